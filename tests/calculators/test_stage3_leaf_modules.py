"""DeepSpeed stage 3's leaf modules and view-saved expert weights.

DeepSpeed fetches the MoE blocks of its default leaf classes (Mixtral's, Qwen2-MoE's,
Qwen3-MoE's) whole, and a leaf's release walk reads the modules after it recursively; the
simulation must walk as the coordinator does, module by module. Expert weights that autograd
saved as views stay allocated after a release, so every copy forward gathered is still there
when forward ends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture, count_params, dense_layers
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Engine, Precision, Stage
from calculators.engines.deepspeed import MODEL
from calculators.engines.deepspeed.config import (
    DEFAULT_LEAF_CLASSES,
    Knobs,
    model_steps,
    parse_config,
)
from calculators.engines.deepspeed.layouts import ParamFacts
from calculators.engines.deepspeed.stage3 import (
    MOE_BLOCK_CLASSES,
    leaf_layers,
    stage3_trace,
    view_saved,
)
from calculators.errors import InputError
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import TrainingSetup
from calculators.parameters import architecture_params
from measure.hf_families import FAMILIES, family_config
from tests.calculators.test_stage3_trace import reference_trace

MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def _arch(family: str, layers: int, size: str = "tiny") -> Architecture:
    body = family_config(family, size)
    body.update(model_type=family, num_hidden_layers=layers)
    if "layer_types" in body:  # the family's pattern, as long as the layers
        types = body["layer_types"]
        body["layer_types"] = [types[i % len(types)] for i in range(layers)]
    return architecture_from_hf_config(body)


@st.composite
def leaf_cases(
    draw: st.DrawFn, families: tuple[str, ...] = MOE
) -> tuple[Architecture, frozenset[int]]:
    arch = _arch(draw(st.sampled_from(families)), draw(st.integers(1, 4)))
    moe = range(dense_layers(arch), arch.layers) if arch.num_experts > 1 else range(0)
    leaves = draw(st.sampled_from(["all", "none", "some"]))
    if leaves == "all":
        return arch, frozenset(moe)
    if leaves == "none":
        return arch, frozenset()
    return arch, frozenset(draw(st.sets(st.sampled_from(list(moe)))) if moe else ())


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    case=st.one_of(leaf_cases(), leaf_cases(FAMILIES)),
    persistence=st.sampled_from([0, 200, 5_000, 100_000]),
    max_live=st.sampled_from([0, 5_000, 50_000, 10**9]),
    prefetch=st.sampled_from([0, 300, 20_000, 5 * 10**7]),
    reuse=st.sampled_from([0, 1_000, 30_000, 150_000, 10**9]),
    modelled=st.booleans(),
    recompute=st.booleans(),
)
def test_leaf_blocks_walk_as_the_coordinator_does(
    case: tuple[Architecture, frozenset[int]],
    persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
    modelled: bool,
    recompute: bool,
) -> None:
    # ``modelled``: with transformers' parameterless modules (rotary embedding, activations,
    # a tied head's step); ``recompute``: every layer recomputed in backward (checkpointing),
    # the fetches down to the first that saved something held until the recomputation
    arch, leaves = case
    params = architecture_params(arch)
    knobs = Knobs(
        param_persistence_threshold=persistence,
        max_live_parameters=max_live,
        prefetch_bucket_size=prefetch,
        max_reuse_distance=reuse,
        leaves=leaves,
        steps=model_steps(arch) if modelled else None,
        recompute=recompute,
    )
    listed = tuple(params)
    walked = reference_trace(
        listed, persistence, 2**63 - 1, max_live, prefetch, reuse, leaves, knobs.steps, recompute
    )
    assert stage3_trace(params, knobs) == walked
    assert stage3_trace(listed, knobs) == walked
    assert view_saved(params) == view_saved(listed)


def test_leaf_release_reads_the_later_modules_recursively() -> None:
    # two Mixtral blocks 64 wide with 4 experts, nothing prefetched: after block 0's MoE block
    # forward walks block 1 (each parameter once per module above it: about twice the block),
    # the final norm and the head, more than a distance of two blocks' experts; after block 1's
    # only the norm and the head
    arch = _arch("mixtral", 2)
    params = architecture_params(arch)
    experts = [i for i, p in enumerate(params) if ".experts." in p.name]
    numel = sum(params[i].numel for i in experts) // 2  # one block's
    knobs = Knobs(
        param_persistence_threshold=0,
        prefetch_bucket_size=0,
        max_reuse_distance=2 * numel,
        leaves=frozenset({0, 1}),
    )
    trace = stage3_trace(params, knobs)
    assert [trace.kept[i] for i in experts] == [False, False, True, True]
    assert [trace.backward_gathers[i] for i in experts] == [1, 1, 0, 0]


@pytest.mark.parametrize("family", MOE)
def test_default_classes_name_three_families(family: str) -> None:
    arch = _arch(family, 3)
    leaves = leaf_layers(arch, parse_config(None))
    moe = frozenset(range(dense_layers(arch), arch.layers))
    assert leaves == (moe if MOE_BLOCK_CLASSES[family] in DEFAULT_LEAF_CLASSES else frozenset())
    assert (
        leaf_layers(arch, parse_config({"zero_optimization": {"leaf_module": {"classes": []}}}))
        == frozenset()
    )
    short = MOE_BLOCK_CLASSES[family].rsplit(".", 1)[1]
    by_class = {"zero_optimization": {"leaf_module": {"classes": short}}}
    assert leaf_layers(arch, parse_config(by_class)) == moe
    by_name = {
        "zero_optimization": {"leaf_module": {"classes": [], "names": ["model.layers.2.mlp"]}}
    }
    assert leaf_layers(arch, parse_config(by_name)) == moe & {2}
    by_suffix = {"zero_optimization": {"leaf_module": {"classes": [], "name_suffixes": "mlp"}}}
    assert leaf_layers(arch, parse_config(by_suffix)) == moe


def test_dense_models_have_no_leaves() -> None:
    assert leaf_layers(_arch("llama", 2), parse_config(None)) == frozenset()
    assert leaf_layers(None, parse_config(None)) == frozenset()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"classes": 3}, "classes"),
        ({"names": ["a", 1]}, "names"),
        ({"name_suffixes": {"a": 1}}, "name_suffixes"),
    ],
)
def test_bad_leaf_module_names_its_field(value: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as e:
        parse_config({"zero_optimization": {"leaf_module": value}})
    assert e.value.field == f"engine_config.zero_optimization.leaf_module.{field}"


def test_released_expert_copies_count_until_backward() -> None:
    # the medium Mixtral at DeepSpeed's defaults releases the first blocks' experts after
    # forward; each copy forward gathered of them is still allocated when forward ends
    arch = _arch("mixtral", 16, "medium")
    params = architecture_params(arch)
    knobs = replace(parse_config(None), leaves=leaf_layers(arch, parse_config(None)))
    trace = stage3_trace(params, knobs)
    held = view_saved(params)
    assert held and any(not trace.kept[i] for i in held)
    facts = ParamFacts(params)
    kept = facts.stage3_kept(knobs, exact=True)
    numels = [p.numel for p in params]
    copies = [
        trace.forward_gathers[i] if i in held else (trace.kept[i] or i == len(numels) - 1)
        for i in range(len(numels))
    ]
    alive = zip(numels, copies, trace.persistent, strict=True)
    elements = sum(n * c for n, c, p in alive if not p)
    assert kept.gathered_bytes >= 2 * elements
    assert kept.gathered_bytes < 2 * elements + 512 * len(numels)  # allocator rounding only


def _notes(family: str, zero: dict[str, Any], batch: Batch | None = None) -> list[str]:
    arch = _arch(family, 16, "medium")
    setup = TrainingSetup(
        params=count_params(arch),
        dp=2,
        precision=Precision.MIXED_BF16,
        engine=Engine.DEEPSPEED,
        architecture=arch,
        batch=batch or Batch(2, 1024),
        engine_config={"zero_optimization": {"stage": 3, **zero}},
    )
    return [n for n in MODEL.estimate(setup, Stage.PARAMETERS).notes if "stage 3: " in n]


def test_notes_say_which_blocks_are_leaves_and_what_stays_allocated() -> None:
    notes = " ".join(_notes("mixtral", {}))
    assert "MoE blocks of 16 layers are ZeRO-3 leaf modules" in notes
    assert "stay allocated until their backward" in notes
    off = " ".join(_notes("mixtral", {"leaf_module": {"classes": []}}))
    assert "leaf modules" not in off
    assert "leaf modules" not in " ".join(_notes("llama", {}))


@pytest.mark.parametrize("tied", [False, True])
def test_torch_linear_saves_every_linear_weight(tied: bool) -> None:
    # memory_efficient_linear off: F.linear's matrix product saves weight.t(), a view
    arch = Architecture(
        layers=2, hidden=64, heads=4, vocab_size=100, max_seq_len=32, tied_embeddings=tied
    )
    params = architecture_params(arch)
    held = {params[i].name for i in view_saved(params, linear_views=True)}
    linear = {p.name for p in params if p.name.endswith(".weight") and len(p.shape) == 2}
    embeddings = {"pos.weight"} if tied else {"pos.weight", "embed.weight"}
    assert held == linear - embeddings
    assert view_saved(params) == ()  # DeepSpeed's own linear function saves the parameter


def test_checkpointed_blocks_save_no_views() -> None:
    # every decoder layer checkpointed: forward saves nothing inside it, so a released expert
    # weight's copy is freed (measured: mixtral 2.5B held 2.48 GB after forward with
    # checkpointing, 10.64 GB without)
    full = Batch(2, 1024, Checkpointing.FULL)
    assert not any("stay allocated" in n for n in _notes("mixtral", {}, full))
    assert any("stay allocated" in n for n in _notes("mixtral", {}))
