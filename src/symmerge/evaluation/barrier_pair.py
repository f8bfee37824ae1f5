"""Loss and accuracy along the straight line between two models, and the barrier on it.

For each λ the canonical parameters are interpolated and run through the *stock* forward of one HF
model object (`evaluation.StockForward`): one forward implementation, the one users run, and no model
built per λ.

    loss barrier     = max_λ [ L(λ) − ((1−λ) L(0) + λ L(1)) ]
    accuracy barrier = max_λ [ ((1−λ) Acc(0) + λ Acc(1)) − Acc(λ) ]

Both are measured on the same batches at every λ.
"""

from __future__ import annotations

import math
import time

import torch

from ..runtime.progress import tqdm
from ..store.compatible import check_compatible
from ..store.model import Model
from .forward import StockForward, grid, interpolate


def above_line(lams: list[float], values: list[float]) -> list[float]:
    """Each value minus the straight line between the first and last (λ = 0 and 1): 0 at both ends."""
    v0, v1 = values[0], values[-1]
    return [v - ((1 - lam) * v0 + lam * v1) for lam, v in zip(lams, values)]


def summarise(lams: list[float], losses: list[float], accs: list[float]) -> dict:
    """Barriers from a curve whose first and last points are λ = 0 and λ = 1."""
    loss_gap = above_line(lams, losses)
    acc_gap = [-g for g in above_line(lams, accs)]  # accuracy falls below its line
    i_loss = max(range(len(lams)), key=lambda i: loss_gap[i])
    i_acc = max(range(len(lams)), key=lambda i: acc_gap[i])
    return {"barrier": loss_gap[i_loss], "barrier_lambda": lams[i_loss],
            "accuracy_barrier": acc_gap[i_acc], "accuracy_barrier_lambda": lams[i_acc]}


def line_barrier(lams: list[float], losses: list[float]) -> float:
    """max over the grid of L(lam) minus the straight line between the endpoint losses (NaN if any loss is)."""
    if not all(math.isfinite(x) for x in losses):
        return math.nan
    return max(above_line(lams, losses))


def highest_excess(lams: list[float], losses: list[float]) -> float:
    """max over the interior grid points of L(lam) minus the straight line: the barrier without its floor
    at 0 (negative when the whole path lies below the line; NaN if any loss is)."""
    if not all(math.isfinite(x) for x in losses):
        return math.nan
    return max(above_line(lams, losses)[1:-1])


def barrier(a: Model, b: Model, batches: list[dict], points: int = 11, refine: bool = False,
            progress: bool = True, dtype: torch.dtype | None = None, device=None) -> dict:
    """Loss/accuracy at `points` evenly spaced λ in [0, 1] (plus 4 around the peak with `refine`), the
    forward in `dtype` (default: A's storage dtype) on `device` (default: the CPU); the interpolation
    itself stays in the parameters' precision."""
    check_compatible(a, b)
    forward = StockForward(a, dtype, device)
    lams = grid(points)
    results: dict[float, dict] = {}
    start = time.perf_counter()

    def run(todo):
        for lam in tqdm(todo, desc="barrier", unit="λ", disable=not progress):
            results[lam] = forward.scores(interpolate(a.params, b.params, lam), batches)

    run(lams)
    if refine:
        curve = sorted(results)
        s = summarise(curve, [results[x]["loss"] for x in curve], [results[x]["accuracy"] for x in curve])
        step = 1.0 / (points - 1)
        peak = s["barrier_lambda"]
        extra = [peak + f * step for f in (-0.5, -0.25, 0.25, 0.5)]
        run([x for x in extra if 0 < x < 1 and x not in results])
    curve = sorted(results)
    out = {
        "lambdas": curve,
        "loss": [results[x]["loss"] for x in curve],
        "loss_se": [results[x]["loss_se"] for x in curve],
        "accuracy": [results[x]["accuracy"] for x in curve],
        "accuracy_se": [results[x]["accuracy_se"] for x in curve],
    }
    out.update(summarise(curve, out["loss"], out["accuracy"]))
    out.update({"n_batches": len(batches), "seconds": time.perf_counter() - start})
    return out


def plot(result: dict, path, title: str = "") -> None:
    """Loss and accuracy along the path, with the straight line between the endpoints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lams = result["lambdas"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "loss", "loss"), (axes[1], "accuracy", "accuracy")):
        ys = result[key]
        ax.plot(lams, ys, "o-", label=f"{label} along the path")
        ax.plot([lams[0], lams[-1]], [ys[0], ys[-1]], "--", color="gray", label="endpoint line")
        ax.set_xlabel("λ  (0 = A, 1 = B)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_title(f"loss barrier {result['barrier']:.4f}")
    axes[1].set_title(f"accuracy barrier {result['accuracy_barrier']:.4f}")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    from ..runtime.atomic import write_file

    write_file(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
