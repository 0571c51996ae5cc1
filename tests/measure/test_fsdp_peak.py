"""FSDP2's step peak on the CPU, simulated world: every live storage counted after every op.

``measure`` reads peaks from the CUDA allocator only; here a dispatch mode sums the storages
alive after each op of a real FSDP2 step (fake process group, rank 0 of N) and keeps the
largest sum, which is what ``max_memory_allocated`` reads less the allocator's rounding. The
GPT is the 1.1B one of ``measure.validate --part a`` divided by 16 in hidden size and
vocabulary, with 6 blocks and twice its tokens per block so that, as there, the blocks'
backward is the peak at large N. (The optimizer step is no candidate here: torch's Adam is
foreach only on CUDA, so the CPU step has no temporary the size of the parameters.)

The same count runs on transformers' own modelling code (``measure.engines.hf``, the ``tiny``
family configs) with the experts fewer than N, so FSDP2 pads their dim 0 up to N rows: the
mode also records in which phase of the step the largest sum happened, which must be the
phase of the predicted moment.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from calculators.architecture import Architecture  # noqa: E402
from calculators.batch import Batch  # noqa: E402
from calculators.conventions import Engine, Optimizer, Precision, Stage  # noqa: E402
from calculators.engines.torch.config import REDUCE_DTYPE  # noqa: E402
from calculators.engines.torch.memory import estimate  # noqa: E402
from calculators.engines.torch.peak import CONVERT_OUTPUTS, TRAINER_LOOP  # noqa: E402
from calculators.model_states import TrainingSetup  # noqa: E402
from measure.engines.pytorch import build_engine, root_reshards_after_forward  # noqa: E402
from measure.memory import LiveStorages  # noqa: E402
from measure.workloads import gpt_workload  # noqa: E402

ARCH = {"layers": 6, "hidden": 112, "heads": 7, "vocab_size": 3141, "max_seq_len": 64}
TOKENS = 64


class PeakStorages(LiveStorages):
    """Bytes of the storages alive after each op (each storage once), the largest sum and the
    phase (``phase``, set by the loop) it happened in."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.peak = 0
        self.phase = ""
        self.peak_phase = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        live = self.live()
        if live > self.peak:
            self.peak, self.peak_phase = live, self.phase
        return out

    def _watch(self, out: Any) -> None:
        # a DTensor's shard, which a fake process group's collectives do not dispatch
        local = getattr(out, "_local_tensor", None)
        super()._watch(out if local is None else local)

    def live(self) -> int:
        return self.live_bytes()


def _measured(world: int, stage: Stage, reduce_in_half: bool = False) -> tuple[int, int]:
    """(resident, peak) of rank 0's third step, as measure's loop runs it."""
    arch = Architecture(**ARCH)
    workload = gpt_workload(arch, 1, TOKENS)
    cpu = torch.device("cpu")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        with PeakStorages() as mode:
            x, y = workload.make_batch(cpu, torch.Generator().manual_seed(0))
            model = workload.build(cpu)
            engine = build_engine(
                model,
                workload.shard_units(model),
                stage,
                Precision.MIXED_BF16,
                Optimizer.ADAM,
                cpu,
                True,
                reduce_in_half=reduce_in_half,
            )
            held: list[torch.Tensor] = []
            for step in range(3):
                if step == 2:
                    mode.peak = 0
                out, loss = workload.forward(engine.module, x, y)
                held.clear()
                loss.backward()
                held.extend((out, loss))
                del out, loss
                engine.optimizer.step()
                engine.optimizer.zero_grad(set_to_none=True)
            return mode.live(), mode.peak
    finally:
        dist.destroy_process_group()


def _predicted(world: int, stage: Stage, reduce_in_half: bool = False) -> tuple[int, int, str]:
    reduce = {"reduce_dtype": "bfloat16"} if reduce_in_half else {}
    setup = TrainingSetup(
        params=1,
        dp=world,
        precision=Precision.MIXED_BF16,
        optimizer=Optimizer.ADAM,
        engine=Engine.TORCH,
        architecture=Architecture(**ARCH),
        batch=Batch(1, TOKENS),
        engine_config={
            "holds_outputs": True,
            "fsdp_root_reshard_after_forward": root_reshards_after_forward(),
            "cublas_workspace_bytes": 0,
            "cublaslt_workspace_bytes": 0,  # no cuBLAS on the CPU
            "caching_allocator": False,
            **reduce,
        },
    )
    est = estimate(setup, stage)
    assert est.peak is not None
    moment = next(n for n in est.notes if n.startswith("peak at "))
    return est.resident, est.peak, moment.split(";")[0].removeprefix("peak at ")


@pytest.mark.parametrize(
    ("world", "stage", "reduce_in_half", "moment"),
    [
        # the root unit gathered again for the head's backward and kept through every block's
        # backward, beside the block's parameters, gradients and reduce-scatter buffers
        (64, Stage.PARAMETERS, False, "block_backward"),
        (8, Stage.PARAMETERS, False, "block_backward"),
        # reshard_after_forward=False: every unit stays gathered from forward to the loss
        (64, Stage.GRADIENTS, False, "loss_backward"),
        # with 16-bit reduce-scatter buffers the blocks' backward holds less: the root's own
        # pre-backward, its flat all-gather output and its copy-out alive together, is larger
        (64, Stage.PARAMETERS, True, "root_backward_gather"),
        (4, Stage.PARAMETERS, True, "root_backward_gather"),
        (64, Stage.GRADIENTS, True, "loss_backward"),
    ],
)
def test_fsdp2_peak_matches_the_step(
    world: int, stage: Stage, reduce_in_half: bool, moment: str
) -> None:
    resident, peak = _measured(world, stage, reduce_in_half)
    p_resident, p_peak, p_moment = _predicted(world, stage, reduce_in_half)
    assert abs(p_resident - resident) <= 0.005 * resident
    assert abs(p_peak - peak) <= 0.005 * peak, (p_peak, peak)
    assert p_moment == moment, (p_peak, peak)


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp2_peak_of_the_canonical_decoder_at_few_tokens(
    monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    # 16 tokens over a 32,000-token vocabulary: the root's moments set the peak. Tied (as
    # GPT-2), the token embedding's backward holds the head's gradient, the embedding's and
    # autograd's sum of the two beside the gathered root: it had read 20.7 % low uncounted
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ARCH", {**ARCH, "vocab_size": 32000, "tied_embeddings": tied})
    monkeypatch.setattr(here, "TOKENS", 16)
    _, peak = _measured(8, Stage.PARAMETERS)
    _, p_peak, p_moment = _predicted(8, Stage.PARAMETERS)
    assert abs(p_peak - peak) <= 0.005 * peak, (p_peak, peak)
    assert p_moment == ("block_backward" if tied else "root_reduction")


# the phase of the step each predicted moment belongs to
PHASE = {
    "loss_forward": "forward",
    "last_block_gather": "forward",
    "first_block_gather": "forward",
    "last_block_forward": "forward",
    "final_norm_forward": "forward",
    "loss_backward": "backward",
    "block_backward": "backward",
    "recompute": "backward",
    "root_reduction": "backward",
    "root_backward_gather": "backward",
    "optimizer_step": "step",
}


def _peak_off(got: dict[str, Any], family: str, checkpointing: str) -> int:
    """The prediction's peak less the count's, less a cast the prediction counts and this CPU
    run does not show: a Mixtral experts layer's weighted product (16-bit ``proj_out`` times
    fp32 routing weights) casts its first gradient back to 16 bits beside its three fp32
    token-expert rows × hidden gradients on the GPU (bench/results/step_fuzz/h200_ds_seed27.jsonl
    reads -2 % without it), while the CPU count of the checkpointed run peaks at the index's
    backward, just before the product's, with no such cast after it."""
    off = got["p_peak"] - got["peak"]
    if family == "mixtral" and checkpointing == "full":
        from measure.hf_families import family_config

        config = family_config(family, "tiny")
        rows = 2 * 64 * config["num_experts_per_tok"]  # micro-batch 2 × 64 tokens, top-k
        off -= 2 * rows * config["hidden_size"]
    return off


def _hf_step(
    family: str,
    world: int,
    stage: Stage,
    checkpointing: str,
    engine_config: dict[str, Any] | None = None,
    seq_len: int = 64,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """Rank 0's second step of a transformers model under FSDP2, as measure's loop runs it,
    beside the calculator's prediction for the same request (``engine_config``: the FSDP2
    settings the request carries)."""
    from measure.engines.pytorch import build_engine as build
    from measure.hf_families import family_config
    from measure.runner import run_settings, training_setup
    from measure.spec import parse_spec
    from measure.workloads import build_workload

    hf_config = family_config(family, "tiny")
    if vocab_size is not None:
        hf_config["vocab_size"] = vocab_size
    body = {
        "model": {"hf_config": hf_config},
        "dp": world,
        "stages": [int(stage)],
        "precision": "mixed_bf16",
        "optimizer": "adamw",
        "engine": "torch",
        "mode": "simulated",
        "device": "cpu",
        "batch": {
            "micro_batch_size": 2,
            "seq_len": seq_len,
            "activation_checkpointing": checkpointing,
        },
        "allow_slow_cpu": True,
    }
    if engine_config is not None:
        body["engine_config"] = engine_config
    spec = parse_spec(body)
    workload = build_workload(spec)
    cpu = torch.device("cpu")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        setup = training_setup(
            spec, workload, world, run_settings(spec, workload, cpu, stage), stage
        )
        est = estimate(setup, stage)
        with PeakStorages() as mode:
            x, y = workload.make_batch(cpu, torch.Generator().manual_seed(0))
            model = workload.build(cpu)
            engine = build(
                model,
                workload.shard_units(model),
                stage,
                spec.precision,
                spec.optimizer,
                cpu,
                True,
                reduce_in_half=REDUCE_DTYPE in spec.engine_config,
                convert_outputs=spec.engine_config.get(CONVERT_OUTPUTS) is True,
            )
            held: list[torch.Tensor] = []
            trainer = spec.engine_config.get(TRAINER_LOOP) is True
            for step in range(2):
                if step == 1:  # the optimizer states exist from the first step on
                    mode.peak = 0
                mode.phase = "forward"
                if trainer:  # transformers' Trainer: compute_loss returns the loss alone
                    out, loss = None, workload.forward(engine.module, x, y)[1]
                else:
                    out, loss = workload.forward(engine.module, x, y)
                held.clear()
                mode.phase = "backward"
                loss.backward()
                if out is not None:
                    held.extend((out, loss))
                del out, loss
                mode.phase = "step"
                engine.optimizer.step()
                engine.optimizer.zero_grad(set_to_none=True)
            resident = mode.live()
    finally:
        dist.destroy_process_group()
    assert est.peak is not None
    moment = next(n for n in est.notes if n.startswith("peak at "))
    return {
        "resident": resident,
        "peak": mode.peak,
        "phase": mode.peak_phase,
        "p_resident": est.resident,
        "p_peak": est.peak,
        "p_moment": moment.split(";")[0].removeprefix("peak at "),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "world", "stage", "checkpointing", "moment"),
    [
        # experts padded from 4 to 64 rows: at the last block's all-gather in forward every
        # block is still gathered (reshard_after_forward=False), beside the last step's logits
        ("qwen2_moe", 64, Stage.GRADIENTS, "none", "last_block_gather"),
        # gathered again for backward: a block's prefetched all-gather output and its copy-out
        # alive together, beside the next block's reduce-scatter input
        ("mixtral", 64, Stage.PARAMETERS, "none", "block_backward"),
        # checkpointed: the recomputed block 0's experts' backward, both experts' weight
        # gradients written while the rest of the recomputed block is still saved
        ("qwen3_moe", 16, Stage.PARAMETERS, "full", "recompute"),
        # the combine's backward at the start of the experts' backward: Mixtral's fp32 routing
        # weights make the un-permuted gradient and both gradients of the weighted product
        # fp32 (token-expert rows × hidden) while the recomputed block is still saved
        ("mixtral", 2, Stage.PARAMETERS, "full", "recompute"),
        # dense: the loss inside the model, all blocks gathered, the last step's logits held
        ("llama", 2, Stage.GRADIENTS, "none", "loss_forward"),
    ],
)
def test_fsdp2_peak_of_transformers_models(
    family: str, world: int, stage: Stage, checkpointing: str, moment: str
) -> None:
    pytest.importorskip("transformers")
    got = _hf_step(family, world, stage, checkpointing)
    assert abs(got["p_resident"] - got["resident"]) <= 0.005 * got["resident"], got
    assert abs(_peak_off(got, family, checkpointing)) <= 0.005 * got["peak"], got
    assert got["p_moment"] == moment, got
    assert got["phase"] == PHASE[moment], got


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "stage", "engine_config", "moment"),
    [
        # a tied head's gradient, the embedding's dense one and autograd's sum of the two, all
        # alive in the embedding's backward beside the root still gathered
        ("qwen3", Stage.PARAMETERS, None, "block_backward"),
        ("qwen3", Stage.GRADIENTS, None, "block_backward"),
        # untied and reducing in 16 bits: the root's pre-backward copy-out
        ("llama", Stage.PARAMETERS, {"mp_policy": {"param_dtype": "bfloat16"}}, None),
    ],
)
def test_fsdp2_peak_with_a_large_vocabulary_and_few_tokens(
    family: str, stage: Stage, engine_config: dict[str, Any] | None, moment: str | None
) -> None:
    """A vocabulary of 8,192 over a hidden size of 64 at 2 x 4 tokens, Nd 8: the root's
    moments (embedding backward, the root's gather in backward) outgrow the blocks' and the
    loss's."""
    pytest.importorskip("transformers")
    got = _hf_step(family, 8, stage, "none", engine_config, seq_len=4, vocab_size=8192)
    assert abs(got["p_resident"] - got["resident"]) <= 0.005 * got["resident"], got
    assert abs(got["p_peak"] - got["peak"]) <= 0.005 * got["peak"], got
    if moment is not None:
        assert got["p_moment"] == moment, got
    assert got["phase"] == "backward", got


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "world", "stage", "checkpointing", "shape", "moment"),
    [
        # the last step's outputs, now fp32, held through this step's loss inside the model
        ("llama", 2, Stage.GRADIENTS, "none", {}, "loss_forward"),
        # this step's fp32 copy of the logits alive beside the loss's two fp32 gradients
        ("llama", 2, Stage.PARAMETERS, "none", {}, "loss_backward"),
        # and through the blocks' backward to the root's reduction at its end
        ("phi3", 4, Stage.PARAMETERS, "none", {"seq_len": 16, "vocab_size": 8192}, None),
        ("mixtral", 2, Stage.PARAMETERS, "full", {}, "recompute"),
    ],
)
def test_fsdp2_peak_with_accelerates_fp32_outputs(
    family: str,
    world: int,
    stage: Stage,
    checkpointing: str,
    shape: dict[str, int],
    moment: str | None,
) -> None:
    """Forward wrapped as accelerate wraps it under mixed precision: autocast on top of FSDP2's
    policy and an fp32 copy of the logits returned; the peak follows the copy the loop holds
    and nothing else changes."""
    pytest.importorskip("transformers")
    plain = _hf_step(family, world, stage, checkpointing, None, **shape)
    got = _hf_step(family, world, stage, checkpointing, {CONVERT_OUTPUTS: True}, **shape)
    assert abs(got["p_resident"] - got["resident"]) <= 0.005 * got["resident"], got
    assert abs(_peak_off(got, family, checkpointing)) <= 0.005 * got["peak"], got
    if moment is not None:
        assert got["p_moment"] == moment, got
    # the held fp32 logits replace 16-bit ones: twice their bytes (2 × 2 × tokens × vocab)
    assert got["resident"] > plain["resident"] and got["peak"] > plain["peak"]
    assert got["p_peak"] - plain["p_peak"] == pytest.approx(got["peak"] - plain["peak"], rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "world", "stage", "checkpointing", "engine_config", "shape"),
    [
        ("llama", 2, Stage.GRADIENTS, "none", {}, {}),
        ("llama", 2, Stage.PARAMETERS, "none", {CONVERT_OUTPUTS: True}, {}),
        ("phi3", 4, Stage.PARAMETERS, "none", {CONVERT_OUTPUTS: True}, {"seq_len": 16}),
        ("mixtral", 2, Stage.PARAMETERS, "full", {}, {}),
    ],
)
def test_fsdp2_peak_under_transformers_trainer_loop(
    family: str,
    world: int,
    stage: Stage,
    checkpointing: str,
    engine_config: dict[str, Any],
    shape: dict[str, int],
) -> None:
    """transformers' Trainer keeps the loss alone: the logits (fp32 under accelerate's wrapper)
    die as forward returns and nothing is held between steps; the count and the prediction
    drop together."""
    pytest.importorskip("transformers")
    plain = _hf_step(family, world, stage, checkpointing, engine_config or None, **shape)
    got = _hf_step(
        family, world, stage, checkpointing, {**engine_config, TRAINER_LOOP: True}, **shape
    )
    assert abs(got["p_resident"] - got["resident"]) <= 0.005 * got["resident"], got
    assert abs(_peak_off(got, family, checkpointing)) <= 0.005 * got["peak"], got
    assert got["peak"] < plain["peak"] and got["p_peak"] < plain["p_peak"], (got, plain)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "phi3", "qwen3"])
def test_fsdp2_recomputed_dense_mlp_backward_at_nd_64(family: str) -> None:
    """Nd 64: the model states per rank so small that the recomputed block's dense MLP backward
    sets the peak (down_proj's input and weight gradients, then both factors')."""
    pytest.importorskip("transformers")
    got = _hf_step(family, 64, Stage.PARAMETERS, "full")
    assert abs(got["p_peak"] - got["peak"]) <= 0.005 * got["peak"], got
    assert got["p_moment"] == "recompute", got
    assert got["phase"] == "backward", got


def canonical_at_few_tokens() -> list[str]:
    """Measured and predicted peaks of the canonical decoder at few tokens over a large
    vocabulary, tied and untied, stages 2 and 3, simulated Nd 8 (the figures
    ``python3 -m tests.measure.test_fsdp_peak`` prints)."""
    global ARCH, TOKENS
    kept = ARCH, TOKENS
    rows = []
    try:
        for tied in (False, True):
            for vocab, tokens in ((32000, 16), (50257, 8)):
                ARCH, TOKENS = {**kept[0], "vocab_size": vocab, "tied_embeddings": tied}, tokens
                for stage in (Stage.GRADIENTS, Stage.PARAMETERS):
                    _, peak = _measured(8, stage)
                    _, p_peak, moment = _predicted(8, stage)
                    rows.append(
                        f"tied={tied} vocab={vocab} tokens={tokens} Nd=8 stage={int(stage)}: "
                        f"measured {peak:,} B, predicted {p_peak:,} B "
                        f"({100 * (p_peak - peak) / peak:+.2f} %, {moment})"
                    )
    finally:
        ARCH, TOKENS = kept
    return rows


if __name__ == "__main__":
    print("\n".join(canonical_at_few_tokens()))  # noqa: T201 (a script's report)
