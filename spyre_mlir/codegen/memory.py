"""Device tensors and the DMA helpers every kernel uses.

A tensor lives in device memory in the canonical Spyre layout (row-major, innermost dim padded to whole
128-byte sticks), so any tensor is also a 2-D array of ``rows`` = product of the outer dims, each ``pitch``
bytes apart. Kernels only ever see that 2-D view (:class:`DevTensor`) and address memory by bytes, which is
what lets a reshape that keeps the innermost dim be a free alias, and lets intermediates share device memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from spyre_mlir.runtime.binary import buffer_layout
from spyre_mlir.runtime.formats import STICK_BYTES, Format

__all__ = ["DevTensor", "NoFormat", "format_of", "load_rows", "store_rows", "load_gather"]


class NoFormat(ValueError):
    """An element type no buffer of a binary can hold (complex<f16>, say)."""


def format_of(elt) -> Format:
    """The device format of an MLIR element type (the model's own types; reduce-precision decides them)."""
    s = str(elt)
    if s not in _FORMATS:
        raise NoFormat(f"no device format for element type {s}")
    return _FORMATS[s]


# f16 and bf16 data live as DLFloat16 (what the device computes on); f64, complex, i16 and ui8 only on the host.
_FORMATS = {"f32": Format.FP32, "f64": Format.FP64, "!spyre.dlf16": Format.DLF16, "f16": Format.DLF16,
            "bf16": Format.DLF16, "f8E4M3FN": Format.FP8_E4M3, "f8E5M2": Format.FP8_E5M2, "i8": Format.INT8,
            "i4": Format.INT4, "i16": Format.INT16, "ui8": Format.UINT8, "i32": Format.INT32, "i64": Format.INT64,
            "index": Format.INT64, "i1": Format.BOOL, "complex<f32>": Format.COMPLEX64,
            "complex<f64>": Format.COMPLEX128}


def supported_types() -> list[str]:
    """The element types a buffer can hold."""
    return list(_FORMATS)


_IO_DTYPES = {"f16": "float16", "bf16": "bfloat16"}


def io_dtype(elt) -> str:
    """The dtype callers see for an input/output of element type ``elt`` when its format's value dtype is not it
    ('' otherwise)."""
    return _IO_DTYPES.get(str(elt), "")


@dataclasses.dataclass
class DevTensor:
    """A tensor in device memory: ``shape`` in ``fmt`` at byte ``addr``; ``buffer`` names the runtime buffer
    it lives in (what host ops and outputs refer to); ``storage`` identifies the memory for liveness.

    A *row view* (``rowmap`` set: a transpose that keeps the innermost dim, read in place) has its row ``r`` at
    row ``rowmap[r]`` of the rows at ``addr``. A reshape of a row view that merges whole source rows into wider
    rows (attention's heads [h, s, d] -> [s, h, d] -> [s, h*d]) keeps it a view with ``block`` = the source
    rows' width: row ``r``'s ``j``-th block of ``block`` columns is source row ``rowmap[r * cols // block + j]``.
    Kernels read views through :func:`load_rows` / :func:`load_gather` (strided DMAs); they cannot be written,
    and nothing that addresses bytes itself may be given one."""

    shape: tuple
    fmt: Format
    addr: int
    buffer: object       # runtime.binary.Buffer holding it
    storage: int
    rowmap: tuple | None = None       # a tuple, so that tensors still compare by value
    block: int = 0                    # a merged row view's source row width (0: rows are whole source rows)

    @property
    def cols(self) -> int:
        return self.shape[-1] if self.shape else 1

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def pitch(self) -> int:
        return -(-self.fmt.nbytes(self.cols) // STICK_BYTES) * STICK_BYTES

    @property
    def nbytes(self) -> int:
        return buffer_layout(tuple(self.shape) or (1,), self.fmt)[1]

    @property
    def width(self) -> int:
        """The columns of one source row: ``block`` for a merged row view, else ``cols``."""
        return self.block or self.cols

    def reshaped(self, shape) -> "DevTensor":
        cols = (tuple(shape)[-1:] or (1,))[0]
        if self.rowmap is None or cols == self.cols:
            return dataclasses.replace(self, shape=tuple(shape))
        w = self.width
        if cols % w or self.fmt.nbytes(w) % STICK_BYTES:
            raise ValueError("a row view keeps its innermost dim, or merges whole source rows of whole sticks")
        return dataclasses.replace(self, shape=tuple(shape), block=0 if cols == w else w)

    @functools.cached_property
    def _rowmap_array(self) -> np.ndarray:
        """``rowmap`` as an array, made once per tensor (a prefill's head views map 32k rows, read per tile)."""
        a = np.asarray(self.rowmap, dtype=np.int64)
        a.flags.writeable = False
        return a

    def _blocks(self) -> np.ndarray:
        """A view's source rows as [rows, blocks per row]."""
        return self._rowmap_array.reshape(-1, self.cols // self.width)

    def rows_from(self, row: int, shape) -> "DevTensor":
        """The tensor of ``shape`` (this one's innermost dim) whose bytes are this one's from ``row`` on."""
        if self.rowmap is not None:
            n = math.prod(shape[:-1]) if len(shape) > 1 else 1
            return dataclasses.replace(self, shape=tuple(shape),
                                       rowmap=tuple(self._blocks()[row:row + n].ravel().tolist()))
        return dataclasses.replace(self, shape=tuple(shape), addr=self.addr + row * self.pitch)

    def row_view(self, rows, shape) -> "DevTensor":
        """The tensor of ``shape`` (this one's innermost dim) whose row ``r`` is this one's row ``rows[r]``."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.rowmap is not None:
            rows = self._blocks()[rows].ravel()
        return dataclasses.replace(self, shape=tuple(shape), rowmap=tuple(rows.tolist()))


def _col_bytes(t: DevTensor, col0: int) -> int:
    nb = t.fmt.nbytes(col0)
    if nb % STICK_BYTES:
        raise ValueError(f"column offset {col0} of a {t.fmt.key} tensor is not on a stick boundary")
    return nb


def _writable(t: DevTensor) -> DevTensor:
    if t.rowmap is not None:
        raise ValueError("a row view is read only")
    return t


def load_rows(b, core, tile, t: DevTensor, row0: int, col0: int = 0, loc=None):
    """tile <- t[row0 : row0 + tile.rows, col0 : col0 + tile.cols] (2-D view of t)."""
    if t.rowmap is not None:
        return load_gather(b, core, tile, t, np.arange(row0, row0 + tile.rows), col0, loc)
    b.dma_load(core, t.addr + row0 * t.pitch + _col_bytes(t, col0), tile.addr, (tile.rows, tile.pitch),
               (0, t.pitch), (0, tile.pitch), loc=loc)


def store_rows(b, core, tile, t: DevTensor, row0: int, col0: int = 0, loc=None):
    """t[row0 : ..., col0 : ...] <- tile (whole sticks, the tile's zeroed padding included)."""
    t = _writable(t)
    b.dma_store(core, t.addr + row0 * t.pitch + _col_bytes(t, col0), tile.addr, (tile.rows, tile.pitch),
                (0, t.pitch), (0, tile.pitch), loc=loc)


def load_gather(b, core, tile, t: DevTensor, src_rows, col0: int = 0, loc=None):
    """tile row i <- t row src_rows[i] (any pattern, e.g. a broadcast), from column ``col0`` (on a stick
    boundary): consecutive rows with a constant source stride (0 for a repeated row) become one DMA, and
    equal runs at a constant distance one 3-D DMA. A merged row view is gathered block by block (the part of
    each source row the tile's columns cover), the blocks of a row side by side in one 3-D DMA where they can."""
    src_rows = np.asarray(src_rows, dtype=np.int64)
    w = t.width
    if t.rowmap is None:
        src = src_rows[:, None]
    else:
        src = t._blocks()[src_rows]
    pitch = -(-t.fmt.nbytes(w) // STICK_BYTES) * STICK_BYTES       # of the source rows
    runs = []     # (tile byte offset, source byte address, count, source stride, row bytes)
    c, end = col0, col0 + tile.cols
    while c < end:      # the tile's columns, a source row's block at a time
        j, off = divmod(c, w)
        hi = min(end, (j + 1) * w)
        dst0, base = t.fmt.nbytes(c - col0), t.addr + (_col_bytes(t, off) if off else 0)
        k = tile.pitch - dst0 if hi == end else t.fmt.nbytes(hi - c)
        for r0, s0, cnt, st in _row_runs(src[:, j]):
            runs.append((dst0 + r0 * tile.pitch, base + s0 * pitch, cnt, st * pitch, k))
        c = hi
    i = 0
    while i < len(runs):
        d0, s0, cnt, st, k = runs[i]
        m = 1
        if i + 1 < len(runs) and runs[i + 1][2:] == (cnt, st, k):
            dd, ds = runs[i + 1][0] - d0, runs[i + 1][1] - s0
            while (i + m < len(runs) and runs[i + m][2:] == (cnt, st, k) and ds >= 0 and dd > 0
                   and runs[i + m][0] - runs[i + m - 1][0] == dd and runs[i + m][1] - runs[i + m - 1][1] == ds
                   and _blocks_apart(m + 1, cnt, dd, tile.pitch, k)):
                m += 1
        if m == 1:
            dd, ds = cnt * tile.pitch, 0
        b.dma_load(core, s0, tile.addr + d0, (m, cnt, k), (ds, st), (dd, tile.pitch), loc=loc)
        i += m


def _row_runs(rows: np.ndarray):
    """(first index, first row, count, row stride) of each run of ``rows`` with a constant stride >= 0."""
    i, n = 0, len(rows)
    while i < n:
        j = i + 1
        stride = int(rows[i + 1] - rows[i]) if i + 1 < n else 0
        if stride < 0:
            stride, j = 0, i + 1
        else:
            while j < n and rows[j] - rows[j - 1] == stride:
                j += 1
        yield i, int(rows[i]), j - i, stride
        i = j


def _blocks_apart(m: int, n: int, s2: int, s1: int, k: int) -> bool:
    """``m`` blocks of ``n`` rows of ``k`` bytes, blocks ``s2`` and rows ``s1`` apart, never overlap: the blocks
    are disjoint ranges, or their rows interleave (what the loader accepts on the scratchpad side)."""
    return s2 >= (n - 1) * s1 + k or (s2 >= k and s1 >= (m - 1) * s2 + k)


def store_scatter(b, core, tile, t: DevTensor, dst_rows, loc=None):
    """t row dst_rows[i] <- tile row i: consecutive rows with a constant positive destination stride become
    one DMA (the destination rows must be distinct, as a store may not overlap itself)."""
    t = _writable(t)
    dst_rows = np.asarray(dst_rows, dtype=np.int64)
    i, n = 0, len(dst_rows)
    while i < n:
        j = i + 1
        stride = int(dst_rows[i + 1] - dst_rows[i]) if i + 1 < n else 1
        if stride < 1:
            stride = 1
        else:
            while j < n and dst_rows[j] - dst_rows[j - 1] == stride:
                j += 1
        b.dma_store(core, t.addr + int(dst_rows[i]) * t.pitch, tile.addr + i * tile.pitch, (j - i, tile.pitch),
                    (0, stride * t.pitch), (0, tile.pitch), loc=loc)
        i = j
