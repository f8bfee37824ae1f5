"""Learned matching (one-sided) and dual learned matching: group elements trained on the task loss of
the interpolated model, with every model weight frozen.

- "learned": B's element g is learned; OUT = g·B. Continuous groups go through a parameterisation
  (`parametrize.py`); permutations through a straight-through estimator: the forward uses the hard
  assignment P = LAP(L) of a latent matrix L and the backward treats P as L (`apply.StraightThrough`:
  rows gathered by P, the gradient of the dense product L @ x to L). The residual permutation
  (`residual_perm`, the residual rotation restricted to permutation matrices) acts as a matrix, so its
  straight-through element is P + (L - L.detach()). Start: `init` (the weight-matching solution),
  latents at its permutation matrices.
- "dual": `init` is absorbed into B first (B' = init·B); then A and B' each get their own continuous
  elements (residual rotation and scale, QK and OV maps, GLU scales), starting at the identity;
  permutations stay fixed. Outputs gA·A and gB·B'.
  The group acts linearly on weights, so (1 - lam) gA·A + lam gB·B' = gA·((1 - lam) A + lam
  (gA^-1 gB)·B'): dual matching reaches exactly the paths one-sided matching with permutations fixed
  reaches. At the identity start its two sides get opposite copies of the one-sided gradient, so at
  learning rate lr the relative element gA^-1 gB first moves like one-sided learning's at 2 lr (tested).

Loss: the stock HF loss (`objective.py`) of (1 - lam) gA·A + lam gB·B at lam ~ U(lam_range), a fresh
lam per step (`lam_sampling="peak"`: half the steps take lam near the grid points where the last
validation curve stands highest above the straight line, see `learn_loop.peak_lambda`).
"residual" anchoring learns a correction h with g = h∘g0 (h starts at the identity, where every
parameterisation is best conditioned); "absolute" learns g itself from `from_element(g0)`.

The residual scale is learned only when named in `groups`: with it, the interpolation can collapse
onto one endpoint (the midpoint of A and c·B computes B's function as c grows, by scale invariance),
which lowers the measured barrier without merging anything.

The loop (`learn_loop.py`) draws every step's batch and lambda from (seed, step) alone, so a resumed
run equals an uninterrupted one; it tracks the validation barrier every `eval_every` steps and
returns the best state (the lowest validation barrier; among paths at or below the straight line, whose
barrier is 0, the one whose highest point stands lowest).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .. import SymmergeError
from .. import groups as G
from ..apply import StraightThrough, apply
from ..merge import check_compatible
from ..model import Model
from ..spec import Spec, compose, identity_element
from .objective import Objective, grid, interpolate
from .parametrize import Parametrization, learnable, parametrization, resolve_methods, straight_through

METHODS = ("learned", "dual")
LAM_SAMPLING = ("uniform", "peak")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class Interrupted(KeyboardInterrupt):
    """Raised after the checkpoint was written, when a run is stopped (Ctrl-C or `on_step`)."""


def parse_lam_range(text: str) -> tuple[float, float]:
    """"0.4,0.6" -> (0.4, 0.6); a single number means a fixed lambda. Checked by LearnConfig.validate."""
    try:
        parts = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])") from None
    if len(parts) not in (1, 2):
        raise SymmergeError(f"--lam-range {text!r} is not 'LOW,HIGH' (two numbers in [0, 1])")
    return (parts[0], parts[-1])


@dataclass
class LearnConfig:
    method: str = "learned"
    groups: list[str] | None = None  # families to learn (default: all)
    param: str = "auto"  # see parametrize.resolve_methods
    steps: int = 200
    lr: float = 1e-2
    lam_range: tuple[float, float] = (0.4, 0.6)
    lam_sampling: str = "uniform"  # or "peak": half the steps near the validation curve's highest points
    seed: int = 0
    eval_every: int = 25
    patience: int = 0  # evaluations without improvement before stopping; 0: never stop early
    grid_points: int = 5  # lambdas of the validation barrier (endpoints included)
    anchor: str = "residual"  # "residual" (g = h∘g0, h from the identity) or "absolute"
    dtype: str = "float32"  # of the HF forward; group algebra is always float64
    checkpoint_every: int = 50
    progress: bool = True

    def validate(self) -> None:
        lo, hi = self.lam_range
        if not (0.0 <= lo <= hi <= 1.0):
            raise SymmergeError(f"--lam-range {lo},{hi} must satisfy 0 <= low <= high <= 1")
        if self.lam_sampling not in LAM_SAMPLING:
            raise SymmergeError(f"--lam-sampling must be one of {', '.join(LAM_SAMPLING)}, not {self.lam_sampling!r}")
        if self.method not in METHODS:
            raise SymmergeError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.anchor not in ("residual", "absolute"):
            raise SymmergeError(f"anchor must be residual or absolute, not {self.anchor!r}")
        if self.dtype not in DTYPES:
            raise SymmergeError(f"dtype must be one of {', '.join(DTYPES)}")
        if self.steps < 0 or self.eval_every < 1 or self.lr <= 0:
            raise SymmergeError("--steps must be >= 0, eval_every >= 1 and the learning rate > 0")
        grid(self.grid_points)

    def settings(self) -> dict:
        """What must be equal to resume a run (everything but the progress bar and checkpoint cadence)."""
        skip = {"progress", "checkpoint_every"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["lam_range"] = list(out["lam_range"])
        if out["lam_sampling"] == "uniform":  # checkpoints written before the option existed still resume
            del out["lam_sampling"]
        return out


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


@dataclass
class Result:
    elements: dict[str, dict[str, torch.Tensor]]  # side ("A" or "B") -> full element for that input
    report: dict


def lap(latent: torch.Tensor) -> torch.Tensor:
    """Hard permutation (index vector) maximising sum_i L[i, p[i]], batched over leading axes.

    When every row's maximum sits in a different column, the row-wise argmax is that permutation (no
    assignment can beat each row's maximum); the exact solver runs only when rows compete. Latents
    start one-hot and move slowly, so most steps take the shortcut.
    """
    flat = latent.detach().reshape(-1, *latent.shape[-2:]).numpy()
    rows = []
    for x in flat:
        best = x.argmax(axis=1)
        rows.append(best if np.unique(best).size == best.size else linear_sum_assignment(x, maximize=True)[1])
    return torch.as_tensor(np.stack(rows), dtype=torch.int64).reshape(latent.shape[:-1])


def _check_element(spec: Spec, g: dict, what: str) -> None:
    missing = [n for n in spec.groups if n not in g]
    if missing:
        raise SymmergeError(f"{what} has no entry for groups {missing[:3]}")
    for n, grp in spec.groups.items():
        err = G.membership_error(grp, g[n])
        if err > 1e-6:
            raise SymmergeError(f"{what}: {n} is not in its group (error {err:.2e})")


class Learner:
    """Holds the frozen models, the slots and the objective; `run` trains (see the module docstring)."""

    def __init__(self, a: Model, b: Model, cfg: LearnConfig, init: dict | None = None):
        cfg.validate()
        check_compatible(a, b)
        self.a, self.b, self.cfg, self.spec = a, b, cfg, a.spec.restricted(cfg.groups)
        self.init = {n: t.clone() for n, t in (init or identity_element(self.spec)).items()}
        _check_element(self.spec, self.init, "the initial element")
        selected = self.spec.select(cfg.groups)
        if cfg.groups is None:  # see the module docstring: a learned scale lets the path collapse
            selected = [n for n in selected if self.spec.groups[n].family != "residual_scale"]
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
        self.slots = self._make_slots(cont, ste, methods)
        self.obj = Objective(a, DTYPES[cfg.dtype])
        b_params = apply(self.spec, self.init, b.params) if self.dual else b.params
        self.params = {"A": self.obj.cast(a.params), "B": self.obj.cast(b_params)}

    def _make_slots(self, cont, ste, methods) -> list[Slot]:
        slots = []
        for side in self.base:
            for n in cont:
                p = parametrization(self.spec.groups[n], methods[n])
                raw, fixed = p.from_element(self.base[side][n]) if self.cfg.anchor == "absolute" else p.identity()
                slots.append(Slot(side, n, p, raw, fixed))
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

    def trainables(self) -> dict[str, torch.Tensor]:
        return {f"{s.key}.{k}": t for s in self.slots for k, t in sorted(s.raw.items())}

    def element(self, side: str, hard: bool) -> dict[str, torch.Tensor]:
        """The side's learned element (on top of its base); straight-through permutations unless `hard`."""
        g = dict(self.base[side])
        for s in (s for s in self.slots if s.side == side):
            grp = self.spec.groups[s.group]
            if s.param is None and grp.kind == "permutation":
                p = lap(s.raw["latent"])
                g[s.group] = p if hard else StraightThrough(p, s.raw["latent"])
                continue
            if s.param is None:  # the residual permutation acts as a matrix: hard forward, latent backward
                latent = s.raw["latent"]
                p = torch.nn.functional.one_hot(lap(latent), grp.size).to(G.DTYPE)
                g[s.group] = p if hard else p + (latent - latent.detach())
                continue
            h = s.param.element(s.raw, s.fixed)
            g[s.group] = h if self.cfg.anchor == "absolute" else G.compose(grp, h, self.base[side][s.group])
        return g

    def endpoints(self, hard: bool) -> tuple[dict, dict]:
        """Both sides' moved parameters; for training (not `hard`) the elements are cast once to the
        forward's dtype, instead of once per tensor they act on."""
        def moved(side):
            g = self.element(side, hard)
            if not hard:
                g = {n: t.to(self.obj.dtype) if torch.is_tensor(t) and t.is_floating_point() else t for n, t in g.items()}
            return apply(self.spec, g, self.params[side])

        return (moved("A") if self.dual else self.params["A"]), moved("B")

    def loss(self, batch: dict, lam: float) -> torch.Tensor:
        ta, tb = self.endpoints(hard=False)
        return self.obj.loss(interpolate(ta, tb, lam), batch)

    @torch.no_grad()
    def curve(self, batches: list[dict], lams: list[float]) -> list[float]:
        ta, tb = self.endpoints(hard=True)
        return [self.obj.mean_loss(interpolate(ta, tb, lam), batches) for lam in lams]

    def final_elements(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per input, the full element whose action on that input gives the output (checked members)."""
        with torch.no_grad():
            out = {side: {n: t.detach().clone() for n, t in self.element(side, hard=True).items()} for side in self.base}
        if self.dual:
            out["B"] = compose(self.spec, out["B"], self.init)  # first the absorbed init, then gB
        for side, g in out.items():
            _check_element(self.spec, g, f"the learned element of {side}")
        return out


def learn(a: Model, b: Model, train: list[dict], val: list[dict], cfg: LearnConfig, init: dict | None = None,
          checkpoint=None, resume: bool = False, on_step=None) -> Result:
    """Run learned or dual matching; returns the elements for the inputs and a JSON-able report.

    checkpoint: folder for the run's state (written every `checkpoint_every` steps, on stop and at the
    end); resume: continue from it. on_step(step) -> True stops the run like Ctrl-C (for tests).
    """
    if not train or not val:
        raise SymmergeError("learned matching needs training and validation batches (--data)")
    from .learn_loop import Run  # the loop imports this module

    learner = Learner(a, b, cfg, init)
    return Run(learner, train, val, checkpoint, on_step).go(resume)
