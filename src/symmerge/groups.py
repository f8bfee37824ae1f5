"""Symmetry groups as data, and the algebra of one group's elements.

A `Group` says what kind of map it is, its size, its batch (one map per KV group for the head-internal
maps) and the constraints the architecture imposes. Elements are plain tensors, in float64:

| kind          | element tensor      | acts on an axis of length n as                        |
|---------------|---------------------|-------------------------------------------------------|
| permutation   | int64 `[*batch, n]` | `T'[i] = T[p[i]]` (the matrix `P[i, p[i]] = 1`)       |
| orthogonal    | `[*batch, n, n]`    | `T' = G T` along the axis                             |
| invertible    | `[*batch, n, n]`    | `T' = G T` along the axis                             |
| diagonal      | `[*batch, n]`       | `T'[i] = d[i] T[i]`                                   |
| scalar        | `[]`                | `T' = a T`                                            |

Composition `compose(g2, g1)` means "first g1, then g2" (the matrix `G2 G1`).

An orthogonal group with the "permutation_matrix" constraint holds only permutation matrices (the
residual permutation of permutation-only matching, `Spec.restricted`); like "signed_permutation"
it makes the group discrete.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from . import SymmergeError

KINDS = ("permutation", "orthogonal", "invertible", "diagonal", "scalar")
#: constraints a group may carry; each is read by `random_element` and `membership_error`
CONSTRAINTS = ("fixes_ones", "rope", "signed_permutation", "permutation_matrix", "positive")

DTYPE = torch.float64


@dataclass(frozen=True)
class Group:
    """One factor of a model's symmetry group.

    name: unique within a spec, e.g. "blocks.3.qk".
    family: what `--groups` selects, e.g. "qk_map"; several groups (one per layer) share a family.
    batch: independent copies (one map per KV group: `(n_kv,)`), `()` for one map.
    rotary_dims: for the "rope" constraint, the leading dimensions of each head that RoPE rotates,
        with `rotate_half` pairing dimension i with i + rotary_dims/2.
    indexed_by: name of a permutation group that permutes this group's batch axis (the head
        permutation re-indexes the per-head maps; the FFN permutation re-indexes the GLU scales).
    note: why the group has this form (printed by `symmerge inspect`).
    """

    name: str
    family: str
    kind: str
    size: int
    batch: tuple[int, ...] = ()
    constraints: tuple[str, ...] = ()
    layer: int | None = None
    rotary_dims: int = 0
    indexed_by: str | None = None
    note: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        assert all(c in CONSTRAINTS for c in self.constraints), self.constraints
        if self.indexed_by is not None:
            # the permutation re-indexes either the batch axis or, for a diagonal, its entries
            assert self.batch or self.kind == "diagonal", self.name

    @property
    def dimension(self) -> int:
        """Dimension of the group as a manifold (0 for discrete groups)."""
        n, copies = self.size, math.prod(self.batch)
        if self.discrete:
            return 0
        if self.kind == "scalar":
            return 1
        if self.kind == "diagonal":
            return n * copies
        if self.kind == "orthogonal":
            m = n - 1 if "fixes_ones" in self.constraints else n
            return m * (m - 1) // 2 * copies
        if "rope" in self.constraints:
            free = n - self.rotary_dims
            return (self.rotary_dims + free * free) * copies
        return n * n * copies

    @property
    def discrete(self) -> bool:
        """Permutations, and the maps restricted to (signed) permutation matrices."""
        return self.kind == "permutation" or bool({"signed_permutation", "permutation_matrix"} & set(self.constraints))

    @property
    def order_note(self) -> str:
        if self.kind == "permutation":
            return f"S({self.size})"
        if "signed_permutation" in self.constraints:
            return f"signed permutations of {self.size}"
        if "permutation_matrix" in self.constraints:
            return f"permutation matrices of {self.size}"
        return ""


def identity(group: Group) -> torch.Tensor:
    n, b = group.size, group.batch
    if group.kind == "permutation":
        return torch.arange(n).expand(*b, n).clone()
    if group.kind in ("orthogonal", "invertible"):
        return torch.eye(n, dtype=DTYPE).expand(*b, n, n).clone()
    if group.kind == "diagonal":
        return torch.ones(*b, n, dtype=DTYPE)
    return torch.tensor(1.0, dtype=DTYPE)


def inverse(group: Group, g: torch.Tensor) -> torch.Tensor:
    """The inverse of one group's element (batched), ignoring re-indexing by other groups."""
    if group.kind == "permutation":
        return torch.argsort(g, dim=-1)
    if group.kind == "orthogonal":
        return g.transpose(-1, -2).clone()
    if group.kind == "invertible":
        return torch.linalg.inv(g)
    return 1.0 / g


def compose(group: Group, g2: torch.Tensor, g1: torch.Tensor) -> torch.Tensor:
    """First `g1`, then `g2`."""
    if group.kind == "permutation":
        return torch.gather(g1, -1, g2)  # P2 P1 as index vectors: p1[p2]
    if group.kind in ("orthogonal", "invertible"):
        return g2 @ g1
    return g2 * g1


def inverse_transpose(group: Group, g: torch.Tensor) -> torch.Tensor:
    """`G^{-T}`: how the element acts on the axes that *read* what `g` acts on."""
    if group.kind in ("permutation", "orthogonal"):
        return g
    if group.kind == "invertible":
        return torch.linalg.inv(g).transpose(-1, -2)
    return 1.0 / g


def as_matrix(group: Group, g: torch.Tensor) -> torch.Tensor:
    """Dense `[*batch, n, n]` matrix of an element (for tests and reports)."""
    n = group.size
    if group.kind == "permutation":
        return torch.nn.functional.one_hot(g, n).to(DTYPE)
    if group.kind == "diagonal":
        return torch.diag_embed(g)
    if group.kind == "scalar":
        return g * torch.eye(n, dtype=DTYPE)
    return g


# --- random elements ------------------------------------------------------------------------------


def _haar_orthogonal(n: int, gen: torch.Generator, batch: tuple[int, ...] = ()) -> torch.Tensor:
    a = torch.randn(*batch, n, n, generator=gen, dtype=DTYPE)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar measure


def ones_complement_basis(n: int) -> torch.Tensor:
    """`[n, n-1]` orthonormal basis of the complement of the all-ones vector (Helmert-like, exact)."""
    return _ones_complement_basis(n).clone()


@functools.lru_cache(maxsize=4)
def _ones_complement_basis(n: int) -> torch.Tensor:  # a QR of n x n: worth keeping at d = 2048
    q, _ = torch.linalg.qr(torch.cat([torch.ones(n, 1, dtype=DTYPE), torch.eye(n, dtype=DTYPE)[:, : n - 1]], 1))
    return q[:, 1:]


def orthogonal_fixing_ones(r: torch.Tensor) -> torch.Tensor:
    """`O = 11^T/n + U R U^T` for `R` in O(n-1): orthogonal, and `O 1 = 1`."""
    n = r.shape[-1] + 1
    u = ones_complement_basis(n)
    return torch.full((n, n), 1.0 / n, dtype=DTYPE) + u @ r @ u.T


def _log_uniform(shape, gen, spread: float) -> torch.Tensor:
    return torch.exp((2 * torch.rand(tuple(shape), generator=gen, dtype=DTYPE) - 1) * math.log(spread))


def _well_conditioned(n: int, gen: torch.Generator, batch, spread: float) -> torch.Tensor:
    """Random invertible matrices with singular values in [1/spread, spread]."""
    u, v = _haar_orthogonal(n, gen, batch), _haar_orthogonal(n, gen, batch)
    return u @ torch.diag_embed(_log_uniform((*batch, n), gen, spread)) @ v


def _random_signed_permutation(n: int, gen: torch.Generator, batch) -> torch.Tensor:
    count = math.prod(batch)
    mats = []
    for _ in range(count):
        p = torch.randperm(n, generator=gen)
        s = torch.randint(0, 2, (n,), generator=gen).to(DTYPE) * 2 - 1
        mats.append(torch.nn.functional.one_hot(p, n).to(DTYPE) * s[:, None])
    return torch.stack(mats).reshape(*batch, n, n) if batch else mats[0]


def rope_blocks(group: Group, pair_a: torch.Tensor, pair_b: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Assemble maps that commute with RoPE.

    On each rotary pair (i, i + r/2) the map is the scaled rotation [[a, -b], [b, a]], which commutes
    with every position's rotation; the non-rotary dimensions (r..n) get the full block `free`;
    there are no cross terms. pair_a, pair_b: `[*batch, r/2]`; free: `[*batch, n-r, n-r]`.
    """
    n, r = group.size, group.rotary_dims
    h = r // 2
    m = torch.zeros(*pair_a.shape[:-1], n, n, dtype=DTYPE)
    idx = torch.arange(h)
    m[..., idx, idx] = pair_a
    m[..., idx + h, idx + h] = pair_a
    m[..., idx, idx + h] = -pair_b
    m[..., idx + h, idx] = pair_b
    m[..., r:, r:] = free
    return m


def random_element(group: Group, gen: torch.Generator, spread: float = 2.0) -> torch.Tensor:
    """A random element, well away from the identity; scales lie in [1/spread, spread]."""
    n, b = group.size, group.batch
    signed = "signed_permutation" in group.constraints
    if group.kind == "permutation":
        return torch.stack([torch.randperm(n, generator=gen) for _ in range(math.prod(b))]).reshape(*b, n)
    if group.kind == "scalar":
        return _log_uniform((), gen, spread)
    if group.kind == "diagonal":
        d = _log_uniform((*b, n), gen, spread)
        if "positive" not in group.constraints:
            d = d * (torch.randint(0, 2, (*b, n), generator=gen).to(DTYPE) * 2 - 1)
        return d
    if group.kind == "orthogonal":
        if "permutation_matrix" in group.constraints:
            perms = [torch.randperm(n, generator=gen) for _ in range(math.prod(b))]
            return torch.nn.functional.one_hot(torch.stack(perms), n).to(DTYPE).reshape(*b, n, n)
        if "fixes_ones" in group.constraints:
            assert not b, "fixes_ones is only used for the single residual rotation"
            return orthogonal_fixing_ones(_haar_orthogonal(n - 1, gen))
        return _haar_orthogonal(n, gen, b)
    # invertible
    if "rope" in group.constraints:
        r = group.rotary_dims
        if signed:  # quarter turns on each pair, a signed permutation elsewhere
            k = torch.randint(0, 4, (*b, r // 2), generator=gen).to(DTYPE) * (math.pi / 2)
            a, bb = torch.round(torch.cos(k)), torch.round(torch.sin(k))
            free = _random_signed_permutation(n - r, gen, b) if n > r else torch.zeros(*b, 0, 0, dtype=DTYPE)
        else:
            radius = _log_uniform((*b, r // 2), gen, spread)
            angle = torch.rand(*b, r // 2, generator=gen, dtype=DTYPE) * 2 * math.pi
            a, bb = radius * torch.cos(angle), radius * torch.sin(angle)
            free = _well_conditioned(n - r, gen, b, spread)
        return rope_blocks(group, a, bb, free)
    if signed:
        return _random_signed_permutation(n, gen, b)
    return _well_conditioned(n, gen, b, spread)


# --- membership -----------------------------------------------------------------------------------


def membership_error(group: Group, g: torch.Tensor) -> float:
    """0 for an exact member; otherwise the largest violation of the group's defining equations."""
    n, b = group.size, group.batch
    expected = (*b, n) if group.kind in ("permutation", "diagonal") else () if group.kind == "scalar" else (*b, n, n)
    if tuple(g.shape) != expected:
        raise SymmergeError(f"element of {group.name} has shape {tuple(g.shape)}, expected {expected}")
    if group.kind == "permutation":
        ok = torch.equal(torch.sort(g, dim=-1).values, identity(group))
        return 0.0 if ok else float("inf")
    if group.kind in ("scalar", "diagonal"):
        bad = (g <= 0) if "positive" in group.constraints or group.kind == "scalar" else (g == 0)
        return float("inf") if bool(bad.any()) else 0.0
    errors = [0.0]
    eye = torch.eye(n, dtype=g.dtype)
    if group.kind == "orthogonal":
        errors.append(float((g @ g.transpose(-1, -2) - eye).abs().max()))
    else:
        svals = torch.linalg.svdvals(g)
        if float(svals.min()) == 0.0:
            return float("inf")
    if "fixes_ones" in group.constraints:
        ones = torch.ones(n, dtype=g.dtype)
        errors.append(float((g @ ones - ones).abs().max()))
    if "rope" in group.constraints:
        h = group.rotary_dims // 2
        idx = torch.arange(h)
        a, bb = g[..., idx, idx], g[..., idx + h, idx]
        free = g[..., group.rotary_dims :, group.rotary_dims :]
        errors.append(float((g - rope_blocks(group, a, bb, free)).abs().max()))
    if "signed_permutation" in group.constraints:
        errors.append(float((g.abs().sum(-1) - 1).abs().max() + (g.abs().round() - g.abs()).abs().max()))
    if "permutation_matrix" in group.constraints:  # orthogonal with 0/1 entries: a permutation matrix
        errors.append(float((g.round() - g).abs().max() + (g < -0.5).any()))
    return max(errors)
