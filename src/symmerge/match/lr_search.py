"""`--lr auto`: the learning rate of a learned / dual run, chosen on the validation split (two models or many).

Each rate of `candidates(method)` (`LR_FACTORS` times the method's `DEFAULT_LR`: half-decades over two
orders of magnitude) runs a short run of `k` steps from the run's start, with the run's own batches
and λ draws (those of steps 0..k-1 for the run's seed, λ uniform over the range) and a cosine decay
over the k steps, so each is a complete small run at that rate. Its path is then measured on the first
`n` validation batches at the interior points of a `PROBE_POINTS`-point grid (λ = 1/4, 1/2, 3/4; the
endpoints once for all rates), and the rate whose path stands lowest above the straight line
(`barrier_pair.highest_excess`, the rule that picks the best state) is chosen; for many models the
probe is the run's own objective (the largest excess over the merge weights and the validation points
of the simplex, the vertices once for all rates). Ties go to the smaller rate,
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

The grid brackets its choice: when the best rate is an end of the grid (the lowest or the highest rate
tried), the next half-decade beyond that end (`factor`: 1, 3, 10, 30, ...) is tried too, until the best
is interior or `MAX_EXTRA` rates were added. The plan reserves those rates' short runs and evaluations
(`plan` with the grid's size plus `MAX_EXTRA`), so the bound below holds whether or not the grid grows.

Where it fails: a short run favours rates that move fast, so on a pair where the long run wants a
lower rate than its first steps do, the choice is too high by a half-decade or so; the report lists
every rate's barrier, so such a case shows.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from ..errors import SymmergeError
from .learn_config import DEFAULT_LR, LR_FACTORS, LearnConfig
from .objectives import finite_or_none

BUDGET = 0.1
EVAL_SHARE = 1 / 3
FORWARDS_PER_STEP = 3  # a training step: forward and backward (about two forwards), and more
PROBE_POINTS = 5  # the probes' grid: 0, 1/4, 1/2, 3/4, 1
MIN_STEPS = 5
MAX_EXTRA = 2  # rates tried beyond an end of the grid when the best lies on it


def candidates(method: str) -> list[float]:
    return [DEFAULT_LR[method] * f for f in LR_FACTORS]


def planned_rates(method: str) -> int:
    """The short runs a search plans for: the grid and the rates that may bracket it."""
    return len(candidates(method)) + MAX_EXTRA


def factor(i: int) -> float:
    """The i-th half-decade of the rate ladder, as a fraction of DEFAULT_LR: 10^(i//2), times 3 for odd i
    (... 0.03, 0.1, 0.3, 1, 3, 10 ...: LR_FACTORS is i = -4..0)."""
    return float(f"{3 if i % 2 else 1}e{i // 2}")  # parsed from its decimal: 0.3, not 0.30000000000000004


def ladder_index(f: float) -> int:
    """The i with factor(i) == f (to rounding), for a factor on the ladder."""
    i = min(range(-40, 41), key=lambda j: abs(math.log(factor(j) / f)))
    if not math.isclose(factor(i), f, rel_tol=1e-9):
        raise ValueError(f"{f} is not on the rate ladder")
    return i


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
    plan(cfg.run_steps(n_train), n_val, planned_rates(cfg.method), ratio)


def affordable_rate(cfg: LearnConfig, train: list[dict], val: list[dict], lr_given: bool) -> tuple[float | str, str | None]:
    """(the rate to run with, a note or None), before any work. `lr="auto"` on a run too short for its search
    (`check_budget`: a tiny data set) is refused where the user asked for it (`lr_given`); where it is only
    the recipe's default, the method's fixed rate is taken instead and the note says so (for the report and
    the end-of-run line)."""
    try:
        check_budget(cfg, len(train), len(val), size_ratio(train, val))
    except SymmergeError:
        if lr_given:
            raise
        rate = DEFAULT_LR[cfg.method]
        return rate, f"lr {rate:g}, the method's fixed rate: this run is too short for --lr auto's search"
    return cfg.lr, None


def choose_lr(learner, train: list[dict], val: list[dict], cfg: LearnConfig) -> tuple[float, dict]:
    """(the chosen rate, the search's record) for `cfg`, a resolved run (`steps`, `eval_every` set)
    whose validation batches are `val`. `learner` is left as it came (its start, its config)."""
    from .learn_loop import Run

    base = DEFAULT_LR[cfg.method]
    rates = candidates(cfg.method)
    ratio = size_ratio(train, val)
    k, n = plan(cfg.steps, len(val), planned_rates(cfg.method), ratio)
    t0 = time.perf_counter()
    sub = val[:n]
    start = {name: t.detach().clone() for name, t in learner.trainables().items()}
    own = learner.cfg
    probe = learner.objective(replace(cfg, grid_points=PROBE_POINTS))  # two models: the path on the probe grid
    ends = learner.curve(sub, probe.ends)

    def excess() -> float:
        """The objective's score on `sub` (not floored at 0; NaN where a loss is not finite)."""
        x = probe.score(probe.entry(ends, learner.curve(sub, probe.inner)))
        return math.nan if x is None else x

    start_excess = excess()
    tried: dict[float, tuple[float, bool]] = {}  # rate -> (excess, diverged)

    def short_run(lr: float) -> None:
        learner.cfg = replace(cfg, lr=lr, steps=k, eval_every=k, lam_sampling="uniform", progress=False, extend=1.0)
        run = Run(learner, train, sub, None, None)
        for step in range(k):
            run.train_step(step)
            if run.meta["diverged"]:
                break
        diverged = run.meta["diverged"]
        x = excess()
        tried[lr] = (x if math.isfinite(x) and not diverged else math.inf, diverged)
        with torch.no_grad():
            for name, t in learner.trainables().items():
                t.copy_(start[name])

    def best() -> float:
        return min(sorted(tried), key=lambda r: (tried[r][0], r))  # ties to the smaller rate

    try:
        for lr in rates:
            short_run(lr)
        for _ in range(MAX_EXTRA):
            low, high, chosen = min(tried), max(tried), best()
            if chosen not in (low, high) or len(tried) < 2:
                break
            i = ladder_index(chosen / base)
            short_run(base * factor(i - 1 if chosen == low else i + 1))
    finally:
        learner.cfg = own
    order = sorted(tried)
    scores = [tried[r][0] for r in order]
    chosen = best()
    record = {"rates": order, "excess": [finite_or_none(x) for x in scores],
              "barriers": [finite_or_none(max(x, 0.0)) for x in scores],
              "diverged": [tried[r][1] for r in order], "start_excess": finite_or_none(start_excess), "chosen": chosen,
              "grid": rates, "extended": sorted(set(order) - set(rates)), "steps_each": k,
              "val_batches": n, "probe_points": PROBE_POINTS, "cost_steps": search_steps(k, n, len(order), ratio),
              "val_size_ratio": ratio,
              "run_steps": cfg.steps,
              "seconds": round(time.perf_counter() - t0, 3)}
    return chosen, record


def run_rate(learner, train: list[dict], val: list[dict], cfg: LearnConfig,
             saved: dict | None = None) -> tuple[float, dict | None]:
    """(the rate a run uses, its search's record or None) for `cfg`, a resolved run whose validation batches
    are `val`: the given rate; for "auto" the rate of `saved` (the plan of the run being resumed) when it
    holds a search, else `choose_lr`'s."""
    if cfg.lr != "auto":
        return float(cfg.lr), None
    if saved is not None and "lr_search" in saved:
        return saved["lr"], saved["lr_search"]
    return choose_lr(learner, train, val, cfg)
