"""DeepSpeed stage 3's parameter coordinator, simulated: what stays gathered, what is fetched.

Paths relative to ``deepspeed/runtime/`` of 0.19.8: zero/partitioned_param_coordinator.py,
zero/parameter_offload.py, zero/partition_parameters.py, zero/stage3.py.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import accumulate, compress
from operator import add, ge, gt, sub
from typing import Any

from calculators.architecture import Architecture, dense_layers
from calculators.caching_allocator import block
from calculators.collector import collector_paused
from calculators.conventions import HALF_BYTES
from calculators.engines.deepspeed.buckets import ipg_buckets, ipg_ranges
from calculators.engines.deepspeed.config import Knobs, ModelSteps
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
        root_backward: parameters gathered again by the root's backward step, before the
            loss's backward runs.
        early_backward: those gathered by the backward steps before the first block's (the
            root's, the head's, the final norm's), alive with everything forward saved.
        flat_extra: elements of forward prefetches' flat buffers alive at the end of forward
            beside the copies made from them: a prefetch of several parameters gathers into one
            flat buffer; the first of them to be fetched waits on the whole handle, which copies
            every part out (partition_parameters.py ``AllGatherCoalescedHandle.wait``:
            ``torch.cat``), and the handle, with its buffer, stays in the in-flight registry
            until the last of them is fetched. A prefetch that gathers some parameters for
            forward uses and one for its backward use holds its whole buffer twice into
            backward.
        alone_in_flight: parameters a forward prefetch gathered alone (the only one of its
            ``__all_gather_params`` call not gathered yet) for a use in backward: still in
            flight when forward ends, their gather not waited on until backward fetches them.
            A single-parameter gather hands the collective the partition itself
            (partition_parameters.py ``_all_gather_sequential``), or, under parameter offload,
            a fresh device copy of it that torch's NCCL process group keeps until the wait.
    """

    persistent: tuple[bool, ...]
    kept: tuple[bool, ...]
    forward_gathered: int = 0
    backward_gathered: int = 0
    forward_gathers: tuple[int, ...] = ()
    backward_gathers: tuple[int, ...] = ()
    forward_calls: int = 0
    backward_calls: int = 0
    root_backward: tuple[int, ...] = ()
    early_backward: tuple[int, ...] = ()
    flat_extra: int = 0
    alone_in_flight: tuple[int, ...] = ()


# --- ZeRO-3 leaf modules -----------------------------------------------------------------------
# A leaf module (utils/z3_leaf_module.py, set from zero_optimization.leaf_module by
# engine.py _configure_distributed_model) gets hooks but its children do not
# (parameter_offload.py _register_deepspeed_module): it is one step of the trace that fetches
# and releases every parameter below it. Its own release walk reads every later module's
# parameters recursively (partitioned_param_coordinator.py __params_to_release passes
# ``recurse=z3_leaf_module(submodule_to_release)`` for each module it walks), while the other
# modules' walks read a leaf's own parameters only (none for an MoE block).

MOE_BLOCK_CLASSES = {
    "mixtral": "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "qwen2_moe": "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "qwen3_moe": "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
    "deepseek_v3": "transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
}
"""The MoE block of each family, as transformers >= 5 names it (``model.layers.<i>.mlp``)."""

_MOE_PARTS = frozenset({"router", "experts", "shared_expert", "shared_expert_gate"})
"""The modules of an MoE block in the canonical names (``blocks.<i>.<part>``)."""
_MOE_RUN = ("router", "experts", "shared_expert", "shared_expert_gate")
_QWEN2_MOE_RUN = ("shared_expert", "router", "experts", "shared_expert_gate")


def leaf_layers(arch: Architecture | None, knobs: Knobs) -> frozenset[int]:
    """The layers whose MoE block is a ZeRO-3 leaf module under ``knobs``' ``leaf_module``:
    its class named (fully qualified or by class name, utils/z3_leaf_module.py
    _do_set_z3_leaf_modules), or its module name ``model.layers.<i>.mlp`` named or ending in a
    named suffix. Only a transformers MoE family has such blocks."""
    m = arch.modelling if arch is not None else None
    if arch is None or m is None or arch.num_experts <= 1 or m.family not in MOE_BLOCK_CLASSES:
        return frozenset()
    qualified = MOE_BLOCK_CLASSES[m.family]
    short = qualified.rsplit(".", 1)[1]
    moe = range(dense_layers(arch), arch.layers)
    if qualified in knobs.leaf_classes or short in knobs.leaf_classes:
        return frozenset(moe)
    names = set(knobs.leaf_names)
    return frozenset(
        i
        for i in moe
        if f"model.layers.{i}.mlp" in names
        or any(f"model.layers.{i}.mlp".endswith(x) for x in knobs.leaf_suffixes)
    )


def _module(p: ParamTensor, leaves: frozenset[int]) -> str:
    """The module whose hooks fetch ``p``: its own, or the leaf MoE block above it."""
    module = p.module
    if leaves and module.startswith("blocks."):
        _, layer, rest = (module.split(".", 2) + [""])[:3]
        if rest.split(".", 1)[0] in _MOE_PARTS and int(layer) in leaves:
            return f"blocks.{layer}.mlp"
    return module


def _is_leaf(module: str, leaves: frozenset[int]) -> bool:
    """Whether ``module`` is the leaf MoE block of one of ``leaves``."""
    if not leaves or not module.endswith(".mlp") or not module.startswith("blocks."):
        return False
    layer = module[len("blocks.") : -len(".mlp")]
    return layer.isdigit() and int(layer) in leaves


_ROTARY = "rotary_emb."
"""The rotary embeddings' steps (``rotary_emb.<k>``): forward only."""


def _in_backward(module: str) -> bool:
    return not module.startswith(_ROTARY)


def _with_steps(children: dict[str, list[str]], steps: ModelSteps) -> None:
    """``children`` with transformers' parameterless modules added (:class:`ModelSteps`)."""
    for node, kids in list(children.items()):
        gate = f"{node}.gate" if f"{node}.up" in kids else f"{node}.gate_up"
        if gate in kids:
            act = f"{node}.act_fn"
            kids.insert(kids.index(gate) + 1, act)
            children[act] = []
        elif node.endswith(".experts") and not kids:  # experts as two 3-D parameters
            kids.append(f"{node}.act_fn")
            children[f"{node}.act_fn"] = []
        parts = [k for k in kids if k.rsplit(".", 1)[-1] in _MOE_PARTS]
        if parts and node.startswith("blocks."):  # the MoE block, not a leaf here
            block = f"{node}.mlp"
            kids[kids.index(parts[0]) : kids.index(parts[-1]) + 1] = [block]
            # run order: the router, the experts, the shared expert; Qwen2-MoE runs its shared
            # expert first and its gate last
            order = _QWEN2_MOE_RUN if f"{node}.shared_expert_gate" in parts else _MOE_RUN
            children[block] = sorted(parts, key=lambda k: order.index(k.rsplit(".", 1)[-1]))
        if steps.residual_dropout and f"{node}.attn" in kids and f"{node}.mlp" in kids:
            for part in ("attn", "mlp"):
                dropout = f"{node}.{part}_dropout"
                kids.insert(kids.index(f"{node}.{part}") + 1, dropout)
                children[dropout] = []
    top = children[""]
    inner = [k for k in top if k != "head"]
    rotary = [f"{_ROTARY}{k}" for k in range(steps.rotary)]
    at = inner.index("embed") + 1 if "embed" in inner else 0
    inner[at:at] = rotary
    head = ["head"] if "head" in top or steps.tied_head else []
    for k in rotary + head:
        children.setdefault(k, [])
    children["model"] = inner
    children[""] = ["model", *head]


def module_tree(
    params: Sequence[ParamTensor],
    leaves: frozenset[int] = frozenset(),
    steps: ModelSteps | None = None,
) -> dict[str, list[str]]:
    """Each module's child modules in registration order, the root ``""`` first.

    Every module whose ``forward`` runs is a step of the trace (parameter_offload.py
    pre-forward hook), the root and containers included (they own no parameters);
    ``ModuleList``s are never called, so an indexed module's parent is the module above the
    list. The MoE blocks of ``leaves`` are leaf modules: one module, no children. ``steps``:
    transformers' modules that own no listed parameter (:class:`ModelSteps`).
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
        module = _module(p, leaves)
        if module in children:
            continue
        above, _, name = module.rpartition(".")
        if above in children and not name.isdigit():  # the parent seen already: most modules
            children[module] = []
            children[above].append(module)
        else:
            register(module)
    if steps is not None:
        _with_steps(children, steps)
    return children


def fetch_order(
    params: Sequence[ParamTensor],
    leaves: frozenset[int] = frozenset(),
    steps: ModelSteps | None = None,
    recompute: bool = False,
) -> tuple[list[str], list[str]]:
    """Modules in the order DeepSpeed's hooks fetch them, forward then backward.

    Every module whose ``forward`` runs is fetched (``module_tree``). Backward fetches come
    from the hooks on each module's outputs, so a container comes before its children and
    children run in reverse. ``recompute``: each block runs its forward again in backward
    (:func:`_recomputed`).
    """
    children = module_tree(params, leaves, steps)
    owners = {_module(p, leaves) for p in params}
    return _walk(children, False), _walk(children, True, owners if recompute else None)


def _before_blocks(backward: list[str]) -> int:
    """Backward steps before the first block's (the root, the head, the final norm), of the
    modules in backward order."""
    return next((k for k, m in enumerate(backward) if m.startswith("blocks.")), len(backward))


def _walk(
    children: dict[str, list[str]],
    reverse: bool,
    recompute: set[str] | None = None,
    root: str = "",
) -> list[str]:
    """The modules from ``root``, each before its children (last first when ``reverse``).
    ``recompute``: the modules that own parameters, when each block runs its forward again in
    backward (:func:`_recomputed`)."""
    out: list[str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if reverse and recompute is not None and _is_block(node):
            path, later = _trigger_path(children, node, recompute)
            out += path + _walk(children, False, root=node)
            stack.extend(reversed(later))
            continue
        out.append(node)
        kids = children[node]
        # pushed last-first, so the first to visit is on top
        stack.extend([k for k in kids if _in_backward(k)] if reverse else reversed(kids))
    return out


# --- recomputation ------------------------------------------------------------------------------
# Under transformers' gradient checkpointing (``GradientCheckpointingLayer``:
# torch.utils.checkpoint, non-reentrant) each decoder layer's forward runs again in backward,
# through ``__call__``, so DeepSpeed's pre-forward hooks fetch the layer and every module in it
# once more (partitioned_param_coordinator.py ``record_module`` traces those steps with the
# rest). The recomputation starts when backward first reads what the layer saved: the backward
# hooks on the layer's output and on the output of its last child, of that child's last child
# and so on fire first, down to the first module that saved something (a parameterless leaf, a
# dropout at p = 0, saves nothing and is passed), then the layer's forward runs whole, then
# backward goes on with the modules not yet fetched. An MoE block's experts end the descent:
# the block combining their outputs saves what it routed. Read off DeepSpeed's own trace of
# transformers' layers on the CPU (``bench/ds_cpu_gathers.py --checkpointing full --order``
# prints a layer's backward steps as ``record_module`` saw them), and checked by its gathers.


def held_steps(backward: Sequence[str]) -> set[int]:
    """The backward fetches (positions in ``backward``, a recomputed trace) made before their
    block's recomputation: from a block's first step to its second. Their modules' backward
    runs the recomputation, and their release waits for its end (parameter_offload.py: the
    release is the post-backward hook's, ``ds_active_sub_modules`` holds the module until
    then), so none is released before the recomputation fetches it again."""
    held: set[int] = set()
    block = None
    for k, m in enumerate(backward):
        if _is_block(m):
            block = m if block != m else None  # its second step: the recomputation's
        if block is not None:
            held.add(k)
    return held


def _holding(s: _Steps) -> _Steps:
    """``s`` as a fetch before its block's recomputation (:func:`held_steps`)."""
    return replace(s, held=True) if s.params is not None else s


def _is_block(module: str) -> bool:
    """Whether ``module`` is a decoder layer (``blocks.<i>``)."""
    above, _, index = module.rpartition(".")
    return above == "blocks" and index.isdigit()


def _is_expert(module: str) -> bool:
    """Whether ``module`` is one expert of an MoE block (``blocks.<i>.experts.<j>``)."""
    above, _, index = module.rpartition(".")
    return index.isdigit() and above.endswith(".experts")


def _trigger_path(
    children: dict[str, list[str]], node: str, owners: set[str]
) -> tuple[list[str], list[str]]:
    """A recomputed module's backward steps before its forward runs again (``node``, its last
    child, that child's last child, ... down to the first that saved something), and the
    subtrees whose backward steps come after it, in order."""
    path, later = [node], []
    kids = [k for k in reversed(children[node]) if _in_backward(k)]
    while kids:
        k = kids[0]
        if _is_expert(k):
            break
        kids.pop(0)
        if not children[k] and k not in owners:  # parameterless: saved nothing
            path.append(k)
            continue
        below, below_later = _trigger_path(children, k, owners)
        path += below
        later = below_later
        break
    return path, later + kids


# --- the trace, run-length coded ---------------------------------------------------------------
# A step of the trace is either one module fetch owning a parameter that can be released, with
# its parameters' indices, or a stretch of consecutive fetches whose parameters are all
# persistent (always gathered, never released: such a fetch only pops its queue entries and may
# prefetch). Identical experts and blocks whose parameters are all persistent make one stretch
# however many copies there are; identical copies that own parameters which can be released
# make one run (the first copy's fetches and how far down the list each further copy lies).


@dataclass(frozen=True)
class _Steps:
    """``steps`` consecutive module fetches with ``entries`` parameter uses of ``elements``
    elements in all; ``params``: the one fetch's parameters when it owns one that is not
    persistent; ``held``: a backward fetch before its block's recomputation, whose release
    waits for the module's backward, which runs the recomputation (:func:`held_steps`)."""

    steps: int
    entries: int
    elements: int
    params: tuple[int, ...] | None = None
    nested: int = 0
    leaf: bool = False
    held: bool = False


@dataclass(frozen=True)
class _Run:
    """``copies`` identical subtrees in trace order: ``body`` is the first one's fetches (none a
    run), and each further copy's parameters lie ``shift`` further down the list (negative when
    the copies are walked last first). ``steps``, ``entries``, ``elements``, ``nested``: one
    copy's."""

    body: tuple[_Steps, ...]
    copies: int
    shift: int
    steps: int
    entries: int
    elements: int
    nested: int = 0


_Item = _Steps | _Run


def _fetch(
    mine: tuple[int, ...],
    numel: Sequence[int],
    persistent: Sequence[bool],
    nested: int,
    leaf: bool = False,
) -> _Steps:
    """One module's fetch; a leaf module owns no parameter itself (all lie below it)."""
    if len(mine) == 1:  # most modules: one weight
        (i,) = mine
        elements, alike = (0 if leaf else numel[i]), persistent[i]
    else:
        elements = 0 if leaf else sum([numel[i] for i in mine])
        alike = all(persistent[i] for i in mine)
    if alike:
        return _Steps(1, len(mine), elements, None, nested)
    return _Steps(1, len(mine), elements, mine, nested, leaf)


def _joined(steps: list[_Item]) -> list[_Item]:
    """Consecutive stretches of persistent fetches made one."""
    out: list[_Item] = []
    for s in steps:
        a = out[-1] if out else None
        if (
            isinstance(s, _Steps)
            and s.params is None
            and isinstance(a, _Steps)
            and a.params is None
        ):
            out[-1] = _Steps(
                a.steps + s.steps,
                a.entries + s.entries,
                a.elements + s.elements,
                None,
                a.nested + s.nested,
            )
        else:
            out.append(s)
    return out


def _shifted(s: _Steps, shift: int) -> _Steps:
    """``s`` with its parameters ``shift`` further down the list."""
    if not shift or s.params is None:
        return s
    return _Steps(
        s.steps,
        s.entries,
        s.elements,
        tuple(i + shift for i in s.params),
        s.nested,
        s.leaf,
        s.held,
    )


def _moved(s: _Item, shift: int) -> _Item:
    """``s`` (a run: each copy) with its parameters ``shift`` further down the list."""
    if isinstance(s, _Run):
        body = tuple(_shifted(b, shift) for b in s.body)
        return _Run(body, s.copies, s.shift, s.steps, s.entries, s.elements, s.nested)
    return _shifted(s, shift)


def _repeated(copy: list[_Item], copies: int, stride: int, reverse: bool) -> list[_Item]:
    """The fetches of ``copies`` identical subtrees in trace order, from the first copy's
    (``copy``; copy ``c``'s parameters are ``stride · c`` further down the list): one stretch
    when a copy is one (its parameters all persistent), one run when a copy holds no run, else
    each copy's fetches."""
    if len(copy) == 1 and isinstance(copy[0], _Steps) and copy[0].params is None:
        s = copy[0]
        return [
            _Steps(
                s.steps * copies, s.entries * copies, s.elements * copies, None, s.nested * copies
            )
        ]
    flat = [s for s in copy if isinstance(s, _Steps)]
    if copies > 1 and len(flat) < len(copy):
        # a copy that holds runs (a block's experts): written out step by step when that is no
        # longer than the copies are many, so the copies make one run (the walk then plays most
        # copies at once instead of walking each copy's own runs)
        size = sum(s.copies * len(s.body) if isinstance(s, _Run) else 1 for s in copy)
        if size <= max(_UNROLL, copies):
            flat = _unrolled(copy)
            copy = list(flat)
    if copies > 1 and len(flat) == len(copy):
        first = stride * (copies - 1) if reverse else 0
        return [
            _Run(
                tuple(_shifted(s, first) for s in flat),
                copies,
                -stride if reverse else stride,
                sum(s.steps for s in flat),
                sum(s.entries for s in flat),
                sum(s.elements for s in flat),
                sum(s.nested for s in flat),
            )
        ]
    out: list[_Item] = []
    for c in range(copies - 1, -1, -1) if reverse else range(copies):
        out += [_moved(s, stride * c) for s in copy]
    return _joined(out)


# a copy's runs are written out when the result has at most this many steps, or as many as there
# are copies (``_repeated``)
_UNROLL = 64


def _unrolled(copy: list[_Item]) -> list[_Steps]:
    """``copy``'s fetches with each run written out copy by copy."""
    out: list[_Item] = []
    for s in copy:
        if isinstance(s, _Run):
            out += [_shifted(b, c * s.shift) for c in range(s.copies) for b in s.body]
        else:
            out.append(s)
    return [s for s in _joined(out) if isinstance(s, _Steps)]


def _trace_by_names(
    params: Sequence[ParamTensor],
    numel: Sequence[int],
    persistent: Sequence[bool],
    leaves: frozenset[int],
    steps: ModelSteps | None = None,
    recompute: bool = False,
) -> tuple[list[_Item], list[_Item], int]:
    """Forward and backward fetches of a list of named tensors, and the backward steps before
    the first block's."""
    owned: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        owned.setdefault(_module(p, leaves), []).append(i)
    owners = set(owned) if recompute else None
    if steps is not None and steps.tied_head and "embed" in owned:
        owned["head"] = owned["embed"]  # lm_head holds the embedding's weight
    children = module_tree(params, leaves, steps)
    forward, backward = _walk(children, False), _walk(children, True, owners)
    # each module's fetch, the same forward and backward; its elements below it first
    total: dict[str, int] = {}
    step: dict[str, _Steps] = {}
    for node in reversed(forward):  # children before their parent
        mine = tuple(owned.get(node, ()))
        own = sum(numel[i] for i in mine)
        kids = children[node]
        total[node] = own + sum(total[k] for k in kids) if kids else own
        step[node] = _fetch(mine, numel, persistent, total[node], _is_leaf(node, leaves))
    held = held_steps(backward) if recompute else set()
    return (
        _joined([step[m] for m in forward]),
        _joined([_holding(step[m]) if k in held else step[m] for k, m in enumerate(backward)]),
        _before_blocks(backward),
    )


def _trace_by_template(
    params: ParamList,
    numel: Sequence[int],
    persistent: Sequence[bool],
    by_size: bool,
    leaves: frozenset[int],
    steps: ModelSteps | None = None,
    recompute: bool = False,
) -> tuple[list[_Item], list[_Item], int]:
    """Forward and backward fetches of an architecture's tensors, from its template (and the
    backward steps before the first block's): the
    subtree of the first block of each kind (and of its expert 0) stands for every copy, whose
    tensors lie a whole block (expert) further down the list per copy. ``by_size``: persistence
    depends on a tensor's size alone, so copies are alike; otherwise consecutive copies whose
    tensors' persistence is alike are taken together. ``leaves`` holds every block of a kind or
    none of them."""
    template = params.template
    children = module_tree(template.tensors, leaves, steps)
    owned: dict[str, list[int]] = {}
    for t, p in enumerate(template.tensors):
        owned.setdefault(_module(p, leaves), []).append(t)
    owners = set(owned)
    if steps is not None and steps.tied_head and "embed" in owned:
        owned["head"] = owned["embed"]  # lm_head holds the embedding's weight
    block_roots = {f"blocks.{k.start}": n for n, k in enumerate(template.kinds)}
    expert_roots = {
        n: f"blocks.{k.start}.experts.0" for n, k in enumerate(template.kinds) if k.expert
    }

    def alike(node: str, kind: int, shift: int, stride: int, copies: int) -> list[tuple[int, int]]:
        """Consecutive copies of ``node`` (each ``stride`` tensors, one after another, the
        first ``shift`` down the list from the template's) whose tensors' persistence is
        alike: (first copy, copies)."""
        if by_size:
            return [(0, copies)]
        inside = [
            template.index(t, kind)
            for t, p in enumerate(template.tensors)
            if p.module == node or p.module.startswith(node + ".")
        ]
        low = min(inside, default=0) + shift
        groups, first = [], 0
        for c in range(1, copies):
            here = low + c * stride
            if persistent[here : here + stride] != persistent[here - stride : here]:
                groups.append((first, c - first))
                first = c
        return [*groups, (first, copies - first)]

    def copies_of(
        node: str, reverse: bool, kind: int, shift: int, stride: int, copies: int
    ) -> tuple[list[_Item], int]:
        parts, total = [], 0
        walk = recomputed if reverse and recompute and _is_block(node) else subtree
        for first, count in alike(node, kind, shift, stride, copies):
            copy, size = walk(node, reverse, kind, shift + stride * first)
            parts.append(_repeated(copy, count, stride, reverse))
            total += size * count
        return _joined([s for part in (parts[::-1] if reverse else parts) for s in part]), total

    def subtree(node: str, reverse: bool, kind: int | None, shift: int) -> tuple[list[_Item], int]:
        """The fetches of ``node``'s subtree in the first block of its kind (expert 0), its
        tensors ``shift`` further down the list, and the elements below ``node``."""
        mine = tuple(template.index(t, kind) + shift for t in owned.get(node, ()))
        total = sum(numel[i] for i in mine)
        out: list[_Item] = []
        kids = children[node]
        for kid in [k for k in reversed(kids) if _in_backward(k)] if reverse else kids:
            part, size = below(kid, reverse, kind, shift)
            out += part
            total += size
        own = _fetch(mine, numel, persistent, total, _is_leaf(node, leaves))
        return _joined([own, *out]), total

    def below(kid: str, reverse: bool, kind: int | None, shift: int) -> tuple[list[_Item], int]:
        """The fetches of ``kid``'s subtree, its copies taken together where it is the first
        block of its kind or the first expert."""
        if kid in block_roots:
            k = block_roots[kid]
            stride = template.block_length(template.kinds[k])
            return copies_of(kid, reverse, k, shift, stride, template.kinds[k].blocks)
        if kind is not None and kid == expert_roots.get(kind):
            stride = template.kinds[kind].expert
            return copies_of(kid, reverse, kind, shift, stride, template.experts)
        return subtree(kid, reverse, kind, shift)

    def recomputed(
        node: str, _reverse: bool, kind: int | None, shift: int
    ) -> tuple[list[_Item], int]:
        """A block's backward fetches with its forward run again (``_trigger_path``)."""
        forward, total = subtree(node, False, kind, shift)
        path, later = _trigger_path(children, node, owners)
        out: list[_Item] = []
        for m in path:  # each module's own fetch
            mine = tuple(template.index(t, kind) + shift for t in owned.get(m, ()))
            nested = subtree(m, False, kind, shift)[1]
            out.append(_holding(_fetch(mine, numel, persistent, nested, _is_leaf(m, leaves))))
        out += forward
        for m in later:
            out += below(m, True, kind, shift)[0]
        return _joined(out), total

    backward = subtree("", True, None, 0)[0]
    return (
        subtree("", False, None, 0)[0],
        backward,
        _before_blocks(_walk(children, True, owners if recompute else None)),
    )


def stage3_trace(params: Sequence[ParamTensor], knobs: Knobs) -> Stage3Trace:
    """The coordinator simulation, cached per parameter list and the knobs it reads."""
    return _stage3_trace(*_trace_args(params, knobs))


def _trace_args(
    params: Sequence[ParamTensor], knobs: Knobs
) -> tuple[Sequence[ParamTensor], int, int, int, int, int, frozenset[int], ModelSteps | None, bool]:
    """``_stage3_trace``'s arguments: the list as a cache key, the knobs it reads, the
    modelling code's parameterless steps and whether the blocks are recomputed."""
    leaves = knobs.leaves
    key = _key(params)
    if leaves and isinstance(params, ParamList):
        spans = [set(range(k.start, k.start + k.blocks)) for k in params.template.kinds]
        if any(span & leaves and not span <= leaves for span in spans):
            key = tuple(params)  # some blocks of a kind are leaves: walked by name
    return (
        key,
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
        leaves,
        knobs.steps,
        knobs.recompute,
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
@collector_paused
def _stage3_trace(
    params: Sequence[ParamTensor],
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
    leaves: frozenset[int] = frozenset(),
    modelled: ModelSteps | None = None,
    recompute: bool = False,
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
      they reappear in the trace before ``stage3_max_reuse_distance`` elements. A leaf
      module's walk reads each later module's parameters recursively, so its own reappear at
      the first backward step (the root): they are kept when forward after it reads fewer
      elements than the distance, counting a parameter once per module above it.
    - ``recompute``: each block runs its forward again in backward (:func:`_trigger_path`), so
      its parameters have three uses: forward, then two in backward (the recomputation's and
      the backward's, or for the modules fetched before the recomputation starts, those two
      the other way round).

    The prefetcher outruns the forward (it skips what is gathered), reaches the backward half of
    the queue a few modules in and records every backward use, so on models that fit
    ``stage3_max_live_parameters`` nearly every parameter stays gathered into backward.

    A run of identical copies (experts, blocks) is walked copy by copy only until a copy
    repeats the one before it exactly; the copies after it that would repeat it too (the
    prefetch head a copy further on, the live-element count back, the same reuse decisions) are
    played at once (``repeats``).
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
    if isinstance(params, ParamList):
        forward, backward, outside = _trace_by_template(
            params, numel, persistent, by_size, leaves, modelled, recompute
        )
    else:
        forward, backward, outside = _trace_by_names(
            params, numel, persistent, leaves, modelled, recompute
        )
    items = forward + backward
    n_forward = sum(_span(s)[0] for s in forward)
    early_end = n_forward + outside  # the backward steps before the first block's
    early: list[tuple[bool, int]] = []  # (after the root's step, parameter)
    n_steps = n_forward + sum(_span(s)[0] for s in backward)
    # Where each item starts (step, queue entry, elements traversed before it); the queue
    # entries of the parameters that can be released, as three flat lists; and for each such
    # parameter its uses (every module is fetched once in forward, once in backward, and with
    # ``recompute`` a block's once more in backward: the first backward use is then the middle
    # one ``use_m``, else ``use_m`` is ``use_b``), the elements traversed before each backward
    # use and after each other use (the reuse distances between them). A persistent parameter is
    # always gathered and never released, so its entries only take room in the queue: the walks
    # below step over them by position. A run's entries and uses are laid out copy by copy at
    # once.
    n = len(numel)
    starts: list[tuple[int, int, int]] = []
    movable: list[int] = []  # queue positions
    movable_param: list[int] = []
    movable_step: list[int] = []
    use_f, use_b, after_f, before_b = [0] * n, [0] * n, [0] * n, [0] * n
    # the middle uses, while there may be some: each backward use moves the one before to them
    after_b = [0] * n
    use_m, before_m, after_m = ([0] * n, [0] * n, [0] * n) if recompute else (use_b, before_b, [])
    # the middle use is a fetch whose release waits for the recomputation (``_Steps.held``)
    holding = [False] * n if recompute else []
    middle = ((use_b, use_m), (before_b, before_m), (after_b, after_m)) if recompute else ()
    # a leaf module's parameters with the nested elements read in forward up to and with it
    leaf_reads: list[tuple[tuple[int, ...], int]] = []
    # every use of a parameter held by two modules (a tied head's): (step, elements traversed
    # before it, and after it); only the tied embedding is, so the others are dropped below
    shared: dict[int, list[tuple[int, int, int]]] = {}
    tied = modelled is not None and modelled.tied_head
    step = entry = elements = nested = 0
    for s in items:
        starts.append((step, entry, elements))
        back = step >= n_forward
        if not back:
            if isinstance(s, _Run):
                read = nested
                for b in s.body:
                    read += b.nested
                    if b.leaf and b.params is not None:
                        leaf_reads += [
                            (tuple(i + c * s.shift for i in b.params), read + c * s.nested)
                            for c in range(s.copies)
                        ]
                nested += s.nested * s.copies
            else:
                nested += s.nested
                if s.leaf and s.params is not None:
                    leaf_reads.append((s.params, nested))
        uses, distances = (use_b, before_b) if back else (use_f, after_f)
        moved = middle if back else ()
        if isinstance(s, _Run):
            # entry, parameter, step, elements before it and after it
            lanes: list[tuple[int, int, int, int, int]] = []
            at = [0, 0, 0]
            for b in s.body:
                for k, i in enumerate(b.params or ()):
                    if not persistent[i]:
                        lanes.append((at[0] + k, i, at[1], at[2], at[2] + b.elements))
                        if b.held:
                            _set(holding, i, s.shift, 0, s.copies, [True] * s.copies)
                at = [at[0] + b.entries, at[1] + b.steps, at[2] + b.elements]
            width, copies = len(lanes), s.copies
            size = width * copies
            positions, owners, steps = [0] * size, [0] * size, [0] * size
            for j, (e, i, t, el, el_after) in enumerate(lanes):
                positions[j::width] = range(entry + e, entry + e + copies * s.entries, s.entries)
                owners[j::width] = range(i, i + copies * s.shift, s.shift)
                steps[j::width] = range(step + t, step + t + copies * s.steps, s.steps)
                for source, target in moved:
                    _set(target, i, s.shift, 0, copies, _lane(source, i, s.shift, 0, copies))
                _fill(uses, i, s.shift, copies, step + t, s.steps)
                _fill(
                    distances, i, s.shift, copies, elements + (el if back else el_after), s.elements
                )
                if moved:
                    _fill(after_b, i, s.shift, copies, elements + el_after, s.elements)
            movable += positions
            movable_param += owners
            movable_step += steps
        elif s.params is not None:
            for k, i in enumerate(s.params):
                if not persistent[i]:
                    movable.append(entry + k)
                    movable_param.append(i)
                    movable_step.append(step)
                    for source, target in moved:
                        target[i] = source[i]
                    uses[i] = step
                    distances[i] = elements + (0 if back else s.elements)
                    after_b[i] = elements + s.elements
                    if s.held:
                        holding[i] = True
                    if tied:
                        shared.setdefault(i, []).append((step, elements, elements + s.elements))
        spanned = _span(s)
        step += spanned[0]
        entry += spanned[1]
        elements += spanned[2]
    n_queue = entry
    # the tied embedding: two uses in forward
    shared = {i: u for i, u in shared.items() if sum(t < n_forward for t, _, _ in u) > 1}
    if recompute:
        # a parameter with one backward use: its middle use is that one
        for i in [i for i, m in enumerate(use_m) if not m]:
            use_m[i], before_m[i], after_m[i] = use_b[i], before_b[i], after_b[i]
    # elements a release walk reads between a parameter's forward use and its next use: its own
    # module's walk counts modules' own parameters; a leaf's, every module's nested ones up to
    # the root's backward step. ``gap_m``: between the middle use and the last.
    gap: list[int] = list(map(sub, before_m, after_f))
    gap_m: list[int] = list(map(sub, before_b, after_m)) if recompute else gap
    for mine, read in leaf_reads:
        for i in mine:
            gap[i] = nested - read
    for i in compress(range(n), holding):
        gap_m[i] = -1  # never released before the recomputation fetches it again
    item_entries = [e for _, e, _ in starts]
    head = 0
    available = list(persistent)
    recent = [_NEVER] * n
    n_available = 0
    gathered = [0, 0]
    gathers = [[0] * n, [0] * n]
    calls = [0, 0]
    kept = available
    alone = [False] * n  # Stage3Trace.alone_in_flight
    # While a run's copy is walked as the pattern of the copies after it: each parameter's
    # state before the copy first changed it (gathered, last recorded use, gathers per phase,
    # gathered alone in flight).
    journal: dict[int, tuple[bool, int, int, int, bool]] | None = None
    # A copy whose prefetches popped more parameters than any run's copy has entries moved the
    # head by more than a copy of the run it lies in, so nothing repeats it (``repeats``): its
    # journal stops there. ``journal_room``: entries it may still take.
    widest = max((s.entries for s in items if isinstance(s, _Run)), default=0)
    journal_room = 0
    # Since the copy began: whether a prefetch found room, and the fewest live elements a
    # prefetch found no room at.
    prefetched, crowded = [False], [_NEVER]
    flat = [0]  # Stage3Trace.flat_extra

    def room() -> int:
        """The prefetch budget: ``min(max_live - available, prefetch_bucket_size)``."""
        budget = min(max_live - n_available, prefetch)
        if budget > 0:
            prefetched[0] = True
        elif crowded[0] == _NEVER or n_available < crowded[0]:
            crowded[0] = n_available
        return budget

    def note(i: int) -> None:
        nonlocal journal, journal_room
        if journal is not None and i not in journal:
            journal[i] = (available[i], recent[i], gathers[0][i], gathers[1][i], alone[i])
            journal_room -= 1
            if journal_room < 0:
                journal = None

    def gather(i: int, phase: int) -> int:
        nonlocal n_available
        if available[i]:
            return 0
        note(i)
        available[i] = True
        n_available += numel[i]
        gathered[phase] += numel[i]
        gathers[phase][i] += 1
        return 1

    def prefetch_at(step: int) -> None:
        """Pop until ``min(max_live - available, prefetch_bucket_size)`` elements not yet
        gathered are requested: persistent entries are popped without effect, so only the
        others are visited; the prefetched set is one __all_gather_params call (:484)."""
        nonlocal head, n_available
        budget = room()
        if head >= n_queue or budget <= 0:
            return
        phase = 0 if step < n_forward else 1
        requested = 0
        batch = last = 0
        # what the backward steps before the first block's gather (Stage3Trace.early_backward)
        early_step = (step > n_forward) if n_forward <= step < early_end else None
        first = bisect_left(movable, head)
        head = n_queue  # unless the budget is reached first
        # ``gather`` written out: a prefetch may pop most of the queue (``note`` is called
        # at most ``journal_room`` times a copy)
        counts = gathers[phase]
        waited = pending = False  # one of the batch fetched in forward, one only in backward
        for k in range(first, len(movable)):
            i = movable_param[k]
            if journal is not None and i not in journal:
                note(i)
            use = movable_step[k]
            if use > recent[i]:
                recent[i] = use
            if not available[i]:
                available[i] = True
                size = numel[i]
                n_available += size
                gathered[phase] += size
                counts[i] += 1
                batch += 1
                last = i
                if early_step is not None:
                    early.append((early_step, i))
                if use < n_forward:
                    waited = True
                else:
                    pending = True
                requested += size
                if requested >= budget:
                    head = movable[k] + 1
                    break
        if batch:
            calls[phase] += 1
            if waited and pending:
                flat[0] += requested
            elif batch == 1 and pending and phase == 0:
                alone[last] = True

    def released(i: int, after: int) -> bool:
        """Released after a use at ``after - 1``: the walk from ``after`` keeps i if its next
        use comes before the elements traversed reach the distance (checked before each module:
        strictly fewer than it)."""
        if persistent[i] or recent[i] > after:
            return False
        if i in shared:
            return _next_use_beyond(shared[i], after, reuse)
        if after > use_b[i]:
            return True
        return (gap_m[i] if after > use_m[i] else gap[i]) >= reuse

    def fetch(first: int, entry: int, mine: tuple[int, ...], entries: int) -> None:
        """One module fetch owning a parameter that can be released."""
        nonlocal head, n_available, kept
        phase = 0 if first < n_forward else 1
        # the module's own parameters: one __all_gather_params call (:381)
        if n_forward <= first < early_end:
            early.extend((first > n_forward, i) for i in mine if not available[i])
        if sum([gather(i, phase) for i in mine]):
            calls[phase] += 1
        # pop the module's entries not popped yet (``head`` never lags behind the step's
        # first entry: each step pops up to its last)
        for k, i in enumerate(mine):
            if entry + k >= head:
                note(i)
                recent[i] = first
        head = max(head, entry + entries)
        prefetch_at(first)
        after = first + 1
        for i in [i for i in mine if released(i, after)]:
            if available[i]:
                note(i)
                available[i] = False
                n_available -= numel[i]
        if first == n_forward - 1:
            kept = list(available)

    def stretch(first: int, entry: int, s: _Steps) -> int | None:
        """A stretch of persistent fetches; the step where the queue runs out within it, if it
        does. Each pops its own entries, which can be neither prefetched nor released, so
        ``head`` passes them all at once: the prefetch search starts at the first entry after
        them either way, and a queue that ends inside the stretch leaves no use to play out.
        Each fetch prefetches while the budget lasts; once it does not, the rest of the stretch
        changes nothing."""
        nonlocal head, kept
        head = max(head, entry + s.entries)
        j = 0
        while j < s.steps and head < n_queue:
            if room() > 0:
                prefetch_at(first + j)
                end = j + 1
            else:
                end = s.steps
            if first + j <= n_forward - 1 < first + end:
                kept = list(available)
            j = end
        return first + j if j < s.steps else None

    def use_class(i: int, last: int) -> int:
        """Which of i's uses ``last`` (a recorded use) is: none yet, forward, (with
        ``recompute``) middle, backward."""
        cls = (last >= use_f[i]) + (last >= use_b[i])
        return cls + (last >= use_m[i]) if recompute else cls

    def states(x: int, dx: int, lo: int, hi: int) -> tuple[list[bool], list[int]]:
        """Gathered and last recorded use (as its class) of ``x + m·dx`` for m in [lo, hi)."""
        last = _lane(recent, x, dx, lo, hi)
        classes = map(
            add,
            map(ge, last, _lane(use_f, x, dx, lo, hi)),
            map(ge, last, _lane(use_b, x, dx, lo, hi)),
        )
        if recompute:
            classes = map(add, classes, map(ge, last, _lane(use_m, x, dx, lo, hi)))
        return _lane(available, x, dx, lo, hi), list(classes)

    def repeats(
        r: _Run,
        c: int,
        first0: int,
        entry0: int,
        head0: int,
        reference: dict[int, tuple[bool, int, int, int, bool]],
    ) -> tuple[int, list[tuple[int, int]]]:
        """How many copies from ``c`` on walk exactly as copy ``c - 1`` just did, shifted a
        copy each (and the parameters that copy read, each with its shift per copy).

        A copy reads and changes only its own parameters and those of the queue entries its
        prefetches pop (``head`` before it to ``head`` after), besides the live-element count.
        When that count came back, the head moved a whole copy of the run it lies in (or not at
        all), the release decision of the copy's own parameters (their reuse distances) is the
        same on each copy, and the state of the parameters copies c..c+k-1 read equals the state
        those copy c - 1 read, copy by copy, before it ran (each shifted a copy), then each of
        those copies repeats the one before it (by induction). Stops before the copy that ends
        forward, and where the two shifts differ the parameters must stay apart."""
        d, t = r.shift, c - 1
        limit = r.copies - c
        if first0 <= n_forward - 1 < first0 + r.copies * r.steps:
            limit = min(limit, (n_forward - 1 - first0) // r.steps - c)
        # (a recomputed block fetches each of its modules twice in backward)
        own = list(dict.fromkeys(i + t * d for b in r.body for i in b.params or ()))
        own = [i for i in own if not persistent[i]]
        moved = head - head0
        window: list[int] = []
        shift = d
        if moved == 0:
            # no entry popped: copies wholly before the head pop nothing either
            limit = min(limit, (head0 - entry0) // r.entries - c)
        else:
            j = bisect_right(item_entries, head0) - 1
            ahead = items[j]
            if not isinstance(ahead, _Run) or ahead.entries != moved:
                return 0, []
            end = item_entries[j] + ahead.copies * ahead.entries
            if head > end:
                return 0, []
            limit = min(limit, (end - head) // moved)
            # (a recomputed block's parameters are popped twice)
            popped = dict.fromkeys(
                movable_param[bisect_left(movable, head0) : bisect_left(movable, head)]
            )
            mine = set(own)
            window = [x for x in popped if x not in mine]
            if ahead is not r:
                if len(window) < len(popped):
                    return 0, []
                shift = ahead.shift
                limit = min(limit, _apart(own, d, window, shift, limit))
        lanes = [(x, shift) for x in window] + [(x, d) for x in own]
        # how many copies keep the same decision (forward: the reuse distance to backward)
        # (backward, recomputed: from the recomputation's use to the backward's, which shrinks
        # copy by copy where the copies are a block's experts)
        distance = gap if first0 < n_forward else gap_m
        decide = [(x, distance[x] >= reuse) for x in own] if first0 < n_forward or recompute else []
        # the parameters the pattern copy changed, on each lane: (copy, gathered, use class)
        # before it ran, found through their remainder modulo the lane's shift
        residues: dict[int, dict[int, list[int]]] = {}
        for dx in {dx for _, dx in lanes}:
            groups: dict[int, list[int]] = residues.setdefault(dx, {})
            for y in reference:
                groups.setdefault(y % dx, []).append(y)
        marks: list[list[tuple[int, bool, int]]] = []
        for x, dx in lanes:
            marks.append(
                [
                    (q, reference[y][0], use_class(y, reference[y][1]))
                    for y in residues[dx].get(x % dx, ())
                    if (q := (y - x) // dx) >= 0
                ]
            )
        k, size = 0, 1
        while k < limit:
            hi = min(limit, k + size)
            bad = hi - k
            for x, keep in decide:
                gaps = _lane(distance, x, d, k + 1, hi + 1)
                if (min(gaps) >= reuse) if keep else (max(gaps) < reuse):
                    continue
                bad = min(bad, next(q for q, g in enumerate(gaps) if (g >= reuse) != keep))
            for (x, dx), changed in zip(lanes, marks, strict=True):
                # copies k+1..hi now against copies k..hi-1 before the pattern copy ran (the
                # same but for the tensors it changed)
                gathered_now, classes = states(x, dx, k, hi + 1)
                now = gathered_now[1:], classes[1:]
                was = gathered_now[:-1], classes[:-1]
                for q, av, cls in changed:
                    if k <= q < hi:
                        was[0][q - k] = av
                        was[1][q - k] = cls
                if now == was:
                    continue
                bad = min(
                    bad,
                    next(
                        q
                        for q, pair in enumerate(zip(*now, *was, strict=True))
                        if pair[:2] != pair[2:]
                    ),
                )
            if bad < hi - k:
                return k + bad, lanes
            k, size = hi, 2 * size
        return k, lanes

    def repeat(
        k: int,
        lanes: list[tuple[int, int]],
        reference: dict[int, tuple[bool, int, int, int, bool]],
    ) -> None:
        """Copies 1..k after the reference copy leave each parameter it read ``m·dx`` further
        down the list as it left that one (the window's first: a parameter the prefetch reads
        ahead of the walk is walked later)."""
        for x, dx in lanes:
            _set(available, x, dx, 1, k + 1, [available[x]] * k)
            cls = use_class(x, recent[x])
            latest = ((None, use_f, use_m, use_b) if recompute else (None, use_f, use_b))[cls]
            _set(
                recent, x, dx, 1, k + 1, _lane(latest, x, dx, 1, k + 1) if latest else [_NEVER] * k
            )
            was = reference.get(x)
            for phase in (0, 1):
                more = gathers[phase][x] - (was[2 + phase] if was else gathers[phase][x])
                if more:
                    counts = _lane(gathers[phase], x, dx, 1, k + 1)
                    _set(gathers[phase], x, dx, 1, k + 1, [v + more for v in counts])
            if was and alone[x] and not was[4]:
                _set(alone, x, dx, 1, k + 1, [True] * k)

    def walk_run(first0: int, entry0: int, r: _Run) -> int | None:
        """The copies of a run one by one, each the pattern for the copies after it: where a
        stretch of them repeats it exactly, it is played at once. The step where the queue runs
        out, if it does."""
        nonlocal journal, journal_room, head, n_available
        c = 0
        # the copy's own parameters and the popped ones of at most one copy of any run
        room_per_copy = sum(len(b.params or ()) for b in r.body) + widest
        while c < r.copies:
            at, en = first0 + c * r.steps, entry0 + c * r.entries
            head0, held, before = head, n_available, (gathered[:], calls[:], flat[0])
            journal, prefetched[0], crowded[0] = {}, False, _NEVER
            journal_room = room_per_copy
            for b in r.body:
                if head >= n_queue:
                    journal = None
                    return at
                if b.params is None:
                    stop = stretch(at, en, b)
                    if stop is not None:
                        journal = None
                        return stop
                else:
                    shift = c * r.shift
                    fetch(
                        at, en, tuple(i + shift for i in b.params) if shift else b.params, b.entries
                    )
                at += b.steps
                en += b.entries
            reference, journal = journal, None
            c += 1
            # The live-element count read by a prefetch that found room must come back; one
            # that found none finds none while the count grows, or falls but stays at or
            # above the cap.
            grows = n_available - held
            if grows and prefetched[0]:
                room_for = 0
            elif grows >= 0 or prefetch <= 0 or crowded[0] == _NEVER:
                room_for = r.copies
            else:
                room_for = (crowded[0] - max_live) // -grows
            if reference is not None and c < r.copies and head < n_queue and room_for > 0:
                k, lanes = repeats(r, c, first0, entry0, head0, reference)
                k = min(k, room_for)
                if k > 0:
                    repeat(k, lanes, reference)
                    for phase in (0, 1):
                        gathered[phase] += k * (gathered[phase] - before[0][phase])
                        calls[phase] += k * (calls[phase] - before[1][phase])
                    flat[0] += k * (flat[0] - before[2])
                    head += k * (head - head0)
                    n_available += k * grows
                    c += k
        return None

    step = n_steps
    for (first, entry, _), s in zip(starts, items, strict=True):
        if head >= n_queue:
            step = first
            break
        if isinstance(s, _Run):
            stop = walk_run(first, entry, s)
        elif s.params is not None:
            fetch(first, entry, s.params, s.entries)
            continue
        else:
            stop = stretch(first, entry, s)
        if stop is not None:
            step = stop
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
        for i in dict.fromkeys(movable_param[bisect_left(movable_step, first) :]):
            # ``released`` inlined: the last recorded use is final
            held = available[i]
            last = recent[i]
            uses_shared = shared.get(i)
            if uses_shared is not None:
                its_uses: Sequence[int] = [u for u, *_ in uses_shared]
            else:
                uf, um, ub = use_f[i], use_m[i], use_b[i]
                # the distinct uses in order (a middle use only under recomputation)
                if um == uf or um == ub:
                    its_uses = (uf,) if uf == ub else (uf, ub)
                else:
                    its_uses = (uf, um) if uf == ub else (uf, um, ub)
            for use in its_uses:
                if use < first:
                    continue
                if not held:
                    phase = 0 if use < n_forward else 1
                    held = True
                    gathered[phase] += numel[i]
                    gathers[phase][i] += 1
                    gathered_at[phase].add(use)
                    if n_forward <= use < early_end:
                        early.append((use > n_forward, i))
                if uses_shared is not None:
                    if last <= use + 1 and _next_use_beyond(uses_shared, use + 1, reuse):
                        held = False
                elif last <= use + 1 and (
                    use == ub or (gap_m[i] if use == um else gap[i]) >= reuse
                ):
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
        flat[0],
        tuple(compress(range(n), alone)),
    )


_NEVER = -(10**18)  # no use recorded yet


def _next_use_beyond(uses: list[tuple[int, int, int]], after: int, reuse: int) -> bool:
    """Whether a parameter with these uses (step, elements before it, after it) is released
    after its use at ``after - 1``: it has no later use, or the release walk from ``after``
    reads at least the reuse distance in elements before the module of the next one."""
    here = next(end for step, _, end in uses if step == after - 1)
    later = [before for step, before, _ in uses if step >= after]
    return not later or later[0] - here >= reuse


def _span(s: _Item) -> tuple[int, int, int]:
    """Steps, queue entries and elements of an item."""
    if isinstance(s, _Run):
        return s.steps * s.copies, s.entries * s.copies, s.elements * s.copies
    return s.steps, s.entries, s.elements


def _fill(values: list[int], first: int, shift: int, copies: int, start: int, step: int) -> None:
    """``values[first + c·shift] = start + c·step`` for each copy c."""
    if shift > 0:
        values[first : first + copies * shift : shift] = range(start, start + copies * step, step)
    else:
        low = first + (copies - 1) * shift
        values[low : first + 1 : -shift] = range(start + (copies - 1) * step, start - step, -step)


def _lane(values: list[Any], x: int, dx: int, lo: int, hi: int) -> list[Any]:
    """``values[x + m·dx]`` for m in [lo, hi)."""
    stop = x + hi * dx
    return values[x + lo * dx : stop if stop >= 0 else None : dx]


def _set(values: list[Any], x: int, dx: int, lo: int, hi: int, new: list[Any]) -> None:
    """``values[x + m·dx] = new[m - lo]`` for m in [lo, hi)."""
    stop = x + hi * dx
    values[x + lo * dx : stop if stop >= 0 else None : dx] = new


def _apart(a: list[int], da: int, b: list[int], db: int, limit: int) -> int:
    """The most copies k <= limit for which parameters ``x + m·da`` (x in a) and
    ``y + m·db`` (y in b), m in [0, k], lie in ranges apart."""

    def apart(k: int) -> bool:
        a_lo, a_hi = min(a) + min(0, k * da), max(a) + max(0, k * da)
        b_lo, b_hi = min(b) + min(0, k * db), max(b) + max(0, k * db)
        return a_hi < b_lo or b_hi < a_lo

    if not a or not b:
        return limit
    lo, hi = -1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if apart(mid):
            lo = mid
        else:
            hi = mid - 1
    return max(lo, 0)


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


def gathered_numels(
    numels: Sequence[int], trace: Stage3Trace, held: Sequence[int] = (), later: bool = False
) -> list[int]:
    """Sizes of the gathered copies (not persistent) alive when the loss's backward runs: those
    the coordinator keeps, the head's last parameter, whose gradient backward starts with, every
    copy forward gathered of the parameters in ``held`` (``view_saved``), released or not, and
    what the root's backward step gathers again; ``later``: what the steps up to the first
    block's gather again instead (the head's and the final norm's backward)."""
    if not numels:
        return []
    kept = list(compress(numels[:-1], map(gt, trace.kept[:-1], trace.persistent[:-1])))
    if not trace.persistent[-1]:
        kept.append(numels[-1])
    last = len(numels) - 1
    again = trace.early_backward if later else trace.root_backward
    kept += [numels[i] for i in again if i != last]
    for i in held:
        if not trace.persistent[i] and trace.forward_gathers:
            last = i == len(numels) - 1
            kept += [numels[i]] * max(trace.forward_gathers[i] - (trace.kept[i] or last), 0)
    return kept


def view_saved(params: Sequence[ParamTensor], linear_views: bool = False) -> tuple[int, ...]:
    """The parameters autograd saves as views of their gathered copy, whose memory stays
    allocated when the coordinator releases them until their backward uses it. A release sets
    ``param.data`` to an empty tensor (partition_parameters.py ``free_param``), which frees the
    copy only when nothing else refers to it.

    - The 3-D expert weights of transformers' experts: ``weight.transpose(-2, -1)`` into
      ``grouped_mm``, or ``weight[expert]`` into ``F.linear`` (``integrations/moe.py`` and the
      families' eager loop).
    - ``linear_views`` (``memory_efficient_linear`` off, so ``F.linear`` is torch's own): every
      linear layer's weight, saved as ``weight.t()`` by the matrix product's backward; the
      token embedding too when the head is tied to it. With it on, DeepSpeed's
      ``LinearFunctionForZeroStage3`` saves the parameter itself, whose copy is freed.
    """
    names = (".experts.gate_up_proj", ".experts.down_proj")
    if linear_views:
        listed = list(params)
        tied = not any(p.name == "head.weight" for p in listed)
        embeddings = {"pos.weight"} if tied else {"embed.weight", "pos.weight"}
        return tuple(
            i
            for i, p in enumerate(listed)
            if p.name.endswith(names)
            or (p.name.endswith(".weight") and len(p.shape) == 2 and p.name not in embeddings)
        )
    if not isinstance(params, ParamList):
        return tuple(i for i, p in enumerate(params) if p.name.endswith(names))
    m = params.arch.modelling
    if m is None or not m.fused_experts:
        return ()
    template = params.template  # each block's copies, without naming every tensor
    out: list[int] = []
    for k, kind in enumerate(template.kinds):
        stride = template.block_length(kind)
        for t, p in enumerate(template.tensors):
            if p.name.startswith(f"blocks.{kind.start}.") and p.name.endswith(names):
                first = template.index(t, k)
                out += range(first, first + kind.blocks * stride, stride)
    return tuple(sorted(out))


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
    key, *trace_knobs = _trace_args(params, knobs)
    return _stage3_plan(key, n, exact, knobs.reduce_bucket_size, *trace_knobs)


@lru_cache(maxsize=64)
@collector_paused
def _stage3_plan(
    params: Sequence[ParamTensor],
    n: int,
    exact: bool,
    reduce_bucket_size: int,
    *trace_knobs: Any,
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
