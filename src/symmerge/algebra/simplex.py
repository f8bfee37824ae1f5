"""Weights over n models: the merge weights a user gives, and points drawn on the simplex.

A weight vector is valid when it has one finite, non-negative entry per model and sums to 1 within
`WEIGHT_SUM_TOL` (weights come as decimals from the command line, so an exact sum cannot be asked for).
Dirichlet(1, ..., 1) draws are uniform on the simplex and depend on the seed alone.
"""

from __future__ import annotations

import math

import torch

from ..errors import SymmergeError

#: how far from 1 the weights' sum may be (they are written in decimal on the command line)
WEIGHT_SUM_TOL = 1e-6


def check_weights(weights: list[float] | None, n: int) -> list[float]:
    """One non-negative weight per model, summing to 1 (default: uniform); returned as floats."""
    if n < 2:
        raise SymmergeError(f"merging needs at least two models, got {n}")
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise SymmergeError(f"{len(w)} weights for {n} models; give one weight per model")
    if not all(math.isfinite(x) for x in w) or any(x < 0 for x in w):
        raise SymmergeError(f"weights {w} must be finite and non-negative")
    if abs(math.fsum(w) - 1.0) > WEIGHT_SUM_TOL:
        raise SymmergeError(f"weights {w} sum to {math.fsum(w):g}, not 1")
    return w


def parse_weights(text: str | None) -> list[float] | None:
    """`w1,w2,...` from the command line (None: uniform)."""
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise SymmergeError(f"--weights {text!r}: give comma-separated numbers, e.g. 0.5,0.25,0.25") from None


def dirichlet(n: int, k: int, seed: int) -> list[list[float]]:
    """`k` points drawn uniformly on the simplex of `n` vertices (Dirichlet(1, ..., 1)), seeded."""
    gen = torch.Generator().manual_seed(seed)
    e = -torch.log(torch.rand(k, n, generator=gen, dtype=torch.float64).clamp_min(1e-300))
    return (e / e.sum(1, keepdim=True)).tolist()
