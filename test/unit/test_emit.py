"""spyre-emit on hand-written IR: each kernel runs on the emulator and matches numpy.

The programs run with the emulator's fp32-reference numerics (no rounding), so the kernels' arithmetic is
checked to ~1e-6 whatever the tensor formats; one faithful run checks the dlf16 rounding bound.
"""

import collections

import numpy as np
import pytest

from spyre_mlir import codegen
from spyre_mlir.context import make_context
from spyre_mlir.runtime import load_bytes
from spyre_mlir.runtime.formats import dlf16_round
from spyre_mlir.runtime.isa import MatmulFlag, Op
from spyre_mlir.target import load_target



def run(ir_text, inputs, cores=2, params=None, numerics="fp32-reference", layout=False):
    """Select and plan the kernels (the kernel passes; a hand-written grid and tile are kept), emit, load.
    ``layout``: run spyre-layout first (sticks, and transpose_rhs as an explicit restickify)."""
    from torch_mlir import ir

    from spyre_mlir.params import attach, values
    from spyre_mlir.passes.manager import run_pipeline

    plan = "spyre-schedule"
    if "spyre.scratchpad" not in ir_text:
        plan = "spyre-allocate-scratchpad," + plan
    if "spyre.grid" not in ir_text:
        plan = f"spyre-divide-work{{cores={cores}}},spyre-tile," + plan
    plan = ("spyre-layout," if layout else "") + "spyre-select-kernels,spyre-fold-constants," + plan
    with make_context():
        module = ir.Module.parse(ir_text)
        attach(module, params or {})
        run_pipeline(module, f"builtin.module({plan})")
        em = codegen.emit(module, load_target(cores=cores), params=values(module) or None)
    exe = load_bytes(em.b.to_bytes(), numerics=numerics)
    return exe(*inputs), em, exe


RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


MATMUL = """
func.func @main(%a: tensor<{M}x{K}xf32>, %b: tensor<{K}x{N}xf32>, %bias: tensor<{N}xf32>) -> tensor<{M}x{N}xf32> {{
  %r = "spyre.matmul"(%a, %b, %bias) {{operandSegmentSizes = array<i32: 1, 1, 1>{attrs}}}
      : (tensor<{M}x{K}xf32>, tensor<{K}x{N}xf32>, tensor<{N}xf32>) -> tensor<{M}x{N}xf32>
  return %r : tensor<{M}x{N}xf32>
}}
"""


@pytest.mark.parametrize("cores, grid, tile", [
    (1, None, None),
    (4, (2, 2, 1), (8, 64, 64)),     # M and N split, several tiles per core, K in steps
    (4, (1, 1, 4), (16, 128, 64)),   # split-K with a ring reduce; bias added after the reduction
    (4, None, None),                 # grid and tile chosen by the kernel passes
])
def test_matmul(cores, grid, tile):
    M, K, N = 16, 256, 128
    attrs = ""
    if grid:
        attrs = f", spyre.grid = array<i64: {', '.join(map(str, grid))}>, " \
                f"spyre.tile = array<i64: {', '.join(map(str, tile))}>"
    a, b, bias = rand(M, K), rand(K, N), rand(N)
    (y,), _, _ = run(MATMUL.format(M=M, K=K, N=N, attrs=attrs), [a, b, bias], cores=cores)
    np.testing.assert_allclose(y, a @ b + bias, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("elt, grid, tile", [("f32", (2, 2, 1), (8, 64, 64)), ("!spyre.dlf16", (2, 2, 1), (8, 64, 64)),
                                             ("f32", (1, 4, 1), (32, 32, 192)), ("!spyre.dlf16", (4, 1, 1), (8, 64, 64))])
def test_matmul_resident_a(elt, grid, tile):
    """A resident A (spyre.resident_a, buffer `ares`): each core keeps its part of the A tiles of a row of output
    tiles, loaded (f32: staged in `as` and converted) for the row's first tile and sent again from the scratchpad
    for the others. The PT array multiplies the same tiles in the same order, so the result is bit-identical to
    the plan without it, and A's bytes are read from device memory once instead of once per output tile of a row
    (a partial last K step, 256 = 192 + 64, included)."""
    M, K, N = 32, 256, 256
    ta, tb = f"tensor<{M}x{K}x{elt}>", f"tensor<{K}x{N}x{elt}>"
    attrs = (f", spyre.grid = array<i64: {', '.join(map(str, grid))}>, "
             f"spyre.tile = array<i64: {', '.join(map(str, tile))}>")
    text = f"""
func.func @main(%a: {ta}, %b: {tb}) -> tensor<{M}x{N}xf32> {{
  %r = "spyre.matmul"(%a, %b) {{operandSegmentSizes = array<i32: 1, 1, 0>{{attrs}}}} : ({ta}, {tb}) -> tensor<{M}x{N}xf32>
  return %r : tensor<{M}x{N}xf32>
}}"""
    from spyre_mlir.runtime.formats import dlf16_round

    a, b = dlf16_round(rand(M, K)), dlf16_round(rand(K, N))
    (yr,), emr, exr = run(text.replace("{attrs}", attrs + ", spyre.resident_a = true"), [a, b], cores=4,
                          numerics="faithful")
    (yp,), emp, exp_ = run(text.replace("{attrs}", attrs), [a, b], cores=4, numerics="faithful")
    assert np.array_equal(yr, yp)
    np.testing.assert_allclose(yr, a @ b, rtol=1e-2, atol=1e-2)
    gm, gn, _ = grid
    passes = N // gn // tile[1]
    a_bytes = M * K * (4 if elt == "f32" else 2)
    saved = exp_.static_profile.dram_read_bytes - exr.static_profile.dram_read_bytes
    assert saved == a_bytes * (passes - 1)


@pytest.mark.parametrize("N, grid, resident", [(176, (2, 3, 1), False), (688, (4, 6, 1), False),
                                               (688, (1, 11, 1), True), (176, (1, 2, 1), False)])
def test_matmul_ragged_n_split(N, grid, resident):
    """N in whole sticks that no even split of the cores takes (176 = 2.75 sticks, 688 = 10.75): a ragged split
    gives every core ceil(N / gn) rounded up to whole sticks but the last, which takes the rest (one tile column
    per core). Bit-identical to the same tiles walked by one grid column, and to numpy within dlf16's bound."""
    M, K = 32, 128
    gm, gn, _ = grid
    nb = -(-(-(-N // gn)) // 64) * 64
    t = lambda g, tile: (f", spyre.grid = array<i64: {', '.join(map(str, g))}>, "  # noqa: E731
                         f"spyre.tile = array<i64: {', '.join(map(str, tile))}>")
    text = f"""
func.func @main(%a: tensor<{M}x{K}x!spyre.dlf16>, %b: tensor<{K}x{N}x!spyre.dlf16>) -> tensor<{M}x{N}xf32> {{
  %r = "spyre.matmul"(%a, %b) {{operandSegmentSizes = array<i32: 1, 1, 0>{{attrs}}}} : (tensor<{M}x{K}x!spyre.dlf16>, tensor<{K}x{N}x!spyre.dlf16>) -> tensor<{M}x{N}xf32>
  return %r : tensor<{M}x{N}xf32>
}}"""
    from spyre_mlir.runtime.formats import dlf16_round

    a, b = dlf16_round(rand(M, K)), dlf16_round(rand(K, N))
    tile = (M // gm // (2 if resident else 1), nb, 64)
    ragged = t(grid, tile) + (", spyre.resident_a = true" if resident else "")
    (y,), em, _ = run(text.replace("{attrs}", ragged), [a, b], cores=gm * gn, numerics="faithful")
    (y1,), _, _ = run(text.replace("{attrs}", t((gm, 1, 1), tile)), [a, b], cores=gm, numerics="faithful")
    assert np.array_equal(y, y1)
    assert np.all(np.abs(y - a @ b) <= 2.0**-8 * (np.abs(a) @ np.abs(b)) + 1e-5)


def test_matmul_faithful_dlf16_bound():
    """Faithful numerics: inputs round to dlf16 (2^-10 relative each), the PT array accumulates in fp32, the
    fp32 output is not rounded again, so |err| <= 2 * 2^-10 * sum_k |a||b| (+ fp32 noise)."""
    M, K, N = 8, 128, 64
    a, b, bias = rand(M, K), rand(K, N), rand(N)
    (y,), _, _ = run(MATMUL.format(M=M, K=K, N=N, attrs=""), [a, b, bias], cores=1, numerics="faithful")
    bound = 2 * 2.0**-10 * (np.abs(a) @ np.abs(b)) + 1e-5
    assert np.all(np.abs(y - (a @ b + bias)) <= bound)


def test_batch_matmul_reads_a_transposed_rhs_as_it_is():
    """q @ k^T: the kernel reads the [S, D] rhs as it is stored (MATMUL TRANS_B), with or without spyre-layout
    (which keeps transpose_rhs for a run-time rhs): no RESTICK, no host op, and the bits of the plain product
    of the same rhs stored [K, N]."""
    ir_text = """
func.func @main(%a: tensor<3x8x64xf32>, %b: tensor<3x32x64xf32>) -> tensor<3x8x32xf32> {
  %r = "spyre.batch_matmul"(%a, %b) {transpose_rhs = true} : (tensor<3x8x64xf32>, tensor<3x32x64xf32>) -> tensor<3x8x32xf32>
  return %r : tensor<3x8x32xf32>
}"""
    plain = """
func.func @main(%a: tensor<3x8x64xf32>, %b: tensor<3x64x32xf32>) -> tensor<3x8x32xf32> {
  %r = "spyre.batch_matmul"(%a, %b) : (tensor<3x8x64xf32>, tensor<3x64x32xf32>) -> tensor<3x8x32xf32>
  return %r : tensor<3x8x32xf32>
}"""
    a, b = dlf16_round(rand(3, 8, 64)), dlf16_round(rand(3, 32, 64))
    for layout in (True, False):
        (y,), em, exe = run(ir_text, [a, b], cores=2, layout=layout, numerics="faithful")
        assert em.host_ops == []
        ops = {int(r["op"]) for c in exe.program.code for r in c}
        assert Op.RESTICK not in ops
        mm = [r for c in exe.program.code for r in c if r["op"] == Op.MATMUL]
        assert mm and all(int(r["flags"]) & int(MatmulFlag.TRANS_B) for r in mm)
    (y0,), _, _ = run(plain, [a, np.ascontiguousarray(b.transpose(0, 2, 1))], cores=2, numerics="faithful")
    assert np.array_equal(y, y0)
    np.testing.assert_allclose(y, a @ b.transpose(0, 2, 1), rtol=1e-2, atol=1e-2)


HEADS = """
func.func @main(%a: tensor<4x16x64xf32>, %w: tensor<256x64xf32>) -> ({res}) {{
  %t = "spyre.transpose"(%a) {{permutation = array<i64: 1, 0, 2>{move}}} : (tensor<4x16x64xf32>) -> tensor<16x4x64xf32>
  %m = "spyre.reshape"(%t) {{{move_only}}} : (tensor<16x4x64xf32>) -> tensor<16x256xf32>
  %r = "spyre.matmul"(%m, %w) {{operandSegmentSizes = array<i32: 1, 1, 0>{mm}}} : (tensor<16x256xf32>, tensor<256x64xf32>) -> tensor<16x64xf32>
  %n = "spyre.map"(%m) ({{
  ^bb0(%e: f32):
    %x = arith.negf %e : f32
    "spyre.yield"(%x) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>{move}}} : (tensor<16x256xf32>) -> tensor<16x256xf32>
  return {ret} : {res}
}}"""


@pytest.mark.parametrize("grid, tile", [
    (None, None),
    ((2, 2, 1), (8, 32, 64)),       # A shared over the ring, K tiles of one head
    ((1, 1, 4), (16, 64, 32)),      # split K, half a head per K tile (a source row's second half)
    ((2, 1, 2), (8, 64, 96)),       # K tiles across heads: one and a half heads
])
def test_merged_heads_are_read_in_place(grid, tile):
    """Attention's heads merged back, [h, s, d] -> [s, h, d] -> [s, h*d]: the transpose and the reshape are
    aliases (a merged row view: each row's d-wide blocks gathered from their heads' rows), no copy kernel; the
    matmul and the row-wise map read the view with strided DMAs, bit-identical to the program that copies the
    rows first (the transpose also returned)."""
    def text(copy):
        attrs = dict(move="", move_only="", mm="")
        if grid:
            attrs.update(move=", spyre.grid = array<i64: 1>, spyre.tile = array<i64: 16>",
                         move_only="spyre.grid = array<i64: 1>, spyre.tile = array<i64: 16>",
                         mm=f", spyre.grid = array<i64: {', '.join(map(str, grid))}>, "
                            f"spyre.tile = array<i64: {', '.join(map(str, tile))}>")
        res = "tensor<16x64xf32>, tensor<16x256xf32>" + (", tensor<16x4x64xf32>" if copy else "")
        return HEADS.format(res=res, ret="%r, %n" + (", %t" if copy else ""), **attrs)

    a, w = dlf16_round(rand(4, 16, 64)), dlf16_round(rand(256, 64))
    (y, n), em, exe = run(text(False), [a, w], cores=4, numerics="faithful")
    (y0, n0, _), em0, exe0 = run(text(True), [a, w], cores=4, numerics="faithful")
    assert np.array_equal(y, y0) and np.array_equal(n, n0)
    merged = a.transpose(1, 0, 2).reshape(16, 256)
    np.testing.assert_allclose(y, merged @ w, rtol=2e-2, atol=5e-2)
    np.testing.assert_array_equal(n, -merged)
    assert em.kernels == ["spyre.matmul", "spyre.map"] and "spyre.transpose" in em0.kernels
    p, p0 = exe.static_profile, exe0.static_profile
    assert p.dram_read_bytes < p0.dram_read_bytes and p.cycles < p0.cycles


REPEAT_KV = """
func.func @main(%q: tensor<4x16x64xf32>, %k: tensor<2x1x16x64xf32>) -> ({res}) {{
  %e = "spyre.map"(%k) ({{
  ^bb0(%a: f32):
    "spyre.yield"(%a) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>}} : (tensor<2x1x16x64xf32>) -> tensor<2x2x16x64xf32>
  %r = "spyre.reshape"(%e) : (tensor<2x2x16x64xf32>) -> tensor<4x16x64xf32>
  %s = "spyre.batch_matmul"(%q, %r) {{transpose_rhs = true}} : (tensor<4x16x64xf32>, tensor<4x16x64xf32>) -> tensor<4x16x16xf32>
  return {ret} : {res}
}}"""


@pytest.mark.parametrize("cores", [1, 4, 8])
def test_repeated_kv_heads_are_read_in_place(cores):
    """Grouped-query attention's repeat_kv (an identity map broadcasting k's 2 heads to 4) is a row view of k
    (kernel `alias`: each head's rows gathered from its group's), read by the scores' batch_matmul: no copy
    kernel, bit-identical to the program that copies (the expanded k also returned)."""
    def text(copy):
        res = "tensor<4x16x16xf32>" + (", tensor<2x2x16x64xf32>" if copy else "")
        return REPEAT_KV.format(res=res, ret="%s" + (", %e" if copy else ""))

    q, k = dlf16_round(rand(4, 16, 64)), dlf16_round(rand(2, 1, 16, 64))
    (y,), em, exe = run(text(False), [q, k], cores=cores, numerics="faithful")
    (y0, _), em0, exe0 = run(text(True), [q, k], cores=cores, numerics="faithful")
    assert np.array_equal(y, y0)
    kk = np.repeat(k, 2, axis=1).reshape(4, 16, 64)
    np.testing.assert_allclose(y, q @ kk.transpose(0, 2, 1), rtol=2e-2, atol=5e-2)
    assert em.kernels == ["spyre.batch_matmul"] and "spyre.map" in em0.kernels
    assert exe.static_profile.cycles < exe0.static_profile.cycles


WIDENED = """
func.func @main(%x: tensor<64x128x!spyre.dlf16>, %w: tensor<128x64x!spyre.dlf16>, %r: tensor<64x64x!spyre.dlf16>) -> ({res}) {{
  %m = "spyre.matmul"(%x, %w) {{acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>{mm}}} : (tensor<64x128x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %a = "spyre.map"(%r, %m) ({{
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 1, 0, 0>{rows}}} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %v = "spyre.reshape"(%a) {{{rows_only}}} : (tensor<64x64x!spyre.dlf16>) -> tensor<1x64x64x!spyre.dlf16>
  %f = "spyre.cast"(%v) {{operandSegmentSizes = array<i32: 1, 0>{rows}}} : (tensor<1x64x64x!spyre.dlf16>) -> tensor<1x64x64xf32>
  return {ret} : {res}
}}"""


@pytest.mark.parametrize("cores, grid", [(1, None), (4, None), (4, (1, 1, 2))])
def test_widening_cast_after_the_epilogue(cores, grid):
    """A residual add the matmul applies, returned in f32: the cast widening it is applied by the matmul's kernel
    too (the map's values rounded to dlf16, then widened into f32 and stored), no cast kernel; with K split over
    2 cores the reduce-sum's root applies both. Bit-identical to the program whose map and cast run as kernels of
    their own (the map's result also returned)."""
    attrs = dict(mm="", rows="", rows_only="")
    if grid:
        attrs = dict(mm=f", spyre.grid = array<i64: {', '.join(map(str, grid))}>, spyre.tile = array<i64: 64, 64, 64>",
                     rows=", spyre.grid = array<i64: 1>, spyre.tile = array<i64: 64>",
                     rows_only="spyre.grid = array<i64: 1>, spyre.tile = array<i64: 64>")

    def text(separate):
        res = "tensor<1x64x64xf32>" + (", tensor<64x64x!spyre.dlf16>" if separate else "")
        return WIDENED.format(res=res, ret="%f" + (", %a" if separate else ""), **attrs)

    x, w, r = (dlf16_round(rand(*s)) for s in ((64, 128), (128, 64), (64, 64)))
    (y,), em, exe = run(text(False), [x, w, r], cores=cores, numerics="faithful")
    (y0, _), em0, _ = run(text(True), [x, w, r], cores=cores, numerics="faithful")
    assert np.array_equal(y, y0) and y.dtype == np.float32
    np.testing.assert_allclose(y[0], r + x @ w, rtol=2e-2, atol=5e-2)
    assert em.kernels == ["spyre.matmul"] and "spyre.cast" in em0.kernels
    assert any(r["op"] == Op.RING_REDUCE for c in exe.program.code for r in c) == bool(grid)


def test_map_broadcasts_and_rewrites():
    """ROW ([R,1]), COL ([C]) and a per-channel [C,1,1] broadcast (by DMA with a zero stride), with select
    and erf rewritten onto SFU functions."""
    ir_text = """
func.func @main(%x: tensor<2x4x8x64xf32>, %r: tensor<2x4x8x1xf32>, %c: tensor<64xf32>, %ch: tensor<4x1x1xf32>) -> tensor<2x4x8x64xf32> {
  %y = "spyre.map"(%x, %r, %c, %ch) ({
  ^bb0(%a: f32, %b: f32, %d: f32, %e: f32):
    %zero = arith.constant 0.0 : f32
    %s = arith.subf %a, %b : f32
    %m = arith.mulf %s, %d : f32
    %t = arith.addf %m, %e : f32
    %p = arith.cmpf ogt, %t, %zero : f32
    %q = arith.select %p, %t, %a : f32
    %f = math.erf %q : f32
    "spyre.yield"(%f) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<2x4x8x64xf32>, tensor<2x4x8x1xf32>, tensor<64xf32>, tensor<4x1x1xf32>) -> tensor<2x4x8x64xf32>
  return %y : tensor<2x4x8x64xf32>
}"""
    from math import erf

    x, r, c, ch = rand(2, 4, 8, 64), rand(2, 4, 8, 1), rand(64), rand(4, 1, 1)
    (y,), em, _ = run(ir_text, [x, r, c, ch], cores=4)
    t = (x - r) * c + ch
    ref = np.vectorize(erf)(np.where(t > 0, t, x)).astype(np.float32)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=2e-6)
    assert em.host_ops == []


ROWWISE = """
func.func @main(%x: tensor<6x8x96xf32>, %g: tensor<96xf32>, %b: tensor<96xf32>) -> (tensor<6x8x96xf32>, tensor<6x8x96xf32>, tensor<6x8x96xf32>, tensor<6x8x1xf32>, tensor<6x8xf32>) {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<6x8x96xf32>) -> tensor<6x8x96xf32>
  %l = "spyre.layernorm"(%x, %g, %b) {axis = 2 : i64, epsilon = 1.0e-05 : f32, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<6x8x96xf32>, tensor<96xf32>, tensor<96xf32>) -> tensor<6x8x96xf32>
  %n = "spyre.rmsnorm"(%x, %g) {epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<6x8x96xf32>, tensor<96xf32>) -> tensor<6x8x96xf32>
  %m = "spyre.reduce"(%x) {dims = array<i64: 2>, kind = "max", keepdim = true} : (tensor<6x8x96xf32>) -> tensor<6x8x1xf32>
  %u = "spyre.reduce"(%x) {dims = array<i64: 2>, kind = "mean", keepdim = false} : (tensor<6x8x96xf32>) -> tensor<6x8xf32>
  return %s, %l, %n, %m, %u : tensor<6x8x96xf32>, tensor<6x8x96xf32>, tensor<6x8x96xf32>, tensor<6x8x1xf32>, tensor<6x8xf32>
}"""


@pytest.mark.parametrize("cores", [1, 3, 32])
def test_rowwise_ops(cores):
    x, g, b = rand(6, 8, 96), rand(96), rand(96)
    s, l, n, m, u = run(ROWWISE, [x, g, b], cores=cores)[0]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(l, (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(n, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(m, x.max(-1, keepdims=True))
    np.testing.assert_allclose(u, x.mean(-1), rtol=1e-5, atol=1e-6)


def test_parameters_fold_and_quantize():
    """Parameters are constants: a transpose and a host region of parameters fold at compile time; an int8
    per-channel quantized weight keeps its codes and is rescaled per column on write-back."""
    ir_text = """
func.func @main(%x: tensor<4x64xf32>, %w: tensor<32x64xf32> {spyre.param = "w"}, %v: tensor<32xf32> {spyre.param = "v"}) -> tensor<4x32xf32> {
  %q = "spyre.cast"(%w) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>} : (tensor<32x64xf32>) -> tensor<32x64xi8>
  %d = "spyre.cast"(%q) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>} : (tensor<32x64xi8>) -> tensor<32x64xf32>
  %t = "spyre.transpose"(%d) {permutation = array<i64: 1, 0>, restickify = true, spyre.const_fold = true} : (tensor<32x64xf32>) -> tensor<64x32xf32>
  %h = "spyre.host"() ({
    %c = arith.constant dense<2.0> : tensor<32xf32>
    %s = arith.mulf %v, %c : tensor<32xf32>
    "spyre.yield"(%s) : (tensor<32xf32>) -> ()
  }) {reason = "test"} : () -> tensor<32xf32>
  %r = "spyre.matmul"(%x, %t, %h) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<4x64xf32>, tensor<64x32xf32>, tensor<32xf32>) -> tensor<4x32xf32>
  return %r : tensor<4x32xf32>
}"""
    x, w, v = rand(4, 64), rand(32, 64), rand(32)
    (y,), em, exe = run(ir_text, [x], cores=2, params={"w": w, "v": v})
    assert em.host_ops == []                                   # everything of parameters folded
    fmts = {b.name: b.fmt.key for b in exe.program.buffers if b.kind == "constant"}
    assert "int8" in fmts.values()
    s = np.abs(w).max(1) / 127
    wq = np.clip(np.rint(w / s[:, None]), -127, 127) * s[:, None]
    np.testing.assert_allclose(y, x @ wq.T + 2 * v, rtol=1e-5, atol=1e-4)


def test_without_params_they_become_inputs():
    ir_text = """
func.func @main(%x: tensor<4x64xf32>, %w: tensor<64x64xf32> {spyre.param = "fc.w"}) -> tensor<4x64xf32> {
  %r = "spyre.matmul"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x64xf32>, tensor<64x64xf32>) -> tensor<4x64xf32>
  return %r : tensor<4x64xf32>
}"""
    x, w = rand(4, 64), rand(64, 64)
    (y,), _, exe = run(ir_text, [x, w], cores=1)
    assert exe.program.inputs == ["in0", "fc.w"]
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-4)


def test_intermediates_share_device_memory():
    """A chain of 8 maps needs two live intermediates at a time: liveness reuse (at the barriers the plan puts
    between them) keeps the slots at two or three, not eight."""
    body = "\n".join(
        f'  %v{i + 1} = "spyre.map"(%v{i}) ({{\n  ^bb0(%a: f32):\n    %c = arith.constant 1.0 : f32\n'
        f'    %s = arith.addf %a, %c : f32\n    "spyre.yield"(%s) : (f32) -> ()\n  }}) '
        f'{{operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 32>, '
        f'spyre.barrier = true}} : (tensor<64x64xf32>) -> tensor<64x64xf32>'
        for i in range(8))
    ir_text = f"func.func @main(%v0: tensor<64x64xf32>) -> tensor<64x64xf32> {{\n{body}\n  return %v8 : tensor<64x64xf32>\n}}"
    x = rand(64, 64)
    (y,), em, exe = run(ir_text, [x], cores=2)
    np.testing.assert_allclose(y, x + 8, rtol=1e-6)
    slots = [b for b in exe.program.buffers if b.name.startswith("slot")]
    assert 1 <= len(slots) <= 3


def test_listing_names_every_instruction():
    (_,), em, exe = run(MATMUL.format(M=8, K=64, N=64, attrs=""), [rand(8, 64), rand(64, 64), rand(64)], cores=2)
    text = codegen.listing(em.b.program())
    n = sum(len(c) for c in exe.program.code)
    assert sum(1 for line in text.splitlines() if line.startswith("  ")) == n
    assert "matmul" in text and "spyre.matmul" in text


def test_data_movement_by_dma():
    """Transposes that keep the innermost dim, slices taking all of it (or whole sticks of it) and concats
    along outer dims are row gathers by DMA on the device; a transpose of the last two dims is a RESTICK
    (device memory to device memory, fenced by barriers); another transpose of the innermost dim stays on
    the host."""
    ir_text = """
func.func @main(%x: tensor<2x3x4x64xf32>, %y: tensor<2x5x4x64xf32>) -> (tensor<2x4x3x64xf32>, tensor<2x2x2x64xf32>, tensor<2x8x4x64xf32>, tensor<2x3x64x4xf32>, tensor<2x3x4x32xf32>, tensor<2x64x4x3xf32>) {
  %t = "spyre.transpose"(%x) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x3x4x64xf32>) -> tensor<2x4x3x64xf32>
  %s = "spyre.slice"(%x) {offsets = array<i64: 0, 1, 0, 0>, sizes = array<i64: 2, 2, 2, 64>, strides = array<i64: 1, 1, 2, 1>} : (tensor<2x3x4x64xf32>) -> tensor<2x2x2x64xf32>
  %c = "spyre.concat"(%x, %y) {dim = 1 : i64} : (tensor<2x3x4x64xf32>, tensor<2x5x4x64xf32>) -> tensor<2x8x4x64xf32>
  %h = "spyre.transpose"(%x) {permutation = array<i64: 0, 1, 3, 2>} : (tensor<2x3x4x64xf32>) -> tensor<2x3x64x4xf32>
  %k = "spyre.slice"(%x) {offsets = array<i64: 0, 0, 0, 32>, sizes = array<i64: 2, 3, 4, 32>, strides = array<i64: 1, 1, 1, 1>} : (tensor<2x3x4x64xf32>) -> tensor<2x3x4x32xf32>
  %p = "spyre.transpose"(%x) {permutation = array<i64: 0, 3, 2, 1>} : (tensor<2x3x4x64xf32>) -> tensor<2x64x4x3xf32>
  return %t, %s, %c, %h, %k, %p : tensor<2x4x3x64xf32>, tensor<2x2x2x64xf32>, tensor<2x8x4x64xf32>, tensor<2x3x64x4xf32>, tensor<2x3x4x32xf32>, tensor<2x64x4x3xf32>
}"""
    x, y = rand(2, 3, 4, 64), rand(2, 5, 4, 64)
    (t, s, c, h, k, p), em, exe = run(ir_text, [x, y], cores=4)
    np.testing.assert_array_equal(k, x[..., 32:])          # whole sticks of the innermost dim: plain DMA
    np.testing.assert_array_equal(t, x.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(s, x[:, 1:3, 0:4:2])
    np.testing.assert_array_equal(c, np.concatenate([x, y], axis=1))
    np.testing.assert_array_equal(h, x.transpose(0, 1, 3, 2))
    np.testing.assert_array_equal(p, x.transpose(0, 3, 2, 1))
    assert em.kernels.count("spyre.transpose") == 2 and len(em.host_ops) == 1
    rst = [r for r in exe.program.code[0] if r["op"] == Op.RESTICK]
    assert len(rst) == 1 and (int(rst[0]["m"]), int(rst[0]["n"]), int(rst[0]["k"])) == (6, 4, 64)


def test_mask_maps_on_the_sfu():
    """i1 masks are 0/1 tiles: comparisons, andi, select and i1<->float conversions stay on the device."""
    ir_text = """
func.func @main(%x: tensor<8x64xf32>, %m: tensor<8x64xi1>) -> (tensor<8x64xi1>, tensor<8x64xf32>) {
  %b = "spyre.map"(%x, %m) ({
  ^bb0(%a: f32, %k: i1):
    %z = arith.constant 0.0 : f32
    %p = arith.cmpf olt, %a, %z : f32
    %q = arith.andi %p, %k : i1
    "spyre.yield"(%q) : (i1) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8x64xi1>) -> tensor<8x64xi1>
  %f = "spyre.map"(%b, %x) ({
  ^bb0(%k: i1, %a: f32):
    %ninf = arith.constant -1.0e+09 : f32
    %s = arith.select %k, %ninf, %a : f32
    %u = arith.uitofp %k : i1 to f32
    %t = arith.addf %s, %u : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xi1>, tensor<8x64xf32>) -> tensor<8x64xf32>
  return %b, %f : tensor<8x64xi1>, tensor<8x64xf32>
}"""
    x, m = rand(8, 64), RNG.random((8, 64)) < 0.5
    (b, f), em, _ = run(ir_text, [x, m], cores=2)
    ref = (x < 0) & m
    np.testing.assert_array_equal(b, ref)
    np.testing.assert_allclose(f, np.where(ref, -1e9, x) + ref, rtol=1e-6)
    assert em.host_ops == []


def test_rowwise_double_buffering_overlaps_dma():
    """With several row tiles per core, inputs and outputs alternate between two tile sets so the next
    tile's DMA overlaps this tile's SFU work: same numbers, fewer modeled cycles than single buffering (a plan
    written by hand: its scratchpad has one buffer per streamed operand)."""
    def ir_text(plan):
        return f"""
func.func @main(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {{
  %y = "spyre.softmax"(%x) {{dim = -1 : i64, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 16>{plan}}} : (tensor<256x256xf32>) -> tensor<256x256xf32>
  return %y : tensor<256x256xf32>
}}"""
    x = rand(256, 256)
    single = ", spyre.scratchpad = {in0 = 0 : i64, out0 = 16384 : i64, xf = 32768 : i64, max = 49152 : i64, " \
             "sum = 49152 : i64}"
    (y1,), _, e1 = run(ir_text(""), [x], cores=1)
    (y2,), _, e2 = run(ir_text(single), [x], cores=1)
    np.testing.assert_array_equal(y1, y2)
    assert e1.profile.cycles < e2.profile.cycles


def test_innermost_data_movement_on_the_pt_array():
    """Slices of the innermost dim at sub-stick offsets, concats along it and reshapes that split or merge it
    are products with 0/1 selection matrices: bit-exact on dlf16 tensors (faithful numerics)."""
    ir_text = """
func.func @main(%x: tensor<2x16x64x!spyre.dlf16>) -> (tensor<2x16x8x!spyre.dlf16>, tensor<2x16x16x!spyre.dlf16>, tensor<2x16x4x16x!spyre.dlf16>, tensor<2x4x256x!spyre.dlf16>) {
  %a = "spyre.slice"(%x) {offsets = array<i64: 0, 0, 8>, sizes = array<i64: 2, 16, 8>, strides = array<i64: 1, 1, 1>} : (tensor<2x16x64x!spyre.dlf16>) -> tensor<2x16x8x!spyre.dlf16>
  %b = "spyre.slice"(%x) {offsets = array<i64: 0, 0, 40>, sizes = array<i64: 2, 16, 8>, strides = array<i64: 1, 1, 1>} : (tensor<2x16x64x!spyre.dlf16>) -> tensor<2x16x8x!spyre.dlf16>
  %c = "spyre.concat"(%b, %a) {dim = 2 : i64} : (tensor<2x16x8x!spyre.dlf16>, tensor<2x16x8x!spyre.dlf16>) -> tensor<2x16x16x!spyre.dlf16>
  %s = "spyre.reshape"(%x) : (tensor<2x16x64x!spyre.dlf16>) -> tensor<2x16x4x16x!spyre.dlf16>
  %m = "spyre.reshape"(%x) : (tensor<2x16x64x!spyre.dlf16>) -> tensor<2x4x256x!spyre.dlf16>
  return %a, %c, %s, %m : tensor<2x16x8x!spyre.dlf16>, tensor<2x16x16x!spyre.dlf16>, tensor<2x16x4x16x!spyre.dlf16>, tensor<2x4x256x!spyre.dlf16>
}"""
    from spyre_mlir.runtime.formats import dlf16_round

    x = dlf16_round(rand(2, 16, 64))
    (a, c, s, m), em, _ = run(ir_text, [x], cores=4, numerics="faithful")
    np.testing.assert_array_equal(a, x[..., 8:16])
    np.testing.assert_array_equal(c, np.concatenate([x[..., 40:48], x[..., 8:16]], axis=-1))
    np.testing.assert_array_equal(s, x.reshape(2, 16, 4, 16))
    np.testing.assert_array_equal(m, x.reshape(2, 4, 256))
    assert em.host_ops == []


def test_head_split_of_whole_sticks_is_an_alias():
    """[16, 256] -> [16, 4, 64] dlf16 (one stick per head) moves no data: the second map reads the first one's bytes in
    place, after a barrier (its rows are not the producer's rows), bit-exact."""
    ir_text = """
func.func @main(%x: tensor<16x256x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16> {
  %a = "spyre.map"(%x) ({
  ^bb0(%e: f32):
    %n = arith.negf %e : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<16x256x!spyre.dlf16>) -> tensor<16x256x!spyre.dlf16>
  %s = "spyre.reshape"(%a) : (tensor<16x256x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  %b = "spyre.map"(%s) ({
  ^bb0(%e: f32):
    %t = arith.addf %e, %e : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<16x4x64x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  return %b : tensor<16x4x64x!spyre.dlf16>
}"""
    from spyre_mlir.runtime.formats import dlf16_round

    x = dlf16_round(rand(16, 256))
    (y,), em, _ = run(ir_text, [x], cores=4, numerics="faithful")
    np.testing.assert_array_equal(y, (-2 * x).reshape(16, 4, 64))
    assert em.host_ops == [] and em.kernels == ["spyre.map", "spyre.map"]


def test_flatten_of_rows_below_a_stick_on_device():
    """A CNN's flatten [1, 64, 8, 8] -> [1, 4096] dlf16: 8-element rows merged 8 at a time into rows of one stick
    (8 selection matrices [8, 64], not 512 of [8, 4096]), the result written as those sticks: exact, on the
    device, and a matmul reads it."""
    ir_text = """
func.func @main(%x: tensor<1x64x8x8x!spyre.dlf16>, %w: tensor<4096x64x!spyre.dlf16>) -> (tensor<1x4096x!spyre.dlf16>, tensor<1x64x!spyre.dlf16>) {
  %f = "spyre.reshape"(%x) : (tensor<1x64x8x8x!spyre.dlf16>) -> tensor<1x4096x!spyre.dlf16>
  %y = "spyre.matmul"(%f, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x4096x!spyre.dlf16>, tensor<4096x64x!spyre.dlf16>) -> tensor<1x64x!spyre.dlf16>
  return %f, %y : tensor<1x4096x!spyre.dlf16>, tensor<1x64x!spyre.dlf16>
}"""
    from spyre_mlir.runtime.formats import dlf16_round

    x, w = dlf16_round(rand(1, 64, 8, 8)), dlf16_round(rand(4096, 64) * 0.05)
    (f, y), em, exe = run(ir_text, [x, w], cores=4, numerics="faithful")
    assert em.host_ops == [] and em.kernels == ["spyre.reshape", "spyre.matmul"]
    np.testing.assert_array_equal(f, x.reshape(1, 4096))
    # The 8 terms of a row tile read rows 8r + h of one operand: one 3-D DMA gathers them all (move.merged_terms),
    # besides the one loading the selections, not a DMA per term.
    loads = [sum(1 for i in s if i.op is Op.DMA_LOAD and "spyre.reshape" in i.loc) for s in exe.steps.streams]
    tiles = [sum(1 for i in s if i.op is Op.MATMUL and "spyre.reshape" in i.loc) // 8 for s in exe.steps.streams]
    assert sum(tiles) > 0 and all(n == (1 + t if t else 0) for n, t in zip(loads, tiles)), (loads, tiles)
    np.testing.assert_allclose(y, x.reshape(1, 4096) @ w, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("rows, cin, cout, width", [(128, 384, 32, 64), (64, 768, 96, 192), (16, 768, 24, 192)])
def test_head_split_into_pieces_of_sticks_reads_rows_of_their_lcm(rows, cin, cout, width):
    """An attention head split of rows of whole sticks into pieces that are not whole sticks, dlf16 (a BERT-style
    [128, 384] -> [128, 12, 32], Phi-3's heads of 96): the operand read as rows of lcm(cout, 64) elements, each
    split by width / cout selection matrices [width, cout] (not cin / cout of [cin, cout]: 12 of [384, 32] take
    576 KB a core, more than a quarter of the scratchpad, so the host did it): exact, on the device."""
    ir_text = f"""
func.func @main(%x: tensor<{rows}x{cin}x!spyre.dlf16>) -> tensor<{rows}x{cin // cout}x{cout}x!spyre.dlf16> {{
  %s = "spyre.reshape"(%x) : (tensor<{rows}x{cin}x!spyre.dlf16>) -> tensor<{rows}x{cin // cout}x{cout}x!spyre.dlf16>
  return %s : tensor<{rows}x{cin // cout}x{cout}x!spyre.dlf16>
}}"""
    x = dlf16_round(rand(rows, cin))
    (y,), em, exe = run(ir_text, [x], cores=4, numerics="faithful")
    np.testing.assert_array_equal(y, x.reshape(rows, cin // cout, cout))
    assert em.host_ops == [] and em.kernels == ["spyre.reshape"]
    mms = [i for s in exe.steps.streams for i in s if i.op is Op.MATMUL]
    assert mms and all(i.mm[1][2] == width and i.mm[2][1:3] == (width, cout) for i in mms), \
        {(i.mm[1][1:3], i.mm[2][1:3]) for i in mms}


@pytest.mark.parametrize("rows, k, cin, width", [(32, 8, 96, 192), (16, 32, 24, 192), (8, 12, 32, 64)])
def test_head_merge_of_pieces_of_sticks_writes_rows_of_their_lcm(rows, k, cin, width):
    """The merge back of heads that are not whole sticks ([32, 8, 96] -> [32, 768] dlf16) writes its result as rows
    of lcm(cin, 64) elements, each merged from width / cin input rows by [cin, width] selection matrices (not 8 of
    [96, 768], 1.2 MB a core, which left it to the host): exact, on the device."""
    ir_text = f"""
func.func @main(%x: tensor<{rows}x{k}x{cin}x!spyre.dlf16>) -> tensor<{rows}x{k * cin}x!spyre.dlf16> {{
  %s = "spyre.reshape"(%x) : (tensor<{rows}x{k}x{cin}x!spyre.dlf16>) -> tensor<{rows}x{k * cin}x!spyre.dlf16>
  return %s : tensor<{rows}x{k * cin}x!spyre.dlf16>
}}"""
    x = dlf16_round(rand(rows, k, cin))
    (y,), em, exe = run(ir_text, [x], cores=4, numerics="faithful")
    np.testing.assert_array_equal(y, x.reshape(rows, k * cin))
    assert em.host_ops == [] and em.kernels == ["spyre.reshape"]
    mms = [i for s in exe.steps.streams for i in s if i.op is Op.MATMUL]
    assert mms and all(i.mm[2][1:3] == (cin, width) for i in mms), {i.mm[2][1:3] for i in mms}


def test_pooling_and_suffix_reductions_on_device():
    """Max/avg pooling (row gathers + selection matmuls + SFU max/add) and a mean over the trailing (H, W)
    dims (rows combined in fp32, then one row reduction); dlf16 data, exact selection, one rounding."""
    ir_text = """
func.func @main(%x: tensor<1x4x8x8x!spyre.dlf16>) -> (tensor<1x4x4x4x!spyre.dlf16>, tensor<1x4x3x3x!spyre.dlf16>, tensor<1x4x1x1xf32>) {
  %m = "spyre.pool2d"(%x) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x4x8x8x!spyre.dlf16>) -> tensor<1x4x4x4x!spyre.dlf16>
  %a = "spyre.pool2d"(%x) {kernel = array<i64: 3, 3>, kind = "avg", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x4x8x8x!spyre.dlf16>) -> tensor<1x4x3x3x!spyre.dlf16>
  %r = "spyre.reduce"(%x) {dims = array<i64: 2, 3>, kind = "mean", keepdim = true} : (tensor<1x4x8x8x!spyre.dlf16>) -> tensor<1x4x1x1xf32>
  return %m, %a, %r : tensor<1x4x4x4x!spyre.dlf16>, tensor<1x4x3x3x!spyre.dlf16>, tensor<1x4x1x1xf32>
}"""
    from spyre_mlir.runtime.formats import dlf16_round

    x = dlf16_round(rand(1, 4, 8, 8))
    (m, a, r), em, _ = run(ir_text, [x], cores=4, numerics="faithful")
    np.testing.assert_array_equal(m, x.reshape(1, 4, 4, 2, 4, 2).max(axis=(3, 5)))
    avg = np.mean([x[:, :, i:i + 5:2, j:j + 5:2] for i in range(3) for j in range(3)], axis=0)
    np.testing.assert_allclose(a, avg, rtol=2.0**-10, atol=1e-6)    # fp32 window sum, one dlf16 rounding
    np.testing.assert_allclose(r, x.mean(axis=(2, 3), keepdims=True), rtol=1e-6, atol=1e-6)
    assert em.host_ops == []
    # Each pool's column selections are one stacked constant that a core loads with one DMA.
    from spyre_mlir.runtime.isa import Op

    prog = em.b.program()
    sels = [(b.addr, b.addr + b.nbytes) for b in prog.buffers if b.name.startswith("select")]
    assert len(sels) == 2
    per_core = [[int(((c["dev"] >= lo) & (c["dev"] < hi) & (c["op"] == Op.DMA_LOAD)).sum()) for lo, hi in sels]
                for c in prog.code]
    assert max(map(max, per_core)) == 1 and all(sum(n) >= 1 for n in zip(*per_core))


CONV = """
func.func @main(%x: tensor<2x{C}x9x10x!spyre.dlf16>, %w: tensor<{F}x{CG}x3x3x!spyre.dlf16> {{spyre.param = "w"}}, %b: tensor<{F}x!spyre.dlf16> {{spyre.param = "b"}}) -> tensor<2x{F}x{OH}x{OW}x!spyre.dlf16> {{
  %r = "spyre.conv2d"(%x, %w, %b) {{dilations = array<i64: {D}, {D}>, groups = {G} : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: {P}>, strides = array<i64: {S}, {S}>{PLAN}}} : (tensor<2x{C}x9x10x!spyre.dlf16>, tensor<{F}x{CG}x3x3x!spyre.dlf16>, tensor<{F}x!spyre.dlf16>) -> tensor<2x{F}x{OH}x{OW}x!spyre.dlf16>
  return %r : tensor<2x{F}x{OH}x{OW}x!spyre.dlf16>
}}"""


@pytest.mark.parametrize("C, F, G, S, D, P, plan", [
    (3, 8, 1, 2, 1, (1, 1, 1, 1), ""),
    (4, 4, 4, 1, 1, (1, 1, 1, 1), ""),
    (5, 16, 1, 1, 2, (2, 0, 1, 3), ""),                                                 # dilated: per kernel row
    (16, 16, 16, 1, 1, (0, 2, 1, 1), ", spyre.grid = array<i64: 1, 2, 2>, spyre.tile = array<i64: 1, 8, 2>"),
    (6, 16, 1, 2, 1, (1, 1, 1, 1), ", spyre.grid = array<i64: 2, 1, 1>, spyre.tile = array<i64: 1, 8, 1>"),
])
def test_conv2d_on_the_pt_array(C, F, G, S, D, P, plan):
    """conv2d as an implicit GEMM on the PT array (groups 1, and depthwise with block-diagonal filters), the
    input columns read through MATMUL windows; padding (asymmetric too), stride, dilation, and hand-written
    grids and tiles (several filter tiles, images and row blocks per core); fp32 accumulation and one rounding:
    |err| <= 2^-9 * sum |x||w| (dlf16 weights and output) on dlf16 inputs."""
    from spyre_mlir.runtime.formats import dlf16_round

    from spyre_mlir.runtime.hostprog import _conv2d

    OH, OW = (9 + P[0] + P[2] - D * 2 - 1) // S + 1, (10 + P[1] + P[3] - D * 2 - 1) // S + 1
    x = dlf16_round(rand(2, C, 9, 10))
    w, bias = rand(F, C // G, 3, 3), rand(F)
    ir_text = CONV.format(C=C, F=F, CG=C // G, G=G, S=S, D=D, P=", ".join(map(str, P)), OH=OH, OW=OW, PLAN=plan)
    (y,), em, _ = run(ir_text, [x], cores=4, params={"w": w, "b": bias}, numerics="faithful")
    assert em.host_ops == []
    attrs = {"strides": [S, S], "dilations": [D, D], "padding": list(P), "groups": G}
    wq, bq = dlf16_round(w), dlf16_round(bias)
    ref = _conv2d(x, wq, bq, attrs)
    bound = 2.0**-9 * (_conv2d(np.abs(x), np.abs(wq), np.abs(bq), attrs)) + 1e-6
    assert np.all(np.abs(y - ref) <= bound)


def test_conv_shares_its_filters_over_the_ring():
    """With one filter tile per core, the cores of a filter block read the filters and bias from device memory
    once: each loads a part and multicasts it. On 3 cores (two images each: the 1-core program's patches) the
    program reads exactly the bytes the 1-core program reads, the rest crosses the ring; on 6 (one tile a core) the
    rows neighbouring patches share are read once too: per image, 9 input rows instead of the 1-core program's
    4 + 5 + 4 (its three row tiles' patches, halos included) x 8 channels x 128 B. Bit-identical results."""
    x, w, bias = dlf16_round(rand(2, 8, 9, 10)), rand(16, 8, 3, 3), rand(16)
    reads, outs = {}, {}
    for g in [(1, 1, 1), (1, 1, 3), (2, 1, 3)]:
        plan = f", spyre.grid = array<i64: {', '.join(map(str, g))}>, spyre.tile = array<i64: 1, 16, 3>"
        text = CONV.format(C=8, F=16, CG=8, G=1, S=1, D=1, P="1, 1, 1, 1", OH=9, OW=10, PLAN=plan)
        (outs[g],), _, exe = run(text, [x], cores=6, params={"w": w, "b": bias}, numerics="faithful")
        reads[g] = (exe.static_profile.dram_read_bytes, exe.static_profile.ring_bytes > 0)
    assert reads[(1, 1, 3)] == (reads[(1, 1, 1)][0], True)
    assert reads[(2, 1, 3)] == (reads[(1, 1, 1)][0] - 2 * (13 - 9) * 8 * 128, True)
    assert np.array_equal(outs[(1, 1, 3)], outs[(1, 1, 1)]) and np.array_equal(outs[(2, 1, 3)], outs[(1, 1, 1)])



def test_conv_with_one_tile_a_core_loads_its_patch_with_the_filters():
    """Sharing its filters, with one tile a core, the conv kernel loads every core's patch before the barrier that
    delivers the filters, so the segment after it only computes and stores: no segment mixes device-memory reads
    and writes. Same result as the one-core kernel."""
    x, w, bias = dlf16_round(rand(2, 8, 9, 10)), rand(16, 8, 3, 3), rand(16)
    outs = {}
    for g in [(1, 1, 1), (2, 1, 3)]:
        plan = f", spyre.grid = array<i64: {', '.join(map(str, g))}>, spyre.tile = array<i64: 1, 16, 3>"
        text = CONV.format(C=8, F=16, CG=8, G=1, S=1, D=1, P="1, 1, 1, 1", OH=9, OW=10, PLAN=plan)
        (outs[g],), _, exe = run(text, [x], cores=6, params={"w": w, "b": bias}, numerics="faithful")
    assert np.array_equal(outs[(2, 1, 3)], outs[(1, 1, 1)])
    for code in exe.program.code:
        ops = [Op(o) for o in code["op"]]
        barrier = ops.index(Op.BARRIER)
        assert ops[:barrier].count(Op.DMA_LOAD) >= 2 and Op.DMA_STORE not in ops[:barrier]
        assert Op.DMA_LOAD not in ops[barrier:] and Op.DMA_STORE in ops[barrier:]

@pytest.mark.parametrize("bias", [True, False])
def test_conv_applies_its_relu_before_the_store(bias):
    """A ReLU map whose input is a conv2d's only use (and which device ops read) is the conv kernel's epilogue
    (kernel "epilogue"): no map kernel runs for it and the result is bit-identical to the map run on its own
    (there the conv result is also returned, so it has two readers and stays a separate kernel). The kernel
    applies it to the fp32 accumulator, rounding once (relu(round(x)) is round(relu(x))), with a bias or not."""
    relu = """
  %y = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.0 : f32
    %c = arith.cmpf ugt, %a, %z : f32
    %s = arith.select %c, %a, %z : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x16x9x10x!spyre.dlf16>) -> tensor<2x16x9x10x!spyre.dlf16>
  %n = "spyre.map"(%y) ({
  ^bb0(%a: f32):
    %m = arith.negf %a : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x16x9x10x!spyre.dlf16>) -> tensor<2x16x9x10x!spyre.dlf16>"""
    conv = CONV.format(C=8, F=16, CG=8, G=1, S=1, D=1, P="1, 1, 1, 1", OH=9, OW=10, PLAN="")
    if not bias:
        for a, b in ((', %b: tensor<16x!spyre.dlf16> {spyre.param = "b"}', ""), ("(%x, %w, %b)", "(%x, %w)"),
                     ("array<i32: 1, 1, 1>", "array<i32: 1, 1, 0>"), (", tensor<16x!spyre.dlf16>) ->", ") ->")):
            assert a in conv
            conv = conv.replace(a, b)
    t = "tensor<2x16x9x10x!spyre.dlf16>"
    fused = conv.replace("  return %r", relu + "\n  return %n")
    apart = conv.replace(f"-> {t} {{", f"-> ({t}, {t}) {{").replace(
        f"  return %r : {t}", relu + f"\n  return %r, %n : {t}, {t}")
    from spyre_mlir.runtime.formats import dlf16_round

    x, w, b = dlf16_round(rand(2, 8, 9, 10)), rand(16, 8, 3, 3), rand(16)
    p = {"w": w, "b": b} if bias else {"w": w}
    (yf,), emf, _ = run(fused, [x], cores=4, params=p, numerics="faithful")
    (r, yu), emu, _ = run(apart, [x], cores=4, params=p, numerics="faithful")
    assert emf.kernels == ["spyre.conv2d", "spyre.map"] and emu.kernels == ["spyre.conv2d", "spyre.map", "spyre.map"]
    assert np.array_equal(yf, yu) and np.array_equal(yu, -np.maximum(r, 0)) and (yu == 0).any()


@pytest.mark.parametrize("pool", [True, False])
def test_conv_with_one_tile_a_core_stores_it_in_pieces(pool, monkeypatch):
    """A conv whose cores hold one tile each computes and stores it in pieces of whole pool windows
    (cost.conv_pieces), each piece's store behind the next piece's products: the bits of the tile done whole,
    in fewer modeled cycles."""
    import torch

    import spyre_mlir
    from spyre_mlir import cost
    from spyre_mlir.runtime.isa import Op

    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU()] + [torch.nn.MaxPool2d(2)] * pool
    model, x = torch.nn.Sequential(*layers).eval(), torch.randn(1, 3, 64, 64)
    runs = {}
    for pieces in (True, False):
        if not pieces:
            monkeypatch.setattr(cost, "conv_pieces", lambda k, tile, *a: ((0, tile[2]),))
        exe = spyre_mlir.compile(model, (x,), cores=16, cache_dir=False)
        stores = collections.Counter(s.core for s in exe.steps if getattr(s, "op", None) is Op.DMA_STORE)
        runs[pieces] = (exe(x)[0], exe.static_profile.cycles, max(stores.values()))
    (y, c, n), (y0, c0, n0) = runs[True], runs[False]
    assert np.array_equal(y, y0) and c < c0 and n > n0


@pytest.mark.parametrize("kind, window, relu, cores", [("max", (3, 2), True, 4), ("avg", (3, 2), False, 3),
                                                       ("max", (3, 5), False, 1), ("avg", (1, 2), True, 2)])
def test_conv_applies_its_pool_before_the_store(kind, window, relu, cores):
    """A non-overlapping pool of a conv's output (through its ReLU epilogue or directly) is applied by the conv
    kernel (kernel "epilogue"): no pool kernel runs and the full-size output is never stored, and the result is
    bit-identical to the pool2d kernel run apart (there the conv result is also returned)."""
    t = "tensor<2x16x9x10x!spyre.dlf16>"
    ph, pw = window
    pt = f"tensor<2x16x{9 // ph}x{10 // pw}x!spyre.dlf16>"
    src = "%r"
    body = ""
    if relu:
        body = f"""
  %y = "spyre.map"(%r) ({{
  ^bb0(%a: f32):
    %z = arith.constant 0.0 : f32
    %m = arith.maximumf %a, %z : f32
    "spyre.yield"(%m) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>}} : ({t}) -> {t}"""
        src = "%y"
    body += (f'\n  %p = "spyre.pool2d"({src}) {{kind = "{kind}", kernel = array<i64: {ph}, {pw}>, strides = '
             f'array<i64: {ph}, {pw}>}} : ({t}) -> {pt}')
    conv = CONV.format(C=8, F=16, CG=8, G=1, S=1, D=1, P="1, 1, 1, 1", OH=9, OW=10, PLAN="")
    fused = conv.replace(f"-> {t} {{", f"-> {pt} {{").replace(f"  return %r : {t}", body + f"\n  return %p : {pt}")
    apart = conv.replace(f"-> {t} {{", f"-> ({t}, {pt}) {{").replace(
        f"  return %r : {t}", body + f"\n  return %r, %p : {t}, {pt}")
    from spyre_mlir.runtime.formats import dlf16_round

    x, w, bias = dlf16_round(rand(2, 8, 9, 10)), rand(16, 8, 3, 3), rand(16)
    p = {"w": w, "b": bias}
    (yf,), emf, exf = run(fused, [x], cores=cores, params=p, numerics="faithful")
    (r, yu), emu, _ = run(apart, [x], cores=cores, params=p, numerics="faithful")
    assert emf.kernels == ["spyre.conv2d"]
    assert emu.kernels == ["spyre.conv2d"] + ["spyre.map"] * relu + ["spyre.pool2d"]
    assert np.array_equal(yf, yu)
    win = (np.maximum(r, 0) if relu else r).reshape(2, 16, 9 // ph, ph, 10 // pw, pw)
    ref = win.max(axis=(3, 5)) if kind == "max" else dlf16_round(win.mean(axis=(3, 5), dtype=np.float64))
    assert np.allclose(yf, ref, rtol=2.0**-8, atol=1e-6)
    # The conv's full-size output never goes to device memory: the stores write the pooled rows (a stick each).
    assert exf.static_profile.dram_write_bytes == 2 * 16 * (9 // ph) * 128
    # The pool's column selections are one stacked constant: a core loads (its part of) it with one DMA.
    from spyre_mlir.runtime.isa import Op

    prog = emf.b.program()
    (lo, hi), = [(b.addr, b.addr + b.nbytes) for b in prog.buffers if b.name.endswith(".psel")]
    assert max(int(((c["dev"] >= lo) & (c["dev"] < hi) & (c["op"] == Op.DMA_LOAD)).sum()) for c in prog.code) == 1


@pytest.mark.parametrize("safe, mask, cores", [(False, False, 4), (True, True, 4), (True, False, 1), (False, True, 3)])
def test_batch_matmul_applies_its_softmax_before_the_store(safe, mask, cores):
    """Attention scores: a softmax over the last dim of a batch_matmul's result (after its mask-add epilogue) is
    applied by the matmul kernel to each whole-row output tile (kernel "epilogue"): no softmax kernel runs and
    the result is bit-identical to the softmax kernel run apart (there the scores are also returned). A masked
    row (-inf everywhere) gives zeros with a safe softmax. (A device map reads the probabilities, as attention's
    PV matmul does: a returned value has an output buffer of its own.)"""
    t = "tensor<4x32x64x!spyre.dlf16>"
    mask_map = f"""
  %m = "spyre.map"(%r, %k) ({{
  ^bb0(%a: f32, %c: f32):
    %s = arith.addf %a, %c : f32
    "spyre.yield"(%s) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 1, 0, 0>}} : ({t}, tensor<1x32x64xf32>) -> {t}""" if mask else ""
    src = "%m" if mask else "%r"
    safe_attr = ", safe = true" if safe else ""
    body = f"""{mask_map}
  %p = "spyre.softmax"({src}) {{acc_type = f32, dim = 2 : i64{safe_attr}}} : ({t}) -> {t}
  %n = "spyre.map"(%p) ({{
  ^bb0(%a: f32):
    %x = arith.negf %a : f32
    "spyre.yield"(%x) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>}} : ({t}) -> {t}"""
    head = (f'func.func @main(%q: tensor<4x32x16x!spyre.dlf16>, %kt: tensor<4x64x16x!spyre.dlf16>, '
            f'%k: tensor<1x32x64xf32>) -> RES {{\n'
            f'  %r = "spyre.batch_matmul"(%q, %kt) {{acc_type = f32, transpose_rhs = true}} : '
            f'(tensor<4x32x16x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>) -> {t}')
    fused = head.replace("RES", t) + body + f"\n  return %n : {t}\n}}"
    apart = head.replace("RES", f"({t}, {t})") + body + f"\n  return %r, %n : {t}, {t}\n}}"
    q, kt = dlf16_round(rand(4, 32, 16)), dlf16_round(rand(4, 64, 16))
    k = np.where(RNG.random((1, 32, 64)) < 0.3, -np.inf, 0.0).astype(np.float32)
    k[0, 5] = -np.inf                                   # one fully masked row
    (yf,), emf, _ = run(fused, [q, kt, k], cores=cores, numerics="faithful")
    (r, yu), emu, _ = run(apart, [q, kt, k], cores=cores, numerics="faithful")
    assert emf.kernels == ["spyre.batch_matmul", "spyre.map"]
    assert emu.kernels[-2:] == ["spyre.softmax", "spyre.map"]
    assert np.array_equal(yf, yu)
    yf = -yf
    np.testing.assert_allclose(yf.sum(-1)[:, [i for i in range(32) if not (mask and safe and i == 5)]], 1.0,
                               atol=3e-2)
    if mask and safe:
        assert (yf[:, 5] == 0).all()


@pytest.mark.parametrize("grid", ["", ", spyre.grid = array<i64: 1, 2, 1>, spyre.tile = array<i64: 32, 64, 256>",
                                  ", spyre.grid = array<i64: 1, 1, 2>, spyre.tile = array<i64: 32, 128, 128>"])
def test_matmul_applies_its_tanh_before_the_store(grid):
    """The same epilogue on a matmul (one core, an N split sharing operands over the ring, a K split reduced on
    the group root): the map's tanh is applied to each output tile; bit-identical to the map run apart."""
    t = "tensor<32x128x!spyre.dlf16>"
    mg = ", spyre.grid = array<i64: 1>, spyre.tile = array<i64: 32>" if grid else ""    # a plan by hand for all
    body = f"""
  %y = "spyre.map"(%r) ({{
  ^bb0(%a: f32):
    %s = math.tanh %a : f32
    "spyre.yield"(%s) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>{mg}}} : ({t}) -> {t}
  %n = "spyre.map"(%y) ({{
  ^bb0(%a: f32):
    %m = arith.negf %a : f32
    "spyre.yield"(%m) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>{mg}}} : ({t}) -> {t}"""
    head = (f'  %r = "spyre.matmul"(%x, %w) {{acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>{grid}}} : '
            f'(tensor<32x256x!spyre.dlf16>, tensor<256x128x!spyre.dlf16>) -> {t}')
    sig = "func.func @main(%x: tensor<32x256x!spyre.dlf16>, %w: tensor<256x128x!spyre.dlf16>)"
    fused = f"{sig} -> {t} {{\n{head}{body}\n  return %n : {t}\n}}"
    apart = f"{sig} -> ({t}, {t}) {{\n{head}{body}\n  return %r, %n : {t}, {t}\n}}"
    from spyre_mlir.runtime.formats import dlf16_round

    x, w = dlf16_round(rand(32, 256)), dlf16_round(rand(256, 128) * 0.1)
    (yf,), emf, _ = run(fused, [x, w], cores=4, numerics="faithful")
    (r, yu), emu, _ = run(apart, [x, w], cores=4, numerics="faithful")
    assert emf.kernels == ["spyre.matmul", "spyre.map"] and len(emu.kernels) == 3
    assert np.array_equal(yf, yu)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_fused_casts_are_bit_identical(tmp_path, monkeypatch, kind):
    """spyre-fuse folds the input cast and the result cast into the matmul kernel, and the input cast into a conv
    kernel: same bits as the unfused program (faithful dlf16 numerics), less device-memory traffic and fewer
    modeled cycles."""
    import torch

    import spyre_mlir
    import spyre_mlir.pipeline as pipeline
    from spyre_mlir.frontend import import_model

    torch.manual_seed(0)
    if kind == "linear":
        model, x = torch.nn.Linear(256, 128, bias=False).eval(), torch.randn(64, 256)
    else:
        model, x = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU()).eval(), \
            torch.randn(1, 3, 32, 32)
    imported = import_model(model, (x,))
    fused_pipeline = pipeline.kernel_pipeline
    runs = {}
    for fuse in (True, False):
        if not fuse:
            monkeypatch.setattr(pipeline, "kernel_pipeline",
                                lambda *a, **k: fused_pipeline(*a, **k).replace("spyre-fuse,", ""))
        exe = spyre_mlir.compile(imported, precision="dlf16", cores=4, cache_dir=tmp_path / str(fuse))
        (y,) = exe(x)
        runs[fuse] = (np.asarray(y, np.float32), exe.profile)
    (yf, pf), (yu, pu) = runs[True], runs[False]
    assert np.array_equal(yf.view(np.uint32), yu.view(np.uint32))
    assert pf.dram_read_bytes + pf.dram_write_bytes < pu.dram_read_bytes + pu.dram_write_bytes
    assert pf.cycles < pu.cycles


@pytest.mark.parametrize("tile, early", [((16, 64, 256), True),     # one output tile and K step per core
                                         ((16, 64, 128), True),     # two K steps: the last step's fetch
                                         ((8, 64, 128), True),      # two tiles of two K steps per core
                                         ((8, 64, 256), False)])    # two tiles of one double-buffered K step
def test_write_back_operands_load_with_the_last_k_step(tile, early):
    """A shared-operand matmul loads its tile's bias and the epilogue's further inputs (a residual here) with the
    operands of the tile's last K step, a segment before its multiply, instead of stalling the epilogue; not where
    the single buffer of those operands is still read by the previous tile's epilogue in that segment (one
    double-buffered K step per tile). Same results either way."""
    M, K, N = 32, 256, 128
    t = f"tensor<{M}x{N}xf32>"
    text = f"""
func.func @main(%a: tensor<{M}x{K}xf32>, %b: tensor<{K}x{N}xf32>, %bias: tensor<{N}xf32>, %res: {t}) -> {t} {{
  %r = "spyre.matmul"(%a, %b, %bias) {{operandSegmentSizes = array<i32: 1, 1, 1>, spyre.grid = array<i64: 2, 2, 1>,
      spyre.tile = array<i64: {', '.join(map(str, tile))}>}} : (tensor<{M}x{K}xf32>, tensor<{K}x{N}xf32>, tensor<{N}xf32>) -> {t}
  %y = "spyre.map"(%r, %res) ({{
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 32>}}
      : ({t}, {t}) -> {t}
  %n = "spyre.map"(%y) ({{
  ^bb0(%p: f32):
    %m = arith.negf %p : f32
    "spyre.yield"(%m) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 32>}}
      : ({t}) -> {t}
  return %n : {t}
}}"""
    a, b, bias, res = rand(M, K), rand(K, N), rand(N), rand(M, N)
    (y,), em, exe = run(text, [a, b, bias, res], cores=4)
    assert exe.static_profile.dram_write_bytes == 2 * M * N * 4    # the add is the matmul's epilogue
    np.testing.assert_allclose(-y, a @ b + bias + res, rtol=1e-5, atol=1e-4)
    res_buf = next(buf for buf in exe.program.buffers if buf.name == exe.program.inputs[3])
    for code in exe.program.code:
        ops = [Op(o) for o in code["op"]]
        loads = [i for i, (op, d) in enumerate(zip(ops, code["dev"]))
                 if op is Op.DMA_LOAD and res_buf.addr <= d < res_buf.addr + res_buf.nbytes]
        # The epilogue's add reads the residual tile where it was loaded: a barrier between says a segment ahead.
        reader = [next(j for j in range(i, len(ops)) if ops[j] is Op.SFU and code["a0"][i] in
                       (code["a1"][j], code["a2"][j])) for i in loads]
        ahead = [Op.BARRIER in ops[i:j] for i, j in zip(loads, reader)]
        assert loads and all(ahead) == early


def test_rows_kernel_with_one_tile_a_core_loads_then_stores():
    """A row-wise kernel that gives each core one tile runs in two phases: every core's loads, a barrier, then
    every core's work and stores, so no barrier segment mixes device-memory reads and writes (each moves at the
    read or write bandwidth). Same values as the same op streamed in smaller tiles."""
    def ir_text(tile):
        t = "tensor<128x256xf32>"
        return f"""
func.func @main(%x: {t}) -> {t} {{
  %y = "spyre.softmax"(%x) {{dim = -1 : i64, spyre.grid = array<i64: 4>, spyre.tile = array<i64: {tile}>}} : ({t}) -> {t}
  return %y : {t}
}}"""
    x = rand(128, 256)
    (phased,), _, exe = run(ir_text(32), [x], cores=4)
    (streamed,), _, _ = run(ir_text(8), [x], cores=4)
    np.testing.assert_array_equal(phased, streamed)
    for code in exe.program.code:
        ops = [Op(o) for o in code["op"]]
        barrier = ops.index(Op.BARRIER)
        assert Op.DMA_LOAD in ops[:barrier] and Op.DMA_STORE not in ops[:barrier]
        assert Op.DMA_LOAD not in ops[barrier:] and Op.DMA_STORE in ops[barrier:]


def test_attention_mask_is_read_once_for_all_heads():
    """A batched matmul whose epilogue adds a mask every batch (head) shares, on a grid of one head per core group
    and one output tile per core: the cores at one grid position of all groups load a part of the mask block each
    and multicast it, so device memory sees the mask once instead of once per head (its row block: 8 KB, not 32);
    bit-identical to the same tiles on two groups of two heads each (mask read per head)."""
    t = "tensor<4x32x64x!spyre.dlf16>"
    ROWS = ", spyre.grid = array<i64: 1>, spyre.tile = array<i64: 128>"
    text = f"""
func.func @main(%q: tensor<4x32x16x!spyre.dlf16>, %kt: tensor<4x64x16x!spyre.dlf16>, %k: tensor<1x32x64xf32>) -> {t} {{
  %r = "spyre.batch_matmul"(%q, %kt) {{acc_type = f32, transpose_rhs = true{{GRID}}}} : (tensor<4x32x16x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>) -> {t}
  %m = "spyre.map"(%r, %k) ({{
  ^bb0(%a: f32, %c: f32):
    %s = arith.addf %a, %c : f32
    "spyre.yield"(%s) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 1, 0, 0>{ROWS}}} : ({t}, tensor<1x32x64xf32>) -> {t}
  %n = "spyre.map"(%m) ({{
  ^bb0(%a: f32):
    %x = arith.negf %a : f32
    "spyre.yield"(%x) : (f32) -> ()
  }}) {{operandSegmentSizes = array<i32: 1, 0, 0, 0>{ROWS}}} : ({t}) -> {t}
  return %n : {t}
}}"""
    q, kt = dlf16_round(rand(4, 32, 16)), dlf16_round(rand(4, 64, 16))
    k = np.where(RNG.random((1, 32, 64)) < 0.3, -np.inf, 0.0).astype(np.float32)
    out, reads = {}, {}
    for groups in (4, 2):
        grid = f", spyre.grid = array<i64: {groups}, 2, 1, 1>, spyre.tile = array<i64: 1, 16, 64, 16>"
        (out[groups],), em, exe = run(text.replace("{GRID}", grid), [q, kt, k], cores=8, numerics="faithful")
        assert em.kernels == ["spyre.batch_matmul", "spyre.map"]       # the mask add is the epilogue
        reads[groups] = exe.static_profile.dram_read_bytes
    assert np.array_equal(out[4], out[2])
    assert reads[2] - reads[4] == 3 * 32 * 64 * 4


def test_remembered_answers_last_one_read_only_block():
    """codegen.common.remembered: inside the outermost ``remembering()`` block an op's answer is computed once
    (nested blocks share it); outside any block, and in another thread, it is computed again."""
    import threading

    from torch_mlir import ir

    from spyre_mlir.codegen.common import remembered, remembering

    calls = []

    @remembered
    def answer(op):
        calls.append(op)
        return len(calls)

    with make_context():
        module = ir.Module.parse("func.func @f() { return }")
        op = module.body.operations[0]
        assert answer(op) == 1 and answer(op) == 2                 # no block: every call computes
        with remembering():
            assert answer(op) == 3
            with remembering():
                assert answer(op) == 3                             # the outer block's answer
            assert answer(op) == 3
            other = []
            t = threading.Thread(target=lambda: other.append(answer(op)))
            t.start()
            t.join()
            assert other == [4]                                    # another thread's blocks are its own
        assert answer(op) == 5                                     # forgotten when the block ends


def test_emission_reads_the_ir_and_works_out_each_op_model_once(monkeypatch):
    """The emitter never changes the IR, so what it asks of an op (its model, whether it is a matmul's epilogue, a
    softmax, a sibling...), asked by every kernel near it, is worked out once per op (codegen.emit remembers): a
    transformer block's kernel IR prints the same after emission, and no op's model is made twice."""
    torch = pytest.importorskip("torch")
    from spyre_mlir.compiler import emit, prepare_module, run_stage
    from spyre_mlir.frontend import import_model
    from spyre_mlir.passes import op_model
    from spyre_mlir.pipeline import graph_pipeline, kernel_pipeline
    from test_compile_e2e import _example

    model, x = _example("transformer")
    with torch.no_grad():
        imported = import_model(model, x)
    with make_context():
        module = prepare_module(imported)
        run_stage(module, graph_pipeline(), "graph pipeline")
        run_stage(module, kernel_pipeline("dlf16", 8), "kernel pipeline")
        before = str(module)
        made = collections.Counter()

        def counted(fn):
            def model_of(op):
                made[op] += 1
                return fn(op)
            return model_of
        for kind, fn in list(op_model._MODELS.items()):
            monkeypatch.setitem(op_model._MODELS, kind, counted(fn))
        emit(module, load_target(cores=8))
        assert str(module) == before
    assert made and max(made.values()) == 1, [(op.name, n) for op, n in made.items() if n > 1][:5]
