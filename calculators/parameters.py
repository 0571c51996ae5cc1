"""Parameter tensors as the engines see them: one type, one cached list per architecture, and
the dense decoder a bare parameter count implies."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import overload

from calculators.architecture import (
    MAX_DIM,
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    block_kinds,
    block_template,
    tensor_counts,
)

ROOT_GROUP = "root"
"""The FSDP2 unit of everything outside the blocks (embeddings, final norm, head)."""


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor.

    Attributes:
        name: dotted name as ``nn.Module.named_parameters`` gives it.
        shape: its shape.
        group: the FSDP2 unit that owns it (``blocks.<i>`` or ``root``).
        numel: elements (derived from ``shape``).
        module: the owning module's path, ``name`` without ``.weight``/``.bias``.
    """

    name: str
    shape: tuple[int, ...]
    group: str = ROOT_GROUP
    # derived once: the stage-3 coordinator and bucket walks read them per tensor, many times
    numel: int = field(init=False, repr=False, compare=False)
    module: str = field(init=False, repr=False, compare=False)

    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "numel", math.prod(self.shape))
        object.__setattr__(self, "module", self.name.rsplit(".", 1)[0])
        object.__setattr__(self, "_hash", hash((self.name, self.shape, self.group)))

    def __hash__(self) -> int:
        # once: the stage-3 caches key on whole parameter lists (tens of thousands for MoE)
        return self._hash

    def fsdp_shard_numel(self, world: int) -> int:
        """Rank 0's padded dim-0 chunk: ceil(dim0 / N) rows (``_fsdp_param.py``)."""
        if not self.shape:
            return 1
        return -(-self.shape[0] // world) * math.prod(self.shape[1:])


class Numels(tuple[int, ...]):
    """Each tensor's elements in order, with how often each size occurs (``sizes``), counted
    from the distinct tensors of an architecture rather than one by one."""

    sizes: Counter[int]

    def __new__(cls, values: Iterable[int], sizes: Counter[int]) -> Numels:
        out = super().__new__(cls, values)
        out.sizes = sizes
        return out


def tally(values: Iterable[int]) -> Counter[int]:
    """How many times each value occurs: a sum of ``f(value)`` over tensors is a sum over the
    distinct values (blocks repeat the same shapes, experts are identical)."""
    if isinstance(values, Numels):
        return Counter(values.sizes)
    return Counter(values)


def shape_counts(params: Sequence[ParamTensor]) -> Counter[tuple[int, ...]]:
    """How often each shape occurs in ``params``; from the architecture for a
    :class:`ParamList` (no tensor named)."""
    if isinstance(params, ParamList):
        return params.shape_counts
    return Counter(p.shape for p in params)


def fsdp_shard_total(params: Sequence[ParamTensor], world: int) -> int:
    """Σ ``fsdp_shard_numel(world)`` over ``params``, once per distinct shape."""
    shapes = shape_counts(params)
    return sum(
        count * ParamTensor("", shape).fsdp_shard_numel(world) for shape, count in shapes.items()
    )


def fsdp_padded_total(params: Sequence[ParamTensor], world: int) -> int:
    """Σ ``ceil(dim0 / N) · N · rest`` over ``params``: every dim 0 padded to a multiple of N
    (FSDP2 ``_get_dim0_padded_size``), once per distinct shape."""
    shapes = shape_counts(params)
    return sum(
        count * (-(-shape[0] // world) * world if shape else world) * math.prod(shape[1:])
        for shape, count in shapes.items()
    )


def _param(name: str, shape: tuple[int, ...], group: str) -> ParamTensor:
    """``ParamTensor(name, shape, group)`` without the dataclass's per-field frozen setattr."""
    p = object.__new__(ParamTensor)
    p.__dict__.update(
        name=name,
        shape=shape,
        group=group,
        numel=math.prod(shape),
        module=name.rpartition(".")[0] if "." in name else name,
        _hash=hash((name, shape, group)),
    )
    return p


@dataclass(frozen=True)
class BlockKind:
    """Blocks alike in a :class:`ParamTemplate`.

    Attributes:
        start: the first block's index.
        blocks: how many blocks of this kind follow one another.
        pre: tensors of a block before its experts' run (all of them without experts).
        expert: tensors of one expert (0 without experts).
        post: tensors of a block after its experts' run.
    """

    start: int
    blocks: int
    pre: int
    expert: int
    post: int


@dataclass(frozen=True)
class ParamTemplate:
    """One copy of each repeated part of a parameter list: the tensors before the blocks
    (``first`` of them), then the first block of each kind with its expert 0, then the tensors
    after the blocks.

    Attributes:
        tensors: the template's tensors, named as the first copy of each is.
        first: tensors before the blocks.
        kinds: the kinds of block, in order.
        experts: copies of each expert's tensors per block.
    """

    tensors: tuple[ParamTensor, ...]
    first: int
    kinds: tuple[BlockKind, ...]
    experts: int

    def index(self, t: int, kind: int | None) -> int:
        """The full list's index of template tensor ``t`` (of block kind ``kind``, ``None``
        outside the blocks): in the kind's first block, expert 0. Block ``b`` of the kind
        holds it ``b · block_length`` further on, expert ``e`` ``e · expert`` further."""
        if kind is None:
            if t < self.first:
                return t
            return self.length - (len(self.tensors) - t)
        k = self.kinds[kind]
        u = t - self.first - sum(x.pre + x.expert + x.post for x in self.kinds[:kind])
        base = self.first + sum(x.blocks * self.block_length(x) for x in self.kinds[:kind])
        if u < k.pre + k.expert:
            return base + u
        return base + k.pre + self.experts * k.expert + u - k.pre - k.expert

    def block_length(self, kind: BlockKind) -> int:
        return kind.pre + self.experts * kind.expert + kind.post

    def template_index(self, i: int) -> int:
        """The template tensor that the full list's tensor ``i`` copies (``index`` inverted)."""
        if i < self.first:
            return i
        at, t = self.first, self.first  # where each kind starts, in the list and the template
        for kind in self.kinds:
            length = self.block_length(kind)
            if i < at + kind.blocks * length:
                u = (i - at) % length
                if u >= kind.pre:
                    u -= kind.pre
                    run = self.experts * kind.expert
                    u = kind.pre + (u % kind.expert if u < run else kind.expert + u - run)
                return t + u
            at += kind.blocks * length
            t += kind.pre + kind.expert + kind.post
        return len(self.tensors) - (self.length - i)

    def block_starts(self) -> list[int]:
        """Where each block starts in the full list, then where the last one ends (empty
        without blocks)."""
        at, starts = self.first, []
        for kind in self.kinds:
            for _ in range(kind.blocks):
                starts.append(at)
                at += self.block_length(kind)
        return [*starts, at] if starts else []

    @property
    def length(self) -> int:
        """Tensors in the full list."""
        blocks = sum(k.blocks * self.block_length(k) for k in self.kinds)
        return len(self.tensors) - sum(k.pre + k.expert + k.post for k in self.kinds) + blocks


class ParamList(Sequence[ParamTensor]):
    """An architecture's parameters in ``named_parameters`` order, held by its architecture.

    Blocks of one kind repeat the same tensors and experts the same MLP, so the element
    counts (``numels``) are laid out from the first block of each kind and its expert 0 as
    whole-list repetitions, without a tensor object per parameter (a 16-layer, 4,096-expert
    MoE has ~197k); ``template`` holds one copy of each repeated part. The named tensors are
    built on first use of an item, once per list: only walks that read names pay for them (the
    torch engines; the stage-3 coordinator when the model persistence threshold binds, so that
    equal tensors differ by position). Equal to the tuple of the same tensors; hashed by the
    architecture.
    """

    def __init__(self, arch: Architecture) -> None:
        self.arch = arch

    @cached_property
    def numels(self) -> Numels:
        """Each tensor's elements, in order (the same as ``p.numel`` over the tensors)."""
        return self._numels()

    def _numels(self) -> Numels:
        counts = tensor_counts(self.arch)
        sizes: Counter[int] = Counter()
        for t, count in counts:
            sizes[t.numel] += count
        first = tuple(t.numel for t, _ in counts if t.layer is None and t.stage_hint == "first")
        last = tuple(t.numel for t, _ in counts if t.layer is None and t.stage_hint != "first")
        out = list(first)
        for start, blocks in block_kinds(self.arch):
            layer = block_template(self.arch, start)
            block: list[int] = []
            for k, (t, per_expert) in enumerate(layer):
                if not per_expert:
                    block.append(t.numel)
                elif k == 0 or not layer[k - 1][1]:  # the first tensor of the experts' run
                    run = [x.numel for x, _ in itertools.takewhile(lambda p: p[1], layer[k:])]
                    block += run * self.arch.num_experts
            out += block * blocks
        out += last
        return Numels(out, sizes)

    @cached_property
    def shape_counts(self) -> Counter[tuple[int, ...]]:
        """How often each shape occurs in the list."""
        return self._shape_counts()

    def _shape_counts(self) -> Counter[tuple[int, ...]]:
        shapes: Counter[tuple[int, ...]] = Counter()
        for t, count in tensor_counts(self.arch):
            shapes[t.shape] += count
        return shapes

    @cached_property
    def template(self) -> ParamTemplate:
        """The tensors outside the blocks, and the first block of each kind with its expert 0
        (the rest are copies of them)."""
        return self._template()

    def _template(self) -> ParamTemplate:
        counts = tensor_counts(self.arch)
        first = [t for t, _ in counts if t.layer is None and t.stage_hint == "first"]
        last = [t for t, _ in counts if t.layer is None and t.stage_hint != "first"]
        tensors = [_param(t.name, t.shape, ROOT_GROUP) for t in first]
        kinds = []
        for start, blocks in block_kinds(self.arch):
            layer = block_template(self.arch, start)
            flags = [per_expert for _, per_expert in layer]
            pre = flags.index(True) if True in flags else len(flags)
            experts = sum(flags)
            kinds.append(BlockKind(start, blocks, pre, experts, len(flags) - pre - experts))
            tensors += [_param(t.name, t.shape, f"blocks.{start}") for t, _ in layer]
        tensors += [_param(t.name, t.shape, ROOT_GROUP) for t in last]
        return ParamTemplate(tuple(tensors), len(first), tuple(kinds), self.arch.num_experts)

    @cached_property
    def tensors(self) -> tuple[ParamTensor, ...]:
        """The named tensors (built once per list)."""
        return self._tensors()

    def _tensors(self) -> tuple[ParamTensor, ...]:
        return _named_params(self.arch)

    def __len__(self) -> int:
        return len(self.numels)

    @overload
    def __getitem__(self, index: int) -> ParamTensor: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[ParamTensor, ...]: ...

    def __getitem__(self, index: int | slice) -> ParamTensor | tuple[ParamTensor, ...]:
        return self.tensors[index]

    def __iter__(self) -> Iterator[ParamTensor]:
        return iter(self.tensors)

    def _identity(self) -> tuple[object, ...]:
        """What the list is built from: equal lists of one class have equal identities."""
        return (self.arch,)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ParamList):
            return type(self) is type(other) and self._identity() == other._identity()
        if isinstance(other, tuple | list):
            return self.tensors == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self), *self._identity()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self._identity()!r}"


def param_numels(params: Sequence[ParamTensor]) -> Sequence[int]:
    """Each tensor's elements, in order; from the architecture for a :class:`ParamList`."""
    if isinstance(params, ParamList):
        return params.numels
    return [p.numel for p in params]


def first_block_span(params: Sequence[ParamTensor]) -> tuple[int, int]:
    """Where the first block's tensors (group ``blocks.0``) start and end in ``params``: after
    the tensors outside the blocks that come first; both the list's length without blocks."""
    if isinstance(params, ParamList):
        template = params.template
        if not template.kinds:
            return len(params), len(params)
        return template.first, template.first + template.block_length(template.kinds[0])
    first = next((i for i, p in enumerate(params) if p.group != ROOT_GROUP), len(params))
    end = first
    for i in range(first, len(params)):
        if params[i].group == "blocks.0":
            end = i + 1
    return first, end


def block_starts(params: Sequence[ParamTensor]) -> list[int]:
    """Where each block's tensors start in ``params``, then where the last block ends (empty
    without blocks): from the template of a list that has one, else from the groups."""
    if isinstance(params, ParamList):
        return params.template.block_starts()
    first: dict[str, int] = {}
    end = 0
    for i, p in enumerate(params):
        if p.group != ROOT_GROUP:
            first.setdefault(p.group, i)
            end = i + 1
    return [*first.values(), end] if first else []


def shape_at(params: Sequence[ParamTensor], i: int) -> tuple[int, ...]:
    """The shape of ``params[i]``, read from the template of a list that has one (its blocks
    and experts repeat the template's tensors) rather than naming every tensor."""
    if isinstance(params, ParamList):
        template = params.template
        return template.tensors[template.template_index(i)].shape
    return params[i].shape


@lru_cache(maxsize=16)
def architecture_params(arch: Architecture) -> ParamList:
    """Every parameter of ``arch`` in ``named_parameters`` order, once per architecture (a sweep
    asks for the same list per Nd and stage); the tensors themselves are named on first use
    (:class:`ParamList`)."""
    return ParamList(arch)


def _named_params(arch: Architecture) -> tuple[ParamTensor, ...]:
    """The named tensors of ``arch``, built from ``block_template``: the first block of each
    kind (and its expert 0) named again for every block and expert, the same list
    ``tensors(arch)`` gives.
    """
    counts = tensor_counts(arch)
    first = [t for t, _ in counts if t.layer is None and t.stage_hint == "first"]
    last = [t for t, _ in counts if t.layer is None and t.stage_hint != "first"]
    out = [_param(t.name, t.shape, ROOT_GROUP) for t in first]
    for start, blocks in block_kinds(arch):
        layer = block_template(arch, start)
        block0, expert0 = f"blocks.{start}.", f"blocks.{start}.experts.0."
        for i in range(start, start + blocks):
            group = f"blocks.{i}"
            for k, (t, per_expert) in enumerate(layer):
                if not per_expert:
                    out.append(_param(f"{group}.{t.name[len(block0) :]}", t.shape, group))
                elif k == 0 or not layer[k - 1][1]:  # the first tensor of the experts' run
                    run = [x for x, _ in itertools.takewhile(lambda p: p[1], layer[k:])]
                    for e in range(arch.num_experts):
                        prefix = f"{group}.experts.{e}."
                        out += [
                            _param(prefix + x.name[len(expert0) :], x.shape, group) for x in run
                        ]
    out += [_param(t.name, t.shape, ROOT_GROUP) for t in last]
    return tuple(out)


# --- a bare parameter count ---------------------------------------------------------------------

HEAD_DIM = 128
"""Width of one attention head in the implied decoder (GPT-3 ≥ 6.7B, Llama, Mistral)."""
WIDTH_PER_LAYER = 128
"""hidden / layers of the implied decoder: GPT-3 6.7B-175B (4096/32 ... 12288/96), Llama 2
7B/13B (4096/32, 5120/40), Llama 3 8B and Mistral 7B (4096/32)."""
VOCAB = 32_000
"""Token rows of the implied decoder's embedding and head (Llama 2, Mistral 7B)."""
FFN_MULTIPLE = 256
"""Llama's ``multiple_of``: the MLP width is ⌈(2/3 · 4 · hidden) / 256⌉ · 256."""
MIN_FFN_RATIO = 2
"""The implied MLP is never narrower than 2 × hidden (Llama's is 8/3 ×)."""
MAX_LAYERS = 2048
"""The implied decoder stops growing here (hidden 262,144: about 1.7 quadrillion parameters)."""


@dataclass(frozen=True)
class ImpliedDecoder:
    """The dense decoder a bare parameter count is taken to be.

    Attributes:
        architecture: a Llama-style decoder (RMSNorm, SwiGLU, no biases, untied head) whose
            hidden size is ``WIDTH_PER_LAYER`` × layers, heads ``HEAD_DIM`` wide, vocabulary
            ``VOCAB``, layers chosen so that its count with Llama's MLP width comes nearest Ψ
            (unless that leaves the MLP under ``MIN_FFN_RATIO`` × hidden); the MLP width then
            takes what is left of Ψ.
        leftover: elements below one MLP row across all blocks (< 3 · hidden · layers), added
            to the first block's down projection so that the tensors add up to Ψ exactly.
    """

    architecture: Architecture
    leftover: int

    def describe(self) -> str:
        a = self.architecture
        return (
            f"{a.layers} layers × hidden {a.hidden} ({a.heads} heads of {HEAD_DIM}), SwiGLU MLP "
            f"{a.ffn}, vocabulary {a.vocab_size}, untied head"
        )


def _fixed(layers: int) -> int:
    """Parameters of the implied decoder outside its MLPs (embedding, attention, norms, head)."""
    d = WIDTH_PER_LAYER * layers
    # per block: fused qkv 3d² + output d² + two RMSNorm weights; then final norm, embedding, head
    return layers * (4 * d * d + 2 * d) + d + 2 * VOCAB * d


def _llama_ffn(hidden: int) -> int:
    return -(-(2 * 4 * hidden) // (3 * FFN_MULTIPLE)) * FFN_MULTIPLE


def _nominal(layers: int) -> int:
    d = WIDTH_PER_LAYER * layers
    return _fixed(layers) + 3 * d * _llama_ffn(d) * layers


@lru_cache(maxsize=64)
def implied_decoder(psi: int) -> ImpliedDecoder | None:
    """The dense decoder that Ψ implies (``ImpliedDecoder``), or None outside its shapes: below
    one layer 128 wide (about 8.3M parameters, nearly all embedding) or above ``MAX_LAYERS``."""
    layers = 1
    while layers < MAX_LAYERS and _nominal(layers + 1) <= psi:
        layers += 1
    up = layers + 1
    if (
        layers < MAX_LAYERS
        and psi - _nominal(layers) > _nominal(up) - psi
        and psi - _fixed(up) >= 3 * MIN_FFN_RATIO * (WIDTH_PER_LAYER * up) ** 2 * up
    ):
        layers = up  # the nearer of the two counts around Ψ, unless its MLP would be thin
    d = WIDTH_PER_LAYER * layers
    ffn, leftover = divmod(psi - _fixed(layers), 3 * d * layers)
    if not 1 <= ffn <= MAX_DIM:
        return None
    arch = Architecture(
        layers=layers,
        hidden=d,
        heads=d // HEAD_DIM,
        vocab_size=VOCAB,
        ffn_hidden=ffn,
        bias=False,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=Activation.SILU,
    )
    return ImpliedDecoder(arch, leftover)


_GROWN = "blocks.0.mlp.down.weight"
"""The implied decoder's tensor that carries the leftover elements."""


class ImpliedParamList(ParamList):
    """The implied decoder's tensors (:class:`ParamList` of its architecture), with the
    ``leftover`` elements added to the first block's down projection, flattened, so that they
    add up to Ψ exactly. That block is a kind of its own in the template; the other blocks are
    copies of the second."""

    def __init__(self, arch: Architecture, leftover: int) -> None:
        super().__init__(arch)
        self.leftover = leftover

    def _identity(self) -> tuple[object, ...]:
        return (self.arch, self.leftover)

    def _grown(self, p: ParamTensor) -> ParamTensor:
        return ParamTensor(p.name, (p.numel + self.leftover,), p.group)

    @cached_property
    def _plain(self) -> tuple[int, ParamTensor]:
        """The tensor to grow, as the architecture has it, and its index in the list."""
        template = super()._template()
        t = next(i for i, p in enumerate(template.tensors) if p.name == _GROWN)
        return template.index(t, 0), template.tensors[t]

    def _numels(self) -> Numels:
        at, plain = self._plain
        numels = super()._numels()
        out = list(numels)
        out[at] += self.leftover
        sizes = Counter(numels.sizes)
        sizes[plain.numel] -= 1
        sizes[out[at]] += 1
        return Numels(out, +sizes)

    def _shape_counts(self) -> Counter[tuple[int, ...]]:
        _, plain = self._plain
        shapes = super()._shape_counts()
        shapes[plain.shape] -= 1
        shapes[self._grown(plain).shape] += 1
        return +shapes

    def _template(self) -> ParamTemplate:
        plain = super()._template()
        (kind,) = plain.kinds
        tensors = [self._grown(p) if p.name == _GROWN else p for p in plain.tensors]
        if kind.blocks == 1:
            return replace(plain, tensors=tuple(tensors))
        end = plain.first + kind.pre + kind.expert + kind.post
        second = [_param(t.name, t.shape, "blocks.1") for t, _ in block_template(self.arch, 1)]
        return ParamTemplate(
            tuple(tensors[:end] + second + tensors[end:]),
            plain.first,
            (replace(kind, blocks=1), replace(kind, start=1, blocks=kind.blocks - 1)),
            plain.experts,
        )

    def _tensors(self) -> tuple[ParamTensor, ...]:
        at, plain = self._plain
        out = list(super()._tensors())
        out[at] = self._grown(plain)
        return tuple(out)


@lru_cache(maxsize=16)
def implied_params(psi: int) -> ParamList | None:
    """The implied decoder's tensors (``implied_decoder``), adding up to Ψ exactly."""
    implied = implied_decoder(psi)
    if implied is None:
        return None
    if not implied.leftover:
        return architecture_params(implied.architecture)
    return ImpliedParamList(implied.architecture, implied.leftover)


def implied_note(psi: int) -> str | None:
    """What a bare count of ``psi`` is taken to be, for the notes of per-tensor figures."""
    implied = implied_decoder(psi)
    if implied is None:
        return None
    return (
        f"a bare parameter count is taken as the dense decoder it implies: "
        f"{implied.describe()} (hidden = {WIDTH_PER_LAYER} × layers as in GPT-3 and Llama 2 "
        f"7B/13B, the layer count whose Llama-style count comes nearest Ψ, the MLP width "
        "fitted to Ψ); per-tensor figures (buckets, padding, persistent parameters, stage-3 "
        "re-gathers, buffers sized by the largest tensor) follow that shape: give an "
        "architecture, preset or hf_config for the model's own tensors"
    )
