"""Check the ``deepspeed`` engine profile against real DeepSpeed runs.

Measure (on GPUs, one process per GPU)::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda python3 -m torch.distributed.run --nproc_per_node 2 \
        bench/validate_deepspeed.py run --out results.json

Each configuration (model × precision × stage × optimizer offload) builds the canonical decoder
(``measure.workloads.GPT``: GPT-2-style, learned positions, LayerNorm, biased linears, 4h GELU
MLP, SDPA causal attention, untied bias-free head), hands it to ``deepspeed.initialize`` with a
client ``torch.optim.Adam`` and runs warm-up steps, then one measured step of the plain loop::

    logits = engine(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    engine.backward(loss); engine.step()

Rank 0 records ``memory_allocated`` after the step (resident: the loop still holds ``logits``,
``loss``, ``x``, ``y``) and ``max_memory_allocated`` over the step after
``reset_peak_memory_stats`` (peak), plus every collective DeepSpeed issues during the measured
step (``torch.distributed`` functions wrapped before DeepSpeed binds them). Between
configurations everything is freed, including the cuBLAS workspaces, so each one starts empty.

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
from collections import defaultdict
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
}
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
    zero: dict[str, Any] = {"stage": c["stage"], **c.get("zero", {})}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": c.get("ga", 1),
        c["precision"]: {"enabled": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }
    if c["offload"]:
        zero["offload_optimizer"] = {"device": "cpu"}
        cfg["zero_force_ds_cpu_optimizer"] = False  # a client torch.optim.Adam (engine.py:2341)
    return cfg


# --- collective counting ---------------------------------------------------------------------

PHASE = {"name": None}
COLLECTIVES: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])


def _wrap(name: str, tensor_arg: int, key: str) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = getattr(dist, name, None)
    if original is None:
        return

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if PHASE["name"] is not None:
            t = kwargs.get(key, args[tensor_arg] if len(args) > tensor_arg else None)
            if isinstance(t, (list, tuple)):
                numel = sum(x.numel() for x in t)
                elem = t[0].element_size() if t else 0
                dtype = str(t[0].dtype) if t else "?"
            else:
                numel, elem, dtype = t.numel(), t.element_size(), str(t.dtype)
            entry = COLLECTIVES[(name, PHASE["name"], dtype.replace("torch.", ""))]
            entry[0] += 1
            entry[1] += numel * elem
        return original(*args, **kwargs)

    setattr(dist, name, wrapped)
    if getattr(c10d, name, None) is original:
        setattr(c10d, name, wrapped)


def install_counters() -> None:
    """Wrap the collectives DeepSpeed's TorchBackend calls; payload = the whole tensor."""
    _wrap("all_reduce", 0, "tensor")
    _wrap("broadcast", 0, "tensor")
    _wrap("reduce", 0, "tensor")
    _wrap("all_gather_into_tensor", 0, "output_tensor")  # output = N x shard
    _wrap("_all_gather_base", 0, "output_tensor")
    _wrap("reduce_scatter_tensor", 1, "input")  # input = N x shard
    _wrap("_reduce_scatter_base", 1, "input")
    _wrap("all_gather", 0, "tensor_list")
    _wrap("reduce_scatter", 1, "input_list")
    _wrap("all_to_all_single", 1, "input")


# --- one configuration -------------------------------------------------------------------------


class Mem:
    """torch.cuda memory counters, or zeros on a CPU smoke test."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.torch = torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def alloc(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated() if self.cuda else 0

    def requested(self) -> int:
        """Bytes the tensors asked for, before the allocator's rounding and block reuse."""
        if not self.cuda:
            return 0
        return int(self.torch.cuda.memory_stats().get("requested_bytes.all.current", 0))

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def clear(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch._C._cuda_clearCublasWorkspaces()
            self.torch.cuda.empty_cache()


def run_one(c: dict[str, Any], rank: int) -> dict[str, Any]:
    import deepspeed
    import torch

    from measure.workloads import GPT, fp32_cross_entropy

    arch, micro_batch, seq = MODELS.get(c["model"], TINY)
    torch.manual_seed(0)
    model = GPT(arch)  # fp32 on the CPU; DeepSpeed moves and casts it
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    mem = Mem()
    dev = torch.device("cuda", torch.cuda.current_device()) if mem.cuda else torch.device("cpu")
    base = mem.alloc()
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, config=ds_config(c, micro_batch)
    )
    gen = torch.Generator().manual_seed(rank)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, arch.vocab_size, (micro_batch, seq), generator=gen).to(dev)
        y = torch.randint(0, arch.vocab_size, (micro_batch, seq), generator=gen).to(dev)
        return x, y

    phase_peaks: dict[str, int] = defaultdict(int)
    x = y = logits = loss = None
    ga = c.get("ga", 1)
    for i in range(WARMUP + 1):
        measured = i == WARMUP
        if measured:
            mem.sync()
            COLLECTIVES.clear()
            mem.reset()
            start_alloc = mem.alloc()
        for _ in range(ga):  # engine.step() every micro-batch; it steps at the boundary
            x, y = batch()
            PHASE["name"] = "forward" if measured else None
            logits = engine(x)
            loss = fp32_cross_entropy(logits, y)
            if measured:
                mem.sync()
                phase_peaks["forward"] = max(phase_peaks["forward"], mem.peak())
                mem.reset()
                PHASE["name"] = "backward"
            engine.backward(loss)
            if measured:
                mem.sync()
                phase_peaks["backward"] = max(phase_peaks["backward"], mem.peak())
                after_backward = mem.alloc()
                mem.reset()
                PHASE["name"] = "step"
            engine.step()
            if measured:
                mem.sync()
                phase_peaks["step"] = max(phase_peaks["step"], mem.peak())
                mem.reset()
                PHASE["name"] = None
    resident = mem.alloc()
    result = {
        **c,
        "dp": torch.distributed.get_world_size(),
        "micro_batch": micro_batch,
        "seq_len": seq,
        "params": sum(
            p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters()
        ),
        "baseline": base,
        "start_of_step": start_alloc,
        "after_backward": after_backward,
        "resident": resident,
        "peak": max(phase_peaks.values()),
        "phase_peaks": dict(phase_peaks),
        "requested_resident": mem.requested(),
        "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
        "optimizer": type(engine.optimizer).__name__,
        "loss": float(loss.item()),
        "collectives": [
            {"op": k[0], "phase": k[1], "dtype": k[2], "calls": v[0], "payload_bytes": v[1]}
            for k, v in sorted(COLLECTIVES.items())
        ],
    }
    del x, y, logits, loss
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine, opt, model
    gc.collect()
    mem.clear()
    result["leftover"] = mem.alloc()
    return result


def run(out: Path, budget_s: float, only: str | None, which: str) -> None:
    install_counters()  # before deepspeed binds torch.distributed functions
    import deepspeed
    import torch

    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    start = time.time()
    results = []
    models = ["tiny"] if only == "tiny" else [m for m in MODELS if not only or only in m]
    chosen = {"main": lambda: configs(models), "knobs": knob_configs, "single": single_gpu_configs}[
        which
    ]()
    if only == "tiny":  # CPU smoke test of any set
        chosen = [{**c, "model": "tiny"} for c in chosen]
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
            gc.collect()
            Mem().clear()
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
            patched = patched or r["stage"] == 3
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
    p_run.add_argument("--set", default="main", choices=("main", "knobs", "single"))
    p_rep = sub.add_parser("report")
    p_rep.add_argument("path", type=Path, nargs="+")
    args = parser.parse_args()
    if args.cmd == "run":
        run(args.out, args.budget_s, args.only, args.set)
    else:
        report(args.path)


if __name__ == "__main__":
    main()
