# ruff: noqa: T201 (a script: its report goes to stdout)
"""Whether DeepSpeed stage 3 waits on every all-gather of forward before forward ends, on the CPU.

torch's NCCL process group keeps an async collective's input alive until the collective is
waited on (``TORCH_NCCL_AVOID_RECORD_STREAMS=1``, its default). Parameter offload hands each
single-parameter all-gather a fresh device copy of the partition (``partition_parameters.py``
``_all_gather_sequential``), so a gather not waited on would keep its copy. This runs TinyLlama's
``config.json`` cut to a few layers under DeepSpeed stage 3 on two CPU ranks (gloo), with and
without parameter offload, the knobs of transformers' sample config as the Trainer resolves
"auto", and counts the single-parameter gathers (``AllGatherHandle``) of each step's forward
that were not waited on when the loss was returned::

    pip install deepspeed==0.19.8   # DS_BUILD_OPS=0
    DS_ACCELERATOR=cpu python3 -m torch.distributed.run --nproc-per-node 2 \\
        bench/ds_gather_waits.py --layers 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.runtime.zero import partition_parameters as pp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure.engines.hf import build_hf, hf_config  # noqa: E402

CONFIG = Path(__file__).resolve().parent / "hf_configs" / "tinyllama-1.1b.json"


def run(layers: int, offload: bool, steps: int) -> list[tuple[int, int, list[str]]]:
    """(gathers, not waited, their names) of each step's forward."""
    body = json.loads(CONFIG.read_text())
    body.update(num_hidden_layers=layers, vocab_size=2048)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        body.pop(key, None)
    torch.manual_seed(0)
    model = build_hf(hf_config(body), torch.device("cpu"), checkpointing=True)
    names = {id(p): n for n, p in model.named_parameters()}
    h = int(body["hidden_size"])
    zero: dict[str, Any] = {
        "stage": 3,
        "reduce_bucket_size": h * h,
        "stage3_prefetch_bucket_size": int(0.9 * h * h),
        "stage3_param_persistence_threshold": 10 * h,
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    if offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    made: list[list[Any]] = []  # [handle, name, waited]
    init, wait = pp.AllGatherHandle.__init__, pp.AllGatherHandle.wait

    def recorded_init(self: Any, handle: Any, param: Any, *a: Any, **k: Any) -> None:
        init(self, handle, param, *a, **k)
        made.append([self, names.get(id(param), "?"), False])

    def recorded_wait(self: Any, *a: Any, **k: Any) -> None:
        for entry in made:
            if entry[0] is self:
                entry[2] = True
        wait(self, *a, **k)

    pp.AllGatherHandle.__init__ = recorded_init  # type: ignore[method-assign]
    pp.AllGatherHandle.wait = recorded_wait  # type: ignore[method-assign]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), config=config
    )
    x = torch.randint(3, 2000, (1, 64))
    out = []
    for _ in range(steps):
        made.clear()
        loss = engine(input_ids=x, labels=x).loss
        unwaited = [name for _, name, waited in made if not waited]
        out.append((len(made), len(unwaited), unwaited))
        engine.backward(loss)
        engine.step()
    pp.AllGatherHandle.__init__, pp.AllGatherHandle.wait = init, wait  # type: ignore[method-assign]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    for offload in (True, False):
        result = run(a.layers, offload, a.steps)
        if torch.distributed.get_rank() == 0:
            label = "parameter offload" if offload else "no offload"
            print(f"TinyLlama cut to {a.layers} layers, {label}, 2 CPU ranks:")
            for i, (gathers, unwaited, which) in enumerate(result):
                print(
                    f"  step {i}: {gathers} single-parameter gathers in forward, "
                    f"{unwaited} not waited on when it ends {which or ''}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
