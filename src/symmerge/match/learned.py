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
  The learner runs the loss on that one-sided form, (1 - lam)·A + lam·(gA^-1 gB)·B, with gradients to both
  sides through gA^-1 gB (`Learner.moves`; not with a learned residual scale): A's tensors are not transformed.

Loss: the stock HF loss of (1 - lam) gA·A + lam gB·B at lam drawn from lam_range, run block by block
(`blockwise.py`: endpoints frozen in their checkpoint's dtype, each block's weights materialised in
`dtype` inside the forward and recomputed in the backward; the same figures as `evaluation.StockForward`
on the whole state dict, tested), a fresh
lam per step (the default, `lam_sampling="peak"`: half the steps take lam near the grid points where the last
validation curve stands highest above the straight line, the others uniform, see `objectives.peak_lambda`;
"uniform": all of them uniform).
"residual" anchoring learns a correction h with g = h∘g0 (h starts at the identity, where every
parameterisation is best conditioned); "absolute" learns g itself from `from_element(g0)`.

The residual scale is learned only when named in `groups` (`Spec.default_families` says why: with
it, the interpolation can collapse onto one endpoint).

The loop (`learn_loop.py`) draws every step's batch and lambda from (seed, step) alone, so a resumed
run equals an uninterrupted one; it tracks the validation barrier every `eval_every` steps and
returns the best state (the lowest validation barrier; among paths at or below the straight line, whose
barrier is 0, the one whose highest point stands lowest).

Where each part lives: `learn_config` (the settings, their defaults and checks), `learner` (the
models, the learned elements and the loss), `blockwise` (the frozen endpoints and the block-wise
forward), `learn_loop` (steps, validation, best state, stopping, checkpoints), `learn_state` (the
checkpoint files); this module holds `learn`, which joins them.
"""

from __future__ import annotations

from ..errors import SymmergeError
from ..runtime import distributed
from ..store.model import Model
from .heap import release_freed_heap
from .learn_config import LearnConfig
from .learn_loop import Result, Run
from .learn_plan import make_plan, resolved
from .learn_report import after_best, best_se, end_line
from .learn_state import resume_point, save_plan
from .learner import Learner


def learn(a: Model, b: Model, train: list[dict], val: list[dict], cfg: LearnConfig, init: dict | None = None,
          checkpoint=None, resume: bool = False, on_step=None) -> Result:
    """Run learned or dual matching; returns the elements for the inputs and a JSON-able report.

    The run's length, evaluations, validation size and rate are first made concrete (`learn_plan`:
    epochs over `train`, the validation batches sized from the barrier's standard error, `lr="auto"`
    searched on the validation split); the report holds that plan, the best state's standard error
    and how the validation curve moved after it (`learn_report`), and its one-line summary.
    checkpoint: folder for the run's state (written every `checkpoint_every` steps, on stop and at the
    end); resume: continue from it. on_step(step) -> True stops the run like Ctrl-C (for tests).
    """
    if not train or not val:
        raise SymmergeError("learned matching needs training and validation batches (--data)")
    group = distributed.current()  # several processes: one starting element (cuda: each rank's own GPU, `distributed.init`)
    group.agree(lambda: group.check_data(train, val))
    if init is not None:
        init = group.broadcast(init)
    release_freed_heap()  # what the data and the weight-matching start freed, before the frozen stores are kept
    learner = Learner(a, b, cfg, init)
    saved, resume = resume_point(checkpoint, resume)
    plan = make_plan(learner, train, val, cfg, saved)
    learner.cfg = resolved(cfg, plan)
    if checkpoint is not None and saved is None:  # a resumed run keeps the plan it saved
        save_plan(checkpoint, plan)
    val = val[:plan["val_batches"]]
    result = Run(learner, train, val, checkpoint, on_step).go(resume)
    rep = result.report
    rep["plan"] = plan
    rep["time"]["search_s"] = plan["lr_search"]["seconds"] if "lr_search" in plan else 0.0
    rep["barrier_after_se"] = best_se(learner, val, rep["lambdas"], rep["losses_after"])
    rep["after_best"] = after_best(rep["history"], rep["best_step"], rep["barrier_after_se"])
    rep["end_line"] = end_line(rep)
    return result
