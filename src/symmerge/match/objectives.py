"""What a learned / dual run draws, trains on and validates: a path between two models or the simplex of
many. The loop (`learn_loop.Run`) is one for both; an objective gives it

- `draw(step, n_batches, history)`: the step's batch index and mix (λ for a path, a point of the simplex
  for many), from (seed, step) alone (`step_randomness`: an epoch-wise shuffle of the batches and uniforms
  of the step's own generator), and for λ sampling "peak" the last validation curve, which the
  checkpoint holds, so a resumed run takes the steps an uninterrupted run takes;
- `SAMPLINGS`: the λ samplings it draws, its default first (`sampling`: the one a run takes, `LearnConfig.lam_sampling`
  where given);
- `ends` (mixes evaluated once: the endpoints or vertices, which compute their inputs' functions) and
  `inner` (the mixes evaluated at every validation), and `entry(ends, inner)`: one validation's record;
- `value(entry)`: the figure the run reports and learns on past its plan while it falls (None where not
  finite); `score(entry)`: the figure the best state minimises (the first of equals kept);
- `report(history, best_step, ends)`: the objective's part of the run's report; `settings()`: what
  must be equal to resume a run, beyond `LearnConfig.settings`.
"""

from __future__ import annotations

import math

import torch

from ..algebra.simplex import dirichlet
from ..errors import SymmergeError
from ..evaluation.barrier_pair import above_line, highest_excess, line_barrier
from ..evaluation.forward import grid
from .learn_config import LearnConfig


def step_randomness(seed: int, step: int, n_batches: int, k: int) -> tuple[int, list[float]]:
    """Batch index and `k` uniforms of one step, from (seed, step) alone: the batches shuffled once per
    epoch (every batch once per pass), the uniforms from the step's own generator."""
    epoch, pos = divmod(step, n_batches)
    order = torch.randperm(n_batches, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    gen = torch.Generator().manual_seed(seed * 7_919 + 104_729 * step + 1)
    return int(order[pos]), torch.rand(k, generator=gen, dtype=torch.float64).tolist()


def peak_uniforms(seed: int, step: int) -> list[float]:
    """Three more uniforms of one step for `peak_lambda`, from (seed, step) alone."""
    g = torch.Generator().manual_seed(seed * 7_919 + 104_729 * step + 2)
    return torch.rand(3, generator=g, dtype=torch.float64).tolist()


def peak_lambda(lams: list[float], losses: list, lam_range, u: list[float]) -> float:
    """A lambda that weights the highest part of the path, from three uniforms `u`.

    Half the draws (u[0] < 1/2) are uniform over `lam_range`, which keeps every lambda trained. The
    other half pick a grid point inside the range with probability softmax(excess / tau), excess being
    the validation loss above the straight line between the endpoint losses and tau a quarter of the
    excess's spread (the highest point is e^4 times as likely as the lowest), then move uniformly
    within half a grid spacing of it (clipped to the range). Uniform when the curve is not finite or
    no interior grid point lies inside the range.
    """
    lo, hi = lam_range
    uniform = lo + (hi - lo) * u[1]
    inside = [i for i, lam in enumerate(lams) if 0 < lam < 1 and lo <= lam <= hi]
    if u[0] < 0.5 or not inside or any(x is None or not math.isfinite(x) for x in losses):
        return uniform
    excess = torch.tensor(above_line(lams, losses), dtype=torch.float64)[inside]
    tau = max(float(excess.max() - excess.min()) / 4, 1e-6)
    cdf = torch.cumsum(torch.softmax(excess / tau, 0), 0)
    k = min(int(torch.searchsorted(cdf, torch.tensor(u[1], dtype=torch.float64))), len(inside) - 1)
    half = 0.5 / (len(lams) - 1)
    return min(max(lams[inside[k]] + (2 * u[2] - 1) * half, lo), hi)


def sampling_of(cfg: LearnConfig, samplings: tuple[str, ...], why: str) -> str:
    """The λ sampling a run under `cfg` takes: `cfg.lam_sampling`, or the first of the objective's `samplings` where
    it names none; one the objective cannot draw raises, saying `why`."""
    chosen = cfg.lam_sampling or samplings[0]
    if chosen not in samplings:
        raise SymmergeError(f"{why}: --lam-sampling {chosen} is not drawn here; choose from {', '.join(samplings)}")
    return chosen


def finite_or_none(x: float) -> float | None:
    """`x`, or None where it is not finite (strict JSON has no inf or NaN)."""
    return x if math.isfinite(x) else None


class PathObjective:
    """Two models: the mix is λ from `lam_range`, half the draws near the highest points of the last validation
    curve ("peak", the default: `peak_lambda`) or all uniform ("uniform"); validation is the loss curve on the λ grid of
    `grid_points` (endpoints included), its value the line barrier; the best state has the lowest barrier,
    and among paths at or below the line (barrier 0) the one whose highest point stands lowest."""

    task = "matching"
    SAMPLINGS = ("peak", "uniform")

    def __init__(self, cfg: LearnConfig):
        self.cfg = cfg
        self.sampling = sampling_of(cfg, self.SAMPLINGS, "a path between two models")
        self.lams = grid(cfg.grid_points)
        self.ends, self.inner = [0.0, 1.0], self.lams[1:-1]

    def draw(self, step: int, n_batches: int, history: list[dict]) -> tuple[int, float]:
        idx, (u,) = step_randomness(self.cfg.seed, step, n_batches, 1)
        lo, hi = self.cfg.lam_range
        if self.sampling == "peak":
            return idx, peak_lambda(self.lams, history[-1]["losses"], self.cfg.lam_range,
                                    peak_uniforms(self.cfg.seed, step))
        return idx, lo + (hi - lo) * u

    def entry(self, ends: list[float], inner: list[float]) -> dict:
        losses = [ends[0], *inner, ends[1]]
        return {"barrier": finite_or_none(line_barrier(self.lams, losses)), "losses": [finite_or_none(x) for x in losses]}

    def value(self, entry: dict) -> float | None:
        return entry["barrier"]

    def score(self, entry: dict) -> float | None:
        return None if entry["barrier"] is None else highest_excess(self.lams, entry["losses"])

    def report(self, history: list[dict], best_step: int, ends) -> dict:
        best = next(h for h in history if h["step"] == best_step)
        return {"barrier_before": history[0]["barrier"], "barrier_after": best["barrier"], "lambdas": self.lams,
                "losses_before": history[0]["losses"], "losses_after": best["losses"]}

    def settings(self) -> dict:
        return {}


class SimplexObjective:
    """n models merged with `weights`: the mix is a point alpha ~ Dirichlet(1, ..., 1) of the simplex;
    validation is the excess L(sum_i a_i X_i) - sum_i a_i L_i at the merge weights and at `val_points`
    seeded Dirichlet points (the vertex losses L_i fixed: each X_i computes its input's function), its
    value the largest excess (not floored at 0), which the best state minimises."""

    task = "merging"
    SAMPLINGS = ("uniform",)

    def __init__(self, cfg: LearnConfig, weights: list[float], val_points: int):
        self.sampling = sampling_of(cfg, self.SAMPLINGS, "merging many models draws points of the simplex uniformly "
                                                         "(--lam-sampling peak is for pairs)")
        self.cfg, self.n = cfg, len(weights)
        self.points = [list(weights), *dirichlet(self.n, val_points, cfg.seed + 1)]
        self.ends = [[float(j == i) for j in range(self.n)] for i in range(self.n)]
        self.inner = self.points

    def draw(self, step: int, n_batches: int, history: list[dict]) -> tuple[int, list[float]]:
        idx, u = step_randomness(self.cfg.seed, step, n_batches, self.n)
        e = [-math.log(max(x, 1e-300)) for x in u]
        return idx, [x / math.fsum(e) for x in e]

    def entry(self, ends: list[float], inner: list[float]) -> dict:
        excess = [loss - math.fsum(a * e for a, e in zip(alpha, ends)) for loss, alpha in zip(inner, self.points)]
        return {"objective": finite_or_none(max(excess)), "excess": excess}

    def value(self, entry: dict) -> float | None:
        return entry["objective"]

    def score(self, entry: dict) -> float | None:
        return entry["objective"]

    def report(self, history: list[dict], best_step: int, ends) -> dict:
        best = next(h for h in history if h["step"] == best_step)
        return {"validation_objective": "largest excess L(sum_i a_i X_i) - sum_i a_i L_i over the merge weights "
                                        "and the validation Dirichlet points",
                "validation_points": self.points, "validation_endpoint_losses": ends,
                "objective_before": history[0]["objective"], "objective_after": best["objective"]}

    def settings(self) -> dict:
        return {"merge_weights": self.points[0], "validation_points": len(self.points) - 1}
