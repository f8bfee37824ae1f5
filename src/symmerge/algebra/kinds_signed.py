"""The discrete sign kinds (see `kinds.py` for what a kind is): maps that are signed permutation matrices.

| object               | group                                                   | where                          |
|----------------------|---------------------------------------------------------|--------------------------------|
| `SignedPermutations` | "signed_permutation": signed permutation matrices       | OLMo `clip_qkv`, no RoPE       |
| `SignedRope`         | "rope" and "signed_permutation": quarter turns per pair | OLMo `clip_qkv` with RoPE      |
| `PairSigns`          | "qk_norm" (and "rope"): ±1 diagonals, equal on a pair   | QK-norm (Qwen3, OLMo-2)        |
| `SignedPermutationMatrices` | orthogonal "signed_permutation"                  | the residual under post-norms  |

Every element is orthogonal with entries in {-1, 0, 1}, so `G^{-T} = G`; none has a parameterisation
(learned matching keeps them fixed), and weight matching solves each exactly (`match/solvers.py`).
"""

from __future__ import annotations

import math

import torch

from .kinds import DTYPE, Invertible, Orthogonal, RopeCommuting


def _random_signed_permutation(n: int, gen: torch.Generator, batch) -> torch.Tensor:
    mats = []
    for _ in range(math.prod(batch)):
        p = torch.randperm(n, generator=gen)
        s = torch.randint(0, 2, (n,), generator=gen).to(DTYPE) * 2 - 1
        mats.append(torch.nn.functional.one_hot(p, n).to(DTYPE) * s[:, None])
    return torch.stack(mats).reshape(*batch, n, n) if batch else mats[0]


def _signed_error(g: torch.Tensor) -> float:
    """0 exactly when every row of `g` has one entry ±1 and zeros elsewhere."""
    return float((g.abs().sum(-1) - 1).abs().max() + (g.abs().round() - g.abs()).abs().max())


class _AnySignedPermutation:
    """Every signed permutation matrix (mixed into an invertible or orthogonal kind, which checks the rest)."""

    discrete = True

    def random(self, group, gen, spread):
        return _random_signed_permutation(group.size, gen, group.batch)

    def membership_error(self, group, g):
        return max(super().membership_error(group, g), _signed_error(g))

    def order_note(self, group):
        return f"signed permutations of {group.size}"


class SignedPermutations(_AnySignedPermutation, Invertible):
    """clip_qkv clamps q, k, v elementwise: only signed permutations commute with it."""

    solver = "signed_permutation"


class SignedRope(RopeCommuting):
    """clip_qkv with RoPE: quarter turns on each rotary pair, a signed permutation on the other dims."""

    discrete, solver = True, "signed_rope"

    def random(self, group, gen, spread):
        n, b, r = group.size, group.batch, group.rotary_dims
        k = torch.randint(0, 4, (*b, r // 2), generator=gen).to(DTYPE) * (math.pi / 2)
        a, bb = torch.round(torch.cos(k)), torch.round(torch.sin(k))
        free = _random_signed_permutation(n - r, gen, b) if n > r else torch.zeros(*b, 0, 0, dtype=DTYPE)
        return group.pairing.blocks(n, a, bb, free)

    def membership_error(self, group, g):
        return max(super().membership_error(group, g), _signed_error(g))

    def dimension(self, group):
        return 0

    def order_note(self, group):
        return f"signed permutations of {group.size}"


class PairSigns(SignedRope):
    """QK-norm (RMSNorm with weights γ on q and k before RoPE): a sign on each rotary pair (a half turn) and on
    each other dim. M must keep the RMS (orthogonal) and `diag(γ) M diag(γ)^{-1}` must commute with RoPE:
    for generic γ only these diagonals do, and they do for every γ (`spec._qk_note`, tests/test_qk_norm.py)."""

    solver = "pair_signs"

    def random(self, group, gen, spread):
        n, b = group.size, group.batch
        s = torch.randint(0, 2, (*b, n), generator=gen).to(DTYPE) * 2 - 1
        if group.pairing is not None:
            s[..., group.pairing.second] = s[..., group.pairing.first]
        return torch.diag_embed(s)

    def membership_error(self, group, g):
        d = torch.diagonal(g, dim1=-2, dim2=-1)
        err = max(Invertible.membership_error(self, group, g), _signed_error(g),
                  float((g - torch.diag_embed(d)).abs().max()))
        if group.pairing is not None:
            err = max(err, float((d[..., group.pairing.first] - d[..., group.pairing.second]).abs().max()))
        return err

    def order_note(self, group):
        pairs = group.rotary_dims // 2
        return f"signs of {pairs} rotary pairs and {group.size - group.rotary_dims} other dims"


class SignedPermutationMatrices(_AnySignedPermutation, Orthogonal):
    """The residual group under post-norms (OLMo-2): `x + γ ⊙ rms(y)` commutes with O exactly when
    `O diag(γ) = diag(γ') O'` for an orthogonal O' acting on y; for generic γ, O is a signed permutation
    `P S`, y moves by it too and γ by P alone (the "abs" action: `|O| γ`)."""

    solver = "signed_assignment"

    def dimension(self, group):
        return 0
