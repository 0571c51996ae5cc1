# ruff: noqa: T201 (a script: its report goes to stdout)
"""When the sliding-window mask of a checkpointed transformers model dies, and where the step's
largest total after the first gradient sits: a live-storage count (``measure.memory``) of one
bf16 training step on the CPU, as DeepSpeed's CPU check of the backward moments counts it
(``tests/measure/test_deepspeed_hf_peak.py``: the small Mistral config cut to two layers, one
1,024-token sequence, full checkpointing, stage 1: ``param.grad`` left in place)::

    python3 -m bench.window_mask_lifetime
"""

from __future__ import annotations

import argparse
import weakref
from typing import Any

import torch

from measure.engines.hf import build_hf, hf_config
from measure.hf_families import family_config
from measure.memory import LiveStorages


class _Count(LiveStorages):
    """Live bytes after every op: the largest after the first gradient hook, and the op after
    which the mask's storage is gone."""

    def __init__(self, mask: list[weakref.ref[torch.UntypedStorage]]) -> None:
        super().__init__("cpu")
        self.mask, self.ops, self.hooked = mask, 0, False
        self.peak: tuple[int, int, str] = (0, 0, "")
        self.mask_gone: tuple[int, str] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.ops += 1
        if self.mask and self.mask[0]() is None and self.mask_gone is None:
            self.mask_gone = (self.ops, str(func))
        if self.hooked and (live := self.live_bytes()) >= self.peak[0]:
            self.peak = (live, self.ops, str(func))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="mistral", help="a windowed measure.hf_families one")
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    import transformers.masking_utils as masking

    config = family_config(args.family, "small")
    config["num_hidden_layers"] = 2
    torch.manual_seed(0)
    model = build_hf(hf_config(config), torch.device("cpu"), True).to(torch.bfloat16)
    mask: list[weakref.ref[torch.UntypedStorage]] = []
    make = masking.create_sliding_window_causal_mask

    def kept(*a: Any, **k: Any) -> Any:
        m = make(*a, **k)
        if isinstance(m, torch.Tensor):
            mask.append(weakref.ref(m.untyped_storage()))
        return m

    module = type(model).__module__
    modelling = __import__(module, fromlist=["create_sliding_window_causal_mask"])
    modelling.create_sliding_window_causal_mask = kept
    count = _Count(mask)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _: setattr(count, "hooked", True))
    with count:
        ids = torch.randint(0, config["vocab_size"], (1, args.seq_len))
        out = model(input_ids=ids, labels=ids.clone())
        logits, loss = out.logits, out.loss
        del out
        end_of_forward, forward_ops = count.live_bytes(), count.ops
        size = mask[0]().nbytes() if mask and mask[0]() is not None else 0  # type: ignore[union-attr]
        loss.backward()
    assert logits is not None
    print(f"end of forward: {end_of_forward:,} B live after {forward_ops} ops; mask {size:,} B")
    print(f"mask freed after op {count.mask_gone} of {count.ops}")
    peak, op, func = count.peak
    print(
        f"largest after the first hook: {peak:,} B at op {op} ({func}), "
        f"{peak - end_of_forward:+,} B from the end of forward"
    )


if __name__ == "__main__":
    main()
