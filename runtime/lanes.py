"""A second host process for the emulator: a segment of many small steps (the steps between two barrier
releases) runs as two lanes of cores (emulator._two_lanes), the second's in a worker process forked from this
one.

Why a process: a plan's steps are many small numpy calls (a tile per call), and two Python threads running
them hand the GIL back and forth at every call: measured slower than one thread (the decoder block of
``bench/peers.py``: 5.9 -> 7.5 ms). A forked process holds its own copy of the plan (the closures) and shares the
memories (:func:`shared_zeros`: anonymous shared mappings), so each lane runs without the other's GIL.

Why this is the same computation: in a segment, cores meet nowhere (the loader proves no two cores touch the same
device bytes unordered, :class:`~.schedule._Races`, and scratchpads are per core), so the cores of one lane never
read what the other lane writes; each core's steps keep their order; and each step computes exactly what it
computes in one process (BLAS per core, elementwise functions by element). Barrier deliveries (ring copies and
the sums of a reduce), host operations, gathers and RESTICK run in this process, outside the lanes.

The protocol is a control block in shared memory: this process writes the lane to run next (``GO``), the worker
writes what it finished (``DONE``), and each waits by spinning, then in short naps (a pipe or futex round trip
is 50-100 us on a virtual machine, as long as a small segment). It relies on x86's total store order (the
worker's stores to the memories are seen before its ``DONE``), so it is used on x86-64 Linux only. Between runs
the worker blocks on a pipe; it exits when its executable is dropped, when this process exits, or when killed.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import mmap
import os
import platform
import signal
import sys
import time
import traceback
import warnings
import weakref

import numpy as np

__all__ = ["available", "shared_zeros", "Worker", "WorkerError", "make_room", "tick"]

_GO, _DONE, _FAILED, _CPU = range(4)
_IDLE = (1 << 20) - 1           # the lane index that ends a run: the worker goes back to the pipe
_MSG = 4096                     # bytes of the failure message area
_SPINS = 256                    # tries a wait spins (~0.1-0.3 ms) before it naps
_NAP = 20e-6                    # seconds a nap asks for (the kernel's timer slack makes it ~60-80 us)
_LIVE_MAX = 4                   # workers alive at once; the least recently used is stopped for a new one ...
_STALE = 64                     # ... once this many runs (of any program with lanes) went by since its last run
_LIVE: collections.OrderedDict = collections.OrderedDict()     # pid -> weakref to Worker, least recently used first
_RUNS = [0]                     # runs of programs with lanes so far (tick)
_COLLECTED = [-_STALE]          # the run count at make_room's last garbage collection


class WorkerError(RuntimeError):
    """The worker failed a lane (its message) or died."""


def available() -> bool:
    """Whether runs may use a worker process: Linux on x86-64 (the store order the protocol needs), ``fork``,
    at least two CPUs this process may run on, and ``SPYRE_EMU_WORKERS`` not ``0``."""
    return (os.environ.get("SPYRE_EMU_WORKERS", "1") != "0" and sys.platform == "linux"
            and platform.machine() in ("x86_64", "AMD64") and hasattr(os, "fork")
            and len(os.sched_getaffinity(0)) >= 2)


def shared_zeros(n: int, dtype) -> np.ndarray:
    """``n`` zeros of ``dtype`` in anonymous shared memory: a worker forked later sees the same bytes."""
    nbytes = n * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), np.uint8, count=nbytes).view(dtype)


def _spin(ready, alive) -> None:
    """Wait until ``ready()``: spinning first (yielding the CPU at each try), then in short sleeps, so that a
    waiter sharing a CPU with the process it waits for does not take that CPU's time from it. Every thousand
    tries or so, check ``alive()`` (raises or exits when it fails)."""
    n = 0
    while not ready():
        n += 1
        if n < _SPINS:
            os.sched_yield()
        else:
            time.sleep(_NAP)
        if n & 1023 == 0:
            alive()


def _serve(ctl: np.ndarray, msg: np.ndarray, wake: int, lanes: list, parent: int) -> None:
    """The worker's loop: wait on the pipe for a run, then run each lane ``GO`` names until the run ends."""
    seen = 0

    def orphaned():
        if os.getppid() != parent:
            os._exit(0)

    with np.errstate(all="ignore"):
        while os.read(wake, 1):
            while True:
                _spin(lambda: int(ctl[_GO]) != seen, orphaned)
                seen = int(ctl[_GO])
                k = seen & _IDLE
                if k == _IDLE:
                    ctl[_CPU] = time.process_time_ns()
                    ctl[_DONE] = seen
                    break
                try:
                    for step in lanes[k]:
                        step()
                except BaseException as e:         # noqa: BLE001 - reported to the parent, which raises it
                    text = "".join(traceback.format_exception_only(type(e), e)).strip().encode()[:_MSG - 1]
                    msg[:len(text)] = np.frombuffer(text, np.uint8)
                    msg[len(text)] = 0
                    ctl[_FAILED] = 1
                ctl[_DONE] = seen


def _child(ctl, msg, wake, lanes, parent, close) -> None:
    try:
        for fd in close:
            os.close(fd)
        gc.disable()        # nothing of the parent's is collected here (no finalizer of its runs twice)
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # ^C interrupts the parent, which stops this one
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG: die with the parent
        except (OSError, AttributeError):
            pass
        if os.getppid() == parent:
            _serve(ctl, msg, wake, lanes, parent)
    finally:
        os._exit(0)


def _stop(pid: int, wake: int, reaped: list, owner: int) -> None:
    _LIVE.pop(pid, None)
    os.close(wake)
    # Once reaped, the pid may be another process's; and a process forked from the owner (a user's fork) has a
    # copy of this object, not the worker.
    if not reaped and os.getpid() == owner:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass


def tick() -> None:
    """Count a run of a program with lanes (how recently a worker was used, :func:`make_room`)."""
    _RUNS[0] += 1


def make_room() -> bool:
    """Whether a new worker may start: fewer than ``_LIVE_MAX`` are alive, or the least recently used ones that
    no run used in the last ``_STALE`` runs are stopped for it. Not one in a run on another thread (which waits on
    it), nor one of the programs run in turn: five programs with lanes called one after another forked a
    worker at every call (the CNN: 28.8 ms a call, 5.0 ms for four); the program left without one runs its lanes
    in its own process until one is stale."""
    if len(_LIVE) >= _LIVE_MAX and _RUNS[0] - _COLLECTED[0] >= _STALE:
        # Workers of executables dropped but not yet collected (their plans and machines refer to one another)
        # hold their places: collect them, at most once in _STALE runs.
        _COLLECTED[0] = _RUNS[0]
        gc.collect()
    for pid in list(_LIVE):
        if len(_LIVE) < _LIVE_MAX:
            break
        ref = _LIVE.get(pid)
        old = ref() if ref is not None else None
        if old is not None and (old.busy or _RUNS[0] - old.last_run < _STALE):
            continue
        _LIVE.pop(pid, None)
        if old is not None:
            old.close()
    return len(_LIVE) < _LIVE_MAX


class Worker:
    """A forked process that runs the second lane of each :class:`~.emulator.Lanes` step (``lanes[k]``: the
    steps of lane ``k``). :meth:`begin` a run, :meth:`go` and :meth:`wait` for each lane, :meth:`end` the run.
    Made where :func:`make_room` found room (threads racing for the last place may exceed the cap by one)."""

    def __init__(self, lanes: list):
        self.busy, self.last_run = False, _RUNS[0]
        block = np.frombuffer(mmap.mmap(-1, 8 * 8 + _MSG), np.uint8)
        self.ctl, self.msg = block[:64].view(np.int64), block[64:]
        r, w = os.pipe()
        others = [x._wake for x in (ref() for ref in _LIVE.values()) if x is not None]
        parent = os.getpid()
        try:
            with warnings.catch_warnings():     # 3.12+ warns of threads: the child runs none of their code
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:
            _child(self.ctl, self.msg, r, lanes, parent, [w] + others)
        os.close(r)
        self.pid, self._wake, self._want, self._reaped = pid, w, 0, []
        self._finalizer = weakref.finalize(self, _stop, pid, w, self._reaped, parent)
        _LIVE[pid] = weakref.ref(self)

    @property
    def cpu_seconds(self) -> float:
        """CPU time the worker has used, up to the end of the last run (its waits by spinning included)."""
        return int(self.ctl[_CPU]) / 1e9

    @property
    def alive(self) -> bool:
        """Not stopped, and the process still there (killed from outside, it is stopped here)."""
        if self._finalizer.alive:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                    return True
            except ChildProcessError:       # gone, or not this process's child (a copy in a user's fork)
                pass
            self._reaped.append(True)
            self.close()
        return False

    def close(self) -> None:
        self._finalizer()

    def _check(self) -> None:
        if not self.alive:
            raise WorkerError("the emulator's worker process died")

    def begin(self) -> None:
        _LIVE.move_to_end(self.pid)
        self.busy, self.last_run = True, _RUNS[0]
        os.write(self._wake, b"r")

    def go(self, k: int) -> None:
        self._want = ((self._want >> 20) + 1 << 20) | k
        self.ctl[_GO] = self._want

    def wait(self) -> None:
        _spin(lambda: int(self.ctl[_DONE]) == self._want, self._check)
        if self.ctl[_FAILED]:
            self.ctl[_FAILED] = 0
            text = bytes(self.msg[:int(np.argmin(self.msg))]).decode(errors="replace")
            raise WorkerError(text)

    def end(self) -> None:
        self.go(_IDLE)
        self.wait()
        self.busy = False
