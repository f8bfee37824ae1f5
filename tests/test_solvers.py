"""The per-group solvers: exact minimisers, checked against brute force and planted solutions."""

from __future__ import annotations

import itertools

import pytest
import torch

from symmerge.algebra import groups as G
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
    assert float((found.T - o).abs().max()) > 1e-3  # negative control: the transposed (inverse) rotation


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


def _padded(gen, n: int, r: int, m: int) -> torch.Tensor:
    """[n, m] with data in the first r rows and zeros below (an expanded model's zero-padded head dimensions)."""
    return torch.cat([torch.randn(r, m, generator=gen, dtype=torch.float64), torch.zeros(n - r, m, dtype=torch.float64)])


def _map_objective(g, xa, xb, ya, yb) -> float:
    """The true objective `||G xb - xa||^2 + ||G^{-T} yb - ya||^2`."""
    return float(((g @ xb - xa) ** 2).sum() + ((torch.linalg.inv(g).transpose(-1, -2) @ yb - ya) ** 2).sum())


@pytest.mark.parametrize("seed", range(4))
def test_balanced_lstsq_on_zero_padded_directions_beats_the_identity_and_a_near_map(seed):
    """B with data in r of n directions, A with data everywhere (a wide model against an expanded narrow one):
    A is a rotation of B's data plus noise, so the rotation is a good member and the identity a poor one.
    The map found must beat both (before the fix, the full-space solve completed by the identity on B's
    empty directions cost 100x the identity: the inverse side was pinned to B's own r directions)."""
    gen = torch.Generator().manual_seed(10 + seed)
    n, r, m = 8, 4, 30
    xb, yb = _padded(gen, n, r, m), _padded(gen, n, r, m)
    q = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))[0]
    noise = lambda: 0.3 * torch.randn(n, m, generator=gen, dtype=torch.float64)  # noqa: E731
    xa, ya = q @ xb + noise(), q @ yb + noise()
    found = balanced_lstsq(xa, xb, ya, yb)
    got = _map_objective(found, xa, xb, ya, yb)
    assert got <= _map_objective(q, xa, xb, ya, yb) and got < _map_objective(torch.eye(n, dtype=torch.float64), xa, xb, ya, yb)
    assert float(torch.linalg.svdvals(found).min()) > 1e-3  # invertible, not merely refused later


def test_balanced_lstsq_on_zero_padded_directions_is_exact_for_a_planted_map():
    """Batched: a head with empty directions, one with data everywhere and a zero head. Where B has data, the
    planted map's action on B is recovered exactly (on B's empty directions any completion is as good); a zero
    head gets the identity."""
    gen = torch.Generator().manual_seed(5)
    n, r, m = 8, 3, 20
    grp = G.Group("m", "qk_map", "invertible", n, batch=(3,))
    mp = G.random_element(grp, gen)
    xb = torch.stack([_padded(gen, n, r, m), torch.randn(n, m, generator=gen, dtype=torch.float64), torch.zeros(n, m, dtype=torch.float64)])
    yb = torch.stack([_padded(gen, n, r, m), torch.randn(n, m, generator=gen, dtype=torch.float64), torch.zeros(n, m, dtype=torch.float64)])
    inv_t = lambda g: torch.linalg.inv(g).transpose(-1, -2)  # noqa: E731
    xa, ya = mp @ xb, inv_t(mp) @ yb
    found = balanced_lstsq(xa, xb, ya, yb)
    eps = torch.finfo(torch.float64).eps
    scale = float(xa.abs().max() + ya.abs().max())
    assert float((found @ xb - xa).abs().max()) < 1e4 * eps * scale
    assert float((inv_t(found) @ yb - ya).abs().max()) < 1e4 * eps * scale
    assert float((found[2] - torch.eye(n, dtype=torch.float64)).abs().max()) == 0.0
    # negative control: the planted map's inverse does not reproduce A
    assert float((inv_t(mp) @ xb - xa).abs().max()) > 1e-3
