"""Device tensors and the DMA helpers every kernel uses.

A tensor lives in device memory in the canonical Spyre layout (row-major, innermost dim padded to whole
128-byte sticks), so any tensor is also a 2-D array of ``rows`` = product of the outer dims, each ``pitch``
bytes apart. Kernels only ever see that 2-D view (:class:`DevTensor`) and address memory by bytes, which is
what lets a reshape that keeps the innermost dim be a free alias, and lets intermediates share device memory.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from spyre_mlir.runtime.binary import buffer_layout
from spyre_mlir.runtime.formats import STICK_BYTES, Format

__all__ = ["DevTensor", "format_of", "load_rows", "store_rows", "load_gather"]


def format_of(elt) -> Format:
    """The device format of an MLIR element type (the model's own types; reduce-precision decides them)."""
    s = str(elt)
    if s not in _FORMATS:
        raise ValueError(f"no device format for element type {s}")
    return _FORMATS[s]


# f16 and bf16 data live as DLFloat16 (what the device computes on); f64, complex, i16 and ui8 only on the host.
_FORMATS = {"f32": Format.FP32, "f64": Format.FP64, "!spyre.dlf16": Format.DLF16, "f16": Format.DLF16,
            "bf16": Format.DLF16, "f8E4M3FN": Format.FP8_E4M3, "f8E5M2": Format.FP8_E5M2, "i8": Format.INT8,
            "i4": Format.INT4, "i16": Format.INT16, "ui8": Format.UINT8, "i32": Format.INT32, "i64": Format.INT64,
            "index": Format.INT64, "i1": Format.BOOL, "complex<f32>": Format.COMPLEX64,
            "complex<f64>": Format.COMPLEX128}
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
    row ``rowmap[r]`` of the rows at ``addr``. Kernels read it through :func:`load_rows` / :func:`load_gather`
    (strided DMAs); it cannot be written, and nothing that addresses bytes itself may be given one."""

    shape: tuple
    fmt: Format
    addr: int
    buffer: object       # runtime.binary.Buffer holding it
    storage: int
    rowmap: tuple | None = None       # a tuple, so that tensors still compare by value

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

    def reshaped(self, shape) -> "DevTensor":
        if self.rowmap is not None and (tuple(shape)[-1:] or (1,)) != (self.shape[-1:] or (1,)):
            raise ValueError("a row view keeps its innermost dim")
        return dataclasses.replace(self, shape=tuple(shape))

    def rows_from(self, row: int, shape) -> "DevTensor":
        """The tensor of ``shape`` (this one's innermost dim) whose bytes are this one's from ``row`` on."""
        if self.rowmap is not None:
            n = math.prod(shape[:-1]) if len(shape) > 1 else 1
            return dataclasses.replace(self, shape=tuple(shape), rowmap=tuple(self.rowmap[row:row + n]))
        return dataclasses.replace(self, shape=tuple(shape), addr=self.addr + row * self.pitch)

    def row_view(self, rows, shape) -> "DevTensor":
        """The tensor of ``shape`` (this one's innermost dim) whose row ``r`` is this one's row ``rows[r]``."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.rowmap is not None:
            rows = np.asarray(self.rowmap, dtype=np.int64)[rows]
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
    equal runs at a constant distance one 3-D DMA."""
    src_rows = np.asarray(src_rows, dtype=np.int64)
    if t.rowmap is not None:
        src_rows = np.asarray(t.rowmap, dtype=np.int64)[src_rows]
    base = t.addr + (_col_bytes(t, col0) if col0 else 0)
    runs = []     # (first tile row, first source row, count, source stride)
    i, n = 0, len(src_rows)
    while i < n:
        j = i + 1
        stride = int(src_rows[i + 1] - src_rows[i]) if i + 1 < n else 0
        if stride < 0:
            stride, j = 0, i + 1
        else:
            while j < n and src_rows[j] - src_rows[j - 1] == stride:
                j += 1
        runs.append((i, int(src_rows[i]), j - i, stride))
        i = j
    k = 0
    while k < len(runs):
        r0, s0, cnt, st = runs[k]
        m = 1
        if k + 1 < len(runs) and runs[k + 1][2] == cnt and runs[k + 1][3] == st:
            ds = runs[k + 1][1] - s0
            while (k + m < len(runs) and runs[k + m][2] == cnt and runs[k + m][3] == st
                   and runs[k + m][1] - runs[k + m - 1][1] == ds and ds >= 0):
                m += 1
        else:
            ds = 0
        b.dma_load(core, base + s0 * t.pitch, tile.addr + r0 * tile.pitch, (m, cnt, tile.pitch),
                   (ds * t.pitch, st * t.pitch), (cnt * tile.pitch, tile.pitch), loc=loc)
        k += m


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
