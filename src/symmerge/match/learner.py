"""The learner of learned / dual matching: the frozen models, the learned group elements (one slot per
learned group and side) and the loss of the interpolated model (see `learned.py` for the method).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..algebra import groups as G
from ..algebra.apply import Prepared, StraightThrough, apply
from ..algebra.elements import compose, identity_element
from ..algebra.spec import SCALE, Spec
from ..errors import SymmergeError
from ..store.compatible import check_compatible
from ..store.parts import part_keys, part_of
from .blockwise import BlockwiseForward, PartFn
from .frozen import fill
from .learn_config import DTYPES, LearnConfig, parse_lr_scale
from .objectives import PathObjective
from .parametrize import Parametrization, learnable, parametrization, resolve_methods, straight_through
from .sharded import frozen


@dataclass
class Slot:
    """One learned group on one side: a parameterisation, or a straight-through permutation latent."""

    side: str
    group: str
    param: Parametrization | None
    raw: dict[str, torch.Tensor]
    fixed: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.side}.{self.group}"


def trainables(slots: list[Slot]) -> dict[str, torch.Tensor]:
    """The learned tensors of `slots`, named `side.group.key` (the names a checkpoint keeps them under)."""
    return {f"{s.key}.{k}": t for s in slots for k, t in sorted(s.raw.items())}


def rate_groups(slots: list[Slot], spec: Spec, lr_scale: str | None) -> list[tuple[float, list[str]]]:
    """The trainable tensors' names (as `trainables` names them) grouped by their family's rate factor
    (`LearnConfig.lr_scale`; 1 where not named), first appearance first and `trainables`' order within a group:
    with no factor given, one group holding every name in `trainables`' order. Naming a family that none of
    `slots` learns is an error (a factor that would silently do nothing)."""
    scales = parse_lr_scale(lr_scale)
    learned = {spec.groups[s.group].family for s in slots}
    unknown = sorted(set(scales) - learned)
    if unknown:
        raise SymmergeError(f"--lr-scale names {', '.join(unknown)}, not learned here; the learned families are "
                            f"{', '.join(sorted(learned))}")
    groups: dict[float, list[str]] = {}
    for s in slots:
        factor = scales.get(spec.groups[s.group].family, 1.0)
        groups.setdefault(factor, []).extend(f"{s.key}.{k}" for k in sorted(s.raw))
    return list(groups.items())


def lap(latent: torch.Tensor) -> torch.Tensor:
    """Hard permutation (index vector) maximising sum_i L[i, p[i]], batched over leading axes.

    When every row's maximum sits in a different column, the row-wise argmax is that permutation (no
    assignment can beat each row's maximum); the exact solver runs only when rows compete. Latents
    start one-hot and move slowly, so most steps take the shortcut.
    """
    flat = latent.detach().reshape(-1, *latent.shape[-2:]).cpu().numpy()  # scipy solves on the CPU
    rows = []
    for x in flat:
        best = x.argmax(axis=1)
        rows.append(best if np.unique(best).size == best.size else linear_sum_assignment(x, maximize=True)[1])
    return torch.as_tensor(np.stack(rows), dtype=torch.int64).reshape(latent.shape[:-1]).to(latent.device)


def select(stored: dict, rows: dict | None, dtype) -> dict:
    """The tensors of a stored part in `dtype` (0-dim ones left out), or with `rows` only those it names,
    each restricted to its rows of axis 0 (`blockwise.PartFn`)."""
    if rows is None:
        return {k: v.to(dtype) for k, v in stored.items() if v.dim() > 0}
    return {k: (stored[k] if r is None else stored[k][r]).to(dtype) for k, r in rows.items()}


def param_dtype(forward: torch.dtype) -> torch.dtype:
    """The dtype of the continuous groups' parameters and their Adam state: float64, or float32 when the forward
    runs in 16 bits. Its gradients then carry the forward's rounding (bf16: 8 significant bits), which float32's 24
    hold with room to spare, and the parameters and optimiser state take half the memory (at Pythia-1.4B shape,
    dual: 48M parameters, 1.5 GB of parameters, gradients and moments in float64). The elements are still built in
    float64 from them, and the outputs' elements checked members there."""
    return torch.float32 if torch.finfo(forward).bits <= 16 else G.DTYPE


def prepare(spec: Spec, g: dict, fixed_groups, identity: dict, dtype, device) -> dict:
    """An element as it acts in the forward: continuous maps with their inverse transposes worked out in
    float64 and cast to the forward's `dtype` and `device` (`apply.Prepared`), permutations moved there; fixed
    groups at the identity (dual: the absorbed permutations) left out, so they make no copies."""
    out = {}
    for n, t in g.items():
        if n in fixed_groups and torch.equal(t, identity[n]):
            continue
        if isinstance(t, StraightThrough):
            out[n] = StraightThrough(t.index.to(device), t.latent.to(device))
        elif t.is_floating_point():
            out[n] = Prepared.of(spec.groups[n], t, dtype, device)
        else:
            out[n] = t.to(device)
    return out


def mix(a: dict, b: dict, lam) -> dict:
    """(1 - lam)·a + lam·b tensor by tensor, each in one pass (`torch.lerp`: one new tensor and one rounding, where
    the sum made three tensors, each a fresh mapping the kernel zeroes, and rounded three times in 16 bits); exact
    a's or b's values at lam 0 and 1 where both are finite. A 0-dim value equal on both sides (the canonical
    `norm.eps`) is kept as it is, as `evaluation.interpolate` keeps it."""
    w = float(lam)
    return {k: a[k] if a[k].dim() == 0 and torch.equal(a[k], b[k]) else torch.lerp(a[k], b[k], w) for k in a}


def eps_scale(spec: Spec, eps0: float, eps: list, scales: list, weights: list, dtype, device):
    """The residual scale c = sqrt(eps0 / eps) that brings the mixture's eps (each model's `eps` moved by its
    element's residual scale, None for none, then mixed with `weights`) to the forward's config eps `eps0`
    (see `evaluation.at_eps`); None where it is exactly 1 (no residual scale learned nor absorbed)."""
    moved = [e if a is None else apply(spec, {SCALE: a}, {"norm.eps": e})["norm.eps"] for e, a in zip(eps, scales)]
    mixed = moved[0] if all(torch.equal(m, moved[0]) for m in moved[1:]) else sum(w * m for w, m in zip(weights, moved))
    c = torch.sqrt(eps0 / mixed)
    if not c.requires_grad and float(c) == 1.0:
        return None
    return c.to(device=device, dtype=dtype)


def _check_element(spec: Spec, g: dict, what: str) -> None:
    missing = [n for n in spec.groups if n not in g]
    if missing:
        raise SymmergeError(f"{what} has no entry for groups {missing[:3]}")
    for n, grp in spec.groups.items():
        err = G.membership_error(grp, g[n])
        if err > 1e-6:
            raise SymmergeError(f"{what}: {n} is not in its group (error {err:.2e})")


class Learner:
    """Holds the frozen models, the slots and the objective; `run` trains (see the module docstring).

    `a`, `b`: `Model`s, or `LazyModel`s (read block by block from their files, never wholly in float64).
    The endpoints are kept frozen in their checkpoint's dtype on `cfg.device` (`frozen.Frozen`; dual:
    B with `init` absorbed); every loss runs the stock blocks one at a time on weights materialised in
    `cfg.dtype` (`blockwise.BlockwiseForward`); elements and their algebra stay float64."""

    def __init__(self, a, b, cfg: LearnConfig, init: dict | None = None):
        cfg.validate()
        check_compatible(a, b)
        self.cfg, self.spec = cfg, a.spec.restricted(cfg.groups)
        self.init = {n: t.clone() for n, t in (init or identity_element(self.spec)).items()}
        _check_element(self.spec, self.init, "the initial element")
        selected = self.spec.select(self.spec.default_families() if cfg.groups is None else cfg.groups)
        self.dual = cfg.method == "dual"
        cont = [n for n in selected if learnable(self.spec.groups[n])]
        ste = [] if self.dual else [n for n in selected if straight_through(self.spec.groups[n])]
        if not cont and not ste:
            raise SymmergeError(f"{cfg.method} matching has nothing to learn in {cfg.groups or 'all groups'}: "
                                "dual matching learns continuous groups only; signed permutations stay fixed")
        self.fixed_groups = [n for n in self.spec.groups if n not in cont and n not in ste]
        methods = resolve_methods({n: self.spec.groups[n] for n in cont}, cfg.param)
        self.methods = methods
        ident = identity_element(self.spec)
        self.base = {"A": ident, "B": ident} if self.dual else {"B": self.init}
        self.param_dtype = param_dtype(DTYPES[cfg.dtype])
        self.slots = self._make_slots(cont, ste, methods)
        self.identity = ident
        device = torch.device(cfg.device)
        spec, start = self.spec, self.init  # not `self`: the frozen store keeps this function (no reference cycle,
        # so the endpoints go when the learner does, before the outputs are written)
        absorb = (lambda part: apply(spec, start, part)) if self.dual and init is not None else None
        self.frozen = {"A": frozen(a, device), "B": frozen(b, device, absorb)}  # under torchrun maybe sharded
        fill(list(self.frozen.values()))  # the ends of both first (see `frozen.fill`)
        self.forward = BlockwiseForward(a, list(self.frozen.values()), DTYPES[cfg.dtype], device, cfg.recompute)
        eps = self.frozen["A"].scalars("final").get("norm.eps")
        self.eps0 = None if eps is None else float(eps)
        self.rescale = self.eps0 is not None and SCALE in self.spec.groups
        #: dual without a learned residual scale: the path is run as (1 - lam)·A + lam·(gA^-1 gB)·B (`moves`)
        self.relative = self.dual and all(s.group != SCALE for s in self.slots)
        self.lazy = self._lazy_groups()

    def _make_slots(self, cont, ste, methods) -> list[Slot]:
        slots = []
        for side in self.base:
            for n in cont:
                p = parametrization(self.spec.groups[n], methods[n])
                raw, fixed = p.from_element(self.base[side][n]) if self.cfg.anchor == "absolute" else p.identity()
                slots.append(Slot(side, n, p, {k: v.to(self.param_dtype) for k, v in raw.items()}, fixed))
            for n in ste if side == "B" else []:
                # float32 is plenty to rank columns, and halves the optimiser's and the gathers' traffic;
                # a residual permutation is already a (permutation) matrix
                start = self.base[side][n]
                latent = (start if start.is_floating_point() else torch.nn.functional.one_hot(start, start.shape[-1]))
                latent = latent.to(torch.float32)
                slots.append(Slot(side, n, None, {"latent": latent}))
        for s in slots:
            for t in s.raw.values():
                t.requires_grad_(True)
        return slots

    # --- elements and loss ---------------------------------------------------------------------------

    def objective(self, cfg: LearnConfig) -> PathObjective:
        """What the loop draws and validates for this learner under `cfg`: the path from A to B."""
        return PathObjective(cfg)

    def start_tensors(self) -> dict[str, torch.Tensor]:
        """The starting element, which a checkpoint must have started from to be resumed."""
        return self.init

    def trainables(self) -> dict[str, torch.Tensor]:
        return trainables(self.slots)

    def element(self, side: str, hard: bool, only=None, skip=()) -> dict[str, torch.Tensor]:
        """The side's learned element (on top of its base); straight-through permutations unless `hard`.
        `only`: just these groups' learned values (nothing of the base); `skip`: these groups left at the base."""
        g = {} if only is not None else dict(self.base[side])
        for s in self.slots:
            if s.side == side and (only is None or s.group in only) and s.group not in skip:
                g[s.group] = self._slot_element(s, hard)
        return g

    def _slot_element(self, s: Slot, hard: bool):
        grp = self.spec.groups[s.group]
        if s.param is None and grp.structure.index_vector:
            p = lap(s.raw["latent"])
            return p if hard else StraightThrough(p, s.raw["latent"])
        if s.param is None:  # the residual permutation acts as a matrix: hard forward, latent backward
            latent = s.raw["latent"]
            p = torch.nn.functional.one_hot(lap(latent), grp.size).to(G.DTYPE)
            return p if hard else p + (latent - latent.detach())
        raw = {k: v.to(G.DTYPE) for k, v in s.raw.items()}  # the element in float64, whatever the parameters' dtype
        h = s.param.element(raw, s.fixed)
        return h if self.cfg.anchor == "absolute" else G.compose(grp, h, self.base[s.side][s.group])

    def _lazy_groups(self) -> tuple[set, dict]:
        """(the continuous learned groups that act on one block only, {part key: those of them acting on it}):
        `path` builds their elements inside that block's materialisation, so that the backward's recomputation
        builds them again and one layer's elements (and their parameterisation's autograd buffers) are alive at
        a time, not every layer's."""
        acting = {key: set() for key in part_keys(self.frozen["A"].shape)}
        for name, actions in self.spec.actions.items():
            acting[part_of(name)].update(a.group for a in actions)
        ends = acting["embed"] | acting["final"]
        lazy = {s.group for s in self.slots if s.param is not None and s.group not in ends}
        return lazy, {key: groups & lazy for key, groups in acting.items() if groups & lazy}

    def moves(self, hard: bool, only=None, skip=()) -> dict[str, dict]:
        """{side: the element that moves that side's frozen tensors on the path} (`element`'s arguments).

        One-sided: {"B": g}. Dual: {"A": gA, "B": gB}, or, where `relative`, {"B": gA^-1 gB} alone: gA is a symmetry
        of the model, so (1 - lam)·gA·A + lam·gB·B computes the function of gA^-1 of it, (1 - lam)·A + lam·(gA^-1 gB)·B,
        whose loss and gradients (through gA^-1 gB) are the same, and A's tensors need no transforming: half the
        weights acted on, in the forward, its recomputation and the backward. Not with a learned residual scale
        (it moves eps, which the mixture's config eps is then brought back to: `eps_scale`). The groups act on
        different axes of every tensor (the permutations, which re-index maps, stay fixed in dual matching), so
        gA^-1 gB is taken group by group, in float64."""
        if not self.relative:
            return {side: self.element(side, hard, only, skip) for side in self.base}
        ga, gb = self.element("A", hard, only, skip), self.element("B", hard, only, skip)
        learned = {s.group for s in self.slots}
        groups = self.spec.groups
        return {"B": {n: G.compose(groups[n], G.inverse(groups[n], ga[n]), t) if n in learned else t for n, t in gb.items()}}

    def prepared(self, g: dict) -> dict:
        return prepare(self.spec, g, self.fixed_groups, self.identity, self.forward.dtype, self.forward.device)

    def _eps_scale(self, elements: dict, lam):
        """`eps_scale` of the path (B's eps moved by its element's scale, A's too in dual matching)."""
        if not self.rescale:
            return None
        sides = ("A", "B")
        return eps_scale(self.spec, self.eps0, [self.frozen[s].scalars("final")["norm.eps"] for s in sides],
                         [elements[s][SCALE] if s in elements else None for s in sides], [1 - lam, lam],
                         self.forward.dtype, self.forward.device)

    def path(self, lam, hard: bool) -> PartFn:
        """Canonical tensors of one part of (1 - lam)·gA·A + lam·gB·B in the forward's dtype (gA: the identity for
        one-sided learning; dual: run as (1 - lam)·A + lam·(gA^-1 gB)·B where `relative`, see `moves`), for
        `BlockwiseForward`, each part acted on when asked. The elements of the groups acting on the ends (the
        residual ones) and the permutations are built once; the continuous maps of one block (QK, OV, GLU scales)
        inside that block's part (`_lazy_groups`)."""
        lazy, per_part = self.lazy
        raw = self.moves(hard, skip=lazy)
        prepared = {side: self.prepared({n: t for n, t in g.items() if n not in lazy}) for side, g in raw.items()}
        scale = self._eps_scale(raw, lam)
        dt = self.forward.dtype

        def part(key, rows: dict | None = None) -> dict:
            moved = {}
            block = self.moves(hard, only=per_part[key]) if key in per_part else {}
            for side in ("A", "B"):
                tensors = select(self.frozen[side].part(key), rows, dt)
                g = {**prepared[side], **self.prepared(block[side])} if side in block else prepared.get(side)
                moved[side] = apply(self.spec, g, tensors) if g is not None else tensors
            mixed = mix(moved["A"], moved["B"], lam)
            return mixed if scale is None else apply(self.spec, {SCALE: scale}, mixed)

        return part

    def loss(self, batch: dict, lam: float) -> torch.Tensor:
        return self.forward.loss(self.path(lam, hard=False), batch)

    @torch.no_grad()
    def curve(self, batches: list[dict], lams: list[float]) -> list[float]:
        out = []
        for lam in lams:
            part = self.path(lam, hard=True)
            out.append(sum(float(self.forward.loss(part, b)) for b in batches) / len(batches))
        return out

    def final_elements(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per input, the full element whose action on that input gives the output (checked members)."""
        with torch.no_grad():
            out = {side: {n: t.detach().clone() for n, t in self.element(side, hard=True).items()} for side in self.base}
        if self.dual:
            out["B"] = compose(self.spec, out["B"], self.init)  # first the absorbed init, then gB
        for side, g in out.items():
            _check_element(self.spec, g, f"the learned element of {side}")
        return out
