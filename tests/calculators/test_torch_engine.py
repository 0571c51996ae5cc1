"""The torch engine profile: exact partitions from torch's source, no torch import."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators import communication as comm
from calculators.architecture import Architecture, tensors
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.engines import engine_model
from calculators.engines.torch import MODEL
from calculators.engines.torch.memory import rank0_partition, zero_partition
from calculators.errors import InputError
from calculators.memory import StageEstimate, estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.parameters import ParamTensor

GPT = Architecture(layers=2, hidden=256, heads=4, vocab_size=1000, max_seq_len=64)
PSI = sum(t.numel for t in tensors(GPT))


def _setup(dp: int, precision: Precision = Precision.MIXED_BF16, **kw: object) -> TrainingSetup:
    return TrainingSetup(
        params=PSI,
        dp=dp,
        precision=precision,
        optimizer=Optimizer.ADAM,
        engine=Engine.TORCH,
        architecture=GPT,
        **kw,  # type: ignore[arg-type]
    )


def _adamw(arch: Architecture, batch: object, dp: int = 4, **kw: object) -> TrainingSetup:
    """FSDP2's usual setup: mixed bf16, AdamW, the architecture's own parameter count."""
    from calculators.parameters import architecture_params

    return TrainingSetup(
        params=sum(t.numel for t in architecture_params(arch)),
        dp=dp,
        precision=Precision.MIXED_BF16,
        optimizer=Optimizer.ADAMW,
        engine=Engine.TORCH,
        architecture=arch,
        batch=batch,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_registered_as_the_torch_engine() -> None:
    assert engine_model(Engine.TORCH) is MODEL
    assert estimate(_setup(4), [0, 3]).convention.startswith("torch")


@pytest.mark.parametrize(
    ("numels", "world", "owned"),
    [
        # largest first, ties keep their order, each to the first least-loaded rank
        ([10, 10, 10, 10], 2, [[0, 2], [1, 3]]),
        ([1, 100, 50, 50], 2, [[1, 0], [2, 3]]),
        ([5, 3, 3], 4, [[0], [1], [2], []]),
    ],
)
def test_zero_partition_follows_partition_parameters(
    numels: list[int], world: int, owned: list[list[int]]
) -> None:
    assert zero_partition(numels, world) == owned


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.sampled_from([0, 1, 2, 3, 7, 64, 100, 4096]), max_size=60).flatmap(
        lambda sizes: st.tuples(st.just(sizes), st.integers(1, 70))
    )
)
def test_rank0_partition_deals_whole_rounds_as_the_greedy_does(case: tuple[list[int], int]) -> None:
    # runs of equal sizes (and zero-size parameters, and more ranks than parameters): the
    # rounds dealt at once give rank 0 what the greedy gives it one parameter at a time
    numels, world = case
    assert rank0_partition(numels, world) == zero_partition(numels, world)[0]


def test_rank0_partition_of_a_deep_model_in_rounds() -> None:
    # 13 tensor shapes repeated over 20,000 layers at Nd 8: whole rounds of each run
    numels = [4096 * 4096, 1024 * 4096, 1024 * 4096, 4096 * 4096, 4096] * 20_000 + [7]
    assert rank0_partition(numels, 8) == zero_partition(numels, 8)[0]
    # totals that differ by less than the run's size when it starts: rank 0 holds the most
    # (7), so it takes the last place of each round
    for numels, world in (([7, 6] + [4] * 10, 2), ([7, 6, 5] + [4] * 13, 3)):
        assert rank0_partition(numels, world) == zero_partition(numels, world)[0]


@pytest.mark.parametrize(
    ("shape", "world", "shard"),
    [((1000, 256), 64, 16 * 256), ((256,), 64, 4), ((3,), 4, 1), ((7, 2), 1, 14), ((64,), 128, 1)],
)
def test_fsdp2_rank0_chunk_is_padded(shape: tuple[int, ...], world: int, shard: int) -> None:
    assert ParamTensor("p", shape, "g").fsdp_shard_numel(world) == shard


def test_stage0_ddp_keeps_buckets_and_full_adam() -> None:
    est = MODEL.estimate(_setup(8), Stage.NONE)
    assert est.components == {
        "fp32_params": 4 * PSI,
        "ddp_buckets": 4 * PSI,
        "optimizer_states": 8 * PSI,
    }
    assert est.resident == 16 * PSI
    assert est.device.gradients == 4 * PSI  # param.grad during the step


def test_stage1_holds_rank0_partition_of_states() -> None:
    est = MODEL.estimate(_setup(4), Stage.OPTIMIZER)
    # By hand, largest first to the least-loaded rank: the four 256x1024 MLP weights go one
    # per rank, embed (1000x256) to rank 0 and head to rank 1, the 768x256 qkv weights to ranks
    # 2 and 3, then the 256x256 proj weights to 2 and 3 (524,288 each), so pos (64x256) lands on
    # rank 0 (518,144) and it is never the least loaded again: 262,144 + 256,000 + 16,384.
    assert est.device.optimizer_states == 8 * 534_528
    assert est.resident == 8 * PSI + est.device.optimizer_states


@pytest.mark.parametrize("stage", [Stage.GRADIENTS, Stage.PARAMETERS])
def test_fsdp2_resident_is_padded_shards(stage: Stage) -> None:
    n = 64
    shard = sum(-(-t.shape[0] // n) * math.prod(t.shape[1:]) for t in tensors(GPT))
    est = MODEL.estimate(_setup(n), stage)
    # beside the blocks the caching allocator hands the shards and the two Adam states beyond
    # their requests: here every shard is under 1 MiB, so the small pool rounds each up to
    # 512 bytes and no more
    shards = [4 * -(-t.shape[0] // n) * math.prod(t.shape[1:]) for t in tensors(GPT)]
    assert max(shards) <= 1024 * 1024
    rounding = sum(-(-b // 512) * 512 - b for b in shards)
    assert est.components["allocator_shard_blocks"] == rounding
    assert est.components["allocator_state_blocks"] == 2 * rounding
    assert est.resident == (4 + 8) * shard + 3 * rounding
    assert est.device.gradients == 4 * shard
    assert shard * n >= PSI


def test_fp32_and_pure_bf16_dtypes() -> None:
    assert MODEL.estimate(_setup(1, Precision.FP32), Stage.NONE).resident == 16 * PSI
    assert MODEL.estimate(_setup(1, Precision.BF16), Stage.NONE).resident == 8 * PSI


def test_without_shapes_falls_back_to_psi_over_n_and_says_so() -> None:
    setup = TrainingSetup(params=1000, dp=4, engine=Engine.TORCH, precision=Precision.FP32)
    est = MODEL.estimate(setup, Stage.OPTIMIZER)
    assert est.device.optimizer_states == 8 * 250
    assert any("approximate" in n for n in est.notes)


def test_given_tensor_list_is_used() -> None:
    setup = TrainingSetup(
        params=30,
        dp=4,
        engine=Engine.TORCH,
        precision=Precision.FP32,
        engine_config={"tensors": [["a", [5, 3], "l0"], ["b", [15], "l1"]]},
    )
    assert MODEL.estimate(setup, Stage.PARAMETERS).device.parameters == 4 * (2 * 3 + 4)


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("optimizer", {"optimizer": Optimizer.ADAFACTOR}),
        # FSDP2's CPUOffloadPolicy moves the parameters and the optimizer together, at stage 2+
        ("offload.optimizer", {"offload": Offload(optimizer=OffloadDevice.CPU)}),
        ("offload.params", {"offload": Offload(params=OffloadDevice.CPU)}),
        ("offload", {"offload": Offload(params=OffloadDevice.NVME)}),
    ],
)
def test_unmodelled_inputs_name_their_field(field: str, kw: dict[str, object]) -> None:
    setup = TrainingSetup(params=PSI, dp=4, engine=Engine.TORCH, **kw)  # type: ignore[arg-type]
    with pytest.raises(InputError) as err:
        MODEL.estimate(setup, Stage.OPTIMIZER)
    assert err.value.field == field


def _offload_pair(stage: Stage, dp: int, **batch: object) -> tuple[StageEstimate, StageEstimate]:
    from calculators.batch import Batch

    arch = Architecture(layers=4, hidden=256, heads=4, vocab_size=1000, max_seq_len=256)
    micro = Batch(**{"micro_batch_size": 1, "seq_len": 256, **batch})  # type: ignore[arg-type]
    on = Offload(optimizer=OffloadDevice.CPU, params=OffloadDevice.CPU)
    return (
        MODEL.estimate(_adamw(arch, micro, dp), stage),
        MODEL.estimate(_adamw(arch, micro, dp, offload=on), stage),
    )


@pytest.mark.parametrize("stage", [Stage.GRADIENTS, Stage.PARAMETERS])
@pytest.mark.parametrize("dp", [2, 8])
def test_cpu_offload_moves_the_sharded_states_to_host_memory(stage: Stage, dp: int) -> None:
    # CPUOffloadPolicy: the shards, their gradients and the optimizer's states in host memory;
    # the optimizer steps there, and the device keeps only what a step gathers and makes
    plain, off = _offload_pair(stage, dp)
    assert off.cpu == plain.device
    assert off.device.total == 0
    c, p = off.components, plain.components
    blocks = p["allocator_shard_blocks"] + p["allocator_state_blocks"]
    assert off.resident == plain.resident - p["model_states_resident"]
    states = plain.device.parameters + plain.device.optimizer_states
    assert p["model_states_resident"] == states + blocks
    assert c["peak_candidate_optimizer_step"] == c["held_outputs"]
    # the root's reduction no longer finds the blocks' reduced shards
    root = p["peak_candidate_root_reduction"] - c["peak_candidate_root_reduction"]
    assert 0 < root < plain.device.gradients
    assert off.peak < plain.peak - p["model_states_resident"] + 1
    assert any("CPUOffloadPolicy" in n for n in off.notes)


def test_cpu_offload_prefetch_holds_the_inputs_copied_up() -> None:
    # reshard_after_forward=True: block i's pre-backward prefetches block i-1, whose shards are
    # copied up from the CPU and cast before its flat all-gather output is made
    import dataclasses

    from calculators.engines.torch.peak import FsdpBackward, FsdpBlock

    block = FsdpBlock(gathered=40, grads=40, reduce_input=80, shard_grad=20, gather_inputs=20)
    fsdp = FsdpBackward(
        blocks=((4, block),),
        root_gathered=100,
        root_grads=10,
        prefetch=True,
        keeps_shards=False,
    )
    assert fsdp.at_prefetch(0, 0) == 0
    for i in (1, 2, 3):
        assert fsdp.at_prefetch(i, 0) == fsdp.at_gather(i, 0) + 20
    # the reduced shards went to the CPU: none of the three after block 0 is held there
    kept = dataclasses.replace(fsdp, keeps_shards=True)
    assert fsdp.at_block_end(0, 0) == 40 + 80 + 100 + 10 + 40
    assert kept.at_block_end(0, 0) == fsdp.at_block_end(0, 0) + 3 * 20
    # one rank alone prefetches nothing: its shards are copied up and into the unsharded
    # storage when the block's own pre-backward waits for it, with no flat output
    alone = dataclasses.replace(fsdp, across_ranks=False)
    assert [alone.at_prefetch(i, 0) for i in range(4)] == [0] * 4
    assert alone.at_gather(2, 0) == fsdp.at_gather(2, 0) - 40 + 20
    assert alone.at_block_end(2, 0) == fsdp.at_block_end(2, 0) - 40


def sent_bytes_per_rank(setup: TrainingSetup, stage: Stage) -> int:
    """/v1/communication's torch convention, every micro-step reducing (as measure/ runs)."""
    cs = comm.CommunicationSetup(
        training=setup,
        topology=comm.make_topology(setup.dp, 1, 1, None, None),
        grad_accumulation_steps=1,
        grad_sync=comm.GradSync.PER_MICRO_STEP,
    )
    return comm.stage_communication(cs, stage).sent_bytes_per_rank


def test_communication_per_stage() -> None:
    n = 4
    s = _setup(n)
    shard = sum(-(-t.shape[0] // n) * math.prod(t.shape[1:]) for t in tensors(GPT))
    assert sent_bytes_per_rank(s, Stage.NONE) == 4 * PSI * 2 * (n - 1) // n
    # + broadcast of every fp32 parameter from its owner, (N-1)/N on average
    ar, bc = 4 * PSI * 2 * (n - 1), 4 * PSI * (n - 1)
    assert sent_bytes_per_rank(s, Stage.OPTIMIZER) == ar // n + bc // n
    # stage 2: forward bf16 all-gather + fp32 reduce-scatter of the padded shards
    assert sent_bytes_per_rank(s, Stage.GRADIENTS) == (n - 1) * shard * (2 + 4)
    # stage 3 gathers again in backward, root included
    assert sent_bytes_per_rank(s, Stage.PARAMETERS) == (n - 1) * shard * (2 + 2 + 4)


@pytest.mark.parametrize("field", ["tp", "pp"])
def test_model_parallelism_is_refused(field: str) -> None:
    setup = TrainingSetup(
        params=PSI,
        dp=4,
        precision=Precision.MIXED_BF16,
        engine=Engine.TORCH,
        architecture=GPT,
        **{field: 2},  # type: ignore[arg-type]
    )
    with pytest.raises(InputError) as err:
        MODEL.estimate(setup, Stage.GRADIENTS)
    assert err.value.field == field


def _loss_backward(arch: Architecture, dp: int, stage: Stage) -> int:
    from calculators.batch import Batch

    setup = _adamw(arch, Batch(micro_batch_size=2, seq_len=1024), dp)
    return estimate(setup, [stage]).stages[0].components["peak_candidate_loss_backward"]


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp2_gathers_root_and_last_block_before_a_loss_the_root_returns(tied: bool) -> None:
    # transformers computes the loss inside the root module: FSDP2's pre-backward hook on the
    # loss gathers the root unit (embedding, final norm, head) and prefetches the last block
    # before the loss's backward; a loop that computes the loss outside gathers them later.
    import dataclasses

    from calculators.hf_config import architecture_from_hf_config

    hf = architecture_from_hf_config(
        {
            "model_type": "llama",
            "tie_word_embeddings": tied,
            "num_hidden_layers": 8,
            "hidden_size": 768,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "intermediate_size": 2048,
            "vocab_size": 32000,
        }
    )
    plain = dataclasses.replace(hf, modelling=None)
    matrix = 32000 * 768
    block = 768 * 768 * 2 + 2 * 768 * 256 + 3 * 768 * 2048 + 2 * 768
    root = (1 if tied else 2) * matrix + 768
    for dp in (2, 4):
        gap = _loss_backward(hf, dp, Stage.PARAMETERS) - _loss_backward(plain, dp, Stage.PARAMETERS)
        assert gap - _activation_gap(hf, plain) == 2 * (root + block)
    # reshard_after_forward=False already holds everything gathered: nothing more
    assert _loss_backward(hf, 2, Stage.GRADIENTS) - _loss_backward(
        plain, 2, Stage.GRADIENTS
    ) == _activation_gap(hf, plain)


def _activation_gap(hf: Architecture, plain: Architecture) -> int:
    from calculators.activations import Regime, activations
    from calculators.batch import Batch

    b = Batch(micro_batch_size=2, seq_len=1024)
    return (
        activations(hf, b, Regime.HALF).end_of_forward
        - activations(plain, b, Regime.HALF).end_of_forward
    )


@pytest.mark.parametrize("stage", [Stage.GRADIENTS, Stage.PARAMETERS])
def test_fsdp2_reduces_the_root_last_with_its_unsharded_gradients_alive(stage: Stage) -> None:
    # the root's 16-bit unsharded gradients and the fp32 reduce-scatter input chunk_cat fills,
    # beside the blocks' reduced fp32 shards and the loop's held outputs
    from calculators.batch import Batch
    from calculators.parameters import ROOT_GROUP, architecture_params, fsdp_shard_total

    arch = Architecture(layers=2, hidden=256, heads=4, vocab_size=1000, max_seq_len=128)
    ts = architecture_params(arch)
    setup = _adamw(arch, Batch(micro_batch_size=1, seq_len=128))
    c = estimate(setup, [stage]).stages[0].components
    root = fsdp_shard_total([t for t in ts if t.group == ROOT_GROUP], 4)
    blocks = fsdp_shard_total(ts, 4) - root
    expected = c["held_outputs"] + 4 * blocks + 4 * root * (2 + 4)
    assert c["peak_candidate_root_reduction"] == expected
    assert (
        "peak_candidate_root_reduction"
        not in estimate(setup, [Stage.OPTIMIZER]).stages[0].components
    )


def test_without_the_caching_allocator_the_tensors_count_as_they_ask() -> None:
    # engine_config.caching_allocator false (the measure runner on the CPU): no replayed blocks
    wide = Architecture(layers=4, hidden=1024, heads=8, vocab_size=32000, max_seq_len=64)

    def setup(**config: object) -> TrainingSetup:
        return TrainingSetup(
            params=sum(t.numel for t in tensors(wide)),
            dp=2,
            precision=Precision.MIXED_BF16,
            optimizer=Optimizer.ADAM,
            engine=Engine.TORCH,
            architecture=wide,
            engine_config=config,
        )

    cached = MODEL.estimate(setup(), Stage.PARAMETERS)
    plain = MODEL.estimate(setup(caching_allocator=False), Stage.PARAMETERS)
    c = cached.components
    blocks = c["allocator_shard_blocks"] + c["allocator_state_blocks"]
    assert blocks > 0
    assert "allocator_shard_blocks" not in plain.components
    assert plain.resident == cached.resident - blocks
    with pytest.raises(InputError) as err:
        MODEL.estimate(setup(caching_allocator="no"), Stage.PARAMETERS)
    assert err.value.field == "engine_config.caching_allocator"


@pytest.mark.parametrize("stage", [Stage.GRADIENTS, Stage.PARAMETERS])
def test_fsdp2_forward_gathers_block_0_with_the_roots_flat_output_kept(stage: Stage) -> None:
    # every unit is resharded when backward ends: forward gathers the root, runs the embedding
    # and gathers block 0 while the root's flat all-gather output is still kept, the loop's
    # last outputs alive
    from calculators.activations import Regime, activations
    from calculators.batch import Batch
    from calculators.parameters import ROOT_GROUP, architecture_params, fsdp_shard_total

    arch = Architecture(layers=3, hidden=256, heads=4, vocab_size=8000, max_seq_len=128)
    ts = architecture_params(arch)
    batch = Batch(micro_batch_size=1, seq_len=64)
    setup = _adamw(arch, batch)
    c = estimate(setup, [stage]).stages[0].components
    root = 4 * fsdp_shard_total([t for t in ts if t.group == ROOT_GROUP], 4)
    block0 = 4 * fsdp_shard_total([t for t in ts if t.group == "blocks.0"], 4)
    embedded = 2 * 64 * 256 + activations(arch, batch, Regime.HALF).embedding
    expected = 2 * 2 * (root + block0) + embedded + c["held_outputs"]
    assert c["peak_candidate_first_block_gather"] == expected
    ddp = estimate(setup, [Stage.OPTIMIZER]).stages[0].components
    assert "peak_candidate_first_block_gather" not in ddp


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("keeps_shards", [True, False])
@pytest.mark.parametrize("accumulated", [0, 7_000])
@pytest.mark.parametrize("across_ranks", [True, False])
def test_fsdp2_backward_terms_are_linear_inside_each_run_of_alike_blocks(
    prefetch: bool, keeps_shards: bool, accumulated: int, across_ranks: bool
) -> None:
    # the blocks' backward evaluates each FSDP2 moment at FsdpBackward.candidates only, and the
    # every_n_layers walk takes it as a line inside each run (engines/torch/peak.py
    # _block_backward): both hold where every term is linear in the block away from a run's
    # first two and last two blocks, for unlike runs (DeepSeek's dense blocks, then its
    # experts blocks)
    from calculators.engines.torch.peak import FsdpBackward, FsdpBlock

    dense = FsdpBlock(1_009, 1_013, 2_017, 251, 127, 257, 509)
    experts = FsdpBlock(4_001, 4_003, 8_009, 1_021, 503, 1_031, 2_003)
    f = FsdpBackward(
        blocks=((7, dense), (9, experts)),
        root_gathered=101,
        root_grads=103,
        prefetch=prefetch,
        embedding_grads=131,
        keeps_shards=keeps_shards,
        across_ranks=across_ranks,
    )
    assert f.layers == 16
    assert f.candidates() == {0, 1, 5, 6, 7, 8, 14, 15}
    assert f.inner_runs() == [range(2, 5), range(9, 14)]
    for at in (
        f.at_block_start,
        f.at_block_end,
        f.at_reduce,
        f.at_cast,
        f.at_gather,
        f.at_prefetch,
    ):
        for inner in f.inner_runs():
            first = inner.start - 1
            slope = at(first + 1, accumulated) - at(first, accumulated)
            line = [
                at(first, accumulated) + slope * (i - first) for i in range(first, inner.stop + 1)
            ]
            assert [at(i, accumulated) for i in range(first, inner.stop + 1)] == line
    # each block reads its own sizes and its neighbours': the last dense block holds the first
    # experts block's reduce-scatter input, and the first experts block finds the dense block
    # before it prefetched (none in a world of one, whose gather makes no flat output)
    assert f.at_block_end(6, 0) - f.at_reduce(6, 0) == 1_009 + 8_009 - 2_017
    if prefetch:
        expected = 1_009 - 4_001 if across_ranks else -1_031
        assert f.at_block_start(7, 0) - f.at_gather(7, 0) == expected
