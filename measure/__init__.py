"""The live side of the calculator: runs real ZeRO engines and compares with the prediction.

- ``workloads``: the canonical GPT decoder of ``calculators.architecture`` (same parameter
  names, shapes and order) and an MLP of ``layers`` x Linear(hidden, hidden).
- ``engines``: PyTorch's own engines as a training script sets them up (DDP,
  ZeroRedundancyOptimizer, FSDP2).
- ``session``: one stage on one rank: warm-up, collectives counted, memory probed per phase.
- ``memory`` / ``comms``: the real figures (CUDA allocator or live CPU storages; c10d calls).
- ``compare``: prediction (engine ``torch``) vs measurement, field by field.
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
