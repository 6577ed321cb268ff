"""The emulator's machine: device memory, per-core scratchpads, and the units that act on them.

Memories are plain byte arrays (numpy uint8) sized to what the program declares and uses; the loader has
already proved every access in bounds and every read initialized, so this module only moves bytes and
computes. What each instruction does lives here: :class:`Machine` turns the loader's decoded instructions
into a plan of closures over precomputed numpy views (:class:`TileView`, :class:`Copy`), built once at
load; a call walks the plan and each step is a handful of vectorized numpy operations per tile.

Numerics:

* ``faithful``: values live only as encoded bytes. PT and SFU decode their operands (DLFloat16 bit-exact via
  ``formats``), compute in fp32 (int32 for int x int matmuls) and round on write to the destination format.
* ``fp32-reference``: the same program with rounding removed. Every memory carries a float32 *shadow*, one
  slot per byte address; an element's exact value sits in the slot of its first byte. Every write stores
  the unrounded fp32 value there (bytes are still written, rounded, so byte-level code stays identical),
  DMA and ring copies move the shadow along with the bytes, and every read takes the shadow. Constants
  are what the file holds (already rounded by the compiler); int4 tiles have no shadow (two values per
  byte) and always read their codes. Comparing both modes separates compile bugs from rounding.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from spyre_mlir.errors import SpyreError

from . import lanes as _lanes_mod, native
from .formats import STICK_BYTES, Format, decode, dlf16_encode, encode
from .hostops import run_host_op
from .isa import INSTR_DTYPE, ROOT_ALL, MatmulFlag, Op, ReduceFn, SfuFn, tile_pitch
from .schedule import Sync, bits, sticks

__all__ = ["Memory", "TileView", "TileList", "tiles", "WindowView", "Copy", "Restick", "Machine", "to_storage",
           "INT_RANGE", "sfu_eval", "reduce_eval", "NUMERICS", "Frozen", "Shared", "Once", "block_sticks",
           "SpyreRuntimeError", "one_blas_thread"]

NUMERICS = ("faithful", "fp32-reference")


_BLAS: list | None = None      # (a BLAS library's threadpoolctl controller, its setter), found at the first run


class one_blas_thread:
    """A context in which numpy's BLAS runs on the calling thread only. The emulator makes many small matmuls
    (a tile per core); OpenBLAS's fork/join per call costs more than it gains at those sizes, and on a busy
    host its spinning threads slow each call by 10-100x (a 1024^3 matmul program: 1.5 s -> 0.37 s). Set through
    the libraries' own controllers, found once: ``ThreadpoolController.limit`` took 20-50 us a run (an MLP's run
    is ~0.4 ms); this takes ~2 us. With the library's own setter: threadpoolctl's (3.6+) leaves OpenBLAS alone
    when another Python thread set it first, and a run from a second thread then kept OpenBLAS's threads (the
    1024^3 matmul: 40 -> 932 ms a call). Runs take turns (``Executable``), so they never set it at once."""

    def __enter__(self):
        global _BLAS
        if _BLAS is None:
            try:
                from threadpoolctl import ThreadpoolController
                _BLAS = [(c, getattr(c, "_real_set_num_threads", c.set_num_threads))
                         for c in ThreadpoolController().select(user_api="blas").lib_controllers]
            except ImportError:       # optional at run time: only speed depends on it
                _BLAS = []
        self.before = [(c.get_num_threads(), set_threads) for c, set_threads in _BLAS]
        for _, set_threads in self.before:
            set_threads(1)
        return self

    def __exit__(self, *exc) -> None:
        for n, set_threads in self.before:
            set_threads(n)


class SpyreRuntimeError(SpyreError, RuntimeError):
    """A run failed on data the loader could not see (e.g. a gather index out of range)."""


class Memory:
    """A byte-addressed memory with an optional float32 shadow (fp32-reference mode)."""

    def __init__(self, nbytes: int, shadow: bool, shared: bool = False):
        # ``shared``: with a worker process (runtime/lanes.py); private memory is faster where there is none (it
        # may get huge pages: the 1024^3 matmul ran 26 -> 32 ms a call in shared memory).
        zeros = _lanes_mod.shared_zeros if shared else np.zeros
        self.shared = shared
        self.bytes = zeros(nbytes, np.uint8)
        self.shadow = zeros(nbytes, np.float32) if shadow else None

    def part(self, start: int, nbytes: int) -> "Memory":
        """Bytes [start, start + nbytes) as a memory of their own (views, not copies)."""
        m = Memory.__new__(Memory)
        m.shared = self.shared
        m.bytes = self.bytes[start:start + nbytes]
        m.shadow = None if self.shadow is None else self.shadow[start:start + nbytes]
        return m


INT_RANGE = {Format.INT8: (-128, 127), Format.INT4: (-8, 7), Format.INT32: (-(2**31), 2**31 - 1),
              Format.INT64: (-(2**63), 2**63 - 1)}


def to_storage(fmt: Format, x) -> np.ndarray:
    """Values -> the format's storage array, the way a unit writes them: floats round (DLFloat16 bit-exact,
    saturating), integers round half to even and saturate (NaN -> 0), bool is ``x != 0``."""
    if fmt.is_float or fmt.exact_storage:
        return encode(fmt, x)
    x = np.asarray(x)
    if fmt is Format.BOOL:
        return x != 0
    lo, hi = INT_RANGE[fmt]
    if x.dtype.kind == "f":
        x = np.clip(np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0), lo, hi)
    elif x.dtype.kind in "iu" and x.size and (x.min() < lo or x.max() > hi):
        x = np.clip(x, lo, hi)
    return encode(fmt, x.astype(np.int64))


# to_storage of the formats tiles use most, without its dispatch (the same functions it calls).
_ENCODERS = {Format.DLF16: dlf16_encode, Format.FP32: lambda x: np.asarray(x, dtype=np.float32)}

_LUTS: dict[Format, np.ndarray] = {}


def _lut(fmt: Format) -> np.ndarray | None:
    """Decode table of a 8/16-bit float format: every bit pattern decoded once by ``formats.decode``, so a
    tile decodes with one gather, and stays bit-exact by construction."""
    if fmt not in (Format.DLF16, Format.BF16, Format.FP8_E4M3, Format.FP8_E5M2):
        return None
    if fmt not in _LUTS:
        dt = fmt.storage_dtype
        _LUTS[fmt] = decode(fmt, np.arange(1 << (8 * dt.itemsize), dtype=np.int64).astype(dt))
    return _LUTS[fmt]


class TileView:
    """A dense [rows, cols] region of ``fmt`` at ``addr`` (row pitch padded to sticks), as numpy views.

    Used for scratchpad tiles and for whole device buffers (same layout). Writes zero the row padding so
    the bytes of a region never depend on what was there before. With ``count`` > 1 it is that many such
    regions ``step`` bytes apart (the same tile on several cores' scratchpads), seen as [count, rows, cols].
    ``count`` and ``step`` may be pairs: a [count0, count1] grid of regions ``step`` bytes apart along each (each
    core's part of a tile, cores of a grid row at another offset), still seen as [count0 x count1, rows, cols].
    """

    def __init__(self, mem: Memory, addr: int, rows: int, cols: int, fmt: Format, count=0, step=0):
        counts = tuple(count) if isinstance(count, tuple) else (count,) if count else ()
        steps = tuple(step) if isinstance(step, tuple) else (step,) if count else ()
        self.fmt, self.rows, self.cols = fmt, rows, cols
        self.shape = ((math.prod(counts),) if counts else ()) + (rows, cols)
        self._grid = len(counts) > 1        # its arrays are [count0, count1, ...]: reshaped on every access
        # A write takes values of the whole shape: a grid's reshaped, int4's packed in pairs along the rows. Any
        # other write broadcasts as it is assigned (an explicit broadcast cost ~3 us a write).
        self._whole = self._grid or fmt is Format.INT4
        self._grid_shape = counts + (rows, cols)
        pitch = tile_pitch(cols, fmt)
        rb = fmt.nbytes(cols)

        def regions(a: np.ndarray) -> np.ndarray:
            return _strided(a, addr, counts + (rows, pitch), steps + (pitch, 1))
        region = regions(mem.bytes)
        self.raw = region[..., :rb]
        self.pad = region[..., rb:]
        self.store = self.raw if fmt in (Format.INT4, Format.BOOL) else self.raw.view(fmt.storage_dtype)
        self.shadow = self.shadow_pad = None
        if mem.shadow is not None and fmt is not Format.INT4 and not fmt.exact_storage:
            sreg = regions(mem.shadow)
            self.shadow = sreg[..., 0:rb:fmt.bits // 8]
            self.shadow_pad = sreg[..., rb:]
        self._lut = _lut(fmt)
        self._encode = _ENCODERS.get(fmt) or (lambda x: to_storage(fmt, x))
        self._native = native.Dlf16Tile(self.store) if fmt is Format.DLF16 and native.available() else None
        self._native_first = None       # the codes of one tile: write_one

    def _flat(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.shape) if self._grid else a

    def read_bytes(self) -> np.ndarray:
        """Decode the stored bytes: float32 for float formats, integers for integer formats. A new array."""
        if self._native is not None:
            return self._flat(self._native.decode())
        if self._lut is not None:
            # take with intp indices: numpy's fast gather (indexing by the uint16 codes, or strided ones, is
            # about twice as slow).
            return self._flat(np.take(self._lut, self.store.astype(np.intp)))
        if self.fmt is Format.BOOL:
            return self._flat(self.raw != 0)
        return self._flat(decode(self.fmt, self.store, self.cols))

    def read(self) -> np.ndarray:
        """The values a unit sees: the shadow in fp32-reference mode, else the decoded bytes."""
        return self._flat(self.shadow) if self.shadow is not None else self.read_bytes()

    def read_new(self) -> np.ndarray:
        """:meth:`read` as a new array (a copy of the shadow), which the caller owns."""
        return self._flat(self.shadow).copy() if self.shadow is not None else self.read_bytes()

    def peek(self) -> np.ndarray:
        """:meth:`read`, as a view of the memory where it is one (fp32 tiles): for arithmetic whose result
        does not depend on the operand's layout (IEEE +, -, *, /, sqrt, min/max, compares), never kept."""
        return self._flat(self.store) if self.shadow is None and self.fmt is Format.FP32 else self.read()

    def write(self, values) -> None:
        """Round ``values`` (broadcastable to the view's shape) into the format; keep the exact value in the
        shadow when there is one."""
        if self._whole:
            if np.shape(values) != self.shape:
                values = np.broadcast_to(values, self.shape)
            if self._grid:
                values = values.reshape(self._grid_shape)
        self._store(values)
        if self.pad.size:
            self.pad[...] = 0
        if self.shadow is not None:
            self.shadow[...] = values
            self.shadow_pad[...] = 0

    def _store(self, values) -> None:
        if self._native is not None:
            self._native.encode(values)
        else:
            self.store[...] = self._encode(values)      # BOOL and INT4: store is the raw bytes

    def write_one(self, values) -> None:
        """:meth:`write` of the same values (broadcastable to one tile) to each of the ``count`` tiles, rounded
        once."""
        values = np.broadcast_to(values, (1,) + self.shape[1:])
        if self._native is not None and self.shape[0] > 1:
            # The native encode of a broadcast rounds it once per tile: round it once, copy the codes to every
            # tile (a cast of a tile all 32 cores hold: 4x faster). Rounded apart, not in the first tile, as a
            # copy whose source overlaps its destination costs numpy three times as much.
            if self._native_first is None:
                self._native_first = native.Dlf16Tile(np.empty((1,) * (self.store.ndim - 2) + self.shape[1:],
                                                               np.uint16))
            self._native_first.encode(values)
            np.copyto(self.store, self._native_first.codes)
        else:
            self._store(values)
        if self.pad.size:
            self.pad[...] = 0
        if self.shadow is not None:
            self.shadow[...] = values
            self.shadow_pad[...] = 0


class WindowView:
    """MATMUL's B operand read through a column window (flag WINDOW): column j is the stored tile's column
    ``offset + j * stride``, zero where that is outside the tile's ``width`` columns (a convolution's shifted,
    strided input columns and its zero padding). Reads like the view it wraps ([rows, cols] or batched)."""

    def __init__(self, view, width: int, offset: int, stride: int, n: int):
        cols = offset + stride * np.arange(n)
        self.view, self.ok = view, (cols >= 0) & (cols < width)
        self.cols = cols[self.ok]
        # The columns in the window are outputs [lo, hi), stored columns first, first + stride, ...: a basic
        # slice, several times faster than a masked fancy-index copy at a convolution's small tiles.
        inside = np.flatnonzero(self.ok)
        self.lo, self.hi = (int(inside[0]), int(inside[-1]) + 1) if inside.size else (0, 0)
        first = offset + stride * self.lo
        self.src = slice(first, first + stride * (self.hi - self.lo - 1) + 1, stride) if inside.size else None

    def read(self) -> np.ndarray:
        t = self.view.read()
        out = np.empty(t.shape[:-1] + (self.ok.size,), t.dtype)
        out[..., :self.lo] = 0
        out[..., self.hi:] = 0
        if self.src is not None:
            out[..., self.lo:self.hi] = t[..., self.src]
        return out


class TransposedView:
    """MATMUL's B operand stored transposed (flag TRANS_B): the stored [N, K] tile read as [K, N], contiguous,
    so BLAS sums exactly as for the same B stored [K, N]. A constant (:class:`Frozen`, a weight) is transposed
    once per load. The pieces of one output tile multiply the same B (and a sibling's) one after another: another
    read-only value (a decode kept for rereads) is transposed once for them."""

    _last = ()      # ((read-only value, its contiguous transpose), ...), newest first: one tuple, swapped whole
    KEEP = 4

    def __init__(self, view):
        self.view = view
        if (shape := getattr(view, "shape", None)) is not None:
            self.shape = shape[:-2] + shape[:-3:-1]

    def read(self) -> np.ndarray:
        if isinstance(self.view, Frozen):
            return self.view.transposed()
        v = self.view.read()
        last = TransposedView._last
        for value, t in last:
            if value is v:
                return t
        t = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=np.float32)
        if not v.flags.writeable:
            TransposedView._last = ((v, t),) + last[:self.KEEP - 1]
        return t


class TileList:
    """The same tile shape at offsets that are not evenly spaced (cores using different addresses for it):
    one view per tile, read as one [count, rows, cols] array. The rare case; :class:`TileView` is the fast one."""

    def __init__(self, mem: Memory, offsets, rows: int, cols: int, fmt: Format):
        self.views = [TileView(mem, o, rows, cols, fmt) for o in offsets]
        self.shape = (len(offsets), rows, cols)

    def read_bytes(self) -> np.ndarray:
        return np.stack([v.read_bytes() for v in self.views])

    def read(self) -> np.ndarray:
        return np.stack([v.read() for v in self.views])

    peek = read

    def write(self, values) -> None:
        for v, x in zip(self.views, np.broadcast_to(values, self.shape)):
            v.write(x)

    def write_one(self, values) -> None:
        for v in self.views:
            v.write(np.broadcast_to(values, (1,) + v.shape)[0])


def _strided(a: np.ndarray, offset: int, shape, strides) -> np.ndarray:
    """A view of 1-D ``a`` from element ``offset`` with ``strides`` in elements. Unlike ``as_strided`` (several
    times slower to build, and the plan builds thousands), numpy checks that the view stays inside ``a``."""
    f = a.itemsize
    return np.ndarray(shape, a.dtype, buffer=a, offset=offset * f, strides=tuple(s * f for s in strides))


def _step(offsets) -> int | None:
    """The spacing of evenly spaced, increasing offsets (0 for a single one), else None."""
    if len(offsets) == 1:
        return 0
    d = offsets[1] - offsets[0]
    if d <= 0 or offsets[-1] - offsets[0] != d * (len(offsets) - 1):
        return None
    return d if list(offsets) == list(range(offsets[0], offsets[-1] + 1, d)) else None


def _grid_steps(offsets) -> tuple[int, int, int, int] | None:
    """(count0, count1, step0, step1) when ``offsets`` are a grid, ``offsets[i * count1 + j] = offsets[0] +
    i * step0 + j * step1`` with both steps positive and both counts > 1 (an M/N-split matmul's cores each at
    its part of a tile: a core's row of the grid at one offset, the next row further on), else None."""
    n, o = len(offsets), list(offsets)
    j = 2
    while j < n and o[j] - o[j - 1] == o[1] - o[0]:
        j += 1
    if j >= n or n % j or o[1] <= o[0] or o[j] <= o[0]:
        return None
    s0, s1 = o[j] - o[0], o[1] - o[0]
    if any(o[k] != o[0] + k // j * s0 + k % j * s1 for k in range(n)):
        return None
    return n // j, j, s0, s1


def tiles(mem: Memory, offsets, rows: int, cols: int, fmt: Format) -> TileView | TileList:
    """The same [rows, cols] tile at each of ``offsets`` in ``mem``, as one [count, rows, cols] view."""
    step = _step(offsets)
    if step is not None:
        return TileView(mem, offsets[0], rows, cols, fmt, count=len(offsets), step=step)
    grid = _grid_steps(offsets)
    if grid is not None:
        return TileView(mem, offsets[0], rows, cols, fmt, count=grid[:2], step=grid[2:])
    return TileList(mem, offsets, rows, cols, fmt)


def block_sticks(offsets, strides, shape) -> np.ndarray:
    """The 128-byte sticks of (outer, rows, row_bytes) strided blocks at each of ``offsets``, in copy order."""
    m, n, k = shape
    return ((_row_starts(offsets, strides, m, n)[:, None] + np.arange(0, k, STICK_BYTES)) // STICK_BYTES).ravel()


class Frozen:
    """A tile whose bytes are the same at every run where it is read (copied from constants only): its values
    are decoded at the first run and kept (read only), so weights are not decoded again at every call."""

    def __init__(self, view):
        self.view, self.value, self._transposed = view, None, None

    def read(self) -> np.ndarray:
        if self.value is None:
            self.value = np.array(self.view.read())       # a copy: the memory changes later in the run
            self.value.flags.writeable = False
        return self.value

    peek = read

    def transposed(self) -> np.ndarray:
        """:meth:`read` as [..., cols, rows], contiguous float32 (a weight MATMUL reads with TRANS_B), made at
        the first run and kept: transposing a layer's weights again at every call cost more than its product."""
        if self._transposed is None:
            v = self.value if self.value is not None else self.view.read()
            self._transposed = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=np.float32)
            self._transposed.flags.writeable = False
        return self._transposed


class Decoded:
    """A tile that later reads of the same run see with the same bytes (the plan proved it: equal stick ids, as
    for :class:`Shared`), as the kernels of a convolution read one input patch through a window per tap: its
    first read at each run decodes it (:class:`FirstRead`) and keeps the values, read only, for the later ones
    (:class:`Reread`); the last of them lets them go, so a run holds no more decoded tiles than it rereads."""

    def __init__(self, view):
        self.view, self.value, self.last = view, None, None


class FirstRead:
    def __init__(self, tile: Decoded):
        self.tile, self.shape = tile, tile.view.shape

    def read(self) -> np.ndarray:
        v = self.tile.view.read()           # a fresh array: nothing else holds it
        if self.tile.last is not None:
            v.flags.writeable = False
            self.tile.value = v
        return v

    peek = read


class Reread:
    def __init__(self, tile: Decoded):
        self.tile, self.shape = tile, tile.view.shape
        tile.last = self

    def read(self) -> np.ndarray:
        v = self.tile.value
        if self.tile.last is self:
            self.tile.value = None
        return v

    peek = read


class Grouped:
    """Tiles of several cores, some holding the same bytes (the plan proved it, as for :class:`Shared`): the
    distinct ones (``first``, one per group, in order of first appearance) are decoded, then copied to the cores
    of their group (``index``: each core's group)."""

    def __init__(self, first, index: np.ndarray):
        self.first, self.index = first, index
        self.shape = (index.size,) + first.shape[1:]

    def read(self) -> np.ndarray:
        return np.take(self.first.read(), self.index, axis=0)

    peek = read


class Shared:
    """The same tile on several cores whose bytes are provably equal (copied by one DMA batch from the same
    device bytes, unwritten since): decoded once, from the first core's copy, then copied per core."""

    def __init__(self, first: TileView, count: int):
        self.first, self.shape = first, (count,) + first.shape

    def read(self) -> np.ndarray:
        return np.broadcast_to(self.first.read(), self.shape).copy()     # contiguous, as a decode makes it

    peek = read


class _Sent(NamedTuple):
    """What a RING_SEND read, for the barrier that delivers it."""

    slot: int              # its offset in the staging memory
    const: np.ndarray      # which of its sticks held bytes copied from constants
    ids: np.ndarray        # their ids (Machine._orig)
    src: int               # the scratchpad-memory address it read
    sticks: np.ndarray     # the sticks there
    staging: "Staging"     # the step copying it into the staging memory
    pieces: np.ndarray     # the piece each of its sticks held (Machine._live): read as its deliveries are


class _Pieces(NamedTuple):
    """Ring deliveries of one size at a barrier, one piece each (a send landing on one core), before the plan
    knows which are read (Machine._land)."""

    pieces: np.ndarray     # their ids (Machine._live)
    sends: np.ndarray      # the send each one delivers (its index in _Landing.sent)
    src: np.ndarray        # where each copies from (the bytes the send read, or its staging slot)
    dst: np.ndarray        # where it lands (scratchpad memory)
    nbytes: int
    const: bool            # all of them carry constants' bytes
    first: np.ndarray      # the first stick each lands on
    sticks: np.ndarray     # and how many


class _Landing(NamedTuple):
    """A barrier release's deliveries as planned: its copies (:class:`_Pieces`, ``direct``: from the bytes the
    sends read rather than their staging slots), then its reduce-sums."""

    direct: bool
    sent: list             # what each send read (_Sent)
    copies: list
    reduces: list


class _ToCopies:
    """A result computed once (``values()``) for a tile every core of a batch holds alike, written to the copies
    (one a core, at ``addrs``, pieces ``pieces``) that a later step reads: ``view``, which Machine.plan settles
    once the whole plan is known (None: no copy is read)."""

    def __init__(self, values, addrs: list[int], tile: tuple, pieces: np.ndarray):
        self.values, self.addrs, self.tile, self.pieces, self.view = values, addrs, tile, pieces, None

    def __call__(self) -> None:
        if self.view is not None:
            self.view.write_one(self.values())


class Staging:
    """The copy of a batch of ring sends' bytes into the staging memory, where the barrier that delivers them reads
    them; left out once each of its ``pending`` sends is delivered from the bytes it read (Machine._direct)."""

    def __init__(self, copy, pending: int):
        self.copy, self.pending = copy, pending

    def landed(self) -> None:
        self.pending -= 1
        if not self.pending:
            self.copy = None

    def __call__(self) -> None:
        if self.copy is not None:
            self.copy()


class Once:
    """A step whose effect lasts: it runs at the first call only (constants loaded into scratchpad ``sticks``
    that nothing else writes hold the same bytes at every later call), unless the plan finds another writer of
    those sticks and a step that reads the bytes at every call (``always``). ``pieces``: what it writes, as
    Machine._live knows it."""

    def __init__(self, step, sticks, pieces):
        self.step, self.sticks, self.pieces, self.always, self.done = step, sticks, pieces, False, False

    def __call__(self) -> None:
        if not self.done:
            self.step()
            self.done = not self.always


# Host threads a run uses: a big batch splits into two halves of its cores, the second on a worker thread.
# numpy releases the GIL in its loops, copies and BLAS calls, so on an idle host big steps take about half
# the time; each half computes exactly what it would alone (BLAS stays on one thread per call).
_THREADS = min(2, os.cpu_count() or 1)
# Work (MACs / 64 of a matmul; elements or bytes / 4 of other batches) below which a second thread costs more
# than it saves: handing a half over and back takes ~0.1 ms, and elementwise work is fast (the cast of 32 tiles of
# 128x64 fp32 into DLFloat16: 0.06 ms on one thread, 0.14 ms as two halves).
_SPLIT_WORK = 1 << 18
_SPLIT_ELEMS = 1 << 20
_POOL: list = []
if hasattr(os, "register_at_fork"):
    # A fork (a data loader's, a process pool's) has a copy of the pool but not its thread: a step it handed over
    # would wait forever. The child makes a pool of its own at its first Parallel step.
    os.register_at_fork(after_in_child=_POOL.clear)
# Elements an SFU computes in about the time a step of its own costs (Machine._sfu_groups).
_GROUP_ELEMS = 1 << 16


def _quietly(step) -> None:
    with np.errstate(all="ignore"):       # numpy's error state is per thread
        step()


def _row_groups(ids: np.ndarray) -> np.ndarray:
    """Each row's group among the rows of ``ids`` ([cores, sticks] stick ids), equal rows alike, numbered in order
    of first appearance (np.unique by rows: 10x slower)."""
    first: dict[bytes, int] = {}
    return np.array([first.setdefault(row.tobytes(), len(first)) for row in ids], dtype=np.intp)


def _sequence(steps: list):
    """Steps run one after another, as one step."""
    return steps[0] if len(steps) == 1 else lambda: [f() for f in steps]


class Parallel:
    """Two steps on disjoint cores, the second on a worker thread."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self) -> None:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="spyre-emu"))
        pending = _POOL[0].submit(_quietly, self.second)
        try:
            self.first()
        finally:
            pending.result()


# A segment runs as two lanes (runtime/lanes.py) when its work (elements, or MACs / 64, or bytes / 4, as
# _SPLIT_WORK) reaches this: below, the handoff to the worker costs about what the second lane saves.
_LANE_WORK = 1 << 16
# ... and a program uses a worker when its lanes hold this much work (about a millisecond a run): a run wakes the
# worker from its pipe and waits for it to go back, ~0.1-0.2 ms.
_LANE_PROGRAM_WORK = 1 << 20
# Operations that run in this process only: host code (Python objects, user functions), data-dependent device
# reads (an embedding's rows) and device-to-device moves (rare, and outside the DMA batches the lanes split).
_MAIN_ONLY = frozenset({Op.HOST, Op.GATHER, Op.RESTICK})


def _work(batch) -> int:
    """A batch's work: elements, or MACs / 64, or bytes / 4 (its instructions are of one kind: one size)."""
    s = batch[0]
    return len(batch) * max(s.useful_macs // 64, s.elems, s.nbytes // 4)


def _lane_split(batches) -> tuple[list, list] | None:
    """A segment's batches as two lanes (:func:`_two_lanes`), or None when it should run as it is: too little
    work, one core, or an operation that runs in this process only."""
    if any(b[0].op in _MAIN_ONLY for b in batches) or sum(map(_work, batches)) < _LANE_WORK:
        return None
    return _two_lanes(batches)


def _two_lanes(batches) -> tuple[list, list] | None:
    """A segment's batches as two lanes of the cores they run on: the first half and the second, where that parts
    every batch evenly, else every other core (a batch on a few of the cores is then in both). A regular set of
    cores stays regular in each, so its tiles stay one strided view. Halves first, as neighbouring cores often
    hold a tile alike (a row of the core grid, its multicast): in one lane it is read, and cast, once for all of
    them; every other core, the 1024^3 matmul took 17.0 -> 20.8 ms. None when one lane would be empty."""
    cores = sorted({i.core for b in batches for i in b})
    for second in ({c: 2 * k >= len(cores) for k, c in enumerate(cores)}, {c: k % 2 == 1 for k, c in enumerate(cores)}):
        lanes = tuple([[i for i in b if second[i.core] is odd] for b in batches] for odd in (False, True))
        if all(abs(len(x) - len(y)) <= 1 for x, y in zip(*lanes)):
            break
    lanes = tuple([b for b in lane if b] for lane in lanes)
    return lanes if all(lanes) else None


def _threaded(batch) -> bool:
    """Whether ``batch`` is worth two threads (a segment outside process lanes runs as lanes of threads,
    :func:`_thread_lanes`; Machine._prepare_split). Not ring transfers: a RING_REDUCE's sum and a RING_SEND's
    copy run at the barrier that delivers them (a send's own step at most stages its bytes), so their work is
    not where their step stands."""
    op = batch[0].op
    return (_THREADS >= 2 and len(batch) >= 2 and op not in (Op.RING_REDUCE, Op.RING_SEND)
            and _work(batch) >= (_SPLIT_WORK if op is Op.MATMUL else _SPLIT_ELEMS))


def _thread_lanes(batches) -> tuple[list, list] | None:
    """A segment's batches as two lanes (:func:`_two_lanes`) for two threads, where the segment does not run as
    process lanes (no worker process) but a batch of it is big enough for two threads (:func:`_threaded`) and
    every one may run off the main thread: one handoff for the segment, not one per batch (waking the other
    thread takes ~0.1 ms), and its small steps in parallel too. The cores of a segment meet nowhere (as for
    :class:`Lanes`)."""
    if not any(map(_threaded, batches)) or any(b[0].op in _MAIN_ONLY for b in batches):
        return None
    return _two_lanes(batches)


def lane_splits(segs) -> list | None:
    """Each segment's lanes (:func:`_lane_split`, None for one that runs as it is), or None when the program's
    lanes hold too little work for a worker process (``_LANE_PROGRAM_WORK``), or less than half of its work."""
    splits = [_lane_split(batches) for batches, _ in segs]
    laned = sum(_work(b) for split, (batches, _) in zip(splits, segs) if split for b in batches)
    # Mostly outside the lanes (a Granite layer: 1.5%), the program would gain little and pay for shared memory
    # in every step (no huge pages: 450 -> 570-630 ms a call).
    if laned < _LANE_PROGRAM_WORK or 2 * laned < sum(_work(b) for batches, _ in segs for b in batches):
        return None
    return splits


class Lanes:
    """A segment as two lanes of cores: the second runs in the machine's worker process (``lanes.Worker``,
    ``k``-th lane it knows) while this process runs the first; without a worker, one after the other."""

    def __init__(self, machine, k: int, first: list, second: list):
        self.machine, self.k, self.first, self.second = machine, k, first, second

    def __call__(self) -> None:
        worker = self.machine.worker
        if worker is None:
            for f in self.first + self.second:
                f()
            return
        worker.go(self.k)
        try:
            for f in self.first:
                f()
        finally:
            worker.wait()


def _row_starts(offsets, strides, m: int, n: int) -> np.ndarray:
    """Where each row of (m, n) strided blocks at ``offsets`` starts, in copy order."""
    one = (np.arange(m)[:, None] * strides[0] + np.arange(n)[None, :] * strides[1]).ravel()
    return (np.asarray(offsets, dtype=np.int64)[:, None] + one[None, :]).ravel()


def _rows(a: np.ndarray, unit: int, k: int) -> np.ndarray:
    """A contiguous memory array as its ``k``-element rows starting at every multiple of ``unit`` (overlapping
    when ``unit < k``), each one opaque (void) element."""
    f = a.itemsize
    return np.ndarray(((a.size - k) // unit + 1,), np.dtype((np.void, k * f)), buffer=a, strides=(unit * f,))


def _ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i] + arange(counts[i])`` for every i, concatenated."""
    total = int(counts.sum())
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)


def _runs(src_offs, dst_offs) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive (source, destination) pairs whose offsets both step evenly and upwards."""
    runs, i = [], 0
    while i < len(src_offs):
        j = i + 1
        if j < len(src_offs):
            steps = (src_offs[j] - src_offs[i], dst_offs[j] - dst_offs[i])
            while (j < len(src_offs) and min(steps) > 0
                   and (src_offs[j] - src_offs[j - 1], dst_offs[j] - dst_offs[j - 1]) == steps):
                j += 1
            j = max(j, i + 1)
        runs.append((i, j))
        i = j
    return runs


_RUNS = 4          # a copy in at most this many strided pieces rather than by stick index
_PIECE_BYTES = 1 << 15     # or in more pieces when they move at least this much each, on average


def _shift_runs(src_offs, dst_offs) -> list[list[int]]:
    """The (source, destination) pairs as evenly stepped runs of pairs that move their bytes by the same distance
    (a ring multicast: each core's part to the core 4 on, to the core 8 on, ...), as lists of pair indices."""
    by_shift: dict[int, list[int]] = {}
    for i, (s, d) in enumerate(zip(src_offs, dst_offs)):
        by_shift.setdefault(d - s, []).append(i)
    out = []
    for idx in by_shift.values():
        idx.sort(key=lambda i: src_offs[i])
        srcs = [src_offs[i] for i in idx]
        out += [idx[i:j] for i, j in _runs(srcs, srcs)]
    return out


class _Sticks:
    """The scratchpad sticks of one tile on each core of a batch, [cores, n], in the plan's per-stick arrays
    (``_pending``, ``_csp``, ``_orig``, ``_writes``): a strided view when the cores' tiles are evenly spaced, as
    most are (no index array: a 64 KB accumulator tile on 32 cores is 65,536 sticks at every K step), else
    through an index array."""

    __slots__ = ("shape", "_first", "_step", "_index")

    def __init__(self, addrs: list[int], n: int):
        self.shape = (len(addrs), n)
        step = _step(addrs)
        self._index = None if step is not None else np.add.outer(np.asarray(addrs, np.int64) // STICK_BYTES,
                                                                 np.arange(n, dtype=np.int64))
        self._first, self._step = addrs[0] // STICK_BYTES, (step or 0) // STICK_BYTES

    @classmethod
    def of(cls, st: np.ndarray) -> "_Sticks":
        """Sticks ``st`` as they are, through the index array."""
        self = cls.__new__(cls)
        self.shape, self._index = st.shape, st
        return self

    def _view(self, a: np.ndarray) -> np.ndarray:
        return _strided(a, self._first, self.shape, (self._step, 1))

    def get(self, a: np.ndarray) -> np.ndarray:
        """The sticks' entries of ``a``: a view, or a copy when indexed."""
        return self._view(a) if self._index is None else a[self._index]

    def put(self, a: np.ndarray, values) -> None:
        if self._index is None:
            self._view(a)[...] = values
        else:
            a[self._index] = values

    def add(self, a: np.ndarray, values) -> None:
        """``a[sticks] += values`` (each stick once)."""
        if self._index is None:
            self._view(a)[...] += values
        else:
            a[self._index] += values


class Copy:
    """Byte copies of one (outer, rows, row_bytes) strided shape at several (source, destination) offset pairs
    between two memories, shadow included. Evenly spaced offsets make one strided copy, a few runs of them
    (a ring's shift: cores 1..15 then core 0) a few, and so do the runs of each distance moved when they are
    few or big (a multicast: every core's part to the core 4 on, 8 on, ...); otherwise the rows move by index
    (every DMA and ring transfer is whole sticks). The destinations of one copy never overlap (each core's own
    bytes, or what the loader proved no other core touches), so the pieces may move in any order."""

    def __init__(self, src: Memory, src_offs, src_strides, dst: Memory, dst_offs, dst_strides, shape):
        m, n, k = shape
        ss, ds = _step(src_offs), _step(dst_offs)
        if ss is None and len(set(src_offs)) == 1:
            ss = 0                       # every copy reads the same bytes (a broadcast load)
        arrays = [(src.bytes, dst.bytes)] + ([(src.shadow, dst.shadow)] if src.shadow is not None else [])
        runs = [list(range(i, j)) for i, j in _runs(src_offs, dst_offs)] if ss is None or ds is None else []
        if len(runs) > _RUNS:
            # Runs of the pairs of one shift instead, when they are few or big: a strided copy passes over the
            # bytes once, the index copy twice (gather, then scatter).
            runs = _shift_runs(src_offs, dst_offs)
            if len(runs) > _RUNS and len(runs) * _PIECE_BYTES > len(src_offs) * m * n * k:
                runs = []

        def view(a, off, count, step, strides):
            return _strided(a, off, (count, m, n, k), (step, strides[0], strides[1], 1))

        if runs:
            # Each run steps evenly in both memories (by construction): one strided view pair.
            self.index = None
            self.pairs = []
            for idx in runs:
                i, count = idx[0], len(idx)
                rs, rd = ((src_offs[idx[1]] - src_offs[i], dst_offs[idx[1]] - dst_offs[i]) if count > 1
                          else (0, 0))
                self.pairs += [(view(d, dst_offs[i], count, rd, dst_strides),
                                view(s, src_offs[i], count, rs, src_strides)) for s, d in arrays]
        elif ss is not None and ds is not None:
            self.index = None
            self.pairs = [(view(d, dst_offs[0], len(src_offs), ds, dst_strides),
                           view(s, src_offs[0], len(src_offs), ss, src_strides)) for s, d in arrays]
        else:
            # Each row moves as one opaque element (one memcpy in numpy's fancy indexing; bytes as columns are
            # several times slower), indexed in a view whose elements are rows starting at every multiple of
            # the largest unit all row starts share. Rows that follow each other in both memories are one row.
            if src_strides[1] == dst_strides[1] == k:
                n, k = 1, n * k
                if src_strides[0] == dst_strides[0] == k:
                    m, k = 1, m * k
            unit = math.gcd(*src_offs, *dst_offs, *src_strides, *dst_strides) or k
            self.index = (_row_starts(src_offs, src_strides, m, n) // unit,
                          _row_starts(dst_offs, dst_strides, m, n) // unit)
            self.pairs = [(_rows(d, unit, k), _rows(s, unit, k)) for s, d in arrays]

    def __call__(self) -> None:
        if self.index is None:
            for d, s in self.pairs:
                np.copyto(d, s)
        else:
            si, di = self.index
            for d, s in self.pairs:
                d[di] = s[si]


class Restick:
    """RESTICK: device [m, n, k] -> device [m, k, n] in one format, both in the canonical stick layout. Moves
    bits (no decode, no rounding): the element codes are permuted, the destination's row padding is zeroed,
    and in fp32-reference mode the shadow values travel with their elements."""

    def __init__(self, mem: Memory, src: int, dst: int, shape, fmt: Format):
        m, n, k = shape
        self.shape, self.fmt = (m, n, k), fmt
        self.src = TileView(mem, src, m * n, k, fmt)
        self.dst = TileView(mem, dst, m * k, n, fmt)

    def _codes(self, view: TileView, cols: int) -> np.ndarray:
        if self.fmt is Format.INT4:            # packed nibbles, low first: one uint8 code per element
            raw = view.raw
            return np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[0], -1)[:, :cols]
        return view.store

    def __call__(self) -> None:
        m, n, k = self.shape
        codes = self._codes(self.src, k).reshape(m, n, k).transpose(0, 2, 1).reshape(m * k, n)
        if self.fmt is Format.INT4:
            if n % 2:
                codes = np.concatenate([codes, np.zeros((m * k, 1), np.uint8)], axis=1)
            self.dst.raw[...] = codes[:, 0::2] | codes[:, 1::2] << 4
        else:
            self.dst.store[...] = codes
        self.dst.pad[...] = 0
        if self.src.shadow is not None:
            # As TileView.write: an element's value sits in the slot of its first byte; padding is zero.
            self.dst.shadow[...] = self.src.shadow.reshape(m, n, k).transpose(0, 2, 1).reshape(m * k, n)
            self.dst.shadow_pad[...] = 0


class Gather:
    """GATHER: rows of a device table picked by indices on the scratchpad (an embedding lookup), copied whole
    (bits, shadow included) to dense scratchpad rows. An index outside the table is a run-time error naming the
    instruction: which rows are read depends on the data, so the loader cannot prove it."""

    def __init__(self, device: Memory, sp: Memory, gather, base: int, label: str):
        dev, stride, dst, idx, fmt, m, n, k = gather
        self.n, self.label = n, label
        self.ids = sp.bytes[base + idx:base + idx + m * fmt.nbytes(1)].view(fmt.storage_dtype)
        arrays = [(device.bytes, sp.bytes)] + ([(device.shadow, sp.shadow)] if device.shadow is not None else [])
        self.pairs = [(_strided(d, base + dst, (m, k), (k, 1)), _strided(s, dev, (n, k), (stride, 1)))
                      for s, d in arrays]

    def __call__(self) -> None:
        ids = self.ids.astype(np.intp)
        bad = (ids < 0) | (ids >= self.n)
        if bad.any():
            raise SpyreRuntimeError(f"{self.label}: index {int(ids[bad][0])} is outside the table's {self.n} rows")
        for d, s in self.pairs:
            np.take(s, ids, axis=0, out=d)


# ---------------------------------------------------------------------------------------------------------
# SFU arithmetic (fp32)
# ---------------------------------------------------------------------------------------------------------

_F32 = np.float32
_SQRT2 = np.sqrt(2.0)
_GELU_C = _F32(np.sqrt(2.0 / np.pi))


def _erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function, float64, fractional error < 1.2e-7 everywhere (Numerical Recipes'
    Chebyshev fit). numpy has no erf and the runtime must not depend on scipy or torch."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(-z * z + poly)
    return np.where(x >= 0, r, 2.0 - r)


def _sigmoid(x):
    return _F32(1) / (_F32(1) + np.exp(-x))


_UNARY = {
    SfuFn.CAST: lambda x, imm: x * _F32(imm),
    SfuFn.NEG: lambda x, imm: -x,
    SfuFn.ABS: lambda x, imm: np.abs(x),
    SfuFn.EXP: lambda x, imm: np.exp(x),
    SfuFn.LOG: lambda x, imm: np.log(x),
    SfuFn.SQRT: lambda x, imm: np.sqrt(x),
    SfuFn.RSQRT: lambda x, imm: _F32(1) / np.sqrt(x),
    SfuFn.RECIP: lambda x, imm: _F32(1) / x,
    SfuFn.TANH: lambda x, imm: np.tanh(x),
    SfuFn.SIGMOID: lambda x, imm: _sigmoid(x),
    SfuFn.GELU_ERF: lambda x, imm: (0.5 * x * _erfc(-x / _SQRT2)).astype(_F32),
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u), without the cancellation of 1 + tanh(u) for negative x.
    SfuFn.GELU_TANH: lambda x, imm: x * _sigmoid(_F32(2) * _GELU_C * (x + _F32(0.044715) * x * x * x)),
    SfuFn.SILU: lambda x, imm: x * _sigmoid(x),
    SfuFn.RELU: lambda x, imm: np.maximum(x, _F32(0)),
    SfuFn.POWS: lambda x, imm: np.power(x, _F32(imm)),
}

_BINARY = {
    SfuFn.ADD: np.add, SfuFn.SUB: np.subtract, SfuFn.MUL: np.multiply, SfuFn.DIV: np.divide,
    SfuFn.MAX: np.maximum, SfuFn.MIN: np.minimum, SfuFn.POW: np.power,
    SfuFn.EQ: np.equal, SfuFn.NE: np.not_equal, SfuFn.LT: np.less, SfuFn.LE: np.less_equal,
    SfuFn.GT: np.greater, SfuFn.GE: np.greater_equal,
}


def sfu_eval(fn: SfuFn, shape, x, y, imm: float, swap: bool) -> np.ndarray:
    """One SFU op in fp32: ``x`` is src0 (None for FILL), ``y`` src1 already shaped to broadcast (or the
    immediate), result broadcast to ``shape``."""
    if fn is SfuFn.FILL:
        return np.full(shape, imm, dtype=_F32)
    x = np.asarray(x, dtype=_F32)
    if fn in _UNARY:
        return np.asarray(_UNARY[fn](x, imm), dtype=_F32)
    y = np.asarray(y, dtype=_F32)
    if fn is SfuFn.SELECT:
        return np.where(x != 0, y, _F32(imm)).astype(_F32)
    if swap:
        x, y = y, x
    r = _BINARY[fn](x, y)
    if r.shape == tuple(shape) and r.dtype == _F32:
        return r                  # already a fresh fp32 array of the result's shape: no copy
    return np.broadcast_to(r, shape).astype(_F32)


def _plain_cast(batch, dst) -> bool:
    """Whether an SFU batch is a conversion to DLFloat16 whose result is its source's encoding: a CAST by 1 (x * 1
    is x, but that it quiets a signalling NaN, and the encoding gives every NaN the NaN code of its sign), in
    faithful numerics (``dst`` has no fp32-reference shadow, which would keep the NaN unquieted), where no core's
    codes overlap its source (cores' scratchpads are apart). The encode then reads the source as it is, without
    the multiply's pass (as long as the encode's)."""
    fn, _, _, d, _, _, imm = batch[0].sfu
    return (fn is SfuFn.CAST and imm == 1.0 and d[3] is Format.DLF16 and isinstance(dst, TileView)
            and dst.shadow is None and not any(_overlap(i.sfu[3], i.sfu[4]) for i in batch))


def _in_place(dst, src) -> bool:
    """Whether ``dst`` is the view ``src`` reads through (the plan keeps one view per addresses and shape: an
    accumulator read as it is, not a kept decode), of fp32 with no shadow, grid or row padding to keep: a result
    can be computed into its memory directly."""
    return (src is dst and isinstance(dst, TileView) and dst.fmt is Format.FP32 and dst.shadow is None
            and not dst._grid and not dst.pad.size)


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two scratchpad tiles (offset, rows, cols, format) of one core share a byte."""
    return a[0] < b[0] + b[1] * tile_pitch(b[2], b[3]) and b[0] < a[0] + a[1] * tile_pitch(a[2], a[3])


def reduce_eval(fn: ReduceFn, x) -> np.ndarray:
    """Row reduction [..., m, n] -> [..., m, 1], accumulating in fp32."""
    x = np.asarray(x, dtype=_F32)
    if fn is ReduceFn.SUM:
        r = np.sum(x, axis=-1, dtype=_F32)
    elif fn is ReduceFn.MEAN:
        r = np.sum(x, axis=-1, dtype=_F32) / _F32(x.shape[-1])
    elif fn is ReduceFn.MAX:
        r = np.max(x, axis=-1)
    else:
        r = np.min(x, axis=-1)
    return r[..., None]


# ---------------------------------------------------------------------------------------------------------
# What each instruction does: the static schedule as a plan of batched steps
# ---------------------------------------------------------------------------------------------------------

# The record fields that say where an instruction acts (addresses, peer, group). Instructions of different cores
# that agree on every other field are one operation on other data (SPMD code): they run as one numpy operation.
_WHERE = {Op.DMA_LOAD: ("a0", "dev"), Op.DMA_STORE: ("a0", "dev"),
          Op.MATMUL: ("a0", "a1", "a2", "a3", "a4", "a5"), Op.SFU: ("a0", "a1", "a2"), Op.REDUCE: ("a0", "a1"),
          Op.RING_SEND: ("a0", "a1", "core", "mask"), Op.RING_REDUCE: ("a0", "a1", "core", "mask")}


def _mask(where) -> int:
    """The record's bits other than ``where``'s, as an integer mask over the little-endian record."""
    m = np.full(INSTR_DTYPE.itemsize, 0xFF, dtype=np.uint8)
    for f in where:
        dt, off = INSTR_DTYPE.fields[f][:2]
        m[off:off + dt.itemsize] = 0
    return int.from_bytes(m.tobytes(), "little")


_WHAT = {op: _mask(where) for op, where in _WHERE.items()}

# Ops whose scratchpad reads all go through Machine._tiles, which knows which cores' copies a step really reads
# (Machine._use); DMA and ring steps mark theirs where they find them; any other op's step counts every stick its
# instructions read.
_PRECISE_READS = frozenset({Op.MATMUL, Op.SFU, Op.REDUCE, Op.RING_REDUCE})


# SFU functions that are exactly rounded IEEE operations (or exact): the same bits whatever the operands' layout.
_EXACT = frozenset({SfuFn.CAST, SfuFn.NEG, SfuFn.ABS, SfuFn.SQRT, SfuFn.RSQRT, SfuFn.RECIP, SfuFn.RELU, SfuFn.FILL,
                    SfuFn.ADD, SfuFn.SUB, SfuFn.MUL, SfuFn.DIV, SfuFn.MAX, SfuFn.MIN, SfuFn.EQ, SfuFn.NE,
                    SfuFn.LT, SfuFn.LE, SfuFn.GT, SfuFn.GE, SfuFn.SELECT})


def _f32(x) -> np.ndarray:
    """A matmul operand as BLAS gets it from a 2-D read: contiguous float32 (a copy only when it is not)."""
    return np.ascontiguousarray(x, dtype=np.float32)


# K depth of one BLAS product in the PT emulation. OpenBLAS sums a K longer than its inner block (256 floats here)
# in pieces whose split depends on M, and a one-row product takes another path (gemv): the same output element
# of one plan would then get other bits when the cores or cards tile its rows otherwise. Chunks of at most PT_K,
# added in K order, on at least two rows sum every element the same way whatever the K tiling. The row count may
# still matter: OpenBLAS's small-matrix kernels (SkylakeX) take products of up to about 2^20 MACs, and the first M
# rows of a taller product differed from the M-row product in 231 of 2,000 random shapes, all small ones. So the
# emulator multiplies each tile as its plan gives it (per core, never rows of several cores as one product).
PT_K = 256


def pt_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` ([..., M, K] @ [..., K, N], float32) summed alike for every M and row: K in chunks of ``PT_K``
    added in order, a one-row ``a`` computed as two rows."""
    if a.shape[-2] == 1:
        return pt_product(np.concatenate([a, np.zeros_like(a)], axis=-2), b)[..., :1, :]
    K = a.shape[-1]
    r = a[..., :PT_K] @ b[..., :PT_K, :]
    for k0 in range(PT_K, K, PT_K):
        r += a[..., k0:k0 + PT_K] @ b[..., k0:k0 + PT_K, :]
    return r


def _products(A, B, cores: int):
    """The products of a matmul batch's operands (:func:`pt_product`), from contiguous float32 (copies of strided
    shadows), as BLAS sums them the same way every time. A :class:`Grouped` operand whose groups are runs of
    cores, or which the cores cycle through, is not copied per core: its distinct tiles broadcast over their
    cores, as a :class:`Shared` one's tile does (numpy still multiplies core by core with the same BLAS call)."""
    grouped = [X for X in (A, B) if isinstance(X, Grouped)]
    if len(grouped) != 1 or (runs := _group_runs(grouped[0].index)) is None:
        return lambda: pt_product(_f32(A.read()), _f32(B.read()))
    G = grouped[0]
    g = int(G.index.max()) + 1
    # The distinct tiles as [groups, 1] and the other operand's as [groups, cores/groups] when groups are runs of
    # cores; [1, groups] and [cores/groups, groups] when the cores cycle through them.
    at, split = ((slice(None), None), (g, cores // g)) if runs else ((None, slice(None)), (cores // g, g))

    def product():
        # A before B, as the plan made their reads (a first read and its reread may be both operands).
        a, b = (_f32((X.first if X is G else X).read()) for X in (A, B))
        x, y = (a, b) if G is A else (b, a)
        if y.ndim != 3 or y.shape[0] != cores:      # the other operand is one tile every core shares
            x = np.take(x, G.index, axis=0)
        else:
            x, y = x[at], y.reshape(split + y.shape[1:])
        r = pt_product(x, y) if G is A else pt_product(y, x)
        return r.reshape((cores,) + r.shape[2:]) if r.ndim == 4 else r
    return product


def _group_runs(index: np.ndarray) -> bool | None:
    """How a Grouped operand's cores hold its distinct tiles: True when each group is a run of cores (0 0 1 1),
    False when the cores cycle through the groups (0 1 0 1), None otherwise (groups of unequal sizes or orders)."""
    n, g = index.size, int(index.max()) + 1
    if n % g:
        return None
    cores = np.arange(n)
    if np.array_equal(index, cores // (n // g)):
        return True
    return False if np.array_equal(index, cores % g) else None


def _kind(ins):
    """What instructions must share to run as one batch: the record without its where-fields. HOST and
    RESTICK run alone (the instruction itself is its kind)."""
    what = _WHAT.get(ins.op)
    return ins if what is None else int.from_bytes(ins.rec.tobytes(), "little") & what


def _batches(seg: list) -> list[list]:
    """The instructions of one segment (between two barrier releases) as batches that run as one operation.
    At each turn one operation runs on every core that has it next: among those no other core still has ahead
    of it (else that core would run it alone later), the one most cores have (ties: the first core's); when
    every next operation is still ahead of some core, the one most cores have. So cores whose streams differ
    only by a few extra instructions (the edge cores of a convolution, a core that also loads a shared tile)
    run those alone and the rest together. Each core keeps its order and cores only meet at barriers, and no
    two cores touch the same device bytes in a segment with one writing (the loader proves it,
    :class:`~.schedule._Races`), so this computes what the schedule's order computes."""
    if len(seg) < 2:
        return [[s] for s in seg]
    kind = {s: _kind(s) for s in seg}
    queues: dict[int, list] = {}
    for s in seg:
        queues.setdefault(s.core, []).append(s)
    # SPMD: every core runs the same operations, so each turn takes the next of every core.
    runs = [[kind[s] for s in q] for q in queues.values()]
    if all(r == runs[0] for r in runs[1:]):
        return [list(b) for b in zip(*queues.values())]
    # Where each kind last occurs in each core's queue: a kind is still ahead of a core while that is past
    # the core's next instruction.
    last = [{k: j for j, k in enumerate(r)} for r in runs]
    qs = list(queues.values())
    at = [0] * len(qs)
    live = list(range(len(qs)))
    out = []
    while live:
        heads = Counter(runs[c][at[c]] for c in live)
        ready = [k for k in heads if all(runs[c][at[c]] == k or last[c].get(k, -1) <= at[c] for c in live)]
        best = max(ready or heads, key=heads.__getitem__)
        batch = [c for c in live if runs[c][at[c]] == best]
        out.append([qs[c][at[c]] for c in batch])
        for c in batch:
            at[c] += 1
        live = [c for c in live if at[c] < len(runs[c])]
    return out


def segments(steps) -> list[tuple[list[list], "Sync | None"]]:
    """The static schedule as its segments: (the segment's batches, :func:`_batches`; the barrier release
    ending it, None for the last). A pure function of the schedule, kept with it by the loader."""
    out, seg = [], []
    for s in list(steps) + [None]:
        if s is not None and not isinstance(s, Sync):
            seg.append(s)
            continue
        out.append((_batches(seg), s))
        seg = []
    return out


class Machine:
    """The memories of one loaded program (device memory; the scratchpads of all cores as one memory, core
    ``c``'s at offset ``c * sp_stride``) in a numerics mode, and what each instruction does to them.
    :meth:`plan` turns the loader's static schedule (decoded :class:`~.schedule.Ins` and
    :class:`~.schedule.Sync` steps, :mod:`.schedule`) into closures over precomputed views, once at load;
    the same instruction of several cores is one closure over [cores, rows, cols] views. A run calls them
    in order."""

    def __init__(self, device: Memory, sp: Memory, sp_stride: int, numerics: str, host_code=None):
        self.device, self.sp, self.stride, self.numerics, self.host_code = device, sp, sp_stride, numerics, host_code
        # RING_SEND -> what it read (_Sent): delivered at the barrier, from the staging memory or straight from
        # what it read (_direct). One staging memory for all sends (a slot each), so the sends a barrier delivers
        # are one copy.
        self._staged = {}
        self._stage, self._stage_end = None, 0
        self.lanes: list[Lanes] = []     # the plan's Lanes steps, in order (the worker runs their second lanes)
        self.worker = None               # a run's worker process (runtime/lanes.py), set by the executable
        self.lanes_here = False          # the last run ran both lanes in this process, for want of a worker
        self._lane = None                # the lane being planned (0, 1) or None
        self._views = {}                 # (scratchpad addresses, tile shape) -> its view (_tiles_at)

    def first_run_again(self) -> None:
        """The next run runs every first-run-only step again (:class:`Once`: constants loaded into scratchpads
        at the first run). For a worker process forked anew: the one before decoded and kept the constants of
        its lanes (:class:`Frozen`) at its first run, and that went with it. The new one decodes them at its
        first run, and a step of this process's lane may have loaded them (the lanes of two segments may
        part the cores otherwise), since overwritten."""
        for s in self._lasting:
            s.done = False

    def buffer_view(self, b) -> TileView:
        """A device buffer (a :class:`~.binary.Buffer`) as a [rows, innermost dim] view."""
        return TileView(self.device, b.addr, b.rows, b.shape[-1] if b.shape else 1, b.fmt)

    def plan(self, segs, constants=(), splits: list | None = None) -> list:
        """The static schedule's steps as closures, in schedule order, from its segments (:func:`segments`):
        each segment between barrier releases as its batches, each release as its deliveries (none when nothing
        is delivered). ``constants``: (addr, nbytes) of the constant buffers. ``splits``: the segments' lanes
        (:func:`lane_splits`), planned as :class:`Lanes` for a worker process (runtime/lanes.py)."""
        # Which sticks hold bytes copied from constants only, at this point of the plan: the same at every run.
        # Faithful tiles read from them are decoded once (:class:`Frozen`); the fp32-reference shadow is read
        # as a strided view, and numpy's elementwise kernels may differ between layouts, so it is left alone.
        self._cdev = np.zeros(self.device.bytes.size // STICK_BYTES, dtype=bool)
        for addr, nbytes in constants:
            self._cdev[addr // STICK_BYTES:(addr + nbytes) // STICK_BYTES] = True
        self._csp = np.zeros(self.sp.bytes.size // STICK_BYTES, dtype=bool)
        # Where each scratchpad stick's bytes come from, at this point of the plan: equal ids, equal bytes. A DMA
        # load gives (its batch, the device stick) ids, so the cores of one broadcast load share them; a ring
        # delivery gives the ids its sender's sticks had; any other write gives new ids of its own (negative,
        # never repeated).
        self._orig = -np.arange(1, self._csp.size + 1, dtype=np.int64)
        self._mark = np.zeros(self._csp.size, dtype=bool)      # scratch of _direct, all False between uses
        self._reads = {}         # (addresses, tile shape) -> (stick ids, Decoded) of the last read view there
        self._frozen = {}        # (addresses, tile shape) -> (stick ids, Frozen) of constant bytes read there
        self._next_id, self._loads = self._csp.size + 1, 0
        # How many instructions write each scratchpad stick: a load of constants into sticks nothing else writes
        # over the whole plan leaves the same bytes there for every later run, and runs once (decided at the end).
        self._writes = np.zeros(self._csp.size, dtype=np.int32)
        self._lasting: list[Once] = []
        # Ring deliveries by (direct, source offsets, destination offsets, bytes): a loop's barriers deliver
        # between the same double buffers again and again (the 4096^3 matmul: 1,024 copies, 66 distinct).
        self._deliveries: dict[tuple, Copy] = {}
        # Which writes a later step reads, decided at the end. A ring delivery is planned as its pieces (one send
        # landing on one core), a constant load as one piece, a result every core holds alike as a piece a core
        # (_prepare_same_sfu), and _pending holds the piece whose bytes a stick has, unread so far (-1: none). A read
        # before the bytes are written again marks the piece in _live (read at every call) or, for constants decoded
        # once (Frozen), in _first (read at the first call only). A delivery is copied only where it is read: a matmul
        # whose cores all received the same tile reads the first core's copy (Shared), so a multicast's other copies are
        # never read, nor those of a cast of a tile every core loaded alike. A constant load or delivery that only
        # Frozen reads runs at the first call only, even where other bytes are later written over it. Both arrays have a
        # last entry that the sticks holding no piece mark.
        self._pending = np.full(self._csp.size, -1, dtype=np.int32)
        # Sizes summed by batch (an operation of one kind): 3,300 of them, not the 106,000 steps of a 4096^3
        # matmul (0.13 s).
        batches = [b for bs, _ in segs for b in bs]
        sends = [i.send for b in batches if b[0].op is Op.RING_SEND for i in b]
        loads = sum(len(b) for b in batches if b[0].op is Op.DMA_LOAD)
        shared = sum(len(b) for b in batches if b[0].op is Op.SFU)         # at most, of _prepare_same_sfu
        self._live = np.zeros(sum(len(x[0]) for x in sends) + loads + shared + 1, dtype=bool)
        self._first = np.zeros_like(self._live)
        self._pieces = 0
        self._to_copies: list[_ToCopies] = []
        slots = sum(x[3] for x in sends)
        self._stage, self._stage_end = Memory(slots, self.sp.shadow is not None, bool(splits)), 0
        reds = [i.reduce[3] for b in batches if b[0].op is Op.RING_REDUCE for i in b]
        n = sum(t[1] * t[2] for t in reds)
        self._sums, self._sums_end = (_lanes_mod.shared_zeros if splits else np.zeros)(n, np.float32), 0
        self._parts = {}         # RING_REDUCE -> its part of _sums
        plan, self.lanes = [], []
        for (batches, sync), split in zip(segs, splits or [None] * len(segs)):
            if split is None and (halves := _thread_lanes(batches)):
                # Lanes 2 and 3: a tile one of them decodes for its later steps is none of the worker's.
                plan.append(Parallel(*map(_sequence, self._prepare_lanes(halves, 2))))
            elif split is None:
                plan += [self._prepare_split(b) for b in batches]
            else:
                self.lanes.append(Lanes(self, len(self.lanes), *self._prepare_lanes(split, 0)))
                plan.append(self.lanes[-1])
            if sync is not None:
                plan.append(self._prepare_sync(sync))
        # A delivery's bytes are read when it is, and a send may forward bytes delivered before: last first.
        for f in reversed(plan):
            if isinstance(f, _Landing):
                self._read_sent(f)
        plan = [f for f in (self._land(f) if isinstance(f, _Landing) else f for f in plan) if f is not None]
        for f in self._to_copies:
            read = self._live[f.pieces] | self._first[f.pieces]
            if read.any():
                f.view = self._tiles_at([a for a, r in zip(f.addrs, read) if r], *f.tile)
        for s in self._lasting:
            s.always = bool((self._writes[s.sticks] > 1).any() and self._live[s.pieces].any())
        return plan

    def _prepare_lanes(self, lanes, first: int) -> list[list]:
        """Each lane's batches prepared, the lanes numbered from ``first``: a tile a lane decodes once for its later
        steps is kept by lane (:meth:`_tiles`), as it lives in the process or thread that runs the lane."""
        parts = []
        for self._lane, part in enumerate(lanes, start=first):
            parts.append([self._prepare(b) for b in part])
        self._lane = None
        return parts

    def _prepare_split(self, batch):
        """A big batch as two halves run at once (:class:`Parallel`), else as one step."""
        if not _threaded(batch):
            return self._prepare(batch)
        if groups := self._sfu_groups(batch):
            # Computed once a group: a few tiles, less work than handing half of them to another thread costs.
            return self._prepare_sfu_groups(groups)
        h = len(batch) // 2
        return Parallel(self._prepare(batch[:h]), self._prepare(batch[h:]))

    def _tile_sticks(self, off: int, t) -> np.ndarray:
        """Sticks of tile ``t`` (addr, rows, cols, fmt) at scratchpad-memory offset ``off``."""
        lo = off + t[0]
        return sticks(lo, lo + t[1] * tile_pitch(t[2], t[3]))

    def _batch_sticks(self, batch, tile) -> tuple[list[int], np.ndarray]:
        """The scratchpad-memory address of tile ``tile(ins)`` of every instruction of a batch, and its sticks as
        [instructions, sticks] (the loader proved tiles stick-aligned, so every one is the same run of sticks
        from its own first)."""
        addrs = [i.core * self.stride + tile(i)[0] for i in batch]
        _, rows, cols, fmt = tile(batch[0])
        n = rows * tile_pitch(cols, fmt) // STICK_BYTES
        return addrs, np.add.outer(np.asarray(addrs, dtype=np.int64) // STICK_BYTES, np.arange(n, dtype=np.int64))

    def _tiles(self, batch, tile, write: bool = False):
        """The tile ``tile(ins)`` of every instruction of a batch (each on its core) as one view. Create an
        instruction's read tiles before its written ones: this follows what the sticks hold."""
        t = tile(batch[0])
        if t is None:
            return None
        addrs = [i.core * self.stride + tile(i)[0] for i in batch]
        view = self._tiles_at(addrs, *t[1:])
        at = _Sticks(addrs, t[1] * tile_pitch(t[2], t[3]) // STICK_BYTES)
        if write:
            self._fresh(at)
            return view
        pieces = at.get(self._pending)
        if pieces.max() < 0:
            pieces = None           # no piece there: the reads below mark none
        if self.numerics == "faithful" and at.get(self._csp).all():
            return self._once(self._frozen, tuple(addrs), t[1:], at.get(self._orig).ravel(), lambda: Frozen(view),
                              pieces=pieces, first_call=True)
        # The stick ids, [cores, sticks]: read here only, before this step writes anything.
        ids2 = at.get(self._orig)
        if _lut(t[3]) is not None and self._same(batch, tile, ids2):
            self._mark_read(None if pieces is None else pieces[0])
            return Shared(TileView(self.sp, addrs[0], *t[1:]), len(batch))
        if self.numerics == "faithful" and _lut(t[3]) is not None:
            view, read = self._grouped(view, addrs, t, ids2, pieces)
            # The distinct tiles of a grouped read are what a first read decodes and keeps (the copies per core
            # are made at each read): a transposed B is then transposed once a group, not once a core.
            index = view.index if isinstance(view, Grouped) else None
            held = view.first if index is not None else view
            # Keyed by lane too: the values a first read keeps live in the process that read them.
            held = self._once(self._reads, (self._lane, *addrs), t[1:], ids2.ravel(), lambda: Decoded(held),
                              Reread, FirstRead, read)
            return held if index is None else Grouped(held, index)
        self._mark_read(pieces)
        return view

    def _tiles_at(self, addrs, rows: int, cols: int, fmt: Format):
        """:func:`tiles` of the scratchpads, one view per (addresses, shape): a loop's steps read and write the
        same double buffers again and again (the 4096^3 matmul: 5,492 views of a few dozen), and a view holds no
        state of its own."""
        key = (tuple(addrs), rows, cols, fmt)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = tiles(self.sp, addrs, rows, cols, fmt)
        return view

    def _grouped(self, view, addrs, t, ids2, pieces):
        """``view`` as a :class:`Grouped` one when groups of its cores hold the same bytes (equal stick ids
        ``ids2``, as for :class:`Shared`): the cores of one head of an attention all loaded its K and V. Also the
        pieces it reads (of ``pieces``, by core): the first core's of each group."""
        index = _row_groups(ids2)
        if not 1 < index.max() + 1 < len(addrs):
            return view, pieces
        firsts = np.unique(index, return_index=True)[1]        # each group's first core
        return (Grouped(self._tiles_at([addrs[i] for i in firsts], *t[1:]), index),
                None if pieces is None else pieces[firsts])

    def _once(self, memo, addrs, shape, ids, make, again=None, first=None, pieces=None, first_call=False):
        """The holder (``make()``) of the values read at these addresses, kept in ``memo`` for later reads of
        the same bytes (equal stick ids ``ids``): each such read gets ``again(holder)``, the first
        ``first(holder)`` (None: the holder itself). Only the first reads memory, marking ``pieces`` (as
        :meth:`_mark_read`) read at every call or, ``first_call``, at the first call only.
        Constants (:class:`Frozen`, decoded once per load) and a run's rereads (:class:`Decoded`) so decode
        once, and hand the same array to every reader (the pieces of one output tile multiply the same B)."""
        seen = memo.get((addrs, shape))
        if seen is not None and np.array_equal(seen[0], ids):
            return seen[1] if again is None else again(seen[1])
        self._mark_read(pieces, first_call)
        holder = make()
        memo[addrs, shape] = (ids.copy(), holder)
        return holder if first is None else first(holder)

    def _same(self, batch, tile, ids2=None) -> bool:
        """Whether tile ``tile(ins)`` holds the same bytes on every core of a batch, at this point of the plan
        (faithful numerics only: the fp32-reference shadow is left as it is). ``ids2``: its sticks' ids by core,
        when known."""
        if self.numerics != "faithful" or len(batch) < 2 or tile(batch[0]) is None:
            return False
        orig = ids2 if ids2 is not None else self._orig[self._batch_sticks(batch, tile)[1]]
        return bool((orig == orig[0]).all())

    def _fresh(self, at: _Sticks) -> None:
        """Sticks ``at`` get bytes of their own (ids nothing else has, not constants'), written by one more
        instruction."""
        at.put(self._csp, False)
        n = math.prod(at.shape)
        at.put(self._orig, -np.arange(self._next_id, self._next_id + n).reshape(at.shape))
        self._next_id += n
        at.add(self._writes, 1)
        if at.get(self._pending).max() >= 0:
            at.put(self._pending, -1)

    def _use(self, st, first_call: bool = False) -> None:
        """A step reads sticks ``st`` at every call (or at the first call only): mark the pieces they hold."""
        self._mark_read(self._pending[st], first_call)

    def _mark_read(self, pieces, first_call: bool = False) -> None:
        """Mark read the pieces of ``pieces`` (what sticks hold, Machine._pending; None: none) at every call, or at
        the first call only."""
        if not self._pieces or pieces is None:
            return
        p = pieces.ravel()
        if p.size and p.max() >= 0:
            # A piece holds runs of sticks: mark each run's piece once (-1 marks the spare last entry).
            read = self._first if first_call else self._live
            read[p[0]] = True
            read[p[1:][p[1:] != p[:-1]]] = True

    def _prepare(self, batch):
        s = batch[0]
        if s.op not in _PRECISE_READS and s.op not in (Op.DMA_LOAD, Op.DMA_STORE, Op.RING_SEND):
            self._use(np.concatenate([i.core * self.stride // STICK_BYTES + i.sp_reads for i in batch]))
        if s.op in (Op.DMA_LOAD, Op.DMA_STORE):
            _, dstr, _, sstr, shape = s.dma
            dev = [i.dma[0] for i in batch]
            sp = [i.core * self.stride + i.dma[2] for i in batch]
            if s.op is Op.DMA_LOAD:
                dst = block_sticks(sp, sstr, shape)
                src = block_sticks(dev, dstr, shape)
                const = self._csp[dst] = self._cdev[src]
                self._loads += 1
                self._orig[dst] = self._loads * self._cdev.size + src
                self._writes[dst] += 1
                copy = Copy(self.device, dev, dstr, self.sp, sp, sstr, shape)
                if not const.all():
                    self._pending[dst] = -1
                    return copy
                self._pending[dst] = piece = self._pieces
                self._pieces += 1
                self._lasting.append(Once(copy, dst, np.array([piece])))
                return self._lasting[-1]
            read = block_sticks(sp, sstr, shape)
            self._use(read)
            self._cdev[block_sticks(dev, dstr, shape)] = self._csp[read]
            return Copy(self.sp, sp, sstr, self.device, dev, dstr, shape)
        if s.op is Op.MATMUL:
            fl, _, b, _, _, _, _, imm, ints, window = s.mm
            accumulate, scale = bool(fl & MatmulFlag.ACC), (imm if fl & MatmulFlag.SCALE else None)
            A, B, BI, CS = (self._tiles(batch, lambda i, j=j: i.mm[j]) for j in (1, 2, 5, 6))
            # An operand every core holds alike is read once, as one [rows, cols] matrix that the product
            # broadcasts over the cores: numpy still multiplies core by core with the same BLAS call, so the
            # bits are those of a per-core copy, without making one.
            A, B = (t.first if isinstance(t, Shared) else t for t in (A, B))
            if window is not None:
                B = WindowView(B, b[2], *window)
            elif fl & MatmulFlag.TRANS_B:
                B = Grouped(TransposedView(B.first), B.index) if isinstance(B, Grouped) else TransposedView(B)
            CR = self._tiles(batch, lambda i: i.mm[3]) if accumulate else None
            C, O = (self._tiles(batch, lambda i, j=j: i.mm[j], write=True) for j in (3, 4))
            ints = ints and self.numerics == "faithful"
            product = _products(A, B, len(batch))
            if accumulate and not ints and O is None and _in_place(C, CR):
                def matmul_into():
                    # C + product, in that operand order, into C's own fp32 memory (no result to copy in).
                    np.add(C.store, product(), out=C.store)
                return matmul_into

            def matmul():
                if ints:
                    r = (A.read().astype(np.float64) @ B.read().astype(np.float64)).astype(np.int64)
                    if accumulate:
                        r += CR.read().astype(np.int64)
                    r = ((r + 2**31) % 2**32 - 2**31).astype(np.int32)     # int32 wraps
                else:
                    r = product()
                    if accumulate:                     # C + product, in that operand order
                        c = CR.peek()
                        # Into the product, but for one that every core shares (both operands did) and C does not.
                        r = np.add(c, r, out=r if r.ndim >= c.ndim else None)
                C.write(r)
                if O is not None:
                    v = r.astype(np.float32, copy=False)
                    if scale is not None:
                        v = v * np.float32(scale)
                    if CS is not None:
                        v = v * CS.peek().astype(np.float32, copy=False)
                    if BI is not None:
                        v = v + BI.peek().astype(np.float32, copy=False)
                    O.write(v)
            return matmul
        if s.op is Op.SFU:
            fn, mode, swap, dst, _, _, imm = s.sfu
            if groups := self._sfu_groups(batch):
                return self._prepare_sfu_groups(groups)
            S0, S1 = (self._tiles(batch, lambda i, j=j: i.sfu[j]) for j in (4, 5))
            D = self._tiles(batch, lambda i: i.sfu[3], write=True)
            shape = (len(batch), dst[1], dst[2])

            # Functions whose numpy kernels may round differently by operand layout read contiguous copies.
            get = "peek" if fn in _EXACT else "read"
            x = getattr(S0, get) if S0 is not None else (lambda: None)
            y = getattr(S1, get) if S1 is not None else (lambda: imm)

            if _plain_cast(batch, D):
                return lambda: D.write(x())

            def sfu():
                D.write(sfu_eval(fn, shape, x(), y(), imm, swap))
            return sfu
        if s.op is Op.REDUCE:
            fn = s.red[0]
            S = self._tiles(batch, lambda i: i.red[2])
            D = self._tiles(batch, lambda i: i.red[1], write=True)
            return lambda: D.write(reduce_eval(fn, S.read()))
        if s.op is Op.RING_SEND:
            k, base = s.send[3], self._stage_end
            self._stage_end += len(batch) * k
            srcs = [i.core * self.stride + i.send[2] for i in batch]
            step = Staging(Copy(self.sp, srcs, (0, 0), self._stage, [base + j * k for j in range(len(batch))], (0, 0),
                                (1, 1, k)), len(batch))
            # What a send reads is read as its deliveries are (Machine._read_sent), not at every call: the pieces
            # its sticks hold now, one gather for the batch (-1 for none marks the spare entry).
            st2 = np.add.outer(np.array(srcs, np.int64) // STICK_BYTES, np.arange(k // STICK_BYTES))
            held = self._pending[st2]
            for j, (i, src, st) in enumerate(zip(batch, srcs, st2)):
                self._staged[i] = _Sent(base + j * k, self._csp[st], self._orig[st], src, st, step, held[j])
            return step
        if s.op is Op.RING_REDUCE:
            S = self._tiles(batch, lambda i: i.reduce[3])
            # Each core's part, as fp32, in shared memory: the barrier's sum reads it in this process.
            _, rows, cols, _ = s.reduce[3]
            n = len(batch) * rows * cols
            parts = self._sums[self._sums_end:self._sums_end + n].reshape(len(batch), rows, cols)
            self._sums_end += n
            self._parts.update(zip(batch, parts))

            def contribute():
                parts[...] = S.read()
            return contribute
        if s.op is Op.RESTICK:
            src, dst, shape, fmt, _, _ = s.restick
            self._cdev[s.dev_writes] = False
            return Restick(self.device, src, dst, shape, fmt)
        if s.op is Op.GATHER:
            st = s.core * self.stride // STICK_BYTES + s.sp_writes
            self._fresh(_Sticks.of(st))
            return Gather(self.device, self.sp, s.gather, s.core * self.stride, s.label)
        if s.op is Op.HOST:
            self._cdev[s.dev_writes] = False
            return self._prepare_host(s)
        raise AssertionError(s.op)

    def _sfu_groups(self, batch) -> list[list] | None:
        """An SFU batch as groups of its cores whose operands hold the same bytes (in order of first appearance): each
        group's result is computed once (:meth:`_prepare_same_sfu`). Exactly rounded functions into an encoded
        format, in faithful numerics; None when the groups would cost more steps than they save work (every core's
        operands differ, or few cores share small tiles)."""
        s = batch[0]
        if (s.op is not Op.SFU or self.numerics != "faithful" or len(batch) < 2 or s.sfu[0] not in _EXACT
                or s.sfu[3][3] not in _ENCODERS):
            return None
        ids = [self._orig[self._batch_sticks(batch, lambda i, j=j: i.sfu[j])[1]]
               for j in (4, 5) if s.sfu[j] is not None]
        if not ids:                 # no operand: every core computes the same
            return [batch]
        ids = np.concatenate(ids, axis=1)
        if (ids == ids[0]).all():
            return [batch]
        index = _row_groups(ids)
        # A group is a step of its own (~15 us): worth it where it saves that many elements' work (the cast of a
        # 512x128 tile by two groups of 16 cores, not of a 128x64 one by 16 pairs: 0.24 ms against 0.06 ms).
        g, elems = int(index.max()) + 1, batch[0].elems
        if (len(batch) - g) * elems < g * _GROUP_ELEMS:
            return None
        return [[i for i, k in zip(batch, index) if k == group] for group in range(g)]

    def _prepare_sfu_groups(self, groups):
        return _sequence([self._prepare_same_sfu(g) for g in groups])

    def _prepare_same_sfu(self, batch):
        """An SFU batch whose operands hold the same bytes on every core (a cast of a tile all cores loaded):
        computed once, on the first core's operands, and written to every core whose copy a later step reads
        (:class:`_ToCopies`). Exactly rounded functions only (:data:`_EXACT`): their result does not depend on
        how many elements one numpy call computes."""
        fn, mode, swap, dst, _, _, imm = batch[0].sfu
        first = batch[0].core * self.stride
        S0, S1 = (None if t is None else TileView(self.sp, first + t[0], *t[1:], count=1)
                  for t in batch[0].sfu[4:6])
        for t in batch[0].sfu[4:6]:
            if t is not None:
                self._use(self._tile_sticks(first, t))
        D = self._tiles(batch, lambda i: i.sfu[3], write=True)
        # Every core's result has the bytes of the first core's: the same ids. Each core's copy is a piece
        # (_pending): a step that reads equal bytes on several cores reads one core's (Shared, Grouped), so the
        # copies no step reads are left out once the whole plan is known (plan, _ToCopies).
        one = self._tile_sticks(first, dst)
        pieces = np.arange(self._pieces, self._pieces + len(batch))
        self._pieces += len(batch)
        for i, piece in zip(batch, pieces):
            st = self._tile_sticks(i.core * self.stride, i.sfu[3])
            if i is not batch[0]:
                self._orig[st] = self._orig[one]
            self._pending[st] = piece
        shape = (1, dst[1], dst[2])
        x = S0.peek if S0 is not None else (lambda: None)
        y = S1.peek if S1 is not None else (lambda: imm)
        values = x if _plain_cast(batch, D) else (lambda: sfu_eval(fn, shape, x(), y(), imm, swap))
        self._to_copies.append(_ToCopies(values, [i.core * self.stride + i.sfu[3][0] for i in batch], dst[1:],
                                         pieces))
        return self._to_copies[-1]

    def _prepare_host(self, s):
        op, ins_bufs, out_bufs, attrs = s.host
        views = [self.buffer_view(b) for b in ins_bufs]
        outs = [self.buffer_view(b) for b in out_bufs]

        if op == "jit":
            call = self.host_code.call(attrs["fn"], attrs["in_dtypes"], attrs["out_dtypes"],
                                       [b.shape for b in ins_bufs], [b.shape for b in out_bufs])
            run = lambda op, attrs, args, shapes: call.run(args)   # noqa: E731
        else:
            run = run_host_op

        def host():
            # Integers and bools as stored (their fp32 shadow is no integer); floats as the numerics see them.
            args = [(v.read() if b.fmt.is_float else v.read_bytes()).reshape(b.shape)
                    for v, b in zip(views, ins_bufs)]
            try:
                res = run(op, attrs, args, [b.shape for b in out_bufs])
            except Exception as e:   # user functions may raise anything: report where it happened
                raise SpyreRuntimeError(f"{s.label}: {e.__class__.__name__}: {e}") from e
            for v, r, b in zip(outs, res, out_bufs):
                v.write(np.asarray(r).reshape(v.rows, v.cols))
        return host

    def _direct(self, sent, landed) -> bool:
        """Whether a barrier's sends (``sent``: what each read) can land straight from the bytes they read: none
        of those was written since its send (equal ids) and no send lands on them (``landed``: the sticks).
        Then their staging copies at the sends are left out."""
        if not sent:
            return False
        read = np.concatenate([x.sticks for x in sent])
        if not np.array_equal(self._orig[read], np.concatenate([x.ids for x in sent])):
            return False
        # A mark per stick instead of a sorted intersection: linear in the sticks, with many sends a barrier.
        mark = self._mark
        mark[read] = True
        hit = mark[landed].any()
        mark[read] = False
        if hit:
            return False
        for x in sent:
            x.staging.landed()
        return True

    def _prepare_sync(self, s: Sync) -> "_Landing":
        sends = s.sends
        sent = [self._staged[snd] for snd in sends]
        # Every copy (a send to one of its cores, a piece), in issue order, as arrays: a barrier of a 32-core
        # matmul delivers hundreds.
        which = np.repeat(np.arange(len(sends)), [len(snd.send[0]) for snd in sends])
        lo = (np.fromiter((p for snd in sends for p in snd.send[0]), np.int64, which.size) * self.stride
              + np.array([snd.send[1] for snd in sends], np.int64)[which])
        size = np.array([snd.send[3] for snd in sends], np.int64)[which]
        order = np.argsort(lo, kind="stable")
        overlap = bool((lo[order[1:]] < (lo + size)[order[:-1]]).any())
        # The sticks every copy lands on, in issue order, and the send sticks each one is a copy of.
        n = size // STICK_BYTES
        every = _ragged_arange(lo // STICK_BYTES, n)
        count = np.array([x.sticks.size for x in sent], np.int64)
        read = _ragged_arange((np.cumsum(count) - count)[which], n)
        const = np.concatenate([x.const for x in sent]) if sends else np.zeros(0, bool)
        ids = np.concatenate([x.ids for x in sent]) if sends else np.zeros(0, np.int64)
        direct = self._direct(sent, every)
        pieces = self._pieces + np.arange(which.size)
        self._pieces += which.size
        # What each send read (which sticks held constants' bytes, their ids) lands in issue order: where sends
        # overlap, the last one wins.
        if overlap:
            cuts = np.cumsum(n)[:-1]
            for d, r, p in zip(np.split(every, cuts), np.split(read, cuts), pieces):
                self._csp[d], self._orig[d], self._pending[d] = const[r], ids[r], p
                self._writes[d] += 1
        else:
            self._csp[every], self._orig[every] = const[read], ids[read]
            self._pending[every] = np.repeat(pieces, n)
            self._writes[every] += 1
        # Overlapping sends land one by one; otherwise the sends of one barrier land together, one copy per size.
        src = np.array([x.src if direct else x.slot for x in sent], np.int64)[which]
        keys = which if overlap else size
        starts = np.cumsum(n) - n
        copies = []
        for first in np.sort(np.unique(keys, return_index=True)[1]):
            sel = np.flatnonzero(keys == keys[first])
            part = _ragged_arange(starts[sel], n[sel])
            copies.append(_Pieces(pieces[sel], which[sel], src[sel], lo[sel], int(size[first]),
                                  bool(const[read[part]].all()), every[starts[sel]], n[sel]))
        reduces = []
        for group in s.reduces:
            mask, root, dst, _ = group[0].reduce
            receivers = bits(mask) if root == ROOT_ALL else [root]
            view = self._tiles_at([r * self.stride + dst[0] for r in receivers], *dst[1:])
            for r in receivers:
                self._fresh(_Sticks.of(self._tile_sticks(r * self.stride, dst)))

            def reduce_sum(parts=[self._parts[g] for g in group], view=view):
                total = parts[0]
                for p in parts[1:]:            # in core order, like the ring
                    total = total + p
                view.write(total)
            reduces.append(reduce_sum)
        return _Landing(direct, sent, copies, reduces)

    def _read_sent(self, landing: "_Landing") -> None:
        """Mark what the barrier's sends read as their deliveries are read: at every call where one of a send's
        pieces is, else at the first call where one is."""
        for read in (self._first, self._live):
            hit = np.zeros(len(landing.sent), dtype=bool)
            for c in landing.copies:
                hit[c.sends[read[c.pieces]]] = True
            if hit.any():
                read[np.concatenate([landing.sent[j].pieces for j in np.flatnonzero(hit)])] = True

    def _land(self, landing: "_Landing"):
        """A barrier's deliveries as one step, once the whole plan is known: the copies of its live pieces only
        (a piece no step reads before its bytes are written again is left out), then its reduce-sums. None when
        nothing is left."""
        steps = []
        for c in landing.copies:
            read = self._live[c.pieces] | self._first[c.pieces]
            if not read.any():
                continue
            key = (landing.direct, tuple(c.src[read].tolist()), tuple(c.dst[read].tolist()), c.nbytes)
            if (copy := self._deliveries.get(key)) is None:
                copy = self._deliveries[key] = Copy(self.sp if landing.direct else self._stage, key[1], (0, 0),
                                                    self.sp, key[2], (0, 0), (1, 1, c.nbytes))
            # Constants' bytes land the same at every call: where nothing else writes them over the whole plan,
            # they stay from the first call on (as a constant load does).
            if c.const:
                self._lasting.append(Once(copy, _ragged_arange(c.first[read], c.sticks[read]), c.pieces[read]))
                copy = self._lasting[-1]
            steps.append(copy)
        steps += landing.reduces
        return _sequence(steps) if steps else None
