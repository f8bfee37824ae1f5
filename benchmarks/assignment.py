"""Linear assignment for weight matching: scipy's linear_sum_assignment vs a pure-torch auction.

The FFN permutation step solves one n x n assignment per layer (n = d_mlp: 4096 for Pythia-410M,
8192 for Pythia-1.4B). lapjv/lap are not installed, so the alternative measured here is Bertsekas'
auction with epsilon scaling, vectorised in torch (all unassigned rows bid at once). Score matrices
are built like the real ones: a planted permutation plus noise (`--noise` is the noise/signal ratio),
so that the easy and the hard regimes both show.

    PYTHONPATH=src python benchmarks/assignment.py --sizes 512 2048 4096 --noise 0.5 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import record
import torch
from scipy.optimize import linear_sum_assignment


def auction(score: torch.Tensor, eps_final: float | None = None, max_rounds: int = 100_000) -> torch.Tensor:
    """p maximising sum_i score[i, p[i]] to within n * eps_final (Jacobi auction, epsilon scaling)."""
    n = score.shape[0]
    span = float(score.max() - score.min()) or 1.0
    eps_final = eps_final if eps_final is not None else span * 1e-7 / n
    price = torch.zeros(n, dtype=score.dtype)
    eps = span / 4
    while True:
        owner = torch.full((n,), -1, dtype=torch.long)  # object -> person
        assigned = torch.full((n,), -1, dtype=torch.long)  # person -> object
        for _ in range(max_rounds):
            free = (assigned < 0).nonzero().squeeze(1)
            if free.numel() == 0:
                break
            val = score[free] - price  # [f, n]
            top = val.topk(2, dim=1)
            bid = price[top.indices[:, 0]] + top.values[:, 0] - top.values[:, 1] + eps
            obj = top.indices[:, 0]
            # each object goes to its highest bidder
            best = torch.full((n,), -float("inf"), dtype=score.dtype).scatter_reduce(0, obj, bid, "amax")
            win = bid == best[obj]
            winners, won = free[win], obj[win]
            won, first = np.unique(won.numpy(), return_index=True)  # ties: one winner per object
            won, winners = torch.from_numpy(won), winners[torch.from_numpy(first)]
            prev = owner[won]
            assigned[prev[prev >= 0]] = -1
            owner[won], assigned[winners] = winners, won
            price[won] = best[won]
        if eps <= eps_final:
            return assigned
        eps = max(eps / 8, eps_final)


def planted(n: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(n, 64, generator=gen, dtype=torch.float64)
    b = a[torch.randperm(n, generator=gen)] + noise * torch.randn(n, 64, generator=gen, dtype=torch.float64)
    return a @ b.T


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.5, 4.0])
    record.add_argument(ap, "assignment")
    args = ap.parse_args()
    rows = []
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"{'n':>6} {'noise':>6} {'scipy s':>9} {'auction s':>10} {'auction/scipy':>14} {'value gap':>10}")
    for n in args.sizes:
        for noise in args.noise:
            s = planted(n, noise, torch.Generator().manual_seed(n))
            t0 = time.perf_counter()
            r, c = linear_sum_assignment(s.numpy(), maximize=True)
            t1 = time.perf_counter()
            p = auction(s)
            t2 = time.perf_counter()
            best = float(s.numpy()[r, c].sum())
            got = float(s[torch.arange(n), p].sum())
            print(f"{n:>6} {noise:>6} {t1 - t0:>9.3f} {t2 - t1:>10.3f} {(t2 - t1) / (t1 - t0):>14.1f} "
                  f"{(best - got) / abs(best):>10.1e}")
            rows.append([n, noise, f"{t1 - t0:.3f}", f"{t2 - t1:.3f}", f"{(t2 - t1) / (t1 - t0):.0f}",
                         f"{(best - got) / abs(best):.1e}"])
    key = f"sizes {' '.join(map(str, args.sizes))}, noise {' '.join(map(str, args.noise))}"
    record.save(args.results, "assignment", key, key, [record.table(
        "seconds per problem", ["n", "noise", "scipy (s)", "auction (s)", "auction / scipy", "value gap"], rows)])


if __name__ == "__main__":
    main()
