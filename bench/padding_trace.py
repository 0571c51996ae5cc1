# ruff: noqa: T201 (a script: its report goes to stdout)
"""What a padded ``attention_mask`` adds to the tensors transformers' forward saves, on the CPU.

Builds a ``config.json`` (layers and vocabulary cut down, so it runs in seconds) with SDPA
attention in bf16, runs one training forward (loss from ``labels``) with no mask, an all-ones
mask and a mask with zeros (the second sequence padded from its middle), and prints the saved
storages each adds or drops against no mask (bytes, shape, dtype, count): what a padding
collator adds, which ``batch.padded`` counts. This runs torch's CPU attention; the figures
follow the kernels a GPU runs (``measure/trace.py``)::

    python3 bench/padding_trace.py bench/hf_configs/qwen3-0.6b.json
    python3 bench/padding_trace.py bench/hf_configs/llama-3.1-8b.json --layers 2 --seq-len 256
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def saved(model: Any, ids: Any, mask: Any) -> Counter[tuple[int, tuple[int, ...], str]]:
    """The storages autograd saves in one forward: (bytes, shape, dtype) -> how many."""
    import torch

    seen: dict[int, tuple[int, tuple[int, ...], str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = (storage.nbytes(), tuple(t.shape), str(t.dtype))
        return t

    kwargs = {} if mask is None else {"attention_mask": mask}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids, **kwargs)
    return Counter(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="a config.json")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    a = ap.parse_args()
    import torch

    from measure.engines.hf import build_hf, hf_config

    body = json.loads(Path(a.config).read_text())
    body.update(num_hidden_layers=a.layers, vocab_size=a.vocab)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        body.pop(key, None)
    torch.manual_seed(0)
    model = build_hf(hf_config(body), torch.device("cpu"), checkpointing=False).to(torch.bfloat16)
    b, s = a.micro_batch_size, a.seq_len
    ids = torch.randint(3, a.vocab - 1, (b, s))
    ones = torch.ones(b, s, dtype=torch.long)
    padded = ones.clone()
    padded[-1, s // 2 :] = 0
    bare = saved(model, ids, None)
    print(f"{Path(a.config).name}: {a.layers} layers, {b} x {s} tokens, bf16, CPU")
    print(f"  no mask: {sum(n * c for (n, _, _), c in bare.items()):,} bytes saved")
    for name, mask in (("all-ones mask", ones), ("padded mask", padded)):
        got = saved(model, ids, mask)
        added, dropped = got - bare, bare - got
        delta = sum(n * c for (n, _, _), c in added.items()) - sum(
            n * c for (n, _, _), c in dropped.items()
        )
        print(f"  {name}: {delta:+,} bytes against no mask")
        for (n, shape, dtype), count in sorted(added.items()):
            print(f"    + {count} x {n:,} B {shape} {dtype}")
        for (n, shape, dtype), count in sorted(dropped.items()):
            print(f"    - {count} x {n:,} B {shape} {dtype}")


if __name__ == "__main__":
    main()
