"""`--lr auto`: the learning rate of a learned / dual run, chosen for the pair on the validation split.

Each rate of `candidates(method)` (`LR_FACTORS` times the method's `DEFAULT_LR`: half-decades over two
orders of magnitude) runs a short run of `k` steps from the run's start, with the run's own batches
and λ draws (those of steps 0..k-1 for the run's seed, λ uniform over the range) and a cosine decay
over the k steps, so each is a complete small run at that rate. Its path is then measured on the first
`n` validation batches at the interior points of a `PROBE_POINTS`-point grid (λ = 1/4, 1/2, 3/4; the
endpoints once for all rates), and the rate whose path stands lowest above the straight line
(`barrier.highest_excess`, the rule that picks the best state) is chosen; ties go to the smaller rate,
a diverged run scores +inf. Everything is a function of the seed and the data, so the choice is
deterministic for a seed (on one machine and thread count, as the run is).

Cost, counted in the run's own training steps: the search's short-run steps, plus its evaluations
counted as steps (a λ point on `n` batches as ceil(n·r / 3) steps, r the validation batches' size over
the training batches' (`size_ratio`), since a step is a forward, a backward of about twice its cost and
a materialisation of the path's weights with gradients, where an evaluation is a forward per batch and
one materialisation without), is at most
`BUDGET` of the run's steps alone, its own evaluations not counted; at most `EVAL_SHARE` of that goes
to the evaluations. So the search costs at most a tenth of the run's wall time, whatever the run's
evaluations cost. A run too short to afford `MIN_STEPS` steps per rate and one validation batch is
refused (give `--lr`).

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
EVAL_SHARE = 1 / 3
FORWARDS_PER_STEP = 3  # a training step: forward and backward (about two forwards), and more
PROBE_POINTS = 5  # the probes' grid: 0, 1/4, 1/2, 3/4, 1
MIN_STEPS = 5


def candidates(method: str) -> list[float]:
    return [DEFAULT_LR[method] * f for f in LR_FACTORS]


def size_ratio(train: list[dict], val: list[dict]) -> float:
    """How much larger a validation batch is than a training batch (elements of the first tensor of
    each: tokens, or image pixels), the largest validation batch against the smallest training one."""
    def size(batch: dict) -> int:
        return next(iter(batch.values())).numel()

    return max(size(b) for b in val) / min(size(b) for b in train)


def eval_steps(n_batches: int, points: int, ratio: float = 1.0) -> int:
    """An upper bound, in training steps, of evaluating `points` λ values on `n_batches` batches, each
    `ratio` times a training batch's size."""
    return points * math.ceil(n_batches * ratio / FORWARDS_PER_STEP - 1e-9)


def search_steps(k: int, n: int, n_rates: int, ratio: float = 1.0) -> int:
    """What a search of `k` steps per rate, measured on `n` validation batches, costs in training steps:
    the short runs, the interior probe points for the start and after every rate, the endpoints once."""
    return n_rates * k + (n_rates + 1) * eval_steps(n, PROBE_POINTS - 2, ratio) + eval_steps(n, 2, ratio)


def plan(run_steps: int, n_val: int, n_rates: int, ratio: float = 1.0) -> tuple[int, int]:
    """(steps per rate, validation batches) of a search costing at most BUDGET x `run_steps` training
    steps (`search_steps`), at most EVAL_SHARE of it in evaluations."""
    budget = math.floor(BUDGET * run_steps)
    n = 1
    while n < n_val and search_steps(0, n + 1, n_rates, ratio) <= EVAL_SHARE * budget:
        n += 1
    k = (budget - search_steps(0, n, n_rates, ratio)) // n_rates
    if k < MIN_STEPS:
        need = math.ceil((n_rates * MIN_STEPS + search_steps(0, 1, n_rates, ratio)) / BUDGET)
        raise SymmergeError(f"--lr auto needs a longer run: its search costs at most a tenth of the run's "
                            f"{run_steps} steps, and needs a run of at least {need}; give --lr RATE or a longer "
                            "run (more --steps or --epochs)")
    return k, n


def check_budget(cfg: LearnConfig, n_train: int, n_val: int, ratio: float = 1.0) -> None:
    """Refuse, before any work, an `lr="auto"` run too short to afford its search (with `n_val`
    validation batches given, `ratio` times a training batch's size; `choose_lr` checks again with the
    batches the run uses)."""
    if cfg.lr != "auto":
        return
    plan(cfg.run_steps(n_train), n_val, len(candidates(cfg.method)), ratio)


def choose_lr(learner, train: list[dict], val: list[dict], cfg: LearnConfig) -> tuple[float, dict]:
    """(the chosen rate, the search's record) for `cfg`, a resolved run (`steps`, `eval_every` set)
    whose validation batches are `val`. `learner` is left as it came (its start, its config)."""
    from .learn_loop import Run

    rates = candidates(cfg.method)
    ratio = size_ratio(train, val)
    k, n = plan(cfg.steps, len(val), len(rates), ratio)
    t0 = time.perf_counter()
    lams, sub = grid(PROBE_POINTS), val[:n]
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
              "val_batches": n, "probe_points": PROBE_POINTS, "cost_steps": search_steps(k, n, len(rates), ratio),
              "val_size_ratio": ratio,
              "run_steps": cfg.steps,
              "seconds": round(time.perf_counter() - t0, 3)}
    return rates[best], record


def _json(x: float) -> float | None:
    return x if math.isfinite(x) else None
