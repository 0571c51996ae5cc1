# ruff: noqa: T201 (a script: its report goes to stdout)
"""Calibrating on an offloaded run: what its step can and cannot set.

Under FSDP2's CPU offload ``measure`` times the optimizer's step on the host
(``host_optimizer_step_s``). For each offloaded run of the plan_validation JSONs given that timed
its step, this calibrates on it three ways and predicts every other run of the same file:

- whole step: the figures solved from the whole measured step (with the run's host probe, both
  figures), the host optimizer at its stated bandwidth, as before the step was timed;
- whole step, timed: the same with the host optimizer bandwidth from the timed step;
- default: what ``POST /v1/calibrations`` does now: the timed bandwidth, the probe's host cost,
  and the GEMM efficiency kept at its figure (the step's remainder also holds FSDP2's copies to
  and from the host, which the model under-predicts).

    python3 bench/offload_calibration.py bench/results/plan_validation/fsdp2_offload_timed_*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.validate_plan import (  # noqa: E402
    _with,
    _with_both,
    committed_setup,
    config_label,
    measured_host_steps,
    measured_probes,
    measured_runs,
)
from calculators.errors import InputError  # noqa: E402
from calculators.plan import Calibration, Learned, calibrate, predict  # noqa: E402


def _calibrated(*args: Any, **kwargs: Any) -> Calibration | str:
    """:func:`calibrate`, or why it refuses (a step whose remainder implies GEMMs above the
    peak: the predicted host step and copies take more of it than they did)."""
    try:
        return calibrate(*args, **kwargs)
    except InputError as err:
        return str(err)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.files:
        body = json.loads(path.read_text())
        runs = measured_runs(body)
        _, setup = committed_setup(body, runs)
        probes, timed = measured_probes(body), measured_host_steps(body)
        print(f"## {path.name}: {setup.params:,} parameters, Nd {setup.gpus}")
        for on, seconds in runs:
            if on not in timed:
                continue
            label = config_label(on)
            probe = probes.get(on)
            print(f"\ncalibrated on {label} ({seconds:.4f} s, host optimizer {timed[on]:.3f} s)")
            print(
                "| predicted run | measured (s) | whole step (s) | error | whole step, timed (s) "
                "| error | default (s) | error |"
            )
            print("|---|---|---|---|---|---|---|---|")
            whole = _calibrated(
                setup, on, seconds, probe=probe, learn=Learned.BOTH if probe else None
            )
            fitted = [
                ("whole step", whole),
                (
                    "whole step, timed",
                    _calibrated(
                        setup,
                        on,
                        seconds,
                        probe=probe,
                        learn=whole.learned
                        if isinstance(whole, Calibration)
                        else Learned.BOTH
                        if probe
                        else Learned.GPU,
                        host_optimizer_seconds=timed[on],
                    ),
                ),
                (
                    "default",
                    _calibrated(setup, on, seconds, probe=probe, host_optimizer_seconds=timed[on]),
                ),
            ]
            used = [
                cal if isinstance(cal, str) else (_with_both if probe else _with)(setup, cal, label)
                for _, cal in fitted
            ]
            for c, measured in runs:
                if c == on:
                    continue
                cells = []
                for s in used:
                    if isinstance(s, str):
                        cells += ["refused", ""]
                        continue
                    p = predict(s, c)[1].total
                    cells += [f"{p:.4f}", f"{p / measured - 1:+.1%}"]
                print(f"| {config_label(c)} | {measured:.4f} | " + " | ".join(cells) + " |")
            for name, cal in fitted:
                if isinstance(cal, str):
                    print(f"{name}: refused: {cal}")
                    continue
                bw = cal.host_optimizer_bandwidth
                print(
                    f"{name}: figure {cal.learned.value}, GEMM efficiency {cal.efficiency:.3f}, "
                    f"host {cal.host_seconds_per_kernel * 1e6:.1f} µs per kernel"
                    + ("" if bw is None else f", host optimizer {bw / 1e9:.2f} GB/s per rank")
                )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
