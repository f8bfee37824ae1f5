"""The state of weight matching on one set of tensors: the current element and the squared distance
of every tensor under it, with the acceptance rule that keeps the objective monotone (see `weight.py`).
"""

from __future__ import annotations

import math

import torch

from ..algebra.apply import apply
from ..algebra.spec import Spec
from . import near_ties
from .norms import sqdist, sqnorm


class State:
    """The current element, and the squared distance of every tensor under it (kept up to date).

    `products`: the precision of the products behind the assignment costs (`weight_products.cross`);
    distances are always in the tensors' own precision."""

    def __init__(self, spec: Spec, A: dict, B: dict, g: dict, products: str | None = None):
        self.spec, self.A, self.B, self.g, self.products = spec, A, B, g, products
        self.names = [n for n, t in A.items() if t.dim() > 0]  # norm.eps moves with the scale: not a weight
        self.norm2 = math.fsum(sqnorm(A[n]) for n in self.names)
        self.terms = self._terms(self.names, g)

    def moved(self, names, g) -> dict:
        return apply(self.spec, g, {n: self.B[n] for n in names})

    def _terms(self, names, g) -> dict[str, float]:
        """Squared distance per tensor, one tensor at a time (peak memory: one moved tensor)."""
        out = {}
        for n in names:
            out[n] = sqdist(self.A[n], self.moved([n], g)[n])
        return out

    def similarity(self) -> float:
        return 1.0 - math.fsum(self.terms.values()) / self.norm2

    def offer(self, names: list[str], candidate: dict, judge=None) -> bool:
        """Keep `candidate` if it lowers the squared distance of `names` (exactly rounded sums).

        A candidate outside the group (a singular map where the kind is invertible, e.g. a QK/OV map solved
        against a width-expanded model's zero head dimensions) or with a non-finite distance is refused, so the
        objective stays monotone and the element stays a member.

        `names` must be every tensor the candidate changes; `judge` (default: all of them) are the
        ones whose distance decides (the first sweep judges on the tensors its cost could use).
        """
        try:
            new = self._terms(names, candidate)
        except torch.linalg.LinAlgError:  # a map of the invertible kinds that is singular: not in the group
            return False
        if not all(math.isfinite(v) for v in new.values()):
            return False
        judge = names if judge is None else [n for n in names if n in judge]
        after, before = math.fsum(new[n] for n in judge), math.fsum(self.terms[n] for n in judge)
        if near_ties.active() and self._changes(candidate):
            near_ties.note("acceptance", abs(before - after) / max(before, _TINY), _eps(self.A))
        if after < before:
            self.g = candidate
            self.terms.update(new)
            return True
        return False


    def _changes(self, candidate: dict) -> bool:
        """Whether `candidate` differs from the current element (only then is its acceptance a choice)."""
        return any(v is not self.g.get(k) and not torch.equal(v, self.g[k]) if k in self.g else True
                   for k, v in candidate.items())


_TINY = float(torch.finfo(torch.float64).tiny)


def _eps(params: dict) -> float:
    """Machine epsilon of the algebra (the dtype of the tensors whose distances are compared)."""
    return float(torch.finfo(next(iter(params.values())).dtype).eps)


def without(g: dict, names) -> dict:
    """`g` without the groups `names` (they then act as the identity)."""
    out = dict(g)
    for n in names:
        out[n] = None
    return {k: v for k, v in out.items() if v is not None}


def scatter(x_a: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """A solution found in A's order, stored at B's indices (entry perm[i] gets x_a[i])."""
    if perm is None:
        return x_a
    out = torch.empty_like(x_a)
    out[perm] = x_a
    return out
