"""Where DeepSpeed's step reaches its peak: the ATen op during which ``max_memory_allocated``
is highest through one training step of a transformers model (a dispatch mode resets the peak
before each op, so an op's own temporaries count), with the ops either side, in MiB: what
is allocated after each op and the most allocated during it. Run under torchrun (one
process is enough):

    torchrun --nproc-per-node 1 bench/gpu/ds_peak_op.py --family llama --stage 1 \
        --attn-implementation eager
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.gpu.op_memory import OpMemory

MIB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="llama")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--attn-implementation", default="eager")
    ap.add_argument("--window", type=int, default=10)
    a = ap.parse_args()
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    from measure.hf_families import family_config

    cfg = family_config(a.family, "small")
    body = {k: v for k, v in cfg.items() if k != "model_type"}
    deepspeed.init_distributed()
    dev = torch.device("cuda", torch.distributed.get_rank())
    torch.cuda.set_device(dev)
    # fp32 on the CPU, as measure/engines/deepspeed.py hands it over; DeepSpeed moves and casts
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(a.family, **body),
        attn_implementation=a.attn_implementation,
        dtype=torch.float32,
    )
    model.train()
    client = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ds = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": a.stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=client, config=ds)
    ids = torch.randint(0, cfg["vocab_size"], (a.batch, a.seq), device=dev)
    log: list[tuple[str, int, int]] = []

    def mark(name: str) -> None:
        now = torch.cuda.memory_allocated()
        log.append((name, now, now))

    for _ in range(3):
        log.clear()
        with OpMemory(log):
            loss = engine(input_ids=ids, labels=ids).loss
            mark("== end of forward")
            engine.backward(loss)
            mark("== end of backward")
            engine.step()
        del loss
    i = max(range(len(log)), key=lambda j: log[j][2])
    marks = [j for j, e in enumerate(log) if e[0].startswith("==")]
    print(
        f"peak {log[i][2] / MIB:.1f} MiB during op {i} of {len(log)} "
        f"(end of forward at op {marks[0]}, end of backward at {marks[1]}); "
        "MiB after / most during each op:"
    )
    for f, m, top in log[max(i - a.window, 0) : i + a.window]:
        print(f"{m / MIB:10.1f} {top / MIB:10.1f}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
