# ruff: noqa: T201 (a script: its report goes to stdout)
"""Which SDPA kernel CUDA picks for a layer's q, k and v, the layout of its output, and what
autograd saves.

For each (q/k width, v width) pair: ``torch._fused_sdp_choice`` on 16-bit inputs laid out as
transformers lays them out (q and k from ``torch.cat``: (b, heads, s, d); v a transposed view;
``--layout view``: q, k and v all transposed views of the projections' (b, s, heads, d)
output, as Llama's attention has them), the aten op that runs, whether
``output.transpose(1, 2)`` is contiguous (if not, transformers' ``.contiguous()`` before
``o_proj`` copies it), and every tensor autograd saves (shape, dtype, bytes). Causal without a
mask, or with ``--mask``, the (b, 1, s, s) boolean mask transformers builds for a padded batch
(or a sliding window)::

    python3 bench/gpu/sdpa_choice.py            # on a CUDA machine
    python3 bench/gpu/sdpa_choice.py --mask --widths 64/64,96/96,128/128,256/256 --seq 1000
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

NAMES = {int(getattr(SDPBackend, n)): n for n in dir(SDPBackend) if n.isupper()}


class _Ops(TorchDispatchMode):
    """The scaled-dot-product aten ops that run."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if "scaled_dot_product" in name or "attention" in name:
            self.ops.append(name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="96/64,192/128,128/128,64/64", help="q/k width/v width")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--mask", action="store_true", help="a (b, 1, s, s) boolean mask")
    ap.add_argument("--layout", choices=["cat", "view"], default="cat")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    a = ap.parse_args()
    print(torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    b, h, s = 2, a.heads, a.seq
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    kw: dict[str, Any] = {"device": "cuda", "dtype": dtype}
    mask = None
    if a.mask:
        mask = torch.ones(b, 1, s, s, device="cuda", dtype=torch.bool).tril()
        mask[-1, :, :, s // 2 :] = False  # the last sequence padded from its middle
    for pair in a.widths.split(","):
        dq, dv = (int(x) for x in pair.split("/"))
        if a.layout == "cat":
            q = torch.randn(b, h, s, dq, **kw, requires_grad=True)
            k = torch.randn(b, h, s, dq, **kw, requires_grad=True)
        else:
            q = torch.randn(b, s, h, dq, **kw, requires_grad=True).transpose(1, 2)
            k = torch.randn(b, s, h, dq, **kw, requires_grad=True).transpose(1, 2)
        v = torch.randn(b, s, h, dv, **kw, requires_grad=True).transpose(1, 2)
        causal = mask is None
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal)
        saved: list[str] = []

        def pack(t: torch.Tensor, saved: list[str] = saved) -> torch.Tensor:
            n = t.untyped_storage().nbytes()
            saved.append(f"{tuple(t.shape)} {str(t.dtype)[6:]} {n:,} B")
            return t

        ops = _Ops()
        with ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        print(
            f"q/k {dq}, v {dv}: {NAMES.get(choice, choice)}; ops {ops.ops}; output strides "
            f"{out.stride()}; transpose(1, 2) contiguous: {out.transpose(1, 2).is_contiguous()}"
        )
        for line in saved:
            print(f"    saved {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
