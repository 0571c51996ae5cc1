# ruff: noqa: T201 (a script: its report goes to stdout)
"""What the training loop does with the model's outputs, on the committed runs.

Two sets of runs, each predicted twice from the current calculators: as it ran, and as a
request without the loop's setting is predicted.

- ``bench/results/hf_*_accelerate_outputs*.json`` wrapped forward as accelerate does under mixed
  precision (``engine_config.convert_outputs_to_fp32``: autocast, fp32 copies of the logits
  returned); without it the loop gets 16-bit logits back.
- ``bench/results/hf_*_trainer_loop.json`` kept the loss alone, as transformers' Trainer does
  (``engine_config.trainer_loop``: the logits die as forward returns); without it the loop
  keeps its outputs through backward and between steps.

Per set and metric: how many runs, the median and largest |error| and the lowest error.

    python3 bench/loop_outputs.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.accuracy import RESULTS, Run, hf_runs  # noqa: E402

METRICS = ("peak", "resident")


def _accelerate(path: Path, as_run: bool) -> list[Run]:
    return hf_runs(path, converted_as=None if as_run else False)


def _trainer(path: Path, as_run: bool) -> list[Run]:
    return hf_runs(path, without=() if as_run else ("trainer_loop",))


SETS = (
    ("hf_*_accelerate_outputs*.json", "fp32 outputs", "16-bit outputs", _accelerate),
    ("hf_*_trainer_loop.json", "the loss kept alone", "outputs kept", _trainer),
)


def main() -> int:
    for pattern, as_run, without, read in SETS:
        paths = sorted(RESULTS.glob(pattern))
        print(f"{len(paths)} files: {', '.join(p.name for p in paths)}")
        for title, ran in ((f"as run ({as_run})", True), (f"predicted with {without}", False)):
            runs = [r for p in paths for r in read(p, ran)]
            for metric in METRICS:
                errs = [100 * r.errors[metric] for r in runs if r.errors.get(metric) is not None]
                worst = max(errs, key=abs)
                print(
                    f"{title:38} {metric:9} {len(errs):3} runs  median |err| "
                    f"{statistics.median(abs(e) for e in errs):5.2f} %  max |err| "
                    f"{abs(worst):5.2f} %  lowest {min(errs):+6.2f} %  highest {max(errs):+6.2f} %"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
