"""The barrier of many models: loss and accuracy of weighted averages inside the simplex of n models.

Models of one architecture whose widths differ are first expanded into the widest config that takes
all the others (`expansion.widest_many`; their functions unchanged). Every point is a weighted average of
the canonical parameters, run through the stock forward by the
project's one evaluation service (`evaluation.StockForward`, as the pairwise barrier). With merge weights w and endpoint
losses L_i (accuracies a_i):

    average_loss      = L(sum_i w_i M_i)
    average_excess    = average_loss - sum_i w_i L_i
    pairwise_max      = the largest pairwise barrier (`barrier_pair.summarise` on `points` λ per pair)
    simplex_barrier   = max(0, max_k [L(sum_i α_ki M_i) - sum_i α_ki L_i]) over K Dirichlet(1,...,1) draws
                        α_k (seeded); 0 is the value at the vertices, as the pairwise barrier's floor

and for accuracy the same with the sign turned (the line minus the accuracy): average_accuracy_drop,
pairwise_max_accuracy, simplex_accuracy_barrier. The draws are uniform on the simplex; with few of
them the maximum is a lower bound of the true one.
"""

from __future__ import annotations

import itertools
import math
import time

import torch

from ..algebra.simplex import check_weights, dirichlet
from ..runtime.progress import tqdm
from ..store.model import Model
from .barrier_pair import summarise
from .forward import StockForward


def mix(models: list[Model], alpha: list[float]) -> dict[str, torch.Tensor]:
    """sum_i alpha_i M_i, tensor by tensor (a vertex returns that model's tensors exactly)."""
    nz = [i for i, a in enumerate(alpha) if a != 0.0]
    if len(nz) == 1 and alpha[nz[0]] == 1.0:
        return dict(models[nz[0]].params)
    return {k: sum(a * m.params[k] for a, m in zip(alpha, models) if a != 0.0) for k in models[0].params}


def _line(alpha, values) -> float:
    return math.fsum(a * v for a, v in zip(alpha, values))


def many_barrier(models: list[Model], batches: list[dict], weights: list[float] | None = None, points: int = 11,
                 simplex_points: int = 16, seed: int = 0, progress: bool = True, dtype=None, device=None) -> dict:
    """The figures of the module docstring, with each pair's curve and each simplex point's values (the
    forward in `dtype` on `device`, as `StockForward`'s)."""
    from ..store.expansion import widest_many

    n = len(models)
    w = check_weights(weights, n)
    models, _ = widest_many(models, [str(m.path) for m in models])  # mixed widths: expanded into the widest
    ev = StockForward(models[0], dtype, device)
    start = time.perf_counter()
    bar = tqdm(total=n + 1 + n * (n - 1) // 2 * (points - 2) + simplex_points, desc="barrier", disable=not progress)

    def at(alpha) -> dict:
        bar.update(1)
        return ev.scores(mix(models, alpha), batches)

    vertex = [[1.0 if j == i else 0.0 for j in range(n)] for i in range(n)]
    ends = [at(v) for v in vertex]
    losses, accs = [r["loss"] for r in ends], [r["accuracy"] for r in ends]
    avg = at(w)
    pairs = []
    lams = [i / (points - 1) for i in range(points)]
    for i, j in itertools.combinations(range(n), 2):
        inner = [at([(1 - lam) * (k == i) + lam * (k == j) for k in range(n)]) for lam in lams[1:-1]]
        curve_l = [losses[i], *(r["loss"] for r in inner), losses[j]]
        curve_a = [accs[i], *(r["accuracy"] for r in inner), accs[j]]
        pairs.append({"pair": [i, j], "loss": curve_l, "accuracy": curve_a, **summarise(lams, curve_l, curve_a)})
    draws = []
    for alpha in dirichlet(n, simplex_points, seed):
        r = at(alpha)
        draws.append({"weights": alpha, "loss": r["loss"], "accuracy": r["accuracy"],
                      "excess": r["loss"] - _line(alpha, losses), "accuracy_drop": _line(alpha, accs) - r["accuracy"]})
    bar.close()
    return {
        "n_models": n, "weights": w, "endpoint_losses": losses, "endpoint_accuracies": accs,
        "average_loss": avg["loss"], "average_loss_se": avg["loss_se"], "average_accuracy": avg["accuracy"],
        "average_excess": avg["loss"] - _line(w, losses), "average_accuracy_drop": _line(w, accs) - avg["accuracy"],
        "pairwise_max": max(p["barrier"] for p in pairs),
        "pairwise_max_accuracy": max(p["accuracy_barrier"] for p in pairs),
        "simplex_barrier": max([0.0, *(d["excess"] for d in draws)]),
        "simplex_accuracy_barrier": max([0.0, *(d["accuracy_drop"] for d in draws)]),
        "simplex_points": simplex_points, "seed": seed, "lambdas": lams, "pairwise": pairs, "simplex": draws,
        "n_batches": len(batches), "seconds": time.perf_counter() - start,
    }


def triangle(models: list[Model], batches: list[dict], resolution: int = 10, progress: bool = True, dtype=None,
             device=None) -> dict:
    """Loss and accuracy on the triangular grid of three models (barycentric steps of 1/resolution)."""
    ev = StockForward(models[0], dtype, device)
    pts = [[i / resolution, j / resolution, (resolution - i - j) / resolution]
           for i in range(resolution + 1) for j in range(resolution + 1 - i)]
    res = [ev.scores(mix(models, p), batches) for p in tqdm(pts, desc="triangle", disable=not progress)]
    return {"points": pts, "loss": [r["loss"] for r in res], "accuracy": [r["accuracy"] for r in res]}


def plot_triangle(grid: dict, path, names: list[str], title: str = "") -> None:
    """The loss over the triangle of three models (filled contours, vertices named)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.tri as mtri

    corners = [(0.0, 0.0), (1.0, 0.0), (0.5, math.sqrt(3) / 2)]
    xy = [(sum(a * c[0] for a, c in zip(p, corners)), sum(a * c[1] for a, c in zip(p, corners))) for p in grid["points"]]
    tri = mtri.Triangulation([x for x, _ in xy], [y for _, y in xy])
    fig, ax = plt.subplots(figsize=(6, 5.4))
    cs = ax.tricontourf(tri, grid["loss"], levels=20, cmap="viridis")
    fig.colorbar(cs, ax=ax, label="loss")
    for (x, y), name in zip(corners, names):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(0, 6 if y > 0 else -14), ha="center")
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or "loss over the simplex of three models", pad=24)
    fig.tight_layout()
    from ..runtime.atomic import write_file

    write_file(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
