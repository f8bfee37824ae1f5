"""Wall time by kind of work, for the reports' `seconds_by_step_kind`."""

from __future__ import annotations

import contextlib
import time


class Timer:
    """`with timer(kind):` adds the block's wall time to `seconds[kind]` (also when the block raises)."""

    def __init__(self, seconds: dict):
        self.seconds = seconds

    @contextlib.contextmanager
    def __call__(self, kind: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t0
