"""The analytical cost model (spyre_mlir/cost.py): packing, work division, tiles, and agreement with the
runtime's cycle model on the reference matmul kernel."""

import collections
import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_mlir import cost
from spyre_mlir.runtime.isa import tile_bytes
from spyre_mlir.target import load_target

T = load_target()


def _best(M, N, K, cores, fmt="dlf16"):
    """(grid, tile, nbuf, cycles) the way spyre-divide-work and spyre-tile choose them."""
    grid = cost.best_matmul_grid(M, N, K, cores, T, fmt)
    gm, gn, gk = grid
    tile, nbuf, _ = cost.best_tile(M // gm, N // gn, K // gk, T, fmt, split_k=gk, active=gm * gn * gk)
    return grid, tile, nbuf, cost.matmul_cycles(M, N, K, grid, tile, T, fmt, double_buffer=nbuf == 2)


# ---- packing ----------------------------------------------------------------------------------------------


def test_pack_aligns_and_reuses_dead_buffers():
    bufs = [cost.Buffer("x", 100, 0, 9), cost.Buffer("t1", 300, 1, 2), cost.Buffer("t2", 200, 3, 4),
            cost.Buffer("t3", 50, 2, 3)]
    offsets, peak = cost.pack(bufs, 128)
    assert all(off % 128 == 0 for off in offsets.values())
    assert offsets["t2"] == offsets["t1"]            # t1 is dead before t2 is born
    assert offsets["t3"] not in (offsets["t1"], offsets["x"])   # t3 overlaps both in time
    assert peak == 128 + 384 + 128


def test_pack_never_overlaps_live_buffers():
    bufs = [cost.Buffer(f"b{i}", 1000 + 77 * i, i % 3, i % 3 + 2) for i in range(12)]
    offsets, peak = cost.pack(bufs, 128)
    for a in bufs:
        for b in bufs:
            if a is not b and a.first <= b.last and b.first <= a.last:
                lo_a, lo_b = offsets[a.name], offsets[b.name]
                assert lo_a + a.nbytes <= lo_b or lo_b + b.nbytes <= lo_a
    assert peak <= sum(-(-b.nbytes // 128) * 128 for b in bufs)


# ---- matmul -----------------------------------------------------------------------------------------------


def test_1024_cubed_on_32_cores_vs_one():
    g1, _, _, one = _best(1024, 1024, 1024, 1)
    g32, _, _, many = _best(1024, 1024, 1024, 32)
    assert g1 == (1, 1, 1)
    # One core is compute-bound (1024^3 / 1536 MAC/cycle ~ 700k cycles). Across cores DRAM bandwidth is
    # shared; the cores of a grid row share A tiles and those of a grid column B tiles over the ring, so
    # device memory sees A and B once (4 MiB) and the result once (2 MiB): ~42k cycles at 150 GB/s, which
    # is what bounds the card (the PT work alone would take ~22k). Every core is used.
    assert 690_000 < one.total < 720_000
    assert g32[0] * g32[1] * g32[2] == 32 and g32[2] == 1
    assert 13 < one.total / many.total < 17
    # The PT work itself divides by the cores in use.
    pt_per_core = cost.matmul_cycles(1024, 1024, 1024, (4, 8, 1), (256, 128, 64), T).pt
    assert one.pt / pt_per_core == pytest.approx(32, rel=0.02)
    assert many.dma > many.pt


def test_compute_bound_when_bandwidth_is_not_shared():
    """With DRAM bandwidth to spare, 32 cores give ~32x: what limits the card is bytes, not the search."""
    fast = dataclasses.replace(T, dram_mixed_gbps=1e6, dram_read_gbps=1e6, dram_write_gbps=1e6)
    one = cost.matmul_cycles(1024, 1024, 1024, (1, 1, 1), (256, 256, 512), fast)
    grid = cost.best_matmul_grid(1024, 1024, 1024, 32, fast)
    assert grid[0] * grid[1] * grid[2] == 32
    gm, gn, gk = grid
    tile, nbuf, _ = cost.best_tile(1024 // gm, 1024 // gn, 1024 // gk, fast, split_k=gk, active=32)
    many = cost.matmul_cycles(1024, 1024, 1024, grid, tile, fast, double_buffer=nbuf == 2)
    assert 25 < one.total / many.total <= 32


def test_k_split_only_when_m_and_n_cannot_use_the_cores():
    assert cost.best_matmul_grid(1024, 1024, 1024, 32, T)[2] == 1
    assert cost.best_matmul_grid(4096, 4096, 512, 32, T)[2] == 1
    # 64x64 output: M gives at most 8 blocks of 8 rows, N one stick; K (65536) takes the rest.
    gm, gn, gk = cost.best_matmul_grid(64, 64, 65536, 32, T)
    assert gk > 1 and (65536 // gk) % 64 == 0


@pytest.mark.parametrize("M,N,K", [(1024, 1024, 1024), (64, 64, 64), (8, 4096, 4096), (200, 192, 96),
                                   (4096, 64, 4096), (1000, 1024, 1000), (128, 688, 256), (1000, 1000, 1000)])
def test_grids_are_stick_aligned(M, N, K):
    """M and K split evenly (M in PT rows, K in sticks); N in whole sticks, evenly or ragged (every block but the
    last ceil(N / gn) rounded up to sticks, the last the non-empty rest) and then without a K split."""
    gm, gn, gk = cost.best_matmul_grid(M, N, K, 32, T)
    assert gm * gn * gk <= 32
    assert M % gm == 0 and (gm == 1 or (M // gm) % 8 == 0)
    assert K % gk == 0 and (gk == 1 or (K // gk) % 64 == 0)
    nb = cost.n_block(N, gn, 64)
    assert nb is not None and (gn == 1 or nb % 64 == 0) and 0 < N - (gn - 1) * nb <= nb
    assert nb * gn == N or gk == 1


def test_ragged_n_split():
    """688 = 10.75 sticks: no even split in sticks but 1; ragged ones for 2, 3, 4, 6 and 11 cores, none for 5,
    7 or 8 (a core would get nothing). The decoder MLP's [128, 256] @ [256, 688] uses one."""
    assert [g for g in range(1, 13) if cost.n_block(688, g, 64)] == [1, 2, 3, 4, 6, 11]
    assert cost.n_block(688, 11, 64) == 64 and cost.n_block(688, 4, 64) == 192
    assert cost.n_block(1024, 8, 64) == 128              # even splits stay even
    assert cost.best_matmul_grid(128, 688, 256, 32, T)[1] > 1


def test_tiny_matmul_uses_few_cores():
    # Each core loads its part of B first and multicasts it while it loads its A rows (cost.b_first), so even a
    # 32x64x64 matmul gains from a few cores; ring hops and barriers keep it from all 32.
    gm, gn, gk = cost.best_matmul_grid(32, 64, 64, 32, T)
    assert gm * gn * gk <= 4
    # 64^3: with shared operands a few cores win a little (the bytes do not grow), not all 32.
    gm, gn, gk = cost.best_matmul_grid(64, 64, 64, 32, T)
    assert 1 < gm * gn * gk <= 8


def test_tiles_fit_the_scratchpad_and_the_pt_array():
    for block in [(512, 256, 1024), (256, 128, 1024), (1024, 1024, 1024), (8, 64, 64), (64, 4096, 4096)]:
        tile, nbuf, _ = cost.best_tile(*block, T)
        assert all(b % t == 0 for b, t in zip(block, tile))
        assert all(t % 8 == 0 for t in tile)
        assert tile[1] % 64 == 0 and tile[2] % 64 == 0          # whole dlf16 sticks for DMA rows
        need = cost.footprint(cost.matmul_buffers(tile, nbuf=nbuf), T)
        assert need <= T.scratchpad_usable_bytes
    # A forced tile that cannot fit has no plan.
    assert cost.best_tile(1024, 1024, 1024, T, force=(1024, 1024, 1024)) is None


def test_fp32_reference_matmul_converts_tiles_for_the_pt_array():
    names = [b.name for b in cost.matmul_buffers((64, 64, 64), "fp32", nbuf=1)]
    assert names == ["a0", "b0", "pa", "pb", "acc", "out"]


def test_matmul_buffers_follow_the_kernel():
    bufs = {b.name: b.nbytes for b in cost.matmul_buffers((128, 64, 256), "dlf16", nbuf=2, split_k=4, bias=True)}
    assert bufs == {"a0": tile_bytes(128, 256, "dlf16"), "a1": tile_bytes(128, 256, "dlf16"),
                    "b0": tile_bytes(256, 64, "dlf16"), "b1": tile_bytes(256, 64, "dlf16"),
                    "acc": tile_bytes(128, 64, "fp32"), "red": tile_bytes(128, 64, "fp32"),
                    "out": tile_bytes(128, 64, "dlf16"), "bias": tile_bytes(1, 64, "fp32")}


def test_fp8_halves_the_tiles_and_doubles_the_rate():
    d = cost.matmul_cycles(512, 512, 512, (1, 1, 1), (128, 128, 128), T, "dlf16")
    f = cost.matmul_cycles(512, 512, 512, (1, 1, 1), (128, 128, 128), T, "fp8_e4m3", "dlf16")
    assert f.pt < d.pt * 0.55 and f.dma < d.dma


def test_double_buffering_overlaps_dma_with_compute():
    args = (1024, 1024, 1024, (1, 1, 1), (256, 256, 256), T)
    db, sb = cost.matmul_cycles(*args, double_buffer=True), cost.matmul_cycles(*args, double_buffer=False)
    assert db.total < sb.total
    assert db.total >= max(db.pt, db.dma)
    assert sb.total == pytest.approx(sb.pt + sb.dma)


def test_split_k_pays_a_ring_reduce():
    c = cost.matmul_cycles(64, 64, 65536, (1, 1, 16), (64, 64, 256), T)
    assert c.ring > 64 * 64 * 4 / T.ring_bytes_per_cycle


def test_span_limit():
    # 32 GB of A cannot be divided into 256 MB slices over 32 cores.
    assert cost.best_matmul_grid(131072, 64, 131072, 32, T) is None
    # 512 MB of B: one core cannot address it, so the model splits even though it would rather not.
    assert cost.matmul_span(8, 16384, 16384, (1, 1, 1)) > T.core_span_bytes
    assert cost.best_matmul_grid(8, 16384, 16384, 1, T) is None
    gm, gn, gk = cost.best_matmul_grid(8, 16384, 16384, 4, T)
    assert cost.matmul_span(8, 16384, 16384, (gm, gn, gk)) <= T.core_span_bytes


@pytest.mark.parametrize("cores,grid,split_k,tile,dims", [
    (1, (1, 1), 1, (256, 256, 512), (1024, 1024, 1024)),
    (16, (1, 1), 16, (64, 64, 256), (64, 64, 65536)),
    (1, (1, 1), 1, (64, 64, 64), (64, 64, 64)),
])
def test_agrees_with_the_runtime_cycle_model(cores, grid, split_k, tile, dims):
    """The reference kernel with the same division, run through the runtime's (instruction-level) model."""
    from spyre_mlir.runtime import load_bytes
    from spyre_mlir.runtime.kernels import build_matmul

    t = load_target(cores=cores)
    M, N, K = dims
    prog = build_matmul(t, M, N, K, grid=grid, split_k=split_k, tile_m=tile[0], tile_n=tile[1], tile_k=tile[2])
    runtime = load_bytes(prog.to_bytes(), target=t).static_profile.cycles
    model = cost.matmul_cycles(M, N, K, (*grid, split_k), tile, t).total
    assert model == pytest.approx(runtime, rel=0.15)


_EMIT_MATMUL = """
func.func @main(%a: tensor<{M}x{K}x!spyre.dlf16>, %b: tensor<{K}x{N}x!spyre.dlf16>) -> tensor<{M}x{N}x!spyre.dlf16> {{
  %r = "spyre.matmul"(%a, %b) {{acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>,
      spyre.double_buffer = {db}, spyre.grid = array<i64: {grid}>, spyre.kernel = "matmul",
      spyre.tile = array<i64: {tile}>}}
      : (tensor<{M}x{K}x!spyre.dlf16>, tensor<{K}x{N}x!spyre.dlf16>) -> tensor<{M}x{N}x!spyre.dlf16>
  return %r : tensor<{M}x{N}x!spyre.dlf16>
}}
"""


def _allocate(module, target, double_buffer: bool) -> None:
    """The matmul's scratchpad plan, packed as spyre-allocate-scratchpad packs it, with one or two buffers per
    streamed operand as the case asks (the pass itself double-buffers whenever both fit)."""
    from torch_mlir import ir

    from spyre_mlir.passes.analysis import device_ops, int_array
    from spyre_mlir.passes.op_model import buffers, op_model

    i64 = ir.IntegerType.get_signless(64)
    for op in device_ops(module.operation):
        bufs = buffers(op_model(op), int_array(op, "spyre.grid"), int_array(op, "spyre.tile"),
                       2 if double_buffer else 1)
        offsets, _ = cost.pack(bufs, target.scratchpad_alignment_bytes)
        op.attributes["spyre.scratchpad"] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in offsets.items()})


@pytest.mark.parametrize("cores,grid,tile,dims,db", [
    (32, (4, 8, 1), (256, 128, 64), (1024, 1024, 1024), True),
    (32, (2, 16, 1), (512, 64, 64), (1024, 1024, 1024), True),
    (32, (4, 8, 1), (256, 128, 512), (1024, 1024, 1024), True),
    (8, (2, 4, 1), (512, 256, 64), (1024, 1024, 1024), True),
    (32, (8, 4, 1), (64, 64, 128), (512, 256, 1024), True),     # several output tiles per core
    (4, (2, 2, 1), (256, 256, 512), (512, 512, 512), False),    # single-buffered
    (4, (4, 1, 1), (16, 64, 64), (64, 64, 64), False),
])
def test_agrees_with_the_emitted_shared_kernel(cores, grid, tile, dims, db):
    """M/N splits: the compiler's kernel shares A and B tiles over the ring (the reference kernel does not);
    the model of that kernel against the runtime's cycle model on what spyre-emit produces."""
    from torch_mlir import ir

    from spyre_mlir import codegen
    from spyre_mlir.context import make_context
    from spyre_mlir.runtime import load_bytes

    t = load_target(cores=cores)
    M, N, K = dims
    text = _EMIT_MATMUL.format(M=M, N=N, K=K, grid=", ".join(map(str, grid)), tile=", ".join(map(str, tile)),
                               db=str(db).lower())
    with make_context():
        module = ir.Module.parse(text)
        _allocate(module, t, db)
        em = codegen.emit(module, t)
    prof = load_bytes(em.b.to_bytes(), target=t).static_profile
    model = cost.matmul_cycles(M, N, K, grid, tile, t, double_buffer=db).total
    assert model == pytest.approx(prof.cycles, rel=0.15)
    # A and B leave device memory once per output tile row / column of the core blocks, not once per core.
    gm, gn, _ = grid
    a_reads = (N // gn // tile[1]) * M * K * 2
    b_reads = (M // gm // tile[0]) * K * N * 2
    assert prof.dram_read_bytes == a_reads + b_reads
    assert prof.ring_bytes > 0


# ---- row-wise ---------------------------------------------------------------------------------------------


def _softmax(rows, cols):
    e = cost.RowOperand
    return cost.RowKernel(rows=rows, inputs=(e("in", cols, cols, "dlf16"),), outputs=(e("out", cols, cols, "dlf16"),),
                          temps=(cost.RowTemp("xf", cols, cols, "fp32", 1, 8), cost.RowTemp("max", 1, 1, "fp32", 2, 3),
                                 cost.RowTemp("sum", 1, 1, "fp32", 5, 7)),
                          sfu=(("simple", 6), ("transcendental", 1)), steps=9)


def test_rows_grid_divides_rows_and_keeps_tiny_ops_on_one_core():
    assert cost.best_rows_grid(_softmax(1024, 1024), 32, T) == (32,)
    assert cost.best_rows_grid(_softmax(1000, 1024), 32, T) == (25,)
    assert cost.best_rows_grid(_softmax(8, 64), 32, T) == (1,)


def test_rows_tile_fits_and_temporaries_share():
    k = _softmax(1024, 1024)
    (tr,), nbuf = cost.best_rows_tile(k, 32, T)
    assert 32 % tr == 0
    offsets, peak = cost.pack(cost.rowwise_buffers(k, tr, nbuf), T.scratchpad_alignment_bytes)
    assert offsets["max"] == offsets["sum"]
    assert peak <= T.scratchpad_usable_bytes
    # One row of a million elements (2 MB in, 2 MB out, 4 MB fp32) cannot fit.
    assert cost.best_rows_tile(_softmax(8, 1 << 20), 8, T) is None


def test_sfu_cost_classes():
    e = cost.RowOperand
    base = dict(rows=4096, inputs=(e("in", 1024, 1024, "dlf16"),), outputs=(e("out", 1024, 1024, "dlf16"),))
    simple = cost.rowwise_cycles(cost.RowKernel(**base, sfu=(("simple", 1),)), (1,), (8,), T)
    exp = cost.rowwise_cycles(cost.RowKernel(**base, sfu=(("transcendental", 1),)), (1,), (8,), T)
    lanes = T.sfu_lanes_per_core
    assert simple.sfu == pytest.approx(4096 * 1024 / lanes + 512 * T.sfu_latency_cycles)
    assert exp.sfu > simple.sfu * 3


def test_reduction_results_split_on_stick_boundaries():
    """A sum over the last dim writes [R]: rows may only be cut at whole sticks of the result."""
    e = cost.RowOperand
    k = cost.RowKernel(rows=4096, inputs=(e("in", 256, 256, "dlf16"),), outputs=(e("out", 1, 4096, "dlf16"),),
                       sfu=(("simple", 1),))
    (gr,) = cost.best_rows_grid(k, 32, T)
    assert (4096 // gr) % 64 == 0
    (tr,), _ = cost.best_rows_tile(k, gr, T)
    assert tr == 4096 // gr or tr % 64 == 0


def test_fused_matmul_buffers_and_cost():
    # spyre-fuse: an fp32 lhs converted on the scratchpad (pa), the result rounded to dlf16 (out) and widened
    # (outf) before the store.
    bufs = {b.name: b.nbytes for b in cost.matmul_buffers((128, 64, 256), "fp32", "fp32", nbuf=2, b_fmt="dlf16",
                                                          round_fmt="dlf16")}
    assert bufs == {"a0": tile_bytes(128, 256, "fp32"), "a1": tile_bytes(128, 256, "fp32"),
                    "b0": tile_bytes(256, 64, "dlf16"), "b1": tile_bytes(256, 64, "dlf16"),
                    "pa": tile_bytes(128, 256, "dlf16"), "acc": tile_bytes(128, 64, "fp32"),
                    "out": tile_bytes(128, 64, "dlf16"), "outf": tile_bytes(128, 64, "fp32")}
    plain = cost.matmul_cycles(512, 512, 512, (1, 1, 1), (128, 128, 128), T, "dlf16")
    fused = cost.matmul_cycles(512, 512, 512, (1, 1, 1), (128, 128, 128), T, "fp32", "fp32", b_fmt="dlf16",
                               round_fmt="dlf16")
    # Same PT work at the DLFloat16 rate plus the SFU conversions; fp32 A tiles and result move twice the bytes.
    assert fused.pt > plain.pt and fused.dma > plain.dma
    assert fused.pt < 1.5 * plain.pt


def test_an_alias_reshape_costs_nothing():
    """A reshape that is a view of its operand's bytes (spyre.kernel = "alias") runs no instruction: what a card
    spends on it (the placement's per-op cost) is zero, a copy of the same rows is not."""
    from torch_mlir import ir

    from spyre_mlir.context import make_context
    from spyre_mlir.passes.analysis import device_ops
    from spyre_mlir.passes.manager import run_pipeline
    from spyre_mlir.passes.op_model import best_cycles, op_model

    text = """
func.func @main(%x: tensor<1024x4096x!spyre.dlf16>) -> tensor<1024x32x128x!spyre.dlf16> {
  %v = "spyre.reshape"(%x) : (tensor<1024x4096x!spyre.dlf16>) -> tensor<1024x32x128x!spyre.dlf16>
  %y = "spyre.map"(%v) ({
  ^bb0(%a: f32):
    "spyre.yield"(%a) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1024x32x128x!spyre.dlf16>) -> tensor<1024x32x128x!spyre.dlf16>
  return %y : tensor<1024x32x128x!spyre.dlf16>
}"""
    t = load_target()
    with make_context():
        module = ir.Module.parse(text)
        run_pipeline(module, "builtin.module(spyre-select-kernels)")
        view, copy = device_ops(module.operation)
        assert str(view.attributes["spyre.kernel"]) == '"alias"'
        assert best_cycles(op_model(view), 32, t).total == 0
        assert best_cycles(op_model(copy), 32, t).total > 0


def test_resident_a_when_a_row_has_several_tiles():
    """An M/N-split core walking several output tiles of a row keeps its A parts on the scratchpad when that is
    cheaper (A read once; the plan's `ares`): a 4096^3 Linear on 32 cores, fp32 activations converted on the
    scratchpad. Its plan fits, and the time modeled with it is below the same tile's without it."""
    kw = dict(fmt="fp32", out_fmt="fp32", b_fmt="dlf16", round_fmt="dlf16")
    tile, nbuf, resident = cost.best_tile(1024, 512, 4096, T, active=32, grid=(4, 8), **kw)
    assert resident == (-(-tile[0] // 8), 4096 // tile[2])
    names = {b.name for b in cost.matmul_plan(1024, 512, 4096, tile, T, resident=resident, **kw)[1]}
    assert {"ares", "as", "a0", "a1"} <= names and "pa" not in names
    args = (4096, 4096, 4096, (4, 8, 1), tile, T)
    assert cost.matmul_cycles(*args, double_buffer=nbuf == 2, resident=True, **kw).total < \
        cost.matmul_cycles(*args, double_buffer=nbuf == 2, **kw).total
    # One tile per core (1024^3 on 32 cores): nothing to keep.
    assert cost.best_tile(512, 64, 1024, T, active=32, grid=(2, 16))[2] is None


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=12))
@settings(max_examples=200, deadline=None)
def test_shared_rows_load_every_needed_row_once_by_a_core_needing_it(spans):
    """cost.shared_rows, any row ranges (a phased conv's patches, halos, duplicates): every row some range needs is
    loaded by exactly one range that needs it, in runs."""
    ranges = [(lo, lo + n) for lo, n in spans]
    owned = cost.shared_rows(ranges)
    loads = collections.Counter(r for runs in owned for a, z in runs for r in range(a, z))
    assert set(loads) == {r for lo, hi in ranges for r in range(lo, hi)} and set(loads.values()) == {1}
    assert all(lo <= a < z <= hi for (lo, hi), runs in zip(ranges, owned) for a, z in runs)


def test_shared_rows_give_each_core_its_own_rows_and_split_duplicates():
    """A 3x3 conv's patches on 4 cores of 4 output rows (halo 1 above and below): each core loads its own 4 rows,
    one run; two cores with the same patch split it."""
    assert cost.shared_rows([(0, 5), (3, 9), (7, 13), (11, 16)]) == [[(0, 4)], [(4, 8)], [(8, 12)], [(12, 16)]]
    assert cost.shared_rows([(0, 6), (0, 6)]) == [[(0, 3)], [(3, 6)]]


# Blocks the tile search meets: (mb, nb, kb) per core, a grid (gm, gn) sharing operands or none, and the kernel's
# options that change its cost or its buffers.
_BLOCKS = dict(
    mb=st.sampled_from([8, 24, 64, 128, 200, 512, 1024]), nb=st.sampled_from([64, 128, 192, 400, 512, 2048]),
    kb=st.sampled_from([64, 128, 320, 700, 1024, 4096]), grid=st.sampled_from([None, (1, 32), (8, 4), (2, 2)]),
    batch=st.sampled_from([1, 3]), fmt=st.sampled_from(["dlf16", "fp8_e4m3", "fp32"]),
    sibling=st.sampled_from([None, "dlf16"]), bias=st.booleans(), trans_b=st.booleans(),
    split_k=st.sampled_from([1, 2]))


def _options(grid, batch, fmt, sibling, bias, trans_b, split_k):
    return dict(batch=batch, fmt=fmt, out_fmt="fp32" if fmt == "fp32" else "dlf16", sibling=sibling,
                bias=bias, trans_b=trans_b, split_k=split_k, grid=grid,
                active=32 if grid else split_k, b_fmt="int8" if fmt == "fp8_e4m3" and not trans_b else None)


@given(**_BLOCKS)
@settings(max_examples=150, deadline=None)
def test_the_tile_floor_bounds_the_model(mb, nb, kb, grid, batch, fmt, sibling, bias, trans_b, split_k):
    """The tile search prunes by cost._tile_floor: it must never exceed the model's total, for any tile and
    resident mode (a bound above it would prune the tile that wins)."""
    o = _options(grid, batch, fmt, sibling, bias, trans_b, split_k)
    gm, gn = grid if grid and split_k == 1 else (1, 1)
    floor = cost._tile_floor(mb, nb, kb, gm, gn, batch, T, fmt, o["out_fmt"], o["active"], o["b_fmt"], trans_b,
                             2 if sibling else 1)
    cands = cost.matmul_tile_candidates(mb, nb, kb, T, fmt, o["out_fmt"], o["b_fmt"], trans_b)
    for tile in itertools.product(*cands):
        for resident in ([False, True] if gm * gn > 1 else [False]):
            for db in (False, True):
                c = cost.matmul_cycles(mb * gm, nb * gn, kb, (gm, gn, 1), tile, T, fmt, o["out_fmt"], batch=batch,
                                       bias=bias, double_buffer=db, active=o["active"], b_fmt=o["b_fmt"],
                                       resident=resident, trans_b=trans_b, sibling=sibling, round_fmt="fp8_e4m3",
                                       epi_in=("dlf16",))
                assert floor(*tile) <= c.total * (1 + 1e-9), (tile, resident, db)


@given(**_BLOCKS)
@settings(max_examples=60, deadline=None)
def test_the_pruned_tile_search_finds_the_exhaustive_searchs_tile(mb, nb, kb, grid, batch, fmt, sibling, bias,
                                                                  trans_b, split_k):
    """Every fitting (tile, resident mode) costed in candidate order, the least (cycles, -size, resident) and
    the first of equals: what best_tile returns having costed only the tiles its bound cannot rule out."""
    o = _options(grid, batch, fmt, sibling, bias, trans_b, split_k)
    gm, gn = grid if grid and split_k == 1 else (1, 1)
    best = None
    cands = cost.matmul_tile_candidates(mb, nb, kb, T, fmt, o["out_fmt"], o["b_fmt"], trans_b)
    for tile in itertools.product(*cands):
        modes = [None] + ([(-(-tile[0] // gn), -(-kb // tile[2]))] if gm * gn > 1 and nb > tile[1] else [])
        for resident in modes:
            plan = cost.matmul_plan(mb, nb, kb, tile, T, fmt, o["out_fmt"], batch=batch, split_k=split_k,
                                    bias=bias, b_fmt=o["b_fmt"], resident=resident, trans_b=trans_b,
                                    sibling=sibling)
            if plan is None:
                continue
            c = cost.matmul_cycles(mb * gm, nb * gn, kb, (gm, gn, 1), tile, T, fmt, o["out_fmt"], batch=batch,
                                   bias=bias, double_buffer=plan[0] == 2, active=o["active"], b_fmt=o["b_fmt"],
                                   resident=resident is not None, trans_b=trans_b, sibling=sibling)
            key = (c.total, -math.prod(tile), resident is not None)
            if best is None or key < best[0]:
                best = (key, (tile, plan[0], resident))
    cost.clear_cache()
    got = cost.best_tile(mb, nb, kb, T, o["fmt"], o["out_fmt"], batch=batch, split_k=split_k, bias=bias,
                         active=o["active"], grid=grid, b_fmt=o["b_fmt"], trans_b=trans_b, sibling=sibling)
    assert got == (None if best is None else best[1])


# Matmuls the grid search meets: batch, M, N, K (ragged N splits, K splits when too few rows and columns to
# share out) and the kernel's options that change its cost.
_MATMULS = dict(
    B=st.sampled_from([1, 2, 12]), M=st.sampled_from([8, 16, 128, 200, 1024]),
    N=st.sampled_from([64, 192, 768, 1000, 4096]), K=st.sampled_from([64, 256, 320, 768, 4096]),
    fmt=st.sampled_from([("dlf16", "fp32"), ("dlf16", "dlf16"), ("fp8_e4m3", "dlf16")]),
    kw=st.sampled_from([{}, {"bias": True}, {"sibling": "dlf16"}, {"trans_b": True}, {"softmax": "dlf16"},
                        {"b_fmt": "int8"}, {"epi_ops": ("simple", "transcendental")}]))


@given(**_MATMULS)
@settings(max_examples=80, deadline=None)
def test_the_grid_floor_bounds_the_grids_model(B, M, N, K, fmt, kw):
    """The grid search prunes by cost._grid_floor: it must never exceed what the search costs a grid (with its
    best tile), or it could prune the grid that wins."""
    fmt, out = fmt
    b_fmt, trans_b = kw.get("b_fmt"), kw.get("trans_b", False)
    for g in cost._matmul_grids(B, M, N, K, 32, T, fmt, out, True, b_fmt, trans_b):
        gb, gm, gn, gk = g
        nb = cost.n_block(N, gn, cost.n_quantum(fmt, out, b_fmt, T, trans_b))
        fit = cost.best_tile(M // gm, nb, K // gk, T, fmt, out, batch=B // gb, split_k=gk, active=gb * gm * gn * gk,
                             grid=(gm, gn), force=(None, nb if nb * gn != N else None, None),
                             **{k: v for k, v in kw.items() if k != "epi_ops"})
        if fit is None:
            continue
        c = cost.matmul_cycles(M, N, K, g, fit[0], T, fmt, out, batch=B, double_buffer=fit[1] == 2,
                               resident=fit[2] is not None, **kw)
        assert cost._grid_floor(B, M, K, g, nb, T, fmt, kw.get("sibling")) <= c.total * (1 + 1e-9), g


@given(**_MATMULS)
@settings(max_examples=80, deadline=None)
def test_the_pruned_grid_search_finds_the_exhaustive_searchs_grid(B, M, N, K, fmt, kw):
    """The grid search costs grids in the order of their floor and stops where it exceeds the cheapest: the
    same grid as costing every one (ties to the first in the exhaustive order)."""
    got = cost.best_batch_matmul_grid(B, M, N, K, 32, T, *fmt, **kw)
    assert got == cost.best_batch_matmul_grid(B, M, N, K, 32, T, *fmt, prune=False, **kw)


def test_tile_sizes_walk_a_shorter_last_tile_where_no_multiple_divides():
    assert cost.tile_sizes(512, 64) == [64, 128, 256, 512]         # the divisors in whole quanta
    assert cost.tile_sizes(320, 64) == [64, 320]
    assert cost.tile_sizes(700, 64) == [64, 128, 256, 512, 700]     # 700 = 10 sticks and 60 elements
    assert cost.tile_sizes(300, 8) == [8, 16, 32, 64, 128, 256, 300]
    assert cost.tile_sizes(5, 8) == [5]
    # On one core a 300x1000x700 block (B alone 1.4 MB) has tiles that fit, and the search takes one.
    (tm, tn, tk), _, _ = cost.best_tile(300, 1000, 700, T)
    assert tn in (64, 128, 256, 512) and tk in (64, 128, 256, 512)
