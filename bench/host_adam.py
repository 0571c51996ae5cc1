# ruff: noqa: T201 (a script: its report goes to stdout)
"""How fast torch's AdamW steps parameters held in host memory, as FSDP2's CPU offload runs it.

With ``CPUOffloadPolicy`` the optimizer is torch's own, over fp32 shards in host memory. On the
CPU, ``torch.optim.AdamW`` takes its single-tensor loop (``_default_to_fused_or_foreach``: the
foreach kernels serve CUDA-like devices only), and under torchrun or ``accelerate launch``
each rank runs it on one thread (both set ``OMP_NUM_THREADS=1`` unless told otherwise). This
times that loop over the shard of each parameter of a Hugging Face config (FSDP2 shards dim 0),
with ``--procs`` ranks stepping at the same time as on a node, and prints the seconds per
step, nanoseconds per parameter and the host bandwidth that implies at the bytes
``calculators.speed.TORCH_FOREACH_ADAMW_BYTES`` counts (the single-tensor loop runs the same
element-wise ops per tensor as the foreach path does per list).

``--optimizer deepspeed`` times DeepSpeed's CPU Adam (``DeepSpeedCPUAdam``, ZeRO-Offload) over
one flat fp32 partition of the same size instead, at the 30 B per parameter the planner streams
for it. Its OpenMP threads follow ``OMP_NUM_THREADS`` (set per rank from ``--threads``, as
torchrun and accelerate launch set it to 1; 0 leaves it unset, as the ``deepspeed`` launcher
does, and each rank then runs on every core).

    python3 bench/host_adam.py --hf-config bench/hf_configs/llama-1b.json --world 4 --procs 1,4
    python3 bench/host_adam.py --optimizer deepspeed --world 2 --procs 1,2 --threads 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def shard_shapes(hf_config: Path, world: int) -> list[int]:
    """The element count of each parameter's FSDP2 shard (dim 0 split over ``world``)."""
    from calculators.hf_config import architecture_from_hf_config
    from calculators.parameters import architecture_params

    arch = architecture_from_hf_config(json.loads(hf_config.read_text()))
    return [t.fsdp_shard_numel(world) for t in architecture_params(arch)]


def _time_steps(
    numels: list[int], steps: int, threads: int, optimizer: str, queue: mp.Queue[float]
) -> None:
    if threads > 0:  # else every core of the host (torch's default, OpenMP's default)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    if optimizer == "deepspeed":  # one flat fp32 partition, as ZeRO-Offload keeps it
        numels = [sum(numels)]
    params = [torch.nn.Parameter(torch.randn(n)) for n in numels]
    for p in params:
        p.grad = torch.randn_like(p)
    opt: torch.optim.Optimizer
    if optimizer == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(params, lr=1e-4, adamw_mode=True)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4)
    opt.step()  # creates the states
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    queue.put(statistics.median(times))


def run(numels: list[int], procs: int, steps: int, threads: int, optimizer: str) -> list[float]:
    """Each of ``procs`` processes' median step seconds, all stepping at once."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue[float] = ctx.Queue()
    workers = [
        ctx.Process(target=_time_steps, args=(numels, steps, threads, optimizer, queue))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    out = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from calculators.conventions import Precision
    from calculators.speed import TORCH_FOREACH_ADAMW_BYTES, optimizer_bytes_per_param

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-config", type=Path, default=Path("bench/hf_configs/llama-1b.json"))
    ap.add_argument("--world", type=int, default=4, help="the FSDP2 world the shards come from")
    ap.add_argument("--procs", default="1,4", help="ranks stepping at once, e.g. 1,4,8")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per rank (0: torch's default)"
    )
    ap.add_argument(
        "--optimizer",
        choices=("torch", "deepspeed"),
        default="torch",
        help="torch's AdamW (FSDP2's CPU offload) or DeepSpeed's CPU Adam (ZeRO-Offload)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    numels = shard_shapes(args.hf_config, args.world)
    n = sum(numels)
    per_param = (
        optimizer_bytes_per_param(Precision.MIXED_BF16, 12)
        if args.optimizer == "deepspeed"
        else TORCH_FOREACH_ADAMW_BYTES
    )
    if args.optimizer == "deepspeed":  # build the op once, before the ranks load it
        from deepspeed.ops.op_builder import CPUAdamBuilder

        CPUAdamBuilder().load()
    print(
        f"{args.hf_config.name}: {len(numels)} shards, {n:,} parameters per rank (world "
        f"{args.world}); {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"{args.threads or 'default'} thread(s) per rank (torch's default here: "
        f"{torch.get_num_threads()})"
    )
    rows = []
    for procs in (int(p) for p in args.procs.split(",")):
        secs = run(numels, procs, args.steps, args.threads, args.optimizer)
        worst = max(secs)
        row = {
            "procs": procs,
            "seconds": secs,
            "ns_per_param": worst / n * 1e9,
            "bandwidth_gb_s": n * per_param / worst / 1e9,
        }
        rows.append(row)
        print(
            f"{procs} rank(s) at once: slowest step {worst:.3f} s, "
            f"{row['ns_per_param']:.2f} ns per parameter, "
            f"{row['bandwidth_gb_s']:.1f} GB/s per rank at {per_param:g} B per parameter"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "hf_config": str(args.hf_config),
                    "optimizer": args.optimizer,
                    "bytes_per_param": per_param,
                    "world": args.world,
                    "params_per_rank": n,
                    "tensors": len(numels),
                    "threads": args.threads or os.cpu_count(),
                    "cpus": os.cpu_count(),
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
