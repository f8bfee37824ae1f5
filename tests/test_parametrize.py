"""Every parameterisation stays in its group, represents planted elements, and refuses what it cannot do."""

from __future__ import annotations

import pytest
import torch

from symmerge import SymmergeError
from symmerge.algebra import groups as G
from symmerge.match.parametrize import ADMITS, greedy_signs, parametrization, resolve_methods

GROUPS = {
    "orth": G.Group("orth", "residual_rotation", "orthogonal", 5, batch=(2,)),
    "orth_ones": G.Group("orth_ones", "residual_rotation", "orthogonal", 6, constraints=("fixes_ones",)),
    "inv": G.Group("inv", "qk_map", "invertible", 4, batch=(3,)),
    "rope_partial": G.Group("rope_partial", "qk_map", "invertible", 6, batch=(2,), constraints=("rope",), rotary_dims=4),
    "rope_full": G.Group("rope_full", "qk_map", "invertible", 4, batch=(2,), constraints=("rope",), rotary_dims=4),
    "diag": G.Group("diag", "glu_scale", "diagonal", 5),
    "diag_pos": G.Group("diag_pos", "glu_scale", "diagonal", 5, constraints=("positive",)),
    "scalar": G.Group("scalar", "residual_scale", "scalar", 1, constraints=("positive",)),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


CASES = [(n, m) for n, g in GROUPS.items() for m in ADMITS.get(g.kind, ("log",))]


def _core(group: G.Group, x: torch.Tensor) -> torch.Tensor:
    """The unconstrained block a parameterisation works on (R of a fixes-ones rotation, the free RoPE block)."""
    if "fixes_ones" in group.constraints:
        u = G.ones_complement_basis(group.size)
        return u.T @ x @ u
    if "rope" in group.constraints:
        return x[..., group.rotary_dims:, group.rotary_dims:]
    return x


def _reachable(group: G.Group, method: str, x: torch.Tensor) -> bool:
    """Independent statement of each method's reach: Cayley misses eigenvalue -1 (so reflections), exp
    reaches matrices with a real logarithm (no eigenvalue on the negative real axis, generically)."""
    if group.kind in ("scalar", "diagonal") or method in ("cayley-signs", "polar", "direct"):
        return True
    core = _core(group, x)
    if core.shape[-1] == 0:
        return True
    ev = torch.linalg.eigvals(core)
    if method == "cayley":
        return bool(((ev + 1).abs() > 1e-6).all())
    on_negative_axis = (ev.real < 0) & (ev.imag.abs() < 1e-9)
    return bool(torch.linalg.det(core).min() > 0) and not bool(on_negative_axis.any())


@pytest.mark.parametrize("name,method", CASES)
def test_planted_element_is_reproduced(name, method):
    group = GROUPS[name]
    p = parametrization(group, method)
    reproduced = 0
    for seed in range(60):  # elements outside a method's reach must be refused; stop after 3 inside it
        if reproduced == 3:
            break
        x = G.random_element(group, torch.Generator().manual_seed(seed))
        if not _reachable(group, method, x):
            with pytest.raises(SymmergeError):
                p.from_element(x)
            continue
        raw, fixed = p.from_element(x)
        y = p.element(raw, fixed)
        assert float((y - x).abs().max()) < 1e-9, f"{name}/{method} seed {seed}: element not reproduced"
        # negative control: the element is made from the raw parameters (not carried whole in `fixed`): moved
        # by 1e-3 they give another element, which the 1e-9 check would refuse
        moved = p.element({k: v + 1e-3 for k, v in raw.items()}, fixed)
        assert float((moved - x).abs().max()) > 1e-5, f"{name}/{method} seed {seed}: element ignores its parameters"
        reproduced += 1
    assert reproduced >= 2, f"{name}/{method}: too few planted elements in reach to test"
    raw, fixed = p.identity()
    ident = p.element(raw, fixed)
    if "fixes_ones" in group.constraints:  # 11^T/n + U U^T is the identity up to rounding
        assert float((ident - G.identity(group)).abs().max()) < 1e-15
    else:
        assert torch.equal(ident, G.identity(group)), "identity() must be exact"


def _adam_walk(p, steps: int, lr: float, seed: int, objective=None):
    """Adam on the raw tensors; random linear gradients unless an objective(element) is given."""
    raw, fixed = p.identity()
    for t in raw.values():
        t.requires_grad_(True)
    opt = torch.optim.Adam(list(raw.values()), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for t in range(steps):
        if objective is not None:  # decay to settle on the optimum; random walks keep the large lr
            opt.param_groups[0]["lr"] = lr * (1 - t / steps)
        opt.zero_grad()
        x = p.element(raw, fixed)
        loss = objective(x) if objective else (x * torch.randn(x.shape, generator=gen, dtype=x.dtype)).sum()
        loss.backward()
        opt.step()
        if objective is None:
            worst = max(worst, G.membership_error(p.group, x.detach()))
    return p.element(raw, fixed).detach(), worst


@pytest.mark.parametrize("name,method", CASES)
def test_stays_in_group_under_large_adam_steps(name, method):
    """1000 Adam steps at a large lr (0.5 for Cayley, 0.2 for expm) on random gradients keep rotations
    orthogonal to 1e-5; the other kinds hold their structure and (invertible) stay invertible over
    300 steps at lr 0.05."""
    group = GROUPS[name]
    steps, lr = (1000, 0.2 if method == "expm" else 0.5) if group.kind == "orthogonal" else (300, 0.05)
    x, worst = _adam_walk(parametrization(group, method), steps, lr, seed=1)
    assert worst <= 1e-5 and G.membership_error(group, x) <= 1e-5, f"{name}/{method}: left the group ({worst:.2e})"
    assert float((x - G.identity(group)).abs().max()) > 0.1, "the walk did not move: the check above proves nothing"
    if group.kind == "invertible":
        assert float(torch.linalg.cond(x).max()) < 1e8, f"{name}/{method}: ill conditioned after the walk"


@pytest.mark.parametrize("name,method", [(n, m) for n, m in CASES if GROUPS[n].kind == "invertible"])
def test_invertible_fit_stays_well_conditioned(name, method):
    """A real objective (fit a planted element from the identity) reaches it, and the conditioning of
    every iterate stays well conditioned (condition number < 1e3 on 4x4 and 6x6 maps whose targets
    have about 2-5). The target is a random element in the
    method's reach with det > 0; for expm its square root exp(log(T)/2), so that the path from I is short."""
    group = GROUPS[name]
    p = parametrization(group, method)
    for seed in range(60):
        target = G.random_element(group, torch.Generator().manual_seed(seed), spread=1.5)
        if _reachable(group, method, target) and bool(torch.linalg.det(_core(group, target)).min() > 0):
            break  # a continuous path from I stays where det > 0
    if method == "expm":
        raw, fixed = p.from_element(target)
        target = p.element({k: 0.5 * v for k, v in raw.items()}, fixed)
    conds = []

    def objective(x):
        conds.append(float(torch.linalg.cond(x.detach()).max()))
        return ((x - target) ** 2).sum()

    x, _ = _adam_walk(p, 1000, 0.05, seed=0, objective=objective)
    start = float((G.identity(group) - target).abs().max())
    err = float((x - target).abs().max())  # polar converges slowly (Q times LL^T): 2e-2 after 1000 steps
    assert err < 0.05 * start, f"{name}/{method}: planted element not reached ({err:.2e} of {start:.2e})"
    # direct is a free matrix: nothing keeps its path away from singular matrices (measured: 1100x the
    # target's condition number on the way for inv); only its endpoint is checked
    worst = conds[-1] if method == "direct" else max(conds)
    assert worst < 1e3, f"{name}/{method}: condition number {worst:.1f} on the way (target {max(conds[-1], 1):.1f})"
    inv = torch.linalg.inv(x)
    assert float((x @ inv - torch.eye(group.size, dtype=x.dtype)).abs().max()) < 1e-10


def test_greedy_signs_make_any_rotation_a_cayley_image():
    for seed in range(5):
        q = G.random_element(G.Group("o", "x", "orthogonal", 7), torch.Generator().manual_seed(seed))
        d = greedy_signs(q)
        assert set(d.tolist()) <= {-1.0, 1.0}
        assert float(torch.linalg.det(torch.eye(7, dtype=q.dtype) + d[:, None] * q).abs()) >= 1.0
    # negative control: a reflection is never a Cayley image with all signs +1
    refl = torch.diag(torch.tensor([-1.0, 1, 1], dtype=G.DTYPE))
    assert float(torch.linalg.det(torch.eye(3, dtype=G.DTYPE) + refl)) == 0.0


def test_gradients_reach_every_raw_tensor():
    for name, method in CASES:
        p = parametrization(GROUPS[name], method)
        raw, fixed = p.from_element(G.random_element(GROUPS[name], torch.Generator().manual_seed(3)) if method in
                                    ("cayley-signs", "polar", "direct", "log") else G.identity(GROUPS[name]))
        for t in raw.values():
            t.requires_grad_(True)
        x = p.element(raw, fixed)
        (x * torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)).sum().backward()
        for k, t in raw.items():
            assert t.grad is not None and torch.isfinite(t.grad).all() and float(t.grad.abs().max()) > 0, f"{name}/{method}/{k}"


def test_unadmitted_parameterisations_are_refused():
    with pytest.raises(SymmergeError, match="does not keep orth"):
        parametrization(GROUPS["orth"], "direct")
    with pytest.raises(SymmergeError, match="orthogonal groups admit"):
        parametrization(GROUPS["orth_ones"], "polar")
    with pytest.raises(SymmergeError, match="invertible groups admit"):
        parametrization(GROUPS["inv"], "cayley")
    with pytest.raises(SymmergeError, match="unknown parameterisation"):
        parametrization(GROUPS["inv"], "qr")
    with pytest.raises(SymmergeError, match="discrete"):
        parametrization(G.Group("p", "ffn_perm", "permutation", 4), "cayley")
    signed = G.Group("s", "qk_map", "invertible", 4, constraints=("signed_permutation",))
    with pytest.raises(SymmergeError, match="discrete"):
        parametrization(signed, "polar")


def test_resolve_methods():
    groups = {n: GROUPS[n] for n in ("orth_ones", "inv", "diag", "scalar")}
    assert resolve_methods(groups, "auto") == {"orth_ones": "cayley", "inv": "polar", "diag": "log", "scalar": "log"}
    assert resolve_methods(groups, "expm")["inv"] == "expm"
    mixed = resolve_methods(groups, "residual_rotation=cayley-signs,qk_map=direct")
    assert mixed["orth_ones"] == "cayley-signs" and mixed["inv"] == "direct"
    with pytest.raises(SymmergeError, match="qk_map=expm"):
        resolve_methods(groups, "cayley")  # the invertible QK map does not admit Cayley: say how to choose per family
    with pytest.raises(SymmergeError, match="not being learned"):
        resolve_methods(groups, "ov_map=polar")
    with pytest.raises(SymmergeError, match="unknown parameterisation"):
        resolve_methods(groups, "qk_map=nope")
