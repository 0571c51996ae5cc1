"""How close the predictions are: every committed measurement predicted again, summarised.

    python -m bench.accuracy             # per (engine, family, metric): runs, median, max
    python -m bench.accuracy --markdown  # the accuracy table of README.md, as CI checks it
    python -m bench.accuracy --runs      # every run's errors

Each file under ``bench/results/`` that a ``SOURCES`` entry matches is read, every run in it is
predicted again with the current ``calculators/`` and compared with what the GPU measured.
Errors are (predicted − measured) / measured. Nothing here imports torch: the measured side is
the committed JSON, the predicted side is ``calculators/``.

A new kind of results file needs one ``SOURCES`` entry: a glob and a reader that turns the file
into ``Run``s. Files written by ``python -m measure.validate`` (``[{"case", "result"}]``, each
result with ``runs``) are read by ``validate_runs`` when each run, or its result, carries the
request it ran (``spec``: the ``/v1/measure`` body) and, where the comparison used engine
settings beyond it, the calculators' ``engine_config``; ``hf_*.json`` files are read that way.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.validate_deepspeed import OPS, predict
from calculators.architecture import Architecture, count_params
from calculators.batch import Batch, Checkpointing
from calculators.config_resolution import Requested
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.engines.torch.allocator import BLOCK_COMPONENTS
from calculators.engines.torch.config import REDUCE_DTYPE, resolve_fsdp_config
from calculators.engines.torch.peak import (
    CONVERT_OUTPUTS,
    CUBLASLT_WORKSPACE,
    TRAINER_LOOP,
    biased_linear_threads,
)
from calculators.hf_config import architecture_from_hf_config
from calculators.memory import estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.presets import get_preset
from calculators.topology import Op, sent_factor
from measure.compare import predicted_communication, predicted_memory, relative_error
from measure.engines.deepspeed_config import deepspeed_config
from measure.hf_families import family_config
from measure.spec import architecture_from_body

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- accuracy table: python -m bench.accuracy --markdown -->", "<!-- end -->"

# metric names as the table shows them
PEAK, RESIDENT = "peak", "resident"
AFTER_FORWARD, AFTER_BACKWARD = "after forward", "after backward"
# the peak against the bytes the tensors asked for (runs that recorded it: the allocator's
# requested_bytes), which leaves out the caching allocator's whole-block hand-outs
PEAK_REQUESTED = "requested peak"
SENT = "bytes sent per rank"
METRICS = (PEAK, PEAK_REQUESTED, RESIDENT, AFTER_FORWARD, AFTER_BACKWARD, SENT)
PADDED = ", padded"  # a family's runs on padded batches, shown as rows of their own
OFFLOADED = ", checkpoint offload"  # transformers' checkpoints keeping their inputs on the host


@dataclass(frozen=True)
class Run:
    """One measured run and the current prediction's errors.

    Attributes:
        source: the results file.
        label: what ran (case, Nd, stage, knobs).
        engine: ``torch`` or ``deepspeed`` (with its version in the table).
        family: the model family that ran.
        stage: ZeRO stage.
        dp: data-parallel degree.
        errors: (predicted − measured) / measured per metric that both sides have.
        allocator_share: the caching allocator's blocks the prediction replays beyond the
            tensors' requests (FSDP2's shards and states), over the measured resident.
    """

    source: str
    label: str
    engine: str
    family: str
    stage: int
    dp: int
    errors: Mapping[str, float]
    allocator_share: float = 0.0


# --- readers ------------------------------------------------------------------------------------

# measure/validate.py PEAK_MODELS, the decoder and batch of each case (kept here: no torch)
PEAK_CASES: dict[str, tuple[Architecture, int, int]] = {
    "GPT 124M": (
        Architecture(layers=12, hidden=768, heads=12, vocab_size=50257, max_seq_len=1024),
        8,
        1024,
    ),
    "GPT 1.4B": (
        Architecture(layers=24, hidden=2048, heads=16, vocab_size=50304, max_seq_len=1024),
        4,
        1024,
    ),
}
GPT = "GPT (measure.workloads)"


def _memory_errors(
    setup: TrainingSetup, stage: Stage, measured: Mapping[str, Any]
) -> tuple[dict[str, float], float]:
    """Each memory metric's error, and the replayed allocator blocks over the measured
    resident (``Run.allocator_share``)."""
    predicted = predicted_memory(estimate(setup, [stage]).stages[0])
    blocks = sum(predicted["components"].get(k, 0) for k in BLOCK_COMPONENTS)
    share = blocks / measured["resident"] if measured.get("resident") else 0.0
    out = {}
    for metric, key in (
        (PEAK, "peak"),
        (PEAK_REQUESTED, "peak_requested"),
        (RESIDENT, "resident"),
        (AFTER_FORWARD, "after_forward"),
        (AFTER_BACKWARD, "after_backward"),
    ):
        error = relative_error(predicted.get(key), measured.get(key))
        if error is not None:
            out[metric] = error
    return out, share


def _sent_error(setup: TrainingSetup, stage: Stage, measured: int) -> dict[str, float]:
    """The bytes-sent error, for runs that sent something (one rank sends nothing)."""
    if not measured:
        return {}
    predicted = predicted_communication(setup, stage)["sent_bytes_per_rank"]
    return {SENT: (predicted - measured) / measured}


def _validate_run(
    path: Path, case: str, run: Mapping[str, Any], setup: TrainingSetup, family: str
) -> Run:
    stage = Stage(run["stage"])
    errors, share = _memory_errors(setup, stage, run["measured"])
    sent = run.get("communication", {}).get("measured_sent_bytes_per_rank", 0)
    errors.update(_sent_error(setup, stage, sent))
    return Run(
        path.name,
        f"{case} | {run.get('mode', '-')} | Nd {run['world_size']} | stage {run['stage']}",
        setup.engine.value,
        family,
        run["stage"],
        run["world_size"],
        errors,
        share,
    )


def warmup_workspace(
    env: Mapping[str, Any], arch: Architecture | None, batch: Batch | None
) -> dict[str, int]:
    """The cuBLASLt workspaces of a torch run whose process made one before its baseline
    whatever the model: results without ``warmup_linear_bias`` were measured after a biased
    warm-up linear, which made the main thread's (``measure.session.runtime_warmup`` now makes
    only those the model makes); a checkpointed model with biased linears makes autograd's
    thread's one too."""
    if env.get("device_type") != "cuda" or "warmup_linear_bias" in env:
        return {}
    threads = max(1, biased_linear_threads(arch, batch))
    return {"cublaslt_workspace_bytes": threads * CUBLASLT_WORKSPACE}


def torch_peak_runs(path: Path) -> list[Run]:
    """``python -m measure.validate --part peak``: the GPT cases of ``PEAK_CASES``."""
    out = []
    for item in json.loads(path.read_text()):
        name, ckpt = item["case"].split(" ckpt=")
        arch, micro, seq = PEAK_CASES[name]
        for run in item["result"]["runs"]:
            setup = TrainingSetup(
                params=item["result"]["params"],
                dp=run["world_size"],
                precision=Precision.MIXED_BF16,
                engine=Engine.TORCH,
                architecture=arch,
                batch=Batch(micro, seq, Checkpointing(ckpt)),
            )
            config = {
                "fsdp_root_reshard_after_forward": True,
                **warmup_workspace(item["result"]["environment"], arch, setup.batch),
            }
            setup = replace(setup, engine_config=config)
            out.append(_validate_run(path, item["case"], run, setup, GPT))
    return out


def _model(spec: Mapping[str, Any]) -> tuple[int, Architecture | None, str]:
    """Ψ, architecture and family of a request's ``model``."""
    if "hf_config" in spec:
        config = spec["hf_config"]
        arch = architecture_from_hf_config(config)
        family = str(config.get("model_type", "hf"))
    elif "preset" in spec:
        arch = get_preset(spec["preset"]).architecture
        family = spec["preset"]
    elif "architecture" in spec:
        arch = architecture_from_body(spec["architecture"])
        family = GPT
    else:
        return int(spec["params"]), None, "bare count"
    return count_params(arch), arch, family


def spec_setup(
    spec: Mapping[str, Any], world: int, config: Mapping[str, Any] | None
) -> tuple[TrainingSetup, str]:
    """The calculators' view of a ``/v1/measure`` request run on ``world`` ranks."""
    params, arch, family = _model(spec["model"])
    batch = spec.get("batch")
    offload = spec.get("offload") or {}
    return (
        TrainingSetup(
            params=params,
            dp=world,
            precision=Precision(spec.get("precision", "mixed_bf16")),
            optimizer=Optimizer(spec.get("optimizer", "adam")),
            engine=Engine(spec.get("engine", "torch")),
            offload=Offload(
                optimizer=OffloadDevice(offload.get("optimizer") or "none"),
                params=OffloadDevice(offload.get("params") or "none"),
            ),
            architecture=arch,
            batch=None
            if batch is None
            else Batch(
                batch["micro_batch_size"],
                batch["seq_len"],
                Checkpointing(batch.get("activation_checkpointing", "none")),
                batch.get("grad_accumulation_steps", 1),
                batch.get("padded", False),
                batch.get("checkpoint_offload", False),
                batch.get("checkpoint_every_n_layers", 1),
            ),
            engine_config=dict(config or spec.get("engine_config") or {}),
        ),
        family,
    )


def validate_runs(path: Path) -> list[Run]:
    """``python -m measure.validate`` output whose runs carry their request (``spec``)."""
    out = []
    for item in json.loads(path.read_text()):
        result = item["result"]
        for run in result["runs"]:
            spec = run.get("spec") or result["spec"]
            setup, family = spec_setup(spec, run["world_size"], run.get("engine_config"))
            out.append(_validate_run(path, item["case"], run, setup, family))
    return out


def _hf_engine_config(
    setup: TrainingSetup,
    stage: Stage,
    linear_patched: bool,
    compute_capability_major: int,
    given: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    converted: bool = False,
) -> dict[str, Any]:
    """The ``engine_config`` that ``measure.runner`` hands the calculators for one HF run.

    As ``RunSettings.engine_config`` builds it on a CUDA device: the loop holds its last outputs;
    torch ≥ 2.9's FSDP2 reshards the root when told to (every torch these files record); a
    DeepSpeed run gets its own config body (with ``given``, the ``engine_config`` every request
    of the file carried: ``validate_hf --engine-config``; a torch run the body its FSDP2
    settings decide), and no cuBLASLt workspace once an earlier stage-3 engine of the process
    replaced ``F.linear``; a torch run the cuBLASLt workspace its process made before the
    baseline (:func:`warmup_workspace` of the result's ``environment``). ``converted``: the run
    wrapped forward as accelerate does (its ``resolved_config`` says so; runs recorded before
    the runner did so never did, whatever their config's keys).
    """
    config: dict[str, Any] = {
        "holds_outputs": True,  # measure's default, which validate_hf keeps
        "compute_capability_major": compute_capability_major,
    }
    if setup.engine is Engine.DEEPSPEED:
        assert setup.batch is not None
        offload = {"optimizer": setup.offload.optimizer.value, "params": setup.offload.params.value}
        config.update(
            deepspeed_config(
                stage,
                setup.precision,
                setup.batch.micro_batch_size,
                setup.batch.grad_accumulation_steps,
                offload,
                given or {},
            )
        )
        if linear_patched and stage is not Stage.PARAMETERS:
            config["cublaslt_workspace_bytes"] = 0
    else:
        config["fsdp_root_reshard_after_forward"] = True
        env = environment or {"device_type": "cuda"}
        config.update(warmup_workspace(env, setup.architecture, setup.batch))
        if given:  # the FSDP2 settings every request carried, as measure resolved them
            asked = Requested(
                stages=(stage,),
                precision=setup.precision,
                offload=setup.offload,
                optimizer=setup.optimizer,
                dp=setup.dp,
            )
            config.update(resolve_fsdp_config(given, asked).config)
        config[CONVERT_OUTPUTS] = converted
    if config.get(TRAINER_LOOP) is True:  # the loop kept the loss alone, as measure ran it
        config["holds_outputs"] = False
    return config


def _converted(result: Mapping[str, Any]) -> bool:
    """Whether a measured run wrapped forward as accelerate does, as its resolved config says."""
    values = (result.get("resolved_config") or {}).get("values") or []
    return any(v.get("key") == CONVERT_OUTPUTS and v.get("value") is True for v in values)


def _filled(given: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with each ``"auto"`` value replaced by what the run resolved it to (its
    resolved config's values; one it left unresolved is dropped, as DeepSpeed drops it)."""
    resolved = {
        v["key"]: v["value"] for v in (result.get("resolved_config") or {}).get("values") or []
    }

    def fill(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, Mapping):
                out[key] = fill(value, f"{path}.")
            elif value != "auto":
                out[key] = value
            elif resolved.get(path) is not None:
                out[key] = resolved[path]
        return out

    return fill(given, "")


# the GPUs whose compute capability the results record by name (it sizes cuBLAS workspaces)
CAPABILITY = {"NVIDIA H100": 9, "NVIDIA H200": 9}


def hf_runs(
    path: Path, converted_as: bool | None = None, without: tuple[str, ...] = ()
) -> list[Run]:
    """``python -m measure.validate_hf``: ``{"world", "size", "cases": [{"family", "engine",
    "checkpointing", "result"}]}``, each result as ``/v1/measure`` returns it.

    The request of each case is rebuilt as ``measure.validate_hf`` builds it (the family's
    config at the file's size; micro-batch and sequence from the workload's name), so every
    run is predicted again from the current calculators. The parameter list is the canonical
    decoder's of the config (the GPU run had the built module's own order, which moves
    ZeroRedundancyOptimizer's and FSDP2's shard boundaries by a few tensors at most).
    ``converted_as`` predicts every torch run as if forward had (true) or had not (false) been
    wrapped as accelerate wraps it (``None``: as each run's resolved config says). ``without``:
    keys of the file's ``engine_config`` to predict the runs without (a request that leaves
    them out).
    """
    data = json.loads(path.read_text())
    given = data.get("engine_config") or {}  # validate_hf --engine-config
    given = {k: v for k, v in given.items() if k not in without}
    out = []
    patched = False  # one process per file: a stage-3 DeepSpeed engine patches F.linear
    for case in data["cases"]:
        result = case["result"]
        env = result["environment"]
        shape = re.search(r"\(transformers, b(\d+) s(\d+)(, padded)?", result["workload"])
        if shape is None:
            raise ValueError(f"{path.name}: no batch in workload {result['workload']!r}")
        padded = shape[3] is not None
        # validate_hf --checkpoint-offload
        ckpt_offload = result["workload"].endswith(", offloaded)")
        # validate_hf --every-n-layers
        every = re.search(r" every (\d+) layers", result["workload"])
        every_n = int(every[1]) if every else 1
        hf_config = family_config(case["family"], data["size"])
        attention = data.get("attn_implementation")  # validate_hf --attn-implementation
        if attention:
            hf_config["attn_implementation"] = attention
        body = {
            "model": {"hf_config": hf_config},
            "dp": result["dp"],
            "stages": [r["stage"] for r in result["runs"]],
            "precision": result["precision"],
            "optimizer": result["optimizer"],
            "engine": case["engine"],
            "mode": result["runs"][0]["mode"],
            "device": "cuda",
            "batch": {
                "micro_batch_size": int(shape[1]),
                "seq_len": int(shape[2]),
                "activation_checkpointing": case["checkpointing"],
                "padded": padded,
                "checkpoint_offload": ckpt_offload,
                "checkpoint_every_n_layers": every_n,
            },
            "allow_slow_cpu": True,
        }
        offloaded = False
        if given and case["engine"] == "torch":  # CPUOffloadPolicy, as measure resolved it
            decided = resolve_fsdp_config(
                given,
                Requested(
                    stages=tuple(Stage(r["stage"]) for r in result["runs"]),
                    precision=Precision(result["precision"]),
                    offload=Offload(),
                    optimizer=Optimizer(result["optimizer"]),
                    dp=result["dp"],
                ),
            ).offload
            offloaded = decided.params is not OffloadDevice.NONE
            body["offload"] = {"optimizer": decided.optimizer.value, "params": decided.params.value}
        size_label = f"{result['params'] / 1e9:.1f}B"
        major = next(v for k, v in CAPABILITY.items() if env["device_name"].startswith(k))
        engine = case["engine"]
        version = env.get(engine) if engine == "deepspeed" else env["torch"]
        for run in result["runs"]:
            stage = Stage(run["stage"])
            bare, family = spec_setup(body, run["world_size"], None)
            converted = _converted(result) if converted_as is None else converted_as
            config = _hf_engine_config(
                bare, stage, patched, major, _filled(given, result), env, converted
            )
            setup, _ = spec_setup(body, run["world_size"], config)
            label = f"{case['family']} ckpt={case['checkpointing']}"
            r = _validate_run(path, f"{data['world']} | {label}", run, setup, family)
            # sizes other than the small configs get their own rows, named by parameter count
            shown = r.family if data["size"] == "small" else f"{r.family} {size_label}"
            shown += PADDED if padded else ""
            shown += OFFLOADED if ckpt_offload else ""
            shown += f", every {every_n} layers" if every_n > 1 else ""
            shown += f", {attention}" if attention else ""
            if engine == "torch" and REDUCE_DTYPE in config:  # FSDP2 reducing in 16 bits
                shown += f", reduce {config[REDUCE_DTYPE]}"
            shown += ", CPU offload" if offloaded else ""
            shown += ", fp32 outputs (accelerate)" if converted else ""
            out.append(
                Run(
                    r.source,
                    r.label,
                    f"{engine} {version}",
                    shown,
                    r.stage,
                    r.dp,
                    r.errors,
                    r.allocator_share,
                )
            )
            patched = patched or (
                engine == "deepspeed"
                and stage is Stage.PARAMETERS
                and given.get("zero_optimization", {}).get("memory_efficient_linear", True)
            )
    return out


@dataclass(frozen=True)
class RealModelRun:
    """One run of ``bench/gpu/real_models_round.sh`` and the setup that predicts it.

    Attributes:
        name: the job's name.
        family: the ``config.json``'s file name.
        engine: ``torch`` or ``deepspeed`` with its version.
        run: the run as ``python -m measure`` printed it.
        setup: the request rebuilt from the job's arguments, as the calculators take it.
    """

    name: str
    family: str
    engine: str
    run: Mapping[str, Any]
    setup: TrainingSetup


def real_model_setups(path: Path) -> list[RealModelRun]:
    """``bench/gpu/real_models_round.sh`` and ``canonical_ds_round.sh``: ``[{"name", "args",
    "result"}]``, each job's ``python -m measure`` arguments beside what it printed. The request
    is rebuilt from those arguments (the model's ``config.json`` and the DeepSpeed config they
    name, read from ``bench/``, or the architecture they give), each job one process (no earlier
    engine patched ``F.linear``); the family is the config's file name, or "canonical" and the
    job's name. A job with no result is left out."""
    from unittest import mock

    from measure.__main__ import parse_args
    from measure.spec import parse_spec

    out = []
    for entry in json.loads(path.read_text()):
        result = entry["result"]
        if result is None:
            continue
        args = [str(ROOT / a) if a.startswith("bench/") else a for a in entry["args"]]
        body = parse_args(args)
        body["device"] = "cuda"
        # the request as the run checked it: the config's "auto" values resolved as the
        # Trainer resolves them (DeepSpeed need not be installed to predict its runs)
        with mock.patch("measure.spec.deepspeed_available", return_value=True):
            checked = parse_spec(body)
        body["precision"] = checked.precision.value
        if "--hf-config" in args:
            family = Path(args[args.index("--hf-config") + 1]).stem
            family += PADDED if "--padded" in args else ""
            family += OFFLOADED if "--checkpoint-offload" in args else ""
        else:  # a model given as architecture: the canonical decoder, named by the job
            family = f"canonical {entry['name'].split('_')[0]}"
        major = next(
            v for k, v in CAPABILITY.items() if result["environment"]["device_name"].startswith(k)
        )
        engine = body.get("engine", "torch")
        version = result["environment"][engine if engine == "deepspeed" else "torch"]
        for run in result["runs"]:
            stage = Stage(run["stage"])
            bare, _ = spec_setup(body, run["world_size"], None)
            config = _hf_engine_config(
                bare, stage, False, major, checked.engine_config, result["environment"]
            )
            setup, _ = spec_setup(body, run["world_size"], config)
            out.append(RealModelRun(entry["name"], family, f"{engine} {version}", run, setup))
    return out


def real_model_runs(path: Path) -> list[Run]:
    """``real_model_setups``' runs, each predicted again."""
    out = []
    for m in real_model_setups(path):
        r = _validate_run(path, m.name, dict(m.run), m.setup, m.family)
        out.append(
            Run(r.source, r.label, m.engine, m.family, r.stage, r.dp, r.errors, r.allocator_share)
        )
    return out


def deepspeed_runs(path: Path) -> list[Run]:
    """``bench/validate_deepspeed.py run``: GPT-2 small/large (untied head, or the tied small one)
    under DeepSpeed,
    predicted as its ``report`` does (``predict``)."""
    data = json.loads(path.read_text())
    out = []
    patched = False  # one process per file: stage 3 patches F.linear for the rest of it
    for r in data["results"]:
        if "error" in r:
            raise ValueError(f"{path.name}: a failed run is committed: {r['error'][:200]}")
        memory, comm = predict(r, patched)
        patched = patched or (
            r["stage"] == 3 and r.get("zero", {}).get("memory_efficient_linear", True)
        )
        errors = {
            RESIDENT: (memory.resident - (r["resident"] - r["baseline"]))
            / (r["resident"] - r["baseline"]),
        }
        if memory.peak is not None:
            errors[PEAK] = (memory.peak - (r["peak"] - r["baseline"])) / (r["peak"] - r["baseline"])
        sent = sum(
            int(c["payload_bytes"] * sent_factor(Op(OPS[c["op"]]), r["dp"]))
            for c in r["collectives"]
        )
        if sent:
            errors[SENT] = (comm.sent_bytes_per_rank - sent) / sent
        knobs = [f"GA {r['ga']}"] if r.get("ga", 1) > 1 else []
        knobs += [f"{k}={v}" for k, v in r.get("zero", {}).items()]
        out.append(
            Run(
                path.name,
                f"{r['model']} | Nd {r['dp']} | {r['precision']} | stage {r['stage']} | "
                f"{'cpu offload' if r['offload'] else 'no offload'} | {', '.join(knobs) or '-'}",
                f"deepspeed {data['deepspeed']}",
                "GPT-2 (tied head)" if "-tied" in r["model"] else "GPT-2 (untied head)",
                r["stage"],
                r["dp"],
                errors,
            )
        )
    return out


@dataclass(frozen=True)
class Source:
    """One kind of results file.

    Attributes:
        pattern: glob under ``bench/results/``.
        read: the file's runs, predicted again.
        scope: what the runs cover beyond stages and Nd (the table says those from the data).
        command: how the file is measured (docs/VALIDATION.md).
    """

    pattern: str
    read: Callable[[Path], list[Run]]
    scope: str
    command: str


SOURCES = (
    Source(
        "torch_peak.json",
        torch_peak_runs,
        "124M and 1.4B, mixed bf16, ± full checkpointing, simulated worlds on 1 × H100",
        "python -m measure.validate --part peak",
    ),
    Source(
        "deepspeed_*.json",
        deepspeed_runs,
        "small and large (the tied head: small, micro-batch 4 and 1), fp16/bf16, ± CPU optimizer "
        "offload, bucket and stage-3 knobs, 1 and 2 × H100/H200 (NCCL)",
        "bench/validate_deepspeed.py run",
    ),
    Source(
        "hf_nccl_*.json",
        hf_runs,
        "transformers 5.17, small configs unless the family names a size, micro-batch "
        "2 × 1,024 tokens (some also 1 × 64 to 1 × 4,096), mixed bf16, "
        "± full checkpointing, H100/H200 (NCCL)",
        "bash bench/gpu/hf_round.sh",
    ),
    Source(
        "real_models/*.json",
        real_model_runs,
        "real models' config.json (bench/hf_configs), transformers 5.17, micro-batch × tokens "
        "2 × 1,024, 1 × 2,048, 2 × 2,048, 4 × 512, 1 × 4,096, 2 × 4,096, 1 × 6,144, 1 × 8,192, "
        "2 × 1,000 or 4 × 1,000, some with 2 or 4 micro-steps, some padded, mixed bf16 (torch "
        "also pure bf16 and fp32), ± full checkpointing, transformers Trainer's ds_config "
        '("auto" values; ± CPU optimizer and parameter offload) for DeepSpeed, H100/H200 (NCCL)',
        "bash bench/gpu/real_models_round.sh (SET=1 to 24)",
    ),
    Source(
        "context/*.json",
        real_model_runs,
        "Qwen3-0.6B's config.json, 1 × 512 tokens, mixed bf16, DDP and FSDP2 stage 3, DeepSpeed "
        "stage 2 (the Trainer's ds_config), Nd 1 on a host's second GPU and Nd 2, H200 (NCCL)",
        "bash bench/gpu/context_round.sh",
    ),
    Source(
        "canonical_ds/*.json",
        real_model_runs,
        "the canonical decoder given as architecture (8 layers, hidden 1,024, an 8,192-token "
        "vocabulary): Llama-style (RMSNorm, gated SiLU, RoPE, no biases) ± full checkpointing "
        "and GPT-2-style (LayerNorm, GELU, biases, tied head), 1 × 4,096 tokens, bf16, "
        "DeepSpeed's defaults, H200 (NCCL)",
        "bash bench/gpu/canonical_ds_round.sh",
    ),
    Source(
        "hf_simulated_*.json",
        hf_runs,
        "Nd 8 and 64 simulated on 1 × H200",
        "python -m measure.validate_hf --simulated 8,64",
    ),
)


# results files of other claims: the planner's step time (docs/VALIDATION.md, "Planner step
# time") and the service's own speed (docs/BENCHMARKS.md)
OTHER_CLAIMS = (
    "plan_validation_*.json",
    "plan_model_check.json",
    "asgi_*.json",
    "http_*.json",
    "path_phase_*.json",
    # DeepSpeed's all-gathers on the CPU: tests/calculators/test_deepspeed_cpu_gathers.py
    "ds_cpu_gathers_*.json",
)


def all_runs(results: Path = RESULTS) -> list[tuple[Source, Run]]:
    """Every committed run of every source, predicted again."""
    out = []
    for source in SOURCES:
        for path in sorted(results.glob(source.pattern)):
            out += [(source, run) for run in source.read(path)]
    return out


# --- summary ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The errors of one (engine, family, metric), over every run that has the metric.

    ``median`` and ``max`` are of |error|; ``lowest`` is the most negative error (the run
    predicted furthest too low), or the smallest when none is negative.
    """

    engine: str
    family: str
    metric: str
    runs: int
    median: float
    max: float
    lowest: float
    stages: tuple[int, ...]
    dps: tuple[int, ...]
    scope: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.engine, self.family, self.metric


def summarise(runs: Iterable[tuple[Source, Run]]) -> list[Summary]:
    groups: dict[tuple[str, str, str], list[tuple[Source, Run]]] = {}
    for source, run in runs:
        for metric in run.errors:
            groups.setdefault((run.engine, run.family, metric), []).append((source, run))
    out = []
    for (engine, family, metric), members in groups.items():
        errors = [run.errors[metric] for _, run in members]
        scopes = dict.fromkeys(source.scope for source, _ in members)
        out.append(
            Summary(
                engine,
                family,
                metric,
                len(errors),
                statistics.median(abs(e) for e in errors),
                max(abs(e) for e in errors),
                min(errors),
                tuple(sorted({run.stage for _, run in members})),
                tuple(sorted({run.dp for _, run in members})),
                "; ".join(scopes),
            )
        )
    order = {m: i for i, m in enumerate(METRICS)}
    return sorted(out, key=lambda s: (s.engine, s.family, order.get(s.metric, len(order))))


def percent(x: float) -> str:
    """A relative error in % as the table writes it (two decimals; -0.00 is 0.00)."""
    text = f"{100 * x:.2f}"
    return "0.00" if text == "-0.00" else text


def _span(values: tuple[int, ...]) -> str:
    return (
        "–".join(map(str, (values[0], values[-1])))
        if len(values) > 2
        else "/".join(map(str, values))
    )


def markdown(summaries: Iterable[Summary]) -> str:
    """The README's accuracy table."""
    lines = [
        "| engine | family | metric | runs | what ran | median \\|error\\| % | max \\|error\\| % "
        "| lowest % |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for s in summaries:
        stages = f"stage{'s' if len(s.stages) > 1 else ''} {_span(s.stages)}"
        what = f"{stages}, Nd {'/'.join(map(str, s.dps))}; {s.scope}"
        lines.append(
            f"| {s.engine} | {s.family} | {s.metric} | {s.runs} | {what} | {percent(s.median)} "
            f"| {percent(s.max)} | {percent(s.lowest)} |"
        )
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The table between the markers in README.md."""
    start = text.index(BEGIN) + len(BEGIN)
    return text[start : text.index(END, start)].strip()


def stated(table: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(median, max) |error| in % per (engine, family, metric), as a markdown table states them."""
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        out[cells[0], cells[1], cells[2]] = (float(cells[5]), float(cells[6]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the README's table")
    ap.add_argument("--runs", action="store_true", help="print every run's errors")
    a = ap.parse_args(argv)
    runs = all_runs()
    summaries = summarise(runs)
    if a.markdown:
        print(markdown(summaries))
        return 0
    if a.runs:
        for _, run in runs:
            errors = ", ".join(f"{k} {percent(v)} %" for k, v in run.errors.items())
            print(f"{run.source} | {run.engine} | {run.label} | {errors}")
        return 0
    for s in summaries:
        print(
            f"{s.engine:18s} {s.family:24s} {s.metric:20s} {s.runs:4d} runs  median "
            f"{percent(s.median):>6s} %  max {percent(s.max):>6s} %  lowest "
            f"{percent(s.lowest):>6s} %"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
