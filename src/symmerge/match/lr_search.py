"""`--lr auto`: the learning rate of a learned / dual run, chosen for the pair on the validation split.

Each rate of `candidates(method)` (`LR_FACTORS` times the method's `DEFAULT_LR`: half-decades over two
orders of magnitude) runs a short run of `k` steps from the run's start, with the run's own batches
and λ draws (those of steps 0..k-1 for the run's seed, λ uniform over the range) and a cosine decay
over the k steps, so each is a complete small run at that rate. Its validation curve on the first
`n` validation batches is then measured on the run's grid, and the rate whose path stands lowest
above the straight line (`barrier.highest_excess`, the rule that picks the best state) is chosen;
ties go to the smaller rate, a diverged run scores +inf. Everything is a function of the seed and the
data, so the choice is deterministic for a seed (on one machine and thread count, as the run is).

Cost: the search is planned in forward passes of one batch (`UNITS_PER_STEP` for a training step,
one per grid point and validation batch for an evaluation) to cost at most `BUDGET` of the run it
chooses for, half of it for the short runs' evaluations and the rest for their steps; a run too short
to afford `MIN_STEPS` steps per rate and one validation batch is refused (give `--lr`).

Where it fails: a short run favours rates that move fast, so on a pair where the long run wants a
lower rate than its first steps do, the choice is too high by a half-decade or so; the report lists
every rate's barrier, so such a case shows.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from .. import SymmergeError
from ..barrier import highest_excess
from ..evaluate import grid
from .learn_config import DEFAULT_LR, LR_FACTORS, LearnConfig

BUDGET = 0.1
UNITS_PER_STEP = 3  # a training step: forward and backward, about three forwards
MIN_STEPS = 5


def candidates(method: str) -> list[float]:
    return [DEFAULT_LR[method] * f for f in LR_FACTORS]


def run_units(steps: int, eval_every: int, n_val: int, points: int) -> int:
    """Forward passes of one batch in a run: its steps, its evaluations (step 0, every `eval_every`
    steps and the last) over the interior grid, and the endpoints once."""
    evaluations = 1 + steps // eval_every + (1 if steps % eval_every else 0)
    return UNITS_PER_STEP * steps + evaluations * (points - 2) * n_val + 2 * n_val


def plan(units: int, n_val: int, points: int, n_rates: int) -> tuple[int, int]:
    """(steps per rate, validation batches) of a search costing at most BUDGET x `units`."""
    budget = BUDGET * units
    per_batch = (n_rates + 1) * (points - 2) + 2  # the start and every rate, endpoints once
    n = min(n_val, int(budget / 2 // per_batch))
    k = int((budget - n * per_batch) // (UNITS_PER_STEP * n_rates))
    if n < 1 or k < MIN_STEPS:
        need = math.ceil((per_batch + UNITS_PER_STEP * n_rates * MIN_STEPS) / BUDGET)
        raise SymmergeError(f"--lr auto needs a longer run: its search costs at most a tenth of the run, which "
                            f"here is {units} batch forwards (at least {need} needed); give --lr RATE or a longer run "
                            "(more --steps or --epochs)")
    return k, n


def check_budget(cfg: LearnConfig, n_train: int, n_val: int) -> None:
    """Refuse, before any work, an `lr="auto"` run too short to afford its search (with `n_val`
    validation batches given; `choose_lr` checks again with the number the run uses)."""
    if cfg.lr != "auto":
        return
    steps = cfg.run_steps(n_train)
    n = n_val if not isinstance(cfg.val_batches, int) else min(cfg.val_batches, n_val)
    plan(run_units(steps, cfg.run_eval_every(steps), n, cfg.grid_points), n, cfg.grid_points,
         len(candidates(cfg.method)))


def search_units(k: int, n: int, points: int, n_rates: int) -> int:
    return UNITS_PER_STEP * k * n_rates + ((n_rates + 1) * (points - 2) + 2) * n


def choose_lr(learner, train: list[dict], val: list[dict], cfg: LearnConfig) -> tuple[float, dict]:
    """(the chosen rate, the search's record) for `cfg`, a resolved run (`steps`, `eval_every` set)
    whose validation batches are `val`. `learner` is left as it came (its start, its config)."""
    from .learn_loop import Run

    rates = candidates(cfg.method)
    units = run_units(cfg.steps, cfg.eval_every, len(val), cfg.grid_points)
    k, n = plan(units, len(val), cfg.grid_points, len(rates))
    t0 = time.perf_counter()
    lams, sub = grid(cfg.grid_points), val[:n]
    start = {name: t.detach().clone() for name, t in learner.trainables().items()}
    own = learner.cfg
    ends = learner.curve(sub, [0.0, 1.0])
    excess = [highest_excess(lams, [ends[0], *learner.curve(sub, lams[1:-1]), ends[1]])]
    diverged = []
    try:
        for lr in rates:
            learner.cfg = replace(cfg, lr=lr, steps=k, eval_every=k, lam_sampling="uniform", progress=False)
            run = Run(learner, train, sub, None, None)
            for step in range(k):
                run.train_step(step)
                if run.meta["diverged"]:
                    break
            diverged.append(run.meta["diverged"])
            losses = [ends[0], *learner.curve(sub, lams[1:-1]), ends[1]]
            x = highest_excess(lams, losses)
            excess.append(x if math.isfinite(x) and not run.meta["diverged"] else math.inf)
            with torch.no_grad():
                for name, t in learner.trainables().items():
                    t.copy_(start[name])
    finally:
        learner.cfg = own
    scores = excess[1:]
    best = min(range(len(rates)), key=lambda i: (scores[i], rates[i]))
    record = {"rates": rates, "excess": [_json(x) for x in scores], "barriers": [_json(max(x, 0.0)) for x in scores],
              "diverged": diverged, "start_excess": _json(excess[0]), "chosen": rates[best], "steps_each": k,
              "val_batches": n, "units": search_units(k, n, cfg.grid_points, len(rates)), "run_units": units,
              "seconds": round(time.perf_counter() - t0, 3)}
    return rates[best], record


def _json(x: float) -> float | None:
    return x if math.isfinite(x) else None
