"""The device-level reading names the physical GPU behind the CUDA device, by UUID: NVML and
nvidia-smi number every GPU of the host, while CUDA_VISIBLE_DEVICES renumbers the visible ones
from 0 (a rank on GPU 2 of the host is cuda:0)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

from measure.memory import DeviceMemory, physical_gpu

UUID = "58e3f1a9-7a1b-4c5d-8e9f-0123456789ab"


class _Props:
    def __init__(self, uuid: str | None) -> None:
        if uuid is not None:
            self.uuid = uuid


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, used: dict[str, int]) -> list[str]:
    asked: list[str] = []
    nvml = types.ModuleType("pynvml")

    def by_uuid(gpu: str) -> str:
        asked.append(gpu)
        return gpu

    def by_index(index: int) -> str:
        raise AssertionError(f"looked up by index {index}")

    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = by_index  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used[h])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return asked


def test_nvml_reads_the_gpu_named_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: _Props(UUID))
    asked = _fake_nvml(monkeypatch, {f"GPU-{UUID}": 123 * 2**20})
    assert DeviceMemory(torch.device("cuda", 0)).nvml_used() == 123 * 2**20
    assert asked == [f"GPU-{UUID}"]


def test_nvidia_smi_is_given_the_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: _Props(f"GPU-{UUID}"))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: the fallback runs
    monkeypatch.setattr(shutil, "which", lambda _name: "/usr/bin/nvidia-smi")
    seen: list[list[str]] = []

    def run(cmd: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="4096\n", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    assert DeviceMemory(torch.device("cuda", 0)).nvml_used() == 4096 * 2**20
    assert seen[0][1] == f"--id=GPU-{UUID}"


def test_without_a_uuid_the_index_serves_only_when_nothing_renumbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: _Props(None))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert physical_gpu(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert physical_gpu(0) is None
    assert DeviceMemory(torch.device("cuda", 0)).nvml_used() is None
