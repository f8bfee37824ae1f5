"""A large tensor worked on a few leading rows at a time, so that a product, difference or copy of it never
exists whole: a float64 vocabulary embedding of 262,144 x 1,152 is 2.4 GB, and one more transient of its size
is what sets the memory of the steps that read the ends (`match.norms`, `store.gauge.tied_scale`).

Where it fails: a single row of more than ENTRIES entries is still taken whole (one row at a time).
"""

from __future__ import annotations

import torch

#: entries of a tensor taken at once
ENTRIES = 1 << 22


def rows_at_once(x: torch.Tensor) -> int:
    """Leading rows of `x` (at least one dimension) that make at most ENTRIES entries, and at least one row."""
    return max(1, ENTRIES // max(1, x[:1].numel()))


def row_slices(x: torch.Tensor) -> list[slice]:
    """Slices of `x`'s leading axis, `rows_at_once(x)` rows each (the last one shorter)."""
    step = rows_at_once(x)
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]
