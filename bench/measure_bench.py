"""The measure benchmark: a simulated stage 0–3 sweep of a ~1.3B-class (1.4B) GPT on one GPU.

    python3 bench/measure_bench.py            # on a CUDA host; prints one JSON line

Wall time is taken around ``measure.runner.run`` (model builds, 2 warm-up steps and one
recorded step per stage, the comparison with the calculator), and separately for the whole
process (imports and CUDA start-up included).
"""

from __future__ import annotations

import json
import sys
import time

START = time.perf_counter()

from measure.runner import run  # noqa: E402 (timed from before the import)

# 24 x 2048 GPT-2 style, vocabulary 50,304, untied head: 1,416,744,960 parameters
GPT_1_3B = {"layers": 24, "hidden": 2048, "heads": 16, "vocab_size": 50304, "max_seq_len": 1024}


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    spec = {
        "model": {"architecture": GPT_1_3B},
        "dp": 8,
        "stages": [0, 1, 2, 3],
        "precision": "mixed_bf16",
        "optimizer": "adam",
        "engine": "torch",
        "mode": "simulated",
        "device": device,
        "batch": {"micro_batch_size": 4, "seq_len": 1024},
        "steps": 0,
        "warmup_steps": 2,
    }
    t0 = time.perf_counter()
    result = run(spec, lambda _f, _m: None)
    sweep = time.perf_counter() - t0
    env = result["environment"]
    sys.stdout.write(
        json.dumps(
            {
                "device": env.get("device_name"),
                "torch": env["torch"],
                "params": result.get("params"),
                "stages": [r["stage"] for r in result["runs"]],
                "sweep_wall_s": round(sweep, 1),
                "process_wall_s": round(time.perf_counter() - START, 1),
                "peak_errors": [r["relative_error"]["peak"] for r in result["runs"]],
            }
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
