"""The per-group solvers: exact minimisers, checked against brute force and planted solutions."""

from __future__ import annotations

import itertools

import pytest
import torch

from symmerge import groups as G
from symmerge.match.solvers import balanced_lstsq, best_scale, linear_assignment, procrustes, solve_map


def test_best_scale_beats_a_dense_grid():
    gen = torch.Generator().manual_seed(0)
    p, s = torch.rand(50, generator=gen, dtype=torch.float64) + 0.1, torch.rand(50, generator=gen, dtype=torch.float64) + 0.1
    q, t = torch.randn(50, generator=gen, dtype=torch.float64), torch.randn(50, generator=gen, dtype=torch.float64)
    f = lambda d: p * d**2 - 2 * q * d + s / d**2 - 2 * t / d  # noqa: E731
    d = best_scale(p, q, s, t)
    grid = torch.cat([-torch.logspace(-3, 3, 4001, dtype=torch.float64), torch.logspace(-3, 3, 4001, dtype=torch.float64)])
    brute = torch.stack([f(x) for x in grid]).min(0).values
    assert bool((f(d) <= brute + 1e-9).all())
    dp = best_scale(p, q, s, t, positive=True)
    assert bool((dp > 0).all())
    brute_pos = torch.stack([f(x) for x in grid[4001:]]).min(0).values
    assert bool((f(dp) <= brute_pos + 1e-9).all())
    assert not bool((f(-d) <= brute + 1e-9).all())  # negative control


def test_linear_assignment_is_optimal_by_enumeration():
    s = torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    best = max(itertools.permutations(range(6)), key=lambda p: float(s[torch.arange(6), torch.tensor(p)].sum()))
    assert linear_assignment(s).tolist() == list(best)


@pytest.mark.parametrize("fixes_ones", [False, True])
def test_procrustes_recovers_a_planted_rotation(fixes_ones):
    gen = torch.Generator().manual_seed(2)
    grp = G.Group("r", "residual_rotation", "orthogonal", 7, constraints=("fixes_ones",) if fixes_ones else ())
    o = G.random_element(grp, gen)
    x = torch.randn(7, 30, generator=gen, dtype=torch.float64)
    found = procrustes((o @ x) @ x.T, fixes_ones)
    assert float((found - o).abs().max()) < 1e-12
    assert G.membership_error(grp, found) < 1e-12


@pytest.mark.parametrize("constraints,rotary", [((), 0), (("rope",), 4), (("rope",), 6), (("signed_permutation",), 0),
                                                 (("rope", "signed_permutation"), 4)])
def test_solve_map_recovers_planted_maps(constraints, rotary):
    """`Xa = M Xb`, `Ya = M^{-T} Yb` for a random member M: found exactly, and in the group."""
    gen = torch.Generator().manual_seed(3)
    grp = G.Group("m", "qk_map", "invertible", 6, batch=(3,), constraints=constraints, rotary_dims=rotary)
    m = G.random_element(grp, gen)
    xb, yb = torch.randn(3, 6, 20, generator=gen, dtype=torch.float64), torch.randn(3, 6, 9, generator=gen, dtype=torch.float64)
    xa, ya = m @ xb, torch.linalg.inv(m).transpose(-1, -2) @ yb
    found = solve_map(grp, xa, xb, ya, yb)
    assert float((found - m).abs().max()) < 1e-9
    assert G.membership_error(grp, found) < 1e-9
    # negative control: A and B swapped gives the inverse, which is not M
    assert float((solve_map(grp, xb, xa, yb, ya) - m).abs().max()) > 1e-3


def test_balanced_lstsq_stays_well_conditioned_on_unrelated_data():
    """Unrelated A and B: the fit must not collapse towards 0 (which G^{-T} would blow up)."""
    gen = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    g = balanced_lstsq(r(8, 50), r(8, 50), r(8, 50), r(8, 50))
    sv = torch.linalg.svdvals(g)
    assert float(sv.min()) > 0.2 and float(sv.max()) < 5
