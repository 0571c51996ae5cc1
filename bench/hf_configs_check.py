# ruff: noqa: T201 (a script: its report goes to stdout)
"""Every ``config.json`` under ``bench/hf_configs`` against transformers' own code, on the CPU.

For each config: the parameter count the calculators read from it against ``sum(p.numel())``
of the model transformers builds on the meta device, and the analytical activations
(``calculators/transformers_activations.py``: saved bytes, autocast weight copies, logits, the
loss's transient copy, the key/value cache) against the trace of transformers' forward on fake
tensors (``measure/trace.py``), in every dtype regime, with and without gradient
checkpointing, at each batch shape. Needs torch and transformers (``pip install -e
".[measure,hf]"``); about 20 s per config on one core. With ``--run-every-layer`` the trace,
which plays the layers that repeat an earlier one (``measure/layer_repeats.py``), is also held
equal to the trace that runs every layer (every figure, and the saved bytes per layer). With
``--padded`` the batches carry a padding ``attention_mask`` (``Batch.padded``); with
``--attn-implementation eager`` the configs are read and traced with eager attention.

    python3 bench/hf_configs_check.py                      # every config, 1 × 2,048 and 2 × 4,096
    python3 bench/hf_configs_check.py bench/hf_configs/phi-4-mini.json --shapes 1x8192
    python3 bench/hf_configs_check.py --shapes 1x2048 --run-every-layer
    python3 bench/hf_configs_check.py --shapes 2x1000 --padded
    python3 bench/hf_configs_check.py --shapes 1x600 --attn-implementation eager
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.activations import Regime, activations  # noqa: E402
from calculators.architecture import count_params  # noqa: E402
from calculators.batch import Batch, Checkpointing  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402
from measure import trace  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "hf_configs"


def check(
    path: Path,
    shapes: list[tuple[int, int]],
    run_every_layer: bool = False,
    padded: bool = False,
    attn_implementation: str = "sdpa",
) -> bool:
    """Print one config's comparisons; whether every one was equal."""
    cfg = json.loads(path.read_text())
    if attn_implementation != "sdpa":
        cfg["attn_implementation"] = attn_implementation
    arch = architecture_from_hf_config(cfg)
    ours, theirs = count_params(arch), trace.count_parameters(cfg)
    ok = ours == theirs
    print(
        f"{path.name}: {ours:,} parameters, transformers {theirs:,}: {'equal' if ok else 'DIFFER'}"
    )
    for b, s in shapes:
        for regime in Regime:
            for full in (False, True):
                ckpt = Checkpointing.FULL if full else Checkpointing.NONE
                batch = Batch(b, s, ckpt, padded=padded)
                a = trace.predicted_figures(activations(arch, batch, regime))
                played = trace.trace(cfg, b, s, regime.value, full, padded=padded)
                t = trace.figures(played)
                same = a == t
                verdict = (
                    "equal" if same else f"DIFFER by {[x - y for x, y in zip(a, t, strict=True)]}"
                )
                if run_every_layer:
                    ran = trace.trace(
                        cfg, b, s, regime.value, full, play_repeats=False, padded=padded
                    )
                    equal = trace.figures(ran) == t and ran.by_layer == played.by_layer
                    same = same and equal
                    verdict += (
                        f"; {played.played_layers} layers played, "
                        f"{'equal to' if equal else 'DIFFER from'} running every layer"
                    )
                ok = ok and same
                label = f"{b} x {s:>5} {regime.value:8} checkpointing={ckpt.value:4}"
                print(f"  {label}: {a[0]:>15,} B saved, {verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="*", type=Path, help="config.json files (default: all)")
    ap.add_argument(
        "--shapes", default="1x2048,2x4096", help="micro-batch x tokens, comma-separated"
    )
    ap.add_argument(
        "--run-every-layer",
        action="store_true",
        help="also trace running every layer, and hold the played trace equal to it",
    )
    ap.add_argument("--padded", action="store_true", help="batches with a padding attention_mask")
    ap.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"])
    ns = ap.parse_args(argv)
    shapes = [(int(b), int(s)) for b, s in (shape.split("x") for shape in ns.shapes.split(","))]
    paths = ns.configs or sorted(CONFIGS.glob("*.json"))
    results = [
        check(p, shapes, ns.run_every_layer, ns.padded, ns.attn_implementation) for p in paths
    ]
    print(f"{sum(results)} of {len(results)} configs equal throughout")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
