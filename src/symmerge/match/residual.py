"""The residual rotation and scale given every other group: sufficient statistics, accumulated part by part.

For a tensor T the residual rotation R acts on (R T along the residual axis for writers, R^{-T} T = R T
for readers, since R is orthogonal) and the scale `a` multiplies (writers only), the squared distance is

    ||A_T - a R X_T||^2 = ||A_T||^2 + a^2 ||X_T||^2 - 2 a <R, A_T X_T^T>

with X_T = B's tensor under every *other* group (flattened to `[d, m]` along the residual axis); a tensor
the rotation acts on by `|R|` (post-norm weights, under signed permutations) adds `-2 <|R|, A_T X_T^T>`. So
the whole objective in (R, a) is a function of two d x d cross-covariances (scaled and unscaled
tensors), two norms and a constant, summed over the model: `ResidualFit.add` takes one part at a
time (the embeddings, one block, the head), which is what lets weight matching stream a checkpoint
that does not fit in memory. `solve` alternates the two exact minimisers (Procrustes for R given a,
an assignment when R is restricted to permutations; least squares for a given R), each of which can
only lower the objective.
"""

from __future__ import annotations

import math

import torch

from ..algebra import groups as G
from ..algebra.spec import ROTATION, SCALE, Spec
from .costs import along
from .norms import sqdist, sqnorm
from .solvers import best_rotation
from .weight_products import EXACT, Products, cross


class ResidualFit:
    """`device`: where the cross-covariances' products and the Procrustes solves run (None: where the tensors
    are); the statistics themselves stay on the CPU in float64."""

    def __init__(self, spec: Spec, device: torch.device | None = None):
        self.spec, self.device = spec, device
        d = spec.shape.d_model
        self.c = {True: torch.zeros(d, d, dtype=G.DTYPE), False: torch.zeros(d, d, dtype=G.DTYPE)}  # by "scaled"
        self.c_abs = torch.zeros(d, d, dtype=G.DTYPE)  # tensors acted on by |R| (never scaled)
        self.bb = {True: [], False: []}  # ||X_T||^2 terms
        self.aa: list[float] = []  # ||A_T||^2 over every weight
        self.aa_moved: list[float] = []  # ||A_T||^2 over the tensors the residual groups act on
        self.const: list[float] = []  # squared distances of tensors the residual groups leave alone

    def add(self, A: dict, X: dict) -> None:
        """One part: A's tensors and B's under every group but the residual ones."""
        for name, a in A.items():
            if a.dim() == 0:  # norm.eps: a config value, not a weight
                continue
            x = X[name]
            self.aa.append(sqnorm(a))
            rot = next((act for act in self.spec.actions[name] if act.group == ROTATION), None)
            if rot is None:
                self.const.append(sqdist(a, x))
                continue
            self.aa_moved.append(self.aa[-1])
            scaled = any(act.group == SCALE for act in self.spec.actions[name])
            xa, xb = along(a, rot), along(x, rot)
            c = cross(xa, xb, Products(EXACT, self.device)).to(G.DTYPE)
            if rot.how == "abs":
                self.c_abs += c
            else:
                self.c[scaled] += c
            self.bb[scaled].append(sqnorm(xb))

    def add_distances(self, A: dict, Y: dict) -> None:
        """One part's squared distances at one element: A's tensors and B's under the *whole* element.

        Cheaper than `add` (no cross-covariance), but these terms are constants: `distance` is then
        exact only at the residual element Y was moved by (the starting objective)."""
        for name, a in A.items():
            if a.dim() > 0:
                self.aa.append(sqnorm(a))
                self.const.append(sqdist(a, Y[name]))

    def merge(self, other: ResidualFit) -> None:
        """Add another fit's statistics (the parts it saw) to this one."""
        for k in self.c:
            self.c[k] += other.c[k]
            self.bb[k] += other.bb[k]
        self.c_abs += other.c_abs
        self.aa += other.aa
        self.aa_moved += other.aa_moved
        self.const += other.const

    def norm2(self) -> float:
        return math.fsum(self.aa)

    def distance(self, r: torch.Tensor, a: torch.Tensor) -> float:
        """The squared distance of every tensor added, under rotation `r` and scale `a`."""
        a = float(a)
        inner = a * float((r * self.c[True]).sum()) + float((r * self.c[False]).sum()) + float((r.abs() * self.c_abs).sum())
        return math.fsum([*self.aa_moved, *(a * a * v for v in self.bb[True]), *self.bb[False], *self.const, -2 * inner])

    def solve(self, r: torch.Tensor, a: torch.Tensor, rotation: bool, scale: bool, iters: int = 50, rtol: float = 1e-12):
        """(r, a) lowering `distance`, starting from the given ones; only the chosen groups move.

        With both, the two exact steps alternate until the objective gains less than `rtol * ||A||^2`."""
        bb = math.fsum(self.bb[True])
        best = self.distance(r, a)
        for _ in range(iters if rotation and scale else 1):
            if rotation:
                r = best_rotation(self.spec.groups[ROTATION], float(a) * self.c[True] + self.c[False], self.device,
                                  self.c_abs if bool(self.c_abs.ne(0).any()) else None)
            if scale and bb > 0:
                q = float((r * self.c[True]).sum())
                a = torch.tensor(q / bb, dtype=G.DTYPE) if q > 0 else a  # the scale must stay positive
            now = self.distance(r, a)
            if best - now <= rtol * self.norm2():
                break
            best = now
        return r, a
