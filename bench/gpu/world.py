"""A world of one process for the GPU scripts that build an engine as ``measure`` does."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_of_one(device_type: str, port: int) -> torch.device:
    """Initialise a one-rank process group (NCCL on CUDA, gloo on the CPU) and return the
    device this rank uses."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    cuda = device_type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return device


def world_from_env(device_type: str, port: int) -> tuple[torch.device, int, int]:
    """The device, rank and world size: torchrun's world (NCCL) where it set one, else a world
    of one (:func:`world_of_one`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return world_of_one(device_type, port), 0, 1
    dist.init_process_group("nccl")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local), dist.get_rank(), world
