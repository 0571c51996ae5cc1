"""What accelerators this host has, asked without initialising CUDA in the service process."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import lru_cache
from typing import Any


@lru_cache
def visible_devices() -> dict[str, Any]:
    """torch availability and the GPUs nvidia-smi lists (no CUDA context is created here)."""
    info: dict[str, Any] = {"torch": importlib.util.find_spec("torch") is not None, "gpus": []}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout
            for line in out.strip().splitlines():
                name, mib = (part.strip() for part in line.rsplit(",", 1))
                info["gpus"].append({"name": name, "memory_bytes": int(mib) * 2**20})
        except (OSError, subprocess.SubprocessError, ValueError):
            info["gpus_error"] = "nvidia-smi did not answer"
    return info
