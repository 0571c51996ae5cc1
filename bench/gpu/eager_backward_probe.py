"""Device memory op by op through an eager-attention model's forward and backward.

transformers' ``eager_attention_forward`` keeps (b, heads, s, s) scores and probabilities;
this prints ``torch.cuda.memory_allocated()`` after every ATen op of forward and backward
and the most allocated during it (a dispatch mode resets the peak before each op), in units
of S = b·heads·s² elements relative to the end of forward, around the softmax, so what the
attention's backward holds on the GPU, its kernels' own temporaries included, can be read off
and compared with the model's
(``calculators.transformers_activations.eager_attention_backward``).

    python3 bench/gpu/eager_backward_probe.py --family llama --batch 2 --seq 1024 2048
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.gpu.op_memory import OpMemory


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="llama")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, nargs="+", default=[1024])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--window", type=int, default=12, help="ops shown either side of softmax")
    ap.add_argument(
        "--autocast",
        action="store_true",
        help="fp32 parameters under torch.autocast(bfloat16), as DDP trains (default: bf16)",
    )
    ap.add_argument("--checkpointing", action="store_true", help="transformers' checkpointing")
    a = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    from measure.hf_families import family_config

    cfg = family_config(a.family, "small")
    cfg["num_hidden_layers"] = a.layers
    body = {k: v for k, v in cfg.items() if k != "model_type"}
    dev = torch.device("cuda")
    with dev:
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(a.family, **body),
            attn_implementation="eager",
            dtype=torch.float32 if a.autocast else torch.bfloat16,
        )
    model.train()
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    for seq in a.seq:
        _probe(model, cfg, a.batch, seq, a.window, a.autocast)
    return 0


def _probe(
    model: torch.nn.Module, cfg: dict, batch: int, seq: int, window: int, autocast: bool
) -> None:
    dev = torch.device("cuda")
    scores = batch * cfg["num_attention_heads"] * seq * seq
    log: list[tuple[str, int, int]] = []

    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device=dev)
    for _ in ("warm-up", "measured"):
        torch.cuda.synchronize()
        log.clear()
        with OpMemory(log):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            end_forward = torch.cuda.memory_allocated()
            n_forward = len(log)
            loss.backward()
        model.zero_grad(set_to_none=True)
        del loss
    i_top = max(range(n_forward, len(log)), key=lambda j: log[j][2])
    top = log[i_top]
    print(
        f"=== b {batch} s {seq}: S = {scores} elements; backward peaks during {top[0]} at end of "
        f"forward + {(top[2] - end_forward) / scores:.3f} S"
    )
    print("--- backward, around its peak (S after / most during each op)")
    for f, m, most in log[max(i_top - window, 0) : i_top + window]:
        print(f"{(m - end_forward) / scores:+8.3f} {(most - end_forward) / scores:+8.3f}  {f}")
    for start, name in ((0, "forward"), (n_forward, "backward")):
        i = next(
            (
                j
                for j in range(start, len(log))
                if "softmax" in log[j][0] and "log" not in log[j][0]
            ),
            None,
        )
        if i is None:
            continue
        print(f"--- {name}, around {log[i][0]} (S after / most during each op)")
        for f, m, most in log[max(i - window, 0) : i + window]:
            print(f"{(m - end_forward) / scores:+8.3f} {(most - end_forward) / scores:+8.3f}  {f}")


if __name__ == "__main__":
    sys.exit(main())
