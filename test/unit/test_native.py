"""The emulator's native DLFloat16 conversions (runtime/native.py) against their definitions in formats.py."""

import numpy as np
import torch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spyre_mlir.runtime import native
from spyre_mlir.runtime.formats import _dlf16_decode_bits, _dlf16_encode_bits, dlf16_decode, dlf16_encode

pytestmark = pytest.mark.skipif(not native.available(), reason="SPYRE_EMU_NATIVE=0")


def encode(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.uint16)
    native.Dlf16Tile(out).encode(x)
    return out


@pytest.mark.parametrize("low", [0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF])
def test_encode_every_rounding_class(low):
    """Every fp32 pattern's top 19 bits (sign, exponent, the 10 fraction bits rounding looks at) with low bits
    below, at and above the rounding point: every zero, NaN, infinity, saturation and carry case."""
    x = ((np.arange(1 << 19, dtype=np.uint32) << 13) | np.uint32(low)).view(np.float32)
    np.testing.assert_array_equal(encode(x), _dlf16_encode_bits(x, saturate=True))


def test_decode_every_pattern():
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = native.Dlf16Tile(codes).decode()
    np.testing.assert_array_equal(out.view(np.uint32), _dlf16_decode_bits(codes).view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.uint32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=9)))
def test_encode_any_bits_any_shape(bits):
    x = bits.view(np.float32)
    np.testing.assert_array_equal(encode(x), dlf16_encode(x))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_strided_views_in_and_out(data):
    """Sources and destinations as the emulator hands them: transposed, broadcast, every other element, a
    padded row pitch; nothing outside the destination view changes."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    rows, cols = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 70))
    src = {
        "contiguous": rng.standard_normal((rows, cols)).astype(np.float32),
        "transposed": rng.standard_normal((cols, rows)).astype(np.float32).T,
        "broadcast": np.broadcast_to(rng.standard_normal((rows, 1)).astype(np.float32), (rows, cols)),
        "every other": rng.standard_normal((rows, 2 * cols)).astype(np.float32)[:, ::2],
    }[data.draw(st.sampled_from(["contiguous", "transposed", "broadcast", "every other"]))]
    pitch = cols + data.draw(st.integers(0, 64))
    mem = rng.integers(0, 1 << 16, (rows, pitch), dtype=np.uint16)
    before = mem.copy()
    tile = native.Dlf16Tile(mem[:, :cols])
    tile.encode(src)
    np.testing.assert_array_equal(mem[:, :cols], dlf16_encode(src))
    np.testing.assert_array_equal(mem[:, cols:], before[:, cols:])
    out = tile.decode()
    np.testing.assert_array_equal(out.view(np.uint32), dlf16_decode(mem[:, :cols]).view(np.uint32))


@pytest.mark.parametrize("cols", [1, 15, 16, 17, 33, 64])
def test_codes_of_any_stride_and_rows_of_any_length(cols):
    """Rows run as whole vectors and one masked tail: every tail length writes its row and nothing past it.
    Codes whose rows are not contiguous (every other pair of bytes, a column of a tile) go through a copy."""
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols)) * 1e4).astype(np.float32)
    x.ravel()[::5] = np.nan
    x.ravel()[::7] = -np.inf
    for view in (lambda m: m[:, :cols], lambda m: m[:, :2 * cols:2], lambda m: m[:3, :cols].T.T,
                 lambda m: m[:, :cols][::-1]):
        mem = rng.integers(0, 1 << 16, (3, 2 * cols + 16), dtype=np.uint16)
        before = mem.copy()
        codes = view(mem)
        tile = native.Dlf16Tile(codes)
        tile.encode(x)
        np.testing.assert_array_equal(codes, dlf16_encode(x))
        written = np.zeros(mem.shape, bool)
        view(written)[...] = True
        np.testing.assert_array_equal(mem[~written], before[~written])
        np.testing.assert_array_equal(tile.decode().view(np.uint32), dlf16_decode(codes).view(np.uint32))
    col = np.zeros((cols, 4), np.uint16)
    native.Dlf16Tile(col[:, 1]).encode(x[0])
    np.testing.assert_array_equal(col[:, 1], dlf16_encode(x[0]))
    assert not col[:, [0, 2, 3]].any()


def test_ranks_and_empty():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) / 7
    np.testing.assert_array_equal(encode(x), dlf16_encode(x))
    np.testing.assert_array_equal(encode(np.array(1.5, np.float32)), dlf16_encode(np.float32(1.5)))
    assert encode(np.zeros((0, 4), np.float32)).shape == (0, 4)
    with pytest.raises(ValueError, match="at most 4-D"):
        encode(np.zeros((1, 1, 1, 1, 2), np.float32))


def test_tile_encodes_what_broadcasts_and_decodes_fresh_arrays():
    """A tile's conversions (built once per view): values of a lower rank or with unit dimensions broadcast
    as numpy assigns them; each decode is a new array; what cannot broadcast is an error, nothing written."""
    mem = np.zeros((3, 4, 40), np.uint16)
    tile = native.Dlf16Tile(mem[:, :, :33])
    rng = np.random.default_rng(1)
    for values in (rng.standard_normal((3, 4, 33)), rng.standard_normal((4, 1)), rng.standard_normal(33),
                   -2.5, rng.standard_normal((1, 4, 33))[:, ::-1].astype(np.float32)):
        tile.encode(values)                     # float64 values are rounded to float32 first
        np.testing.assert_array_equal(mem[:, :, :33], dlf16_encode(np.broadcast_to(values, (3, 4, 33))))
        assert not mem[:, :, 33:].any()
        a, b = tile.decode(), tile.decode()
        assert a is not b and a.flags.c_contiguous
        np.testing.assert_array_equal(a, dlf16_decode(mem[:, :, :33]))
    before = mem.copy()
    with pytest.raises(ValueError, match=r"cannot broadcast shape \(2, 33\) to \(3, 4, 33\)"):
        tile.encode(np.zeros((2, 33), np.float32))
    np.testing.assert_array_equal(mem, before)


def test_a_tile_converts_on_several_threads_at_once(in_threads):
    """Each thread converts through argument blocks of its own: decodes of one tile on four threads at once each
    get the tile's values, and encodes into four tiles at once each write their own (sources that lend no
    writable buffer, read-only ones, take the other way to their address)."""
    rng = np.random.default_rng(2)
    mem = np.zeros((4, 8, 64), np.uint16)
    tiles = [native.Dlf16Tile(mem[i]) for i in range(4)]
    values = rng.standard_normal((4, 8, 64)).astype(np.float32)
    values[1].flags.writeable = False
    shared = native.Dlf16Tile(dlf16_encode(values[0]))
    want = dlf16_decode(dlf16_encode(values[0]))

    def work(i):
        for _ in range(300):
            np.testing.assert_array_equal(shared.decode(), want)
            tiles[i].encode(values[i])
    assert in_threads(work, [(i,) for i in range(4)]) == []
    np.testing.assert_array_equal(mem, dlf16_encode(values))


class _Block(torch.nn.Module):
    """Attention, RMS-normalized, with a SiLU-gated MLP and a convolution: DLFloat16 tiles of every kind the
    emulator converts (matmul operands and results, SFU chains, reductions, windows, inputs and outputs)."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.qkv, self.gate, self.down = (torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, 2 * d),
                                          torch.nn.Linear(2 * d, d))
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        q, k, v = self.qkv(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
        y = x + self.down(torch.nn.functional.silu(self.gate(a)))
        return y + self.conv(y[None, None])[0].sum(0)


@pytest.mark.parametrize("cores", [1, 32])
def test_programs_compute_the_bits_of_numpy_conversions(cores, monkeypatch):
    """A program loaded with the native conversions computes the same bits as loaded with numpy's."""
    import spyre_mlir

    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(32, 64)
    (fast,) = spyre_mlir.compile(model, (x,), cores=cores, cache_dir=False)(x)
    monkeypatch.setitem(native._STATE, "enabled", False)
    for name in ("encode", "decode"):
        monkeypatch.setattr(native.Dlf16Tile, name, None)     # the numpy run must not reach them
    (slow,) = spyre_mlir.compile(model, (x,), cores=cores, cache_dir=False)(x)
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    with torch.no_grad():
        np.testing.assert_allclose(fast, model(x).numpy(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "permuted 3-d", "sliced"])
def test_compile_time_weight_encoding_gives_the_tables_bits(layout):
    """params.dlf16_bits, the compiler's encoding of a big weight (native kernel, in blocks), against
    formats.dlf16_encode: every element of a weight past the size that takes the native path, with the
    special values (NaN, infinities, zeros, saturating and underflowing magnitudes) spread through it, read
    as the views folding makes of weights."""
    from spyre_mlir import params

    rng = np.random.default_rng(3)
    base = rng.standard_normal(params.NATIVE_ENCODE_MIN + 4099).astype(np.float32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, 2.0**-31], np.float32)
    base[rng.integers(0, base.size, 5000)] = rng.choice(special, 5000)
    base[::7] *= np.float32(2.0**60)
    n = base.size // 4099 * 4099
    w = base[:n].reshape(-1, 4099)
    view = {"contiguous": w, "transposed": w.T, "permuted 3-d": w.reshape(-1, 2, 4099).transpose(1, 2, 0),
            "sliced": w[:, 3:]}[layout]
    assert view.size >= params.NATIVE_ENCODE_MIN
    np.testing.assert_array_equal(params.dlf16_bits(view), dlf16_encode(view))
