"""What is alive on the GPU after forward under DeepSpeed stage 3, allocation by allocation.

A world over NCCL (torchrun), rank 0 reported: a Hugging Face family built with transformers'
modelling code (``measure.hf_families``), DeepSpeed 0.19.8 stage 3 in bf16 with the default
knobs and a client AdamW, two sequences of 1,024 tokens, two warm-up steps, then the caching
allocator's history over one more forward. Writes every live block of at least ``--min-mib``
with the Python frames that allocated it; ``--variant tied`` or ``untied`` gives the same shape
with and without a tied head::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda PYTHONPATH=$PWD torchrun --nproc-per-node 2 \\
        bench/gpu/ds_forward_snapshot.py --family qwen3 --size medium --variant tied

A world of one gathers nothing (each parameter's gathered copy is its partition).

``--hf-config`` builds a real model's ``config.json`` instead, with the zero_optimization knobs
transformers' Trainer fills from its hidden size ("auto"), ``--offload`` adds the CPU optimizer
and parameter offload of transformers' sample ZeRO-3 config, ``--checkpointing`` turns on
transformers' gradient checkpointing, ``--trace-gathers`` records every all-gather of that forward
(``deepspeed.comm.allgather_fn``): its input's size, whether it was waited on, and, for an input
still alive after forward, whether the allocator still holds its block and which Python objects
refer to it (none: only C++ holds it, e.g. the process group's stash)::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda PYTHONPATH=$PWD torchrun --nproc-per-node 2 \\
        bench/gpu/ds_forward_snapshot.py --hf-config bench/hf_configs/tinyllama-1.1b.json \\
        --micro-batch-size 1 --seq-len 2048 --checkpointing --offload
    python3 bench/gpu/ds_forward_snapshot.py --report bench/results/ds_forward_snapshot/*.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.forward_snapshot import addressed_blocks, live_blocks  # noqa: E402


def run(
    family: str,
    size: str,
    tied: bool | None,
    depth: int,
    min_mib: float,
    hf_config: str | None = None,
    micro: int = 2,
    seq: int = 1024,
    offload: bool = False,
    checkpointing: bool = False,
    settle_s: float = 0.0,
    trace_gathers: bool = False,
) -> dict[str, Any]:
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from measure.hf_families import family_config

    zero: dict[str, Any] = {"stage": 3}
    if hf_config is not None:
        body = json.loads(Path(hf_config).read_text())
        hidden = body["hidden_size"]
        zero |= {  # what the Trainer fills for "auto" (transformers integrations/deepspeed.py)
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
            "sub_group_size": 10**9,
            "stage3_max_live_parameters": 10**9,
            "stage3_max_reuse_distance": 10**9,
        }
    else:
        body = family_config(family, size)
        body["tie_word_embeddings"] = tied
    if offload:
        zero |= {
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        }
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**body), attn_implementation="sdpa", dtype=torch.float32
    )
    if checkpointing:
        model.gradient_checkpointing_enable()  # as measure runs it
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "zero_optimization": zero,
        "bf16": {"enabled": True},
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x = torch.randint(3, body["vocab_size"], (micro, seq), device=engine.device)
    for _ in range(2):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    gathers: list[Gather] = []
    restore = _trace_gathers(gathers) if trace_gathers else None
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    loss = engine(input_ids=x, labels=x).loss
    torch.cuda.synchronize()
    time.sleep(settle_s)  # what outlives forward only briefly is gone by then
    after = torch.cuda.memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if restore is not None:
        restore()
    traced = [g.report(snap) for g in gathers]
    blocks = [
        {
            "size": b["size"],
            "requested": b["requested"],
            "in_forward": b["recorded"],
            "frames": b["frames"],
        }
        for b in live_blocks(depth, int(min_mib * 2**20), snap)
    ]
    blocks.sort(key=lambda b: -b["size"])
    engine.backward(loss)
    engine.step()
    return {
        "family": hf_config or family,
        "size": size,
        "tied": tied,
        "offload": offload,
        "checkpointing": checkpointing,
        "settle_s": settle_s,
        "allocated_before_forward": before,
        "allocated_after_forward": after,
        "blocks": blocks,
        "gathers": traced,
    }


class Gather:
    """One all-gather of the traced forward: a weak reference to its input, and its work object
    wrapped so that a wait on it is seen."""

    def __init__(self, work: Any, source: Any, frames: list[str]) -> None:
        import torch

        self.work = work
        self.source = weakref.ref(source)
        self.ptr = source.data_ptr()
        self.nbytes = source.numel() * source.element_size()
        self.frames = frames
        self.side_stream = torch.cuda.current_stream() != torch.cuda.default_stream()
        self.waited = False

    def wait(self, *a: Any, **k: Any) -> Any:
        self.waited = True
        return self.work.wait(*a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)

    def report(self, snap: dict[str, Any]) -> dict[str, Any]:
        """What became of the input: alive, in an allocated block, referred to by whom."""
        source = self.source()
        held = next(
            (
                b["state"]
                for address, b in addressed_blocks(snap)
                if address <= self.ptr < address + b["size"]
            ),
            "no segment",
        )
        referrers = (
            []
            if source is None
            else sorted({type(r).__name__ for r in gc.get_referrers(source) if r is not self})
        )
        return {
            "bytes": self.nbytes,
            "waited": self.waited,
            "completed": bool(self.work.is_completed()),
            "alive": source is not None,
            "block": held,
            "side_stream": self.side_stream,
            "referrers": referrers,
            "frames": self.frames,
        }


def _trace_gathers(into: list[Gather]) -> Any:
    """Wrap ``deepspeed.comm.allgather_fn`` so each call's input and wait are recorded; returns
    the function that puts it back."""
    import deepspeed.comm as dist

    original = dist.allgather_fn

    def traced(output_tensor: Any, input_tensor: Any, *a: Any, **k: Any) -> Any:
        work = original(output_tensor, input_tensor, *a, **k)
        if work is None:
            return work
        frames = [
            f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack()[-6:-1]
        ]
        into.append(Gather(work, input_tensor, frames))
        return into[-1]

    dist.allgather_fn = traced

    def restore() -> None:
        dist.allgather_fn = original

    return restore


def report(paths: list[str]) -> None:
    """Per written snapshot: the blocks forward allocated and left alive, totalled by the two
    innermost frames that allocated them (count, block bytes, requested bytes)."""
    mib = 2**20
    for path in paths:
        data = json.loads(Path(path).read_text())
        print(
            f"{Path(path).name}: allocated {data['allocated_before_forward'] / mib:.1f} -> "
            f"{data['allocated_after_forward'] / mib:.1f} MiB"
        )
        sites: dict[str, list[int]] = {}
        for b in data["blocks"]:
            if b["in_forward"]:
                site = sites.setdefault(" < ".join(b["frames"][:2]), [0, 0, 0])
                site[0] += 1
                site[1] += b["size"]
                site[2] += b["requested"]
        for where, (count, size, requested) in sorted(sites.items(), key=lambda kv: -kv[1][1]):
            print(f"  {count:4d} {size / mib:9.1f} MiB (requested {requested / mib:9.1f})  {where}")
        kinds: dict[tuple[Any, ...], list[int]] = {}
        for g in data.get("gathers", []):
            key = (
                g["waited"],
                g["alive"],
                g["block"],
                g["side_stream"],
                ",".join(g["referrers"]),
            )
            kinds.setdefault(key, [0, 0])
            kinds[key][0] += 1
            kinds[key][1] += g["bytes"]
        for (waited, alive, held, side, refs), (count, nbytes) in sorted(kinds.items()):
            print(
                f"  gathers: {count:4d} inputs {nbytes / mib:8.1f} MiB  waited={waited} "
                f"alive={alive} block={held} side_stream={side} referrers=[{refs}]"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen3")
    ap.add_argument("--size", default="medium")
    ap.add_argument("--variant", choices=["tied", "untied"])
    ap.add_argument("--hf-config", help="a config.json to build instead of --family at --size")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--offload", action="store_true", help="optimizer and parameters to the CPU")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="seconds to wait after forward before the snapshot",
    )
    ap.add_argument("--trace-gathers", action="store_true", help="record each all-gather's input")
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--min-mib", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/dssnap"))
    ap.add_argument("--report", nargs="+", metavar="JSON", help="summarise written snapshots")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed
    import torch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend="nccl")
    if a.hf_config is None and a.variant is None:
        ap.error("--variant is required without --hf-config")
    tied = None if a.variant is None else a.variant == "tied"
    result = run(
        a.family,
        a.size,
        tied,
        a.depth,
        a.min_mib,
        a.hf_config,
        a.micro_batch_size,
        a.seq_len,
        a.offload,
        a.checkpointing,
        a.settle_s,
        a.trace_gathers,
    )
    if int(os.environ["RANK"]) != 0:
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (
        f"{Path(a.hf_config).stem}{'_offload' if a.offload else ''}"
        f"{'_full' if a.checkpointing else ''}"
        f"{f'_settle{a.settle_s:g}s' if a.settle_s else ''}"
        f"{'_gathers' if a.trace_gathers else ''}"
        if a.hf_config
        else f"{a.family}_{a.size}_{a.variant}"
    )
    path = out / f"ds_snapshot_{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    mib = 2**20
    print(
        f"{name}: allocated {result['allocated_before_forward'] / mib:.1f} -> "
        f"{result['allocated_after_forward'] / mib:.1f} MiB"
    )
    for b in result["blocks"][:40]:
        where = " < ".join(b["frames"][:4])
        print(f"  {b['size'] / mib:9.1f} MiB  fwd={b['in_forward']!s:5}  {where}")


if __name__ == "__main__":
    main()
