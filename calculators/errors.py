"""Domain errors: what went wrong with an input, said in terms of the field that carries it."""

from __future__ import annotations


class InputError(ValueError):
    """An input the calculators cannot answer for.

    Args:
        field: dotted path of the offending request field, e.g. ``"model.architecture.heads"``.
        message: why the value cannot be used, in one sentence.
        also: further fields the same error is about (a request field and the config key it
            contradicts).
    """

    def __init__(self, field: str, message: str, *, also: tuple[str, ...] = ()) -> None:
        super().__init__(f"{', '.join((field, *also))}: {message}")
        self.field = field
        self.message = message
        self.fields = (field, *also)
