"""The live side of the calculator: runs real ZeRO engines and compares with the prediction.

- ``spec``: the one reading of a measure request (torch-free; the route, the CLI and every rank
  use it) and the CPU cost check.
- ``workloads``: the canonical GPT decoder of ``calculators.architecture`` (same parameter
  names, shapes and order) and the MLP; ``build_workload`` picks the module a spec names.
- ``engines``: one module per engine, as ``calculators.engines`` has one per engine model:
  ``pytorch`` (DDP, ZeroRedundancyOptimizer, FSDP2), ``deepspeed`` (with the torch-free
  ``deepspeed_config``), and ``hf`` (the user's Hugging Face model through transformers).
- ``session``: what every engine's stage run shares (runtime warm-up, release, sync).
- ``memory`` / ``comms``: the real figures (CUDA allocator or live CPU storages; c10d calls).
- ``compare``: prediction vs measurement, field by field.
- ``runner.run(spec, progress)``: the entry point of ``POST /v1/measure`` and ``python -m
  measure``; ``validate``: the GPU tables in ``docs/VALIDATION.md``.
"""

import warnings

# torch's import warns "Failed to initialize NumPy: No module named 'numpy'" when NumPy is not
# installed (torch/csrc/utils/tensor_numpy.cpp, raised from torch/_subclasses/functional_tensor.py);
# measure never turns a tensor into a NumPy array, so the warning says nothing to its users. Every
# process that runs measure (the CLI, the service's job child, each spawned rank) imports this
# package before torch.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
