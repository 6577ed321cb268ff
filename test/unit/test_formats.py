"""Bit-exactness of the number formats (runtime/formats.py) against the DLFloat16 spec and ml_dtypes."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spyre_mlir.runtime import formats as F
from spyre_mlir.runtime.formats import (
    DLF16_MAX, DLF16_MIN_NORMAL, DLF16_NAN_BITS, Format, dlf16_decode, dlf16_encode, dlf16_round,
)

ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def spec_value(p: int) -> float:
    """The DLFloat16 value of pattern p straight from the spec, with Python floats."""
    s, e, m = p >> 15, (p >> 9) & 0x3F, p & 0x1FF
    sign = -1.0 if s else 1.0
    if e == 0 and m == 0:
        return math.copysign(0.0, sign)
    if e == 63 and m == 511:
        return math.nan
    return sign * math.ldexp(1.0 + m / 512.0, e - 31)


# Positive finite values in order, with 2**-31 in front: the value the pattern e=0,m=0 "would have". The
# rounding grid includes it (inputs near 2**-31 round onto that pattern, which reads back as zero).
POS = dlf16_decode(np.arange(1, 0x7FFF, dtype=np.uint16)).astype(np.float64)
GRID = np.concatenate([[2.0**-31], POS])
GRID_BITS = np.arange(0, 0x7FFF, dtype=np.int64)


def reference_encode(x: np.ndarray, saturate: bool) -> np.ndarray:
    """Independent encoder: nearest grid value by search, ties to the larger magnitude."""
    x = np.asarray(x, dtype=np.float32)
    sign = np.signbit(x).astype(np.int64) << 15
    with np.errstate(invalid="ignore"):      # signalling NaNs among random bit patterns
        a = np.abs(x.astype(np.float64))
    if saturate:
        a = np.where(np.isnan(a), a, np.minimum(a, DLF16_MAX))
    hi = np.clip(np.searchsorted(GRID, a, side="left"), 1, len(GRID) - 1)
    lo = hi - 1
    mid = (GRID[lo] + GRID[hi]) / 2
    idx = np.where(a >= mid, hi, lo)
    bits = GRID_BITS[idx]
    bits = np.where(a < 2.0**-31, 0, bits)
    overflow = np.isnan(a) | (a >= DLF16_MAX + 2.0**(32 - 10))
    bits = np.where(overflow, DLF16_NAN_BITS, bits)
    return (bits | sign).astype(np.uint16)


# ---- DLFloat16: all patterns ------------------------------------------------------------------------------


def test_decode_matches_spec_for_all_patterns():
    got = dlf16_decode(ALL)
    assert got.dtype == np.float32
    want = np.array([spec_value(int(p)) for p in ALL], dtype=np.float64)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].astype(np.float64), want[~nan])
    assert np.array_equal(np.signbit(got), ALL >= 0x8000)   # zeros and NaNs keep their sign


def test_decode_encode_identity_for_all_patterns():
    # Including the two NaN patterns: decode keeps the NaN's sign, encode puts it back.
    for sat in (True, False):
        assert np.array_equal(dlf16_encode(dlf16_decode(ALL), saturate=sat), ALL)


def test_constants():
    assert dlf16_decode(np.uint16(0x7FFE)) == np.float32(DLF16_MAX) == np.float32(8573157376.0)
    assert dlf16_decode(np.uint16(0x0001)) == np.float32(DLF16_MIN_NORMAL)
    assert DLF16_NAN_BITS == 0x7FFF
    assert np.isnan(dlf16_decode(np.uint16(0xFFFF)))


# ---- DLFloat16: rounding boundaries -----------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_every_midpoint_rounds_away_from_zero(sign):
    lo_bits = np.arange(1, 0x7FFE, dtype=np.uint16)          # every consecutive finite pair (p, p+1)
    a = dlf16_decode(lo_bits).astype(np.float64)
    b = dlf16_decode(lo_bits + 1).astype(np.float64)
    mid = ((a + b) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (a + b) / 2)  # midpoints are exact in fp32
    s = np.float32(sign)
    sbit = np.uint16(0x8000 if sign < 0 else 0)
    below = np.nextafter(mid, np.float32(0))
    above = np.nextafter(mid, np.float32(np.inf))
    assert np.array_equal(dlf16_encode(s * mid), (lo_bits + 1) | sbit)
    assert np.array_equal(dlf16_encode(s * below), lo_bits | sbit)
    assert np.array_equal(dlf16_encode(s * above), (lo_bits + 1) | sbit)


def test_carry_into_exponent():
    # 1 + 1023/1024 is the midpoint between 1 + 511/512 (0x3FFF) and 2 (0x4000): rounds up, exponent + 1.
    assert dlf16_encode(np.float32(1 + 1023 / 1024)) == 0x4000
    assert dlf16_encode(np.nextafter(np.float32(1 + 1023 / 1024), np.float32(0))) == 0x3FFF
    # The fp32 value just below 2 also carries.
    assert dlf16_encode(np.nextafter(np.float32(2), np.float32(0))) == 0x4000


def test_underflow():
    assert dlf16_encode(np.float32(2.0**-31)) == 0x0000            # 2**-31 itself is the zero pattern
    assert dlf16_encode(np.float32(-(2.0**-31))) == 0x8000
    assert dlf16_encode(np.float32(2.0**-31 * (1 + 1 / 512))) == 0x0001   # the smallest value
    half = np.float32(2.0**-31 * (1 + 1 / 1024))                 # midpoint between 2**-31 and the smallest
    assert dlf16_encode(half) == 0x0001
    assert dlf16_encode(np.nextafter(half, np.float32(0))) == 0x0000
    tiny = np.array([2.0**-32, 2.0**-40, 1e-45, 2.0**-31 * (1 - 2**-12)], dtype=np.float32)
    assert np.array_equal(dlf16_encode(tiny), np.zeros(4, np.uint16))
    assert np.array_equal(dlf16_encode(-tiny), np.full(4, 0x8000, np.uint16))
    assert dlf16_encode(np.float32(-0.0)) == 0x8000


def test_overflow_with_and_without_saturation():
    top = np.float32(DLF16_MAX + 2.0**(32 - 10))     # midpoint between max and the NaN pattern's "value"
    below = np.nextafter(top, np.float32(0))
    assert dlf16_encode(below, saturate=False) == 0x7FFE
    assert dlf16_encode(top, saturate=False) == 0x7FFF
    assert dlf16_encode(-top, saturate=False) == 0xFFFF
    assert dlf16_encode(top, saturate=True) == 0x7FFE
    assert dlf16_encode(-top, saturate=True) == 0xFFFE
    x = np.array([1e10, -1e10, 3e38, np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32)
    assert dlf16_encode(x, saturate=False).tolist() == [0x7FFF, 0xFFFF, 0x7FFF, 0x7FFF, 0xFFFF, 0x7FFF, 0xFFFF]
    # onnx-mlir's saturation: finite and infinite values clip to +-max, NaN stays the NaN pattern.
    assert dlf16_encode(x, saturate=True).tolist() == [0x7FFE, 0xFFFE, 0x7FFE, 0x7FFE, 0xFFFE, 0x7FFF, 0xFFFF]
    assert np.isnan(dlf16_round(np.float32(1e10), saturate=False))
    assert dlf16_round(np.float32(1e10)) == np.float32(DLF16_MAX)


def test_matches_independent_reference_on_random_fp32_bits():
    rng = np.random.default_rng(1234)
    bits = rng.integers(0, 1 << 32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    # Also dense samples in the DLFloat16 range, where random fp32 bits are comparatively rare.
    y = (rng.uniform(-33, 33, size=200_000) + 0.0).astype(np.float64)
    y = (np.sign(rng.standard_normal(y.size)) * np.exp2(y)).astype(np.float32)
    for v in (x, y):
        for sat in (True, False):
            assert np.array_equal(dlf16_encode(v, saturate=sat), reference_encode(v, sat))


def test_large_arrays_by_blocks_match_the_definitions():
    """Arrays larger than a chunk (weights) encode and decode a block at a time (rows, or tiles of a transposed
    view, ragged at its edges), through lookup tables: the same bits as the arithmetic definitions, for
    transposed (strided) and 3-D inputs, every pattern."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((700, 300)) * np.exp2(rng.uniform(-40, 40, (700, 300)))).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    for v in (x, x.T, x.reshape(7, 100, 300)):
        for sat in (True, False):
            got = dlf16_encode(v, saturate=sat)
            assert got.shape == v.shape and np.array_equal(got, F._dlf16_encode_bits(v, sat))
    codes = np.tile(ALL, 5).reshape(5, 1 << 16)
    for c in (codes, codes.T):
        got = dlf16_decode(c)
        assert got.shape == c.shape
        assert np.array_equal(got.view(np.uint32), F._dlf16_decode_bits(c).view(np.uint32))


def test_shapes_and_scalars():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2, 1:]   # non-contiguous
    assert dlf16_encode(x).shape == (2, 2, 3)
    assert np.array_equal(dlf16_round(x), x)                         # small integers are exact
    assert dlf16_encode(1.0).shape == ()
    assert dlf16_decode([0x3E00, 0x4000]).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        dlf16_decode(np.array([70000]))


# ---- DLFloat16: properties --------------------------------------------------------------------------------

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(f32, min_size=1, max_size=64))
def test_encode_is_monotonic(xs):
    x = np.sort(np.array(xs, dtype=np.float32))
    r = dlf16_round(x)                    # saturating: finite in, finite out
    assert not np.isnan(r).any()
    assert np.all(np.diff(r.astype(np.float64)) >= 0)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False)))
def test_encode_is_sign_symmetric(x):
    for sat in (True, False):
        assert np.array_equal(dlf16_encode(-x, saturate=sat), dlf16_encode(x, saturate=sat) ^ np.uint16(0x8000))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(
    min_value=2.0**-31 * (1 + 2.0**-10), max_value=DLF16_MAX, width=32)), st.booleans())
def test_relative_error_at_most_half_ulp(x, negate):
    if negate:
        x = -x
    r = dlf16_round(x).astype(np.float64)
    assert np.all(np.abs(r - x) <= 2.0**-10 * np.abs(x.astype(np.float64)))


# ---- fp8 and bf16 -----------------------------------------------------------------------------------------

ML = [
    (F.fp8_e4m3_encode, F.fp8_e4m3_decode, ml_dtypes.float8_e4m3fn, np.uint8, F.FP8_E4M3_MAX),
    (F.fp8_e5m2_encode, F.fp8_e5m2_decode, ml_dtypes.float8_e5m2, np.uint8, F.FP8_E5M2_MAX),
]


@pytest.mark.parametrize("enc,dec,dt,st_,mx", ML)
def test_fp8_all_patterns_round_trip(enc, dec, dt, st_, mx):
    pats = np.arange(256, dtype=np.uint16).astype(np.uint8)
    vals = dec(pats)
    assert np.array_equal(vals.view(np.uint32), pats.view(dt).astype(np.float32).view(np.uint32))   # NaNs too
    finite = np.isfinite(vals)
    assert np.array_equal(enc(vals[finite]), pats[finite])
    assert mx == float(ml_dtypes.finfo(dt).max)      # the constants formats writes out (ml_dtypes is lazy)


@pytest.mark.parametrize("enc,dec,dt,st_,mx", ML)
def test_fp8_matches_ml_dtypes_and_saturates(enc, dec, dt, st_, mx):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(10_000) * mx / 4).astype(np.float32)
    inside = np.abs(x) <= mx
    assert np.array_equal(enc(x[inside]), x[inside].astype(dt).view(np.uint8))
    big = np.array([mx * 4, -mx * 4, np.inf, -np.inf], dtype=np.float32)
    assert np.array_equal(dec(enc(big)), np.array([mx, -mx, mx, -mx], np.float32))
    assert not np.isfinite(dec(enc(big, saturate=False))).any()   # e4m3fn -> NaN, e5m2 -> inf
    assert np.isnan(dec(enc(np.float32(np.nan))))


def test_bf16_matches_ml_dtypes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(10_000).astype(np.float32) * 1e3
    b = F.bf16_encode(x)
    assert b.dtype == np.uint16
    assert np.array_equal(b, x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(F.bf16_decode(b), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    pats = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = F.bf16_decode(pats)
    ok = ~np.isnan(v)
    assert np.array_equal(F.bf16_encode(v[ok]), pats[ok])


# ---- integer quantization ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_per_tensor_error_bound(bits):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((16, 33)).astype(np.float32)
    s = F.symmetric_scale(x, bits)
    assert s.shape == ()
    q = F.quantize_int(x, bits, s)
    qmax = 2 ** (bits - 1) - 1
    assert q.dtype == np.int8 and q.min() >= -qmax and q.max() <= qmax
    assert np.abs(q).max() == qmax
    err = np.abs(F.dequantize_int(q, s).astype(np.float64) - x)
    assert np.all(err <= s / 2 * (1 + 1e-6))


@pytest.mark.parametrize("bits,axis", [(8, 0), (8, 1), (4, -1), (4, 0)])
def test_quantize_per_channel(bits, axis):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 10)).astype(np.float32) * np.float32(10) ** rng.integers(-3, 3, (6, 1))
    x[2] = 0
    x[:, 3] = 0
    s = F.symmetric_scale(x, bits, axis=axis)
    assert s.shape == (x.shape[axis],) and np.all(s > 0)
    q = F.quantize_int(x, bits, s, axis=axis)
    d = F.dequantize_int(q, s, axis=axis)
    shape = [1, 1]
    shape[axis] = -1
    assert np.all(np.abs(d.astype(np.float64) - x) <= s.reshape(shape) / 2 * (1 + 1e-6))


def test_quantize_rounds_half_to_even_and_clips():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0], dtype=np.float32)
    assert F.quantize_int(x, 8, 1.0).tolist() == [0, 2, 2, 0, -2, 127, -127]
    assert F.quantize_int(x, 4, 1.0).tolist() == [0, 2, 2, 0, -2, 7, -7]
    assert F.symmetric_scale(np.zeros(4), 8) == 1.0
    with pytest.raises(ValueError):
        F.quantize_int(x, 9, 1.0)


def test_int4_pack_unpack():
    rng = np.random.default_rng(5)
    q = rng.integers(-8, 8, size=(3, 7)).astype(np.int8)
    p = F.pack_int4(q)
    assert p.dtype == np.uint8 and p.shape == (3, 4)
    assert np.array_equal(F.unpack_int4(p, 7), q)
    assert F.pack_int4(np.array([1, -1], np.int8)).tolist() == [0xF1]     # first element in the low nibble
    assert F.unpack_int4(np.array([0x87], np.uint8)).tolist() == [7, -8]
    with pytest.raises(ValueError):
        F.pack_int4(np.array([8]))


# ---- registry ---------------------------------------------------------------------------------------------


def test_format_codes_are_stable():
    want = {"dlf16": 1, "fp32": 2, "fp8_e4m3": 3, "fp8_e5m2": 4, "bf16": 5, "int8": 6, "int4": 7,
            "int32": 8, "int64": 9, "bool": 10, "fp64": 11, "int16": 12, "uint8": 13, "complex64": 14,
            "complex128": 15}
    assert {k: int(v) for k, v in F.FORMATS.items()} == want
    assert Format.parse("DLF16") is Format.DLF16 and Format.parse(7) is Format.INT4
    with pytest.raises(ValueError):
        Format.parse("fp16")


def test_format_sizes():
    per_stick = {"dlf16": 64, "fp32": 32, "fp8_e4m3": 128, "fp8_e5m2": 128, "bf16": 64, "int8": 128,
                 "int4": 256, "int32": 32, "int64": 16, "bool": 128, "fp64": 16, "int16": 64, "uint8": 128,
                 "complex64": 16, "complex128": 8}
    assert {k: f.elems_per_stick for k, f in F.FORMATS.items()} == per_stick
    assert Format.INT4.bytes_per_element == 0.5 and Format.INT4.nbytes(7) == 4
    assert not Format.INT64.on_device and Format.DLF16.on_device
    assert all(not f.on_device and f.exact_storage for f in (Format.FP64, Format.COMPLEX64, Format.UINT8))
    for f in Format:
        assert f.storage_dtype.itemsize * 8 == f.bits or f is Format.INT4


@pytest.mark.parametrize("name", ["dlf16", "fp32", "fp8_e4m3", "fp8_e5m2", "bf16"])
def test_registry_float_round_trip(name):
    x = np.array([[0.0, 1.0, -2.5, 0.1875], [3.0, -0.25, 96.0, 6.0]], dtype=np.float32)
    b = F.encode(name, x)
    assert b.dtype == Format.parse(name).storage_dtype and b.shape == x.shape
    assert np.array_equal(F.decode(name, b), x)     # all exactly representable


def test_registry_integers():
    q = np.array([[-8, 7, 0], [1, -1, 3]], dtype=np.int8)
    assert np.array_equal(F.decode("int4", F.encode("int4", q), n=3), q)
    assert np.array_equal(F.decode("int8", F.encode("int8", q)), q)
    assert F.encode("int32", q).dtype == np.int32
    assert F.decode(Format.BOOL, F.encode("bool", [1, 0])).tolist() == [True, False]
    with pytest.raises(ValueError):
        F.encode("int8", np.array([200]))
    with pytest.raises(TypeError):
        F.encode("int8", np.array([1.5]))


def test_no_torch_import():
    import subprocess
    import sys
    code = "import sys, spyre_mlir.runtime.formats; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)



def test_running_or_finding_in_the_cache_a_dlfloat16_program_never_imports_ml_dtypes(tmp_path):
    """Importing ml_dtypes takes ~0.7 s (numpy 2.4 registers its ufunc loops in quadratic time): half of a cache
    hit. Torch-MLIR's importer imports it, so a cold compile pays it; a fresh process that loads and runs a
    DLFloat16 binary, or finds its model in the compile cache, must not."""
    import subprocess
    import sys

    # A causal mask of 0 and -inf, which spyre-fold-constants stores as fp8 e5m2 (exact, half the bytes): the
    # loader decodes it through a table, built without ml_dtypes.
    model = ("import sys, numpy as np, torch, spyre_mlir\n"
             "class M(torch.nn.Module):\n"
             "    def __init__(self):\n"
             "        super().__init__()\n"
             "        self.lin = torch.nn.Linear(64, 64)\n"
             "        self.register_buffer('mask', torch.full((8, 64), float('-inf')).triu(1))\n"
             "    def forward(self, x):\n"
             "        return torch.softmax(self.lin(x) + self.mask, -1)\n"
             "torch.manual_seed(0)\n"
             "m = M().eval()\n"
             "x = torch.randn(8, 64)\n")
    cache, binary = str(tmp_path / "cache"), str(tmp_path / "m.spyre")
    run = ("assert np.abs(exe(x.numpy())[0] - m(x).detach().numpy()).max() < 0.05\n"
           "print(sorted(n for n in sys.modules if n.startswith('ml_dtypes')))\n")
    steps = {
        "cold": f"exe = spyre_mlir.compile(m, (x,), cores=2, cache_dir={cache!r})\n"
                f"spyre_mlir.compile_to_file(m, (x,), output={binary!r}, cores=2, cache_dir={cache!r})\n",
        "hit": f"exe = spyre_mlir.compile(m, (x,), cores=2, cache_dir={cache!r})\n"
               f"assert exe.compile_info.cache_hit\n",
        "load": f"from spyre_mlir.runtime import load\nexe = load({binary!r})\n"
                "assert 'fp8_e5m2' in [b.fmt.key for b in exe.program.buffers]\n",
    }
    for name, step in steps.items():
        out = subprocess.run([sys.executable, "-c", model + step + run], capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        imported = out.stdout.strip().splitlines()[-1]
        assert (imported != "[]") if name == "cold" else (imported == "[]"), (name, imported)
