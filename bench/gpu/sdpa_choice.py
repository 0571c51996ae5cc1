# ruff: noqa: T201 (a script: its report goes to stdout)
"""Which SDPA kernel CUDA picks for a layer's q, k and v, and the layout of its output.

For each (q/k width, v width) pair: ``torch._fused_sdp_choice`` on 16-bit causal inputs laid
out as transformers lays them out (q and k from ``torch.cat``: (b, heads, s, d); v a
transposed view), and whether ``output.transpose(1, 2)`` is contiguous (if not,
transformers' ``.contiguous()`` before ``o_proj`` copies it)::

    python3 bench/gpu/sdpa_choice.py            # on a CUDA machine
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812
from torch.nn.attention import SDPBackend

NAMES = {int(getattr(SDPBackend, n)): n for n in dir(SDPBackend) if n.isupper()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="96/64,192/128,128/128,64/64", help="q/k width/v width")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args()
    print(torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    b, h, s = 2, a.heads, a.seq
    for pair in a.widths.split(","):
        dq, dv = (int(x) for x in pair.split("/"))
        kw = {"device": "cuda", "dtype": torch.bfloat16}
        q = torch.randn(b, h, s, dq, **kw)
        k = torch.randn(b, h, s, dq, **kw)
        v = torch.randn(b, s, h, dv, **kw).transpose(1, 2)
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        print(
            f"q/k {dq}, v {dv}: {NAMES.get(choice, choice)}; output strides {out.stride()}; "
            f"transpose(1, 2) contiguous: {out.transpose(1, 2).is_contiguous()}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
