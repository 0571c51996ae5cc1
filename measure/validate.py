"""GPU validation of the torch engine profile: prints markdown tables, writes JSON.

    python -m measure.validate --part a   # one GPU: simulated Nd 1, 8, 64; ~1B GPT; mlp-12x2048
    python -m measure.validate --part b   # every local GPU over NCCL, stages 0-3
    python -m measure.validate --part peak  # one GPU: resident and peak, 2 sizes, Nd 1-64,
                                            # stages 0-3, with and without checkpointing

    python -m measure.validate --part hf ...  # Hugging Face families: measure.validate_hf

``--tiny`` swaps in CPU-sized models to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from measure.runner import run

# ~1.1B parameters: 24 x 12 x 1792^2 in the blocks + 2 x 50257 x 1792 embeddings/head
GPT_1B = {"layers": 24, "hidden": 1792, "heads": 14, "vocab_size": 50257, "max_seq_len": 1024}
GPT_TINY = {"layers": 2, "hidden": 128, "heads": 4, "vocab_size": 512, "max_seq_len": 64}
MIB = 2**20


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f} %"


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / MIB:,.1f}"


HEADER = (
    "| case | mode | Nd | stage | engine | measured resident MiB | of which runtime baseline MiB "
    "| model-state resident MiB: allocated / requested / predicted | error vs allocated "
    "| error vs requested | params / grads / optim error | measured peak MiB | predicted peak "
    "| comm sent/rank MiB (measured / predicted) | comm error | step s |\n|" + "---|" * 16
)


def rows(case: str, result: dict[str, Any]) -> list[str]:
    out = []
    for r in result["runs"]:
        m, p, e, c = r["measured"], r["predicted"], r["relative_error"], r["communication"]
        out.append(
            f"| {case} | {r['mode']} | {r['world_size']} | {r['stage']} | {r['engine_name']} "
            f"| {_mib(m['resident'])} | {_mib(m['baseline'])} "
            f"| {_mib(m['model_state_resident'])} / {_mib(m['model_state_requested'])} / "
            f"{_mib(p['model_state_resident'])} "
            f"| {_pct(e['model_state_resident'])} | {_pct(e['model_state_requested'])} "
            f"| {_pct(e['parameters'])} / {_pct(e['gradients'])} / {_pct(e['optimizer_states'])} "
            f"| {_mib(m['peak'])} | {_mib(p['peak'])} "
            f"| {_mib(c['measured_sent_bytes_per_rank'])} / "
            f"{_mib(c['predicted_sent_bytes_per_rank'])} | {_pct(c['relative_error'])} "
            f"| {'n/a' if r['step_time_s'] is None else format(r['step_time_s'], '.3f')} |"
        )
    return out


def part_a(tiny: bool, device: str) -> list[tuple[str, dict[str, Any]]]:
    gpt = GPT_TINY if tiny else GPT_1B
    batch = {"micro_batch_size": 1, "seq_len": 32 if tiny else 512}
    out = []
    for dp in (1, 8, 64):
        spec: dict[str, Any] = {
            "model": {"architecture": gpt},
            "dp": dp,
            "stages": [0, 1, 2, 3],
            "precision": "mixed_bf16",
            "optimizer": "adam",
            "engine": "torch",
            "mode": "simulated",
            "device": device,
            "batch": batch,
            "steps": 2,
            "warmup_steps": 2,
        }
        out.append((f"GPT {'tiny' if tiny else '1.1B'} bf16", run(spec, _log)))
    mlp = "mlp-12x128" if tiny else "mlp-12x2048"
    spec = {
        "model": {"preset": mlp},
        "dp": 4,
        "stages": [0, 1, 2, 3],
        "precision": "fp32",
        "optimizer": "adam",
        "engine": "torch",
        "mode": "simulated",
        "device": device,
        "steps": 2,
        "warmup_steps": 2,
    }
    out.append((f"MLP {mlp} fp32", run(spec, _log)))
    return out


def part_b(tiny: bool, device: str, dp: int) -> list[tuple[str, dict[str, Any]]]:
    gpt = GPT_TINY if tiny else GPT_1B
    spec = {
        "model": {"architecture": gpt},
        "dp": dp,
        "stages": [0, 1, 2, 3],
        "precision": "mixed_bf16",
        "optimizer": "adam",
        "engine": "torch",
        "mode": "distributed",
        "device": device,
        "batch": {"micro_batch_size": 1, "seq_len": 32 if tiny else 512},
        "steps": 2,
        "warmup_steps": 2,
    }
    return [(f"GPT {'tiny' if tiny else '1.1B'} bf16", run(spec, _log))]


# The resident-and-peak sweep: a GPT-2-small-sized and a ~1.4B decoder, GPT-2 style (learned
# positions, LayerNorm, biased linears, ffn 4h GELU, untied bias-free head), mixed bf16, Adam.
PEAK_MODELS = {
    "GPT 124M": (
        {"layers": 12, "hidden": 768, "heads": 12, "vocab_size": 50257, "max_seq_len": 1024},
        {"micro_batch_size": 8, "seq_len": 1024},
    ),
    "GPT 1.4B": (
        {"layers": 24, "hidden": 2048, "heads": 16, "vocab_size": 50304, "max_seq_len": 1024},
        {"micro_batch_size": 4, "seq_len": 1024},
    ),
}
PEAK_TINY = {"GPT tiny": (GPT_TINY, {"micro_batch_size": 2, "seq_len": 32})}


def part_peak(tiny: bool, device: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, (arch, batch) in (PEAK_TINY if tiny else PEAK_MODELS).items():
        for ckpt in ("none", "full"):
            for dp in (1, 2, 4, 8, 64):
                spec = {
                    "model": {"architecture": arch},
                    "dp": dp,
                    "stages": [0, 1, 2, 3],
                    "precision": "mixed_bf16",
                    "optimizer": "adam",
                    "engine": "torch",
                    "mode": "simulated",
                    "device": device,
                    "batch": dict(batch, activation_checkpointing=ckpt),
                    "steps": 1,
                    "warmup_steps": 2,
                }
                out.append((f"{name} ckpt={ckpt}", run(spec, _log)))
    return out


PEAK_HEADER = (
    "| case | Nd | stage | resident MiB measured / predicted | error | peak MiB measured / "
    "predicted | error | predicted peak moment |\n|" + "---|" * 8
)


def peak_rows(case: str, result: dict[str, Any]) -> list[str]:
    out = []
    for r in result["runs"]:
        m, p, e = r["measured"], r["predicted"], r["relative_error"]
        moment = next((n for n in p["notes"] if n.startswith("peak at ")), "")
        out.append(
            f"| {case} | {r['world_size']} | {r['stage']} | {_mib(m['resident'])} / "
            f"{_mib(p['resident'])} | {_pct(e['resident'])} | {_mib(m['peak'])} / "
            f"{_mib(p['peak'])} | {_pct(e['peak'])} | {moment.split(';')[0][8:]} |"
        )
    return out


def peak_summary(results: list[tuple[str, dict[str, Any]]]) -> str:
    import statistics

    lines = []
    for key in ("resident", "peak"):
        errs = [
            abs(r["relative_error"][key])
            for _, res in results
            for r in res["runs"]
            if r["relative_error"][key] is not None
        ]
        if errs:
            lines.append(
                f"{key}: {len(errs)} runs, median |error| {100 * statistics.median(errs):.2f} %, "
                f"max |error| {100 * max(errs):.2f} %"
            )
    return "\n".join(lines)


def _log(fraction: float, message: str) -> None:
    sys.stderr.write(f"  [{fraction:4.0%}] {message}\n")


def main() -> int:
    if sys.argv[1:3] == ["--part", "hf"]:  # the families' run has its own options
        from measure import validate_hf

        return validate_hf.main(sys.argv[3:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["a", "b", "peak"], required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.part == "a":
        results = part_a(a.tiny, a.device)
    elif a.part == "b":
        results = part_b(a.tiny, a.device, a.dp)
    else:
        results = part_peak(a.tiny, a.device)
    env = results[0][1]["environment"]
    lines = [
        f"Device: {env.get('device_name')} (torch {env['torch']}, CUDA {env.get('cuda')}, "
        f"NCCL {env.get('nccl')}), {env.get('gpus')} GPU(s) visible. Wall time "
        f"{time.perf_counter() - t0:.0f} s. MiB = 2^20 bytes. Errors are "
        "(predicted - measured) / measured.",
        "",
        PEAK_HEADER if a.part == "peak" else HEADER,
    ]
    for case, result in results:
        lines += peak_rows(case, result) if a.part == "peak" else rows(case, result)
    if a.part == "peak":
        lines += ["", peak_summary(results)]
    text = "\n".join(lines)
    sys.stdout.write(text + "\n")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"validation_{a.part}.md").write_text(text + "\n")
    (out / f"validation_{a.part}.json").write_text(
        json.dumps([{"case": c, "result": r} for c, r in results], indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
