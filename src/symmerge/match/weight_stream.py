"""Weight matching streamed from checkpoints: one part (embeddings, a block, the head) of each model
at a time, the block's own groups solved given the residual element, and the residual statistics
(`residual.ResidualFit`) accumulated on the way (see `weight.py` for the method).

Reuse: a part that no chosen group but the residual ones acts on (the embeddings and head; every
block when no per-layer group is chosen) has the same statistics in every sweep, since B's part
under the other groups never changes: they are computed once, in the start pass, and sweeps do not
read that part again. The start pass needs the cross-covariances only of those parts (the first
residual element comes from the ends); of the others it takes the squared distances at the
starting element, which is what the starting objective needs.
"""

from __future__ import annotations

import contextvars
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch

from ..algebra import groups as G
from ..algebra.apply import apply
from ..algebra.spec import Spec
from .residual import ROTATION, SCALE, ResidualFit
from .timer import Timer
from .weight_products import Products
from .weight_state import State
from .weight_steps import descend


def sources(A, B, dtype):
    """A and B served part by part (`model.as_parts`: one in memory through a view in `dtype`)."""
    from ..store.model import as_parts

    return as_parts(A, dtype), as_parts(B, dtype)


class StreamRun:
    """The state of one weight-matching run: the current element, and one method per part visited.

    Each part lives only inside the method that reads it, so at most one part of each model is held."""

    def __init__(self, spec: Spec, src_a, src_b, chosen: set[str], g: dict, products: str | None = None,
                 device: torch.device | None = None):
        self.spec, self.src_a, self.src_b, self.chosen, self.g = spec, src_a, src_b, chosen, g
        # the precision of the assignment costs' products and where they run (`weight_products`); `device` also
        # runs the residual rotation of B's blocks, the cross-covariances and the Procrustes solves
        self.products, self.device = Products(products, device), device
        self.res_groups = [n for n in (ROTATION, SCALE) if n in spec.groups]
        self.fixed = self.fit()  # the statistics of the parts that never change (`fixed_parts`)
        self.fixed_parts = self._fixed_parts()
        # at the identity B's parts need no moving for the starting objective (apply would still multiply)
        self.starts_at_identity = all(torch.equal(x, G.identity(spec.groups[n])) for n, x in g.items())
        self.steps = self.rejected = 0
        self.seconds: dict[str, float] = {}
        self.timer = Timer(self.seconds)

    def fit(self) -> ResidualFit:
        """Empty residual statistics, their products on the run's device."""
        return ResidualFit(self.spec, self.device)

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.g[ROTATION], self.g.get(SCALE, torch.tensor(1.0, dtype=G.DTYPE))

    def set_residual(self, r: torch.Tensor, a: torch.Tensor) -> None:
        self.g[ROTATION] = r
        if SCALE in self.g:
            self.g[SCALE] = a

    def _fixed_parts(self) -> set:
        """The parts no chosen group but the residual ones acts on (their statistics never change)."""
        from ..store.parts import part_keys, part_of

        moving = {part_of(name) for name, acts in self.spec.actions.items()
                  if any(a.group in self.chosen and a.group not in self.res_groups for a in acts)}
        return {key for key in part_keys(self.spec.shape) if key not in moving}

    def _read(self, key):
        from ..store.compatible import check_same_tensors

        with self.timer("reading"):
            pa, pb = self.src_a.part(key), self.src_b.part(key)
        check_same_tensors(pa, pb)
        return pa, pb

    def _without_residual(self, pb: dict) -> dict:
        return apply(self.spec, {n: x for n, x in self.g.items() if n not in self.res_groups}, pb)

    def _rotated(self, pb: dict) -> dict:
        """B's part under the residual groups (the products on the run's device, the result where pb is)."""
        g = {n: self.g[n] for n in self.res_groups}
        if self.device is None:
            return apply(self.spec, g, pb)
        dev = torch.device(self.device)
        moved = apply(self.spec, {n: x.to(dev) for n, x in g.items()}, {k: v.to(dev) for k, v in pb.items()})
        return {k: v.to(pb[k].device) for k, v in moved.items()}

    def start_part(self, key, total: ResidualFit, ends: ResidualFit) -> None:
        """The start pass: `total` gets the part's terms of the starting objective, `ends` (embeddings and
        head) its statistics, and `fixed` those of a part that never changes."""
        pa, pb = self._read(key)
        with self.timer("residual statistics"):
            if key in self.fixed_parts or not isinstance(key, int):
                part = self.fit()
                part.add(pa, self._without_residual(pb))
                if not isinstance(key, int):
                    ends.merge(part)
                if key in self.fixed_parts:
                    self.fixed.merge(part)
                    total.merge(part)
                    return
            total.add_distances(pa, pb if self.starts_at_identity else apply(self.spec, self.g, pb))

    def new_fit(self) -> ResidualFit:
        """A sweep's statistics, holding those of the parts that never change already (kept from the start
        pass: sweeps read only the other parts)."""
        fit = self.fit()
        fit.merge(self.fixed)
        return fit

    def sweep(self, keys, fit: ResidualFit, first: bool, workers: int = 1, done=None) -> None:
        """One sweep over the parts `keys`, in order: each block's own groups given the residual element,
        then its residual statistics added to `fit`. `done()` is called after each part (a progress bar).

        `workers` > 1 solves that many blocks at once, in threads: a block's groups act on its own tensors
        only and the residual element does not move within a sweep, so the blocks are independent; the
        parts are still read one at a time, and each block's element and statistics are taken in the
        order of `keys` on this thread, so the result is bit for bit that of `workers=1` when each block's
        arithmetic is itself single-threaded (`weight.weight_match` runs under `threads.one_thread`).
        Memory: up to `workers` blocks of both models and their transients at once instead of one."""
        done = done or (lambda: None)
        if workers <= 1:
            for key in keys:
                pa, pb = self._read(key)
                self._finish(key, pa, pb, self._solve(key, pa, pb, first, self._block_g(key)), fit)
                done()
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="sweep") as pool:
            pending = deque()  # (key, pa, pb, future of `_solve`), in the order of keys
            for key in keys:
                if len(pending) == workers:
                    self._finish_future(pending.popleft(), fit)
                    done()
                pa, pb = self._read(key)
                context = contextvars.copy_context()  # the caller's `near_ties.recording()` reaches the worker
                pending.append((key, pa, pb, pool.submit(context.run, self._solve, key, pa, pb, first,
                                                         self._block_g(key))))
            while pending:
                self._finish_future(pending.popleft(), fit)
                done()

    def _block_g(self, key) -> dict:
        """The current element of the groups that live in part `key` (a block's own groups)."""
        return {n: x for n, x in self.g.items() if self.spec.groups[n].layer == key}

    def _solve(self, key, pa: dict, pb: dict, first: bool, g_block: dict):
        """A block's own groups given the residual element (one `descend`): (their new element, steps,
        rejected steps, seconds by kind). Reads only `pa`, `pb`, `g_block` and the residual element, so
        blocks can be solved concurrently (`sweep`)."""
        seconds: dict[str, float] = {}
        layer = {n for n in self.chosen if self.spec.groups[n].layer == key} if isinstance(key, int) else set()
        if not layer:
            return {}, 0, 0, seconds
        with Timer(seconds)("applying"):
            pr = self._rotated(pb)
        st = State(self.spec, pa, pr, g_block, self.products)
        n_steps, n_rej = descend(st, layer, first, seconds)
        return st.g, n_steps, n_rej, seconds

    def _finish_future(self, item, fit: ResidualFit) -> None:
        key, pa, pb, future = item
        self._finish(key, pa, pb, future.result(), fit)

    def _finish(self, key, pa: dict, pb: dict, solved, fit: ResidualFit) -> None:
        """Take a block's solution into the element, then add its residual statistics to `fit`."""
        g, n_steps, n_rej, seconds = solved
        self.g.update(g)
        self.steps, self.rejected = self.steps + n_steps, self.rejected + n_rej
        for kind, t in seconds.items():
            self.seconds[kind] = self.seconds.get(kind, 0.0) + t
        with self.timer("residual statistics"):
            fit.add(pa, self._without_residual(pb))

