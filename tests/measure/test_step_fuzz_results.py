"""CI holds docs/VALIDATION.md's figures for the whole GPU steps of ``bench/gpu/step_fuzz.py``:
every committed run predicted again by the current calculators, each group's summary line
exactly as the document states it (``step_fuzz.py --report FILES --current``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from bench.gpu.step_fuzz import allocated_summary, load, summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "step_fuzz"
VALIDATION = ROOT / "docs" / "VALIDATION.md"
# the drawn configs of the device calls under the torch engines, the committed real configs of
# one, and the drawn configs of those under DeepSpeed, grouped by sitting
GROUPS = (
    "h200_seed1[123].jsonl",
    "h200_seed1[45].jsonl",
    "h200_seed1[67].jsonl",
    "h200_real.jsonl",
    "h200_seed18.jsonl",
    "h200_seed19.jsonl",
    "h200_seed20.jsonl",
    "h200_seed2[12].jsonl",
    "h200_seed2[34567].jsonl",
    "h200_seed2[89].jsonl",
    "h200_ds_seed2[1234].jsonl",
    "h200_ds_seed2[567].jsonl",
    "h200_ds_seed[23][089].jsonl",
    "h200_ds_seed3[123].jsonl",
    "h200_seed3[012].jsonl",
    "h200_ds_seed3[45].jsonl",
    "h200_seed3[345].jsonl",
    "h200_ds_seed3[67].jsonl",
)


@pytest.mark.parametrize("pattern", GROUPS)
def test_validation_states_what_the_runs_show(pattern: str) -> None:
    files = sorted(str(p) for p in RESULTS.glob(pattern))
    assert files, f"no committed runs match {pattern}"
    rows = load(files, current=True)
    line = f"`{pattern}`: {summary(rows)}; {allocated_summary(rows)}"
    assert line in VALIDATION.read_text(), (
        f"docs/VALIDATION.md does not state {line!r}: run "
        f"`python3 bench/gpu/step_fuzz.py --report bench/results/step_fuzz/{pattern} --current`"
    )


def test_every_committed_file_is_in_a_group() -> None:
    grouped = {p.name for pattern in GROUPS for p in RESULTS.glob(pattern)}
    assert grouped == {p.name for p in RESULTS.glob("*.jsonl")}
