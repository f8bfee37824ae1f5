"""The rotary pairing: which dimensions of a head RoPE rotates together, read from `ModelShape.rotary_layout`.

RoPE rotates the first `dims` dimensions of each query and key head in pairs, pair k by the angle
`position * freq_k`; the other dimensions pass through. The layout says which two dimensions make
pair k (k < dims/2):

| layout        | pair k           | stock code                                   |
|---------------|------------------|----------------------------------------------|
| "half"        | (k, k + dims/2)  | `rotate_half` (Llama, GPT-NeoX, OLMo)         |
| "interleaved" | (2k, 2k + 1)     | `rotate_every_two` (GPT-J)                   |

A map commutes with every position's rotation exactly when it is a scaled rotation
`[[a, -b], [b, a]]` on each pair, any invertible block on the pass-through dimensions, and zero
between them (the pairs' frequencies differ, so no cross terms survive). This module is the one
place that knows the layouts; everything that builds or reads such a map goes through `Pairing`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SymmergeError
from .kinds import DTYPE

LAYOUTS = ("half", "interleaved")


@dataclass(frozen=True)
class Pairing:
    """The rotary pairs of a head whose first `dims` dimensions RoPE rotates in `layout`."""

    dims: int
    layout: str = "half"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise SymmergeError(f"rotary layout {self.layout!r} is not implemented; symmerge knows {', '.join(LAYOUTS)}")
        if self.dims % 2:
            raise SymmergeError(f"rotary dimension {self.dims} is odd; RoPE needs pairs")

    @property
    def first(self) -> torch.Tensor:
        """Index of the first dimension of each pair, `[dims/2]` (it takes `x cos - y sin`)."""
        k = torch.arange(self.dims // 2)
        return k if self.layout == "half" else 2 * k

    @property
    def second(self) -> torch.Tensor:
        """Index of the second dimension of each pair, `[dims/2]`."""
        k = torch.arange(self.dims // 2)
        return k + self.dims // 2 if self.layout == "half" else 2 * k + 1

    def blocks(self, n: int, a: torch.Tensor, b: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
        """The `[*batch, n, n]` map with `[[a, -b], [b, a]]` on each pair and `free` on dims..n.

        a, b: `[*batch, dims/2]`; free: `[*batch, n - dims, n - dims]`. Commutes with RoPE (module docstring).
        """
        f, s, r = self.first, self.second, self.dims
        m = torch.zeros(*a.shape[:-1], n, n, dtype=DTYPE)
        m[..., f, f] = a
        m[..., s, s] = a
        m[..., f, s] = -b
        m[..., s, f] = b
        m[..., r:, r:] = free
        return m

    def pairs(self, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(a, b)` of each pair's block of `m [*batch, n, n]` (exact when `m` commutes with RoPE)."""
        f, s = self.first, self.second
        return m[..., f, f], m[..., s, f]

    def free(self, m: torch.Tensor) -> torch.Tensor:
        """The block of `m` on the pass-through dimensions, `[*batch, n - dims, n - dims]`."""
        return m[..., self.dims :, self.dims :]

    def pair_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of `x [.., n, m]` by pair as `[.., dims/2, 2, m]`, and `J` applied to each pair
        (`J = [[0, -1], [1, 0]]`, the generator of the pair's rotations)."""
        p = torch.stack([x[..., self.first, :], x[..., self.second, :]], dim=-2)
        jp = torch.stack([-p[..., 1, :], p[..., 0, :]], dim=-2)
        return p, jp
