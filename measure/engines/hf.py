"""The user's Hugging Face model, built and trained as transformers users do.

The module is transformers' own modelling code::

    config = AutoConfig.for_model(model_type, **hf_config)   # use_cache as the body says
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             dtype=torch.float32)  # random init, no download
    # (attn_implementation="eager" where the body's "attn_implementation" says so)
    model.gradient_checkpointing_enable()   # when batch.activation_checkpointing is "full"
    # (offload=True when batch.checkpoint_offload: the layers' inputs in pinned host memory)
    loss = model(input_ids=x, labels=x).loss
    # a padded batch: model(input_ids=x, attention_mask=mask, labels=y), the last sequence
    # padded from its middle (mask 0, label -100 there)

built in fp32 (the engines keep an fp32 master; autocast or FSDP2's policy or DeepSpeed casts),
initialised on the device it trains on (no copy). FSDP2 shards each decoder layer
(``model.get_decoder().layers``) and then the root, as the transformers and torchtitan recipes
do. The parameter list the calculator's engine model partitions comes from the same module
built on the meta device (no memory, no initialisation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from calculators.batch import Checkpointing
from measure.spec import MeasureSpec, config_values
from measure.workloads import Batch, Workload


def hf_config(body: Mapping[str, Any]) -> Any:
    """transformers' config object for a ``config.json`` body, as the user's code would build it:
    ``use_cache`` as the body says (transformers' default is on, and a training forward without
    checkpointing fills the key/value cache; the loop below keeps only the logits and the loss,
    so the cache dies with the model output, as it does in transformers' Trainer)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(str(body["model_type"]), **config_values(body))


def build_hf(
    config: Any,
    device: torch.device,
    checkpointing: bool,
    offload: bool = False,
    every_n_layers: int = 1,
) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` on ``device``, fp32, train mode; SDPA attention
    unless the config body's ``attn_implementation`` asked for eager; ``offload``: the
    checkpoints keep their inputs in pinned host memory (transformers' ``offload=True``);
    ``every_n_layers``: only decoder layers 0, n, 2n, ... are checkpointed."""
    from transformers import AutoModelForCausalLM

    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=impl, dtype=torch.float32
        )
    model.train()
    if checkpointing:
        # transformers' default: use_reentrant=False
        options: dict[str, Any] = {"offload": True} if offload else {}
        if every_n_layers > 1:
            options["every_n_layers"] = every_n_layers
        model.gradient_checkpointing_enable(**options)
    return model  # type: ignore[no-any-return]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers FSDP2 wraps one by one (``model.model.layers`` in every family)."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return list(layers)
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList):
            return list(module)
    raise ValueError(f"{type(model).__name__} has no list of decoder layers")


@functools.lru_cache(maxsize=8)
def _meta_tensors(config_json: str) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    import json

    config = hf_config(json.loads(config_json))
    model = build_hf(config, torch.device("meta"), checkpointing=False)
    group_of: dict[int, str] = {}
    for i, layer in enumerate(decoder_layers(model)):
        for p in layer.parameters():
            group_of[id(p)] = f"layers.{i}"
    return tuple(
        (name, tuple(p.shape), group_of.get(id(p), "root"))
        for name, p in model.named_parameters()  # tied weights appear once, as FSDP2 sees them
    )


def hf_tensors(body: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, FSDP group) of each parameter of the model ``body`` describes."""
    import json

    return list(_meta_tensors(json.dumps(dict(body), sort_keys=True)))


IGNORE_INDEX = -100  # transformers' label for positions the loss skips (padding)


def _forward(
    module: Callable[..., Any], x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    out = module(input_ids=x, labels=y)
    return out.logits, out.loss


def _padded_forward(
    module: Callable[..., Any], x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A padding collator's batch: the mask is 0 where the labels skip the position."""
    out = module(input_ids=x, attention_mask=(y != IGNORE_INDEX).long(), labels=y)
    return out.logits, out.loss


def hf_workload(spec: MeasureSpec) -> Workload:
    """The workload of a request whose model is a Hugging Face ``config.json``."""
    body = spec.model.hf_config
    assert body is not None  # ModelKind.HF carries its config
    config = hf_config(body)
    vocab = int(config.vocab_size)
    micro, seq = spec.micro_batch_size, spec.seq_len
    full = spec.checkpointing is Checkpointing.FULL
    padded = spec.batch is not None and spec.batch.padded
    offload = spec.batch is not None and spec.batch.checkpoint_offload
    every = spec.batch.checkpoint_every_n_layers if spec.batch is not None else 1

    def build(device: torch.device) -> nn.Module:
        return build_hf(config, device, full, offload, every)

    def make_batch(device: torch.device, gen: torch.Generator) -> Batch:
        tokens = torch.randint(0, vocab, (micro, seq), generator=gen).to(device)
        if not padded:
            return tokens, tokens  # labels = input_ids: the model shifts them itself
        # the last sequence is half as long as the others: padded from its middle
        labels = tokens.clone()
        labels[-1, seq // 2 :] = IGNORE_INDEX
        return tokens, labels

    return Workload(
        name=f"{body['model_type']} (transformers, b{micro} s{seq}"
        + (", padded" if padded else "")
        + (", eager attention" if body.get("attn_implementation") == "eager" else "")
        + (", gradient checkpointing" if full else "")
        + (f" every {every} layers" if full and every > 1 else "")
        + (", offloaded)" if offload else ")"),
        architecture=spec.model.architecture,
        tensors=hf_tensors(body),
        build=build,
        make_batch=make_batch,
        forward=_padded_forward if padded else _forward,
        shard_units=decoder_layers,
    )
