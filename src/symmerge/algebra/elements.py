"""Group elements over a whole spec: dicts {group name: tensor}, and their algebra (identity, random draws,
inverse, composition) with the re-indexing that permutations impose on the groups they re-index.

Re-exported by `spec.py`. A group re-indexed by a permutation (`Group.indexed_by`: the per-head maps by the
head permutation, a GLU scale by the FFN permutation, in a mixture of experts the FFN permutations by the
expert permutation) stores its entries in B's order, since it acts before the permutations do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import groups as G

if TYPE_CHECKING:
    from .spec import Spec


def identity_element(spec: Spec) -> dict[str, torch.Tensor]:
    return {n: G.identity(g) for n, g in spec.groups.items()}


def random_element(spec: Spec, gen: torch.Generator, families: list[str] | None = None, spread: float = 2.0):
    """A random element of the selected families (identity elsewhere)."""
    spec = spec.restricted(families)
    chosen = set(spec.select(families))
    return {n: (G.random_element(g, gen, spread) if n in chosen else G.identity(g)) for n, g in spec.groups.items()}


def _by(spec: Spec, name: str, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """`x` (indexed along its leading axes by permutation group `name`'s axes, batch axes first) re-indexed:
    `y[b, i] = x[b, perm[b, i]]`, the gather by which the permutation acts."""
    group = spec.groups[name]
    return group.structure.act_leading(perm, x, len(group.batch))


def reindex(spec: Spec, name: str, x: torch.Tensor, g: dict[str, torch.Tensor]) -> torch.Tensor:
    """`x`, an element of group `name` (or anything indexed as it is), from B's order to A's: re-indexed by the
    permutation that re-indexes `name`, then by the one re-indexing that, and so on up the chain (a GLU scale of
    a mixture of experts by its expert's FFN permutation, then by the expert permutation): the order in which
    `apply` moves the tensors they act on. Entry i then belongs to what lands at position i."""
    k = spec.groups[name].indexed_by
    while k is not None:
        x = _by(spec, k, x, g[k])
        k = spec.groups[k].indexed_by
    return x


def unindex(spec: Spec, name: str, x: torch.Tensor, g: dict[str, torch.Tensor]) -> torch.Tensor:
    """The inverse of `reindex`: `x` in A's order (a solution found against B moved into A's order) back to B's."""
    chain, k = [], spec.groups[name].indexed_by
    while k is not None:
        chain.append(k)
        k = spec.groups[k].indexed_by
    for k in reversed(chain):
        x = _by(spec, k, x, torch.argsort(g[k], dim=-1))
    return x


def inverse(spec: Spec, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The element h with apply(h, apply(g, θ)) = θ.

    The action is θ -> P(C(θ)), with the permutations P acting after the maps C they re-index, so
    (P C)^{-1} = P^{-1} (P C^{-1} P^{-1}): each re-indexed map is inverted, then re-indexed by P (by the whole
    chain of permutations above it, `reindex`).
    """
    out = {n: G.inverse(spec.groups[n], x) for n, x in g.items()}
    for n, grp in spec.groups.items():
        if grp.indexed_by and n in g:
            out[n] = reindex(spec, n, out[n], g)
    return out


def compose(spec: Spec, g2: dict, g1: dict) -> dict[str, torch.Tensor]:
    """First g1, then g2: P2 C2 P1 C1 = (P2 P1)((P1^{-1} C2 P1) C1)."""
    out, back = {}, None
    for n, grp in spec.groups.items():
        x2 = g2[n]
        if grp.indexed_by:
            back = back or inverse(spec, {k: g1[k] for k, h in spec.groups.items() if h.structure.index_vector})
            x2 = reindex(spec, n, x2, back)
        out[n] = G.compose(grp, x2, g1[n])
    return out
