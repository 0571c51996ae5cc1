"""``python -m measure``: measure the engines without the service, JSON on stdout.

Examples::

    python -m measure --preset gpt2 --dp 8 --mode simulated --device cuda
    python -m measure --hf-config config.json --dp 8 --mode simulated --stages 3   # transformers
    python -m measure --architecture '{"layers": 2, "hidden": 256, "heads": 4,
        "vocab_size": 1024, "max_seq_len": 128}' --dp 4 --precision fp32 --device cpu
    torchrun --nproc-per-node 8 -m measure --preset gpt2 --dp 8   # one rank per GPU, any nodes
    python -m measure --preset gpt2 --dp 2 --engine deepspeed --engine-config ds_config.json \
        --micro-batch-size 4 --seq-len 512   # the config you train with, "auto" values included

With --engine-config, the fields it decides (stages, precision, optimizer, offload, accumulation,
checkpointing) come from it unless given here too; a flag given here must agree with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from calculators.errors import InputError


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m measure", description=__doc__.splitlines()[0])
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", help="a /v1/presets name, mlp (12 x 2048) or mlp-{L}x{h}")
    model.add_argument("--architecture", help="architecture JSON object")
    model.add_argument("--hf-config", help="path to a Hugging Face config.json")
    model.add_argument("--spec", help="path to a whole POST /v1/measure body (JSON)")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--stages", help="comma-separated ZeRO stages (default 0,1,2,3)")
    p.add_argument("--engine", default="torch", choices=["torch", "deepspeed"])
    p.add_argument(
        "--engine-config",
        help="path to the JSON config you train with: a DeepSpeed config (engine deepspeed, "
        '"auto" values as transformers\' Trainer fills them) or FSDP2 settings (engine torch)',
    )
    p.add_argument("--precision", help="training precision (default mixed_bf16)")
    p.add_argument("--optimizer", help="optimizer (default adam)")
    p.add_argument("--offload-optimizer", choices=["none", "cpu", "nvme"])
    p.add_argument("--offload-params", choices=["none", "cpu", "nvme"])
    p.add_argument("--mode", default="auto", choices=["simulated", "distributed", "auto"])
    p.add_argument("--device", default="auto", choices=["cuda", "cpu", "auto"])
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--activation-checkpointing", help="none, full or selective (default none)")
    p.add_argument("--grad-accumulation-steps", type=int, help="default 1")
    p.add_argument(
        "--padded",
        action="store_true",
        help="padded batches: an attention_mask with zeros (a transformers model's last "
        "sequence padded from its middle)",
    )
    p.add_argument(
        "--checkpoint-offload",
        action="store_true",
        help="transformers' gradient checkpointing with offload=True: the checkpointed layers' "
        "inputs in pinned host memory (needs --activation-checkpointing full)",
    )
    p.add_argument(
        "--checkpoint-every-n-layers",
        type=int,
        default=None,
        help="transformers' every_n_layers: checkpoint decoder layers 0, n, 2n, ... only (needs "
        "--activation-checkpointing full)",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument(
        "--allow-slow-cpu",
        action="store_true",
        help="run on the CPU even when the run's arithmetic alone takes over a minute there",
    )
    p.add_argument(
        "--host-probe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time the micro-step at one 32-token sequence (the host's dispatch, for "
        "POST /v1/calibrations); default: on a GPU only",
    )
    p.add_argument(
        "--grad-sync",
        choices=["per_micro_step", "per_step"],
        help="under accumulation, DDP (stages 0-1) reduces every micro-step (default) or once "
        "per step, the other micro-steps under no_sync",
    )
    a = p.parse_args(argv)
    if a.spec:
        with open(a.spec) as f:
            return dict(json.load(f))
    if a.preset:
        model_spec: dict[str, Any] = {"preset": a.preset}
    elif a.architecture:
        model_spec = {"architecture": json.loads(a.architecture)}
    else:
        with open(a.hf_config) as f:
            model_spec = {"hf_config": json.load(f)}
    spec: dict[str, Any] = {
        "model": model_spec,
        "dp": a.dp,
        "engine": a.engine,
        "allow_slow_cpu": a.allow_slow_cpu,
        "mode": a.mode,
        "device": a.device,
        "steps": a.steps,
        "warmup_steps": a.warmup_steps,
        "host_probe": a.host_probe,
    }
    if a.grad_sync is not None:
        spec["grad_sync"] = a.grad_sync
    # a flag left out is a field left out: the spec's default, or what --engine-config decides
    if a.stages is not None:
        spec["stages"] = [int(s) for s in a.stages.split(",") if s.strip()]
    for key in ("precision", "optimizer"):
        if getattr(a, key) is not None:
            spec[key] = getattr(a, key)
    offload = {
        key: value
        for key, value in (("optimizer", a.offload_optimizer), ("params", a.offload_params))
        if value is not None
    }
    if offload:
        spec["offload"] = offload
    if a.engine_config:
        with open(a.engine_config) as f:
            spec["engine_config"] = json.load(f)
    if a.micro_batch_size or a.seq_len:
        if not (a.micro_batch_size and a.seq_len):
            p.error("--micro-batch-size and --seq-len go together")
        spec["batch"] = {"micro_batch_size": a.micro_batch_size, "seq_len": a.seq_len}
        for key in ("activation_checkpointing", "grad_accumulation_steps"):
            if getattr(a, key) is not None:
                spec["batch"][key] = getattr(a, key)
        if a.padded:
            spec["batch"]["padded"] = True
        if a.checkpoint_offload:
            spec["batch"]["checkpoint_offload"] = True
        if a.checkpoint_every_n_layers is not None:
            spec["batch"]["checkpoint_every_n_layers"] = a.checkpoint_every_n_layers
    elif a.activation_checkpointing is not None or a.grad_accumulation_steps is not None:
        p.error("--activation-checkpointing and --grad-accumulation-steps need a batch")
    elif a.padded or a.checkpoint_offload or a.checkpoint_every_n_layers is not None:
        p.error("--padded, --checkpoint-offload and --checkpoint-every-n-layers need a batch")
    return spec


def main(argv: list[str] | None = None) -> int:
    from measure.runner import run

    spec = parse_args(argv)

    def progress(fraction: float, message: str) -> None:
        if os.environ.get("RANK", "0") == "0":
            sys.stderr.write(f"[{fraction:4.0%}] {message}\n")

    try:
        result = run(spec, progress)
    except InputError as err:
        error = {"error": {"field": err.field, "message": err.message}}
        sys.stderr.write(json.dumps(error) + "\n")
        return 2
    if result:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
