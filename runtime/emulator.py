"""The emulator's machine: device memory, per-core scratchpads, and the units that act on them.

Memories are plain byte arrays (numpy uint8) sized to what the program declares and uses; the loader has
already proved every access in bounds and every read initialized, so this module only moves bytes and
computes. What each instruction does lives here: :class:`Machine` turns the loader's decoded instructions
into a plan of closures over precomputed numpy views (:class:`TileView`, :class:`DmaCopy`), built once at
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

import numpy as np
from numpy.lib.stride_tricks import as_strided

from spyre_mlir.errors import SpyreError

from .formats import Format, decode, encode
from .hostops import run_host_op
from .isa import ROOT_ALL, MatmulFlag, Op, ReduceFn, SfuFn, tile_pitch
from .schedule import Sync, bits

__all__ = ["Memory", "TileView", "WindowView", "DmaCopy", "Restick", "Machine", "to_storage", "INT_RANGE", "sfu_eval", "reduce_eval",
           "NUMERICS", "SpyreRuntimeError"]

NUMERICS = ("faithful", "fp32-reference")


class SpyreRuntimeError(SpyreError, RuntimeError):
    """A run failed on data the loader could not see (e.g. a gather index out of range)."""


class Memory:
    """A byte-addressed memory with an optional float32 shadow (fp32-reference mode)."""

    def __init__(self, nbytes: int, shadow: bool):
        self.bytes = np.zeros(nbytes, dtype=np.uint8)
        self.shadow = np.zeros(nbytes, dtype=np.float32) if shadow else None


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
    the bytes of a region never depend on what was there before.
    """

    def __init__(self, mem: Memory, addr: int, rows: int, cols: int, fmt: Format):
        self.fmt, self.rows, self.cols = fmt, rows, cols
        pitch = tile_pitch(cols, fmt)
        rb = fmt.nbytes(cols)
        region = mem.bytes[addr:addr + rows * pitch].reshape(rows, pitch)
        self.raw = region[:, :rb]
        self.pad = region[:, rb:]
        self.store = self.raw if fmt in (Format.INT4, Format.BOOL) else self.raw.view(fmt.storage_dtype)
        self.shadow = self.shadow_pad = None
        if mem.shadow is not None and fmt is not Format.INT4 and not fmt.exact_storage:
            sreg = mem.shadow[addr:addr + rows * pitch].reshape(rows, pitch)
            self.shadow = sreg[:, 0:rb:fmt.bits // 8]
            self.shadow_pad = sreg[:, rb:]

    def read_bytes(self) -> np.ndarray:
        """Decode the stored bytes: float32 for float formats, integers for integer formats."""
        if self.fmt is Format.BOOL:
            return self.raw != 0
        lut = _lut(self.fmt)
        if lut is not None:
            return lut[self.store]
        return decode(self.fmt, self.store, self.cols)

    def read(self) -> np.ndarray:
        """The values a unit sees: the shadow in fp32-reference mode, else the decoded bytes."""
        return self.shadow if self.shadow is not None else self.read_bytes()

    def write(self, values) -> None:
        """Round ``values`` (broadcastable to [rows, cols]) into the format; keep the exact value in the
        shadow when there is one."""
        values = np.broadcast_to(values, (self.rows, self.cols))
        bits = to_storage(self.fmt, values)
        if self.fmt is Format.BOOL:
            self.raw[...] = bits
        else:
            self.store[...] = bits
        self.pad[...] = 0
        if self.shadow is not None:
            self.shadow[...] = values
            self.shadow_pad[...] = 0


class WindowView:
    """MATMUL's B operand read through a column window (flag WINDOW): column j is the stored tile's column
    ``offset + j * stride``, zero where that is outside the tile (a convolution's shifted, strided input
    columns and its zero padding)."""

    def __init__(self, view: TileView, offset: int, stride: int, n: int):
        cols = offset + stride * np.arange(n)
        self.view, self.ok = view, (cols >= 0) & (cols < view.cols)
        self.cols = cols[self.ok]

    def read(self) -> np.ndarray:
        t = self.view.read()
        out = np.zeros((t.shape[0], self.ok.size), t.dtype)
        out[:, self.ok] = t[:, self.cols]
        return out


class DmaCopy:
    """A strided byte copy (outer, rows, row_bytes) between two memories, shadow included."""

    def __init__(self, src: Memory, src_addr: int, src_strides, dst: Memory, dst_addr: int, dst_strides,
                 shape):
        m, n, k = shape
        self.src = as_strided(src.bytes[src_addr:], (m, n, k), (src_strides[0], src_strides[1], 1))
        self.dst = as_strided(dst.bytes[dst_addr:], (m, n, k), (dst_strides[0], dst_strides[1], 1))
        self.ssrc = self.sdst = None
        if src.shadow is not None:
            f = src.shadow.itemsize
            self.ssrc = as_strided(src.shadow[src_addr:], (m, n, k), (src_strides[0] * f, src_strides[1] * f, f))
            self.sdst = as_strided(dst.shadow[dst_addr:], (m, n, k), (dst_strides[0] * f, dst_strides[1] * f, f))

    def __call__(self) -> None:
        np.copyto(self.dst, self.src)
        if self.ssrc is not None:
            np.copyto(self.sdst, self.ssrc)


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
    return np.broadcast_to(_BINARY[fn](x, y), shape).astype(_F32)


def reduce_eval(fn: ReduceFn, x) -> np.ndarray:
    """Row reduction [m,n] -> [m,1], accumulating in fp32."""
    x = np.asarray(x, dtype=_F32)
    if fn is ReduceFn.SUM:
        r = np.sum(x, axis=1, dtype=_F32)
    elif fn is ReduceFn.MEAN:
        r = np.sum(x, axis=1, dtype=_F32) / _F32(x.shape[1])
    elif fn is ReduceFn.MAX:
        r = np.max(x, axis=1)
    else:
        r = np.min(x, axis=1)
    return r.reshape(-1, 1)


# ---------------------------------------------------------------------------------------------------------
# What each instruction does: the static schedule as a plan of closures
# ---------------------------------------------------------------------------------------------------------


class Machine:
    """The memories of one loaded program (device memory, one scratchpad per core) in a numerics mode, and what
    each instruction does to them. :meth:`plan` turns the loader's static schedule (decoded
    :class:`~.schedule.Ins` and :class:`~.schedule.Sync` steps, :mod:`.schedule`) into closures over
    precomputed views, once at load; a run calls them in order."""

    def __init__(self, device: Memory, sp: list[Memory], numerics: str, host_code=None):
        self.device, self.sp, self.numerics, self.host_code = device, sp, numerics, host_code

    def buffer_view(self, b) -> TileView:
        """A device buffer (a :class:`~.binary.Buffer`) as a [rows, innermost dim] view."""
        return TileView(self.device, b.addr, b.rows, b.shape[-1] if b.shape else 1, b.fmt)

    def _tile(self, core: int, t) -> TileView | None:
        return None if t is None else TileView(self.sp[core], *t)

    def plan(self, steps) -> list:
        """The steps of the static schedule as closures, in schedule order (a barrier with nothing to deliver
        has none)."""
        return [f for f in map(self._prepare, steps) if f is not None]

    def _prepare(self, s):
        if isinstance(s, Sync):
            return self._prepare_sync(s)
        c, sp, dev = s.core, self.sp[s.core], self.device
        if s.op in (Op.DMA_LOAD, Op.DMA_STORE):
            daddr, dstr, saddr, sstr, shape = s.dma
            if s.op is Op.DMA_LOAD:
                return DmaCopy(dev, daddr, dstr, sp, saddr, sstr, shape)
            return DmaCopy(sp, saddr, sstr, dev, daddr, dstr, shape)
        if s.op is Op.RESTICK:
            src, dst, shape, fmt, _, _ = s.restick
            return Restick(dev, src, dst, shape, fmt)
        if s.op is Op.MATMUL:
            fl, a, b, acc, out, bias, cs, imm, ints, window = s.mm
            A, B, C = self._tile(c, a), self._tile(c, b), self._tile(c, acc)
            if window is not None:
                B = WindowView(B, *window)
            O, BI, CS = self._tile(c, out), self._tile(c, bias), self._tile(c, cs)
            ints = ints and self.numerics == "faithful"
            accumulate, scale = bool(fl & MatmulFlag.ACC), (imm if fl & MatmulFlag.SCALE else None)

            def matmul():
                if ints:
                    r = (A.read().astype(np.float64) @ B.read().astype(np.float64)).astype(np.int64)
                    if accumulate:
                        r += C.read().astype(np.int64)
                    r = ((r + 2**31) % 2**32 - 2**31).astype(np.int32)     # int32 wraps
                else:
                    r = A.read().astype(np.float32) @ B.read().astype(np.float32)
                    if accumulate:
                        r = C.read().astype(np.float32) + r
                C.write(r)
                if O is not None:
                    v = r.astype(np.float32)
                    if scale is not None:
                        v = v * np.float32(scale)
                    if CS is not None:
                        v = v * CS.read().astype(np.float32)
                    if BI is not None:
                        v = v + BI.read().astype(np.float32)
                    O.write(v)
            return matmul
        if s.op is Op.SFU:
            fn, mode, swap, dst, src0, src1, imm = s.sfu
            D, S0, S1 = self._tile(c, dst), self._tile(c, src0), self._tile(c, src1)
            shape = (dst[1], dst[2])

            def sfu():
                D.write(sfu_eval(fn, shape, S0.read() if S0 is not None else None,
                                 S1.read() if S1 is not None else imm, imm, swap))
            return sfu
        if s.op is Op.REDUCE:
            fn, dst, src = s.red
            D, S = self._tile(c, dst), self._tile(c, src)
            return lambda: D.write(reduce_eval(fn, S.read()))
        if s.op is Op.RING_SEND:
            peer, dst, src, k = s.send
            s.stage = np.zeros(k, dtype=np.uint8)
            s.stage_shadow = np.zeros(k, dtype=np.float32) if sp.shadow is not None else None

            def send():
                s.stage[...] = sp.bytes[src:src + k]
                if s.stage_shadow is not None:
                    s.stage_shadow[...] = sp.shadow[src:src + k]
            return send
        if s.op is Op.RING_REDUCE:
            S = self._tile(c, s.reduce[3])
            s.slot = [None]

            def contribute():
                s.slot[0] = np.array(S.read(), dtype=np.float32)
            return contribute
        if s.op is Op.HOST:
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
        raise AssertionError(s.op)

    def _prepare_sync(self, s: Sync):
        deliveries = []
        for snd in s.sends:
            peer, dst, _, k = snd.send
            mem = self.sp[peer]

            def deliver(snd=snd, mem=mem, dst=dst, k=k):
                mem.bytes[dst:dst + k] = snd.stage
                if snd.stage_shadow is not None:
                    mem.shadow[dst:dst + k] = snd.stage_shadow
            deliveries.append(deliver)
        for group in s.reduces:
            mask, root, dst, _ = group[0].reduce
            receivers = bits(mask) if root == ROOT_ALL else [root]
            views = [TileView(self.sp[r], *dst) for r in receivers]

            def reduce_sum(group=group, views=views):
                total = group[0].slot[0]
                for g in group[1:]:            # in core order, like the ring
                    total = total + g.slot[0]
                for v in views:
                    v.write(total)
            deliveries.append(reduce_sum)
        if not deliveries:
            return None
        return lambda: [d() for d in deliveries]
