"""The one request builder: command-line options in, the API's JSON body out.

Every command hands its options here by parameter name; ``FIELDS`` says where each lands in the
body and how its text is read. Sizes and counts are read by ``app.core.units``, as the API reads
the same strings, so ``--params 7.5B`` and ``{"params": "7.5B"}`` are one number.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import units


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""


def parse_size(text: str, option: str = "--device-memory") -> int:
    """``80GB`` → 80·10^9, ``80GiB`` → 80·2^30, ``1234`` → 1234 bytes; whole bytes only."""
    try:
        return units.parse_size(text)
    except ValueError as e:
        raise CliError(f"{option}: {e}") from None


def parse_count(text: str, option: str = "--params") -> int:
    """``7.5B``, ``7.5e9``, ``7500000000`` and ``124,439,808``; ``7,5B`` is refused."""
    try:
        return units.parse_count(text)
    except ValueError as e:
        raise CliError(f"{option}: {e}") from None


def parse_stages(text: str, option: str = "--stages") -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"{option}: expected a list like 0,1,2,3, got {text!r}") from None


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    return text


def read_json(source: str, option: str) -> Any:
    """A JSON file, or ``-`` for stdin."""
    try:
        raw = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise CliError(f"{option}: {e.strerror}: {source}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise CliError(f"{option}: not valid JSON ({e})") from None


def parse_arch(text: str, option: str = "--arch") -> dict[str, Any]:
    """``layers=12,hidden=1024,heads=16,vocab_size=32000`` or a path to a JSON file."""
    if "=" not in text and Path(text).is_file():
        loaded = read_json(text, option)
        if not isinstance(loaded, dict):
            raise CliError(f"{option}: the file must hold a JSON object")
        return loaded
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise CliError(f"{option}: expected name=value, got {part!r}")
        fields[name.strip()] = _scalar(value.strip())
    return fields


@dataclass(frozen=True)
class BodyField:
    """Where one option lands in the request body, and how its text becomes JSON."""

    option: str
    path: tuple[str, ...]
    read: Callable[[Any, str], Any] | None = None


# The model: exactly one of these four options (ModelSpec's own rule, checked here first so the
# message names options rather than fields).
MODEL_OPTIONS: Mapping[str, BodyField] = {
    "params": BodyField("--params", ("model", "params"), parse_count),
    "preset": BodyField("--preset", ("model", "preset")),
    "arch": BodyField("--arch", ("model", "architecture"), parse_arch),
    "hf_config": BodyField("--hf-config", ("model", "hf_config"), read_json),
}

# Every other option, by the parameter name the commands give it.
FIELDS: Mapping[str, BodyField] = {
    **MODEL_OPTIONS,
    "dp": BodyField("--dp", ("dp",)),
    "tp": BodyField("--tp", ("tp",)),
    "pp": BodyField("--pp", ("pp",)),
    "stages": BodyField("--stages", ("stages",), parse_stages),
    "precision": BodyField("--precision", ("precision",)),
    "optimizer": BodyField("--optimizer", ("optimizer",)),
    "optimizer_state_bytes": BodyField("--k", ("k",)),
    "gradients": BodyField("--gradients", ("gradients",)),
    "offload_optimizer": BodyField("--offload-optimizer", ("offload", "optimizer")),
    "offload_params": BodyField("--offload-params", ("offload", "params")),
    "engine": BodyField("--engine", ("engine",)),
    "engine_config": BodyField("--engine-config", ("engine_config",), read_json),
    "micro_batch": BodyField("--micro-batch", ("batch", "micro_batch_size")),
    "seq_len": BodyField("--seq-len", ("batch", "seq_len")),
    "checkpointing": BodyField("--checkpointing", ("batch", "activation_checkpointing")),
    "grad_accum": BodyField("--grad-accum", ("batch", "grad_accumulation_steps")),
    "padded": BodyField("--padded", ("batch", "padded")),
    "checkpoint_offload": BodyField("--checkpoint-offload", ("batch", "checkpoint_offload")),
    "checkpoint_every_n_layers": BodyField(
        "--checkpoint-every-n-layers", ("batch", "checkpoint_every_n_layers")
    ),
    # /v1/communication takes accumulation steps beside the model, not in a batch
    "grad_accumulation_steps": BodyField("--grad-accum", ("grad_accumulation_steps",)),
    "recomputation": BodyField("--checkpointing", ("activation_checkpointing",)),
    "device_memory": BodyField("--device-memory", ("device_memory",), parse_size),
    "max_dp": BodyField("--max-dp", ("max_dp",)),
    "nodes": BodyField("--nodes", ("nodes",)),
    "gpus_per_node": BodyField("--gpus-per-node", ("gpus_per_node",)),
    "interconnect": BodyField("--interconnect", ("interconnect",)),
    "inter_node": BodyField("--inter-node-interconnect", ("inter_node_interconnect",)),
    "mode": BodyField("--mode", ("mode",)),
    "device": BodyField("--device", ("device",)),
    "steps": BodyField("--steps", ("steps",)),
}


def build_request(base: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request: ``--body`` (a JSON file or ``-``) first, then every option given over it."""
    body: dict[str, Any] = {}
    if base is not None:
        loaded = read_json(base, "--body")
        if not isinstance(loaded, dict):
            raise CliError("--body: must be a JSON object")
        body = loaded
    given = {name: value for name, value in options.items() if value is not None}
    models = [MODEL_OPTIONS[name].option for name in given if name in MODEL_OPTIONS]
    if len(models) > 1:
        raise CliError(f"give one model, not {' and '.join(models)}")
    if models:
        body.pop("model", None)  # the option names the model; --body's own choice gives way
    for name, value in given.items():
        field = FIELDS[name]
        *parents, leaf = field.path
        node = body
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[leaf] = value if field.read is None else field.read(value, field.option)
    return body
