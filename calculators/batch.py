"""The training batch: what activation and peak estimates need besides the model."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from calculators.errors import InputError


class Checkpointing(StrEnum):
    """Activation checkpointing (recomputation) policy."""

    NONE = "none"
    FULL = "full"
    """Each block keeps only its input; everything else is recomputed in backward."""
    SELECTIVE = "selective"
    """Attention internals are recomputed (Korthikanti et al. 2022 §4.2)."""


@dataclass(frozen=True)
class Batch:
    """One micro-batch.

    Attributes:
        micro_batch_size: sequences per micro-batch per data-parallel rank.
        seq_len: tokens per sequence.
        activation_checkpointing: recomputation policy.
        grad_accumulation_steps: micro-batches per optimizer step.
        padded: the micro-batch comes with an ``attention_mask`` that has padding (a padding
            collator's sequences of different lengths). Models built by transformers' modelling
            code then attend through a (batch, 1, seq, seq) mask, which changes what attention
            saves; an unpadded or packed batch (or a mask of all ones, which transformers
            drops) is ``False``.
        checkpoint_offload: transformers' gradient checkpointing with ``offload=True``
            (``gradient_checkpointing_enable(offload=True)``; the Trainer's
            ``gradient_checkpointing_kwargs={"offload": True}``): each checkpointed layer's
            input is packed into pinned host memory (``torch.autograd.graph.save_on_cpu``) and
            copied back for the layer's recomputation. Needs full checkpointing.
        checkpoint_every_n_layers: transformers' ``every_n_layers`` (``gradient_checkpointing_
            enable(every_n_layers=n)``; the Trainer's ``gradient_checkpointing_kwargs``): only
            decoder layers 0, n, 2n, ... are checkpointed, the others keep what they save. 1:
            every layer. Above 1 needs full checkpointing.
    """

    micro_batch_size: int
    seq_len: int
    activation_checkpointing: Checkpointing = Checkpointing.NONE
    grad_accumulation_steps: int = 1
    padded: bool = False
    checkpoint_offload: bool = False
    checkpoint_every_n_layers: int = 1

    def __post_init__(self) -> None:
        for name in (
            "micro_batch_size",
            "seq_len",
            "grad_accumulation_steps",
            "checkpoint_every_n_layers",
        ):
            if getattr(self, name) < 1:
                raise InputError(f"batch.{name}", "must be at least 1")
        if self.checkpoint_offload and self.activation_checkpointing is not Checkpointing.FULL:
            raise InputError(
                "batch.checkpoint_offload",
                "offloads the inputs full checkpointing keeps: needs activation_checkpointing full",
            )
        if self.checkpoint_every_n_layers > 1 and (
            self.activation_checkpointing is not Checkpointing.FULL
        ):
            raise InputError(
                "batch.checkpoint_every_n_layers",
                "picks which layers full checkpointing checkpoints: needs activation_checkpointing "
                "full",
            )

    def checkpointed_layers(self, layers: int) -> int:
        """How many of ``layers`` decoder layers are checkpointed."""
        if self.activation_checkpointing is not Checkpointing.FULL:
            return 0
        return -(-layers // self.checkpoint_every_n_layers)

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len
