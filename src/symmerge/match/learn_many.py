"""Learned and dual matching of many models: every model's group element trained on the task loss at
random points of the simplex, the model weights frozen.

Models P_1..P_n with starting elements g0_i (the many-model solution of the matcher it starts from). At each step a
batch and a point alpha ~ Dirichlet(1, ..., 1) of the simplex are drawn from (seed, step) alone, and the
loss is the stock HF loss of sum_i alpha_i g_i·P_i, run block by block on the frozen models
(`blockwise.py`, as pairwise learning: `ManyLearner`).

- "learned": g_i = h_i∘g0_i, with h_i's continuous groups parameterised (`parametrize.py`, from the
  identity) and its permutations learned by straight-through estimation (latents at g0_i's
  permutations), as one-sided learned matching does for B (`learner.py`).
- "dual": g0_i is absorbed into P_i first; then each model learns a continuous h_i from the identity;
  permutations stay g0_i's. g_i = h_i∘g0_i.

Gauge: the loss is unchanged when every model moves by one common element k (sum_i alpha_i k·X_i =
k·sum_i alpha_i X_i computes what the mix computes), so the n elements are determined only up to that
common element. It is fixed by the reference: model 1 (index 0) keeps g0_1 and learns nothing; the
others learn. For n = 2 "learned" is one-sided learned matching of model 2 against model 1, and "dual"
is one-sided learning with the permutations fixed, which reaches exactly the paths pairwise dual
matching reaches (`learned.py`).

Validation: the excess L(sum_i a_i X_i) - sum_i a_i L_i on the validation batches at the merge weights
and at `val_points` seeded Dirichlet points (the endpoint losses L_i are fixed: each X_i computes its
input's function). The validation objective is the largest excess (not floored at 0); the state with
the lowest is kept (step 0 included, so the result is never worse on it than the start).

The loop is the pair's (`learn_loop.Run` with `objectives.SimplexObjective`): checkpoints, resume, the
Ctrl-C checkpoint, several processes under torchrun and learning on past the plan are the same.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..algebra import groups as G
from ..algebra.apply import StraightThrough, apply
from ..algebra.elements import compose, identity_element
from ..algebra.spec import SCALE, Spec
from ..errors import SymmergeError
from ..runtime import distributed
from .blockwise import BlockwiseForward, PartFn
from .frozen import Frozen, fill
from .learn_config import DTYPES, LearnConfig
from .learn_loop import Result, Run
from .learn_state import resume_point, save_plan
from .learner import Slot, eps_scale, lap, prepare, select, trainables
from .lr_search import run_rate
from .objectives import SimplexObjective
from .parametrize import learnable, parametrization, resolve_methods, straight_through

#: the model whose element is fixed (the gauge), 0-based
REFERENCE = 0


def gauge_note(n: int) -> str:
    return (f"reference: model {REFERENCE + 1} of {n} keeps its starting element and learns nothing "
            "(a common element of all models leaves the loss unchanged)")


def _check_member(spec: Spec, g: dict, what: str) -> None:
    for name, grp in spec.groups.items():
        err = G.membership_error(grp, g[name])
        if err > 1e-6:
            raise SymmergeError(f"{what}: {name} is not in its group (error {err:.2e})")


class ManyLearner:
    """The frozen models, one set of slots per learned model (every model but the reference) and the loss.

    `models`: `Model`s, or `LazyModel`s (read part by part). Each is kept frozen in its checkpoint's dtype on
    `cfg.device` (`frozen.Frozen`; dual: its starting element absorbed), and every loss runs the stock blocks
    one at a time on the mixture's weights materialised in `cfg.dtype` (`blockwise.BlockwiseForward`, as
    pairwise learning does): memory holds the n frozen models and one block's worth more, whatever the depth."""

    def __init__(self, models: list, cfg: LearnConfig, init: list[dict] | None = None,
                 weights: list[float] | None = None, val_points: int = 4):
        cfg.validate()
        self.n, self.cfg = len(models), cfg
        self.weights, self.val_points = list(weights or [1 / len(models)] * len(models)), val_points
        self.spec = models[0].spec.restricted(cfg.groups)
        ident = identity_element(self.spec)
        self.identity = ident
        self.init = [{k: t.clone() for k, t in g.items()} for g in (init or [ident] * self.n)]
        for i, g in enumerate(self.init):
            _check_member(self.spec, g, f"the initial element of model {i + 1}")
        self.dual = cfg.method == "dual"
        selected = self.spec.select(self.spec.default_families() if cfg.groups is None else cfg.groups)
        cont = [g for g in selected if learnable(self.spec.groups[g])]
        ste = [] if self.dual else [g for g in selected if straight_through(self.spec.groups[g])]
        if not cont and not ste:
            raise SymmergeError(f"{cfg.method} merging has nothing to learn in {cfg.groups or 'the default groups'}")
        self.fixed_groups = [g for g in self.spec.groups if g not in cont and g not in ste]
        self.methods = resolve_methods({g: self.spec.groups[g] for g in cont}, cfg.param)
        self.base = [ident] * self.n if self.dual else self.init
        self.learned = [i for i in range(self.n) if i != REFERENCE]
        self.slots = [s for i in self.learned for s in self._slots(i, cont, ste)]
        device = torch.device(cfg.device)
        self.frozen = [Frozen(m, device, (lambda part, g=g: apply(self.spec, g, part)) if self.dual else None, keys=())
                       for g, m in zip(self.init, models)]
        fill(self.frozen)  # every model's ends first (see `frozen.fill`)
        self.forward = BlockwiseForward(models[0], self.frozen, DTYPES[cfg.dtype], device, cfg.recompute)
        eps = self.frozen[0].scalars("final").get("norm.eps")
        self.eps0 = None if eps is None else float(eps)
        self.rescale = self.eps0 is not None and SCALE in self.spec.groups

    def _slots(self, i: int, cont, ste) -> list[Slot]:
        slots = []
        for name in cont:
            p = parametrization(self.spec.groups[name], self.methods[name])
            raw, fixed = p.from_element(self.base[i][name]) if self.cfg.anchor == "absolute" else p.identity()
            slots.append(Slot(str(i), name, p, raw, fixed))
        for name in ste:
            start = self.base[i][name]
            latent = start if start.is_floating_point() else torch.nn.functional.one_hot(start, start.shape[-1])
            slots.append(Slot(str(i), name, None, {"latent": latent.to(torch.float32)}))
        for s in slots:
            for t in s.raw.values():
                t.requires_grad_(True)
        return slots

    def objective(self, cfg: LearnConfig) -> SimplexObjective:
        """What the loop draws and validates for this learner under `cfg`: the simplex of the models."""
        return SimplexObjective(cfg, self.weights, self.val_points)

    def start_tensors(self) -> dict[str, torch.Tensor]:
        """The starting elements, which a checkpoint must have started from to be resumed."""
        return {f"{i}.{k}": t for i, g in enumerate(self.init) for k, t in g.items()}

    def trainables(self) -> dict[str, torch.Tensor]:
        return trainables(self.slots)

    def element(self, i: int, hard: bool) -> dict:
        """Model i's element on top of its base (straight-through permutations unless `hard`)."""
        g = dict(self.base[i])
        for s in (s for s in self.slots if s.side == str(i)):
            grp = self.spec.groups[s.group]
            if s.param is None:
                p = lap(s.raw["latent"])
                if grp.structure.index_vector:
                    g[s.group] = p if hard else StraightThrough(p, s.raw["latent"])
                else:  # a permutation matrix: hard forward, latent backward
                    mat = torch.nn.functional.one_hot(p, grp.size).to(G.DTYPE)
                    g[s.group] = mat if hard else mat + (s.raw["latent"] - s.raw["latent"].detach())
                continue
            h = s.param.element(s.raw, s.fixed)
            g[s.group] = h if self.cfg.anchor == "absolute" else G.compose(grp, h, self.base[i][s.group])
        return g

    def mix(self, alpha: list[float], hard: bool) -> PartFn:
        """The parts of sum_i alpha_i g_i·P_i in the forward's dtype (`blockwise.PartFn`): the elements built
        once, each part acted on when the forward asks for it; the eps handled by the residual scale (`eps_scale`)."""
        raw = [self.element(i, hard) for i in range(self.n)]
        prepared = [prepare(self.spec, g, self.fixed_groups, self.identity, self.forward.dtype, self.forward.device)
                    for g in raw]
        scale = None
        if self.rescale:
            scale = eps_scale(self.spec, self.eps0, [f.scalars("final")["norm.eps"] for f in self.frozen],
                              [g[SCALE] for g in raw], alpha, self.forward.dtype, self.forward.device)
        dt = self.forward.dtype

        def part(key, rows: dict | None = None) -> dict:
            moved = [apply(self.spec, p, select(f.part(key), rows, dt)) for p, f in zip(prepared, self.frozen)]
            mixed = {k: sum(a * m[k] for a, m in zip(alpha, moved)) for k in moved[0]}
            return mixed if scale is None else apply(self.spec, {SCALE: scale}, mixed)

        return part

    def loss(self, batch: dict, alpha: list[float]) -> torch.Tensor:
        return self.forward.loss(self.mix(alpha, hard=False), batch)

    @torch.no_grad()
    def curve(self, batches: list[dict], points: list[list[float]]) -> list[float]:
        out = []
        for a in points:
            part = self.mix(a, hard=True)
            out.append(sum(float(self.forward.loss(part, b)) for b in batches) / len(batches))
        return out

    def final_elements(self) -> list[dict[str, torch.Tensor]]:
        """Each model's full element (checked members): g_i = h_i∘g0_i."""
        with torch.no_grad():
            out = [{k: t.detach().clone() for k, t in self.element(i, hard=True).items()} for i in range(self.n)]
        if self.dual:
            out = [compose(self.spec, h, g0) for h, g0 in zip(out, self.init)]
        for i, g in enumerate(out):
            _check_member(self.spec, g, f"the learned element of model {i + 1}")
        return out


def learn_many(models: list, weights: list[float], train: list[dict], val: list[dict], cfg: LearnConfig,
               init: list[dict] | None = None, val_points: int = 4, checkpoint=None, resume: bool = False,
               on_step=None) -> Result:
    """Run learned or dual matching of many models (module docstring): the elements (one per model) and a
    JSON-able report. `cfg`'s length is made concrete here (`steps`, or `epochs` over `train`; evaluations
    every `eval_every`, or `evaluations` in the run); its rate a number or "auto" (`lr_search.run_rate`: searched
    on the run's objective, saved in the checkpoint's plan). checkpoint: folder for the run's state; resume:
    continue from it; on_step(step) -> True stops the run like Ctrl-C."""
    if not train or not val:
        raise SymmergeError(f"{cfg.method} merging needs training and validation batches (--data)")
    steps = cfg.run_steps(len(train))
    cfg = replace(cfg, steps=steps, epochs=None, eval_every=cfg.run_eval_every(steps))
    group = distributed.current()
    group.agree(lambda: group.check_data(train, val))
    if init is not None:
        init = [group.broadcast(g) for g in init]
    learner = ManyLearner(models, cfg, init, weights, val_points)
    saved, resume = resume_point(checkpoint, resume)
    lr, search = run_rate(learner, train, val, cfg, saved)  # "auto": chosen once, a resumed run takes its plan's
    learner.cfg = cfg = replace(cfg, lr=lr)
    if search is not None and checkpoint is not None and saved is None:
        save_plan(checkpoint, {"lr": lr, "lr_search": search})
    result = Run(learner, train, val, checkpoint, on_step).go(resume)
    result.report["gauge"] = gauge_note(learner.n)
    if search is not None:
        result.report["lr_search"] = search
        result.report["time"]["search_s"] = search["seconds"]
    return result
