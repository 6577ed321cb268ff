"""Emulator tests: programs assembled with ProgramBuilder, run, and checked against numpy.

Tolerances come from the format, not from trial and error. DLFloat16 keeps 9 fraction bits and rounds to
nearest, so one rounding has relative error at most U = 2^-10. A DLFloat16 matmul rounds each input once and
the result once, and accumulates exactly enough in fp32 (K * 2^-24 is far below U for these K), so against
numpy fp32 on the unrounded inputs

    |y - x@w| <= 2U (1 + U) |x|@|w| + U |x@w|       (first-order bound, the (1 + U) covers the product)

fp32-reference mode runs the same program without rounding: it must match numpy fp32 to 1e-5 relative to
the same scale |x|@|w| (summation order is the only difference).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_mlir.runtime import InputError, ProgramBuilder, load, register_host_function
from spyre_mlir.runtime.formats import decode, dlf16_encode, dlf16_round, encode
from spyre_mlir.runtime.emulator import SpyreRuntimeError
from spyre_mlir.runtime.kernels import build_layernorm, build_matmul, build_rmsnorm, build_softmax
from spyre_mlir.target import load_target
from spyre_mlir.tools.run import main as spyre_run

U = 2.0**-10            # DLFloat16 unit roundoff (round to nearest, 9 fraction bits)
REF_RTOL = 1e-5         # fp32-reference vs numpy fp32


@pytest.fixture(scope="module")
def targets():
    base = load_target()
    return {n: base.with_cores(n) for n in (1, 2, 4, 32)}


def _rng(seed=0):
    return np.random.default_rng(seed)


def _matmul_bound(x, w):
    ref = x.astype(np.float64) @ w.astype(np.float64)
    return ref, 2 * U * (1 + U) * (np.abs(x) @ np.abs(w)) + U * np.abs(ref)


# ---------------------------------------------------------------------------------------------------------
# matmul on 1, 2 and 32 cores
# ---------------------------------------------------------------------------------------------------------

MATMULS = [
    # cores, M, N, K, kwargs
    (1, 128, 192, 256, dict(tile_m=64, tile_n=64, tile_k=64)),                 # K accumulation, 3x2 tiles
    (1, 40, 100, 70, dict()),                                                   # ragged: padded sticks
    (2, 128, 128, 256, dict(grid=(1, 2), tile_k=128)),                          # N split over 2 cores
    (2, 64, 64, 256, dict(grid=(1, 1), split_k=2)),                             # split-K over the ring
    (32, 256, 256, 512, dict(grid=(2, 2), split_k=8)),                          # 32 cores, split-K by 8
    (32, 256, 512, 128, dict(grid=(4, 8), tile_k=64, double_buffer=False)),     # 32 cores, grid only
]


@pytest.mark.parametrize("cores,M,N,K,kw", MATMULS)
def test_matmul_matches_numpy_within_dlf16_bound(targets, cores, M, N, K, kw):
    exe = build_matmul(targets[cores], M, N, K, **kw).load()
    rng = _rng(cores)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    (y,) = exe(x, w)
    ref, bound = _matmul_bound(x, w)
    assert y.shape == (M, N) and y.dtype == np.float32
    assert np.all(np.abs(y - ref) <= bound), np.max(np.abs(y - ref) / bound)
    # Results are DLFloat16 values: encoding them again changes nothing.
    assert np.array_equal(dlf16_round(y), y)

    ref_exe = build_matmul(targets[cores], M, N, K, **kw).load(numerics="fp32-reference")
    (yr,) = ref_exe(x, w)
    scale = np.abs(x) @ np.abs(w)
    assert np.all(np.abs(yr - ref) <= REF_RTOL * scale)
    assert not np.array_equal(yr, y)        # the reference really skipped the rounding


def test_matmul_constant_weights_and_bias(targets):
    rng = _rng(1)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    exe = build_matmul(targets[1], 32, 64, 128, weights=w, bias=bias, out_fmt="fp32").load()
    assert exe.input_names == ["x"]
    x = rng.standard_normal((32, 128)).astype(np.float32)
    (y,) = exe(x)
    wr = dlf16_round(w)                      # the constant holds rounded weights; bias is fp32
    ref = x.astype(np.float64) @ wr + bias
    bound = U * (1 + U) * (np.abs(x) @ np.abs(wr)) + 1e-5 * (np.abs(ref) + 1)
    assert np.all(np.abs(y - ref) <= bound)


def test_split_k_bias_on_32_cores(targets):
    rng = _rng(2)
    bias = rng.standard_normal(128).astype(np.float32)
    exe = build_matmul(targets[32], 128, 128, 1024, grid=(2, 2), split_k=8, bias=bias).load()
    x = rng.standard_normal((128, 1024)).astype(np.float32)
    w = rng.standard_normal((1024, 128)).astype(np.float32)
    (y,) = exe(x=x, w=w)
    ref, bound = _matmul_bound(x, w)
    assert np.all(np.abs(y - (ref + bias)) <= bound + U * np.abs(bias) + 1e-5 * np.abs(ref))
    assert exe.profile.ring_bytes > 0


def test_int8_matmul_scales_are_exact(targets):
    """int8 x int8 accumulates exactly in int32; write-back applies per-tensor and per-column scales."""
    rng = _rng(3)
    M, N, K = 16, 64, 256
    qa = rng.integers(-127, 128, (M, K)).astype(np.int8)
    qb = rng.integers(-127, 128, (K, N)).astype(np.int8)
    cs = rng.uniform(0.5, 2, N).astype(np.float32)
    b = ProgramBuilder(targets[1])
    a_buf, b_buf = b.input("a", (M, K), "int8"), b.constant("b", qb, "int8", encoded=True)
    cs_buf = b.constant("cs", cs.reshape(1, N), "fp32")
    acc_out, y_out = b.output("acc", (M, N), "int32"), b.output("y", (M, N), "fp32")
    A, B = b.alloc(0, M, K, "int8"), b.alloc(0, K, N, "int8")
    C, Y, CS = b.alloc(0, M, N, "int32"), b.alloc(0, M, N, "fp32"), b.alloc(0, 1, N, "fp32")
    for t, buf in ((A, a_buf), (B, b_buf), (CS, cs_buf)):
        b.load_tile(0, t, buf)
    b.matmul(0, A, B, C, out=Y, scale=0.25, col_scale=CS)
    b.store_tile(0, C, acc_out)
    b.store_tile(0, Y, y_out)
    acc, y = b.load()(qa)
    exact = qa.astype(np.int64) @ qb.astype(np.int64)
    assert acc.dtype == np.int32 and np.array_equal(acc, exact)
    assert np.allclose(y, (exact * 0.25 * cs).astype(np.float32), rtol=2**-23, atol=0)


@pytest.mark.parametrize("K", [64, 512, 688, 1024])
def test_matmul_bits_do_not_depend_on_the_tile_rows(targets, K):
    """An output row's fp32 sum is the same whatever rows share its tile: one [16, K] tile, two [8, K] tiles and a
    one-row tile give the same bits (BLAS alone sums a K beyond its inner block, and a single row, another way;
    then 1, 2 or 4 cards, or other core counts, tiling the same plan's rows otherwise, gave other bits)."""
    rng = _rng(9)
    M, N = 16, 64
    a = dlf16_round(rng.standard_normal((M, K)).astype(np.float32))
    w = dlf16_round(rng.standard_normal((K, N)).astype(np.float32))
    outs = []
    for rows in (16, 8, 1):
        b = ProgramBuilder(targets[1])
        a_buf = b.input("a", (M, K), "dlf16")
        w_buf = b.constant("w", w, "dlf16")
        y_out = b.output("y", (M, N), "fp32")
        A, B, C = b.alloc(0, rows, K, "dlf16"), b.alloc(0, K, N, "dlf16"), b.alloc(0, rows, N, "fp32")
        b.load_tile(0, B, w_buf)
        for r0 in range(0, M, rows):
            b.load_tile(0, A, a_buf, row0=r0)
            b.matmul(0, A, B, C)
            b.store_tile(0, C, y_out, row0=r0)
        outs.append(b.load()(a)[0])
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    assert np.allclose(outs[0], a.astype(np.float64) @ w.astype(np.float64), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["dlf16", "int8"])
def test_matmul_trans_b_is_the_product_of_the_stored_transpose(targets, fmt):
    """MATMUL TRANS_B reads B from a stored [N, K] tile (N = 10 rows of K = 256: 40 sticks, where [K, N] would
    take 256): bit-identical to the plain product of the same B stored [K, N], accumulate included; int8
    exact."""
    rng = _rng(4)
    M, N, K = 8, 10, 256
    if fmt == "int8":
        a = rng.integers(-127, 128, (M, K)).astype(np.int8)
        bt = rng.integers(-127, 128, (N, K)).astype(np.int8)
    else:
        a, bt = dlf16_round(rng.standard_normal((M, K)).astype(np.float32)), \
            dlf16_round(rng.standard_normal((N, K)).astype(np.float32))
    acc = "int32" if fmt == "int8" else "fp32"
    outs = []
    for trans in (True, False):
        b = ProgramBuilder(targets[1])
        a_buf = b.input("a", (M, K), fmt)
        w = bt if trans else np.ascontiguousarray(bt.T)
        b_buf = b.constant("b", w, fmt, encoded=fmt == "int8")
        y_out = b.output("y", (M, N), acc)
        A, B, C = b.alloc(0, M, K, fmt), b.alloc(0, *w.shape, fmt), b.alloc(0, M, N, acc)
        b.load_tile(0, A, a_buf)
        b.load_tile(0, B, b_buf)
        b.matmul(0, A, B, C, trans_b=trans)
        b.matmul(0, A, B, C, accumulate=True, trans_b=trans)
        b.store_tile(0, C, y_out)
        exe = b.load()
        outs.append((exe(a)[0], exe.static_profile.cycles))
    (y, cyc), (y0, cyc0) = outs
    assert np.array_equal(y, y0) and cyc < cyc0      # the same products; B's load moves 5 KiB, not 32 KiB
    ref = 2 * (a.astype(np.float64) @ bt.T.astype(np.float64))
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-3) if fmt == "dlf16" else np.array_equal(y, ref.astype(np.int64))


@pytest.mark.parametrize("offset, stride", [(-1, 1), (2, 1), (-1, 2), (0, 3)])
def test_matmul_column_window_and_interleaved_store(targets, offset, stride):
    """MATMUL WINDOW reads B's columns offset + j*stride of the stored tile (zero outside it), exactly the
    product with the shifted, zero-padded columns; a DMA store whose blocks' rows interleave writes a tile held
    in (half, row) order to rows (row, half)."""
    rng = _rng(8)
    M, K, W, N = 8, 24, 20, 12
    x, w = rng.standard_normal((K, W)).astype(np.float32), rng.standard_normal((M, K)).astype(np.float32)
    b = ProgramBuilder(targets[1])
    x_buf, w_buf = b.constant("x", x, "fp32"), b.constant("w", w, "fp32")
    y_out = b.output("y", (M, N), "fp32")
    X, Wt, C = b.alloc(0, K, W, "fp32"), b.alloc(0, M, K, "fp32"), b.alloc(0, M, N, "fp32")
    Xd, Wd = b.alloc(0, K, W, "dlf16"), b.alloc(0, M, K, "dlf16")
    b.load_tile(0, X, x_buf)
    b.load_tile(0, Wt, w_buf)
    b.sfu(0, "cast", Xd, X)
    b.sfu(0, "cast", Wd, Wt)
    # C rows (h, r) for halves h of M: stored to output rows (r, h) by one DMA with interleaved rows.
    for h in range(2):
        b.matmul(0, Wd.row_slice(4 * h, 4 * h + 4), Xd, C.row_slice(4 * h, 4 * h + 4), window=(offset, stride, N))
    p = C.pitch
    b.dma_store(0, y_out.addr, C.addr, (4, 2, p), (2 * p, p), (p, 4 * p))
    (y,) = b.load()()
    cols = offset + stride * np.arange(N)
    xs = np.where((cols >= 0) & (cols < W), x[:, np.clip(cols, 0, W - 1)], 0)
    ref = np.asarray(dlf16_round(w)) @ np.asarray(dlf16_round(xs))
    ref = ref.reshape(2, 4, N).transpose(1, 0, 2).reshape(M, N)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_fp8_matmul(targets):
    rng = _rng(4)
    M, N, K = 32, 128, 128
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    exe = build_matmul(targets[1], M, N, K, fmt="fp8_e4m3", out_fmt="fp32").load()
    (y,) = exe(x, w)
    from spyre_mlir.runtime.formats import decode
    xr, wr = (decode("fp8_e4m3", encode("fp8_e4m3", v)) for v in (x, w))
    ref = xr.astype(np.float64) @ wr
    assert np.all(np.abs(y - ref) <= 1e-5 * (np.abs(xr) @ np.abs(wr)))


# ---------------------------------------------------------------------------------------------------------
# SFU: elementwise chain, softmax, norms, every function
# ---------------------------------------------------------------------------------------------------------


def _chain_program(target, R=64, C=200):
    """y = exp(max(tanh(x * w + 0.5), x)) - 1, each step rounded to DLFloat16 in the scratchpad."""
    b = ProgramBuilder(target)
    x, w, y = b.input("x", (R, C)), b.input("w", (R, C)), b.output("y", (R, C))
    rows = R // target.num_cores
    for core in range(target.num_cores):
        X, W, T = (b.alloc(core, rows, C) for _ in range(3))
        b.load_tile(core, X, x, core * rows)
        b.load_tile(core, W, w, core * rows)
        b.sfu(core, "mul", T, X, W)
        b.sfu(core, "add", T, T, 0.5)
        b.sfu(core, "tanh", T, T)
        b.sfu(core, "max", T, T, X)
        b.sfu(core, "exp", T, T)
        b.sfu(core, "sub", T, T, 1.0)
        b.store_tile(core, T, y, core * rows)
    return b


def test_elementwise_chain_is_bit_exact(targets):
    """Each SFU op computes in fp32 and rounds on write: a numpy model that rounds after every step with
    formats.dlf16_round must agree bit for bit."""
    rng = _rng(5)
    x = rng.standard_normal((64, 200)).astype(np.float32)
    w = rng.standard_normal((64, 200)).astype(np.float32)
    (y,) = _chain_program(targets[2]).load()(x, w)
    r = dlf16_round
    xr, wr = r(x), r(w)
    t = r(xr * wr)
    t = r(t + np.float32(0.5))
    t = r(np.tanh(t))
    t = r(np.maximum(t, xr))
    t = r(np.exp(t))
    t = r(t - np.float32(1))
    assert np.array_equal(dlf16_encode(y), dlf16_encode(t))
    (yr,) = _chain_program(targets[2]).load(numerics="fp32-reference")(x, w)
    exact = np.exp(np.maximum(np.tanh(x * w + np.float32(0.5)), x)) - np.float32(1)
    assert np.allclose(yr, exact, rtol=REF_RTOL, atol=1e-6)


def test_a_constant_load_into_bytes_the_program_overwrites_runs_at_every_call(targets):
    """The plan runs a load of constants at the first call only when nothing else writes its scratchpad bytes
    (``kept``); a tile the program overwrites after the load (``reused``, with exp of itself) is loaded again at
    every call, so what a store copies from it is the constant at every call."""
    w = _rng(7).standard_normal((8, 64)).astype(np.float32)
    b = ProgramBuilder(targets[1])
    c = b.constant("w", w, "dlf16")
    y1, y2, y3 = (b.output(f"y{i}", (8, 64), "dlf16") for i in (1, 2, 3))
    kept, reused = (b.alloc(0, 8, 64, "dlf16") for _ in range(2))
    b.load_tile(0, kept, c)
    b.store_tile(0, kept, y1)
    b.load_tile(0, reused, c)
    b.store_tile(0, reused, y2)
    b.sfu(0, "exp", reused, reused)
    b.store_tile(0, reused, y3)
    exe = b.load()
    first, second = exe(), exe()
    wr = dlf16_round(w)
    assert np.array_equal(first[0], wr) and np.array_equal(first[1], wr)
    assert np.array_equal(first[2], dlf16_round(np.exp(wr)))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_a_delivery_of_constants_lands_once_unless_the_program_overwrites_it(targets):
    """Ring deliveries of constants' bytes are planned like constant loads: into bytes nothing else writes
    (``kept``) they land at the first call only; into a tile the program overwrites after (``reused``, with exp
    of itself) they land at every call, so what a store copies from it is the constant at every call."""
    w = _rng(8).standard_normal((8, 64)).astype(np.float32)
    b = ProgramBuilder(targets[2])
    c = b.constant("w", w, "dlf16")
    y1 = b.output("y1", (4, 64), "dlf16")
    y2, y3 = (b.output(f"y{i}", (8, 64), "dlf16") for i in (2, 3))
    t = b.alloc(0, 8, 64, "dlf16")
    kept, reused = b.alloc(1, 4, 64, "dlf16"), b.alloc(1, 8, 64, "dlf16")
    b.load_tile(0, t, c)
    b.ring_send(0, 1, kept.addr, t, nbytes=kept.nbytes)      # a size of its own: a delivery of its own
    b.ring_send(0, 1, reused.addr, t)
    b.barrier()
    b.store_tile(1, kept, y1)
    b.store_tile(1, reused, y2)
    b.sfu(1, "exp", reused, reused)
    b.store_tile(1, reused, y3)
    exe = b.load()
    first, second = exe(), exe()
    wr = dlf16_round(w)
    assert np.array_equal(first[0], wr[:4]) and np.array_equal(first[1], wr)
    assert np.array_equal(first[2], dlf16_round(np.exp(wr)))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    # The load and the delivery into `kept` once, the delivery into `reused` at every call.
    assert sorted(s.always for s in exe.machine._lasting) == [False, False, True]


def test_constants_only_decoded_once_are_written_at_the_first_call_only(targets):
    """A weight tile that only matmuls read is decoded at the first call and kept (Frozen), so its load, and its
    delivery to the other core, run at the first call only, even though the program writes other bytes over the
    tile afterwards. A tile a store reads (``kept``, every call) is loaded at every call, and so is one whose
    delivery a store reads on the other core (``sent``, delivered at every call as bytes are written over it
    too): a send reads its bytes as its delivery is read. The outputs are the same at every call."""
    rng = _rng(14)
    x_val = rng.standard_normal((8, 64)).astype(np.float32)
    w_val = rng.standard_normal((64, 64)).astype(np.float32)
    b = ProgramBuilder(targets[2])
    x, w = b.input("x", (8, 64)), b.constant("w", w_val, "dlf16")
    y, z, kept = b.output("y", (2, 8, 64), "fp32"), b.output("z", (2, 64, 64)), b.output("kept", (64, 64))
    sent = b.output("sent", (32, 64))
    W = [b.alloc(c, 64, 64) for c in range(2)]
    X = [b.alloc(c, 8, 64) for c in range(2)]
    C = [b.alloc(c, 8, 64, "fp32") for c in range(2)]
    K, V, V1 = b.alloc(0, 64, 64), b.alloc(0, 32, 64), b.alloc(1, 32, 64)      # V: a delivery of its own size
    b.load_tile(0, W[0], w)
    b.load_tile(0, K, w)
    b.load_tile(0, V, w)
    b.ring_send(0, 1, W[1].addr, W[0])
    b.ring_send(0, 1, V1.addr, V)
    b.barrier()
    b.store_tile(1, V1, sent)
    b.sfu(0, "fill", V, imm=4.0)
    b.sfu(1, "fill", V1, imm=5.0)
    for c in range(2):
        b.load_tile(c, X[c], x)
        b.matmul(c, X[c], W[c], C[c])
        b.store_tile(c, C[c], y, index=(c,))
        b.sfu(c, "fill", W[c], imm=float(c + 1))         # other bytes over the weight tile
        b.store_tile(c, W[c], z, index=(c,))
    b.store_tile(0, K, kept)
    b.sfu(0, "fill", K, imm=3.0)
    exe = b.load()
    wr = dlf16_round(w_val)
    for _ in range(3):
        y_out, z_out, kept_out, sent_out = exe(x_val)
        assert np.array_equal(y_out, np.stack([dlf16_round(x_val) @ wr] * 2))
        assert np.array_equal(z_out, np.stack([np.full((64, 64), 1.0), np.full((64, 64), 2.0)]))
        assert np.array_equal(kept_out, wr) and np.array_equal(sent_out, wr[:32])
    # The weight's load and delivery once; the loads of `kept` and `sent` and the delivery of `sent` at every call.
    assert sorted(s.always for s in exe.machine._lasting) == [False, False, True, True, True]


def test_a_delivery_no_step_reads_is_left_out(targets):
    """Core 0 multicasts its A tile to cores 1..3, and all four multiply it: the plan reads core 0's copy once
    for all of them (equal bytes), so the copies to cores 1 and 3 are never read and are left out. Core 2 also
    negates its copy, a step of its own that reads it, so that copy is delivered; core 3's tile is then loaded
    over, and its dead copy stays out. Every output is what the program computes with every copy delivered."""
    rng = _rng(13)
    a_val = rng.standard_normal((8, 64)).astype(np.float32)
    w_val = rng.standard_normal((4, 64, 64)).astype(np.float32)
    b = ProgramBuilder(targets[4])
    a, w = b.input("a", (8, 64)), b.input("w", (4, 64, 64))
    y, z, r = b.output("y", (4, 8, 64), "fp32"), b.output("z", (8, 64)), b.output("r", (8, 64))
    A = [b.alloc(c, 8, 64) for c in range(4)]
    W = [b.alloc(c, 64, 64) for c in range(4)]
    C = [b.alloc(c, 8, 64, "fp32") for c in range(4)]
    b.load_tile(0, A[0], a)
    b.ring_send(0, [1, 2, 3], A[0].addr, A[0])
    b.barrier()
    for c in range(4):
        b.load_tile(c, W[c], w, index=(c,))
        b.matmul(c, A[c], W[c], C[c])
        b.store_tile(c, C[c], y, index=(c,))
    b.sfu(2, "neg", A[2], A[2])
    b.store_tile(2, A[2], z)
    b.load_tile(3, A[3], a)
    b.sfu(3, "exp", A[3], A[3])
    b.store_tile(3, A[3], r)
    exe = b.load()
    ar = dlf16_round(a_val)
    for _ in range(2):
        y_out, z_out, r_out = exe(a_val, w_val)
        assert np.array_equal(y_out, np.stack([ar @ dlf16_round(w_val[c]) for c in range(4)]))
        assert np.array_equal(z_out, -ar)
        assert np.array_equal(r_out, dlf16_round(np.exp(ar)))
    stride = exe.machine.stride
    landed = {dst // stride for (_, _, dsts, _) in exe.machine._deliveries for dst in dsts}
    assert landed == {2}


def test_softmax(targets):
    """fp32 inside, one rounding of the input and one of the output. With dx_i <= U |x_i|,
    |d softmax_i| <= s_i (|dx_i| + sum_j s_j |dx_j|) <= 2 U max|x| s_i, plus U s_i for the output."""
    rng = _rng(6)
    x = (3 * rng.standard_normal((64, 300))).astype(np.float32)
    (y,) = build_softmax(targets[4], 64, 300, tile_rows=8).load()(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    bound = ref * (2 * U * np.abs(x).max(axis=1, keepdims=True) + U) + 1e-6
    assert np.all(np.abs(y - ref) <= bound)
    assert np.allclose(y.sum(axis=1), 1, atol=64 * U)
    (yr,) = build_softmax(targets[4], 64, 300, tile_rows=8).load(numerics="fp32-reference")(x)
    assert np.allclose(yr, ref, rtol=REF_RTOL, atol=1e-7)


def test_layernorm_and_rmsnorm(targets):
    """z = (x - mu)/sigma in fp32 from inputs rounded once (|dx| <= U X, X = max|x| of the row):
    |dmu| <= U X and |dsigma| <= 2 U X, so |dz| <= 2 U X (1 + |z|) / sigma; the output adds U |y|."""
    rng = _rng(7)
    R, C = 32, 256
    x = (rng.standard_normal((R, C)) * 2 + 1).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, C).astype(np.float32)
    beta = rng.standard_normal(C).astype(np.float32)
    g, be = dlf16_round(gamma), dlf16_round(beta)            # the constants the program holds
    X = np.abs(x).max(axis=1, keepdims=True)

    (y,) = build_layernorm(targets[2], R, C, gamma, beta).load()(x)
    mu, sd = x.mean(axis=1, keepdims=True), np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    z = (x - mu) / sd
    ref = z * g + be
    bound = np.abs(g) * 2 * U * X * (1 + np.abs(z)) / sd + U * np.abs(ref) + 1e-6
    assert np.all(np.abs(y - ref) <= bound)
    (yr,) = build_layernorm(targets[2], R, C, gamma, beta).load(numerics="fp32-reference")(x)
    assert np.allclose(yr, ref, rtol=REF_RTOL, atol=1e-5)

    (y,) = build_rmsnorm(targets[2], R, C, gamma).load()(x)
    rms = np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6)
    ref = x / rms * g
    # d(x/rms) <= U X / rms + |x/rms| * U (rms moves by at most U relative)
    bound = np.abs(g) * (U * X / rms + U * np.abs(x) / rms) + U * np.abs(ref) + 1e-6
    assert np.all(np.abs(y - ref) <= bound)


_UNARY_REF = {
    "neg": lambda x: -x, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "recip": lambda x: 1 / x, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "gelu_erf": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
}
_POSITIVE = {"log", "sqrt", "rsqrt", "recip"}


def _sfu_case(target, build, inputs, shape, numerics="fp32-reference"):
    b = ProgramBuilder(target)
    bufs = {n: b.input(n, v.shape, "fp32") for n, v in inputs.items()}
    y = b.output("y", shape, "fp32")
    tiles = {n: b.alloc(0, *v.shape, "fp32") for n, v in inputs.items()}
    for n in inputs:
        b.load_tile(0, tiles[n], bufs[n])
    D = b.alloc(0, *shape, "fp32")
    build(b, D, tiles)
    b.store_tile(0, D, y)
    return b.load(numerics=numerics)(**inputs)[0]


@pytest.mark.parametrize("fn", sorted(_UNARY_REF))
def test_sfu_unary_functions(targets, fn):
    rng = _rng(8)
    x = rng.uniform(0.1, 4, (8, 64)) if fn in _POSITIVE else rng.uniform(-6, 6, (8, 64))
    x = x.astype(np.float32)
    y = _sfu_case(targets[1], lambda b, D, t: b.sfu(0, fn, D, t["x"]), {"x": x}, x.shape)
    ref = _UNARY_REF[fn](x.astype(np.float64))
    assert np.allclose(y, ref, rtol=REF_RTOL, atol=1e-7), np.max(np.abs(y - ref))


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
          "min": np.minimum, "pow": np.power, "lt": np.less, "ge": np.greater_equal, "eq": np.equal}


@pytest.mark.parametrize("fn", sorted(BINARY))
@pytest.mark.parametrize("bshape", [(8, 64), (8, 1), (1, 64), (1, 1), "imm"])
def test_sfu_binary_broadcasts(targets, fn, bshape):
    rng = _rng(9)
    x = rng.uniform(0.5, 2, (8, 64)).astype(np.float32)
    ins = {"x": x}
    if bshape == "imm":
        other = np.float32(1.25)
        build = lambda b, D, t: b.sfu(0, fn, D, t["x"], 1.25)       # noqa: E731
    else:
        other = np.round(rng.uniform(0.5, 2, bshape), 1).astype(np.float32)
        ins["o"] = other
        build = lambda b, D, t: b.sfu(0, fn, D, t["x"], t["o"])     # noqa: E731
    y = _sfu_case(targets[1], build, ins, x.shape, numerics="faithful")
    ref = BINARY[fn](x, other).astype(np.float32)
    assert np.array_equal(y, ref)           # fp32 destination: exactly numpy's fp32 op
    if bshape == "imm" and fn in ("sub", "div"):
        ys = _sfu_case(targets[1], lambda b, D, t: b.sfu(0, fn, D, t["x"], 1.25, swap=True), ins, x.shape,
                       numerics="faithful")
        assert np.array_equal(ys, BINARY[fn](other, x).astype(np.float32))


def test_sfu_cast_fill_pows_select_and_reductions(targets):
    rng = _rng(10)
    x = rng.standard_normal((16, 64)).astype(np.float32)

    def build(b, D, t):
        Q, M, K = b.alloc(0, 16, 64, "int8"), b.alloc(0, 16, 64, "fp32"), b.alloc(0, 16, 1, "fp32")
        b.sfu(0, "cast", Q, t["x"], imm=20.0)              # quantize: int8 = rint(x * 20), saturating
        b.sfu(0, "cast", D, Q, imm=0.05)                   # dequantize
        b.sfu(0, "gt", M, t["x"], 0.0)
        b.sfu(0, "select", M, M, D, imm=-1.0)              # where(x > 0, dequant, -1)
        b.sfu(0, "pows", D, t["x"], imm=2.0)
        b.reduce(0, "sum", K, D)
        b.sfu(0, "fill", D, imm=3.0)
        b.sfu(0, "add", D, D, K)                           # per-row broadcast
        b.sfu(0, "mul", D, D, M)
    y = _sfu_case(targets[1], build, {"x": x}, x.shape, numerics="faithful")
    q = np.clip(np.rint(x * np.float32(20)), -128, 127) * np.float32(0.05)
    sel = np.where(x > 0, q, -1).astype(np.float32)
    ref = (3 + (x * x).sum(axis=1, keepdims=True, dtype=np.float32)) * sel
    assert np.allclose(y, ref, rtol=1e-6)
    for fn, npf in (("max", np.max), ("min", np.min), ("mean", np.mean)):
        r = _sfu_case(targets[1], lambda b, D, t: b.reduce(0, fn, D, t["x"]), {"x": x}, (16, 1))
        assert np.allclose(r, npf(x, axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------
# ring, host ops, inputs, modes
# ---------------------------------------------------------------------------------------------------------


def test_ring_send_between_cores(targets):
    b = ProgramBuilder(targets[2])
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T0, T1 = b.alloc(0, 8, 64), b.alloc(1, 8, 64)
    b.load_tile(0, T0, x)
    b.sfu(0, "mul", T0, T0, 2.0)
    b.ring_send(0, 1, T1.addr, T0)
    b.barrier()
    b.sfu(1, "add", T1, T1, 1.0)
    b.store_tile(1, T1, y)
    x_val = _rng(11).standard_normal((8, 64)).astype(np.float32)
    (out,) = b.load()(x_val)
    assert np.array_equal(out, dlf16_round(dlf16_round(2 * dlf16_round(x_val)) + 1))


def test_ring_sends_deliver_the_bytes_they_read(targets):
    """A send reads its bytes when it issues and they land at the barrier: two cores swapping tiles at one address
    (each lands where the other's send read), and a core writing its tile again after sending it, deliver the
    values at the send, whether the emulator stages the bytes or copies them straight at the barrier."""
    b = ProgramBuilder(targets[4])
    x, y = b.input("x", (2, 8, 64)), b.output("y", (3, 8, 64))
    T = [b.alloc(c, 8, 64) for c in range(3)]
    assert T[0].addr == T[1].addr
    for c in (0, 1):
        b.load_tile(c, T[c], x, index=(c,))
    b.ring_send(0, 1, T[1].addr, T[0])
    b.ring_send(1, 0, T[0].addr, T[1])
    b.barrier()
    b.ring_send(1, 2, T[2].addr, T[1])
    b.sfu(1, "mul", T[1], T[1], 3.0)             # after its send: it carries x[0], not 3 x[0]
    b.barrier()
    for c in (0, 1, 2):
        b.store_tile(c, T[c], y, index=(c,))
    x_val = dlf16_round(_rng(12).standard_normal((2, 8, 64)).astype(np.float32))
    (out,) = b.load()(x_val)
    assert np.array_equal(out[0], x_val[1]) and np.array_equal(out[2], x_val[0])
    assert np.array_equal(out[1], dlf16_round(3 * x_val[0]))


def _send_program(target, multicast: bool):
    """Core 0 scales a tile and sends it to cores 1..3 (one multicast, or three sends); each adds its index."""
    b = ProgramBuilder(target)
    x, y = b.input("x", (8, 64)), b.output("y", (3, 8, 64))
    T = [b.alloc(c, 8, 64) for c in range(4)]
    b.load_tile(0, T[0], x)
    b.sfu(0, "mul", T[0], T[0], 2.0)
    for to in ([[1, 2, 3]] if multicast else [1, 2, 3]):
        b.ring_send(0, to, T[1].addr, T[0])
    b.barrier()
    for c in (1, 2, 3):
        b.sfu(c, "add", T[c], T[c], float(c))
        b.store_tile(c, T[c], y, index=(c - 1,))
    return b


def test_ring_multicast_is_the_sends_it_replaces(targets):
    """One RING_SEND with a destination mask delivers to every core of it: the outputs and the ring bytes are
    those of one send per destination, in one instruction instead of three. Its copies go back to back, so the
    modeled time is their bytes plus the travel to the farthest core (2 hops on a ring of 4), where three sends
    pay each one's (1 + 2 + 1 hops)."""
    x_val = _rng(13).standard_normal((8, 64)).astype(np.float32)
    runs = {}
    for multicast in (True, False):
        b = _send_program(targets[4], multicast)
        exe = b.load()
        runs[multicast] = (exe(x_val)[0], exe.profile, len(exe.program.code[0]))
    (out, prof, n), (out1, prof1, n1) = runs[True], runs[False]
    two_x = dlf16_round(2 * dlf16_round(x_val))
    for c in (1, 2, 3):
        assert np.array_equal(out[c - 1], dlf16_round(two_x + c))
    assert np.array_equal(out, out1)
    hop = targets[4].hop_latency_cycles
    assert prof.cycles == prof1.cycles - (1 + 2 + 1 - 2) * hop
    assert prof.ring_bytes == prof1.ring_bytes == 3 * 8 * 128
    assert n == n1 - 2


def test_batched_cores_compute_what_the_schedule_order_computes(targets):
    """The plan runs the same instruction of several cores as one operation; where the cores' order matters
    (ring sends landing on the same bytes) it must still compute what cores run in index order compute, and
    cores using different tile addresses for the same operation batch too. (Cores touching the same device
    bytes in one segment never reach the emulator: the loader refuses them, test_binary.py.)"""
    b = ProgramBuilder(targets[4])
    x = b.input("x", (4, 8, 64))
    z, w = b.output("z", (8, 64)), b.output("w", (4, 8, 64))
    T = [b.alloc(c, 8, 64) for c in range(4)]
    # Cores 1..3 send to the same bytes of core 0 (core 2 half as many, so it batches apart from 1 and 3):
    # they land in issue order, core 3's last.
    for c in (1, 2, 3):
        b.load_tile(c, T[c], x, index=(c,))
        b.ring_send(c, 0, T[0].addr, T[c], nbytes=T[c].nbytes // 2 if c == 2 else None)
    b.barrier()
    b.store_tile(0, T[0], z)
    # Cores 0 and 1 hold equal bytes only if core 1's send had landed last: an exact op computed once for both
    # (equal bytes on every core) would give core 1 core 3's values.
    u = b.output("u", (2, 8, 64))
    for c in (0, 1):
        b.sfu(c, "neg", T[c], T[c])
        b.store_tile(c, T[c], u, index=(c,))
    b.barrier()
    # The same op on every core, core 2's tile at another address.
    U2 = b.alloc(2, 8, 64)
    for c in range(4):
        t = U2 if c == 2 else T[c]
        b.load_tile(c, t, x, index=(c,))
        b.sfu(c, "exp", t, t)
        b.store_tile(c, t, w, index=(c,))
    x_val = _rng(12).standard_normal((4, 8, 64)).astype(np.float32)
    exe = b.load()
    for _ in range(2):                 # the second call runs what the first one cached
        z_out, w_out, u_out = exe(x_val)
        assert np.array_equal(z_out, dlf16_round(x_val[3]))
        assert np.array_equal(u_out, -dlf16_round(x_val[[3, 1]]))
        assert np.array_equal(w_out, dlf16_round(np.exp(dlf16_round(x_val))))


def test_host_ops_gather_copy_call(targets):
    @register_host_function("test_scale_rows")
    def _scale(a, factor=1.0):
        return a * factor

    rng = _rng(12)
    table = rng.standard_normal((50, 64)).astype(np.float32)
    b = ProgramBuilder(targets[2])
    ids = b.input("ids", (2, 5), "int32")
    emb = b.constant("emb", table, "fp32")
    g = b.scratch("g", (2, 5, 64), "fp32")
    t = b.scratch("t", (64, 10), "fp32")
    y, z = b.output("y", (64, 10), "fp32"), b.output("z", (64, 10), "fp32")
    b.host(0, "gather", [emb, ids], [g])
    b.host(0, "copy", [g], [t], shape=[10, 64], perm=[1, 0])
    b.host(0, "call", [t], [y], fn="test_scale_rows", kwargs={"factor": 2.0})
    b.barrier()
    T = b.alloc(1, 64, 10, "fp32")
    b.load_tile(1, T, y)
    b.sfu(1, "neg", T, T)
    b.store_tile(1, T, z)
    idx = rng.integers(0, 50, (2, 5)).astype(np.int32)
    out_y, out_z = b.load()(idx)
    ref = 2 * table[idx].reshape(10, 64).T
    assert np.array_equal(out_y, ref) and np.array_equal(out_z, -ref)
    with pytest.raises(Exception, match="gather index out of range"):
        b.load()(np.full((2, 5), 50, np.int32))


def test_inputs_by_name_torch_and_errors(targets):
    exe = _chain_program(targets[1], R=8, C=64).load()
    rng = _rng(13)
    x, w = (rng.standard_normal((8, 64)).astype(np.float32) for _ in range(2))
    (a,) = exe(x, w)
    (b_,) = exe(w=w, x=x)
    assert np.array_equal(a, b_)
    (c,) = exe(x * 0, w)                  # a second call with new data: nothing stale
    assert not np.array_equal(a, c)
    torch = pytest.importorskip("torch")
    (d,) = exe(torch.from_numpy(x), torch.from_numpy(w).to(torch.bfloat16))
    (e,) = exe(x, torch.from_numpy(w).to(torch.bfloat16).float().numpy())
    assert np.array_equal(d, e)
    with pytest.raises(InputError, match="missing input 'w'"):
        exe(x)
    with pytest.raises(InputError, match="shape"):
        exe(x[:4], w)
    with pytest.raises(InputError, match="unknown input 'q'"):
        exe(x, w, q=x)


def test_runs_use_one_blas_thread_and_give_the_caller_its_threads_back(targets, monkeypatch):
    """numpy's BLAS runs on one thread while the emulator runs (its products are a tile per core), and the
    caller's thread count is back after the run and after a run that failed; a context inside a run keeps
    the one thread. So for a run from another thread than the one that set the count first."""
    import os
    import threading

    import spyre_mlir.runtime.emulator as E
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: BLAS runs one thread anyway")

    def threads():
        return {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    seen, product, fail = [], E.pt_product, []

    def spy(a, b):
        seen.append(threads())
        if fail:
            raise RuntimeError("boom")
        with E.one_blas_thread():             # nested: one thread inside it and after it
            pass
        seen.append(threads())
        return product(a, b)

    monkeypatch.setattr(E, "pt_product", spy)
    exe = build_matmul(targets[4], 64, 256, 128, grid=(2, 2)).load()
    x, w = (_rng(5).standard_normal(s).astype(np.float32) for s in ((64, 128), (128, 256)))
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = threads()
        assert before and set(before.values()) == {2}
        exe(x, w)
        assert seen and all(set(s.values()) == {1} for s in seen)
        assert threads() == before
        # A run from another thread too (threadpoolctl's own setter leaves OpenBLAS to the thread that set it first).
        seen.clear()
        t = threading.Thread(target=exe, args=(x, w))
        t.start()
        t.join()
        assert seen and all(set(s.values()) == {1} for s in seen)
        assert threads() == before
        fail.append(True)
        with pytest.raises(SpyreRuntimeError, match="boom"):
            exe(x, w)
        assert threads() == before


def _run_in_a_fork(exe, args, want) -> int:
    """Run ``exe(*args)`` in a forked child: its exit code, 0 when the first output equals ``want``, -SIGALRM when
    it hung (a hang fails the test, not the suite)."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            signal.alarm(30)
            code = 0 if np.array_equal(exe(*args)[0], want) else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_fork_runs_steps_on_two_threads(targets, monkeypatch):
    """A fork of this process (a data loader's worker) that runs a program with steps on two threads gets the
    results this process gets. It has a copy of the thread pool but not its thread: the step it handed over
    waited forever."""
    import spyre_mlir.runtime.emulator as E

    monkeypatch.setenv("SPYRE_EMU_WORKERS", "0")
    monkeypatch.setattr(E, "_SPLIT_WORK", 0)
    exe = build_matmul(targets[4], 64, 256, 128, grid=(2, 2)).load()
    assert any(isinstance(s, E.Parallel) for s in exe._plan)
    x, w = (_rng(6).standard_normal(s).astype(np.float32) for s in ((64, 128), (128, 256)))
    (want,) = exe(x, w)
    assert _run_in_a_fork(exe, (x, w), want) == 0
    assert np.array_equal(exe(x, w)[0], want)


def test_runs_from_several_threads_take_turns(targets, in_threads):
    """Threads calling one executable (a server's request threads) each get their own inputs' outputs: a run
    writes its inputs, runs and reads its outputs in the machine's memories, so runs take turns. So do the
    entries of a bundle, which share their device memory."""
    exe = build_matmul(targets[4], 128, 256, 256, grid=(2, 2), tile_k=64).load()
    rng = _rng(7)
    inputs = [(rng.standard_normal((128, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32))
              for _ in range(4)]
    want = [exe(*xw)[0] for xw in inputs]
    wrong = []

    def calls(k):
        for _ in range(25):
            wrong.append(not np.array_equal(exe(*inputs[k])[0], want[k]))
    assert not in_threads(calls, [(k,) for k in range(4)])
    assert len(wrong) == 100 and not any(wrong)


def test_a_fork_made_while_another_thread_runs_can_run(targets):
    """A fork made while another thread of this process is inside a run (holding the run's turn) runs the
    executable: the thread is not in the child, so the child does not wait for it."""
    import threading

    exe = build_matmul(targets[4], 64, 256, 128, grid=(2, 2)).load()
    x, w = (_rng(8).standard_normal(s).astype(np.float32) for s in ((64, 128), (128, 256)))
    (want,) = exe(x, w)
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with exe.lock:
            inside.set()
            leave.wait()
    t = threading.Thread(target=hold)
    t.start()
    inside.wait()
    try:
        code = _run_in_a_fork(exe, (x, w), want)
    finally:
        leave.set()
        t.join()
    assert code == 0


def test_runtime_does_not_import_torch(tmp_path, targets):
    path = tmp_path / "chain.spyre"
    _chain_program(targets[1], R=8, C=64).write(path)
    # torch-mlir is optional at run time: its JIT compiles the native DLFloat16 conversions when it is there;
    # without it the emulator converts with numpy, to the same bits. (Whatever this process was told: the
    # children choose by what they can import.)
    import os

    env = {k: v for k, v in os.environ.items() if k != "SPYRE_EMU_NATIVE"}
    outs = []
    for block in ("", "sys.modules['torch_mlir'] = None\n"):
        code = (f"import sys, numpy as np\n{block}from spyre_mlir.runtime import load, native\n"
                f"exe = load({str(path)!r})\n"
                "x = np.linspace(-3, 3, 8 * 64, dtype=np.float32).reshape(8, 64)\n"
                "(y,) = exe(x, x[::-1].copy())\n"
                "import spyre_mlir.tools.run\n"
                "print('torch' in sys.modules, native.available(), y.tobytes().hex())")
        outs.append(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                   check=True).stdout.split())
    assert [o[:2] for o in outs] == [["False", "True"], ["False", "False"]]
    assert outs[0][2] == outs[1][2]


# ---------------------------------------------------------------------------------------------------------
# cycle model, profile, trace
# ---------------------------------------------------------------------------------------------------------


def test_cycle_model_overlap_and_roofline(targets):
    t = targets[1]
    single = build_matmul(t, 128, 128, 1024, tile_k=128, double_buffer=False).load().static_profile
    double = build_matmul(t, 128, 128, 1024, tile_k=128, double_buffer=True).load().static_profile
    assert double.cycles < single.cycles              # the next tiles load while the PT array works
    assert single.busy == double.busy                 # same work, only the overlap differs
    p = double
    assert p.dram_read_bytes == (128 * 1024 + 1024 * 128) * 2 and p.dram_write_bytes == 128 * 128 * 2
    assert p.pt_macs == 128 * 128 * 1024
    pt_cycles = p.busy[0][1]
    assert pt_cycles >= p.pt_padded_macs / t.macs_per_cycle("dlf16")
    assert all(0 <= u <= 1 for u in p.utilization.values())
    assert p.bound in ("compute", "memory") and p.intensity == pytest.approx(p.flops / (p.dram_read_bytes +
                                                                                          p.dram_write_bytes))
    # Less DRAM bandwidth per core when 32 cores stream at once: 32x the work does not take 1x the time.
    p32 = build_matmul(targets[32], 128 * 32, 128, 1024, tile_k=128).load().static_profile
    assert p32.cycles > p.cycles * 4


def test_cli_end_to_end(tmp_path, targets, capsys):
    model = tmp_path / "mm.spyre"
    build_matmul(targets[2], 64, 128, 128, grid=(1, 2)).write(model)
    rng = _rng(14)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    np.savez(tmp_path / "in.npz", w=w, x=x)                       # by name, in another order
    out, trace = tmp_path / "out.npz", tmp_path / "trace.json"
    assert spyre_run([str(model), "--inputs", str(tmp_path / "in.npz"), "-o", str(out), "--profile",
                      "--trace", str(trace)]) == 0
    printed = capsys.readouterr().out
    assert "modeled latency" in printed and "roofline bound" in printed
    (ref,) = load(model)(x, w)
    with np.load(out) as npz:
        assert npz.files == ["output_0"] and np.array_equal(npz["output_0"], ref)
    doc = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"core 0", "core 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert (1, "PT") in threads and (0, "DMA") in threads
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1} and all(e["dur"] > 0 for e in spans)

    np.savez(tmp_path / "pos.npz", x, w)                          # arr_0, arr_1: by order
    assert spyre_run([str(model), "-i", str(tmp_path / "pos.npz"), "--json",
                      "--numerics", "fp32-reference"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outputs"][0]["shape"] == [64, 128] and doc["profile"]["cycles"] > 0
    assert doc["profile"]["bound"] in ("compute", "memory")


@pytest.mark.parametrize("args,code,msg", [
    (["{model}"], 1, "missing input 'x'"),
    (["{model}", "-i", "{bad_shape}"], 1, "input 'x': shape (3, 3)"),
    (["{garbage}", "-i", "{bad_shape}"], 1, "bad magic"),
    (["{missing}"], 1, "No such file"),
    (["{model}", "--numerics", "fast"], 2, "invalid choice"),
    ([], 2, "required"),
])
def test_cli_errors_are_one_line(tmp_path, targets, capsys, args, code, msg):
    model = tmp_path / "mm.spyre"
    build_matmul(targets[1], 8, 64, 64).write(model)
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 3)), w=np.zeros((64, 64)))
    (tmp_path / "garbage.spyre").write_bytes(b"not a spyre file at all" * 10)
    paths = dict(model=model, bad_shape=tmp_path / "bad.npz", garbage=tmp_path / "garbage.spyre",
                 missing=tmp_path / "nope.spyre")
    assert spyre_run([a.format(**paths) for a in args]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("spyre-run: error: ") and msg in err[-1]
    assert "Traceback" not in "\n".join(err)
    if code == 1:
        assert len(err) == 1


def test_int4_weights_with_column_scales(targets):
    """Weight-only int4: packed codes in a constant, dequantized on write-back by per-column scales."""
    from spyre_mlir.runtime.formats import pack_int4, quantize_int, symmetric_scale
    rng = _rng(15)
    M, N, K = 8, 256, 128
    w = rng.standard_normal((K, N)).astype(np.float32)
    scale = symmetric_scale(w, 4, axis=1)
    codes = quantize_int(w, 4, scale, axis=1)
    b = ProgramBuilder(targets[1])
    x_buf = b.input("x", (M, K), "dlf16")
    w_buf = b.constant("w", pack_int4(codes), "int4", encoded=True)
    s_buf = b.constant("s", scale.reshape(1, N), "fp32")
    y_buf = b.output("y", (M, N), "fp32")
    X, W, S = b.alloc(0, M, K), b.alloc(0, K, N, "int4"), b.alloc(0, 1, N, "fp32")
    C, Y = b.alloc(0, M, N, "fp32"), b.alloc(0, M, N, "fp32")
    for t, buf in ((X, x_buf), (W, w_buf), (S, s_buf)):
        b.load_tile(0, t, buf)
    b.matmul(0, X, W, C, out=Y, col_scale=S)
    b.store_tile(0, Y, y_buf)
    x = rng.standard_normal((M, K)).astype(np.float32)
    (y,) = b.load()(x)
    xr = dlf16_round(x).astype(np.float64)
    ref = (xr @ codes.astype(np.float64)) * scale
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.abs(y - x @ w).max() < 0.25 * np.abs(x @ w).max()     # and int4 is a (coarse) approximation


def test_cli_disassemble(tmp_path, targets, capsys):
    model = tmp_path / "sm.spyre"
    build_softmax(targets[1], 8, 96).write(model)
    assert spyre_run([str(model), "--disassemble"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"// {model}" and out[1].startswith("// program: ")
    assert out[2].startswith("// buffer x: input dlf16[8, 96] @ 0 (")
    assert any(line.startswith("core 0: ") for line in out)
    assert any(line.split()[1:5] == ["reduce", "fn=max", "m=8", "n=96"] and "// kernels.py:" in line for line in out)
    code = load(model).program.code
    assert out[-1].split() == [f"{len(code) - 1}:{len(code[-1]) - 1}", "end"]


def test_dram_sharing_counts_overlapping_transfers():
    """Bandwidth is split among transfers that overlap in time (time-averaged, the transfer included)."""
    from spyre_mlir.runtime.cycles import _mean_concurrency
    conc = _mean_concurrency(np.array([0.0, 0.0, 5.0, 20.0]), np.array([10.0, 10.0, 15.0, 30.0]))
    assert conc.tolist() == [2.5, 2.5, 2.0, 1.0]


def test_covered_fraction_of_each_transfer():
    """The part of each interval during which any of the others is active (their union, not their sum)."""
    from spyre_mlir.runtime.cycles import _covered
    others = np.array([2.0, 4.0, 12.0, 25.0]), np.array([6.0, 5.0, 14.0, 40.0])
    f = _covered(np.array([0.0, 5.0, 20.0, 3.0, 7.0]), np.array([10.0, 15.0, 30.0, 3.0, 8.0]), *others)
    assert f.tolist() == [0.4, 0.3, 0.5, 0.0, 0.0]
    assert _covered(np.array([0.0]), np.array([1.0]), np.array([]), np.array([])).tolist() == [0.0]


def test_mixed_bandwidth_only_while_reads_and_writes_overlap(targets):
    """A store and a load of one segment cost each other the mixed bandwidth only while both are in flight:
    one after the other on a core's in-order DMA unit, each moves at its own direction's bandwidth; on two
    cores at once, both at the mixed one."""
    t = targets[2]
    rows, cols = 64, 512
    per_cycle = 1.0 / t.clock_ghz

    def profile(store_core, load_core):
        b = ProgramBuilder(t)
        x, y = b.input("x", (rows, cols)), b.output("y", (rows, cols))
        s_tile, l_tile = b.alloc(store_core, rows, cols), b.alloc(load_core, rows, cols)
        b.sfu(store_core, "fill", s_tile, imm=1.0)
        b.store_tile(store_core, s_tile, y)
        b.load_tile(load_core, l_tile, x)
        return b.load().static_profile

    nbytes = rows * cols * 2
    alone = nbytes / (t.dram_write_gbps * per_cycle) + t.dma_latency_cycles
    one_core = {e.name: e.end - e.start for e in profile(0, 0).events if e.unit == "DMA"}
    assert one_core["dma_store"] == pytest.approx(alone)
    assert one_core["dma_load"] == pytest.approx(nbytes / (t.dram_read_gbps * per_cycle) + t.dma_latency_cycles)
    two = [e for e in profile(0, 1).events if e.unit == "DMA"]
    assert len(two) == 2 and all(e.end - e.start > alone for e in two)        # shared, and mixed


@pytest.mark.parametrize("fmt", ["dlf16", "fp32", "fp8_e4m3", "int8", "int4", "int32", "bool"])
@pytest.mark.parametrize("shape", [(3, 5, 70), (2, 33, 130), (64, 64)])
def test_restick_transposes_bits(targets, fmt, shape):
    """RESTICK moves element codes: the stored bits of y are those of x transposed (last two dims), with the
    destination's padding zero, and in fp32-reference mode the exact (unrounded) values travel along."""
    t = targets[2]
    b = ProgramBuilder(t)
    x = b.input("x", shape, fmt)
    s = b.scratch("s", shape, fmt)
    y = b.output("y", shape[:-2] + (shape[-1], shape[-2]), fmt)
    T = b.alloc(0, math.prod(shape[:-1]), shape[-1], fmt)
    # x -> scratchpad -> (an SFU op that keeps exact values in the shadow for float formats) -> s -> RESTICK
    b.dma_load(0, x.addr, T.addr, (T.rows, T.pitch), (0, x.pitch), (0, T.pitch))
    floats = fmt in ("dlf16", "fp32", "fp8_e4m3")
    if floats:
        b.sfu(0, "mul", T, T, 1.0 / 3.0)
    b.dma_store(0, s.addr, T.addr, (T.rows, T.pitch), (0, s.pitch), (0, T.pitch))
    b.barrier()
    b.restick(1, s, y)
    rng = _rng(3)
    if fmt == "bool":
        a = rng.integers(0, 2, shape).astype(bool)
    elif not floats:
        lo, hi = {"int8": (-128, 128), "int4": (-8, 8), "int32": (-2**31, 2**31)}[fmt]
        a = rng.integers(lo, hi, shape)
    else:
        a = rng.standard_normal(shape).astype(np.float32) * 100
    exe = b.load()
    (out,) = exe(a)
    third = np.float32(1.0 / 3.0)
    scaled = decode(fmt, encode(fmt, a), shape[-1]) * third if floats else a     # what the SFU computes
    want = np.swapaxes(decode(fmt, encode(fmt, scaled), shape[-1]) if floats else scaled, -1, -2)
    assert np.array_equal(out, want)
    # Bit level: y's device image holds s's element codes transposed, in the canonical layout (padding zero).
    dev = exe.device.bytes
    simg = dev[s.addr:s.addr + s.nbytes].reshape(-1, s.pitch)
    yimg = dev[y.addr:y.addr + y.nbytes].reshape(-1, y.pitch)
    srb, yrb = s.fmt.nbytes(shape[-1]), y.fmt.nbytes(shape[-2])
    assert not yimg[:, yrb:].any()
    if fmt != "int4":
        dt = np.dtype(f"u{max(1, s.fmt.bits // 8)}")
        sc = np.ascontiguousarray(simg[:, :srb]).view(dt).reshape(shape)
        yc = np.ascontiguousarray(yimg[:, :yrb]).view(dt).reshape(y.shape)
        assert np.array_equal(yc, np.swapaxes(sc, -1, -2))
    # fp32-reference: the shadow carries the exact values through the restick.
    (ref,) = b.load(numerics="fp32-reference")(a)
    exact = np.swapaxes(a.astype(np.float32) * third if floats else a, -1, -2)
    assert np.array_equal(np.asarray(ref, dtype=np.float64), np.asarray(exact, dtype=np.float64))


def test_cycle_model_batches_are_the_schedule_walked_instruction_by_instruction(targets):
    """The timeline advances the emulator's batches (one instruction on each of several cores) as one numpy
    operation, indexing runs of sticks by slices (cycles._work): every instruction's start and end are exactly
    those of walking the schedule one instruction at a time, as the model did before. For a compiled MLP with GELU
    and LayerNorm on 4 cores (instructions reading several runs of sticks, ring transfers, reductions), a
    double-buffered matmul on one core (a load into a buffer waits for the multiply still reading it) and a
    Linear on 32 cores (ring multicasts of the shared weight tiles, landing on several cores at each barrier)."""
    import torch

    import spyre_mlir
    from spyre_mlir.runtime import cycles
    from spyre_mlir.runtime.schedule import Sync

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                                torch.nn.LayerNorm(256)).eval()
    mlp = spyre_mlir.compile(model, (torch.randn(64, 256),), cores=4, cache_dir=False)
    assert any(np.any(np.diff(s.sp_reads) != 1) for s in mlp.steps if not isinstance(s, Sync))   # several runs
    wide = spyre_mlir.compile(torch.nn.Linear(512, 512, bias=False).eval(), (torch.randn(512, 512),), cores=32,
                              cache_dir=False)
    assert any(len(i.send[0]) > 1 for s in wide.steps if isinstance(s, Sync) for i in s.sends)      # multicasts
    waits = False
    for exe in (mlp, build_matmul(targets[1], 128, 128, 1024, tile_k=128, double_buffer=True).load(), wide):
        prog, t, steps = exe.program, exe.target, exe.steps
        dmas = [s for s in steps if not isinstance(s, Sync) and s.op in cycles._SHARED]
        per_cycle = 1.0 / t.clock_ghz
        work = cycles._work(steps, prog.num_cores, t, per_cycle, {id(s): j for j, s in enumerate(dmas)})
        # Any transfer durations will do: long ones (transfers wait for transfers), short ones (a load into a
        # buffer waits for the multiply still reading it).
        for transfers in (np.arange(1.0, len(dmas) + 1) * 37.5, np.full(len(dmas), 0.5)):
            events, free, _, _ = cycles._timeline(work, prog.num_cores, t, transfers)
            want, rfree, war = _walk(steps, prog.num_cores, t, per_cycle, dict(zip(map(id, dmas), transfers)))
            assert [(e.core, e.index, e.start, e.end) for e in events] == want
            assert np.array_equal(free, rfree)
            waits |= war
    assert waits                     # some write waited for a read


def test_cycle_model_indexes_equal_stick_arrays_by_slices_and_others_as_they_are():
    """cycles._sticks: instructions of a batch whose stick arrays are equal (one array, or a loop's trips, which
    decode to equal arrays of their own) index the per-stick times by a slice per run of sticks; arrays that
    differ are indexed as they are, a row a core."""
    from types import SimpleNamespace

    from spyre_mlir.runtime import cycles

    run = np.array([4, 5, 6, 9, 10])
    cores = np.array([0, 1, 2])
    for arrays in ([run] * 3, [run, run.copy(), run.copy()]):
        part = [SimpleNamespace(sp_reads=a) for a in arrays]
        assert cycles._sticks(part, cores, "sp_reads") == [(slice(0, 3), slice(4, 7)), (slice(0, 3), slice(9, 11))]
    differ = [run, run + 1, run]
    (rows, st), = cycles._sticks([SimpleNamespace(sp_reads=a) for a in differ], cores, "sp_reads")
    assert np.array_equal(rows, cores[:, None]) and np.array_equal(st, np.stack(differ))


def _walk(steps, C, t, per_cycle, dur):
    """The cycle model's timeline one instruction at a time in schedule order (``dur``: the DRAM transfers'
    durations by id): [(core, index, start, end)], the units' free times, and whether a write waited for a read."""
    from spyre_mlir.runtime import cycles
    from spyre_mlir.runtime.isa import ROOT_ALL, tile_pitch
    from spyre_mlir.runtime.schedule import Sync

    nst = -(-t.scratchpad_usable_bytes // 128)
    rfree = np.zeros((C, len(cycles.UNITS)))
    spw, spr, want, war = np.zeros((C, nst)), np.zeros((C, nst)), [], False
    for s in steps:
        if isinstance(s, Sync):
            at = rfree[list(s.members)].max() + t.barrier_latency_cycles
            rfree[list(s.members)] = at
            for snd in s.sends:
                for p in snd.send[0]:
                    spw[p, snd.peer_sticks] = at
            for grp in s.reduces:
                mask, root, dst, _ = grp[0].reduce
                st = np.arange(dst[0] // 128, (dst[0] + dst[1] * tile_pitch(dst[2], dst[3])) // 128)
                for q in ([i for i in range(C) if mask >> i & 1] if root == ROOT_ALL else [root]):
                    spw[q, st] = at
            continue
        c, u = s.core, cycles._UNIT[s.op]
        r, w = s.sp_reads, s.sp_writes
        ready = max([rfree[c, u]] + [spw[c, x].max() for x in (r, w) if x.size])
        start = max(ready, spr[c, w].max()) if w.size else ready
        war |= start > ready
        if u == cycles._HOST:
            start = max(start, rfree[c].max())
        d = dur.get(id(s), None)
        end = start + (cycles._duration(s, C, t, per_cycle) if d is None else d)
        rfree[c, u] = end
        if u == cycles._HOST:
            rfree[c, 0] = max(rfree[c, 0], end)
        spw[c, w] = end
        spr[c, r] = np.maximum(spr[c, r], end)
        want.append((c, s.idx, start, end))
    return want, rfree, war


def test_restick_cycle_model(targets):
    """A RESTICK runs on the DMA unit at the target's restickify bandwidth and counts as DRAM read + write."""
    t = targets[1]
    b = ProgramBuilder(t)
    x, y = b.input("x", (4, 256, 512), "dlf16"), b.output("y", (4, 512, 256), "dlf16")
    b.restick(0, x, y)
    p = b.load().static_profile
    nbytes = 4 * 256 * 1024
    assert p.dram_read_bytes == p.dram_write_bytes == nbytes
    ev = [e for e in p.events if e.name == "restick"]
    assert len(ev) == 1 and ev[0].unit == "DMA"
    assert ev[0].end - ev[0].start == pytest.approx(nbytes / (t.restickify_gbps / t.clock_ghz)
                                                    + t.dma_latency_cycles)


@pytest.mark.parametrize("fmt,idx_fmt", [("dlf16", "int64"), ("fp32", "int32"), ("fp8_e4m3", "int64")])
def test_gather_picks_table_rows(targets, fmt, idx_fmt):
    """GATHER copies the table rows the indices on the scratchpad pick (bits, and the exact values in
    fp32-reference mode) to dense scratchpad rows, on several cores at once, as a DMA load of those rows in the
    cycle model; an index outside the table is a run-time error naming the instruction."""
    t = targets[2]
    b = ProgramBuilder(t)
    table, ids = b.constant("table", _rng(5).standard_normal((50, 70)).astype(np.float32), fmt), \
        b.input("ids", (2, 6), idx_fmt)
    y = b.output("y", (2, 6, 70), fmt)
    for core in range(2):
        I = b.alloc(core, 1, 6, idx_fmt)
        T = b.alloc(core, 6, 70, fmt)
        b.load_tile(core, I, ids, core)
        b.gather(core, T, table, I.addr, idx_fmt)
        b.store_tile(core, T, y, index=(core,))
    ix = np.array([[0, 49, 3, 3, 17, 8], [5, 1, 0, 22, 49, 30]])
    exe = b.load()
    want = decode(fmt, encode(fmt, _rng(5).standard_normal((50, 70)).astype(np.float32)), 70)[ix]
    assert np.array_equal(exe(ix)[0], want)
    p = exe.static_profile
    ev = [e for e in p.events if e.name == "gather"]
    assert len(ev) == 2 and all(e.unit == "DMA" for e in ev)
    assert p.dram_read_bytes >= 2 * 6 * table.pitch
    (ref,) = b.load(numerics="fp32-reference")(ix)
    assert np.array_equal(ref, want)
    with pytest.raises(SpyreRuntimeError, match=r"core 1 instruction \d+ \(gather.*index 50 is outside the "
                                                r"table's 50 rows"):
        exe(np.array([[0, 1, 2, 3, 4, 5], [0, 0, 50, 0, 0, 0]]))


@pytest.mark.parametrize("fmt", ["dlf16", "fp32", "fp8_e4m3", "int8"])
@pytest.mark.parametrize("shadow", [False, True])
def test_grid_of_tiles_is_one_view_like_a_list(fmt, shadow):
    """Tiles at a grid of offsets (each core's part of a shared tile: cores c = 4 i + j at c * stride + j * part)
    are one strided view, reading, peeking and writing exactly what a view per tile does."""
    from spyre_mlir.runtime.emulator import Memory, TileList, TileView, tiles
    from spyre_mlir.runtime.formats import Format

    f = Format.parse(fmt)
    stride, part, rows, cols = 8192, 1024, 3, 40
    offsets = [c * stride + (c % 4) * part for c in range(8)]
    mems = [Memory(8 * stride, shadow) for _ in range(2)]
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, 8 * stride, dtype=np.uint8)
    for m in mems:
        m.bytes[...] = noise
        if shadow:
            m.shadow[...] = np.arange(8 * stride) * 0.5
    grid, one_each = tiles(mems[0], offsets, rows, cols, f), TileList(mems[1], offsets, rows, cols, f)
    assert isinstance(grid, TileView) and grid.shape == one_each.shape == (8, rows, cols)
    vals = (rng.standard_normal((8, rows, cols)) * 4).round().astype(np.float32)
    for _ in range(2):          # the noise, then what the writes left
        np.testing.assert_array_equal(grid.read_bytes(), one_each.read_bytes())
        np.testing.assert_array_equal(grid.read(), one_each.read())
        np.testing.assert_array_equal(grid.peek(), one_each.peek())
        grid.write(vals)
        one_each.write(vals)
        np.testing.assert_array_equal(mems[0].bytes, mems[1].bytes)
        grid.write_one(vals[3])
        one_each.write_one(vals[3])
        np.testing.assert_array_equal(mems[0].bytes, mems[1].bytes)
        if shadow:
            np.testing.assert_array_equal(mems[0].shadow, mems[1].shadow)
    # Not a grid: a view per tile.
    assert isinstance(tiles(mems[0], [0, stride, 3 * stride + part, 4 * stride], rows, cols, f), TileList)


@pytest.mark.parametrize("fmt", ["dlf16", "fp32", "fp8_e4m3", "bf16", "int8", "int4", "int32", "bool"])
@pytest.mark.parametrize("shadow", [False, True])
def test_a_write_broadcasts_its_values_as_their_whole_shape_does(fmt, shadow):
    """A tile write of values of a lower rank or with unit dimensions stores the bytes (and shadow) of a write of
    those values broadcast to the tile, each core's tiles apart, on a grid, and int4 packed along the rows."""
    from spyre_mlir.runtime.emulator import Memory, TileView
    from spyre_mlir.runtime.formats import Format

    f = Format.parse(fmt)
    rows, cols = 3, 70
    rng = _rng(9)
    for count, step in ((0, 0), (4, 4096), ((2, 2), (8192, 4096))):
        mems = [Memory(4 * 8192, shadow) for _ in range(2)]
        views = [TileView(m, 256, rows, cols, f, count, step) for m in mems]
        shape = views[0].shape
        for values in (rng.standard_normal(shape[:-1] + (1,)), rng.standard_normal(cols), 3.0,
                       rng.standard_normal((rows, 1))):
            if not f.is_float:
                values = np.rint(np.asarray(values) * 3).astype(np.int64)
            for m in mems:
                m.bytes[...] = 0xA5
            views[0].write(values)
            views[1].write(np.broadcast_to(values, shape))
            np.testing.assert_array_equal(mems[0].bytes, mems[1].bytes)
            if shadow:
                np.testing.assert_array_equal(mems[0].shadow, mems[1].shadow)


@pytest.mark.parametrize("grid", [False, True])
def test_write_one_rounds_once_and_copies_the_codes(grid):
    """The native DLFloat16 write of one tile's values to every core's copy rounds them once and copies the codes
    to every tile: the bytes of a write of each tile, NaNs, infinities, signed zeros and values past DLF16_MAX
    included."""
    from spyre_mlir.runtime import native
    from spyre_mlir.runtime.emulator import Memory, TileList, TileView, tiles
    from spyre_mlir.runtime.formats import DLF16_MAX, Format

    if not native.available():
        pytest.skip("the native conversions are off (SPYRE_EMU_NATIVE=0 or no torch-mlir)")
    stride, rows, cols = 8192, 5, 72
    offsets = [c * stride + (c % 4) * 1024 * grid for c in range(8)]
    mems = [Memory(8 * stride, False) for _ in range(2)]
    view, one_each = tiles(mems[0], offsets, rows, cols, Format.DLF16), TileList(mems[1], offsets, rows, cols,
                                                                                  Format.DLF16)
    assert isinstance(view, TileView) and view._grid == grid and view._native is not None
    vals = _rng(5).standard_normal((rows, cols)).astype(np.float32) * 1e3
    vals[0, :6] = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 2 * DLF16_MAX]
    vals[1, :2] = np.float32(2.0 ** -130), -DLF16_MAX * np.float32(1.001)
    for m in mems:
        m.bytes[...] = 0xA5          # the padding and the other tiles' old bytes
    view.write_one(vals)
    one_each.write_one(vals)
    np.testing.assert_array_equal(mems[0].bytes, mems[1].bytes)
    np.testing.assert_array_equal(view.read_bytes().view(np.uint32),
                                  np.broadcast_to(decode(Format.DLF16, dlf16_encode(vals), cols), (8, rows, cols))
                                  .view(np.uint32))


def test_a_cast_by_one_encodes_its_source_and_an_accumulator_adds_in_place(targets, monkeypatch):
    """A CAST by 1 from fp32 to DLFloat16 hands its source to the encode without the multiply (x * 1 only quiets
    a signalling NaN, and every NaN encodes to the NaN code of its sign), on one core's tile copied to every core
    and on each core's own; a cast whose codes overlap its source still multiplies first. A matmul accumulating
    into an fp32 tile adds into its memory. The bits are those of the multiply and of the sum written apart (where
    a product of operands every core shares is added to each core's C)."""
    import spyre_mlir.runtime.emulator as E

    taken = {"_plain_cast": [], "_in_place": []}

    def counted(name):
        decide = getattr(E, name)

        def f(*args):
            taken[name].append(decide(*args))
            return taken[name][-1]
        return f

    for name in taken:
        monkeypatch.setattr(E, name, counted(name))
    cores, rows, cols = 4, 8, 64
    rng = _rng(9)
    shared = rng.standard_normal((rows, cols)).astype(np.float32) * 1e3
    own = rng.standard_normal((cores * rows, cols)).astype(np.float32)
    snan = np.array([0x7F800001, 0xFF800123], np.uint32).view(np.float32)       # signalling NaNs of both signs
    shared[0, :4] = [*snan, np.inf, -0.0]
    own[1, :4] = [*snan, np.nan, 3e38]
    w = rng.standard_normal((cols, cols)).astype(np.float32)

    b = ProgramBuilder(targets[cores])
    xs, xo, wb = b.input("s", shared.shape, "fp32"), b.input("o", own.shape, "fp32"), b.input("w", w.shape, "fp32")
    names = ("ys", "yo", "yi", "yh", "ym")
    ys, yo, yi, yh, ym = (b.output(n, (cores * rows, cols), "fp32" if n == "ym" else "dlf16") for n in names)
    for c in range(cores):
        S, O, W = b.alloc(c, rows, cols, "fp32"), b.alloc(c, rows, cols, "fp32"), b.alloc(c, cols, cols, "fp32")
        DS, DO, DH, ACC = *(b.alloc(c, rows, cols) for _ in range(3)), b.alloc(c, rows, cols, "fp32")
        WD = b.alloc(c, cols, cols)
        b.load_tile(c, S, xs)
        b.load_tile(c, O, xo, row0=c * rows)
        b.load_tile(c, W, wb)
        b.sfu(c, "cast", DS, S, imm=1.0)                    # the same tile on every core
        b.sfu(c, "cast", DO, O, imm=1.0)                    # each core's own
        b.sfu(c, "cast", WD, W, imm=1.0)
        b.sfu(c, "cast", DH, O, imm=0.5)                    # a scale: multiplied
        b.store_tile(c, DH, yh, row0=c * rows)
        b.matmul(c, DO, WD, ACC)
        b.matmul(c, DS, WD, ACC, accumulate=True)           # ACC = ACC + DS @ WD, in place
        b.store_tile(c, DS, ys, row0=c * rows)
        b.store_tile(c, DO, yo, row0=c * rows)
        b.store_tile(c, ACC, ym, row0=c * rows)
        I = type(S)(S.addr, rows, cols, DS.fmt)             # codes over their own fp32 source: overlap
        b.sfu(c, "cast", I, S, imm=1.0)
        b.store_tile(c, I, yi, row0=c * rows)
    out = dict(zip(names, b.load(numerics="faithful")(s=shared, o=own, w=w)))
    assert True in taken["_plain_cast"] and False in taken["_plain_cast"] and True in taken["_in_place"]

    def codes(x, scale=1):
        with np.errstate(invalid="ignore"):         # the signalling NaNs
            return decode(E.Format.DLF16, dlf16_encode(x * np.float32(scale)), cols).view(np.uint32)

    np.testing.assert_array_equal(out["ys"].view(np.uint32), codes(np.tile(shared, (cores, 1))))
    np.testing.assert_array_equal(out["yo"].view(np.uint32), codes(own))
    np.testing.assert_array_equal(out["yi"].view(np.uint32), codes(np.tile(shared, (cores, 1))))
    np.testing.assert_array_equal(out["yh"].view(np.uint32), codes(own, 0.5))
    ds, do = (decode(E.Format.DLF16, dlf16_encode(x), cols) for x in (np.tile(shared, (cores, 1)), own))
    wd = decode(E.Format.DLF16, dlf16_encode(w), cols)
    acc = np.concatenate([do[r:r + rows] @ wd + ds[r:r + rows] @ wd for r in range(0, cores * rows, rows)])
    ok = np.isfinite(acc)
    np.testing.assert_allclose(out["ym"][ok], acc[ok], rtol=1e-5, atol=1e-2)
    monkeypatch.setattr(E, "_plain_cast", lambda *a: False)
    monkeypatch.setattr(E, "_in_place", lambda *a: False)
    again = dict(zip(names, b.load(numerics="faithful")(s=shared, o=own, w=w)))
    for k in out:
        np.testing.assert_array_equal(out[k].view(np.uint32), again[k].view(np.uint32))


def test_a_tile_every_core_casts_alike_is_written_where_it_is_read(targets):
    """The cast of a tile every core loaded alike is computed once and written to the cores whose copy a later
    step reads: the first core's, which a matmul of all cores reads for each (Shared), and core 2's, which it
    stores. The other cores' copies are left unwritten; the results are those of every copy written."""
    from spyre_mlir.runtime.formats import Format

    cores, rows, cols = 4, 8, 64
    rng = _rng(13)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal((cores * cols, cols)).astype(np.float32)
    b = ProgramBuilder(targets[cores])
    xb, wb = b.input("x", x.shape, "fp32"), b.input("w", w.shape, "fp32")
    y, z = b.output("y", (cores * rows, cols), "fp32"), b.output("z", x.shape)
    for c in range(cores):
        X, W, D, WD, Y = (b.alloc(c, rows, cols, "fp32"), b.alloc(c, cols, cols, "fp32"), b.alloc(c, rows, cols),
                          b.alloc(c, cols, cols), b.alloc(c, rows, cols, "fp32"))
        b.load_tile(c, X, xb)
        b.load_tile(c, W, wb, row0=c * cols)
        b.sfu(c, "cast", D, X, imm=1.0)                     # the same tile on every core
        b.sfu(c, "cast", WD, W, imm=1.0)
        b.matmul(c, D, WD, Y)
        b.store_tile(c, Y, y, row0=c * rows)
        if c == 2:
            b.store_tile(c, D, z)
    exe = b.load(numerics="faithful")
    ys, zs = exe(x=x, w=w)
    xd = decode(Format.DLF16, dlf16_encode(x), cols)
    wd = decode(Format.DLF16, dlf16_encode(w), cols)
    np.testing.assert_array_equal(zs, xd)
    np.testing.assert_allclose(ys, np.concatenate([xd @ wd[c * cols:(c + 1) * cols] for c in range(cores)]),
                               rtol=1e-5, atol=1e-4)
    m = exe.machine
    written = [bool(m.sp.bytes[c * m.stride + D.addr:c * m.stride + D.addr + D.nbytes].any()) for c in range(cores)]
    assert written == [True, False, True, False]
    (cast,) = [f for f in m._to_copies if f.view is not None and f.view.fmt is Format.DLF16 and f.tile[0] == rows]
    assert cast.view.shape[0] == 2


@pytest.mark.parametrize("split", [False, True])
def test_cores_that_load_a_tile_alike_cast_it_once_a_group(targets, monkeypatch, split):
    """Cores 0-1 load one tile and cores 2-3 another: the cast of a batch of all four is computed once a group (a
    step each), also where a batch planned alone is big enough for two threads (then not as halves). The
    codes are those of casting every core's tile, and groups too small to pay for their steps (pairs of small
    tiles) cast per core."""
    import spyre_mlir.runtime.emulator as E
    from spyre_mlir.runtime.formats import Format

    monkeypatch.setenv("SPYRE_EMU_WORKERS", "0")       # one process: lanes of every other core would part the groups

    def build(rows, cols):
        x = _rng(14).standard_normal((2 * rows, cols)).astype(np.float32)
        b = ProgramBuilder(targets[4])
        xb, z = b.input("x", x.shape, "fp32"), b.output("z", (4 * rows, cols), "fp32")
        for c in range(4):
            X, D, Y = b.alloc(c, rows, cols, "fp32"), b.alloc(c, rows, cols), b.alloc(c, rows, cols, "fp32")
            b.load_tile(c, X, xb, row0=c // 2 * rows)
            b.sfu(c, "cast", D, X, imm=1.0)
            b.sfu(c, "cast", Y, D, imm=1.0)
            b.store_tile(c, Y, z, row0=c * rows)
        return x, b

    if split:
        # Batch by batch (Machine._prepare_split, as in a segment a host operation keeps out of lanes).
        monkeypatch.setattr(E, "_SPLIT_ELEMS", 0)
        monkeypatch.setattr(E, "_thread_lanes", lambda batches: None)
    for (rows, cols), grouped in (((256, 256), True), ((8, 64), False)):
        x, b = build(rows, cols)
        exe = b.load(numerics="faithful")
        (z,) = exe(x=x)
        xd = decode(Format.DLF16, dlf16_encode(x), cols)
        np.testing.assert_array_equal(z, np.repeat(xd.reshape(2, rows, cols), 2, axis=0).reshape(4 * rows, cols))
        groups = [f for f in exe.machine._to_copies if f.tile[2] is Format.DLF16]
        # (Split in halves, the small tiles' halves are each one group: cast once a half.)
        assert [len(f.addrs) for f in groups] == ([2, 2] if grouped or split else [])
        if grouped:
            halves = [h for f in exe._plan if isinstance(f, E.Parallel) for h in (f.first, f.second)]
            assert not any(isinstance(h, E._ToCopies) or "_sfu_groups" in getattr(h, "__qualname__", "")
                           for h in halves)
            # The bits of the same program with every core's tile cast on its own.
            with monkeypatch.context() as m:
                m.setattr(E.Machine, "_sfu_groups", lambda self, batch: None)
                (z1,) = build(rows, cols)[1].load(numerics="faithful")(x=x)
            assert np.array_equal(z1.view(np.uint32), z.view(np.uint32))


@pytest.mark.parametrize("numerics", ["faithful", "fp32-reference"])
def test_outputs_are_arrays_of_their_own(targets, numerics):
    """A run's outputs own their memory (a decode, or a copy of the shadow): neither the machine's memories nor a
    later run's outputs."""
    x = _rng(15).standard_normal((16, 64)).astype(np.float32)
    b = ProgramBuilder(targets[1])
    xb, y, z = b.input("x", x.shape, "fp32"), b.output("y", x.shape, "fp32"), b.output("z", x.shape)
    X, D = b.alloc(0, 16, 64, "fp32"), b.alloc(0, 16, 64)
    b.load_tile(0, X, xb)
    b.sfu(0, "cast", D, X, imm=2.0)
    b.store_tile(0, X, y)
    b.store_tile(0, D, z)
    exe = b.load(numerics=numerics)
    first = exe(x=x)
    second = exe(x=-x)
    mems = [m for mem in (exe.machine.device, exe.machine.sp) for m in (mem.bytes, mem.shadow) if m is not None]
    for a, c in zip(first, second):
        assert not any(np.shares_memory(o, m) for o in (a, c) for m in mems)
        np.testing.assert_array_equal(a, -c)


def test_a_segment_with_a_big_batch_runs_as_two_lanes_of_threads(targets, monkeypatch):
    """A segment (4 cores) whose matmuls are big enough for two threads runs as one step of two lanes, the first
    two cores' steps on this thread and the last two's on the other, loads, casts, matmuls and stores alike; a
    tile two matmuls read is decoded once in its lane. The bits are those of a plan that splits each batch."""
    import spyre_mlir.runtime.emulator as E
    from spyre_mlir.runtime.formats import Format

    monkeypatch.setenv("SPYRE_EMU_WORKERS", "0")       # no worker process: its lanes would take the segment
    monkeypatch.setattr(E, "_SPLIT_WORK", 0)
    M, K, N = 16, 64, 32
    rng = _rng(16)
    x = rng.standard_normal((4 * M, K)).astype(np.float32)
    ws = {f"w{i}": rng.standard_normal((K, N)).astype(np.float32) for i in range(2)}

    def build():
        b = ProgramBuilder(targets[4])
        xb, ys = b.input("x", x.shape, "fp32"), [b.output(f"y{i}", (4 * M, N), "fp32") for i in range(2)]
        wbs = [b.input(k, w.shape, "fp32") for k, w in ws.items()]
        for c in range(4):
            X, XD, C = b.alloc(c, M, K, "fp32"), b.alloc(c, M, K), b.alloc(c, M, N, "fp32")
            b.load_tile(c, X, xb, row0=c * M)
            b.sfu(c, "cast", XD, X, imm=1.0)
            for w, y in zip(wbs, ys):
                W, WD = b.alloc(c, K, N, "fp32"), b.alloc(c, K, N)
                b.load_tile(c, W, w)
                b.sfu(c, "cast", WD, W, imm=1.0)
                b.matmul(c, XD, WD, C)
                b.store_tile(c, C, y, row0=c * M)
        return b.load(numerics="faithful")

    planned, prepare = [], E.Machine._prepare
    monkeypatch.setattr(E.Machine, "_prepare", lambda m, batch: planned.append((m._lane, {i.core for i in batch}))
                        or prepare(m, batch))
    exe = build()
    assert {lane for lane, _ in planned} == {2, 3}
    assert set().union(*(c for lane, c in planned if lane == 2)) == {0, 1}
    assert set().union(*(c for lane, c in planned if lane == 3)) == {2, 3}
    (lanes,) = [f for f in exe._plan if isinstance(f, E.Parallel)]
    for half in (lanes.first, lanes.second):
        steps = dict(zip(half.__code__.co_freevars, half.__closure__))["steps"].cell_contents
        assert any(isinstance(c.cell_contents, E.Reread) for f in steps for c in getattr(f, "__closure__", None) or ())
    y = exe(x=x, **ws)
    monkeypatch.setattr(E, "_thread_lanes", lambda batches: None)
    z = build()(x=x, **ws)
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(y, z))
    xd = decode(Format.DLF16, dlf16_encode(x), K)
    np.testing.assert_allclose(y[1], xd @ decode(Format.DLF16, dlf16_encode(ws["w1"]), N), rtol=1e-5, atol=1e-4)


def test_pieces_of_a_tile_share_their_weights_decode_and_transpose(targets, monkeypatch):
    """A matmul done in row pieces (and a sibling beside it) reads the same transposed weight tiles once per
    piece: each constant tile is decoded once per load and made contiguous once, for every piece and call, and
    the pieces give the bits of the whole product."""
    import spyre_mlir.runtime.emulator as E

    rng = _rng(12)
    M, N, K = 32, 64, 128
    ws = [dlf16_round(rng.standard_normal((N, K)).astype(np.float32)) for _ in range(2)]    # [N, K]: TRANS_B
    b = ProgramBuilder(targets[1])
    x_buf = b.input("x", (M, K), "dlf16")
    ys = [b.output(f"y{i}", (M, N), "fp32") for i in range(3)]
    X, C = b.alloc(0, M, K, "dlf16"), b.alloc(0, M, N, "fp32")
    Ws = [b.alloc(0, N, K, "dlf16") for _ in range(2)]
    for i, w in enumerate(ws):
        b.load_tile(0, Ws[i], b.constant(f"w{i}", w, "dlf16"))
    b.load_tile(0, X, x_buf)
    for i, W in enumerate(Ws):                     # whole
        b.matmul(0, X, W, C, trans_b=True)
        b.store_tile(0, C, ys[i])
    for lo in range(0, M, 8):                      # in pieces, the sibling's weight between
        for W in Ws:
            b.matmul(0, X.row_slice(lo, lo + 8), W, C.row_slice(lo, lo + 8), trans_b=True)
    b.store_tile(0, C, ys[2])
    exe = b.load()
    decodes, transposes = [], []
    read_bytes, swap = E.TileView.read_bytes, np.swapaxes
    monkeypatch.setattr(E.TileView, "read_bytes", lambda v: decodes.append(v.shape) or read_bytes(v))
    monkeypatch.setattr(E.np, "swapaxes", lambda a, *ax: transposes.append(a.shape) or swap(a, *ax))
    for seed in (1, 2):
        x = dlf16_round(_rng(seed).standard_normal((M, K)).astype(np.float32))
        y0, y1, y2 = exe(x)
        assert np.array_equal(y2, y1)
        assert np.allclose(y0, x.astype(np.float64) @ ws[0].T, rtol=1e-5, atol=1e-4)
    # Each weight is decoded and transposed once, for all pieces and calls.
    assert [s[-2:] for s in decodes].count((N, K)) == 2 and [s[-2:] for s in transposes].count((N, K)) == 2


class _Values:
    def __init__(self, v):
        self.v, self.shape = v, v.shape

    def read(self):
        return self.v


@pytest.mark.parametrize("index,copied", [([0, 0, 1, 1, 2, 2], False), ([0, 1, 2, 0, 1, 2], False),
                                          ([0, 0, 0, 0, 0, 0], False), ([0, 1, 1, 0, 2, 2], True),
                                          ([0, 0, 0, 0, 1, 1], True)])
@pytest.mark.parametrize("grouped", ["A", "B"])
@pytest.mark.parametrize("other", ["per core", "shared"])
def test_a_grouped_operand_multiplies_as_its_copies_do(monkeypatch, index, copied, grouped, other):
    """The products of a matmul batch with a Grouped operand (K chunks summed in order: K > PT_K) have the bits of
    its per-core copies'. Where the groups are runs of cores or the cores cycle through them, the distinct tiles
    are not copied per core but broadcast over them."""
    import spyre_mlir.runtime.emulator as E

    rng = _rng(21)
    M, K, N, n, g = 8, E.PT_K + 44, 16, len(index), max(index) + 1
    distinct = rng.standard_normal((g, M, K) if grouped == "A" else (g, K, N)).astype(np.float32)
    shape = (K, N) if grouped == "A" else (M, K)
    y = rng.standard_normal(((n,) if other == "per core" else ()) + shape).astype(np.float32)
    G = E.Grouped(_Values(distinct), np.array(index))
    A, B = (G, _Values(y)) if grouped == "A" else (_Values(y), G)
    want = E.pt_product(*((distinct[index], y) if grouped == "A" else (y, distinct[index])))
    takes, take = [], np.take
    monkeypatch.setattr(np, "take", lambda a, *args, **kw: takes.append(a.shape) or take(a, *args, **kw))
    got = E._products(A, B, n)()
    assert got.shape == want.shape == (n, M, N)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert bool(takes) == (copied or other == "shared")


def test_a_grouped_transposed_operand_is_transposed_once_a_group(targets, monkeypatch):
    """Attention's K^T: two groups of cores each load one head's K (the same bytes within a group) and two
    matmuls read it transposed (TRANS_B). The plan reads it as one tile per group (broadcast over the group's
    cores): per call each group's tile is decoded and transposed once, for both matmuls, not once per core. The
    bits are those of the plan that decodes every core's tile."""
    import spyre_mlir.runtime.emulator as E

    M, N, K = 8, 32, 64
    rng = _rng(17)
    ks = [dlf16_round(rng.standard_normal((N, K)).astype(np.float32)) for _ in range(2)]       # [N, K] per head

    def build():
        b = ProgramBuilder(targets[4])
        qb, kbs = b.input("q", (4 * M, K)), [b.input(f"k{h}", (N, K)) for h in range(2)]
        ys = [b.output(f"y{i}", (4 * M, N), "fp32") for i in range(2)]
        for c in range(4):
            Q, Q2, KT, C = b.alloc(c, M, K), b.alloc(c, M, K), b.alloc(c, N, K), b.alloc(c, M, N, "fp32")
            b.load_tile(c, KT, kbs[c // 2])
            b.load_tile(c, Q, qb, row0=c * M)
            b.sfu(c, "mul", Q2, Q, 2.0)
            for A, y in zip((Q, Q2), ys):
                b.matmul(c, A, KT, C, trans_b=True)
                b.store_tile(c, C, y, row0=c * M)
        return b.load(numerics="faithful")

    exe = build()
    steps = [c.cell_contents for f in exe._plan for c in getattr(f, "__closure__", None) or ()]
    assert [g.index.tolist() for g in steps if isinstance(g, E.Grouped)] == [[0, 0, 1, 1]] * 2
    decodes, transposes = [], []
    read_bytes, swap = E.TileView.read_bytes, np.swapaxes
    monkeypatch.setattr(E.TileView, "read_bytes", lambda v: decodes.append(v.shape) or read_bytes(v))
    monkeypatch.setattr(E.np, "swapaxes", lambda a, *ax: transposes.append(a.shape) or swap(a, *ax))
    q = dlf16_round(rng.standard_normal((4 * M, K)).astype(np.float32))
    for _ in range(2):
        y = exe(q, *ks)
    assert [s for s in decodes if s[-2:] == (N, K)] == [(2, N, K)] * 2
    assert [s for s in transposes if s[-2:] == (N, K)] == [(2, N, K)] * 2
    monkeypatch.setattr(E.Machine, "_grouped", lambda m, view, addrs, t, ids2, pieces: (view, pieces))
    z = build()(q, *ks)
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(y, z))
    kk = np.repeat(np.stack(ks), 2, axis=0)
    np.testing.assert_allclose(y[1].reshape(4, M, N), 2 * q.reshape(4, M, K) @ kk.transpose(0, 2, 1),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("rewrite", [False, True])
def test_a_tile_read_again_is_decoded_once_per_run_until_written(targets, rewrite):
    """Two matmuls read the same input tile: the second reuses the first's decode of the run (the plan proves the
    bytes equal); an SFU write between them makes it decode the new bytes. Every call computes from its own
    inputs."""
    from spyre_mlir.runtime.emulator import FirstRead, Reread

    rng = _rng(11)
    M, N, K = 16, 32, 64
    w1, w2 = (dlf16_round(rng.standard_normal((K, N)).astype(np.float32)) for _ in range(2))
    b = ProgramBuilder(targets[1])
    x_buf = b.input("x", (M, K), "dlf16")
    ys = [b.output(f"y{i}", (M, N), "fp32") for i in range(2)]
    X, C = b.alloc(0, M, K, "dlf16"), b.alloc(0, M, N, "fp32")
    Ws = [b.alloc(0, K, N, "dlf16") for _ in range(2)]
    for i, w in enumerate((w1, w2)):
        b.load_tile(0, Ws[i], b.constant(f"w{i}", w, "dlf16"))
    b.load_tile(0, X, x_buf)
    b.matmul(0, X, Ws[0], C)
    b.store_tile(0, C, ys[0])
    if rewrite:
        b.sfu(0, "mul", X, X, 2.0)
    b.matmul(0, X, Ws[1], C)
    b.store_tile(0, C, ys[1])
    exe = b.load()
    reads = [c for f in exe._plan for c in getattr(f, "__closure__", None) or ()
             if isinstance(c.cell_contents, (FirstRead, Reread))]
    assert any(isinstance(c.cell_contents, Reread) for c in reads) != rewrite
    for seed in (1, 2):
        x = dlf16_round(_rng(seed).standard_normal((M, K)).astype(np.float32))
        y0, y1 = exe(x)
        assert np.allclose(y0, x.astype(np.float64) @ w1, rtol=1e-5, atol=1e-4)
        assert np.allclose(y1, (2 * x if rewrite else x).astype(np.float64) @ w2, rtol=1e-5, atol=1e-4)
        # Nothing stays held after a call: a first read keeps its values only for its rereads, the last lets go.
        assert all(c.cell_contents.tile.value is None for c in reads)


# ---- Copy: every way it moves bytes (strided view, a few runs, runs of one shift, rows by index) = a naive copy

@st.composite
def _copies(draw):
    """Non-overlapping destination blocks (each copy's own stick-aligned slot, shuffled) and source blocks
    anywhere (several may read the same bytes), of one (outer, rows, row_bytes) shape with stick-multiple
    strides; the row strides may make rows contiguous (merged into one long row) or not."""
    S = 128
    m, n, k = draw(st.integers(1, 3)), draw(st.integers(1, 3)), S * draw(st.integers(1, 3))
    strides = [(S * draw(st.integers(k // S * n, k // S * n + 2)), S * draw(st.integers(k // S, k // S + 2)))
               for _ in range(2)]
    extent = max((m - 1) * s0 + (n - 1) * s1 + k for s0, s1 in strides)
    count = draw(st.integers(1, 9))
    slot = -(-extent // S) * S + S * draw(st.integers(0, 2))
    dst = [i * slot for i in draw(st.permutations(range(count)))]
    src = [S * draw(st.integers(0, 40)) for _ in range(count)]
    if draw(st.booleans()):       # evenly spaced sources: the strided and few-runs paths
        step = S * draw(st.integers(0, 3)) + (slot if draw(st.booleans()) else 0)
        src = [i * step for i in range(count)]
    if draw(st.booleans()):       # a ring multicast: source i to slots j * count + (i + j) % count, in issue order
        peers = draw(st.integers(1, 3))
        src = [i * slot for i in range(count) for _ in range(peers)]
        dst = [(j * count + (i + j) % count) * slot for i in range(count) for j in range(1, peers + 1)]
    # Runs of one shift (the multicast's) are taken whatever their size, or only when they are big.
    return (m, n, k), strides, src, dst, draw(st.booleans()), draw(st.sampled_from([1, 1 << 15]))


@settings(max_examples=300, deadline=None)
@given(_copies())
def test_copy_moves_the_bytes_of_a_naive_copy(case):
    from spyre_mlir.runtime import emulator
    from spyre_mlir.runtime.emulator import Copy, Memory
    (m, n, k), (sstr, dstr), src_offs, dst_offs, shadow, piece_bytes = case
    rng = np.random.default_rng(len(src_offs))
    src = Memory(max(src_offs) + (m - 1) * sstr[0] + (n - 1) * sstr[1] + k + 256, shadow)
    dst = Memory(max(dst_offs) + (m - 1) * dstr[0] + (n - 1) * dstr[1] + k + 256, shadow)
    src.bytes[...] = rng.integers(0, 256, src.bytes.size, dtype=np.uint8)
    dst.bytes[...] = rng.integers(0, 256, dst.bytes.size, dtype=np.uint8)
    if shadow:
        src.shadow[...] = rng.standard_normal(src.shadow.size)
    want = dst.bytes.copy(), None if not shadow else dst.shadow.copy()
    for so, do in zip(src_offs, dst_offs):
        for i in range(m):
            for j in range(n):
                a, b = so + i * sstr[0] + j * sstr[1], do + i * dstr[0] + j * dstr[1]
                want[0][b:b + k] = src.bytes[a:a + k]
                if shadow:
                    want[1][b:b + k] = src.shadow[a:a + k]
    keep, emulator._PIECE_BYTES = emulator._PIECE_BYTES, piece_bytes
    try:
        Copy(src, src_offs, sstr, dst, dst_offs, dstr, (m, n, k))()
    finally:
        emulator._PIECE_BYTES = keep
    np.testing.assert_array_equal(dst.bytes, want[0])
    if shadow:
        np.testing.assert_array_equal(dst.shadow, want[1])


def _stream_batches(monkeypatch, streams):
    """emulator._batches of per-core streams of kinds (letters), as batches of (core, kind)."""
    from spyre_mlir.runtime import emulator

    class Ins:          # hashed by identity, as schedule.Ins
        def __init__(self, core, kind):
            self.core, self.kind = core, kind
    monkeypatch.setattr(emulator, "_kind", lambda ins: ins.kind)
    seg = [Ins(c, k) for c, s in enumerate(streams) for k in s]
    return [[(i.core, i.kind) for i in b] for b in emulator._batches(seg)]


def test_batches_run_the_extra_instructions_of_some_cores_alone(monkeypatch):
    # The edge core of a convolution loads and sends two more tiles, then computes as the others do: those
    # two run alone, every other step on all cores (greedy by count ran the three cores' steps first, then
    # core 0's whole stream alone: 9 batches).
    streams = ["LSXYZ", "XYZ", "XYZ", "XYZW"]
    assert _stream_batches(monkeypatch, streams) == [
        [(0, "L")], [(0, "S")], [(c, "X") for c in range(4)], [(c, "Y") for c in range(4)],
        [(c, "Z") for c in range(4)], [(3, "W")]]
    # Each next step is still ahead of the other core: the first core's goes first.
    assert _stream_batches(monkeypatch, ["XY", "YX"]) == [[(0, "X")], [(0, "Y"), (1, "Y")], [(1, "X")]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ABCD", max_size=12), min_size=1, max_size=6))
def test_batches_keep_every_core_in_its_order(streams):
    with pytest.MonkeyPatch.context() as mp:
        batches = _stream_batches(mp, streams)
    for b in batches:
        assert len({k for _, k in b}) == 1 and len({c for c, _ in b}) == len(b)     # one kind, a core once
    for c, s in enumerate(streams):
        assert "".join(k for b in batches for core, k in b if core == c) == s
    assert len(batches) <= sum(map(len, streams))
