"""What glibc keeps of freed memory, handed back to the OS, so that a run's resident memory follows what it holds.

Learned matching materialises each block's weights and frees them again, over and over, beside small allocations
that live longer (each block's saved input). Where freed memory stays in the heap, the resident size grows with
what was once allocated rather than with what is held. Both functions act on glibc (Linux) only; elsewhere, or
where the C library cannot be loaded, they do nothing (the run is the same, its resident memory may be larger).
"""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.lru_cache(maxsize=1)
def large_frees_to_the_os() -> None:
    """Serve every allocation of 1 MiB or more by its own mapping (`M_MMAP_THRESHOLD`, which also stops glibc's
    threshold from rising as big chunks are freed), so that what a block materialises goes back to the OS when it
    is freed, whatever small allocations lie between. Set once per process."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (also stops the dynamic threshold)
    except (OSError, AttributeError):
        pass


def release_freed_heap() -> None:
    """Hand the heap's free pages back to the OS (`malloc_trim`): what was freed before `large_frees_to_the_os`
    took effect (the data's tokenising, the weight-matching start's per-block transients) would otherwise stay
    resident under the frozen stores built next, for the whole run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
