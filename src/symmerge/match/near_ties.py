"""Near-ties among weight matching's discrete choices: how many, and by how little they were decided.

A choice is fragile when its margin is within the rounding error of the numbers that decided it: then
another machine, torch build or device (whose products sum in another order) may decide it the other
way, and a coordinate descent follows that choice from then on. Two kinds are watched:

- an assignment `p` minimising `sum_i C[i, p_i]`: its margin is the smallest loss of a 2-swap,
  `C[i, p_j] + C[j, p_i] - C[i, p_i] - C[j, p_j]` (>= 0 at the optimum), relative to the sum of the four
  terms' magnitudes (`swap_margin`). A 2-swap bounds the margin from above: a cheaper k-cycle is possible
  but rare, and exact ties (duplicated units, heads) always show as a 2-swap of margin 0;
- the acceptance of a candidate that changes the element: the relative change of the squared distance.

A margin below `NEAR_TIE` times the machine epsilon of the numbers compared is recorded as a near-tie.
`NEAR_TIE` = 2^10: the rounding error of a sum of m terms is about sqrt(m) eps relative to the sum of
their magnitudes, and the costs here sum up to about a million terms. Records go to the innermost
`recording()` of the calling context (worker threads run in a copy of it); the counts and smallest
margins do not depend on the order in which concurrent workers record.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading

import numpy as np

#: margins below this many machine epsilons (of the numbers compared) are near-ties
NEAR_TIE = 2.0 ** 10
#: rows of the 2-swap loss computed at once (memory: 2 x this x n float64)
_ROWS = 256

_current: contextvars.ContextVar = contextvars.ContextVar("near_ties", default=None)


class NearTies:
    """Per kind of choice: choices seen, near-ties among them, the smallest margin seen (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.kinds: dict[str, dict] = {}

    def add(self, kind: str, margin: float, eps: float) -> None:
        with self._lock:
            k = self.kinds.setdefault(kind, {"choices": 0, "near_ties": 0, "smallest_margin": math.inf})
            k["choices"] += 1
            k["near_ties"] += margin <= NEAR_TIE * eps
            k["smallest_margin"] = min(k["smallest_margin"], margin)

    def report(self) -> dict:
        """JSON-able: per kind {choices, near_ties, smallest_margin}, and the total of near-ties."""
        kinds = {k: {**v, "smallest_margin": None if math.isinf(v["smallest_margin"]) else v["smallest_margin"]}
                 for k, v in sorted(self.kinds.items())}
        return {"near_ties": sum(v["near_ties"] for v in kinds.values()), "threshold_eps": NEAR_TIE, "by_choice": kinds}


@contextlib.contextmanager
def recording():
    """Collect the near-ties of the block's choices into a fresh `NearTies` (yielded)."""
    rec = NearTies()
    token = _current.set(rec)
    try:
        yield rec
    finally:
        _current.reset(token)


def note(kind: str, margin: float, eps: float) -> None:
    """Record one choice of `kind` decided by relative `margin` among numbers of machine epsilon `eps`."""
    rec = _current.get()
    if rec is not None:
        rec.add(kind, margin, eps)


def active() -> bool:
    return _current.get() is not None


def swap_margin(cost: np.ndarray, p: np.ndarray) -> float:
    """The smallest relative loss of swapping two rows' columns in the assignment `p` of `cost` [n, n]
    (minimising): min over i != j of `(C[i,p_j] + C[j,p_i] - C[i,p_i] - C[j,p_j]) / (|..| + |..| + |..| + |..|)`;
    inf for n < 2. O(n^2) time, `_ROWS` rows at a time."""
    n = len(p)
    if n < 2:
        return math.inf
    d = cost[np.arange(n), p]  # [n]
    best = math.inf
    for lo in range(0, n, _ROWS):
        rows = np.arange(lo, min(lo + _ROWS, n))
        a1 = cost[rows][:, p]  # [b, n]: C[i, p_j]
        a2 = cost[:, p[rows]].T  # [b, n]: C[j, p_i]
        loss = a1 + a2 - d[rows, None] - d[None, :]
        scale = np.abs(a1) + np.abs(a2) + np.abs(d[rows, None]) + np.abs(d[None, :])
        rel = loss / np.maximum(scale, np.finfo(np.float64).tiny)
        rel[np.arange(len(rows)), rows] = np.inf  # i == j is no swap
        best = min(best, float(rel.min()))
    return max(best, 0.0)
