"""Gradient buckets: a model chunk's gradient bytes split as a framework fills its buckets.

Each data-parallel kind (``schedules.data_parallel``) says its bucket size; this module does the
split, in ready order, with an optional smaller first bucket (torch DDP's 1 MiB).

    split_buckets(60 * MIB, 25 * MIB, 1 * MIB, knob="parallel.ddp_bucket_mb=25")
"""

from __future__ import annotations

import math

MIB = 2**20
"""Bytes per MiB (torch DDP's bucket_cap_mb)."""
MAX_BUCKETS = 250_000
"""Most gradient buckets one model chunk may have; more is a bucket size typed in the wrong unit."""


def split_buckets(
    total: float, cap: float, first_cap: float | None = None, *, knob: str
) -> tuple[float, ...]:
    """Split ``total`` bytes into buckets of ``cap`` (the first of ``first_cap``)."""
    count = math.ceil(max(total - (first_cap or 0.0), 0.0) / cap)
    if count > MAX_BUCKETS:
        raise ValueError(
            f"{knob} splits {total:.3g} gradient bytes of one model chunk into "
            f"{f'{count:,}' if count < 1e9 else f'{float(count):.3g}'} buckets; at most "
            f"{MAX_BUCKETS:,} are simulated: use larger buckets"
        )
    sizes: list[float] = []
    remaining = total
    for limit in [first_cap] if first_cap else []:
        sizes.append(min(limit, remaining))
        remaining -= sizes[-1]
    while remaining > 0:
        sizes.append(min(cap, remaining))
        remaining -= sizes[-1]
    return tuple(sizes) or (0.0,)


def element_buckets(total: float, elems: int, grad_bytes: int, *, knob: str) -> tuple[float, ...]:
    """Buckets of ``elems`` gradient elements (DeepSpeed's ``reduce_bucket_size``)."""
    return split_buckets(total, elems * grad_bytes, knob=knob)
