"""Pausing Python's cyclic garbage collector over bursts of allocation that make no garbage cycles.

Loading a program makes an object per instruction and a view per tile; emitting one makes the records. The
collector runs every few hundred allocations and, every tenth time, rescans all the young objects made since
its last full collection, so a burst of long-lived objects is scanned again and again: a quarter of the
load of a 4096^3 matmul program (121k instructions). Paused, it catches up once afterwards.
"""

import contextlib
import gc

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused():
    """Pause the collector inside the block and restore its previous state after (nested blocks leave it to
    the outermost)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
