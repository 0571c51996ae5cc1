"""How a request names its model, and the batch it trains on."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, GetJsonSchemaHandler, StrictBool, StrictInt, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from app.schemas.common import JsonObject, Params, StrictModel
from calculators.architecture import Activation, Norm, PositionEmbedding
from calculators.batch import Checkpointing
from calculators.presets import PRESETS

MODEL_KEYS = ("params", "architecture", "preset", "hf_config")
# measure's MLP presets, mlp or mlp-{layers}x{hidden} (measure/mlp_presets.py), within its bounds
MLP_PRESET_PATTERN = "^mlp(-[1-9][0-9]{0,2}x[1-9][0-9]{0,3})?$"

Dim = Annotated[StrictInt, Field(ge=1, le=1_048_576)]


class ArchitectureIn(StrictModel):
    """A decoder-only transformer; its parameter count is derived exactly."""

    layers: Annotated[StrictInt, Field(ge=1, le=10_000, description="Transformer blocks.")]
    hidden: Annotated[Dim, Field(description="Model width.")]
    heads: Annotated[StrictInt, Field(ge=1, le=65536, description="Attention (query) heads.")]
    vocab_size: Annotated[StrictInt, Field(ge=1, le=16_777_216, description="Vocabulary rows.")]
    ffn_hidden: Annotated[Dim | None, Field(description="MLP inner width; null = 4 × hidden.")] = (
        None
    )
    max_seq_len: Annotated[
        Dim | None, Field(description="Context length (rows of a learned position table).")
    ] = None
    kv_heads: Annotated[
        StrictInt | None, Field(ge=1, le=65536, description="Key/value heads (GQA); null = heads.")
    ] = None
    head_dim: Annotated[Dim | None, Field(description="Width of a head; null = hidden/heads.")] = (
        None
    )
    tied_embeddings: StrictBool = Field(
        False, description="Output head shares the token embedding."
    )
    bias: StrictBool = Field(True, description="Biases on attention and MLP linears and LayerNorm.")
    qkv_bias: StrictBool | None = Field(None, description="Bias on qkv alone; null follows bias.")
    lm_head_bias: StrictBool = Field(False, description="Bias on the output head.")
    norm: Norm = Field(Norm.LAYERNORM, description="layernorm or rmsnorm.")
    position_embedding: PositionEmbedding = Field(
        PositionEmbedding.LEARNED, description="learned, rope, alibi or none."
    )
    position_offset: Annotated[StrictInt, Field(ge=0, le=1024)] = Field(
        0, description="Extra rows in the learned position table (OPT: 2)."
    )
    gated_mlp: StrictBool = Field(False, description="SwiGLU-style gate/up/down MLP.")
    activation: Activation = Field(Activation.GELU, description="MLP activation.")
    num_experts: Annotated[StrictInt, Field(ge=1, le=4096)] = Field(1, description="MoE experts.")
    experts_per_token: Annotated[StrictInt, Field(ge=1, le=4096)] = Field(
        1, description="Experts each token is routed to."
    )
    embedding_norm: StrictBool = Field(False, description="Norm after the embedding (BLOOM).")
    final_norm: StrictBool = Field(True, description="Norm before the output head.")
    embed_proj_dim: Annotated[Dim | None, Field(description="OPT word_embed_proj_dim.")] = None


class ModelSpec(StrictModel):
    """Exactly one of params, architecture, preset or hf_config."""

    params: Params | None = None
    architecture: ArchitectureIn | None = None
    preset: Annotated[
        str | None,
        Field(
            max_length=64,
            description="A name from /v1/presets; /v1/measure also builds mlp-{layers}x{hidden} "
            "(Linear(hidden, hidden) + ReLU layers).",
        ),
    ] = None
    hf_config: Annotated[
        JsonObject | None,
        Field(
            description="The body of a Hugging Face config.json (llama, mistral, gpt2, ...); "
            'add "attn_implementation": "eager" for a model built with eager attention '
            "(SDPA otherwise)."
        ),
    ] = None

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The rule "exactly one of" as ``oneOf``: one form per way of naming the model.

        In each form its own key is required and not null, the other three may only be absent
        or null, and nothing else may appear, so the document accepts what ``exactly_one``
        accepts and nothing more.
        """
        schema = handler.resolve_ref_schema(handler(core_schema))
        props: dict[str, Any] = schema["properties"]
        forms = []
        for key in MODEL_KEYS:
            given = {k: v for k, v in props[key].items() if k not in ("anyOf", "default")}
            given.update(next(s for s in props[key]["anyOf"] if s != {"type": "null"}))
            if key == "preset":
                given["anyOf"] = [
                    {"enum": sorted(PRESETS)},
                    {"pattern": MLP_PRESET_PATTERN, "description": "measure's MLP (L x h)"},
                ]
            forms.append(
                {
                    "title": f"Model by {key}",
                    "type": "object",
                    "properties": {k: given if k == key else {"type": "null"} for k in MODEL_KEYS},
                    "required": [key],
                    "additionalProperties": False,
                }
            )
        return {
            "title": schema.get("title", cls.__name__),
            "description": schema.get("description", ""),
            "type": "object",
            "oneOf": forms,
        }

    @model_validator(mode="after")
    def exactly_one(self) -> Self:
        given = [k for k in MODEL_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of params, architecture, preset, hf_config"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class BatchIn(StrictModel):
    """The micro-batch each data-parallel rank trains on."""

    micro_batch_size: Annotated[
        StrictInt, Field(ge=1, le=65536, description="Sequences per micro-batch.")
    ]
    seq_len: Annotated[StrictInt, Field(ge=1, le=1_048_576, description="Tokens per sequence.")]
    activation_checkpointing: Checkpointing = Field(
        Checkpointing.NONE, description="none, full or selective recomputation."
    )
    grad_accumulation_steps: Annotated[StrictInt, Field(ge=1, le=65536)] = Field(
        1, description="Micro-batches per optimizer step."
    )
    padded: StrictBool = Field(
        False,
        description="The batch comes with an attention_mask that has zeros (a padding "
        "collator's sequences of different lengths). A model built by transformers' modelling "
        "code then attends through a (micro_batch_size, 1, seq_len, seq_len) mask in every "
        "layer: SDPA saves the mask as a bias in q's dtype and key/value expanded to every "
        "query head; seq_len is then the padded length (a collator pads to the longest "
        "sequence of the batch: give the longest the run will see). false: no mask, a mask of "
        "all ones (transformers drops it) or packed sequences. Applies to models given by "
        "hf_config or a preset of a transformers family.",
    )
    checkpoint_offload: StrictBool = Field(
        False,
        description="transformers' gradient checkpointing with offload "
        "(model.gradient_checkpointing_enable(offload=True); transformers' Trainer: "
        'gradient_checkpointing_kwargs={"offload": true}): each checkpointed layer\'s input '
        "is held in pinned host memory (torch.autograd.graph.save_on_cpu) instead of on the "
        "device, and copied back for its recomputation; the bytes show in cpu.activations. "
        "Needs activation_checkpointing full and a model given by hf_config or a preset of a "
        "transformers family.",
    )
    checkpoint_every_n_layers: Annotated[StrictInt, Field(ge=1, le=65536)] = Field(
        1,
        description="transformers' every_n_layers (model.gradient_checkpointing_enable("
        "every_n_layers=n); transformers' Trainer: gradient_checkpointing_kwargs="
        '{"every_n_layers": n}): only decoder layers 0, n, 2n, ... are checkpointed, the others '
        "keep what they save, each by its kind (dense or MoE, sliding-window or full "
        "attention, rotary or not). 1: every layer. Above 1 needs activation_checkpointing "
        "full, a model given by hf_config or a preset of a transformers family, and engine "
        "torch.",
    )
