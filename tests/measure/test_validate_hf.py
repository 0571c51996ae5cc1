"""python -m measure.validate_hf on the CPU: a simulated world, tiny sizes (the GPU script's own
check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from measure import validate_hf  # noqa: E402


@pytest.mark.slow
def test_simulated_run_writes_json_and_table(tmp_path: Path) -> None:
    args = ["--simulated", "4", "--size", "tiny", "--device", "cpu", "--families", "llama"]
    args += ["--checkpointing", "full", "--seq-len", "16", "--micro-batch-size", "1"]
    args += ["--warmup-steps", "1", "--steps", "1", "--out", str(tmp_path)]
    assert validate_hf.main(args) == 0
    body = json.loads((tmp_path / "hf_simulated_nd4_tiny.json").read_text())
    (case,) = body["cases"]
    assert (case["family"], case["engine"], case["checkpointing"]) == ("llama", "torch", "full")
    runs = case["result"]["runs"]
    assert [r["stage"] for r in runs] == [0, 1, 2, 3]
    for r in runs:
        (figures,) = r["per_rank"]
        assert figures["sent_bytes"] == r["communication"]["measured_sent_bytes_per_rank"] > 0
        assert figures["step_time_s"] > 0
        assert abs(r["relative_error"]["resident"]) < 0.005
    table = (tmp_path / "hf_simulated_nd4_tiny.md").read_text()
    assert table.count("| llama | torch |") == 4
