# ruff: noqa: T201 (a script: its report goes to stdout)
"""The reduction kernel's staging buffer, measured on the GPU against
``calculators.reduction_scratch``: for each (tokens, features) shape and dtype, the most the
caching allocator held beyond the gradient while (a) ``grad.sum(0)`` ran, and (b) autograd
reduced an ``nn.Linear``'s bias gradient in its backward (beyond the weight gradient it writes
first), against the predicted bytes.

    python3 bench/gpu/reduction_scratch.py --out reduction_scratch.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from calculators.caching_allocator import block  # noqa: E402
from calculators.reduction_scratch import ReductionDevice, reduction_scratch  # noqa: E402

TOKENS = (64, 256, 1000, 1024, 2048, 4096, 8192, 16384)
FEATURES = (128, 512, 768, 896, 1024, 1026, 3072, 4096, 11008, 14336)


def _sum_scratch(tokens: int, features: int, dtype: torch.dtype) -> int:
    g = torch.randn(tokens, features, dtype=dtype, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = g.sum(0)
    torch.cuda.synchronize()
    held = torch.cuda.max_memory_allocated() - base - block(out.nbytes)
    del g, out
    return held


def _bias_scratch(tokens: int, features: int, dtype: torch.dtype) -> int:
    lin = torch.nn.Linear(64, features, device="cuda", dtype=dtype)
    x = torch.randn(tokens, 64, device="cuda", dtype=dtype)
    y = lin(x)
    grad = torch.randn_like(y)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y.backward(grad)
    torch.cuda.synchronize()
    assert lin.weight.grad is not None and lin.bias is not None and lin.bias.grad is not None
    held = (
        torch.cuda.max_memory_allocated()
        - base
        - block(lin.weight.grad.nbytes)
        - block(lin.bias.grad.nbytes)
    )
    del lin, x, y, grad
    return held


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    device = ReductionDevice(props.multi_processor_count, props.max_threads_per_multi_processor)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for tokens in TOKENS:
            for features in FEATURES:
                predicted = reduction_scratch(features, tokens, device)
                summed = _sum_scratch(tokens, features, dtype)
                bias = _bias_scratch(tokens, features, dtype)
                rows.append(
                    {
                        "dtype": str(dtype).removeprefix("torch."),
                        "tokens": tokens,
                        "features": features,
                        "predicted": predicted,
                        "sum": summed,
                        "bias_backward": bias,
                    }
                )
                print(
                    f"{rows[-1]['dtype']:9} {tokens:6} × {features:6}: predicted {predicted:>11,}"
                    f"  sum {summed:>11,}  bias backward {bias:>11,}"
                )
    off = [r for r in rows if not r["predicted"] == r["sum"] == r["bias_backward"]]
    print(f"{len(rows)} shapes, {len(off)} where a measurement differs from the prediction")
    args.out.write_text(
        json.dumps(
            {
                "device": props.name,
                "multiprocessors": props.multi_processor_count,
                "max_threads_per_multiprocessor": props.max_threads_per_multi_processor,
                "torch": torch.__version__,
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
