"""Number formats of the Spyre device, bit-exact, as vectorized numpy.

The emulator's answers are only worth something if every value it stores rounds exactly as the card does, so
the conversions here work on bit patterns, not on float arithmetic:

* DLFloat16 (IBM "SEN169_FP16"): 1 sign, 6 exponent (bias 31), 9 fraction bits, no subnormals, one
  NaN/infinity pattern. Conversion follows onnx-mlir's NNPA code (DLF16Conversion.hpp, Convert.cpp).
* fp8 e4m3 / e5m2 and bfloat16, with ml_dtypes doing the (round-to-nearest-even) rounding.
* symmetric int8 / int4 quantization with per-tensor or per-channel scales, int4 packed two per byte.
* a registry of formats with the stable integer codes the binary file stores.

Only numpy is imported: the runtime loads this at start-up (ml_dtypes at the first fp8 or bfloat16
conversion). See docs/numerics.md.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "DLF16_BIAS", "DLF16_MAX", "DLF16_MAX_BITS", "DLF16_MIN_NORMAL", "DLF16_NAN_BITS", "DLF16_EPS",
    "dlf16_encode", "dlf16_decode", "dlf16_round", "by_blocks",
    "FP8_E4M3_MAX", "FP8_E5M2_MAX",
    "fp8_e4m3_encode", "fp8_e4m3_decode", "fp8_e5m2_encode", "fp8_e5m2_decode",
    "bf16_encode", "bf16_decode",
    "symmetric_scale", "quantize_int", "dequantize_int", "pack_int4", "unpack_int4",
    "STICK_BYTES", "Format", "FORMATS", "encode", "decode",
]

# ---------------------------------------------------------------------------------------------------------
# DLFloat16
# ---------------------------------------------------------------------------------------------------------

DLF16_BIAS = 31
DLF16_NAN_BITS = 0x7FFF            # e=63, m=511: the single NaN/infinity pattern (0xFFFF with sign)
DLF16_MAX_BITS = 0x7FFE            # e=63, m=510
DLF16_MAX = 2.0**32 * (1 + 510 / 512)       # 8573157376.0, exact in fp32
DLF16_MIN_NORMAL = 2.0**-31 * (1 + 1 / 512)  # smallest positive value (e=0, m=1); e=0, m=0 is zero
DLF16_EPS = 2.0**-9                # spacing of values in [1, 2): one ulp relative to the binade's base

_FP32_EXP_SHIFT = 23
_FRAC_DROP = 23 - 9                # fp32 fraction bits DLFloat16 drops
_ROUND_HALF = np.uint32(1 << (_FRAC_DROP - 1))   # half a DLFloat16 ulp in fp32 fraction units
_EXP_OFFSET = 127 - DLF16_BIAS     # fp32 biased exponent - DLFloat16 biased exponent
# Largest fp32 magnitude (as bits) that still rounds to a finite DLFloat16: exponent 63, fraction 510,
# plus everything below the rounding bit. Anything above (incl. inf and NaN) becomes the NaN pattern.
_FP32_NMAX_BITS = np.uint32(
    ((63 + _EXP_OFFSET) << _FP32_EXP_SHIFT) | (510 << _FRAC_DROP) | (int(_ROUND_HALF) - 1)
)


def dlf16_encode(x, saturate: bool = True) -> np.ndarray:
    """fp32 -> DLFloat16 bit patterns (uint16), bit-exact to the device conversion (:func:`_dlf16_encode_bits`
    is the conversion itself; this looks its results up in a table built from it, ~5x faster)."""
    x = np.asarray(x, dtype=np.float32)
    if x.size > _ENCODE_CHUNK:
        return _dlf16_encode_chunks(x, saturate)
    if saturate:
        x = np.clip(x, np.float32(-DLF16_MAX), np.float32(DLF16_MAX))  # NaN passes through
    # take with intp indices: numpy's fastest gather (indexing by the uint32 array itself is ~30% slower).
    return np.take(_dlf16_table(), (x.view(np.uint32) >> 13).astype(np.intp))


_ENCODE_CHUNK = 1 << 16


def by_blocks(x: np.ndarray, out_dtype, lookup, tile: tuple[int, int] | None = None) -> np.ndarray:
    """``lookup(block, out, idx)`` over blocks of ``x`` of about ``_ENCODE_CHUNK`` elements each: a table
    lookup's intp indices for a whole weight matrix are 4x its size in fresh memory (a 4096^2 weight: 128 MiB,
    ten times slower than the lookup itself), a block's stay in cache. Blocks are whole rows, or, for a
    transposed view (a weight read as [K, N] from torch's [N, K]), tiles (:data:`_TILE`): whole rows of it
    would read a few bytes of every cache line of the weight and come back for the rest (a [4096, 12800] view:
    0.24 s -> 0.15 s).
    ``idx`` is a scratch of the block's shape. ``tile``: a transposed view's blocks, if not :data:`_TILE`."""
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    out = np.empty(rows.shape, out_dtype)
    R, C = rows.shape
    if R > 1 and C > 1 and rows.strides[0] == rows.itemsize:
        tr, tc = tile or _TILE
    else:
        tr, tc = max(1, _ENCODE_CHUNK // C), C
    scratch = np.empty((tr, tc), np.intp)
    for r in range(0, R, tr):
        for c in range(0, C, tc):
            block = rows[r:r + tr, c:c + tc]
            lookup(block, out[r:r + tr, c:c + tc], scratch[:block.shape[0], :block.shape[1]])
    return out.reshape(x.shape)


_TILE = (128, 512)      # a transposed view's blocks: 512 runs of 128 elements in memory (fastest measured)


def _dlf16_encode_chunks(x: np.ndarray, saturate: bool) -> np.ndarray:
    """:func:`dlf16_encode` of a large array, a block at a time (:func:`by_blocks`)."""
    table = _dlf16_table()

    def lookup(block, out, idx):
        b = np.clip(block, np.float32(-DLF16_MAX), np.float32(DLF16_MAX)) if saturate else \
            np.ascontiguousarray(block)
        np.right_shift(b.view(np.uint32), np.uint32(13), out=idx)
        np.take(table, idx, out=out, mode="clip")     # every index is in range; "raise" buffers out
    return by_blocks(x, np.uint16, lookup)


_DLF16_TABLE: list[np.ndarray] = []


def _dlf16_table() -> np.ndarray:
    """The unsaturated encoding of every fp32 pattern, indexed by its top 19 bits (sign, exponent, 10 fraction
    bits). That is all it depends on: rounding adds 1 << 13 and keeps bits 14 and up, so only bit 13 of the
    dropped bits matters, and the NaN threshold's low 13 bits are all ones. 1 MiB, built once."""
    if not _DLF16_TABLE:
        reps = (np.arange(1 << 19, dtype=np.uint32) << 13).view(np.float32)
        _DLF16_TABLE.append(_dlf16_encode_bits(reps, saturate=False))
    return _DLF16_TABLE[0]


def _dlf16_encode_bits(x, saturate: bool = True) -> np.ndarray:
    """fp32 -> DLFloat16 bit patterns (uint16), bit-exact to the device conversion.

    Rounding: add half an ulp (1 << 13) to the fp32 magnitude bits and truncate, i.e. round to nearest with
    ties AWAY from zero; a carry out of the fraction bumps the exponent. Results with a negative DLFloat16
    exponent become signed zero (so 2**-31 itself encodes as zero: e=0, m=0 is the zero pattern).
    Magnitudes that would round above DLF16_MAX, infinities and NaNs give the NaN pattern with the input's
    sign.

    saturate=True (the default, as on the device path): clip to [-DLF16_MAX, DLF16_MAX] first, like
    onnx-mlir's fp32_to_dlf16. That clip maps +-inf to +-DLF16_MAX too; NaN stays NaN (0x7FFF / 0xFFFF).
    (zDNN's own saturation maps infinities to NaN instead; we follow onnx-mlir.)

    Non-float32 inputs are first converted to float32, as the device only converts from fp32.
    """
    x = np.asarray(x, dtype=np.float32)
    if saturate:
        x = np.clip(x, np.float32(-DLF16_MAX), np.float32(DLF16_MAX))  # NaN passes through
    u = x.view(np.uint32)
    sign = ((u >> 16) & 0x8000).astype(np.uint16)
    mag = u & np.uint32(0x7FFFFFFF)
    rounded = mag + _ROUND_HALF                                    # carry goes into the exponent by itself
    exp = (rounded >> _FP32_EXP_SHIFT).astype(np.int32) - _EXP_OFFSET
    frac = (rounded >> _FRAC_DROP) & np.uint32(0x1FF)
    finite = ((np.maximum(exp, 0).astype(np.uint32) << 9) | frac).astype(np.uint16)
    bits = np.where(exp < 0, np.uint16(0), finite)
    bits = np.where(mag > _FP32_NMAX_BITS, np.uint16(DLF16_NAN_BITS), bits)
    return (bits | sign).astype(np.uint16)


def dlf16_decode(bits) -> np.ndarray:
    """DLFloat16 bit patterns -> float32 (exact: every DLFloat16 value is an fp32 value).

    value = (-1)^s * 2^(e-31) * (1 + m/512), except e=0,m=0 (signed zero) and e=63,m=511 (NaN). The NaN
    keeps its sign bit, so decode followed by encode is the identity on all 65,536 patterns.
    """
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        if b.dtype.kind not in "iu" or (b.size and (b.min() < 0 or b.max() > 0xFFFF)):
            raise ValueError("dlf16_decode expects 16-bit patterns (uint16 or integers in 0..0xFFFF)")
        b = b.astype(np.uint16)
    if b.size > _ENCODE_CHUNK:
        return _dlf16_decode_chunks(b)
    return _dlf16_decode_bits(b)


def _dlf16_decode_bits(b: np.ndarray) -> np.ndarray:
    """:func:`dlf16_decode` by bit arithmetic (the definition)."""
    b = b.astype(np.uint32)
    sign = (b & 0x8000) << 16
    body = b & 0x7FFF
    e = body >> 9
    m = body & 0x1FF
    u = sign | ((e + _EXP_OFFSET) << _FP32_EXP_SHIFT) | (m << _FRAC_DROP)
    u = np.where(body == 0, sign, u)
    u = np.where(body == DLF16_NAN_BITS, sign | np.uint32(0x7FC00000), u)
    return u.astype(np.uint32).view(np.float32)


_DLF16_VALUES: list[np.ndarray] = []


def _dlf16_decode_chunks(b: np.ndarray) -> np.ndarray:
    """:func:`dlf16_decode` of a large array: every pattern's value looked up in a table built by
    :func:`_dlf16_decode_bits` (bit-exact by construction), a block at a time (:func:`by_blocks`)."""
    if not _DLF16_VALUES:
        _DLF16_VALUES.append(_dlf16_decode_bits(np.arange(1 << 16, dtype=np.uint16)))
    table = _DLF16_VALUES[0]

    def lookup(block, out, idx):
        idx[...] = block
        np.take(table, idx, out=out, mode="clip")
    return by_blocks(b, np.float32, lookup)


def dlf16_round(x, saturate: bool = True) -> np.ndarray:
    """Round fp32 values to the nearest DLFloat16 value (as float32): decode(encode(x))."""
    return dlf16_decode(dlf16_encode(x, saturate=saturate))


# ---------------------------------------------------------------------------------------------------------
# fp8 and bfloat16 (ml_dtypes rounds: nearest, ties to even)
# ---------------------------------------------------------------------------------------------------------

FP8_E4M3_MAX = 448.0          # ml_dtypes.finfo(float8_e4m3fn).max (test_formats checks both)
FP8_E5M2_MAX = 57344.0        # ml_dtypes.finfo(float8_e5m2).max


def _ml(name: str):
    """An ml_dtypes type, imported at its first use: the import takes 0.7 s (with numpy 2.4 it registers its
    ufunc loops in quadratic time), which a process that never meets fp8 or bfloat16 data should not wait."""
    import ml_dtypes

    return getattr(ml_dtypes, name)


def _ml_encode(x, dtype, storage, maxval: float | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if maxval is not None:
        x = np.clip(x, np.float32(-maxval), np.float32(maxval))
    return x.astype(dtype).view(storage)


def _ml_decode(bits, dtype, storage) -> np.ndarray:
    return np.asarray(bits).astype(storage).view(dtype).astype(np.float32)


def fp8_e4m3_encode(x, saturate: bool = True) -> np.ndarray:
    """fp32 -> fp8 e4m3 (the 'fn' variant: no infinities, NaN = 0x7F/0xFF) as uint8.

    saturate=True clips to +-448 first (also +-inf; NaN stays NaN). Without it, overflow gives NaN.
    """
    return _ml_encode(x, _ml("float8_e4m3fn"), np.uint8, FP8_E4M3_MAX if saturate else None)


def _fp8_values(exp_bits: int, inf: bool) -> np.ndarray:
    """[256] float32: the value of each fp8 pattern with ``exp_bits`` exponent bits (IEEE-like: bias
    2^(e-1) - 1, subnormals). ``inf``: the top exponent holds infinities and NaNs (e5m2); else only the
    all-ones pattern is NaN (e4m3fn). NaNs are float32's quiet NaN with the pattern's sign, as ml_dtypes
    converts them. A table, so that decoding (every load of a program with an fp8 buffer builds a lookup
    table from it) needs no ml_dtypes."""
    key = (exp_bits, inf)
    if key not in _FP8_VALUES:
        b = np.arange(256)
        mb, bias = 7 - exp_bits, (1 << (exp_bits - 1)) - 1
        e, m = (b >> mb) & ((1 << exp_bits) - 1), b & ((1 << mb) - 1)
        mag = np.where(e == 0, m * 2.0 ** (1 - bias - mb), (1 + m * 2.0 ** -mb) * 2.0 ** (e - bias))
        top = e == (1 << exp_bits) - 1
        if inf:
            mag = np.where(top, np.where(m == 0, np.inf, np.nan), mag)
        else:
            mag = np.where(top & (m == (1 << mb) - 1), np.nan, mag)
        vals = np.where(b & 0x80, -mag, mag).astype(np.float32)
        nan = np.isnan(vals)
        vals[nan] = np.copysign(np.abs(np.float32(np.nan)), np.where(b[nan] & 0x80, -1, 1)).astype(np.float32)
        _FP8_VALUES[key] = vals
    return _FP8_VALUES[key]


_FP8_VALUES: dict = {}


def fp8_e4m3_decode(bits) -> np.ndarray:
    return np.asarray(_fp8_values(4, False)[np.asarray(bits).astype(np.uint8)])     # 0-d in, 0-d out


def fp8_e5m2_encode(x, saturate: bool = True) -> np.ndarray:
    """fp32 -> fp8 e5m2 (IEEE-like, has +-inf) as uint8.

    saturate=True clips to +-57344 first (also +-inf; NaN stays NaN). Without it, overflow gives +-inf.
    """
    return _ml_encode(x, _ml("float8_e5m2"), np.uint8, FP8_E5M2_MAX if saturate else None)


def fp8_e5m2_decode(bits) -> np.ndarray:
    return np.asarray(_fp8_values(5, True)[np.asarray(bits).astype(np.uint8)])     # 0-d in, 0-d out


def bf16_encode(x) -> np.ndarray:
    """fp32 -> bfloat16 bits (uint16), round to nearest even. A host format: the device computes it as
    DLFloat16, so bf16 data is converted on its way in."""
    return _ml_encode(x, _ml("bfloat16"), np.uint16, None)


def bf16_decode(bits) -> np.ndarray:
    return _ml_decode(bits, _ml("bfloat16"), np.uint16)


# ---------------------------------------------------------------------------------------------------------
# Symmetric integer quantization
# ---------------------------------------------------------------------------------------------------------


def _qmax(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 2..8, got {bits!r}")
    return (1 << (int(bits) - 1)) - 1


def _broadcast_scale(scale, ndim: int, axis: int | None) -> np.ndarray:
    """Shape a per-channel scale vector so it broadcasts along ``axis`` of an ndim-array."""
    s = np.asarray(scale, dtype=np.float64)
    if axis is None:
        if s.size != 1:
            raise ValueError("a per-tensor scale must be a scalar; pass axis= for per-channel scales")
        return s.reshape(())
    axis = axis % ndim
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape)


def symmetric_scale(x, bits: int, axis: int | None = None) -> np.ndarray:
    """Scale so that max|x| maps to the largest code 2^(bits-1)-1: per tensor (axis=None, 0-d result) or
    per channel along ``axis`` (1-d result, one per index of that axis). All-zero channels get scale 1, so
    dequantization never divides by or multiplies with zero."""
    qmax = _qmax(bits)
    x = np.asarray(x, dtype=np.float32)
    if axis is None:
        amax = np.max(np.abs(x)) if x.size else np.float32(0)
    else:
        axis = axis % x.ndim
        others = tuple(i for i in range(x.ndim) if i != axis)
        amax = np.max(np.abs(x), axis=others) if others else np.abs(x)
    amax = np.asarray(amax, dtype=np.float32)
    return np.where(amax > 0, amax / np.float32(qmax), np.float32(1)).astype(np.float32)


def quantize_int(x, bits: int, scale, axis: int | None = None) -> np.ndarray:
    """x / scale rounded half to even (numpy's rint), clipped to the symmetric range
    [-(2^(bits-1)-1), 2^(bits-1)-1] (the most negative code is unused). Returns int8 codes, one per
    element (int4 codes too: pack them with pack_int4 for storage)."""
    qmax = _qmax(bits)
    x = np.asarray(x, dtype=np.float64)
    q = np.rint(x / _broadcast_scale(scale, x.ndim, axis))
    return np.clip(q, -qmax, qmax).astype(np.int8)


def dequantize_int(q, scale, axis: int | None = None) -> np.ndarray:
    """codes * scale as float32. For in-range values, |dequantize(quantize(x)) - x| <= scale / 2."""
    q = np.asarray(q)
    return (q.astype(np.float64) * _broadcast_scale(scale, q.ndim, axis)).astype(np.float32)


def pack_int4(q) -> np.ndarray:
    """Pack signed int4 codes (-8..7) two per byte along the last axis: element 2i in the low nibble,
    2i+1 in the high nibble (the ONNX int4 order). An odd last axis is padded with a zero nibble.
    Returns uint8 of shape (..., ceil(n/2))."""
    q = np.asarray(q)
    if q.ndim == 0:
        q = q.reshape(1)
    if q.dtype.kind not in "iu":
        raise TypeError(f"pack_int4 expects integer codes, got {q.dtype}")
    if q.size and (q.min() < -8 or q.max() > 7):
        raise ValueError("int4 codes must be in -8..7")
    n = q.shape[-1]
    if n % 2:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), dtype=q.dtype)], axis=-1)
    nib = (q.astype(np.int16) & 0xF).astype(np.uint8)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed, n: int | None = None) -> np.ndarray:
    """Inverse of pack_int4: uint8 (..., m) -> int8 codes (..., n), sign-extended; n defaults to 2*m."""
    p = np.asarray(packed, dtype=np.uint8)
    lo = (p & 0xF).astype(np.int8)
    hi = (p >> 4).astype(np.int8)
    out = np.stack([lo, hi], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))
    out = np.where(out > 7, out - 16, out).astype(np.int8)
    if n is not None:
        if not 0 <= n <= out.shape[-1]:
            raise ValueError(f"n={n} does not fit {p.shape[-1]} packed bytes")
        out = out[..., :n]
    return out


# ---------------------------------------------------------------------------------------------------------
# Format registry
# ---------------------------------------------------------------------------------------------------------

STICK_BYTES = 128   # equals Target.stick_bytes; kept here so the runtime needs no target to size a stick


class Format(enum.IntEnum):
    """Number formats with their stable codes. The binary file stores these integers: never renumber."""

    DLF16 = 1
    FP32 = 2
    FP8_E4M3 = 3
    FP8_E5M2 = 4
    BF16 = 5
    INT8 = 6
    INT4 = 7
    INT32 = 8
    INT64 = 9    # host only: the device narrows int64 to int32
    BOOL = 10
    # Host-only formats: device memory holds their bytes for host code; no device unit reads them.
    FP64 = 11
    INT16 = 12
    UINT8 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15

    @property
    def key(self) -> str:
        """Lower-case name used in IR and on the command line ("dlf16", "fp8_e4m3", ...)."""
        return self.name.lower()

    @property
    def bits(self) -> int:
        return _INFO[self][0]

    @property
    def bytes_per_element(self) -> float:
        """0.5 for int4; use nbytes() to size buffers."""
        return self.bits / 8

    @property
    def storage_dtype(self) -> np.dtype:
        """dtype of the array encode() returns; its bytes are the device image (int4: packed uint8)."""
        return np.dtype(_INFO[self][1])

    @property
    def value_dtype(self) -> np.dtype:
        """dtype decode() returns: float32 for float formats, the integer type for integers."""
        return np.dtype(_INFO[self][2])

    @property
    def is_float(self) -> bool:
        return self.value_dtype.kind == "f"

    @property
    def on_device(self) -> bool:
        return self not in HOST_ONLY

    @property
    def exact_storage(self) -> bool:
        """Stored as the values themselves (no rounding; no fp32 shadow needed, or wanted: it would round)."""
        return self in HOST_ONLY

    @property
    def elems_per_stick(self) -> int:
        return STICK_BYTES * 8 // self.bits

    def nbytes(self, count: int) -> int:
        """Bytes needed for ``count`` elements (int4 rounds up to whole bytes)."""
        return (int(count) * self.bits + 7) // 8

    @classmethod
    def parse(cls, fmt: "Format | str | int") -> "Format":
        """Format from a member, its lower-case key or its integer code."""
        if isinstance(fmt, Format):
            return fmt
        if isinstance(fmt, str):
            try:
                return FORMATS[fmt.lower()]
            except KeyError:
                raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})") from None
        try:
            return cls(int(fmt))
        except ValueError:
            raise ValueError(f"unknown format code {fmt!r}") from None


# bits, storage dtype, decoded value dtype
_INFO = {
    Format.DLF16: (16, np.uint16, np.float32),
    Format.FP32: (32, np.float32, np.float32),
    Format.FP8_E4M3: (8, np.uint8, np.float32),
    Format.FP8_E5M2: (8, np.uint8, np.float32),
    Format.BF16: (16, np.uint16, np.float32),
    Format.INT8: (8, np.int8, np.int8),
    Format.INT4: (4, np.uint8, np.int8),
    Format.INT32: (32, np.int32, np.int32),
    Format.INT64: (64, np.int64, np.int64),
    Format.BOOL: (8, np.bool_, np.bool_),
    Format.FP64: (64, np.float64, np.float64),
    Format.INT16: (16, np.int16, np.int16),
    Format.UINT8: (8, np.uint8, np.uint8),
    Format.COMPLEX64: (64, np.complex64, np.complex64),
    Format.COMPLEX128: (128, np.complex128, np.complex128),
}

HOST_ONLY = frozenset({Format.INT64, Format.FP64, Format.INT16, Format.UINT8, Format.COMPLEX64,
                       Format.COMPLEX128})

FORMATS: dict[str, Format] = {f.key: f for f in Format}

_INT_RANGE = {Format.INT8: (-128, 127), Format.INT4: (-8, 7),
              Format.INT32: (-(2**31), 2**31 - 1), Format.INT64: (-(2**63), 2**63 - 1)}


def encode(fmt: "Format | str | int", x, saturate: bool = True) -> np.ndarray:
    """Values -> storage array of ``fmt`` (see Format.storage_dtype).

    Float formats take real values and round. Integer formats take integer codes (quantize first with
    quantize_int) and refuse out-of-range codes rather than wrapping; int4 is packed along the last axis.
    ``saturate`` applies to DLFloat16 and fp8.
    """
    f = Format.parse(fmt)
    if f is Format.DLF16:
        return dlf16_encode(x, saturate=saturate)
    if f is Format.FP32:
        return np.asarray(x, dtype=np.float32)
    if f is Format.FP8_E4M3:
        return fp8_e4m3_encode(x, saturate=saturate)
    if f is Format.FP8_E5M2:
        return fp8_e5m2_encode(x, saturate=saturate)
    if f is Format.BF16:
        return bf16_encode(x)
    if f is Format.BOOL:
        return np.asarray(x).astype(np.bool_)
    if f in HOST_ONLY:
        return np.asarray(x).astype(f.storage_dtype)   # integer wrap-around, as the host's types do
    a = np.asarray(x)
    if a.dtype.kind not in "iub":
        raise TypeError(f"{f.key} encode expects integer codes, got {a.dtype}; quantize first")
    lo, hi = _INT_RANGE[f]
    if a.size and (a.min() < lo or a.max() > hi):
        raise ValueError(f"{f.key} codes must be in {lo}..{hi}")
    if f is Format.INT4:
        return pack_int4(a)
    return a.astype(f.storage_dtype)


def decode(fmt: "Format | str | int", bits, n: int | None = None) -> np.ndarray:
    """Storage array -> values (float32 for float formats, integers for integer formats).

    ``n`` is the element count of the last axis for int4 (packed data cannot tell a padding nibble from a
    zero); it is ignored for other formats.
    """
    f = Format.parse(fmt)
    if f is Format.DLF16:
        return dlf16_decode(bits)
    if f is Format.FP8_E4M3:
        return fp8_e4m3_decode(bits)
    if f is Format.FP8_E5M2:
        return fp8_e5m2_decode(bits)
    if f is Format.BF16:
        return bf16_decode(bits)
    if f is Format.INT4:
        return unpack_int4(bits, n)
    return np.asarray(bits).astype(f.value_dtype)
