"""DeepSpeed stage 3 run on this machine's CPU, its all-gathers beside the simulated coordinator's.

DeepSpeed's parameter coordinator decides what is gathered, prefetched and released from the
module trace alone; the device does not enter into it. So a Hugging Face family built with
transformers' own modelling code and trained one rank on the CPU (gloo) gathers exactly what
each rank gathers on GPUs, and a case's gathers can be read here in seconds: the sizes of
``measure.hf_families`` ("tiny" trains in seconds; "medium", ~0.9B, takes a couple of minutes
and ~17 GB), the knobs a JSON object of ``zero_optimization`` keys. Each case runs in a fresh
process; the last of three steps is read (the trace is recorded in the second).

    pip install deepspeed==0.19.8 transformers   # DS_BUILD_OPS=0: no kernels are built
    python3 -m bench.ds_cpu_gathers --families qwen3,mistral --size medium
    python3 -m bench.ds_cpu_gathers --knobs '{"stage3_param_persistence_threshold": 0}'
    python3 -m bench.ds_cpu_gathers --families qwen2,phi3,mixtral --checkpointing full --order
    python3 -m bench.ds_cpu_gathers --hf-config bench/hf_configs/qwen2.5-0.5b.json \\
        --checkpointing full --knobs '{"reduce_bucket_size": 802816,
        "stage3_prefetch_bucket_size": 722534, "stage3_param_persistence_threshold": 8960}'

(the last with the values transformers' Trainer gives the "auto" knobs of
``bench/ds_configs/trainer_auto_zero3.json`` for that model: hidden², 0.9 hidden², 10 hidden)

Prints, per case, forward and backward all-gather calls and elements, DeepSpeed's and the
simulation's (``calculators.engines.deepspeed.stage3``), and the parameters gathered more than
once in forward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Runs in a fresh process: one rank of DeepSpeed stage 3 on the CPU, every all-gather logged.
_RUN = r"""
import collections, json, os, sys
import torch
import deepspeed
from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from transformers import AutoConfig, AutoModelForCausalLM
from measure.hf_families import family_config

family, size, zero = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
checkpointing = sys.argv[4] == "full"
body = json.loads(family) if family.startswith("{") else family_config(family, size)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(
    AutoConfig.for_model(**body), attn_implementation="sdpa", dtype=torch.float32
)
if checkpointing:
    model.gradient_checkpointing_enable()
model.train()
names = {id(p): n for n, p in model.named_parameters()}
modules = {id(m): n for n, m in model.named_modules()}
log = []
steps = []  # the modules the coordinator's trace records, in order (the second step's)
record = ppc.PartitionedParameterCoordinator.record_module

def recorded(self, module):
    steps.append(modules.get(id(module), "?"))
    return record(self, module)

ppc.PartitionedParameterCoordinator.record_module = recorded
gather = ppc.PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_

def logged(self, params, forward, quantize=False):
    new = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    if new:
        log.append((forward, [names[id(p)] for p in new], sum(p.ds_numel for p in new)))
    return gather(self, params, forward, quantize)

ppc.PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = logged
config = {
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3, **zero},
    "zero_force_ds_cpu_optimizer": False,
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
deepspeed.init_distributed(dist_backend="gloo")
engine, *_ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), config=config
)
x = torch.randint(3, body["vocab_size"], (1, 16))
order = {}
for _ in range(3):
    log.clear()
    steps.clear()
    loss = engine(input_ids=x, labels=x).loss
    forward = list(log)
    log.clear()
    n = len(steps)
    engine.backward(loss)
    backward = list(log)
    if steps:
        order = {"forward": steps[:n], "backward": steps[n:]}
    engine.step()
out = {"order": order}
for phase, calls in (("forward", forward), ("backward", backward)):
    twice = collections.Counter(n for _, ns, _ in calls for n in ns)
    out[phase] = {
        "calls": len(calls),
        "elements": sum(e for *_, e in calls),
        "again": sorted(n for n, c in twice.items() if c > 1),
    }
print("RESULT " + json.dumps(out))
"""


def deepspeed_gathers(
    family: str, size: str, zero: dict[str, Any], checkpointing: str = "none"
) -> dict[str, Any]:
    """``family``: a ``measure.hf_families`` name, or a ``config.json`` body as JSON."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DS_ACCELERATOR": "cpu",
        "DS_BUILD_OPS": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": os.environ.get("MASTER_PORT", "29511"),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", _RUN, family, size, json.dumps(zero), checkpointing],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{family} {zero}: no result\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def simulated_gathers(
    family: str, size: str, zero: dict[str, Any], checkpointing: str = "none"
) -> dict[str, Any]:
    """The simulated coordinator's gathers (with ``checkpointing`` "full", every layer's
    forward run again in backward)."""
    from calculators.engines.deepspeed.config import model_steps, parse_config
    from calculators.engines.deepspeed.stage3 import leaf_layers, stage3_trace
    from calculators.hf_config import architecture_from_hf_config
    from calculators.parameters import architecture_params
    from measure.hf_families import family_config

    body = json.loads(family) if family.startswith("{") else family_config(family, size)
    arch = architecture_from_hf_config(body)
    knobs = parse_config({"zero_optimization": {"stage": 3, **zero}})
    knobs = replace(
        knobs,
        leaves=leaf_layers(arch, knobs),
        steps=model_steps(arch),
        recompute=checkpointing == "full",
    )
    params = architecture_params(arch)
    t = stage3_trace(params, knobs)
    names = [p.name for p in params]
    return {
        "forward": {
            "calls": t.forward_calls,
            "elements": t.forward_gathered,
            "again": sorted(names[i] for i, c in enumerate(t.forward_gathers) if c > 1),
        },
        "backward": {"calls": t.backward_calls, "elements": t.backward_gathered},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="llama,qwen3,gemma2,gemma3_text,mistral")
    parser.add_argument("--size", default="tiny", help="a measure.hf_families size")
    parser.add_argument(
        "--knobs",
        action="append",
        help="zero_optimization keys as JSON (repeatable; default: DeepSpeed's defaults)",
    )
    parser.add_argument("--json", type=Path, help="also write the cases here")
    parser.add_argument("--hf-config", type=Path, help="a config.json instead of --families")
    parser.add_argument(
        "--checkpointing", choices=["none", "full"], default="none", help="transformers' own"
    )
    parser.add_argument(
        "--order",
        action="store_true",
        help="also print the backward steps of the last layer as DeepSpeed's trace holds them",
    )
    args = parser.parse_args()
    cases = []
    print("family | knobs | DeepSpeed fwd calls/elements, bwd | simulated | same")
    families = args.families.split(",")
    if args.hf_config:
        families = [json.dumps(json.loads(args.hf_config.read_text()))]
    for family in families:
        for raw in args.knobs or ["{}"]:
            zero = json.loads(raw)
            ds = deepspeed_gathers(family, args.size, zero, args.checkpointing)
            sim = simulated_gathers(family, args.size, zero, args.checkpointing)
            key = [(p["calls"], p["elements"]) for p in (ds["forward"], ds["backward"])]
            mine = [(p["calls"], p["elements"]) for p in (sim["forward"], sim["backward"])]
            case = {"family": family, "knobs": zero, "deepspeed": ds, "simulated": sim}
            if args.checkpointing != "none":
                case["checkpointing"] = args.checkpointing
            cases.append(case)
            name = args.hf_config.stem if args.hf_config else family
            print(f"{name} | {raw} | {key} | {mine} | {'yes' if key == mine else 'NO'}")
            print(f"    gathered again in forward: {ds['forward']['again']}")
            if args.order:
                backward = ds["order"].get("backward", [])
                layers = [m for m in backward if m.startswith("model.layers.")]
                last = layers[0] if layers else ""  # backward meets the last layer first
                mine = [m for m in backward if m == last or m.startswith(last + ".")]
                print(f"    backward steps of {last}: {mine}")
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
