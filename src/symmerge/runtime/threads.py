"""Arithmetic that does not depend on the thread count: torch's CPU work pinned to one thread.

torch splits a reduction (`sum`, a matrix product's blocks in MKL, a LAPACK factorisation's BLAS calls)
among its intra-op threads and combines the partial results in an order that depends on how many there
are, so the last bits of a float64 cost change with `torch.get_num_threads()` (or `OMP_NUM_THREADS`).
A discrete choice taken on such costs (an assignment, the acceptance of a candidate) can flip on a
near-tie, and a coordinate descent follows the flip from then on. Inside `one_thread()` every CPU op
runs on one thread, in one fixed order, so a computation gives the same bits at any thread count of the
process.

Where it fails: the bits are those of this machine's library build and CPU code path (MKL and oneDNN
pick kernels by instruction set), so another CPU model or torch build may differ in the last bits; work
placed on a GPU runs in the GPU's own order. Speed comes back by running independent pieces of work
in threads of their own (`weight_stream.StreamRun.sweep`), each single-threaded, whose results are then
combined in a fixed order.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_lock = threading.Lock()
_depth = 0
_saved = 1


@contextlib.contextmanager
def one_thread():
    """torch's intra-op CPU threads set to 1 for the block (nestable; restored on the way out)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = torch.get_num_threads()
            torch.set_num_threads(1)
        _depth += 1
    try:
        yield _saved
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.set_num_threads(_saved)

