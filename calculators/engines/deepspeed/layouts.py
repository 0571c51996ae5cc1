"""What each DeepSpeed ZeRO stage keeps on the device, and what each moment of a step adds.

Paths relative to ``deepspeed/runtime/`` of 0.19.8: engine.py, fp16/unfused_optimizer.py
(stage 0), zero/stage_1_and_2.py (stages 1/2), zero/stage3.py (stage 3).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from itertools import accumulate, compress
from typing import TypeVar

from calculators.activations import (
    INDEX_BYTES,
    ActivationBreakdown,
    Regime,
    activations,
    final_norm_saved,
    mlp_backward,
)
from calculators.caching_allocator import block
from calculators.conventions import FP32_BYTES, HALF_BYTES, Stage
from calculators.engines.deepspeed.allocator import blocks, stage0_unsplit_bytes
from calculators.engines.deepspeed.buckets import (
    MEMORY_OPT_ALLREDUCE_SIZE,
    fallback_buckets,
    ipg_ranges,
)
from calculators.engines.deepspeed.config import Knobs, whole
from calculators.engines.deepspeed.stage3 import (
    Stage3Trace,
    gathered_numels,
    stage3_trace,
    view_saved,
)
from calculators.engines.torch.peak import (
    CUBLASLT_WORKSPACE,
    biased_linear_threads,
    holds_outputs,
    trainer_loop,
)
from calculators.model_states import NOWHERE, Placement, TrainingSetup, placement
from calculators.parameters import (
    ParamList,
    ParamTensor,
    block_starts,
    first_block_span,
    param_numels,
    shape_at,
    tally,
)

FP64_BYTES = 8  # gradient norms run in float64 (zero/utils.py get_norm_dtype)
_CHUNK = 64  # parameters per chunk of ParamFacts.largest_of_first
# bucket sizes (or stage-3 configs) one parameter list remembers: its facts outlive the request
# (param_facts), so what one client's distinct bucket sizes add is bounded
_REMEMBERED = 32

K = TypeVar("K")
V = TypeVar("V")


def _remember(cache: MutableMapping[K, V], key: K, value: V) -> V:
    """``cache[key] = value``, the cache emptied first once it holds ``_REMEMBERED``."""
    if len(cache) >= _REMEMBERED:
        cache.clear()
    cache[key] = value
    return value


# --- the parameter list, whatever Nd --------------------------------------------------------------


@dataclass(frozen=True)
class Stage3Kept:
    """Stage 3's coordinator outcome for one parameter list and config, whatever Nd."""

    trace: Stage3Trace
    persistent_counts: dict[int, int]  # persistent parameters per size
    persistent_bytes: int  # their gathered 16-bit copies
    gathered_bytes: int  # the other copies alive at the loss's backward
    later_bytes: int  # ... and at the head's and the final norm's backward
    alone_counts: dict[int, int]  # Stage3Trace.alone_in_flight per size


class ParamFacts:
    """What the stages read of one parameter list that does not depend on Nd: sizes, prefix
    sums, the IPG buckets. Each is worked out on first use, once for every stage and every Nd
    of one request (a sweep asks the same list under up to 64 Nd values), and, through
    ``param_facts``, for every later request about the same model. The sizes come from
    ``param_numels`` (an architecture's list is counted from its distinct tensors, never
    walked tensor by tensor); sums over them run once per distinct size. What it hands out is
    shared: read it, never change it."""

    def __init__(self, params: Sequence[ParamTensor]) -> None:
        self.params = params
        self.numels = param_numels(params)
        self.psi = sum(n * count for n, count in self.counts.items())
        self.largest = max(self.counts)
        # offsets[i]: where parameter i starts in the flat group; offsets[-1] = Ψ
        self.offsets = [0, *accumulate(self.numels)]
        self._ranges: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self._extents: dict[tuple[int, bool], list[tuple[int, int, int, int]]] = {}
        self._buckets: dict[int, list[tuple[int | None, list[tuple[int, int]]]]] = {}
        self._kept: list[tuple[Knobs, bool, bool, Stage3Kept]] = []
        self._chunk_largest: list[int] | None = None
        self._unsplit: dict[tuple[int, bool], tuple[int, int]] = {}

    @cached_property
    def counts(self) -> dict[int, int]:
        """How many parameters have each size."""
        return tally(self.numels)

    @cached_property
    def block_bounds(self) -> list[int]:
        """Where each block's elements start in the flat group, then where the last block
        ends; empty for a list without blocks (a bare count's single tensor)."""
        return [self.offsets[i] for i in block_starts(self.params)]

    @cached_property
    def half_blocks(self) -> int:
        """One 16-bit allocation per parameter (``blocks(HALF_BYTES, numels)``)."""
        return sum(count * block(HALF_BYTES * n) for n, count in self.counts.items())

    @cached_property
    def allreduce_bucket_largest(self) -> int:
        """Stage 0's largest gradient bucket: engine.py allreduce_no_retain closes buckets once
        past 5e8 elements (MEMORY_OPT_ALLREDUCE_SIZE)."""
        return max(
            fallback_buckets(self.numels, MEMORY_OPT_ALLREDUCE_SIZE, whole_run=False), default=0
        )

    def unsplit_bytes(self, n_states: int, adam: bool) -> tuple[int, int]:
        """``stage0_unsplit_bytes`` of the parameters."""
        key = (n_states, adam)
        found = self._unsplit.get(key)
        if found is None:
            found = _remember(self._unsplit, key, stage0_unsplit_bytes(self.numels, n_states, adam))
        return found

    @cached_property
    def backward(self) -> tuple[Sequence[int], list[int]]:
        """The sizes in backward (reversed) order and their prefix sums."""
        order = self.numels[::-1]
        return order, [0, *accumulate(order)]

    def largest_of_first(self, count: int) -> int:
        """The largest of the first ``count`` parameters (0 for none): the running largest of
        whole chunks of ``_CHUNK`` parameters, then the rest of the last chunk."""
        numels = self.numels
        if self._chunk_largest is None:
            ends = range(_CHUNK, len(numels) + 1, _CHUNK)
            self._chunk_largest = [0, *accumulate((max(numels[e - _CHUNK : e]) for e in ends), max)]
        whole = count // _CHUNK
        rest = max(numels[whole * _CHUNK : count], default=0)
        return max(self._chunk_largest[whole], rest)

    def ranges(self, bucket: int, backward: bool) -> list[tuple[int, int]]:
        """``ipg_ranges`` over the parameters, in backward (reversed) order or in order:
        ``(first, end)`` of each bucket, positions in the order walked."""
        key = (bucket, backward)
        found = self._ranges.get(key)
        if found is None:
            order, prefix = self.backward if backward else (self.numels, self.offsets)
            found = _remember(self._ranges, key, ipg_ranges(order, prefix, bucket))
        return found

    def backward_buckets(self, bucket: int) -> list[tuple[int | None, list[tuple[int, int]]]]:
        """Stage 3's IPG buckets, each different one once: the size of its one parameter (None
        when it holds more) and how many parameters of each size it holds (empty gradients
        join no bucket)."""
        found = self._buckets.get(bucket)
        if found is None:
            order = self.backward[0]
            out: list[tuple[int | None, list[tuple[int, int]]]] = []
            seen_runs: set[tuple[int, ...]] = set()
            seen: set[frozenset[tuple[int, int]]] = set()
            for first, end in self.ranges(bucket, backward=True):
                run = tuple(order[first:end])
                if run in seen_runs:  # the layers repeat the same buckets
                    continue
                seen_runs.add(run)
                members = tally(run)
                members.pop(0, None)
                sizes = frozenset(members.items())
                if sizes not in seen:
                    seen.add(sizes)
                    single = next(iter(members)) if sum(members.values()) == 1 else None
                    out.append((single, list(members.items())))
            found = _remember(self._buckets, bucket, out)
        return found

    def stage3_kept(self, knobs: Knobs, exact: bool, views: bool = True) -> Stage3Kept:
        """What stage 3's parameter coordinator keeps gathered (``stage3_trace``), as sizes
        and 16-bit bytes, remembered per config. ``views``: forward saves views of gathered
        weights (``view_saved``; not where every block is checkpointed, whose forward saves
        none)."""
        # Knobs holds the config's other keys (a dict): compared, not hashed
        for seen, seen_exact, seen_views, found in self._kept:
            if seen_exact is exact and seen_views is views and seen == knobs:
                return found
        numels = self.numels
        trace = stage3_trace(self.params, knobs) if exact else Stage3Trace((False,), (True,))
        persistent = list(compress(numels, trace.persistent))
        # gathered at the end of forward: what the coordinator keeps, plus the head
        linear = not knobs.memory_efficient_linear
        held = view_saved(self.params, linear) if exact and views else ()
        gathered = gathered_numels(numels, trace, held)
        later = gathered_numels(numels, trace, held, later=True)
        counts = tally(persistent)
        persistent_bytes = sum(count * block(HALF_BYTES * n) for n, count in counts.items())
        # forward prefetches' flat buffers held into backward beside their parts' copies
        flat = HALF_BYTES * trace.flat_extra
        kept = Stage3Kept(
            trace,
            counts,
            persistent_bytes,
            blocks(HALF_BYTES, gathered) + flat,
            blocks(HALF_BYTES, later) + flat,
            tally([numels[i] for i in trace.alone_in_flight]),
        )
        if len(self._kept) >= _REMEMBERED:
            self._kept.clear()
        self._kept.append((knobs, exact, views, kept))
        return kept

    def bucket_extents(self, bucket: int, backward: bool) -> list[tuple[int, int, int, int]]:
        """Per IPG bucket, in the order walked: the flat group's first and last element its run
        of parameters covers, their 16-bit allocations (walked in order only: the boundary's
        walk frees autograd's gradients bucket by bucket; 0 in backward order), and the
        bucket's 16-bit flattened copy. A bucket is a run of consecutive parameters (zero-sized
        ones skipped), so its extent is a difference of prefix sums."""
        key = (bucket, backward)
        found = self._extents.get(key)
        if found is None:
            numels, offsets = self.numels, self.offsets
            n = len(numels)
            out = []
            if not backward:  # the 16-bit allocations' prefix sums, one look-up per size
                half = {size: block(HALF_BYTES * size) for size in self.counts}
                allocated = [0, *accumulate(map(half.__getitem__, numels))]
            for first, end in self.ranges(bucket, backward):
                if backward:  # positions in the reversed list
                    first, end = n - end, n - first
                    rounded = 0
                else:
                    rounded = allocated[end] - allocated[first]
                lo, hi = offsets[first], offsets[end]
                flat = block(HALF_BYTES * (hi - lo))
                out.append((lo, hi - 1, rounded, flat))
            found = _remember(self._extents, key, out)
        return found


def param_facts(params: Sequence[ParamTensor]) -> ParamFacts:
    """``ParamFacts(params)``, the same object for the 16 architectures asked last (their
    buckets and sums worked out once for every request about the model, as
    ``architecture_params`` keeps their lists); a bare count's one-tensor list gets its own."""
    if not isinstance(params, ParamList):
        return ParamFacts(params)
    return _kept_facts(params)


@lru_cache(maxsize=16)
def _kept_facts(params: ParamList) -> ParamFacts:
    # keyed by the list, which hashes and compares by its architecture
    return ParamFacts(params)


# --- the moments of a step ---------------------------------------------------------------------


@dataclass(frozen=True, init=False)
class Moment:
    """Bytes alive together at one point of the step, beyond the resident model states."""

    activations: int
    buffers: Mapping[str, int]
    total: int = field(init=False, repr=False, compare=False)  # read for every peak search

    def __init__(self, activations: int, buffers: Mapping[str, int]) -> None:
        # the fields set at once (a frozen dataclass's own __init__ sets each through
        # object.__setattr__): a layout builds a few per stage and Nd
        fields = self.__dict__
        fields["activations"] = activations
        fields["buffers"] = buffers
        fields["total"] = activations + sum(buffers.values())


@dataclass(frozen=True)
class StepShape:
    """The workload terms every stage shares (bytes, allocator-rounded)."""

    acts: ActivationBreakdown | None
    held: int  # logits, loss and the batch the loop keeps between steps
    loss_grads: int  # nll_loss and log_softmax fp32 gradients (tokens x vocab each)
    log_softmax_out: int  # the saved fp32 log-softmax output, freed in the loss backward
    head_grad: int = 0  # the head's 16-bit weight gradient (tied or not), 0 when unknown
    block_input: int = 0  # one block's 16-bit input (hidden_states), what checkpointing keeps
    blocks: int = 0
    tied: bool = False  # the head reuses the token embedding
    # transformers' modelling code (0 for the canonical decoder): what the logits path saved
    # beyond the loss, freed before the head's weight gradient (Gemma-2's soft-capping tanh
    # output); what the final norm's backward and the last layer's first backward ops add to
    # the instant that gradient exists (transformers_activations final_norm_backward,
    # last_layer_backward, the second where hooks move each gradient away); what the first
    # layer's first backward ops add to its saved tensors (first_layer_backward)
    logits_path_freed: int = 0
    final_norm_backward: int = 0
    last_layer_backward: int | None = None
    first_layer_backward: int = 0
    last_layer_backward_moved: int | None = None
    # the 16-bit logits a loop that keeps only the loss (transformers' Trainer) drops as forward
    # returns: alive inside the model's forward only, not in ``acts``
    dropped_logits: int = 0
    token_bytes: int = 0  # one 16-bit feature over the micro-batch's tokens
    # stage 3 with the last layer's MLP a leaf module: its gradients wait for the MLP's whole
    # backward, then are reduced together before the norms' backward
    last_layer_backward_leaf: int | None = None
    # the first layer's backward where its gradients add into those accumulated before
    # (later micro-steps: AccumulateGrad adds each in place and frees it, as if moved away)
    first_layer_backward_moved: int = 0
    # the final norm's backward once its weight's gradient is accumulated, where a hook may
    # have allocated (the later part of final_norm_backward)
    final_norm_after_weight: int = 0

    def regrown_gradients(self, hook_moves_gradients: bool) -> int:
        """What :attr:`last_layer_backward` counts of the layer's own gradients kept where no
        hook moves them, to take off on later micro-steps: there each adds into the gradient
        accumulated before and is freed."""
        if hook_moves_gradients or self.last_layer_backward is None:
            return 0
        return self.last_layer_backward - (self.last_layer_backward_moved or 0)

    def first_gradient(self, numels: Sequence[int]) -> int:
        """The gradient the head's backward makes first: its weight's, which exists even when
        the head is tied to the embedding (autograd sums both uses' gradients in the shared
        leaf's input buffer before AccumulateGrad runs); without an architecture the last
        parameter's."""
        return self.head_grad or block(HALF_BYTES * numels[-1])

    @property
    def end_of_forward(self) -> int:
        return self.acts.end_of_forward if self.acts is not None else 0

    @property
    def known(self) -> bool:
        return self.acts is not None


def step_shape(setup: TrainingSetup, knobs: Knobs) -> StepShape:
    arch, batch = setup.architecture, setup.batch
    if arch is None or batch is None:
        return StepShape(None, 0, 0, 0)
    acts = activations(arch, batch, Regime.HALF)
    dropped = 0
    if trainer_loop(knobs.extra, arch):
        # transformers' Trainer keeps the loss alone: the logits die as forward returns
        dropped = acts.logits
        acts = replace(acts, logits=0)
    t, v = batch.tokens, arch.vocab_size
    held = 0
    if holds_outputs(knobs.extra):
        # logits (16-bit), the loss scalar, token ids and targets (int64)
        held = block(HALF_BYTES * t * v) + block(FP32_BYTES) + 2 * block(INDEX_BYTES * t)
    fp32_logits = block(FP32_BYTES * t * v)
    head = block(HALF_BYTES * v * (arch.embed_proj_dim or arch.hidden))
    freed, norm, layer, first_layer, layer_moved = 0, 0, None, 0, None
    norm_after_weight = 0
    leaf: int | None = None
    first_moved = 0
    if arch.modelling is None and arch.final_norm and arch.num_experts == 1:
        # the canonical decoder (measure.workloads.GPT): the final norm's backward writes its
        # input's gradient beside the head's; the last block's MLP backward then runs with the
        # norm's saved input freed (activations.mlp_backward)
        norm = HALF_BYTES * t * arch.hidden
        saved = final_norm_saved(arch, batch)
        layer = (mlp_backward(arch, batch) or 0) - saved
        layer_moved = (mlp_backward(arch, batch, moved=True) or 0) - saved
        # the first block recomputed (first_block_backward): during its MLP's backward only the
        # gradient entering the block is alive (the one leaving it is made later), and its
        # recomputed first norm saves the block input that checkpointing already keeps
        block_input = HALF_BYTES * t * arch.hidden
        recomputed = mlp_backward(arch, batch, recomputed=True) or 0
        first_layer = max(recomputed - 2 * block_input, 0)
        leaf, first_moved = layer, first_layer
    if arch.modelling is not None:
        from calculators import transformers_activations as hf

        if arch.modelling.final_logit_softcap:
            freed = block(HALF_BYTES * t * v)  # tanh(logits / cap), saved by tanh's backward
        norm = hf.final_norm_backward(arch, batch)
        norm_after_weight = hf.final_norm_backward(arch, batch, weight_done=True)
        layer = hf.last_layer_backward(arch, batch)
        layer_moved = hf.last_layer_backward(arch, batch, moved=True)
        # the first block recomputed (first_block_backward): inside its backward only the
        # gradient entering it is alive; the one leaving it is made at its end
        block_input = HALF_BYTES * t * arch.hidden
        first_layer = max(hf.first_layer_backward(arch, batch) - block_input, 0)
        leaf = hf.last_layer_backward(arch, batch, moved=False, moved_by_norms=True)
        first_moved = max(hf.first_layer_backward(arch, batch, moved=True) - block_input, 0)
    return StepShape(
        acts,
        held,
        2 * fp32_logits,
        fp32_logits,
        head,
        HALF_BYTES * t * arch.hidden,
        arch.layers,
        arch.tied_embeddings,
        freed,
        norm,
        layer,
        first_layer,
        layer_moved,
        dropped,
        HALF_BYTES * t,
        leaf,
        first_moved,
        norm_after_weight,
    )


def forward_moments(
    shape: StepShape,
    first_grad: int,
    gathered: int = 0,
    bucket_first_hook: int = 0,
    hook_moves_gradients: bool = False,
    gathered_later: int | None = None,
) -> dict[str, Moment]:
    """Moments of the loss and the start of backward, common to every stage.

    - ``loss_backward``: everything forward saved, and the two fp32 tokens × vocab gradients
      of ``cross_entropy(logits.float())`` (nll_loss's grad input and log_softmax's).
    - ``first_gradient``: the log-softmax output (and what the logits path saved beyond it,
      ``StepShape.logits_path_freed``) is freed, the head's weight gradient exists and
      (stages 1/2) the first gradient hook allocates the IPG bucket
      (stage_1_and_2.py ``setup_buckets``).
    - ``final_norm_backward`` and ``last_layer_backward`` (transformers' modelling code): the
      first ops after it, with the bucket alive (under a tied head, from the final norm's
      weight's hook on: its weight product's backward runs before). An untied head's gradient
      is gone by then
      where the hook copies it into the bucket (``hook_moves_gradients``: stage 2, stage 1
      with overlap_comm, stage 3); a tied one waits in the shared weight's input buffer until
      the embedding's backward.

    ``gathered``: stage 3's gathered parameters at the loss's backward; ``gathered_later``: at
    the moments after it (the head's and the final norm's backward steps gather too).
    """
    if not shape.known:
        return {}
    if gathered_later is None:
        gathered_later = gathered
    base = shape.end_of_forward - shape.log_softmax_out - shape.logits_path_freed
    later = 0 if hook_moves_gradients and not shape.tied else first_grad
    after = {
        "first_gradient": later,
        "ipg_buckets": bucket_first_hook,
        "gathered_parameters": gathered_later,
    }
    out = {
        "loss_backward": Moment(
            shape.end_of_forward,
            {"loss_gradients": shape.loss_grads, "gathered_parameters": gathered},
        ),
        "first_gradient": Moment(
            base,
            {
                "first_gradient": first_grad,
                "ipg_buckets": bucket_first_hook,
                "gathered_parameters": gathered_later,
            },
        ),
    }
    assert shape.acts is not None  # shape.known
    cache = shape.acts.cache_only
    if cache or shape.dropped_logits:
        # inside the model's forward, computing the loss from ``labels``: its key/value cache
        # (dropped with the output once the loop has the loss) and the fp32 copy of the logits
        # that log_softmax reads
        out["loss_forward"] = Moment(
            shape.end_of_forward + shape.dropped_logits,
            {
                "kv_cache": cache,
                "loss_transient": shape.acts.loss_transient,
                "gathered_parameters": gathered,
            },
        )
    if shape.final_norm_backward:
        out["final_norm_backward"] = Moment(base + shape.final_norm_backward, after)
        if shape.tied and shape.final_norm_after_weight:
            # a tied head's gradient waits in the shared weight's input buffer: the first hook
            # is the final norm's weight's, after its weight product's backward, so the bucket
            # exists only for the norm's later ops
            before_hook = Moment(base + shape.final_norm_backward, {**after, "ipg_buckets": 0})
            later_ops = Moment(base + shape.final_norm_after_weight, after)
            out["final_norm_backward"] = max(before_hook, later_ops, key=lambda m: m.total)
    recompute = shape.acts.recompute
    if recompute:
        # activation checkpointing: the last block's forward runs again at the start of
        # backward (torch.utils.checkpoint)
        out["recompute"] = Moment(
            base + recompute,
            {
                "first_gradient": first_grad,
                "ipg_buckets": bucket_first_hook,
                "gathered_parameters": gathered_later,
            },
        )
    layer = shape.last_layer_backward_moved if hook_moves_gradients else shape.last_layer_backward
    if layer is not None:
        out["last_layer_backward"] = Moment(base + recompute + layer, after)
    return out


def first_block_backward(
    shape: StepShape,
    params: Sequence[ParamTensor],
    accumulation: int,
    buffers: Mapping[str, int],
) -> dict[str, Moment]:
    """Full checkpointing where autograd keeps every gradient until the boundary (stage 0, and
    stage 1 without overlap_comm: no hook moves a gradient away during backward).

    torch.utils.checkpoint recomputes the blocks from the last to the first, so the first block
    is recomputed and run backward with every gradient made before it alive: all but the first
    block's own and those of the input-side parameters (token embedding, position table) that
    the last backward ops make; a tied head's gradient already sits in the shared weight's
    input buffer (see :meth:`StepShape.first_gradient`). Of the saved block inputs only the first
    block's is left (plus what all blocks share), the head's saved tensors are gone, and the
    gradients flowing into and out of the block are alive at its end; inside it only the one
    entering it (:attr:`StepShape.first_layer_backward` is net of the other). On later
    micro-steps every gradient is alive (autograd accumulates into ``param.grad`` in place).
    """
    if not shape.known or shape.blocks < 1:
        return {}
    acts = shape.acts
    assert acts is not None  # shape.known
    if not acts.recompute:
        return {}
    numels = param_numels(params)
    first_block, block_end = first_block_span(params)
    # made late: the first block's gradients and those before it, bar a tied head's
    early = [*numels[:1]] if shape.tied and first_block > 0 else []
    grads = blocks(HALF_BYTES, numels if accumulation > 1 else [*early, *numels[block_end:]])
    # the first block's saved input (none on the device when offload holds the inputs in host
    # memory: the copy its recomputation made back is freed once that recomputation is done)
    kept = 0 if acts.offloaded else acts.layers - (shape.blocks - 1) * shape.block_input
    alive = (
        kept
        + acts.embedding
        + acts.logits
        + acts.loss
        - shape.log_softmax_out
        + acts.recompute
        + 2 * shape.block_input
        + (shape.first_layer_backward if accumulation <= 1 else shape.first_layer_backward_moved)
    )
    return {"first_block_backward": Moment(alive, {"gradients": grads, **buffers})}


def tied_embedding_backward(
    shape: StepShape, gradients: int, buffers: Mapping[str, int]
) -> dict[str, Moment]:
    """The last op of backward when the head is tied to the token embedding.

    The head's weight gradient has waited in the shared weight's input buffer since the head's
    backward; ``embedding_dense_backward`` writes the embedding's own 16-bit vocab × hidden
    gradient and autograd adds the two out of place (``InputBuffer::accumulate``) before
    AccumulateGrad runs: three such tensors at once, beside the ``gradients`` still held
    (stage 0, stage 1 without overlap_comm: all the others) and the outputs the loop holds.
    """
    if not shape.known or not shape.tied:
        return {}
    return {
        "tied_embedding_backward": Moment(
            0,
            {
                "held_outputs": shape.held,
                "gradients": gradients,
                "tied_embedding_gradients": 3 * shape.head_grad,
                **buffers,
            },
        )
    }


# the moments of the start of backward, repeated on later micro-steps (later_micro_steps)
BACKWARD_START = ("loss_backward", "first_gradient", "final_norm_backward", "last_layer_backward")


def later_micro_steps(
    moments: dict[str, Moment],
    accumulation: int,
    carried: Mapping[str, int],
    names: Sequence[str],
    regrown: int = 0,
) -> None:
    """With gradient accumulation, micro-steps 2..k repeat ``names`` with ``carried`` alive;
    ``last_layer_backward`` without the ``regrown`` bytes of the layer's own gradients
    (:meth:`StepShape.regrown_gradients`), which add into ``carried`` there."""
    if accumulation <= 1:
        return
    for name in names:
        if name in moments:
            m = moments[name]
            buffers = dict(m.buffers)
            for k, v in carried.items():
                buffers[k] = (
                    max(buffers.get(k, 0), v) if k == "ipg_buckets" else (buffers.get(k, 0) + v)
                )
            acts = m.activations - (regrown if name == "last_layer_backward" else 0)
            moments[f"{name}_later_micro_step"] = Moment(acts, buffers)


# --- stages -------------------------------------------------------------------------------------


@dataclass(frozen=True, init=False)
class Layout:
    """What one stage keeps and what each moment adds."""

    resident_parts: dict[str, int]
    device: Placement
    cpu: Placement
    cpu_buffers: int
    moments: dict[str, Moment]
    notes: list[str]

    def __init__(
        self,
        resident_parts: dict[str, int],
        device: Placement,
        cpu: Placement,
        cpu_buffers: int,
        moments: dict[str, Moment],
        notes: list[str],
    ) -> None:
        # the fields set at once, as Moment's: one layout per stage and Nd
        self.__dict__.update(
            resident_parts=resident_parts,
            device=device,
            cpu=cpu,
            cpu_buffers=cpu_buffers,
            moments=moments,
            notes=notes,
        )


def _partition_elems(n: int, world: int) -> int:
    """Stage 3 partition of one parameter: ceil(n / N) (partition_parameters.py:1816-1817)."""
    return -(-n // world)


def stage0(
    params: Sequence[ParamTensor],
    n_states: int,
    shape: StepShape,
    adam: bool,
    accumulation: int,
    facts: ParamFacts | None = None,
) -> Layout:
    """``facts``: ``params``' sizes already worked out (for the other stages, or kept for the
    model)."""
    if facts is None:
        facts = ParamFacts(params)
    numels = facts.numels
    p16 = blocks(HALF_BYTES, numels)  # module cast to 16-bit, per tensor (engine.py)
    master = blocks(FP32_BYTES, numels)  # p.clone().float() per tensor (unfused_optimizer.py:72-77)
    states = n_states * master  # created eagerly: initialize_optimizer_states (:413-433)
    g16 = blocks(HALF_BYTES, numels)  # autograd's param.grad, freed by zero_grad after step
    g32 = blocks(FP32_BYTES, numels)  # fp16_param.grad.to(fp32) per tensor in step (:217-222)
    foreach = master if adam else 0  # torch _multi_tensor_adam: _foreach_sqrt(exp_avg_sqs)
    # engine.py allreduce_no_retain: buckets close once past 5e8 elements
    # (MEMORY_OPT_ALLREDUCE_SIZE) and are flattened into a new 16-bit tensor (allreduce_bucket)
    flat = block(HALF_BYTES * facts.allreduce_bucket_largest) if len(numels) > 1 else 0
    moments = forward_moments(shape, shape.first_gradient(numels))
    moments.update(first_block_backward(shape, params, accumulation, {}))
    # the tied weight's gradient is one of the three
    moments.update(tied_embedding_backward(shape, g16 - shape.head_grad, {}))
    # autograd accumulates into param.grad; the all-reduce runs at the boundary only
    later_micro_steps(
        moments,
        accumulation,
        {"accumulated_gradients": g16},
        BACKWARD_START,
        shape.regrown_gradients(False),
    )
    moments["gradient_allreduce"] = Moment(
        0, {"held_outputs": shape.held, "gradients": g16, "allreduce_flatten": flat}
    )
    # get_weight_norm: p.grad.float().norm() one tensor at a time (runtime/utils.py:578)
    moments["grad_norm"] = Moment(
        0,
        {
            "held_outputs": shape.held,
            "gradients": g16,
            "norm_fp32_copy": block(FP32_BYTES * facts.largest),
        },
    )
    moments["optimizer_step"] = Moment(
        0,
        {
            "held_outputs": shape.held,
            "gradients": g16,
            "fp32_gradients": g32,
            "adam_foreach_temp": foreach,
        },
    )
    # an architecture's sizes go in with their tally (no recount)
    unsplit, unsplit_step = facts.unsplit_bytes(n_states, adam)
    moments["optimizer_step"] = Moment(
        0, {**moments["optimizer_step"].buffers, "allocator_unsplit_transients": unsplit_step}
    )
    return Layout(
        resident_parts={
            "params_16bit": p16,
            "fp32_master": master,
            "optimizer_states": states,
            "allocator_unsplit_blocks": unsplit,
        },
        device=Placement(parameters=p16, gradients=g16, optimizer_states=master + states),
        cpu=Placement(),
        cpu_buffers=0,
        moments=moments,
        notes=[
            "stage 0: FP16_UnfusedOptimizer keeps per-tensor fp32 masters and creates Adam "
            "states at construction; fp32 gradients exist only inside step()",
            "stage 0 allocates one tensor per parameter and state: allocator_unsplit_blocks "
            "replays DeepSpeed's initialisation on the caching allocator (cached blocks up "
            "to 1 MiB too big are handed out whole); the step's share is replayed on the "
            "init-time step, an estimate",
        ],
    )


def stage12(
    params: Sequence[ParamTensor],
    world: int,
    stage: Stage,
    knobs: Knobs,
    n_states: int,
    shape: StepShape,
    adam: bool,
    accumulation: int,
    facts: ParamFacts | None = None,
) -> Layout:
    """``facts``: ``params``' sizes already worked out (for another stage or Nd)."""
    if facts is None:
        facts = ParamFacts(params)
    return Stage12(facts, stage, knobs, n_states, shape, adam, accumulation).layout(world)


class Stage12:
    """Stage 1 or 2 of one setup: what does not depend on Nd worked out once (the buckets, the
    moments before the reduction), the rest per Nd (``layout``)."""

    def __init__(
        self,
        facts: ParamFacts,
        stage: Stage,
        knobs: Knobs,
        n_states: int,
        shape: StepShape,
        adam: bool,
        accumulation: int,
    ) -> None:
        self.facts, self.stage, self.knobs, self.shape = facts, stage, knobs, shape
        self.n_states, self.adam, self.accumulation = n_states, adam, accumulation
        self.offload = knobs.offload_optimizer is not None
        rbs = knobs.reduce_bucket_size
        overlap = knobs.overlap(stage) or False
        # setup_buckets (:3256-3280): one reduce_bucket_size buffer, two with overlap_comm
        ipg = (2 if overlap else 1) * block(HALF_BYTES * rbs) if knobs.contiguous_gradients else 0
        self.ipg = ipg
        self.bucket_note = f"IPG bucket {rbs} elements x {2 if overlap else 1}"
        # reduction: walk the gradients in bucket order; a bucket is reduced when the next
        # gradient would overflow it (:1422-1428) and flattened into a new 16-bit tensor when it
        # spans more than one partition (allreduce_bucket -> self.flatten, no copy for a single
        # slice). Stage 2 (and stage 1 with overlap_comm) reduces from the hooks, in backward
        # order; stage 1 otherwise walks the parameters at the boundary (reduce_gradients
        # :958-982)
        in_hooks = stage is Stage.GRADIENTS or overlap
        self.in_hooks = in_hooks
        self.hooks_note = in_hooks and facts.psi > rbs
        self.extents = facts.bucket_extents(rbs, in_hooks)
        self.flush_activations = (
            [self._alive_at_flush(lo) for lo, *_ in self.extents[:-1]] if in_hooks else []
        )
        moments = forward_moments(shape, shape.first_gradient(facts.numels), 0, ipg, in_hooks)
        if not in_hooks:
            # overlap_comm off: hooks only set up the bucket; autograd keeps every gradient until
            # engine.allreduce_gradients -> reduce_gradients walks them (engine.py:3088-3092)
            moments.update(
                first_block_backward(shape, facts.params, accumulation, {"ipg_buckets": ipg})
            )
            # the embedding's backward, the last: every gradient but its own made, and the
            # gradient of its output alive while embedding_dense_backward writes its own
            moments["end_of_backward"] = Moment(
                shape.block_input,
                {
                    "held_outputs": shape.held,
                    "gradients": facts.half_blocks,
                    "ipg_buckets": ipg,
                },
            )
            moments.update(
                tied_embedding_backward(
                    shape, facts.half_blocks - shape.head_grad, {"ipg_buckets": ipg}
                )
            )
        else:
            # every other gradient sits in the bucket (or was reduced) by then
            moments.update(tied_embedding_backward(shape, 0, {"ipg_buckets": ipg}))
        if stage is Stage.OPTIMIZER:
            # stage 1 reduces only at the boundary (reduce_ready_partitions_and_remove_grads
            # :2293): the gradients and the bucket (allocated by the first hook, released only by
            # the boundary epilogue) stay into the next micro-step
            later_micro_steps(
                moments,
                accumulation,
                {"accumulated_gradients": facts.half_blocks, "ipg_buckets": ipg},
                BACKWARD_START,
                shape.regrown_gradients(in_hooks),
            )
        self.before_reduction = moments

    def _alive_at_flush(self, lo: int) -> int:
        """The activations alive when backward reduces a bucket whose lowest element is
        ``lo``: the next gradient, that of the parameter ending at element ``lo - 1``,
        overflows it (stage_1_and_2.py ``reduce_independent_p_g_buckets_and_remove_grads``), so
        backward is inside that parameter's block. The blocks below it still hold what they
        saved (with checkpointing, their inputs), that block what it saved or recomputed, and
        the gradients of the overflowing parameter's linear (its output's and its input's,
        ``tokens × (out + in)``; at least the block's input and output gradients) are alive;
        the loss's and the head's tensors are gone. Blocks are taken as saving alike (``layers``
        spread evenly). 0 where the model's blocks or activations are unknown."""
        shape, bounds = self.shape, self.facts.block_bounds
        acts = shape.acts
        if acts is None or not bounds:
            return 0
        layers = len(bounds) - 1
        at = lo - 1  # the element the overflowing parameter ends at
        if at >= bounds[-1]:  # still in the head or the final norm
            return shape.end_of_forward - shape.log_softmax_out - shape.logits_path_freed
        if at < bounds[0]:  # the embedding's
            return acts.embedding + shape.block_input
        below = bisect_right(bounds, at)  # blocks 0 .. below - 1 not done
        # the overflowing gradient's own op: a linear's weight gradient is made beside its
        # input's, with its output's gradient still alive (the block's input and output
        # gradients at least)
        facts = self.facts
        dims = shape_at(facts.params, bisect_right(facts.offsets, at) - 1)
        in_flight = max(
            2 * shape.block_input, shape.token_bytes * sum(dims) if len(dims) == 2 else 0
        )
        return acts.embedding + -(-acts.layers * below // layers) + acts.recompute + in_flight

    def layout(self, world: int) -> Layout:
        """What rank 0 keeps under ``world`` data-parallel ranks."""
        facts, stage, knobs, shape = self.facts, self.stage, self.knobs, self.shape
        numels, ipg, offload, in_hooks = facts.numels, self.ipg, self.offload, self.in_hooks
        # stage_1_and_2.py:387, 446: the flat group is padded to a multiple of 2 x N
        # (nccl_start_alignment_factor = 2); each rank owns len / N elements.
        align = 2 * world
        padded = -(-facts.psi // align) * align
        part = padded // world
        flat16 = block(HALF_BYTES * padded)  # bit16_groups_flat (:497-503)
        # rank 0's partition is [0, part): whole parameters that start inside it
        # (params_in_partition), and the largest slice of one of them. The first k parameters
        # start inside; all but the k-th also end inside, so their slices are whole.
        offsets = facts.offsets
        k = bisect_left(offsets, part, 0, len(numels))
        g_p = offsets[k]
        max_slice = max(facts.largest_of_first(k - 1), min(numels[k - 1], part - offsets[k - 1]))
        gip = block(HALF_BYTES * g_p)  # grads_in_partition (copy_grads_in_partition :2183-2197)
        notes = [
            f"stage {int(stage)}: flat 16-bit group padded to {padded} elements, partition "
            f"{part}; {self.bucket_note}"
        ]
        if self.hooks_note:
            notes.append(
                "buckets reduced during backward are counted with the activations of the "
                "blocks backward has not reached yet (blocks taken as saving alike)"
            )

        # (activations, reduction buffers) of each reduction: the largest sum is the moment
        reduce_peak, reduce_acts = 0, 0
        grads_left = 0 if in_hooks else facts.half_blocks
        allocated = 0  # grads_in_partition, once a bucket has reached rank 0's partition
        extents = self.extents
        spread = world > 1
        if extents:
            # every bucket but the last; a bucket's 16-bit allocations are 0 in backward order
            # (the hooks' walk), where autograd's gradients were never all alive
            flushes = self.flush_activations or [0] * (len(extents) - 1)
            for (lo, last_elem, rounded, flat), acts in zip(extents[:-1], flushes, strict=True):
                # flattened only when the bucket spans more than one rank's partition
                copy = flat if spread and lo // part != last_elem // part else 0
                grads_left -= rounded  # moved into the bucket, autograd's freed
                alive = grads_left + copy + allocated
                if alive + acts > reduce_peak + reduce_acts:
                    reduce_peak, reduce_acts = alive, acts
                if lo < part:
                    allocated = gip
            lo, last_elem, _, flat = extents[-1]  # the last bucket, reduced by the epilogue
            copy = flat if spread and lo // part != last_elem // part else 0
            if copy + allocated > reduce_peak + reduce_acts:
                reduce_peak, reduce_acts = copy + allocated, 0
        if offload:
            gip = 0  # offload copies each in-partition slice straight to the pinned fp32 buffer
        if gip > reduce_peak + reduce_acts:
            reduce_peak, reduce_acts = gip, 0

        moments = dict(self.before_reduction)
        bounds = facts.block_bounds
        first = next((lo for lo, *_ in extents[:-1] if lo < part), None) if in_hooks else None
        # where the first bucket reduced during backward that reaches rank 0's partition is
        # overflowed, and the moments grads_in_partition exists at from then on
        overflowed = None if first is None or offload or not bounds else first - 1
        after_flush: tuple[str, ...] = ()
        if overflowed is not None and overflowed >= bounds[-1]:
            # by the final norm's or the head's gradient: before the last block's backward (its
            # recomputation, its backward ops) begins, and for the final norm's backward after
            # its weight's gradient is accumulated
            after_flush = ("recompute", "last_layer_backward")
            norm = moments.get("final_norm_backward")
            if norm is not None and shape.final_norm_after_weight:
                later = Moment(
                    norm.activations - shape.final_norm_backward + shape.final_norm_after_weight,
                    {**norm.buffers, "grads_in_partition": gip},
                )
                if later.total > norm.total:
                    moments["final_norm_backward"] = later
        elif overflowed is not None and len(bounds) > 1 and overflowed >= bounds[-2]:
            # by a gradient of the last block (a bucket smaller than one layer's gradients): for
            # the rest of that block's backward. The block's largest moment is taken as coming
            # after it (errs high by at most grads_in_partition where it comes before).
            after_flush = ("last_layer_backward",)
        for name in after_flush:
            m = moments.get(name)
            if m is not None:
                moments[name] = Moment(m.activations, {**m.buffers, "grads_in_partition": gip})
        moments["gradient_reduction"] = Moment(
            reduce_acts,
            {"held_outputs": shape.held, "ipg_buckets": ipg, "reduction_buffers": reduce_peak},
        )
        if stage is Stage.GRADIENTS and not offload:
            # each micro-step's epilogue keeps the partition's gradients in all_grad_tensors
            # (views of that step's grads_in_partition) and adds the next ones to it (:1041-1051)
            later_micro_steps(
                moments,
                self.accumulation,
                {"accumulated_gradients": gip},
                (*BACKWARD_START, "gradient_reduction"),
            )

        master = block(FP32_BYTES * part)
        states = self.n_states * master
        cpu = NOWHERE
        cpu_buffers = 0
        resident = {"flat_16bit_params": flat16}
        if offload:
            # temp_grad_buffer_for_gpu_offload (:659-661) stays on the device
            resident["offload_grad_staging"] = block(HALF_BYTES * facts.largest)
            # host: fp32 master, fp32 grad partition (kept), 16-bit staging, Adam states
            cpu = Placement(
                parameters=0,
                gradients=FP32_BYTES * part,
                optimizer_states=FP32_BYTES * part * (1 + self.n_states),
            )
            cpu_buffers = HALF_BYTES * part + HALF_BYTES * facts.largest if knobs.pin_memory else 0
            # per in-partition gradient: fp64 norm copy and an fp32 copy before the host copy
            # (set_norm_for_param_grad_in_gpu, async_inplace_copy_grad_to_fp32_buffer_from_gpu)
            moments["gradient_reduction"] = Moment(
                reduce_acts,
                {
                    "held_outputs": shape.held,
                    "ipg_buckets": ipg,
                    "reduction_buffers": reduce_peak,
                    "offload_norm_copy": block(FP64_BYTES * max_slice),
                },
            )
            device = Placement(parameters=flat16, gradients=0, optimizer_states=0)
            notes.append(
                "optimizer offload: fp32 master, fp32 gradient partition and optimizer "
                "states live in host memory; the step runs on the CPU"
            )
        else:
            resident["fp32_master_partition"] = master
            resident["optimizer_states"] = states
            flat_grad = block(HALF_BYTES * part)
            g32 = block(FP32_BYTES * part)
            base = {"held_outputs": shape.held}
            # step() (:3013-3169): fp64 per-gradient norms, flatten + .to(fp32), Adam
            moments["grad_norm"] = Moment(
                0,
                {
                    **base,
                    "grads_in_partition": gip,
                    "norm_fp64_copy": block(FP64_BYTES * max_slice),
                },
            )
            moments["fp32_gradient"] = Moment(
                0,
                {
                    **base,
                    "grads_in_partition": gip,
                    "flat_16bit_gradient": flat_grad,
                    "fp32_gradient": g32,
                },
            )
            moments["optimizer_step"] = Moment(
                0, {**base, "fp32_gradient": g32, "adam_foreach_temp": master if self.adam else 0}
            )
            device = placement(flat16, gip, master + states)
        return Layout(resident, device, cpu, cpu_buffers, moments, notes)


def _sub_groups(facts: ParamFacts, world: int, local: int, size: int) -> list[int]:
    """Elements of each fp16 sub-group: running over the partitions, a group closes once it
    holds ``size`` elements or more. Found on the partitions' prefix sums, one search per
    group."""
    if local < size:
        return [local] if local else []  # none closes before the end
    groups: list[int] = []
    base, i = 0, 0
    if all(n % world == 0 for n in facts.counts):
        # every partition is n / N: the partitions' prefix sums are the flat group's offsets
        # over N, searched in place (no list per Nd)
        offsets = facts.offsets
        end = len(offsets)
        i = 1
        while True:
            j = bisect_left(offsets, (base + size) * world, i)
            if j == end:
                break
            groups.append(offsets[j] // world - base)
            base, i = offsets[j] // world, j + 1
        if local > base:
            groups.append(local - base)
        return groups
    part_of = {n: -(-n // world) for n in facts.counts}
    prefix = list(accumulate(map(part_of.__getitem__, facts.numels)))
    while True:
        j = bisect_left(prefix, base + size, i)  # the partition that closes the next group
        if j == len(prefix):
            break
        groups.append(prefix[j] - base)
        base, i = prefix[j], j + 1
    if local > base:
        groups.append(local - base)
    return groups


def stage3(
    params: Sequence[ParamTensor],
    world: int,
    knobs: Knobs,
    n_states: int,
    shape: StepShape,
    adam: bool,
    exact: bool,
    facts: ParamFacts | None = None,
) -> Layout:
    """``facts``: ``params``' sizes already worked out (for another stage or Nd)."""
    if facts is None:
        facts = ParamFacts(params)
    return Stage3(facts, knobs, n_states, shape, adam, exact).layout(world)


class Stage3:
    """Stage 3 of one setup: what does not depend on Nd worked out once (the coordinator's
    outcome, the buckets, the moments of forward), the rest per Nd (``layout``)."""

    def __init__(
        self,
        facts: ParamFacts,
        knobs: Knobs,
        n_states: int,
        shape: StepShape,
        adam: bool,
        exact: bool,
    ) -> None:
        self.facts, self.knobs, self.shape = facts, knobs, shape
        self.n_states, self.adam, self.exact = n_states, adam, exact
        # full checkpointing: no block's forward saves anything, views of weights neither
        views = not (shape.acts is not None and shape.acts.recompute > 0)
        self.kept = facts.stage3_kept(knobs, exact, views)
        trace = self.kept.trace
        self.n_persistent, self.n_kept = sum(trace.persistent), sum(trace.kept)
        leaves = knobs.leaves if exact else frozenset()
        linear = not knobs.memory_efficient_linear
        held = view_saved(facts.params, linear) if exact and views else ()
        self.coordinator_notes: list[str] = []
        if leaves:
            self.coordinator_notes.append(
                f"stage 3: the MoE blocks of {len(leaves)} layers are ZeRO-3 leaf modules "
                "(zero_optimization.leaf_module; DeepSpeed's default classes include Mixtral's "
                "and Qwen-MoE's): each is fetched and released whole, and its parameters' "
                "gradients wait for the whole block's backward"
            )
        if held and any(not trace.kept[i] and not trace.persistent[i] for i in held):
            what = (
                "linear and expert weights (memory_efficient_linear off: torch's F.linear)"
                if not knobs.memory_efficient_linear
                else "expert weights"
            )
            self.coordinator_notes.append(
                f"stage 3: {what} released after forward stay allocated until their backward "
                "(autograd saved views of the gathered copies); they count as gathered at the "
                "end of forward"
            )
        # a leaf's gradients wait for its whole backward: the last layer's expert gradients
        # are not moved away one by one (stage3.py reduce_leaf_module_grads)
        self.shape = (
            replace(shape, last_layer_backward_moved=shape.last_layer_backward_leaf)
            if shape.blocks - 1 in leaves
            else shape
        )
        self.ipg = (
            block(HALF_BYTES * knobs.reduce_bucket_size) if knobs.contiguous_gradients else 0
        )  # stage3.py:779-784
        self.buckets = facts.backward_buckets(knobs.reduce_bucket_size)
        # under an N that divides every size, a bucket's padded copy is the bucket itself and
        # a one-tensor bucket needs none: the largest copy is the same for every such N
        self.whole_cat = max(
            (
                0 if single is not None else block(HALF_BYTES * sum(n * c for n, c in sizes))
                for single, sizes in self.buckets
            ),
            default=0,
        )
        self._forward: dict[bool, dict[str, Moment]] = {}

    def forward(self, gathers: bool) -> dict[str, Moment]:
        """The moments of the loss and the start of backward (a fresh dict)."""
        if gathers not in self._forward:
            # gathered at the end of forward: what the coordinator keeps, plus the head; the
            # IPG bucket is persistent here; the head's gradient is copied into it and freed
            gathered = self.kept.gathered_bytes if gathers else 0
            later = self.kept.later_bytes if gathers else 0
            shape = self.shape
            self._forward[gathers] = forward_moments(
                shape, shape.first_gradient(self.facts.numels), gathered, 0, True, later
            )
        return dict(self._forward[gathers])

    def layout(self, world: int) -> Layout:
        """What rank 0 keeps under ``world`` data-parallel ranks."""
        facts, knobs, shape, kept = self.facts, self.knobs, self.shape, self.kept
        n_states = self.n_states
        # _partition_elems per parameter, summed once per distinct size
        local = sum(count * -(-n // world) for n, count in facts.counts.items())
        lp = block(HALF_BYTES * local)  # lp_param_buffer after defragment (stage3.py:972)
        ipg = self.ipg
        gradbuf = block(HALF_BYTES * local)  # grad_partitions_flat_buffer (:791-802)
        # sub-groups close once they reach sub_group_size (_create_fp16_sub_groups :1210-1233)
        groups = _sub_groups(facts, world, local, knobs.sub_group_size)
        largest = max(groups)
        master = sum(block(FP32_BYTES * s) for s in groups)
        states = n_states * master
        # A gathered parameter is a whole 16-bit copy (all_gather_coalesced -> torch.cat per
        # parameter); persistent ones stay gathered for good. With one rank nothing is gathered:
        # NoGatherHandle points param.data at the partition itself (partition_parameters.py
        # _no_gather_coalesced).
        gathers = world > 1
        persist = kept.persistent_bytes if gathers else 0
        offload = knobs.offload_optimizer is not None
        offload_params = knobs.offload_param is not None
        notes = [
            f"stage 3: {self.n_persistent} persistent parameters ({persist} bytes gathered "
            f"for good), {self.n_kept} of {len(facts.numels)} parameters stay gathered from "
            "forward to backward (simulated parameter coordinator: prefetch records their "
            "backward use)",
            "parameters still in flight at the end of forward count as gathered copies",
        ]
        if not self.exact:
            notes.append("approximate: no architecture, Ψ taken as one tensor kept gathered")
        if gathers:  # one rank gathers nothing
            notes += self.coordinator_notes
        moments = self.forward(gathers)
        forward = tuple(moments)
        # backward: gradients land in the persistent IPG bucket; reduce_scatter_coalesced builds
        # a padded, interleaved copy of the bucket (torch.cat) unless it is one divisible tensor
        if self.buckets and all(n % world == 0 for n in facts.counts):
            cat = self.whole_cat
        else:
            cat = max(
                (
                    0
                    if single is not None and single % world == 0
                    else block(
                        HALF_BYTES * world * sum(count * -(-n // world) for n, count in sizes)
                    )
                )
                for single, sizes in self.buckets
            )
        moments["gradient_reduction"] = Moment(
            0, {"held_outputs": shape.held, "reduce_scatter_buffer": cat}
        )
        resident = {
            "partitioned_16bit_params": 0 if offload_params else lp,
            "ipg_bucket": ipg,
            "persistent_parameters": persist,
        }
        cpu = NOWHERE
        cpu_buffers = 0
        if offload_params:
            cpu_buffers += HALF_BYTES * local  # pinned unconditionally (:888-911)
            notes.append(
                "parameter offload: 16-bit partitions in pinned host memory; a parameter "
                "gathered alone is first copied from the host to the device "
                "(partition_parameters.py _all_gather_sequential)"
            )
            if gathers and kept.alone_counts:
                inputs = sum(
                    count * block(HALF_BYTES * -(-n // world))
                    for n, count in kept.alone_counts.items()
                )
                for name in forward:
                    m = moments[name]
                    moments[name] = Moment(
                        m.activations, {**m.buffers, "offload_gather_inputs": inputs}
                    )
                alone = sum(kept.alone_counts.values())
                what = "1 parameter" if alone == 1 else f"{alone} parameters"
                notes.append(
                    f"parameter offload: {what} a forward prefetch gathered alone "
                    f"{'is' if alone == 1 else 'are'} still in flight when forward ends; "
                    "torch's NCCL process group keeps the device copy each gather was handed "
                    "until backward waits on it (TORCH_NCCL_AVOID_RECORD_STREAMS=1, torch's "
                    f"default, stashes the input on the collective): {inputs} bytes, counted "
                    "from the loss to the last layer's backward (an upper bound: the watchdog "
                    "lets a completed one go at the next collective)"
                )
        if offload:
            cpu = Placement(
                parameters=HALF_BYTES * local if offload_params else 0,
                gradients=(FP32_BYTES + HALF_BYTES) * local,
                optimizer_states=FP32_BYTES * local * (1 + n_states),
            )
            if knobs.pin_memory:
                cpu_buffers += (FP32_BYTES + HALF_BYTES) * local  # fp32 grads, 16-bit grad buffer
            # partition_grads: each reduced partition goes to the pinned buffer and back to the
            # device (grad_buffer.to(device)), then .float() before the host copy (:2028, :1457)
            moments["gradient_reduction"] = Moment(
                0,
                {
                    "held_outputs": shape.held,
                    "reduce_scatter_buffer": cat,
                    "offload_partition_copies": block(
                        (HALF_BYTES + FP32_BYTES) * _partition_elems(facts.largest, world)
                    ),
                },
            )
            device = Placement(
                parameters=resident["partitioned_16bit_params"] + persist,
                gradients=0,
                optimizer_states=0,
            )
            notes.append(
                "optimizer offload: fp32 master, gradients and optimizer states in host "
                "memory; the step runs on the CPU"
            )
        else:
            resident["gradient_partitions"] = gradbuf
            resident["fp32_master_partition"] = master
            resident["optimizer_states"] = states
            g32 = block(FP32_BYTES * largest)
            held = shape.held
            # step (:2873-2949): gathered parameters are released first
            # (_partition_all_parameters): the persistent ones are freed at the start of step
            # and gathered again after it
            norm = block(FP64_BYTES * _partition_elems(facts.largest, world))
            moments["grad_norm"] = Moment(
                0, {"held_outputs": held, "norm_fp64_copy": norm, "released_persistent": -persist}
            )
            moments["fp32_gradient"] = Moment(
                0,
                {
                    "held_outputs": held,
                    "flat_16bit_gradient": block(HALF_BYTES * largest),
                    "fp32_gradient": g32,
                    "released_persistent": -persist,
                },
            )
            moments["optimizer_step"] = Moment(
                0,
                {
                    "held_outputs": held,
                    "fp32_gradient": g32,
                    "adam_foreach_temp": g32 if self.adam else 0,
                    "released_persistent": -persist,
                },
            )
            device = Placement(
                parameters=resident["partitioned_16bit_params"] + persist,
                gradients=gradbuf,
                optimizer_states=master + states,
            )
        # _post_step re-gathers the persistent parameters: a padded flat buffer, then the copies
        persist_flat = (
            sum(
                count * block(HALF_BYTES * _partition_elems(n, world) * world)
                for n, count in kept.persistent_counts.items()
            )
            if gathers
            else 0
        )
        moments["persistent_gather"] = Moment(
            0, {"held_outputs": shape.held, "persistent_gather_buffer": persist_flat}
        )
        return Layout(resident, device, cpu, cpu_buffers, moments, notes)


# --- runtime workspaces -------------------------------------------------------------------------


def cublaslt_workspace_bytes(setup: TrainingSetup, stage: Stage, knobs: Knobs) -> int:
    """The cuBLASLt workspaces, when forward runs a biased linear through addmm (a second one
    where checkpointed blocks run forward again in autograd's thread).

    Stage 3 does not: DeepSpeedZeRoOffload wraps the module with ``zero.Init(module=...)``
    (parameter_offload.py:270), which replaces ``torch.nn.functional.linear`` with
    ``zero3_linear_wrap`` when ``memory_efficient_linear`` is on (partition_parameters.py:1090,
    :412-419; zero/config.py:346). For 3-D inputs that runs ``input.matmul(weight.t())`` and
    ``output += bias`` (zero/linear.py), a plain cuBLAS GEMM. The replacement is global and
    stays for the rest of the process.
    """
    value = knobs.extra.get("cublaslt_workspace_bytes")
    if value is not None:
        return whole(value, "engine_config.cublaslt_workspace_bytes")
    if stage is Stage.PARAMETERS and knobs.memory_efficient_linear:
        return 0
    return CUBLASLT_WORKSPACE * biased_linear_threads(setup.architecture, setup.batch)
