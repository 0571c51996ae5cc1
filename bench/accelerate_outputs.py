# ruff: noqa: T201 (a script: its report goes to stdout)
"""What accelerate's fp32 outputs do to the torch engine's predictions, on the committed runs.

The runs in ``bench/results/hf_*_accelerate_outputs*.json`` wrapped forward as accelerate does
under mixed precision (``engine_config.convert_outputs_to_fp32``: autocast, fp32 copies of the
logits returned). Each is predicted twice from the current calculators: as it ran, and as if the
loop got 16-bit logits back (the prediction a request without the setting gets). Per metric: how
many runs, the median and largest |error| and the lowest error of each.

    python3 bench/accelerate_outputs.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.accuracy import RESULTS, hf_runs  # noqa: E402

PATTERN = "hf_*_accelerate_outputs*.json"
METRICS = ("peak", "resident")


def main() -> int:
    paths = sorted(RESULTS.glob(PATTERN))
    print(f"{len(paths)} files: {', '.join(p.name for p in paths)}")
    for title, converted in (("predicted as run (fp32 outputs)", None), ("16-bit outputs", False)):
        runs = [r for p in paths for r in hf_runs(p, converted_as=converted)]
        for metric in METRICS:
            errs = [100 * r.errors[metric] for r in runs if r.errors.get(metric) is not None]
            worst = max(errs, key=abs)
            print(
                f"{title:34} {metric:9} {len(errs):3} runs  median |err| "
                f"{statistics.median(abs(e) for e in errs):5.2f} %  max |err| {abs(worst):5.2f} %"
                f"  lowest {min(errs):+6.2f} %"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
