"""DeepSpeed ZeRO-1/2's backward moments, counted on the CPU: transformers' modelling code, and
the canonical decoder that ``measure/`` builds for a model given as ``architecture``.

DeepSpeed allocates its IPG bucket in the first post-accumulate-grad hook, so the step's peak at
stages 1/2 is the largest live total after that hook. Here the model's own bf16 step runs on the
CPU (DeepSpeed casts the module to 16 bits) under a dispatch mode that sums the storages alive
after every op; a post-accumulate hook on every parameter stands in for DeepSpeed's: at stage 1
it leaves ``param.grad`` alone, at stage 2 it copies the gradient into a bucket and re-points
``param.grad`` at the slice, as ``reduce_independent_p_g_buckets_and_remove_grads`` does. The
largest total after the first hook, above the end of forward, must be what the calculators'
moments after the first gradient give above theirs (``calculators/engines/deepspeed/layouts.py``),
bucket excluded on both sides. Where backward sums a gradient over its leading rows (a bias's,
``sum_to``), CUDA's reduction kernel also holds a staging buffer the CPU's does not: the count
adds it at that op, as ``calculators.reduction_scratch`` sizes it (checked against the GPU by
``tests/calculators/test_reduction_scratch.py``).

The sizes are the ``small`` family configs cut to two layers, and two-layer canonical decoders
(``CANONICAL``), one sequence of 1,024 tokens.
DeepSeek-V3 is left out: its query/key and value head widths differ, so SDPA on the CPU runs the
math kernel, whose saved softmax makes attention's backward the peak (flash or memory-efficient
kernels on a GPU save no such tensor).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


from calculators.architecture import Activation, Architecture, count_params  # noqa: E402
from calculators.batch import Batch, Checkpointing  # noqa: E402
from calculators.conventions import Engine, Optimizer, Precision, Stage  # noqa: E402
from calculators.engines.deepspeed.config import param_list, parse_config  # noqa: E402
from calculators.engines.deepspeed.layouts import stage12, step_shape  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402
from calculators.model_states import TrainingSetup  # noqa: E402
from calculators.reduction_scratch import reduction_scratch  # noqa: E402
from measure.engines.hf import build_hf, hf_config  # noqa: E402
from measure.hf_families import family_config  # noqa: E402
from measure.memory import LiveStorages  # noqa: E402
from measure.workloads import GPT, fp32_cross_entropy  # noqa: E402

SEQ = 1024
# the moments from the first gradient hook on (the loss's backward comes before it; the
# reduction and step are not run here)
AFTER_HOOK = (
    "first_gradient",
    "final_norm_backward",
    "last_layer_backward",
    "recompute",
    "first_block_backward",
    "tied_embedding_backward",
    "end_of_backward",
)


class Live(LiveStorages):
    """Bytes of the storages alive after each op, each once, the bucket's left out; the largest
    total after the first hook."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.ignore: set[int] = set()
        self.hooked = False
        self.peak_after_hook = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.hooked:
            self.peak_after_hook = max(self.peak_after_hook, self.live() + _staging(func, args))
        return out

    def live(self) -> int:
        return self.live_bytes(self.ignore)


def _staging(func: Any, args: Any) -> int:
    """The staging buffer CUDA's reduction kernel holds while it sums a gradient over its
    leading rows, as autograd's ``sum_to`` does for a bias (0 for any other op)."""
    if func is not torch.ops.aten.sum.dim_IntList:
        return 0
    grad, dims = args[0], sorted(d % args[0].dim() for d in args[1])
    if dims != list(range(len(dims))) or not grad.is_contiguous():
        return 0
    rows = 1
    for d in dims:
        rows *= grad.shape[d]
    return reduction_scratch(grad.numel() // rows, rows)


def _measured(
    config: dict[str, Any], stage: int, checkpointing: bool, trainer: bool = False
) -> tuple[int, int]:
    """The largest live total after the first gradient hook, above the end of forward; the
    end of forward's total (``trainer``: the loop keeps the loss alone, as transformers'
    Trainer does)."""
    torch.manual_seed(0)
    model = build_hf(hf_config(config), torch.device("cpu"), checkpointing).to(torch.bfloat16)

    def forward(ids: Any) -> tuple[Any, Any]:
        if trainer:
            return None, model(input_ids=ids, labels=ids.clone()).loss
        out = model(input_ids=ids, labels=ids.clone())
        return out.logits, out.loss

    return _live_count(model, forward, config["vocab_size"], stage)


def _live_count(
    model: Any, forward: Any, vocab: int, stage: int, seq: int = SEQ
) -> tuple[int, int]:
    """``forward(ids)`` -> (logits, loss) under the live count, then backward with DeepSpeed's
    hooks stood in for: the largest total after the first hook above the end of forward, and
    the end of forward's total."""
    params = [p for p in model.parameters() if p.requires_grad]
    bucket = torch.empty(sum(p.numel() for p in params), dtype=torch.bfloat16)
    mode = Live()
    mode.ignore.add(bucket.untyped_storage().data_ptr())
    filled = [0]

    def hook(p: torch.Tensor) -> None:
        mode.hooked = True
        if stage == 2:
            n = p.numel()
            view = bucket.narrow(0, filled[0], n)
            filled[0] += n
            assert p.grad is not None
            view.copy_(p.grad.view(-1))
            p.grad.data = view.view_as(p.grad)

    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    with mode:
        ids = torch.randint(0, vocab, (1, seq))
        logits, loss = forward(ids)
        end_of_forward = mode.live()
        loss.backward()
    del logits  # held through backward unless the loop dropped it (None)
    return mode.peak_after_hook - end_of_forward, end_of_forward


def _predicted(
    config: dict[str, Any], stage: int, checkpointing: bool, trainer: bool = False
) -> int:
    arch = architecture_from_hf_config(config)
    return _predicted_for(arch, stage, checkpointing, trainer=trainer)


def _predicted_for(
    arch: Architecture, stage: int, checkpointing: bool, seq: int = SEQ, trainer: bool = False
) -> int:
    ckpt = Checkpointing.FULL if checkpointing else Checkpointing.NONE
    setup = TrainingSetup(
        params=count_params(arch),
        dp=1,
        precision=Precision.MIXED_BF16,
        optimizer=Optimizer.ADAMW,
        engine=Engine.DEEPSPEED,
        architecture=arch,
        batch=Batch(1, seq, ckpt, 1),
        engine_config={"trainer_loop": True} if trainer else {"holds_outputs": True},
    )
    knobs = parse_config(setup.engine_config)
    params, _ = param_list(setup)
    shape = step_shape(setup, knobs)
    layout = stage12(params, 1, Stage(stage), knobs, 2, shape, True, 1)
    return (
        max(
            m.total - m.buffers.get("ipg_buckets", 0)
            for name, m in layout.moments.items()
            if name in AFTER_HOOK
        )
        - shape.end_of_forward
    )


@pytest.mark.parametrize(
    ("family", "stage", "checkpointing"),
    [
        ("mistral", 1, False),  # untied head: the final norm's backward with its gradient held
        ("mistral", 2, False),  # the head's gradient in the bucket: the first hook's instant
        ("qwen2", 1, False),  # tied head: the first hook is the final norm's weight
        ("gemma2", 2, False),  # soft-capping's tanh output freed; Gemma's norm
        ("mixtral", 1, False),  # the experts' weighted sum, fp32 routing weights
        ("qwen2", 1, True),  # checkpointing, tied: the embedding's backward at the end
        ("mistral", 1, True),  # checkpointing: the first block's MLP backward
    ],
)
def test_backward_moments_match_a_live_storage_count(
    family: str, stage: int, checkpointing: bool
) -> None:
    config = family_config(family, "small")
    config["num_hidden_layers"] = 2
    measured, forward = _measured(config, stage, checkpointing)
    predicted = _predicted(config, stage, checkpointing)
    # vectors of tokens or hidden elements (norm statistics, labels, a norm weight's
    # gradient) are left out of the formulas: within 0.25 % of what forward keeps
    assert abs(predicted - measured) <= forward // 400, (predicted, measured, forward)


@pytest.mark.parametrize(
    ("family", "stage", "checkpointing"),
    [("mistral", 1, False), ("mistral", 2, False), ("qwen2", 1, True)],
)
def test_backward_moments_under_transformers_trainer_loop(
    family: str, stage: int, checkpointing: bool
) -> None:
    # transformers' Trainer keeps the loss alone: the logits are gone before backward
    config = family_config(family, "small")
    config["num_hidden_layers"] = 2
    measured, forward = _measured(config, stage, checkpointing, trainer=True)
    predicted = _predicted(config, stage, checkpointing, trainer=True)
    assert abs(predicted - measured) <= forward // 400, (predicted, measured, forward)
    # what forward leaves alive lacks the 16-bit logits, and only them
    _, kept = _measured(config, stage, checkpointing)
    assert kept - forward == 2 * SEQ * config["vocab_size"]


# the canonical decoder (measure.workloads.GPT): a small vocabulary, so the last block's MLP
# backward, not the head's gradient, sets the largest instant after the first hook. LayerNorm
# only: on the CPU ``F.rms_norm`` runs decomposed, saving fp32 intermediates a GPU kernel does
# not, so an RMSNorm model's count would part from the GPU's at the norms' backward
CANONICAL = {
    "gpt2-style": Architecture(
        layers=2,
        hidden=256,
        heads=4,
        vocab_size=512,
        max_seq_len=SEQ,
        ffn_hidden=2048,
        tied_embeddings=True,
    ),
    "gated": Architecture(
        layers=2,
        hidden=256,
        heads=4,
        vocab_size=512,
        max_seq_len=SEQ,
        ffn_hidden=1024,
        activation=Activation.SILU,
        gated_mlp=True,
        bias=False,
    ),
}


@pytest.mark.parametrize(
    ("name", "stage", "checkpointing"),
    [
        ("gpt2-style", 2, False),  # the output projection's gradients, the weight's moved
        ("gpt2-style", 1, True),  # checkpointing, tied: the first block's MLP backward
        ("gated", 1, False),  # the gated product's two gradients, down's weight kept
        ("gated", 2, False),
        ("gated", 1, True),  # checkpointing: the first block's MLP backward
    ],
)
def test_canonical_decoder_backward_moments_match_a_live_storage_count(
    name: str, stage: int, checkpointing: bool
) -> None:
    arch = CANONICAL[name]
    torch.manual_seed(0)
    model = GPT(arch, "full" if checkpointing else "none").to(torch.bfloat16)

    def forward(ids: Any) -> tuple[Any, Any]:
        logits = model(ids)
        return logits, fp32_cross_entropy(logits, ids)

    measured, forward_total = _live_count(model, forward, arch.vocab_size, stage)
    predicted = _predicted_for(arch, stage, checkpointing)
    assert abs(predicted - measured) <= forward_total // 400, (predicted, measured, forward_total)
