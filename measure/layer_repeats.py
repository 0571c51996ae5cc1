"""Decoder layers that repeat an earlier one, played from a recipe instead of run.

Under fake tensors a decoder layer's forward costs tens of milliseconds of dispatch (an 8B
config: about a second per regime, an 80-layer one several), yet most layers are copies of
another: the same modules, parameter shapes and settings, called with the same masks and rotary
tables and a hidden state of the same shape. They save the same storages, so the first layer of
each kind runs and what it left is written down as a recipe:

- every storage autograd saved in it, and still alive when it returns: a new one (its size),
  its hidden-state input, or one that existed before it (the rotary cos/sin, a mask); with the
  view, dtype and kind (activation, RNG state, weight copy) that the trace counts;
- what its attention put in the key/value cache (``Cache.update`` and the tensors its cache
  layer holds afterwards);
- its output's shape, dtype and ``requires_grad``.

A later layer of the same kind plays the recipe: new fake storages of the same sizes, recorded as
saved in that layer, the cache updated and its layer holding the same views, and an output that
requires grad through a non-view node as a real layer's does (so the next layer saves and
classifies what it would). The trace then counts exactly what running every layer would: a test
holds the two equal over the committed configs in every regime, with and without checkpointing.

Two calls are of one kind when the layers' module trees are equal (types, plain attributes but
``layer_idx``, parameter and buffer shapes), every config list with one entry per layer has the
same entry at both, and the calls' arguments are equal: the hidden state by shape, strides,
dtype, ``requires_grad`` and producing node; every other tensor by its storage. A call with hooks
inside the layer (transformers' output capturing), an output that is not tensors, or a cache call
other than one ``update`` runs for real each time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

Described = tuple[tuple[int, ...], torch.dtype] | None
Packed = list[tuple["weakref.ref[torch.Tensor | PlayedStorage]", int, str, str, Described]]
"""What the trace records as saved: (tensor, layer, grad_fn name, kind: "" to classify it, and
the shape and dtype of the view a played layer's storage stands for)."""
Classify = Callable[[torch.Tensor], str]
"""A saved tensor's kind: "param", "rng", "weight" or "activation"."""

_PLAIN = (int, float, str, bool, type(None))
_VARYING = (("args", 0), ("kwargs", "hidden_states"))
"""Where a decoder layer takes its hidden state: the one tensor that differs between layers."""


class PlayedStorage:
    """A new storage a played layer saved that nothing else reads: its size and identity."""

    __slots__ = ("__weakref__", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class _Unplayable(Exception):
    """The call cannot be written as a recipe."""


@dataclass(frozen=True)
class _Ref:
    """A tensor as a view of a storage: new in the layer (``index`` into the recipe's storages),
    the layer's hidden-state input, or a tensor that existed before (``tensor``)."""

    where: str  # "new", "input", "same"
    index: int
    tensor: torch.Tensor | None
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@dataclass
class _Recipe:
    storages: list[int] = field(default_factory=list)  # bytes of each new storage
    saved: list[tuple[_Ref, str, str]] = field(default_factory=list)  # ref, kind, grad_fn name
    update: tuple[_Ref, _Ref, int, Any, Any] | None = None  # key, value, index shift, args
    cache_holds: list[tuple[str, _Ref]] = field(default_factory=list)
    cached: set[int] = field(default_factory=set)  # new storages the cache takes or holds
    output: list[tuple[tuple[int, ...], torch.dtype, bool] | None] = field(default_factory=list)
    output_is_tensor: bool = True


class LayerRepeats:
    """Wraps each decoder layer's ``forward``: the first call of a kind runs and is written
    down, the later ones are played (module docstring)."""

    def __init__(
        self,
        layers: Sequence[torch.nn.Module],
        config: Any,
        packed: Packed,
        classify: Classify,
        own_hooks: int,
    ) -> None:
        self.packed, self.classify, self.own_hooks = packed, classify, own_hooks
        self.recipes: dict[Hashable, _Recipe | None] = {}
        self.keep: list[torch.Tensor | PlayedStorage] = []  # played, alive to the end
        self.played = 0
        per_layer = _per_layer_lists(config, len(layers))
        for i, layer in enumerate(layers):
            kind = (_structure(layer), tuple(values[i] for values in per_layer))
            layer.forward = self._wrap(layer, i, layer.forward, kind)

    def _wrap(
        self, layer: torch.nn.Module, i: int, forward: Callable[..., Any], kind: Hashable
    ) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if _hooked(layer, self.own_hooks):
                return forward(*args, **kwargs)
            try:
                key = (kind, _call_signature(args, kwargs))
            except _Unplayable:
                return forward(*args, **kwargs)
            if key not in self.recipes:
                return self._write(key, i, forward, args, kwargs)
            recipe = self.recipes[key]
            if recipe is None:
                return forward(*args, **kwargs)
            self.played += 1
            return self._play(layer, recipe, i, args, kwargs)

        return run

    def _write(
        self,
        key: Hashable,
        i: int,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        start = len(self.packed)
        cache = kwargs.get("past_key_values")
        updates: list[tuple[Any, ...]] = []
        if cache is not None and hasattr(cache, "update"):
            real_update = cache.update

            def spy(*a: Any, **kw: Any) -> Any:
                updates.append((a, kw))
                return real_update(*a, **kw)

            cache.update = spy
        try:
            out = forward(*args, **kwargs)
        finally:
            if cache is not None and "update" in vars(cache):
                del cache.update
        try:
            self.recipes[key] = _recipe(
                self.packed[start:], self.classify, i, args, kwargs, cache, updates, out
            )
        except _Unplayable:
            self.recipes[key] = None
        return out

    def _play(
        self,
        layer: torch.nn.Module,
        recipe: _Recipe,
        i: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        hidden = _hidden(args, kwargs)
        # a fake tensor for each new storage the cache holds; the others only need a size and
        # an identity (a fake tensor costs a dispatch)
        storages: list[torch.Tensor | PlayedStorage] = [
            torch.empty(n, dtype=torch.uint8) if k in recipe.cached else PlayedStorage(n)
            for k, n in enumerate(recipe.storages)
        ]
        self.keep.extend(storages)

        def storage(ref: _Ref) -> torch.Tensor | PlayedStorage:
            if ref.where == "same":
                assert ref.tensor is not None
                return ref.tensor
            return hidden if ref.where == "input" else storages[ref.index]

        def view(ref: _Ref) -> torch.Tensor:
            if ref.where != "new":
                return cast(torch.Tensor, storage(ref))
            base = cast(torch.Tensor, storages[ref.index]).view(ref.dtype)
            return base.as_strided(ref.shape, ref.stride, ref.offset)

        for ref, kind, grad_fn in recipe.saved:
            # the storage stands for the saved view (what the trace counts is the storage)
            # and is kept alive, as autograd keeps what it saved
            t = storage(ref)
            self.keep.append(t)
            self.packed.append((weakref.ref(t), i, grad_fn, kind, (ref.shape, ref.dtype)))
        cache: Any = kwargs.get("past_key_values")
        if recipe.update is not None:
            k, v, shift, more, more_kw = recipe.update
            cache.update(view(k), view(v), i + shift, *more, **more_kw)
            held = cache.layers[i + shift]
            for name, ref in recipe.cache_holds:
                setattr(held, name, view(ref))
        # the output hangs on the input's graph, as a real layer's does (the graph before this
        # layer, and all it saved, lives as long as the loss), through a non-view node, as a
        # real layer's residual add. In a checkpointed layer that node saves, as the real
        # layer's ops do, through the checkpoint's hooks (nothing is kept): their handles hold
        # the checkpoint, which holds the layer's inputs to the end of forward
        checkpointed = getattr(layer, "gradient_checkpointing", False) and layer.training
        total = hidden.sum() if hidden.requires_grad else torch.zeros((), requires_grad=True)
        # a product of two tensors saves both; one with a number saves no tensor
        anchor = (total * total if checkpointed else total) * 0
        outs: list[torch.Tensor | None] = []
        for spec in recipe.output:
            if spec is None:
                outs.append(None)
                continue
            shape, dtype, grad = spec
            t = torch.empty(shape, dtype=dtype)
            outs.append(t + anchor.to(dtype) if grad else t)
        return outs[0] if recipe.output_is_tensor else tuple(outs)


def _recipe(
    packed: Packed,
    classify: Classify,
    i: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    cache: Any,
    updates: list[tuple[Any, ...]],
    out: Any,
) -> _Recipe:
    recipe = _Recipe()
    hidden = _hidden(args, kwargs)
    hidden_key = _key(hidden)
    before = {_key(t) for t in _tensors(args, kwargs)}
    new: dict[int, int] = {}

    def ref(t: torch.Tensor) -> _Ref:
        key = _key(t)
        shape, stride, offset = tuple(t.shape), tuple(t.stride()), int(t.storage_offset())
        if key == hidden_key:
            if t is not hidden:
                raise _Unplayable  # a view of the input: not written down
            return _Ref("input", 0, None, shape, stride, offset, t.dtype)
        if key in before:
            return _Ref("same", 0, t, shape, stride, offset, t.dtype)
        nbytes = t.untyped_storage().nbytes()
        if nbytes % t.element_size():
            raise _Unplayable
        if key not in new:
            new[key] = len(recipe.storages)
            recipe.storages.append(nbytes)
        return _Ref("new", new[key], None, shape, stride, offset, t.dtype)

    for weak, _, grad_fn, kind, _ in packed:
        t = weak()
        if t is None:  # died inside the layer: a real repeat frees it too
            continue
        if not isinstance(t, torch.Tensor):
            raise _Unplayable
        kind = kind or classify(t)
        if kind == "param":
            continue
        recipe.saved.append((ref(t), kind, grad_fn))
    if updates:
        if len(updates) != 1:
            raise _Unplayable
        (a, kw) = updates[0]
        # the cache's own arguments beyond the key, value and layer index (a cache_kwargs dict)
        # may hold only tensors from before the layer, played as they are
        more = _tensors(a[3:], {}) + [
            v
            for d in a[3:]
            if isinstance(d, dict)
            for v in d.values()
            if isinstance(v, torch.Tensor)
        ]
        if (
            len(a) < 3
            or not isinstance(a[2], int)
            or kw
            or any(_key(t) not in before for t in more)
        ):
            raise _Unplayable
        shift = a[2] - i
        recipe.update = (ref(a[0]), ref(a[1]), shift, a[3:], {})
        held = cache.layers[a[2]]
        for name, value in vars(held).items():
            if isinstance(value, torch.Tensor):
                recipe.cache_holds.append((name, ref(value)))
        refs = [recipe.update[0], recipe.update[1], *(r for _, r in recipe.cache_holds)]
        recipe.cached = {r.index for r in refs if r.where == "new"}
    outs = [out] if isinstance(out, torch.Tensor) else out
    if not isinstance(outs, (tuple, list)):
        raise _Unplayable
    recipe.output_is_tensor = isinstance(out, torch.Tensor)
    saved_new = {r.index for r, _, _ in recipe.saved if r.where == "new"}
    for o in outs:
        if o is None:
            recipe.output.append(None)
            continue
        if not isinstance(o, torch.Tensor) or not o.is_contiguous():
            raise _Unplayable
        key = _key(o)
        if key in before or (key in new and new[key] in saved_new):
            raise _Unplayable  # the output is also saved or is an input: not written down
        node = o.grad_fn
        if o.requires_grad and (node is None or "View" in type(node).__name__):
            raise _Unplayable
        recipe.output.append((tuple(o.shape), o.dtype, o.requires_grad))
    return recipe


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor):
        raise _Unplayable
    return hidden


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for value in [*args, *kwargs.values()]:
        items = value if isinstance(value, (tuple, list)) else (value,)
        out.extend(v for v in items if isinstance(v, torch.Tensor))
    return out


def _call_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """The call's arguments as ``_VARYING`` and the module docstring compare them."""
    _hidden(args, kwargs)
    items: list[tuple[tuple[str, int | str], Any]] = [(("args", n), v) for n, v in enumerate(args)]
    items += [(("kwargs", k), kwargs[k]) for k in sorted(kwargs)]
    return tuple((where, _value(value, where in _VARYING)) for where, value in items)


def _value(value: Any, varying: bool) -> Hashable:
    if isinstance(value, torch.Tensor):
        geometry = (tuple(value.shape), tuple(value.stride()), value.storage_offset())
        common = (*geometry, value.dtype, value.requires_grad)
        if varying:
            return ("hidden", *common, type(value.grad_fn).__name__)
        return ("tensor", *common, _key(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value(v, False) for v in value))
    if isinstance(value, _PLAIN):
        return ("plain", value)
    if isinstance(value, dict):
        raise _Unplayable
    return ("object", id(value))


def _structure(layer: torch.nn.Module) -> Hashable:
    """The layer's module tree: types, plain attributes but ``layer_idx``, parameter and buffer
    shapes."""
    modules = []
    for name, module in layer.named_modules():
        plain = tuple(
            sorted(
                (k, v)
                for k, v in vars(module).items()
                if k != "layer_idx" and not k.startswith("_") and isinstance(v, _PLAIN)
            )
        )
        modules.append((name, type(module).__qualname__, plain))
    tensors = tuple(
        (name, tuple(t.shape), t.dtype, t.requires_grad)
        for name, t in [*layer.named_parameters(), *layer.named_buffers()]
    )
    return (tuple(modules), tensors)


def _per_layer_lists(config: Any, layers: int) -> list[Sequence[Hashable]]:
    """Config entries that hold one value per layer (``layer_types``, ...)."""
    out: list[Sequence[Hashable]] = []
    for value in vars(config).values():
        if isinstance(value, (list, tuple)) and len(value) == layers:
            if all(isinstance(v, _PLAIN) for v in value):
                out.append(value)
    return out


def _hooked(layer: torch.nn.Module, own_hooks: int) -> bool:
    """Hooks in the layer beyond the trace's own (transformers' output capturing)."""
    if len(layer._forward_hooks) + len(layer._forward_pre_hooks) > own_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules() if m is not layer)
