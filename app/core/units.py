"""Human-readable sizes, made at the edge: GB is 10^9 bytes, GiB is 2^30 bytes."""

from __future__ import annotations

GB = 10**9
GIB = 2**30


def readable(n_bytes: int) -> str:
    """``31406250000`` → ``"31.41 GB (29.25 GiB)"``; both units named, never ambiguous."""
    return f"{n_bytes / GB:,.2f} GB ({n_bytes / GIB:,.2f} GiB)"
