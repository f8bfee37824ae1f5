"""Symmetry groups as data, and the algebra of one group's elements.

A `Group` says what kind of map it is, its size, its batch (one map per KV group for the head-internal
maps) and the constraints the architecture imposes, as plain data (what `symmerge inspect` prints).
It resolves that data once into a kind object (`kinds.py`: `Group.structure`), which knows the
element tensors, the algebra, random elements, membership, the solver and the parameterisations;
the functions below are the element-level API and ask that object.

Composition `compose(g2, g1)` means "first g1, then g2" (the matrix `G2 G1`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import SymmergeError
from . import kinds as K
from . import kinds_signed as KS
from .kinds import DTYPE, _haar_orthogonal, ones_complement_basis, orthogonal_fixing_ones  # noqa: F401 (re-exported)
from .rotary import Pairing

KINDS = ("permutation", "orthogonal", "invertible", "diagonal", "scalar")
#: constraints a group may carry, each read by the kind object it resolves to (`STRUCTURES`)
CONSTRAINTS = ("fixes_ones", "rope", "signed_permutation", "permutation_matrix", "positive", "qk_norm")

#: (kind, sorted constraints) -> the object that implements that group: the one place the strings are read
STRUCTURES: dict[tuple[str, tuple[str, ...]], K.Kind] = {
    ("permutation", ()): K.Permutation(),
    ("orthogonal", ()): K.Orthogonal(),
    ("orthogonal", ("fixes_ones",)): K.OrthogonalFixingOnes(),
    ("orthogonal", ("permutation_matrix",)): K.PermutationMatrices(),
    ("orthogonal", ("signed_permutation",)): KS.SignedPermutationMatrices(),
    ("invertible", ()): K.Invertible(),
    ("invertible", ("rope",)): K.RopeCommuting(),
    ("invertible", ("signed_permutation",)): KS.SignedPermutations(),
    ("invertible", ("rope", "signed_permutation")): KS.SignedRope(),
    ("invertible", ("qk_norm",)): KS.PairSigns(),
    ("invertible", ("qk_norm", "rope")): KS.PairSigns(),
    ("diagonal", ()): K.Diagonal(),
    ("diagonal", ("positive",)): K.Diagonal(positive=True),
    ("scalar", ()): K.Scalar(),
    ("scalar", ("positive",)): K.Scalar(),
}


@dataclass(frozen=True)
class Group:
    """One factor of a model's symmetry group.

    name: unique within a spec, e.g. "blocks.3.qk".
    family: what `--groups` selects, e.g. `spec.QK_MAP`; several groups (one per layer) share a family.
    kind, constraints: see `STRUCTURES`; resolved into `structure` when the record is built.
    batch: independent copies (one map per KV group: `(n_kv,)`), `()` for one map.
    rotary_dims, rotary_layout: for the "rope" constraint, the leading dimensions of each head that
        RoPE rotates and how they pair (`rotary.Pairing`, from `ModelShape.rotary_layout`).
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
    rotary_layout: str = "half"
    structure: K.Kind = field(init=False, repr=False, compare=False)
    pairing: Pairing | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        key = (self.kind, tuple(sorted(self.constraints)))
        if key not in STRUCTURES:
            raise SymmergeError(f"group {self.name}: no {self.kind} group with constraints {self.constraints}; "
                                f"symmerge implements {sorted(STRUCTURES)}")
        object.__setattr__(self, "structure", STRUCTURES[key])
        object.__setattr__(self, "pairing", Pairing(self.rotary_dims, self.rotary_layout) if self.rotary_dims else None)
        if self.indexed_by is not None:
            # the permutation re-indexes either the batch axis or the entries of a vector element (a diagonal)
            assert self.batch or len(self.structure.element_shape(self)) == 1, self.name

    @property
    def dimension(self) -> int:
        """Dimension of the group as a manifold (0 for discrete groups)."""
        return self.structure.dimension(self)

    @property
    def discrete(self) -> bool:
        """Permutations, and the maps restricted to (signed) permutation matrices."""
        return self.structure.discrete

    @property
    def order_note(self) -> str:
        return self.structure.order_note(self)


def identity(group: Group) -> torch.Tensor:
    return group.structure.identity(group)


def inverse(group: Group, g: torch.Tensor) -> torch.Tensor:
    """The inverse of one group's element (batched), ignoring re-indexing by other groups."""
    return group.structure.inverse(g)


def compose(group: Group, g2: torch.Tensor, g1: torch.Tensor) -> torch.Tensor:
    """First `g1`, then `g2`."""
    return group.structure.compose(g2, g1)


def inverse_transpose(group: Group, g: torch.Tensor) -> torch.Tensor:
    """`G^{-T}`: how the element acts on the axes that *read* what `g` acts on."""
    return group.structure.inverse_transpose(g)


def random_element(group: Group, gen: torch.Generator, spread: float = 2.0) -> torch.Tensor:
    """A random element, well away from the identity; scales lie in [1/spread, spread]."""
    return group.structure.random(group, gen, spread)


def membership_error(group: Group, g: torch.Tensor) -> float:
    """0 for an exact member; otherwise the largest violation of the group's defining equations."""
    expected = group.structure.element_shape(group)
    if tuple(g.shape) != expected:
        raise SymmergeError(f"element of {group.name} has shape {tuple(g.shape)}, expected {expected}")
    return group.structure.membership_error(group, g)
