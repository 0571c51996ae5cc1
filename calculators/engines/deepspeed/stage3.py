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
from itertools import accumulate, compress
from operator import gt

from calculators.conventions import HALF_BYTES
from calculators.engines.deepspeed.allocator import block
from calculators.engines.deepspeed.buckets import ipg_buckets, ipg_ranges
from calculators.engines.deepspeed.config import Knobs
from calculators.parameters import ParamList, ParamTensor, param_numels, tally


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


def module_tree(params: Sequence[ParamTensor]) -> dict[str, list[str]]:
    """Each module's child modules in registration order, the root ``""`` first.

    Every module whose ``forward`` runs is a step of the trace (parameter_offload.py
    pre-forward hook), the root and containers included (they own no parameters);
    ``ModuleList``s are never called, so an indexed module's parent is the module above the
    list.
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
    return children


def fetch_order(params: Sequence[ParamTensor]) -> tuple[list[str], list[str]]:
    """Modules in the order DeepSpeed's hooks fetch them, forward then backward.

    Every module whose ``forward`` runs is fetched (``module_tree``). Backward fetches come
    from the hooks on each module's outputs, so a container comes before its children and
    children run in reverse.
    """
    children = module_tree(params)

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


# --- the trace, run-length coded ---------------------------------------------------------------
# A step of the trace is either one module fetch owning a parameter that can be released, with
# its parameters' indices, or a stretch of consecutive fetches whose parameters are all
# persistent (always gathered, never released: such a fetch only pops its queue entries and may
# prefetch). Identical experts and blocks whose parameters are all persistent make one stretch
# however many copies there are.


@dataclass(frozen=True)
class _Steps:
    """``steps`` consecutive module fetches with ``entries`` parameter uses of ``elements``
    elements in all; ``params``: the one fetch's parameters when it owns one that is not
    persistent."""

    steps: int
    entries: int
    elements: int
    params: tuple[int, ...] | None = None


def _fetch(mine: tuple[int, ...], numel: Sequence[int], persistent: Sequence[bool]) -> _Steps:
    elements = sum(numel[i] for i in mine)
    if all(persistent[i] for i in mine):
        return _Steps(1, len(mine), elements)
    return _Steps(1, len(mine), elements, mine)


def _joined(steps: list[_Steps]) -> list[_Steps]:
    """Consecutive stretches of persistent fetches made one."""
    out: list[_Steps] = []
    for s in steps:
        if s.params is None and out and out[-1].params is None:
            a = out[-1]
            out[-1] = _Steps(a.steps + s.steps, a.entries + s.entries, a.elements + s.elements)
        else:
            out.append(s)
    return out


def _repeated(copy: list[_Steps], copies: int, stride: int, reverse: bool) -> list[_Steps]:
    """The fetches of ``copies`` identical subtrees in trace order, from the first copy's
    (``copy``; copy ``c``'s parameters are ``stride · c`` further down the list): one stretch
    when a copy is one (its parameters all persistent), else each copy's fetches."""
    if len(copy) == 1 and copy[0].params is None:
        s = copy[0]
        return [_Steps(s.steps * copies, s.entries * copies, s.elements * copies)]
    out: list[_Steps] = []
    for c in range(copies - 1, -1, -1) if reverse else range(copies):
        shift = stride * c
        out += [
            s
            if s.params is None or not shift
            else _Steps(1, s.entries, s.elements, tuple(i + shift for i in s.params))
            for s in copy
        ]
    return _joined(out)


def _trace_by_names(
    params: Sequence[ParamTensor], numel: Sequence[int], persistent: Sequence[bool]
) -> tuple[list[_Steps], list[_Steps]]:
    """Forward and backward fetches of a list of named tensors."""
    owned: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        owned.setdefault(p.module, []).append(i)
    forward, backward = fetch_order(params)

    def fetches(order: list[str]) -> list[_Steps]:
        return _joined([_fetch(tuple(owned.get(m, ())), numel, persistent) for m in order])

    return fetches(forward), fetches(backward)


def _trace_by_template(
    params: ParamList, numel: Sequence[int], persistent: Sequence[bool]
) -> tuple[list[_Steps], list[_Steps]]:
    """Forward and backward fetches of an architecture's tensors, from its template: the
    subtree of the first block of each kind (and of its expert 0) stands for every copy, whose
    tensors lie a whole block (expert) further down the list per copy. Persistence must depend
    on a tensor's size alone (copies alike)."""
    template = params.template
    children = module_tree(template.tensors)
    owned: dict[str, list[int]] = {}
    for t, p in enumerate(template.tensors):
        owned.setdefault(p.module, []).append(t)
    block_roots = {f"blocks.{k.start}": n for n, k in enumerate(template.kinds)}
    expert_roots = {
        n: f"blocks.{k.start}.experts.0" for n, k in enumerate(template.kinds) if k.expert
    }

    def subtree(node: str, reverse: bool, kind: int | None) -> list[_Steps]:
        """The fetches of ``node``'s subtree in the first block of its kind (expert 0)."""
        mine = tuple(template.index(t, kind) for t in owned.get(node, ()))
        out = [_fetch(mine, numel, persistent)]
        kids = children[node]
        for kid in reversed(kids) if reverse else kids:
            if kid in block_roots:
                k = block_roots[kid]
                stride = template.block_length(template.kinds[k])
                out += _repeated(
                    subtree(kid, reverse, k), template.kinds[k].blocks, stride, reverse
                )
            elif kind is not None and kid == expert_roots.get(kind):
                stride = template.kinds[kind].expert
                out += _repeated(subtree(kid, reverse, kind), template.experts, stride, reverse)
            else:
                out += subtree(kid, reverse, kind)
        return _joined(out)

    return subtree("", False, None), subtree("", True, None)


def stage3_trace(params: Sequence[ParamTensor], knobs: Knobs) -> Stage3Trace:
    """The coordinator simulation, cached per parameter list and the knobs it reads."""
    return _stage3_trace(
        _key(params),
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
    )


def _key(params: Sequence[ParamTensor]) -> Sequence[ParamTensor]:
    """The list as a cache key: a :class:`ParamList` hashes by its architecture (naming no
    tensor), anything else as a tuple."""
    return params if isinstance(params, ParamList) else tuple(params)


def persistent_flags(
    numels: Sequence[int], persistence: int, model_persistence: int
) -> tuple[tuple[bool, ...], bool]:
    """parameter_offload.py ``mark_persistent_parameters``: numel <= the parameter threshold
    while the running total of persistent elements stays within the model threshold.

    When every small tensor fits the model threshold together (the default, sys.maxsize), the
    running total never binds and each flag is ``numel <= threshold`` alone: the second value
    says so (equal tensors are then alike wherever they sit).
    """
    sizes = tally(numels)
    if sum(count * n for n, count in sizes.items() if n <= persistence) <= model_persistence:
        if max(sizes, default=0) <= persistence:
            return (True,) * len(numels), True
        return tuple(map(persistence.__ge__, numels)), True
    flags, total = [], 0
    for n in numels:
        flag = n <= persistence and (total + n <= model_persistence)
        total += n if flag else 0
        flags.append(flag)
    return tuple(flags), False


@lru_cache(maxsize=64)
def _stage3_trace(
    params: Sequence[ParamTensor],
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
    numel = param_numels(params)
    flags, by_size = persistent_flags(numel, persistence, model_persistence)
    persistent = list(flags)
    if all(persistent):
        # Every parameter stays gathered: nothing is fetched, prefetched or released, and the
        # queue holds only persistent entries (the walk below would pop them and gather
        # nothing). No module tree is needed.
        none = (0,) * len(persistent)
        return Stage3Trace(flags, flags, 0, 0, none, none, 0, 0)
    if isinstance(params, ParamList) and by_size:
        forward, backward = _trace_by_template(params, numel, persistent)
    else:
        forward, backward = _trace_by_names(params, numel, persistent)
    fetches = forward + backward
    n_forward = sum(s.steps for s in forward)
    n_steps = n_forward + sum(s.steps for s in backward)
    # Where each run of fetches starts (step, queue entry, elements traversed before it), the
    # queue entries of the parameters that can be released, as three flat lists, and the
    # elements traversed before each of their fetches and the fetch after (the reuse distance).
    # A persistent parameter is always gathered and never released, so its entries only take
    # room in the queue: the walks below step over them by position.
    starts: list[tuple[int, int, int]] = []
    movable: list[int] = []  # queue positions
    movable_param: list[int] = []
    movable_step: list[int] = []
    uses: dict[int, list[int]] = {}
    before: dict[int, int] = {}
    step = entry = elements = 0
    for s in fetches:
        starts.append((step, entry, elements))
        if s.params is not None:
            before[step] = elements
            before[step + 1] = elements + s.elements
            for k, i in enumerate(s.params):
                if not persistent[i]:
                    movable.append(entry + k)
                    movable_param.append(i)
                    movable_step.append(step)
                    uses.setdefault(i, []).append(step)
        step += s.steps
        entry += s.entries
        elements += s.elements
    n_queue = entry
    head = 0
    available = list(persistent)
    recent = [-(10**18)] * len(numel)
    n_available = 0
    gathered = [0, 0]
    gathers = [[0] * len(numel), [0] * len(numel)]
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

    def prefetch_at(step: int) -> None:
        """Pop until ``min(max_live - available, prefetch_bucket_size)`` elements not yet
        gathered are requested: persistent entries are popped without effect, so only the
        others are visited; the prefetched set is one __all_gather_params call (:484)."""
        nonlocal head
        budget = min(max_live - n_available, prefetch)
        if head >= n_queue or budget <= 0:
            return
        phase = 0 if step < n_forward else 1
        requested = 0
        batch = 0
        k = bisect_left(movable, head)
        head = n_queue  # unless the budget is reached first
        while k < len(movable):
            at = movable[k]
            i = movable_param[k]
            recent[i] = max(recent[i], movable_step[k])
            k += 1
            if not available[i]:
                batch += gather(i, phase)
                requested += numel[i]
                if requested >= budget:
                    head = at + 1
                    break
        if batch:
            calls[phase] += 1

    def released(i: int, after: int) -> bool:
        """Released after a use at ``after - 1``: the walk from ``after`` keeps i if its next
        use comes before the elements traversed reach the distance (checked before each module:
        strictly fewer than it)."""
        if persistent[i] or recent[i] > after:
            return False
        mine_uses = uses[i]
        k = bisect_left(mine_uses, after)
        return not (k < len(mine_uses) and before[mine_uses[k]] - before[after] < reuse)

    step = n_steps
    for (first, entry, _), s in zip(starts, fetches, strict=True):
        if head >= n_queue:
            step = first
            break
        if s.params is not None:
            mine = s.params
            phase = 0 if first < n_forward else 1
            # the module's own parameters: one __all_gather_params call (:381)
            if sum(gather(i, phase) for i in mine):
                calls[phase] += 1
            # pop the module's entries not popped yet (``head`` never lags behind the step's
            # first entry: each step pops up to its last)
            for k, i in enumerate(mine):
                if entry + k >= head:
                    recent[i] = first
            head = max(head, entry + s.entries)
            prefetch_at(first)
            after = first + 1
            for i in [i for i in mine if released(i, after)]:
                if available[i]:
                    available[i] = False
                    n_available -= numel[i]
            if first == n_forward - 1:
                kept = list(available)
            continue
        # A stretch of persistent fetches. Each pops its own entries, which can be neither
        # prefetched nor released, so ``head`` passes them all at once: the prefetch search
        # starts at the first entry after them either way, and a queue that ends inside the
        # stretch leaves no use to play out. Each fetch prefetches while the budget lasts;
        # once it does not, the rest of the stretch changes nothing.
        head = max(head, entry + s.entries)
        j = 0
        while j < s.steps and head < n_queue:
            if min(max_live - n_available, prefetch) > 0:
                prefetch_at(first + j)
                end = j + 1
            else:
                end = s.steps
            if first + j <= n_forward - 1 < first + end:
                kept = list(available)
            j = end
        if j < s.steps:
            step = first + j
            break
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


def sub_groups(numels: Sequence[int], world: int, size: int) -> list[int]:
    """Partition elements of each fp16 sub-group: parameters' partitions (``ceil(n / N)``) are
    added in order and a group closes once it reaches ``sub_group_size``
    (stage3.py _create_fp16_sub_groups :1210-1233).

    Found on the prefix sums of the partitions (one search per group); a model whose whole
    partition stays under the size is one group, counted once per distinct size.
    """
    sizes = tally(numels)
    local = sum(count * -(-n // world) for n, count in sizes.items())
    if local < size:
        return [local] if local else []
    prefix = [0, *accumulate(-(-n // world) for n in numels)]
    out: list[int] = []
    start = 0
    while True:
        end = bisect_left(prefix, prefix[start] + size, start + 1)
        if end == len(prefix):
            break
        out.append(prefix[end] - prefix[start])
        start = end
    if local - prefix[start]:
        out.append(local - prefix[start])
    return out


def gathered_numels(numels: Sequence[int], trace: Stage3Trace) -> list[int]:
    """Sizes of the parameters gathered (not persistent) when forward ends: those the
    coordinator keeps, and the head's last parameter, whose gradient backward starts with."""
    if not numels:
        return []
    kept = list(compress(numels[:-1], map(gt, trace.kept[:-1], trace.persistent[:-1])))
    if not trace.persistent[-1]:
        kept.append(numels[-1])
    return kept


def reduce_scatter_buffer(numels: Sequence[int], bucket: int, world: int) -> int:
    """The largest padded, interleaved copy reduce_scatter_coalesced builds of one IPG bucket
    in backward order (stage3.py __avg_scatter_grads): ``ceil(n / N) · N`` elements per
    gradient, none when the bucket is one gradient that divides evenly; bytes, rounded."""
    order = numels[::-1]
    out = 0
    for first, end in ipg_ranges(order, [0, *accumulate(order)], bucket):
        members = tally(order[first:end])
        members.pop(0, None)  # empty gradients join no bucket
        if sum(members.values()) == 1 and next(iter(members)) % world == 0:
            continue
        padded = sum(count * -(-n // world) * world for n, count in members.items())
        out = max(out, block(HALF_BYTES * padded))
    return out


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
        _key(params),
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
    params: Sequence[ParamTensor],
    n: int,
    exact: bool,
    reduce_bucket_size: int,
    *trace_knobs: int,
) -> Stage3Plan:
    """``stage3_plan`` once per parameter list, N and knobs (a sweep asks again per request)."""
    trace = _stage3_trace(params, *trace_knobs)
    numels = param_numels(params)
    gathers = n > 1

    def padded_sum(sizes: Counter[int]) -> int:
        # Σ ceil(x / N) · N, once per distinct size (calculators.traffic.padded)
        return sum(count * -(-x // n) * n for x, count in sizes.items())

    def moved(counts: Sequence[int]) -> int:
        if not gathers:
            return 0
        pairs = Counter(zip(counts, numels, strict=True))
        return sum(count * c * -(-x // n) * n for (c, x), count in pairs.items())

    whole = ipg_buckets(numels[::-1], reduce_bucket_size, whole_run=not exact)
    return Stage3Plan(
        forward_padded=moved(trace.forward_gathers),
        backward_padded=moved(trace.backward_gathers),
        persistent_padded=padded_sum(tally(compress(numels, trace.persistent))) if gathers else 0,
        reduce_padded=padded_sum(tally(numels)),
        reduce_plain=sum(numels),
        forward_calls=trace.forward_calls if gathers else 0,
        backward_calls=trace.backward_calls if gathers else 0,
        reduce_buckets=len(whole),
        persistent=sum(trace.persistent),
        kept=sum(trace.kept),
        params=len(params),
    )
