"""DeepSpeed stage 3's parameter coordinator, simulated: what stays gathered, what is fetched.

Paths relative to ``deepspeed/runtime/`` of 0.19.8: zero/partitioned_param_coordinator.py,
zero/parameter_offload.py, zero/partition_parameters.py, zero/stage3.py.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, repeat

from calculators.engines.deepspeed.buckets import ipg_buckets
from calculators.engines.deepspeed.config import Knobs
from calculators.parameters import ParamTensor, tally


@dataclass(frozen=True)
class Stage3Trace:
    """Stage-3 parameter fetching in steady state (trace complete), per parameter.

    Attributes:
        persistent: never released (numel <= stage3_param_persistence_threshold).
        kept: still gathered (or in flight) when forward ends.
        forward_gathered: elements all-gathered during forward (re-gathers counted again).
        backward_gathered: elements all-gathered during backward.
        forward_gathers: per parameter, how often it is all-gathered during forward.
        backward_gathers: per parameter, how often it is all-gathered during backward.
        forward_calls: all-gather batches issued during forward: one per module fetch and one
            per prefetch that finds something to gather (partitioned_param_coordinator.py
            ``__all_gather_params`` -> one ``all_gather_coalesced``).
        backward_calls: the same during backward.
    """

    persistent: tuple[bool, ...]
    kept: tuple[bool, ...]
    forward_gathered: int = 0
    backward_gathered: int = 0
    forward_gathers: tuple[int, ...] = ()
    backward_gathers: tuple[int, ...] = ()
    forward_calls: int = 0
    backward_calls: int = 0


def fetch_order(params: Sequence[ParamTensor]) -> tuple[list[str], list[str]]:
    """Modules in the order DeepSpeed's hooks fetch them, forward then backward.

    Every module whose ``forward`` runs is fetched (parameter_offload.py pre-forward hook), the
    root and containers included (they own no parameters but take a step of the trace);
    ``ModuleList``s are never called. Backward fetches come from the hooks on each module's
    outputs, so a container comes before its children and children run in reverse.
    """
    children: dict[str, list[str]] = {"": []}

    def parent(path: str) -> str:
        # the longest proper prefix not followed by an index (a ModuleList is not a step)
        q = path
        while True:
            q, _, after = q.rpartition(".")
            if not q or not after.isdigit():
                return q

    def register(path: str) -> None:
        # ancestors first: each joins its parent's children when first seen
        above = parent(path)
        if above not in children:
            register(above)
        children[path] = []
        children[above].append(path)

    for p in params:
        module = p.module
        if module in children:
            continue
        above, _, name = module.rpartition(".")
        if above in children and not name.isdigit():  # the parent seen already: most modules
            children[module] = []
            children[above].append(module)
        else:
            register(module)

    def walk(reverse: bool) -> list[str]:
        out: list[str] = []
        stack = [""]
        while stack:
            node = stack.pop()
            out.append(node)
            kids = children[node]
            # pushed last-first, so the first to visit is on top
            stack.extend(kids if reverse else reversed(kids))
        return out

    return walk(False), walk(True)


def stage3_trace(params: Sequence[ParamTensor], knobs: Knobs) -> Stage3Trace:
    """The coordinator simulation, cached per parameter list and the knobs it reads."""
    return _stage3_trace(
        tuple(params),
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
    )


@lru_cache(maxsize=64)
def _stage3_trace(
    params: tuple[ParamTensor, ...],
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
) -> Stage3Trace:
    """Simulate the parameter coordinator for one steady-state forward and backward.

    - parameter_offload.py ``mark_persistent_parameters``: numel <= param threshold while the
      running total stays within the model threshold; persistent parameters stay gathered.
    - partitioned_param_coordinator.py ``fetch_sub_module``: gather the module's parameters,
      pop their entries off the trace queue, then prefetch: pop entries until
      ``min(max_live - available, prefetch_bucket_size)`` not-yet-gathered elements are
      requested; gathered ones are popped without counting, and every popped entry records the
      step of that use (``__most_recent_step_id_param_fetched_for``).
    - ``release_sub_module`` / ``__params_to_release``: after the module runs, its parameters
      are released unless persistent, unless a prefetch already recorded a later use, and unless
      they reappear in the trace before ``stage3_max_reuse_distance`` elements.

    The prefetcher outruns the forward (it skips what is gathered), reaches the backward half of
    the queue a few modules in and records every backward use, so on models that fit
    ``stage3_max_live_parameters`` nearly every parameter stays gathered into backward.
    """
    numel = [p.numel for p in params]
    persistent, total = [], 0
    for n in numel:
        flag = n <= persistence and (total + n <= model_persistence)
        total += n if flag else 0
        persistent.append(flag)
    owned: dict[str, list[int]] = {}
    module_elements: dict[str, int] = {}
    for i, p in enumerate(params):
        owned.setdefault(p.module, []).append(i)
        module_elements[p.module] = module_elements.get(p.module, 0) + numel[i]
    forward, backward = fetch_order(params)
    trace = forward + backward
    n_forward, n_steps = len(forward), len(trace)
    at_step = list(map(owned.get, trace, repeat([])))
    # The queue of (parameter, step) uses, as two flat lists, and where each step's entries
    # start in it. A persistent parameter is always gathered and never released, so its entries
    # only take room in the queue: the walks below step over them by position.
    queue_param = [i for mine in at_step for i in mine]
    queue_step = [step for step, mine in enumerate(at_step) for _ in mine]
    starts = [0, *accumulate(map(len, at_step))]
    n_queue = len(queue_param)
    # elements traversed before each step, for the reuse distance
    before = [0, *accumulate(map(module_elements.get, trace, repeat(0)))]
    movable = [k for k, i in enumerate(queue_param) if not persistent[i]]  # queue positions
    uses: dict[int, list[int]] = {}
    for k in movable:
        uses.setdefault(queue_param[k], []).append(queue_step[k])
    head = 0
    available = list(persistent)
    recent = [-(10**18)] * len(params)
    n_available = 0
    gathered = [0, 0]
    gathers = [[0] * len(params), [0] * len(params)]
    calls = [0, 0]
    kept = available

    def gather(i: int, phase: int) -> int:
        nonlocal n_available
        if available[i]:
            return 0
        available[i] = True
        n_available += numel[i]
        gathered[phase] += numel[i]
        gathers[phase][i] += 1
        return 1

    def released(i: int, after: int) -> bool:
        """Released after a use at ``after - 1``: the walk from ``after`` keeps i if its next
        use comes before the elements traversed reach the distance (checked before each module:
        strictly fewer than it)."""
        if persistent[i] or recent[i] > after:
            return False
        mine_uses = uses[i]
        k = bisect_left(mine_uses, after)
        return not (k < len(mine_uses) and before[mine_uses[k]] - before[after] < reuse)

    step = 0
    while step < n_steps and head < n_queue:
        mine = at_step[step]
        phase = 0 if step < n_forward else 1
        # the module's own parameters: one __all_gather_params call (:381)
        if sum(gather(i, phase) for i in mine):
            calls[phase] += 1
        # pop as many entries as the module has parameters whose use here is not popped yet
        # (``recent[i] < step``: the queue is popped in order, so those are its entries at or
        # after ``head``)
        end = starts[step + 1]
        not_fetched = end - max(head, starts[step]) if head < end else 0
        popped: set[int] = set()
        while head < n_queue and len(popped) < not_fetched:
            i = queue_param[head]
            recent[i] = queue_step[head]
            popped.add(i)
            head += 1
        budget = min(max_live - n_available, prefetch)
        requested = 0
        batch = 0
        if head < n_queue and budget > 0:
            # pop until ``budget`` elements not yet gathered are requested: persistent entries
            # are popped without effect, so only the others are visited
            k = bisect_left(movable, head)
            head = n_queue  # unless the budget is reached first
            while k < len(movable):
                at = movable[k]
                i = queue_param[at]
                recent[i] = max(recent[i], queue_step[at])
                k += 1
                if not available[i]:
                    batch += gather(i, phase)
                    requested += numel[i]
                    if requested >= budget:
                        head = at + 1
                        break
        if batch:  # the prefetched set: one __all_gather_params call (:484)
            calls[phase] += 1
        after = step + 1
        for i in [i for i in mine if released(i, after)]:
            if available[i]:
                available[i] = False
                n_available -= numel[i]
        if step == n_forward - 1:
            kept = list(available)
        step += 1
    if step < n_steps:
        # The queue is exhausted: nothing is prefetched any more, every parameter's last
        # recorded use is its last use, and each parameter's remaining uses play out on their
        # own (gathered if released, released after its last use or beyond the reuse distance).
        # Persistent parameters stay gathered throughout.
        first = step
        if first <= n_forward - 1:
            kept = list(available)
        gathered_at: list[set[int]] = [set(), set()]
        for i, mine_uses in uses.items():
            k = bisect_left(mine_uses, first)
            if k == len(mine_uses):
                continue
            # ``released`` inlined: uses are distinct steps, so the next use after ``use`` is
            # the next entry, and the last recorded use is final
            held = available[i]
            last = recent[i]
            for j in range(k, len(mine_uses)):
                use = mine_uses[j]
                if not held:
                    phase = 0 if use < n_forward else 1
                    held = True
                    gathered[phase] += numel[i]
                    gathers[phase][i] += 1
                    gathered_at[phase].add(use)
                if last <= use + 1:
                    nxt = j + 1
                    if nxt == len(mine_uses) or (before[mine_uses[nxt]] - before[use + 1] >= reuse):
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
    )


@dataclass(frozen=True)
class Stage3Plan:
    """Stage-3 element counts per micro-step, each parameter padded to a multiple of N.

    From the simulated coordinator (``stage3_trace``, steady state).
    """

    forward_padded: int
    backward_padded: int
    persistent_padded: int
    reduce_padded: int
    reduce_plain: int
    forward_calls: int
    backward_calls: int
    reduce_buckets: int
    persistent: int
    kept: int
    params: int


def stage3_plan(
    params: Sequence[ParamTensor], n: int, knobs: Knobs, *, exact: bool = True
) -> Stage3Plan:
    """What DeepSpeed stage 3 all-gathers and reduces per micro-step on N ranks.

    - Gathers: the coordinator simulation's per-parameter counts (stage3_trace: module fetches,
      prefetches that record every use they pop, the reuse-distance and max-live rules). Each
      gathered parameter moves ``ceil(numel / N) · N`` elements: all_gather_coalesced builds a
      flat buffer of the partitions, ``partition_sz * world_size`` (partition_parameters.py
      _all_gather_dtype :1336-1362), and ``_all_gather_sequential`` one of
      ``ceil(ds_numel / world_size) · world_size`` (:1376). One rank gathers nothing
      (``_no_gather_coalesced``, :1558-1559).
    - Persistent parameters (parameter_offload.py mark_persistent_parameters) stay gathered
      and are all-gathered after each step, one call each (stage3.py:2840-2841 ->
      partition_parameters.py _allgather_params_coalesced :2066-2076).
    - Gradients: IPG buckets in reverse registration order (stage3.py
      __add_grad_to_ipg_bucket), padded per parameter by reduce_scatter_coalesced.
    """
    return _stage3_plan(
        tuple(params),
        n,
        exact,
        knobs.reduce_bucket_size,
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
    )


@lru_cache(maxsize=64)
def _stage3_plan(
    params: tuple[ParamTensor, ...],
    n: int,
    exact: bool,
    reduce_bucket_size: int,
    *trace_knobs: int,
) -> Stage3Plan:
    """``stage3_plan`` once per parameter list, N and knobs (a sweep asks again per request)."""
    trace = _stage3_trace(params, *trace_knobs)
    numels = [p.numel for p in params]
    gathers = n > 1

    def padded_sum(sizes: Counter[int]) -> int:
        # Σ ceil(x / N) · N, once per distinct size (calculators.traffic.padded)
        return sum(count * -(-x // n) * n for x, count in sizes.items())

    def moved(counts: Sequence[int]) -> int:
        if not gathers:
            return 0
        pairs = Counter(zip(counts, numels, strict=True))
        return sum(count * c * -(-x // n) * n for (c, x), count in pairs.items())

    whole = ipg_buckets(list(reversed(numels)), reduce_bucket_size, whole_run=not exact)
    return Stage3Plan(
        forward_padded=moved(trace.forward_gathers),
        backward_padded=moved(trace.backward_gathers),
        persistent_padded=padded_sum(
            tally(x for x, f in zip(numels, trace.persistent, strict=True) if f)
        )
        if gathers
        else 0,
        reduce_padded=padded_sum(tally(numels)),
        reduce_plain=sum(numels),
        forward_calls=trace.forward_calls if gathers else 0,
        backward_calls=trace.backward_calls if gathers else 0,
        reduce_buckets=len(whole),
        persistent=sum(trace.persistent),
        kept=sum(trace.kept),
        params=len(params),
    )
