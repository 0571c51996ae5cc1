"""The inverse questions: the largest model that fits, the smallest Nd that fits it.

Both search the forward formulas (``calculators.memory.estimate``), so every engine, batch and
convention the forward estimate supports answers here too, and the answers agree with it by
construction. The criterion is the figure ``StageEstimate.fits`` uses: the peak when the engine
can estimate it (an architecture and a batch), else the resident bytes. Under the paper's
accounting without a batch that is the model states alone (ZeRO paper Table 2's criterion).

The largest model is searched either as a bare Ψ (one tensor of Ψ parameters) or by growing an
architecture's shape: depth and width together at the shape's own width-to-depth ratio (llama3-8b:
4096 / 32 = 128 per layer, so 40 layers grow to 5120 wide), heads of the same width, the same
query-to-key/value grouping and the same MLP ratio. Every search is a binary search on one
monotone size parameter, so its work is bounded by a few dozen estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from calculators.architecture import MAX_DIM, Architecture, count_params
from calculators.conventions import Stage
from calculators.errors import InputError
from calculators.memory import StageEstimate, estimate
from calculators.model_states import TrainingSetup

MAX_PARAMS = 10**15
MAX_DP = 2**20
# Deepest grown shape searched: 512 blocks at llama3-8b's ratio are 65,536 wide (2.9e13
# parameters, far past any trained model); the engines walk every tensor of every trial, so the
# depth bounds the work (a second or two per stage under deepspeed).
MAX_GROWN_LAYERS = 512
# Llama's reference code rounds the MLP width up to a multiple of 256 (``multiple_of``).
FFN_MULTIPLE = 256


def needed(est: StageEstimate) -> int:
    """The bytes ``fits`` compares with the device: the peak if known, else resident."""
    return est.peak if est.peak is not None else est.resident


def _largest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """Largest n in [lo, hi] with ok(n), for ok true on a prefix; None if ok(lo) is false.

    Gallops up from ``lo`` (doubling) before bisecting, so the work is logarithmic in the answer
    rather than in ``hi``: an engine walking a grown model's tensors costs time per layer.
    """
    if not ok(lo):
        return None
    step = 1
    while lo < hi:
        probe = min(lo + step, hi)
        if not ok(probe):
            hi = probe - 1
            break
        lo, step = probe, step * 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_params(setup: TrainingSetup, stage: Stage, device_memory: int) -> int | None:
    """Largest bare Ψ whose per-device figure fits ``device_memory`` (None if not even Ψ = 1)."""

    def fits(psi: int) -> bool:
        trial = replace(setup, params=psi, architecture=None)
        return needed(estimate(trial, [stage]).stages[0]) <= device_memory

    return _largest_true(1, MAX_PARAMS, fits)


def grown_params(arch: Architecture) -> int:
    """``count_params``, which lists one block of each kind (DeepSeek's dense blocks differ
    from its MoE blocks), not every block."""
    return count_params(arch)


@dataclass(frozen=True)
class Shape:
    """How an architecture grows: one block count sets every width.

    ``width_per_layer`` is the base's hidden size per block; hidden stays a multiple of
    ``unit`` (head width × query heads per key/value head), so the heads stay whole and the
    grouping stays the base's; the MLP keeps the base's ratio to hidden.

    Attributes:
        base: the architecture whose proportions are kept.
    """

    base: Architecture

    @property
    def width_per_layer(self) -> float:
        return self.base.hidden / self.base.layers

    @property
    def group(self) -> int:
        return self.base.heads // self.base.n_kv_heads

    @property
    def unit(self) -> int:
        return self.base.d_head * self.group

    def at(self, layers: int) -> Architecture:
        """The base's shape with ``layers`` blocks."""
        b = self.base
        hidden = max(self.unit, round(layers * self.width_per_layer / self.unit) * self.unit)
        heads = hidden // b.d_head
        ffn = b.ffn * hidden / b.hidden
        multiple = FFN_MULTIPLE if b.ffn % FFN_MULTIPLE == 0 else 1
        return replace(
            b,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=None if b.kv_heads is None else heads // self.group,
            ffn_hidden=None if b.ffn_hidden is None else math.ceil(ffn / multiple) * multiple,
            embed_proj_dim=None,
        )

    @cached_property
    def max_layers(self) -> int:
        """The deepest shape that stays a valid architecture under MAX_PARAMS."""

        def valid(layers: int) -> bool:
            try:
                arch = self.at(layers)
            except InputError:
                return False
            return arch.ffn <= MAX_DIM and grown_params(arch) <= MAX_PARAMS

        top = _largest_true(1, MAX_GROWN_LAYERS, valid)
        return 0 if top is None else top


def largest_shape(
    setup: TrainingSetup, shape: Shape, stage: Stage, device_memory: int
) -> Architecture | None:
    """The deepest (and widest) model of ``shape`` that fits; None if one block does not."""
    top = shape.max_layers
    if top == 0:
        return None

    def fits(layers: int) -> bool:
        arch = shape.at(layers)
        trial = replace(setup, params=grown_params(arch), architecture=arch)
        return needed(estimate(trial, [stage]).stages[0]) <= device_memory

    layers = _largest_true(1, top, fits)
    return None if layers is None else shape.at(layers)


def min_dp(
    setup: TrainingSetup, stage: Stage, device_memory: int, max_dp: int = MAX_DP
) -> int | None:
    """Smallest Nd at which ``setup``'s model fits (None if no Nd up to ``max_dp`` does)."""

    def fits(n: int) -> bool:
        return needed(estimate(replace(setup, dp=n), [stage]).stages[0]) <= device_memory

    # Per-device bytes never grow with Nd, so "does not fit" holds on a prefix of Nd. Doubling
    # first keeps the trials at small Nd: an engine's work can grow with Nd (ZeRO-1's partition).
    lo = 0  # the largest Nd known not to fit (0: none tried)
    hi = 1
    while not fits(hi):
        if hi == max_dp:
            return None
        lo, hi = hi, min(2 * hi, max_dp)
    if lo == 0:
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class Search:
    """One capacity question.

    Attributes:
        setup: the training setup (engine, precision, offload, Nd, batch); its model is ignored.
        device_memory: bytes per device.
        shape: the architecture whose shape is grown; None searches a bare Ψ.
        shape_name: what to call that shape (a preset name, "the given architecture's").
        model: the model whose smallest Nd is asked for, with the same setup.
        max_dp: the largest Nd that search tries.
    """

    setup: TrainingSetup
    device_memory: int
    shape: Architecture | None = None
    shape_name: str = ""
    model: TrainingSetup | None = None
    max_dp: int = MAX_DP


@dataclass(frozen=True)
class StageCapacity:
    """The answers for one stage.

    Attributes:
        stage: the ZeRO stage.
        params: Ψ of the largest model that fits (None: not even the smallest does).
        architecture: that model's architecture, when a shape was grown.
        found: the forward estimate of that model.
        smallest: the estimate of the smallest model tried, when none fits (what it needs).
        smallest_params: Ψ of that smallest model.
        capped: the largest shape searched fits: the answer is a lower bound.
        min_dp: the smallest Nd that fits ``Search.model`` (None: none up to max_dp does).
        at_max_dp: the model's estimate at max_dp, when no Nd fits (what it still needs).
    """

    stage: Stage
    params: int | None
    architecture: Architecture | None
    found: StageEstimate | None
    smallest: StageEstimate | None
    smallest_params: int | None
    capped: bool
    min_dp: int | None
    at_max_dp: StageEstimate | None


@dataclass(frozen=True)
class CapacityResult:
    search: Search
    stages: tuple[StageCapacity, ...]
    convention: str


def _one(setup: TrainingSetup, stage: Stage) -> StageEstimate:
    return estimate(setup, [stage]).stages[0]


def _sized(setup: TrainingSetup, arch: Architecture) -> TrainingSetup:
    return replace(setup, params=grown_params(arch), architecture=arch)


def search(question: Search, stages: list[int]) -> CapacityResult:
    """Per stage: the largest model that fits, and the smallest Nd for the given model."""
    q = question
    shape = None if q.shape is None else Shape(q.shape)
    rows = []
    for s in stages:
        stage = Stage(s)
        arch: Architecture | None = None
        capped = False
        if shape is not None:
            arch = largest_shape(q.setup, shape, stage, q.device_memory)
            trial = None if arch is None else _sized(q.setup, arch)
            capped = arch is not None and arch.layers == shape.max_layers
            least_arch = shape.at(1)
            smallest_params = grown_params(least_arch)
            smallest = None if arch is not None else _one(_sized(q.setup, least_arch), stage)
        else:
            psi = max_params(q.setup, stage, q.device_memory)
            trial = None if psi is None else replace(q.setup, params=psi, architecture=None)
            capped = psi == MAX_PARAMS
            smallest_params = 1
            smallest = None if psi is not None else _one(replace(q.setup, params=1), stage)
        found = None if trial is None else _one(trial, stage)
        least = None if q.model is None else min_dp(q.model, stage, q.device_memory, q.max_dp)
        rows.append(
            StageCapacity(
                stage=stage,
                params=None if trial is None else trial.params,
                architecture=arch,
                found=found,
                smallest=smallest,
                smallest_params=None if smallest is None else smallest_params,
                capped=capped,
                min_dp=least,
                at_max_dp=None
                if q.model is None or least is not None
                else _one(replace(q.model, dp=q.max_dp), stage),
            )
        )
    convention = estimate(replace(q.setup, params=1), []).convention
    return CapacityResult(search=q, stages=tuple(rows), convention=convention)
