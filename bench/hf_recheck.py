"""Recompute the predictions of committed Hugging Face validation runs with today's calculators.

Each ``hf_*.json`` that ``python -m measure.validate_hf`` writes holds every result as
``/v1/measure`` returns it. This script rebuilds each run's request (family, engine,
checkpointing, world and batch), the calculator's view of it (``measure.runner.training_setup``,
the process facts read back from the stored prediction) and prints, per run and per family, the
resident and peak errors of the stored prediction ("before") and of a fresh one ("after")::

    python bench/hf_recheck.py /work/gpudata/torch/hf_*.json /work/gpudata/ds/hf/hf_*.json

``validate_hf`` runs every case of a world in one process group, so a run's baseline (the
allocation read before its engine is built) can hold what earlier runs of the process made.
DeepSpeed reports allocations over that baseline and its convention counts the cuBLAS workspaces
the first step makes; where the baseline already held them (an earlier run made them; runs
since ``measure.session.drop_cublas_workspaces`` free them first), ``--clean-baselines`` adds
the workspaces the prediction counts back to the measured resident and peak (``ws`` column).
torch reports absolute allocations: an earlier engine's leftover in its baseline
(ProcessGroupNCCL keeps DDP's last bucket all-reduce tensors a while after the engine is gone,
see ``measure.runner._distributed``) may or may not be freed before the figures are read, so
torch runs are compared as measured; the ``baseline`` column shows where one was left.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.accuracy import warmup_workspace  # noqa: E402
from calculators.conventions import Stage  # noqa: E402
from calculators.engines.torch.config import REDUCE_DTYPE  # noqa: E402
from calculators.memory import estimate  # noqa: E402
from measure.compare import predicted_memory, relative_error  # noqa: E402
from measure.runner import RunSettings, training_setup  # noqa: E402
from measure.spec import parse_spec  # noqa: E402
from measure.validate_hf import _body  # noqa: E402
from measure.workloads import build_workload  # noqa: E402

MIB = 2**20
SM90_WORKSPACES = 2 * 4096 * 8 * 1024  # calculators.engines.torch.peak, two cuBLAS handles


def _batch(workload: str) -> tuple[int, int]:
    m = re.search(r"b(\d+) s(\d+)", workload)
    if m is None:
        raise SystemExit(f"no batch in workload name {workload!r}")
    return int(m.group(1)), int(m.group(2))


def _workspaces(pred: dict[str, Any]) -> int:
    comps = pred["components"]
    return int(comps.get("runtime_workspaces", comps.get("cublas_workspaces", 0)))


def _spec(case: dict[str, Any], args: argparse.Namespace, run: dict[str, Any]) -> Any:
    """The run's checked request; DeepSpeed need not be installed here to predict its runs."""
    body = _body(
        case["family"], case["engine"], case["checkpointing"], args, run["world_size"], run["mode"]
    )
    with mock.patch("measure.spec.deepspeed_available", return_value=True):
        return parse_spec(body)


def stored_settings(run: dict[str, Any], tensors: Any) -> RunSettings:
    """The process facts the stored prediction was made with."""
    pred = run["predicted"]
    comps = pred["components"]
    cuda = run["device"] == "cuda"
    return RunSettings(
        device_type=run["device"],
        compute_capability_major=(9 if _workspaces(pred) == SM90_WORKSPACES else 8)
        if cuda
        else None,
        holds_outputs=comps.get("held_outputs", 0) > 0,
        # the stored stage-3 after_forward tells whether the root was counted gathered
        fsdp_root_reshards_after_forward=True,
        linear_patched=cuda
        and run["engine"] == "deepspeed"
        and comps.get("cublaslt_workspace") == 0,
        tensors=tensors,
    )


def recheck(path: Path, clean: bool) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = []
    for case in data["cases"]:
        result = case["result"]
        micro, seq = _batch(result["workload"])
        args = argparse.Namespace(
            size=data.get("size", "small"),
            micro_batch_size=micro,
            seq_len=seq,
            device=result["environment"]["device_type"],
            warmup_steps=1,
            steps=1,
            stages=[r["stage"] for r in result["runs"]],
            padded="padded" in result["workload"],
            attn_implementation=data.get("attn_implementation", "sdpa"),
            engine_config=data.get("engine_config"),
        )
        for run in result["runs"]:
            ms = _spec(case, args, run)
            workload = build_workload(ms)
            stage = Stage(run["stage"])
            tensors = tuple(workload.tensors)
            settings = stored_settings(run, tensors)
            if run["engine"] == "torch":  # the FSDP2 reduce dtype the file's config decided
                settings = replace(settings, reduce_dtype=ms.engine_config.get(REDUCE_DTYPE))
            setup = training_setup(ms, workload, run["world_size"], settings, stage)
            if run["engine"] == "torch":  # the cuBLASLt workspace an older warm-up made
                made = warmup_workspace(result["environment"], setup.architecture, setup.batch)
                setup = replace(setup, engine_config={**setup.engine_config, **made})
            after = predicted_memory(estimate(setup, [stage]).stages[0])
            before = run["predicted"]
            meas = dict(run["measured"])
            ws = 0
            if clean and run["engine"] == "deepspeed":
                if meas["baseline"] >= _workspaces(before):
                    ws = _workspaces(before)
            row = {
                "file": path.name,
                "family": case["family"],
                "engine": run["engine"],
                "ckpt": case["checkpointing"],
                "stage": run["stage"],
                "nd": run["world_size"],
                "ws": ws,
                "baseline": meas["baseline"],
            }
            for key in ("resident", "peak"):
                m = meas.get(key)
                if m is not None:
                    m += ws
                row[f"{key}_measured"] = m
                row[f"{key}_before"] = relative_error(before.get(key), m)
                row[f"{key}_after"] = relative_error(after.get(key), m)
                row[f"{key}_pred_after"] = after.get(key)
            rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}"


def _summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    a = [abs(v) for v in values]
    return f"{100 * statistics.median(a):.2f} / {100 * max(a):.2f} / {100 * min(values):+.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--clean-baselines", action="store_true")
    p.add_argument("--quiet", action="store_true", help="only the per-family summary")
    a = p.parse_args(argv)
    rows = [r for f in a.files for r in recheck(f, a.clean_baselines)]
    if not a.quiet:
        print(
            "| family | engine | stage | ckpt | Nd | baseline MiB | ws MiB | resident MiB meas "
            "| err % before / after | peak MiB meas / pred after | err % before / after |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            peak = (r["peak_measured"] or 0) / MIB, (r["peak_pred_after"] or 0) / MIB
            cells = [
                r["family"],
                r["engine"],
                r["stage"],
                r["ckpt"],
                r["nd"],
                f"{r['baseline'] / MIB:.1f}",
                f"{r['ws'] / MIB:.0f}",
                f"{r['resident_measured'] / MIB:,.1f}",
                f"{_pct(r['resident_before'])} / {_pct(r['resident_after'])}",
                f"{peak[0]:,.1f} / {peak[1]:,.1f}",
                f"{_pct(r['peak_before'])} / {_pct(r['peak_after'])}",
            ]
            print("| " + " | ".join(str(c) for c in cells) + " |")
        print()
    print(
        "| engine | family | runs | resident % before: median / max abs / most negative "
        "| after | peak % before | after |"
    )
    print("|---|---|---:|---|---|---|---|")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["engine"], r["family"]), []).append(r)
    for (engine, family), rs in sorted(groups.items()):
        cols = [
            _summary([r[k] for r in rs if r[k] is not None])
            for k in ("resident_before", "resident_after", "peak_before", "peak_after")
        ]
        print(f"| {engine} | {family} | {len(rs)} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
