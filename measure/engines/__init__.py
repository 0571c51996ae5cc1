"""The engines ``measure`` runs, one module each, beside the workloads they train.

- ``pytorch``: PyTorch's own engines as a training script sets them up (DDP,
  ZeroRedundancyOptimizer, FSDP2 ``fully_shard``) and one stage measured on one rank.
- ``deepspeed``: real DeepSpeed ZeRO, one stage measured on one rank;
  ``deepspeed_config`` (torch-free) builds and checks the config body it runs with.
- ``hf``: the user's Hugging Face model, built with transformers' own modelling code.

This package imports no torch itself: :mod:`measure.spec` checks requests with
``deepspeed_config`` where torch is not installed.
"""
