"""Readable sizes: the same text as the thousands-separated format, on both sides of 1,000."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.core.units import GB, GIB, readable


def _grouped(n: int) -> str:
    return f"{n / GB:,.2f} GB ({n / GIB:,.2f} GiB)"


def test_examples() -> None:
    assert readable(31_406_250_000) == "31.41 GB (29.25 GiB)"
    assert readable(0) == "0.00 GB (0.00 GiB)"
    assert readable(1_234_000_000_000) == "1,234.00 GB (1,149.25 GiB)"


@given(
    st.one_of(
        st.integers(0, 10**16),
        # around the switch to the separated form (999 GB) and its rounding to 1,000
        st.integers(998 * GB, 1_001 * GIB),
    )
)
def test_same_text_as_the_grouped_format(n: int) -> None:
    assert readable(n) == _grouped(n)
