"""The plan of a learned / dual run: what a `LearnConfig` leaves to the data made concrete.

- steps: `steps`, or `epochs` passes over the training batches given;
- evaluations: every `eval_every` steps, or `evaluations` spread over the run;
- validation batches: `val_batches` of those given, or, for "auto", as many as make the standard
  error of the validation barrier at most `VAL_SE` (all given at most; see `size_validation`);
- learning rate: the given one, or for "auto" the one `lr_search.choose_lr` picks.

`resolved(cfg, plan)` is the config the loop runs with (every field concrete); the plan goes into the
report and, for a resumed run, comes back from the checkpoint folder (`learn_state.save_plan`), so
the search is not run twice and the resumed run is the same run.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ..evaluation.barrier_pair import above_line
from ..evaluation.forward import grid, mean_se
from ..runtime.progress import tqdm
from .learn_config import VAL_SE, LearnConfig

#: validation batches whose spread estimates the standard error for "auto" (the first ones given)
PROBE_BATCHES = 32
#: "auto" never uses fewer validation batches than this (or all given, when fewer)
MIN_VAL_BATCHES = 4


def batch_excess(learner, batches: list[dict], lam: float) -> list[float]:
    """Per batch, its loss at `lam` above the straight line between its own endpoint losses."""
    out = []
    for b in batches:
        l0, mid, l1 = learner.curve([b], [0.0, lam, 1.0])
        out.append(mid - ((1 - lam) * l0 + lam * l1))
    return out


def peak_lambda(learner, batches: list[dict], points: int) -> float:
    """The interior grid point where the mean validation curve of `batches` stands highest above its line."""
    lams = grid(points)
    gap = above_line(lams, learner.curve(batches, lams))
    return lams[max(range(1, len(lams) - 1), key=lambda i: gap[i])]


def size_validation(learner, val: list[dict], cfg: LearnConfig) -> tuple[int, dict]:
    """(validation batches to use, what the choice rests on). "auto": the per-batch spread s of the
    start's excess at its peak λ on the first PROBE_BATCHES batches gives n = (s / VAL_SE)^2, so that
    the barrier's standard error s / sqrt(n) is at most VAL_SE; clipped to [MIN_VAL_BATCHES, given].
    The start's spread is the largest the run sees (it shrinks as the path flattens), so n is an
    upper bound on what the best state's choice needs. Where it fails: batches far from independent
    (one long document) make s / sqrt(n) too optimistic."""
    given = len(val)
    if cfg.val_batches is None or cfg.val_batches != "auto":
        n = given if cfg.val_batches is None else min(int(cfg.val_batches), given)
        return n, {"val_batches_given": given}
    probe = val[:min(given, PROBE_BATCHES)]
    if len(probe) < 2:
        return given, {"val_batches_given": given, "val_se_target": VAL_SE, "val_spread": None}
    lam = peak_lambda(learner, probe, cfg.grid_points)
    spread = mean_se(batch_excess(learner, probe, lam)) * math.sqrt(len(probe))
    n = min(given, max(MIN_VAL_BATCHES, math.ceil((spread / VAL_SE) ** 2)))
    return n, {"val_batches_given": given, "val_se_target": VAL_SE, "val_spread": spread,
               "val_se_start": spread / math.sqrt(n), "val_probe_lambda": lam}


def make_plan(learner, train: list[dict], val: list[dict], cfg: LearnConfig, saved: dict | None = None) -> dict:
    """The run's plan. `saved`: the plan of the run being resumed, whose "auto" choices (validation
    size, rate) are taken over rather than made again; everything else follows `cfg`, so a resumed
    run given other settings is refused by the checkpoint's settings check."""
    from .lr_search import run_rate

    t0 = time.perf_counter()
    steps = cfg.run_steps(len(train))
    every = cfg.run_eval_every(steps)
    keys = ("val_batches", "val_batches_given", "val_se_target", "val_spread", "val_se_start", "val_probe_lambda")
    if cfg.val_batches == "auto" and saved is not None:
        info = {k: saved[k] for k in keys if k in saved}
        n_val = info.pop("val_batches")
    else:
        n_val, info = size_validation(learner, val, cfg)
    plan = {"train_batches": len(train), "epochs": steps / len(train), "steps": steps, "eval_every": every,
            "val_batches": n_val, **info}
    plan["lr"], search = run_rate(learner, train, val[:n_val], replace(cfg, steps=steps, eval_every=every), saved)
    if search is not None:
        plan["lr_search"] = search
    plan["seconds"] = round(time.perf_counter() - t0, 3)
    if cfg.progress:
        tqdm.write(plan_line(plan))
    return plan


def plan_line(plan: dict) -> str:
    """The plan in one line, printed before the run starts (the search takes a while and shows no bar)."""
    line = (f"plan: {plan['steps']} steps ({plan['epochs']:.3g} epochs of {plan['train_batches']} batches), "
            f"validation every {plan['eval_every']} on {plan['val_batches']} batches")
    search = plan.get("lr_search")
    if search:
        tried = ", ".join(f"{r:.2g}: {_g(b)}" for r, b in zip(search["rates"], search["barriers"]))
        extended = search.get("extended")
        grew = f"; beyond the grid: {', '.join(f'{r:.2g}' for r in extended)}" if extended else ""
        line += (f"; --lr auto chose {plan['lr']:.3g} ({search['steps_each']} steps each on {search['val_batches']} "
                 f"validation batches, validation barrier {tried}{grew}; {search['seconds']:.0f} s)")
    return line


def _g(x) -> str:
    return "nan" if x is None else f"{x:.4f}"


def resolved(cfg: LearnConfig, plan: dict) -> LearnConfig:
    """The config the loop runs with: the plan's steps, evaluations, validation size and rate."""
    return replace(cfg, steps=plan["steps"], epochs=None, eval_every=plan["eval_every"], lr=plan["lr"],
                   val_batches=plan["val_batches"])
