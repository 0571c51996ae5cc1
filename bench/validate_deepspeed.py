"""Check the ``deepspeed`` engine profile against real DeepSpeed runs.

Measure (on GPUs, one process per GPU)::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda python3 -m torch.distributed.run --nproc_per_node 2 \
        bench/validate_deepspeed.py run --out results.json

Each configuration (model × precision × stage × optimizer offload) runs through the path
``/v1/measure`` ships: the config body from :mod:`measure.engines.deepspeed_config`, the run
from :func:`measure.engines.deepspeed.measure_stage` — the canonical decoder
(``measure.workloads.GPT``: GPT-2-style, learned positions, LayerNorm, biased linears, 4h GELU
MLP, SDPA causal attention, untied bias-free head; ``--set tied``: the head is the token
embedding) handed to ``deepspeed.initialize`` with a
client ``torch.optim.Adam``, warm-up steps, then one measured step of the plain loop::

    logits = engine(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    engine.backward(loss); engine.step()

Rank 0 records ``memory_allocated`` after the step (resident: the loop still holds ``logits``,
``loss``, ``x``, ``y``) and ``max_memory_allocated`` over the step after
``reset_peak_memory_stats`` (peak), plus every collective DeepSpeed issues during the measured
step, per phase (``measure.comms``: the c10d ops as dispatched), then one timed step. Between
configurations everything is freed, including the cuBLAS workspaces, so each one starts empty.
The committed results written by the earlier standalone driver (absolute readings, the
``torch.distributed`` function names) are read by ``report`` the same way.

Compare (anywhere, pure Python)::

    python3 bench/validate_deepspeed.py report results.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.architecture import Architecture  # noqa: E402

MODELS: dict[str, tuple[Architecture, int, int]] = {
    # name: (architecture, micro-batch, sequence length); GPT-2 small / large with untied heads
    "gpt2-small-untied": (
        Architecture(layers=12, hidden=768, heads=12, vocab_size=50257, max_seq_len=1024),
        4,
        1024,
    ),
    "gpt2-large-untied": (
        Architecture(layers=36, hidden=1280, heads=20, vocab_size=50257, max_seq_len=1024),
        2,
        1024,
    ),
    # the canonical GPT-2 small: its head is the token embedding (HF GPT2LMHeadModel)
    "gpt2-small-tied": (
        Architecture(
            layers=12,
            hidden=768,
            heads=12,
            vocab_size=50257,
            max_seq_len=1024,
            tied_embeddings=True,
        ),
        4,
        1024,
    ),
}
# one sequence per micro-batch: the tied embedding's gradient sum outweighs the loss's backward
MODELS["gpt2-small-tied-m1"] = (MODELS["gpt2-small-tied"][0], 1, 1024)
TINY = (Architecture(layers=2, hidden=64, heads=2, vocab_size=128, max_seq_len=32), 2, 32)
WARMUP = 3  # step 1 records the stage-3 trace, step 2 completes it, Adam states exist after 1


def knob_configs() -> list[dict[str, Any]]:
    """Second set: gradient accumulation and non-default knobs on the small model, bf16."""
    small = "gpt2-small-untied"
    base = {"model": small, "precision": "bf16", "offload": False}
    out = [{**base, "stage": st, "ga": 2} for st in range(4)]
    out += [
        {**base, "stage": 1, "zero": {"reduce_bucket_size": 50_000_000}},
        {**base, "stage": 2, "zero": {"reduce_bucket_size": 50_000_000, "overlap_comm": True}},
        {
            **base,
            "stage": 3,
            "zero": {
                "reduce_bucket_size": 50_000_000,
                "stage3_max_live_parameters": 30_000_000,
                "stage3_prefetch_bucket_size": 10_000_000,
            },
        },
        {
            **base,
            "stage": 3,
            "zero": {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0},
        },
        {**base, "stage": 2, "offload": True, "ga": 2},
        {"model": "gpt2-large-untied", "precision": "bf16", "offload": False, "stage": 0},
    ]
    return out


def tied_configs() -> list[dict[str, Any]]:
    """Third set: the tied-head GPT-2 small, bf16 and fp16, every stage, no offload; then one
    sequence per micro-batch, bf16."""
    return [
        {"model": "gpt2-small-tied", "precision": precision, "stage": st, "offload": False}
        for precision in ("bf16", "fp16")
        for st in range(4)
    ] + [
        {"model": "gpt2-small-tied-m1", "precision": "bf16", "stage": st, "offload": False}
        for st in range(4)
    ]


def linear_configs() -> list[dict[str, Any]]:
    """Stage 3 with torch's own ``F.linear`` (``memory_efficient_linear`` off) and every
    parameter released after its use: bf16, the small (untied and tied) and large models. Run
    in a process of its own: a stage-3 engine with the knob on replaces ``F.linear`` for the
    rest of the process."""
    zero = {
        "memory_efficient_linear": False,
        "stage3_param_persistence_threshold": 0,
        "stage3_max_reuse_distance": 0,
    }
    return [
        {"model": m, "precision": "bf16", "stage": 3, "offload": False, "zero": zero}
        for m in ("gpt2-small-untied", "gpt2-small-tied", "gpt2-large-untied")
    ]


def single_gpu_configs() -> list[dict[str, Any]]:
    """Nd = 1: the small model, bf16, every stage, offload at stages 2 and 3."""
    base = {"model": "gpt2-small-untied", "precision": "bf16"}
    return [
        {**base, "stage": st, "offload": off}
        for st in range(4)
        for off in (False, True)
        if not off or st >= 2
    ]


def configs(models: list[str]) -> list[dict[str, Any]]:
    out = []
    for model in models:
        for precision in ("bf16", "fp16"):
            for stage in range(4):
                for offload in (False, True):
                    if offload and stage == 0:
                        continue
                    if model == "gpt2-large-untied" and offload and precision == "fp16":
                        continue  # CPU Adam on 4e8 elements is slow; bf16 covers the path
                    out.append(
                        {"model": model, "precision": precision, "stage": stage, "offload": offload}
                    )
    return out


def ds_config(c: dict[str, Any], micro_batch: int) -> dict[str, Any]:
    """The body one configuration runs with, built by the measure path
    (:func:`measure.engines.deepspeed_config.deepspeed_config`, what ``/v1/measure`` sends)."""
    from calculators.conventions import Precision, Stage
    from measure.engines.deepspeed_config import deepspeed_config

    return deepspeed_config(
        Stage(c["stage"]),
        Precision.MIXED_BF16 if c["precision"] == "bf16" else Precision.MIXED_FP16,
        micro_batch,
        c.get("ga", 1),
        {"optimizer": "cpu" if c["offload"] else "none"},
        {"zero_optimization": dict(c["zero"])} if c.get("zero") else None,
    )


# --- one configuration -------------------------------------------------------------------------


def clear_device() -> None:
    """Free everything, the cuBLAS workspaces included, so the next configuration starts empty."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()


def run_one(c: dict[str, Any], rank: int) -> dict[str, Any]:
    """One configuration through the shipped measure path (``measure.engines.deepspeed``)."""
    import torch

    from calculators.conventions import Optimizer, Stage
    from measure.engines import deepspeed as ds_engine
    from measure.spec import StepPlan
    from measure.workloads import gpt_workload

    arch, micro_batch, seq = MODELS.get(c["model"], TINY)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    workload = gpt_workload(arch, micro_batch, seq)
    plan = StepPlan(warmup_steps=WARMUP, steps=1, grad_accumulation_steps=c.get("ga", 1))
    out = ds_engine.measure_stage(
        workload, Stage(c["stage"]), Optimizer.ADAM, dev, plan, ds_config(c, micro_batch), rank
    )
    m = out["measured"]
    base = m["baseline"]
    result = {
        **c,
        "dp": torch.distributed.get_world_size(),
        "micro_batch": micro_batch,
        "seq_len": seq,
        "params": workload.params,
        # absolute allocator readings, as the committed results hold them
        "baseline": base,
        "after_backward": base + m["after_backward"],
        "resident": base + m["resident"],
        "peak": base + (m["peak"] or 0),
        "requested_resident": m["model_state_requested"] + m["held_outputs"],
        "skipped_steps": m["skipped_steps"],
        "optimizer": out["engine_name"].split()[-1],
        "loss": m["loss"],
        "step_time_s": out["step_time_s"],
        "sent_bytes_per_rank": out["measured_sent_bytes_per_rank"],
        "collectives": [
            {k: r[k] for k in ("op", "phase", "dtype", "calls", "payload_bytes")}
            for r in out["collectives"]
        ],
    }
    clear_device()
    result["leftover"] = torch.cuda.memory_allocated() if cuda else 0
    return result


def run(out: Path, budget_s: float, only: str | None, which: str) -> None:
    import deepspeed
    import torch

    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    start = time.time()
    results = []
    untied = [m for m in MODELS if m.endswith("-untied")]
    models = ["tiny"] if only == "tiny" else [m for m in untied if not only or only in m]
    chosen = {
        "main": lambda: configs(models),
        "knobs": knob_configs,
        "single": single_gpu_configs,
        "tied": tied_configs,
        "linear": linear_configs,
    }[which]()
    if only == "tiny":  # CPU smoke test of any set
        chosen = [{**c, "model": "tiny"} for c in chosen]
    elif only:
        chosen = [c for c in chosen if only in c["model"]]
    for c in chosen:
        if time.time() - start > budget_s:
            if rank == 0:
                print(f"budget spent, skipping {c}", flush=True)
            continue
        t0 = time.time()
        try:
            r = run_one(c, rank)
        except Exception as exc:  # report and go on: one failing config must not hide the rest
            r = {**c, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            clear_device()
        r["seconds"] = round(time.time() - t0, 1)
        results.append(r)
        if rank == 0:
            print(json.dumps({k: v for k, v in r.items() if k != "collectives"}), flush=True)
            out.write_text(
                json.dumps(
                    {
                        "torch": torch.__version__,
                        "deepspeed": deepspeed.__version__,
                        "device": torch.cuda.get_device_name() if cuda else "cpu",
                        "driver": "measure.engines.deepspeed",
                        "results": results,
                    },
                    indent=1,
                )
            )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# --- report ------------------------------------------------------------------------------------


def predict(r: dict[str, Any], linear_patched: bool = False) -> tuple[Any, Any]:
    """The model's figures for one run.

    ``linear_patched``: a stage-3 engine was built earlier in the same process, so
    ``torch.nn.functional.linear`` is DeepSpeed's ``zero3_linear_wrap`` for good and no
    cuBLASLt workspace is allocated (calculators.engines.deepspeed.cublaslt_workspace_bytes).
    """
    from calculators.batch import Batch
    from calculators.communication import stage_communication
    from calculators.conventions import Engine, OffloadDevice, Precision, Stage
    from calculators.engines.deepspeed import MODEL
    from calculators.model_states import Offload, TrainingSetup
    from calculators.topology import Topology
    from calculators.traffic import CommunicationSetup

    arch, micro_batch, seq = MODELS.get(r["model"], TINY)
    setup = TrainingSetup(
        params=r["params"],
        dp=r["dp"],
        precision=Precision.MIXED_BF16 if r["precision"] == "bf16" else Precision.MIXED_FP16,
        engine=Engine.DEEPSPEED,
        architecture=arch,
        batch=Batch(micro_batch, seq, grad_accumulation_steps=r.get("ga", 1)),
        offload=Offload(optimizer=OffloadDevice.CPU if r["offload"] else OffloadDevice.NONE),
        engine_config={
            **ds_config(r, micro_batch),
            **({"cublaslt_workspace_bytes": 0} if linear_patched else {}),
        },
    )
    memory = MODEL.estimate(setup, Stage(r["stage"]))
    comm = stage_communication(
        CommunicationSetup(
            training=setup,
            topology=Topology(1, r["dp"], r["dp"]),
            grad_accumulation_steps=r.get("ga", 1),
        ),
        Stage(r["stage"]),
    )
    return memory, comm


def pct(pred: int, meas: int) -> float:
    return 100.0 * (pred - meas) / meas if meas else float("nan")


OPS = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",  # measure.comms names each collective by its kind
}


def label(r: dict[str, Any]) -> str:
    knobs = [f"GA {r['ga']}"] if r.get("ga", 1) > 1 else []
    knobs += [f"{k}={v}" for k, v in r.get("zero", {}).items()]
    short = r["model"].replace("gpt2-", "").replace("-untied", "")
    return (
        f"{short} | {r['dp']} | {r['precision']} | {r['stage']} | "
        f"{'cpu' if r['offload'] else '-'} | {', '.join(knobs) or '-'}"
    )


def report(paths: list[Path]) -> None:
    from calculators.engines.deepspeed.config import param_list, parse_config
    from calculators.engines.deepspeed.stage3 import stage3_trace
    from calculators.topology import Op, sent_factor

    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        print(
            f"{path.name}: torch {data['torch']}, DeepSpeed {data['deepspeed']}, "
            f"{data['device']}, rank 0"
        )
        patched = False  # one process per file: stage 3 patches F.linear for the rest of it
        for r in data["results"]:
            rows.append((r, patched))
            patched = patched or (
                r["stage"] == 3 and r.get("zero", {}).get("memory_efficient_linear", True)
            )
    print()
    print(
        "| model | Nd | prec | stage | offload | knobs | resident meas | pred | err % | "
        "peak meas | pred | err % | peak moment |"
    )
    print("|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    errs_r, errs_p, comm_rows = [], [], []
    for r, patched in rows:
        if "error" in r:
            print(
                f"| {r['model']} | {r.get('dp', '?')} | {r['precision']} | {r['stage']} | "
                f"error: {r['error'][:100]} |"
            )
            continue
        memory, comm = predict(r, patched)
        meas_r = r["resident"] - r["baseline"]
        meas_p = r["peak"] - r["baseline"]
        er, ep = pct(memory.resident, meas_r), pct(memory.peak, meas_p)
        errs_r.append(abs(er))
        errs_p.append(abs(ep))
        moment = next((n.split(": ")[1] for n in memory.notes if n.startswith("peak moment")), "")
        print(
            f"| {label(r)}{' ¹' if patched else ''} | {meas_r:,} | {memory.resident:,} | "
            f"{er:+.2f} | {meas_p:,} | {memory.peak:,} | {ep:+.2f} | {moment} |"
        )
        sent = sum(
            int(c["payload_bytes"] * sent_factor(Op(OPS[c["op"]]), r["dp"]))
            for c in r["collectives"]
        )
        comm_rows.append((r, sent, comm.sent_bytes_per_rank))
    if errs_r:
        errs_r.sort()
        errs_p.sort()
        print(
            "\n¹ after a stage-3 engine in the same process: F.linear is zero3_linear_wrap, "
            "no cuBLASLt workspace (and the allocator holds blocks of earlier engines)"
        )
        print(
            f"\n{len(errs_r)} runs: resident |err| median {errs_r[len(errs_r) // 2]:.2f} % "
            f"max {errs_r[-1]:.2f} %; peak |err| median {errs_p[len(errs_p) // 2]:.2f} % "
            f"max {errs_p[-1]:.2f} %\n"
        )
    print(
        "Communication, bytes sent per rank per optimizer step (ring factors), measured vs "
        "calculators.communication (engine deepspeed):\n"
    )
    print(
        "| model | Nd | prec | stage | offload | knobs | sent meas | pred | err % | "
        "measured collectives (op phase dtype calls payload) |"
    )
    print("|---|---:|---|---:|---|---|---:|---:|---:|---|")
    for r, meas, pred in comm_rows:
        detail = "; ".join(
            f"{OPS[c['op']]} {c['phase']} {c['dtype']} x{c['calls']} {c['payload_bytes']:,}"
            for c in r["collectives"]
        )
        print(f"| {label(r)} | {meas:,} | {pred:,} | {pct(pred, meas):+.2f} | {detail} |")
    print(
        "\nStage 3 all-gathers, elements: measured vs the coordinator simulation "
        "(calculators.engines.deepspeed.stage3_trace, steady state):\n"
    )
    print(
        "| model | Nd | prec | stage | offload | knobs | forward meas | sim | backward meas | sim |"
    )
    print("|---|---:|---|---:|---|---|---:|---:|---:|---:|")
    for r, _, _ in comm_rows:
        if r["stage"] != 3:
            continue
        arch, micro_batch, seq = MODELS.get(r["model"], TINY)
        from calculators.model_states import TrainingSetup

        params, _ = param_list(TrainingSetup(params=r["params"], dp=r["dp"], architecture=arch))
        trace = stage3_trace(params, parse_config(ds_config(r, micro_batch)))
        ga = r.get("ga", 1) if r["dp"] > 1 else 0  # one rank gathers nothing
        gathered = {"forward": 0, "backward": 0}
        for c in r["collectives"]:
            if OPS[c["op"]] == "all_gather" and c["phase"] in gathered:
                gathered[c["phase"]] += c["payload_bytes"] // 2
        print(
            f"| {label(r)} | {gathered['forward']:,} | {ga * trace.forward_gathered:,} | "
            f"{gathered['backward']:,} | {ga * trace.backward_gathered:,} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--out", type=Path, required=True)
    p_run.add_argument("--budget-s", type=float, default=400.0)
    p_run.add_argument("--only", default=None, help="run only models whose name contains this")
    p_run.add_argument(
        "--set", default="main", choices=("main", "knobs", "single", "tied", "linear")
    )
    p_rep = sub.add_parser("report")
    p_rep.add_argument("path", type=Path, nargs="+")
    args = parser.parse_args()
    if args.cmd == "run":
        run(args.out, args.budget_s, args.only, args.set)
    else:
        report(args.path)


if __name__ == "__main__":
    main()
