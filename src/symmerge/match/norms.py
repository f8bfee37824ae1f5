"""Squared norms and distances of whole tensors, accurate at any size and without a transient the tensor's size.

Weight matching judges its steps by objectives summed from `||A||^2` and `||A - g.B||^2` over tensors up to a
vocabulary's embedding (262,144 x 1,152 at Gemma-3-1B shape, 3e8 entries). One reduction over so many entries
is not accurate in float32: `torch.linalg.vector_norm` of 3e8 standard normal float32 entries is 9% low on the
CPU (5e-4 at 8e6 entries), which would misplace the objective, and its comparisons, by far more than float32's
rounding. Here each tensor is reduced in chunks of `CHUNK` entries in its own precision (about 1e-7 relative
in float32), the chunks' sums added in float64. A distance is formed a few rows at a time (`runtime.row_blocks`:
at most `ENTRIES` entries), so `x - y` never exists whole (a float64 embedding's difference alone would be 2.4 GB
at that shape).

Where it fails: the chunks' own sums carry float32's rounding, so float32 objectives agree with float64's to
about 1e-7 relative, not to float64's precision; a tensor's rows larger than `ENTRIES` are formed one row at a time.
"""

from __future__ import annotations

import torch

from ..runtime.row_blocks import rows_at_once

#: entries reduced at once in the tensor's precision (each chunk's sum accurate to about 1e-7 in float32)
CHUNK = 1 << 16


# the chunked path below sees only tensors of more than CHUNK entries: at least one dimension, no empty axis


def _pieces(x: torch.Tensor, rows: int):
    """`x` flattened, `rows` leading rows at a time (views where x is contiguous, else copies of one piece)."""
    for piece in x.split(rows, dim=0):
        yield piece.reshape(-1)


def _sq(v: torch.Tensor) -> torch.Tensor:
    """`||v||^2` of a 1-D tensor as a float64 scalar tensor, chunk by chunk."""
    n = v.numel()
    k = n // CHUNK
    total = torch.zeros((), dtype=torch.float64, device=v.device)
    if k:
        total = total + torch.linalg.vector_norm(v[:k * CHUNK].view(k, CHUNK), dim=1).double().square().sum()
    if n > k * CHUNK:
        total = total + torch.linalg.vector_norm(v[k * CHUNK:]).double().square()
    return total


def sqnorm(x: torch.Tensor) -> float:
    """`||x||^2`, chunk by chunk (see the module docstring); a tensor of at most one chunk in one reduction."""
    if x.numel() <= CHUNK:
        return float(torch.linalg.vector_norm(x)) ** 2
    return float(sum(_sq(v) for v in _pieces(x, rows_at_once(x))))


def sqdist(x: torch.Tensor, y: torch.Tensor) -> float:
    """`||x - y||^2` for tensors of one shape, the difference formed a few rows at a time in one buffer."""
    if x.shape != y.shape:
        raise ValueError(f"sqdist of tensors of shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if x.numel() <= CHUNK:
        return float(torch.linalg.vector_norm(x - y)) ** 2
    rows = rows_at_once(x)
    buf = torch.empty(x[:rows].numel(), dtype=torch.result_type(x, y), device=x.device)
    total = 0.0
    for u, w in zip(_pieces(x, rows), _pieces(y, rows)):
        total = total + _sq(torch.sub(u, w, out=buf[:u.numel()]))
    return float(total)
