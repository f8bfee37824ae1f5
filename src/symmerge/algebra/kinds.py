"""Group kinds as objects: what each kind of symmetry map is, and how it is drawn, checked, solved and learned.

A `Group` (groups.py) is data: a kind name, a size, a batch and the constraints the architecture
imposes. It resolves that data once into one object of this module (`resolve`), and every caller asks
that object instead of testing the strings. Elements are plain tensors, in float64:

| object                  | group                                   | element tensor      | acts along an axis as      |
|-------------------------|-----------------------------------------|---------------------|----------------------------|
| `Permutation`           | permutations                            | int64 `[*batch, n]` | `T'[i] = T[p[i]]`          |
| `Orthogonal`            | O(n)                                    | `[*batch, n, n]`    | `T' = G T`                 |
| `OrthogonalFixingOnes`  | "fixes_ones": O(n) with `O 1 = 1`       | `[n, n]`            | `T' = G T`                 |
| `PermutationMatrices`   | "permutation_matrix": 0/1 orthogonal    | `[*batch, n, n]`    | `T' = G T`                 |
| `Invertible`            | GL(n)                                   | `[*batch, n, n]`    | `T' = G T`                 |
| `RopeCommuting`         | "rope": commutes with RoPE (rotary.py)  | `[*batch, n, n]`    | `T' = G T`                 |
| `SignedPermutations`    | "signed_permutation" (clip_qkv)         | `[*batch, n, n]`    | `T' = G T`                 |
| `SignedRope`            | "rope" and "signed_permutation"         | `[*batch, n, n]`    | `T' = G T`                 |
| `PairSigns`             | "qk_norm" (and "rope"): ±1 diagonals    | `[*batch, n, n]`    | `T' = G T`                 |
| `Diagonal`              | nonzero diagonals ("positive": > 0)     | `[*batch, n]`       | `T'[i] = d[i] T[i]`        |
| `Scalar`                | positive scalars                        | `[]`                | `T' = a T` (whole tensor)  |

The three sign kinds (`SignedPermutations`, `SignedRope`, `PairSigns`) live in `kinds_signed.py`.
A constrained group is a subclass of its kind: it inherits the algebra (identity, inverse,
composition, the action on the reading axes) and replaces the pieces the constraint changes (random
element, membership, dimension, solver, parameterisation form). Each object names its weight-matching
solver (`match/solvers.py` implements them) and its parameterisation form and admitted methods
(`match/parametrize.py` implements them); names, not functions, so that this module imports no matcher.
"""

from __future__ import annotations

import functools
import math

import torch

DTYPE = torch.float64


# --- random draws -----------------------------------------------------------------------------------


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
    u = ones_complement_basis(n).to(r.device)
    return torch.full((n, n), 1.0 / n, dtype=DTYPE, device=r.device) + u @ r @ u.T


def _log_uniform(shape, gen, spread: float) -> torch.Tensor:
    return torch.exp((2 * torch.rand(tuple(shape), generator=gen, dtype=DTYPE) - 1) * math.log(spread))


def _well_conditioned(n: int, gen: torch.Generator, batch, spread: float) -> torch.Tensor:
    """Random invertible matrices with singular values in [1/spread, spread]."""
    u, v = _haar_orthogonal(n, gen, batch), _haar_orthogonal(n, gen, batch)
    return u @ torch.diag_embed(_log_uniform((*batch, n), gen, spread)) @ v


# --- the kinds ----------------------------------------------------------------------------------------


class Kind:
    """One kind of group (see the module docstring). Methods take the `Group` for its size, batch and pairing."""

    name = ""
    discrete = False  # no continuous parameters: weight matching assigns it, learned matching cannot move it smoothly
    straight_through = False  # discrete, and learned by a straight-through estimator (permutations)
    index_vector = False  # elements are int64 index vectors (permutations), not matrices
    acts_on_axis = True  # False: one number that scales the whole tensor
    matrix = True  # elements act as matrices (`act_leading` and `act_in_place` are matrix products)
    positive = False  # scales restricted to positive values
    solver = ""  # the weight-matching solver (match/solvers.py) that finds the best element given the others
    param_form: str | None = None  # learned matching's parameterisation form (match/parametrize.py)
    admits: tuple[str, ...] = ()  # the methods that keep the form in the group
    default_param: str | None = None  # what "auto" picks
    param_choice = False  # whether `--param` chooses among `admits`

    def element_shape(self, group) -> tuple[int, ...]:
        return (*group.batch, group.size, group.size)

    def identity(self, group) -> torch.Tensor:
        n = group.size
        return torch.eye(n, dtype=DTYPE).expand(*group.batch, n, n).clone()

    def compose(self, g2: torch.Tensor, g1: torch.Tensor) -> torch.Tensor:
        """First `g1`, then `g2` (the matrix `G2 G1`)."""
        return g2 @ g1

    def act_leading(self, m: torch.Tensor, x: torch.Tensor, nb: int) -> torch.Tensor:
        """`m` applied along axis `nb` of `x [*batch, n, *rest]` (the batch axes lead)."""
        flat = x.reshape(*x.shape[: nb + 1], -1)  # (*batch, n, prod(rest))
        return (m.to(x.dtype) @ flat).reshape(x.shape)

    def act_in_place(self, m: torch.Tensor, x: torch.Tensor, nb: int, axis: int) -> torch.Tensor:
        """`m` applied along `axis` of `x`, whose first `nb` axes are the batch axes (`axis` >= nb), by one matrix
        product on `x` as it lies: the result is contiguous in `x`'s own axis order. Moving the axis to the front
        (`act_leading`) copied a contiguous `x` whose axis is not the first, and gave back a strided view that
        every later elementwise pass (interpolation, casts) walked slowly: the residual rotation of every reader
        (its last axis) and of a per-head output map (a middle one). The same numbers (one dot product of length
        n per entry)."""
        m = m.to(x.dtype)
        batch, n = x.shape[:nb], x.shape[axis]
        before = math.prod(x.shape[nb:axis])
        if axis == x.dim() - 1:  # rows of x times m^T
            return (x.reshape(*batch, before, n) @ m.transpose(-1, -2)).reshape(x.shape)
        after = math.prod(x.shape[axis + 1:])
        return (m.unsqueeze(-3) @ x.reshape(*batch, before, n, after)).reshape(x.shape)

    def dimension(self, group) -> int:
        """Dimension of the group as a manifold (0 for discrete groups)."""
        return 0 if self.discrete else group.size * group.size * math.prod(group.batch)

    def order_note(self, group) -> str:
        return ""

    def describe(self, x: torch.Tensor, n: int) -> dict:
        """A few numbers that say how far an element is from the identity (`symmerge align`'s report)."""
        svals = torch.linalg.svdvals(x)  # [*batch, n]
        dist = torch.linalg.matrix_norm(x - torch.eye(n, dtype=x.dtype)) / math.sqrt(n)
        return {"max_condition": float((svals[..., 0] / svals[..., -1]).max()),
                "max_relative_distance_from_identity": float(dist.max())}


class Permutation(Kind):
    name, discrete, straight_through, index_vector, solver = "permutation", True, True, True, "assignment"
    matrix = False

    def element_shape(self, group):
        return (*group.batch, group.size)

    def identity(self, group):
        return torch.arange(group.size).expand(*group.batch, group.size).clone()

    def inverse(self, g):
        return torch.argsort(g, dim=-1)

    def compose(self, g2, g1):
        return torch.gather(g1, -1, g2)  # P2 P1 as index vectors: p1[p2]

    def inverse_transpose(self, g):
        return g

    def act_leading(self, m, x, nb):
        # y[b, i] = x[b, m[b, i]]: whole slices copied by index_select (a gather with an index per element
        # was most of the time of moving a 7B block); the same numbers, and the same gradient for x
        if nb == 0:
            return x.index_select(0, m)
        if x.numel() == 0:
            return x.clone()
        batch, n = x.shape[:nb], x.shape[nb]
        count = math.prod(batch)
        offsets = (torch.arange(count, device=m.device) * n).reshape(*batch, 1)
        rows = x.reshape(count * n, -1).index_select(0, (m + offsets).reshape(-1))
        return rows.reshape(x.shape)

    def random(self, group, gen, spread):
        n, b = group.size, group.batch
        return torch.stack([torch.randperm(n, generator=gen) for _ in range(math.prod(b))]).reshape(*b, n)

    def membership_error(self, group, g):
        return 0.0 if torch.equal(torch.sort(g, dim=-1).values, self.identity(group)) else float("inf")

    def order_note(self, group):
        return f"S({group.size})"

    def describe(self, x, n):
        return {"moved": int((x != torch.arange(n)).sum())}


class Orthogonal(Kind):
    name, solver = "orthogonal", "procrustes"
    param_form, admits, default_param, param_choice = "orthogonal", ("cayley", "cayley-signs", "expm"), "cayley", True

    def inverse(self, g):
        return g.transpose(-1, -2).clone()

    def inverse_transpose(self, g):
        return g

    def random(self, group, gen, spread):
        return _haar_orthogonal(group.size, gen, group.batch)

    def membership_error(self, group, g):
        eye = torch.eye(group.size, dtype=g.dtype)
        return max(0.0, float((g @ g.transpose(-1, -2) - eye).abs().max()))

    def dimension(self, group):
        return self._free(group) * (self._free(group) - 1) // 2 * math.prod(group.batch)

    def _free(self, group) -> int:
        return group.size

    def describe(self, x, n):
        angles = torch.linalg.eigvals(x).angle().abs() * (180 / math.pi)
        return {"max_angle_deg": float(angles.max()), "mean_angle_deg": float(angles.mean()),
                "distance_from_identity": float(torch.linalg.matrix_norm(x - torch.eye(n, dtype=x.dtype)).max())}


class OrthogonalFixingOnes(Orthogonal):
    """LayerNorm models: `O = 11^T/n + U R U^T`, R in O(n-1) (`orthogonal_fixing_ones`)."""

    solver, param_form = "procrustes_fixing_ones", "orthogonal_fixing_ones"

    def random(self, group, gen, spread):
        assert not group.batch, "fixes_ones is only used for the single residual rotation"
        return orthogonal_fixing_ones(_haar_orthogonal(group.size - 1, gen))

    def membership_error(self, group, g):
        ones = torch.ones(group.size, dtype=g.dtype)
        return max(super().membership_error(group, g), float((g @ ones - ones).abs().max()))

    def _free(self, group):
        return group.size - 1


class PermutationMatrices(Orthogonal):
    """The residual rotation restricted to permutation matrices (permutation-only matching, `Spec.restricted`)."""

    discrete, straight_through, solver = True, True, "assignment_matrix"

    def random(self, group, gen, spread):
        n, b = group.size, group.batch
        perms = [torch.randperm(n, generator=gen) for _ in range(math.prod(b))]
        return torch.nn.functional.one_hot(torch.stack(perms), n).to(DTYPE).reshape(*b, n, n)

    def membership_error(self, group, g):  # orthogonal with 0/1 entries: a permutation matrix
        return max(super().membership_error(group, g), float((g.round() - g).abs().max() + (g < -0.5).any()))

    def dimension(self, group):
        return 0

    def order_note(self, group):
        return f"permutation matrices of {group.size}"


class Invertible(Kind):
    name, solver = "invertible", "balanced_lstsq"
    param_form, admits, default_param, param_choice = "invertible", ("expm", "polar", "direct"), "polar", True

    def inverse(self, g):
        return torch.linalg.inv(g)

    def inverse_transpose(self, g):
        return torch.linalg.inv(g).transpose(-1, -2)

    def random(self, group, gen, spread):
        return _well_conditioned(group.size, gen, group.batch, spread)

    def membership_error(self, group, g):
        return float("inf") if float(torch.linalg.svdvals(g).min()) == 0.0 else 0.0


class RopeCommuting(Invertible):
    """Maps that commute with RoPE: a scaled rotation on each rotary pair, a full block elsewhere (rotary.py)."""

    solver, param_form = "rope_lstsq", "rope"

    def random(self, group, gen, spread):
        n, b, r = group.size, group.batch, group.rotary_dims
        radius = _log_uniform((*b, r // 2), gen, spread)
        angle = torch.rand(*b, r // 2, generator=gen, dtype=DTYPE) * 2 * math.pi
        free = _well_conditioned(n - r, gen, b, spread)
        return group.pairing.blocks(n, radius * torch.cos(angle), radius * torch.sin(angle), free)

    def membership_error(self, group, g):
        return max(super().membership_error(group, g), self._rope_error(group, g))

    @staticmethod
    def _rope_error(group, g) -> float:
        """0 exactly when `g` has the block form of rotary.py (no cross terms, scaled rotations on the pairs)."""
        a, b = group.pairing.pairs(g)
        return float((g - group.pairing.blocks(group.size, a, b, group.pairing.free(g))).abs().max())

    def dimension(self, group):
        free = group.size - group.rotary_dims
        return (group.rotary_dims + free * free) * math.prod(group.batch)


class Diagonal(Kind):
    """Nonzero diagonal scales (`positive`: positive ones)."""

    name, solver = "diagonal", "best_scale"
    param_form, admits, default_param = "diagonal", ("log",), "log"
    matrix = False

    def __init__(self, positive: bool = False):
        self.positive = positive

    def element_shape(self, group):
        return (*group.batch, group.size)

    def identity(self, group):
        return torch.ones(*group.batch, group.size, dtype=DTYPE)

    def inverse(self, g):
        return 1.0 / g

    def compose(self, g2, g1):
        return g2 * g1

    def inverse_transpose(self, g):
        return 1.0 / g

    def act_leading(self, m, x, nb):
        return x * m.to(x.dtype).reshape(*m.shape, *([1] * (x.dim() - m.dim())))

    def random(self, group, gen, spread):
        b, n = group.batch, group.size
        d = _log_uniform((*b, n), gen, spread)
        if not self.positive:
            d = d * (torch.randint(0, 2, (*b, n), generator=gen).to(DTYPE) * 2 - 1)
        return d

    def membership_error(self, group, g):
        return float("inf") if bool(((g <= 0) if self.positive else (g == 0)).any()) else 0.0

    def dimension(self, group):
        return group.size * math.prod(group.batch)

    def describe(self, x, n):
        return {"min_abs": float(x.abs().min()), "max_abs": float(x.abs().max()), "negative": int((x < 0).sum())}


class Scalar(Diagonal):
    """One positive number scaling every tensor it acts on (the residual scale)."""

    name, acts_on_axis, param_form = "scalar", False, "scalar"

    def __init__(self):
        super().__init__(positive=True)

    def element_shape(self, group):
        return ()

    def identity(self, group):
        return torch.tensor(1.0, dtype=DTYPE)

    def act_leading(self, m, x, nb):
        return x * m.to(x.dtype)

    def random(self, group, gen, spread):
        return _log_uniform((), gen, spread)

    def dimension(self, group):
        return 1

    def describe(self, x, n):
        return {"value": float(x)}
