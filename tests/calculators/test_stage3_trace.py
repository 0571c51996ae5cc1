"""The stage-3 coordinator simulation (``calculators.engines.deepspeed.stage3``) gives exactly what
the entry-by-entry walk it replaced gives, on architectures and knobs drawn to exercise every rule
(persistence, the live-parameter cap, the prefetch bucket, the reuse distance, tied and biased
tensors, experts)."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture
from calculators.engines.deepspeed.config import ModelSteps
from calculators.engines.deepspeed.stage3 import (
    Stage3Trace,
    _is_leaf,
    _module,
    _stage3_trace,
    fetch_order,
    held_steps,
    module_tree,
)
from calculators.parameters import ParamTensor, architecture_params


def reference_trace(
    params: tuple[ParamTensor, ...],
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
    leaves: frozenset[int] = frozenset(),
    steps: ModelSteps | None = None,
    recompute: bool = False,
) -> Stage3Trace:
    """The coordinator walked one queue entry at a time (the simulation as first written); a
    release walks the trace module by module as ``__params_to_release`` does, reading each
    module's own parameters, or every parameter below it when the released module is a leaf
    (the MoE blocks of ``leaves``). ``steps``: transformers' parameterless modules, and a tied
    head holding the embedding's weight (a parameter with two uses each way)."""
    numel = [p.numel for p in params]
    persistent, total = [], 0
    for n in numel:
        flag = n <= persistence and (total + n <= model_persistence)
        total += n if flag else 0
        persistent.append(flag)
    owned: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        owned.setdefault(_module(p, leaves), []).append(i)
    if steps is not None and steps.tied_head and "embed" in owned:
        owned["head"] = owned["embed"]
    forward, backward = fetch_order(params, leaves, steps, recompute)
    trace = forward + backward
    n_forward = len(forward)
    # fetches whose release waits for their block's recomputation
    holding = {n_forward + k for k in held_steps(backward)} if recompute else set()
    early_end = n_forward + next(
        (k for k, m in enumerate(backward) if m.startswith("blocks.")), len(backward)
    )
    early: list[tuple[bool, int]] = []  # (after the root's step, parameter)
    now = [0]
    empty: list[int] = []
    at_step = [owned.get(m, empty) for m in trace]
    children = module_tree(params, leaves, steps)

    def nested(m: str) -> set[int]:
        return set(owned.get(m, ())).union(*(nested(k) for k in children[m]))

    below = {m: nested(m) for m in forward}
    owner = {i: m for m, mine in owned.items() for i in mine}

    def keeps(i: int, after: int) -> bool:
        """``__params_to_release`` from step ``after``: i is kept if it reappears before the
        elements walked reach the distance (checked before each module)."""
        recurse = _is_leaf(owner[i], leaves)
        walked = 0
        for m in trace[after:]:
            if walked >= reuse:
                return False
            # a leaf owns no parameter itself: all of them lie below it
            own = empty if _is_leaf(m, leaves) else owned.get(m, empty)
            mine = below[m] if recurse else own
            if i in mine:
                return True
            walked += sum(numel[j] for j in mine)
        return False

    queue = [(i, step) for step, mine in enumerate(at_step) for i in mine]
    uses: list[list[int]] = [[] for _ in params]
    for i, step in queue:
        uses[i].append(step)
    head = 0
    available = list(persistent)
    recent = [-(10**18)] * len(params)
    n_available = 0
    gathered = [0, 0]
    gathers = [[0] * len(params), [0] * len(params)]
    calls = [0, 0]
    kept = available
    flat = 0
    alone: set[int] = set()

    def gather(i: int, phase: int) -> int:
        nonlocal n_available
        if available[i]:
            return 0
        if n_forward <= now[0] < early_end:
            early.append((now[0] > n_forward, i))
        available[i] = True
        n_available += numel[i]
        gathered[phase] += numel[i]
        gathers[phase][i] += 1
        return 1

    def released(i: int, after: int) -> bool:
        """Released after a use at ``after - 1``: the walk from ``after`` keeps i if its next
        use comes before the elements traversed reach the distance (checked before each module:
        strictly fewer than it)."""
        if persistent[i] or recent[i] > after or after - 1 in holding:
            return False
        return not keeps(i, after)

    step = 0
    while step < len(at_step) and head < len(queue):
        mine = at_step[step]
        now[0] = step
        phase = 0 if step < n_forward else 1
        # the module's own parameters: one __all_gather_params call (:381)
        if sum(gather(i, phase) for i in mine):
            calls[phase] += 1
        not_fetched = {i for i in mine if recent[i] < step}
        popped: set[int] = set()
        while head < len(queue) and len(popped) < len(not_fetched):
            i, use = queue[head]
            head += 1
            recent[i] = use
            popped.add(i)
        budget = min(max_live - n_available, prefetch)
        requested = 0
        batch = 0
        uses_gathered = []
        while head < len(queue) and requested < budget:
            i, use = queue[head]
            head += 1
            recent[i] = max(recent[i], use)
            if not available[i]:
                batch += gather(i, phase)
                requested += numel[i]
                uses_gathered.append((i, use))
        if batch:  # the prefetched set: one __all_gather_params call (:484)
            calls[phase] += 1
            # one flat buffer: the first fetch copies every part out, and the buffer stays
            # until the last is fetched
            if any(use < n_forward for _, use in uses_gathered) and any(
                use >= n_forward for _, use in uses_gathered
            ):
                flat += sum(numel[i] for i, _ in uses_gathered)
            # one parameter gathered alone in forward for its backward use: in flight into
            # backward
            if phase == 0 and len(uses_gathered) == 1 and uses_gathered[0][1] >= n_forward:
                alone.add(uses_gathered[0][0])
        after = step + 1
        for i in [i for i in mine if released(i, after)]:
            if available[i]:
                available[i] = False
                n_available -= numel[i]
        if step == n_forward - 1:
            kept = list(available)
        step += 1
    if step < len(at_step):
        # The queue is exhausted: nothing is prefetched any more, every parameter's last
        # recorded use is its last use, and each parameter's remaining uses play out on their
        # own (gathered if released, released after its last use or beyond the reuse distance).
        first = step
        if first <= n_forward - 1:
            kept = list(available)
        gathered_at: list[set[int]] = [set(), set()]
        for i, mine_uses in enumerate(uses):
            k = bisect_left(mine_uses, first)
            if k == len(mine_uses):
                continue
            # ``released`` inlined: uses are distinct steps, so the next use after ``use`` is
            # the next entry, and the last recorded use is final
            held = available[i]
            free = not persistent[i]
            last = recent[i]
            for j in range(k, len(mine_uses)):
                use = mine_uses[j]
                if not held:
                    phase = 0 if use < n_forward else 1
                    held = True
                    gathered[phase] += numel[i]
                    gathers[phase][i] += 1
                    gathered_at[phase].add(use)
                    if n_forward <= use < early_end:
                        early.append((use > n_forward, i))
                if free and last <= use + 1 and use not in holding and not keeps(i, use + 1):
                    held = False
                if use < n_forward:
                    kept[i] = held
            available[i] = held
        calls[0] += len(gathered_at[0])
        calls[1] += len(gathered_at[1])
    return Stage3Trace(
        tuple(persistent),
        tuple(kept),
        gathered[0],
        gathered[1],
        tuple(gathers[0]),
        tuple(gathers[1]),
        calls[0],
        calls[1],
        tuple(sorted(i for later, i in early if not later)),
        tuple(sorted(i for _, i in early)),
        flat,
        tuple(sorted(alone)),
    )


@st.composite
def architectures(draw: st.DrawFn) -> Architecture:
    heads = draw(st.sampled_from([1, 2, 4]))
    experts = draw(st.sampled_from([1, 1, 3, 8]))
    return Architecture(
        layers=draw(st.integers(1, 4)),
        hidden=heads * draw(st.sampled_from([4, 8, 32])),
        heads=heads,
        vocab_size=draw(st.sampled_from([7, 100, 1000])),
        ffn_hidden=draw(st.sampled_from([None, 12, 96])),
        num_experts=experts,
        experts_per_token=min(experts, 2),
        gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        max_seq_len=draw(st.sampled_from([16, 64])),
    )


@settings(max_examples=700, deadline=None, derandomize=True, database=None)
@given(
    arch=architectures(),
    persistence=st.sampled_from([0, 50, 200, 5_000, 100_000]),
    model_persistence=st.sampled_from([0, 1_000, 2**63 - 1]),
    max_live=st.sampled_from([0, 100, 5_000, 50_000, 10**9]),
    prefetch=st.sampled_from([0, 1, 300, 20_000, 5 * 10**7]),
    reuse=st.sampled_from([0, 100, 10_000, 10**9]),
    recompute=st.booleans(),
)
def test_trace_equals_the_entry_by_entry_walk(
    arch: Architecture,
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
    recompute: bool,
) -> None:
    # ``recompute``: every block's forward runs again in backward (full checkpointing)
    params = architecture_params(arch)
    knobs = (persistence, model_persistence, max_live, prefetch, reuse, frozenset(), None)
    assert _stage3_trace(params, *knobs, recompute) == reference_trace(
        tuple(params), *knobs, recompute
    )
