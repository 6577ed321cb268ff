"""Analytical cost model of Spyre kernels: how many cycles an op takes for a work division and a tile size,
and which per-core scratchpad buffers its kernel needs.

The kernel-level passes (spyre-divide-work, spyre-tile, spyre-allocate-scratchpad) decide with these numbers,
so they stay pure Python on the :class:`~spyre_mlir.target.Target` (no MLIR here). The model follows the
runtime's cycle model (``runtime/cycles.py``) term by term, at the granularity of whole tiles, with the same
numbers: both read every one from the Target, the fixed per-instruction latencies (``*_latency_cycles``,
[assumed] in the target file) included.

* PT: MACs padded to the PT array (M to ``pt_rows``, N to ``pt_cols``) / ``macs_per_cycle(fmt)`` per core.
* DMA: bytes moved (whole 128-byte sticks, ``runtime.isa.tile_bytes``) / the core's share of DRAM bandwidth:
  the card's mixed read+write bandwidth divided by the cores that work at the same time (``clock_ghz``
  turns GB/s into bytes per cycle), plus a fixed latency per transfer. Split-K loads, which run between the
  group's barriers with no store in flight, get the read-only bandwidth.
* overlap: with double buffering the next tile loads while the PT array or SFU works on this one, so a core
  takes ``max(compute, dma)`` plus the part that cannot overlap (the first load, the last compute: ``min /
  tiles``); with single buffers, or a single tile, ``compute + dma``.
* operand sharing (M/N splits, ``gk = 1``): each K step is a barrier segment in which every core loads 1/gn of
  its A tile and 1/gm of its B tile at the read bandwidth shared by all the group's cores and ring-sends its
  parts to the rest of its grid row / column (the A sends overlap the B load), while the PT array works on the
  previous step; a segment takes the longer of the two plus the barrier, the first load and the last multiply
  and store (alone, at the write bandwidth) do not overlap.
* split-K: each output tile's fp32 partial sums meet in a ring reduce-sum (bytes / ``ring_bytes_per_cycle``
  plus a hop per member), then the root rounds on the SFU; this is not overlapped.
* SFU (row-wise ops): elements x the sum of the op's per-element passes weighted by their cost class
  (``sfu_cycles("simple"|"reciprocal"|"transcendental")``) / the core's SFU lanes.
* sync: the cores of a multi-core op meet at a barrier at its end (a fixed latency plus a ring hop per core),
  so splitting a tiny op is not free.

Kernels follow ``runtime/kernels.py`` and ``codegen/kernels/``: a matmul core walks its [mb, nb] output block
in [tm, tn] tiles and its K slice in tk steps, with A/B tiles double-buffered (shared across an M/N grid), an
fp32 accumulator and an output tile; a row-wise core
walks its rows in tiles of tr rows, with streamed inputs/outputs double-buffered and fp32 temporaries.
:func:`pack` places a kernel's buffers with liveness-based reuse; the tile search and the allocator share it,
so a tile chosen to fit is exactly what gets allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple, Sequence

from spyre_mlir.runtime.formats import Format
from spyre_mlir.runtime.isa import PT_FORMATS, tile_bytes
from spyre_mlir.target import Target

__all__ = [
    "Buffer", "Cycles", "pack", "footprint", "nbuf_for", "stick_elems", "divisors",
    "n_block", "n_quantum", "k_quantum", "tile_sizes", "b_tile_bytes", "softmax_stats", "matmul_buffers", "matmul_cycles", "matmul_span", "matmul_plan", "matmul_tile_candidates", "best_matmul_grid", "best_batch_matmul_grid",
    "best_tile",
    "RowOperand", "RowTemp", "RowKernel", "rowwise_buffers", "rowwise_cycles", "rowwise_span", "rows_plan",
    "best_rows_grid", "best_rows_tile",
    "store_parts", "last_pieces", "softmax_sfu", "finish_cycles", "ConvKernel", "conv_buffers", "conv_pieces", "conv_shares", "conv_cycles", "conv_span", "conv_plan", "conv_tile_candidates", "best_conv_grid",
    "best_conv_tile",
]

FP32 = "fp32"


def stick_elems(fmt: str, target: Target) -> int:
    """Elements of ``fmt`` in one stick (64 dlf16, 32 fp32, 128 fp8/int8)."""
    return target.stick_bytes * 8 // Format.parse(fmt).bits


def n_block(N: int, gn: int, quantum: int) -> int | None:
    """Columns of a core's block when ``gn`` cores split a matmul's N: N / gn when that is whole ``quantum``s
    (sticks of B and the result), else a ragged split, ceil(N / gn) rounded up to whole quanta on every core
    but the last, which takes the (non-empty) rest; None when neither exists. A ragged block is walked as one
    output tile column (the cores of an M/N split step in lock-step)."""
    if gn == 1:
        return N
    if N % gn == 0 and (N // gn) % quantum == 0:
        return N // gn
    nb = _ceil(_ceil(N, gn), quantum) * quantum
    return nb if (gn - 1) * nb < N else None


def n_quantum(fmt: str, out_fmt: str, b_fmt: str | None, target: Target, trans_b: bool = False) -> int:
    """The N split's quantum: whole sticks of the result, and of B when it is sticked on N (not ``trans_b``)."""
    return max(stick_elems(out_fmt or fmt, target), 1 if trans_b else stick_elems(b_fmt or fmt, target))


def k_quantum(fmt: str, b_fmt: str | None, target: Target, trans_b: bool = False) -> int:
    """The K split's and K tile's quantum: whole sticks of A, and of B when it is stored transposed."""
    return max(stick_elems(fmt, target), stick_elems(b_fmt or fmt, target) if trans_b else 1)


def b_tile_bytes(tk: int, tn: int, b_fmt: str, trans_b: bool = False) -> int:
    """Bytes of a [tk, tn] B tile, held as [tn, tk] (sticks along K) when B is stored transposed."""
    return tile_bytes(tn, tk, b_fmt) if trans_b else tile_bytes(tk, tn, b_fmt)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (asked for every dim of every grid and tile search: remembered)."""
    return list(_divisors(n))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pad(a: int, b: int) -> int:
    return _ceil(a, b) * b


# ------------------------------------------------------------------------------------------------------------
# Buffers and packing


class Buffer(NamedTuple):
    """A per-core scratchpad buffer of a kernel, live from step ``first`` to step ``last`` (inclusive). A tuple:
    the tile search builds a kernel's buffers for every candidate tile."""

    name: str
    nbytes: int
    first: int = 0
    last: int = 1 << 30


def pack(buffers: Sequence[Buffer], align: int) -> tuple[dict[str, int], int]:
    """Offsets for ``buffers`` (in their order, first fit) and the peak bytes.

    Two buffers may share bytes only when their lifetimes do not overlap; offsets are ``align``-aligned.
    """
    sizes = [_pad(b.nbytes, align) for b in buffers]
    if buffers and max(b.first for b in buffers) <= min(b.last for b in buffers):
        # All live at once (every matmul buffer): first fit places each after the one before.
        offsets = dict(zip((b.name for b in buffers), itertools.accumulate(sizes, initial=0)))
        return offsets, sum(sizes)
    placed: list[tuple[Buffer, int, int]] = []
    offsets: dict[str, int] = {}
    peak = 0
    for b, size in zip(buffers, sizes):
        busy = sorted((off, off + osize) for o, off, osize in placed if o.first <= b.last and b.first <= o.last)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        placed.append((b, off, size))
        offsets[b.name] = off
        peak = max(peak, off + size)
    return offsets, peak


def footprint(buffers: Sequence[Buffer], target: Target) -> int:
    return pack(buffers, target.scratchpad_alignment_bytes)[1]


@dataclasses.dataclass(frozen=True)
class Cycles:
    """Modeled cycles of one op on its busiest core, by unit, and the total (with overlap applied)."""

    pt: float = 0.0
    sfu: float = 0.0
    dma: float = 0.0
    ring: float = 0.0
    total: float = 0.0


def pt_rate(target: Target, fmt: str) -> int:
    """PT MACs per cycle per core for ``fmt``. fp32 (the fp32-reference precision) and other formats without a
    PT rate are modeled at the DLFloat16 rate, as the emulator runs them."""
    try:
        return target.macs_per_cycle(fmt)
    except ValueError:
        return target.macs_per_cycle("dlf16")


def sync_cycles(active: int, target: Target) -> float:
    """Cores of a multi-core op meet at its end: a barrier plus a ring hop per further core. This is what keeps
    tiny ops on one core."""
    return target.barrier_latency_cycles + target.hop_latency_cycles * (active - 1) if active > 1 else 0.0


def _overlap(compute: float, dma: float, tiles: int, double_buffer: bool) -> float:
    """Double-buffered: DMA and compute overlap except the first load and the last compute (fill/drain)."""
    if not double_buffer or tiles <= 1:
        return compute + dma
    return max(compute, dma) + min(compute, dma) / tiles


def nbuf_for(tiles: int, fits_double: bool) -> int:
    """Buffers per streamed operand: two (double buffering) when there is a next tile to prefetch and both fit."""
    return 2 if tiles > 1 and fits_double else 1


def _bytes_per_cycle(target: Target, active: int) -> float:
    """One core's share of device-memory bandwidth when ``active`` cores move data at once."""
    return target.dram_mixed_gbps / target.clock_ghz / max(1, active)


# ------------------------------------------------------------------------------------------------------------
# Matmul and batch matmul: grid (gb, gm, gn, gk), tile (tm, tn, tk), one batch per tile


def matmul_buffers(tile: Sequence[int], fmt: str = "dlf16", out_fmt: str | None = None, *, nbuf: int = 2,
                   split_k: int = 1, bias: bool = False, b_fmt: str | None = None,
                   round_fmt: str | None = None, colscale: str | None = None,
                   epi_in: Sequence[str] = (), resident: tuple[int, int] | None = None,
                   trans_b: bool = False, softmax: str | None = None, epi_temps: int = 0,
                   sibling: str | None = None, chain: tuple | None = None,
                   prologue: tuple | None = None) -> list[Buffer]:
    """A matmul core's buffers: a0 a1 (A [tm,tk]), b0 b1 (B [tk,tn], [tn,tk] when ``trans_b``), pa / pb (DLFloat16 copies of A / B when
    their format is not one the PT array multiplies), acc (fp32 [tm,tn]), red (fp32 ring reduce destination,
    split-K only), out ([tm,tn] result format; ``round_fmt`` when the result is rounded to it first), outf
    ([tm,tn] result format, the widened copy of out, with ``round_fmt`` only), bias ([1,tn] in the bias
    operand's format when ``bias`` names it, else fp32), colscale ([1,tn] in ``colscale``'s format: the
    per-column scales of quantized weights, applied on write-back), epa epb ... ([tm,tn] in each ``epi_in``
    format: the blocks of an epilogue's further inputs), ept (fp32 [tm,tn], ``epi_temps`` = 1: an epilogue
    needing a second fp32 temporary; its first is the accumulator). All live throughout.

    ``sibling`` (the result format of a sibling matmul the kernel computes beside this one, :func:`matmul_cycles`):
    g0 g1 (its B tiles, like b0 b1), gacc (its fp32 accumulator), gred (split-K: its reduce-sum destination),
    gout ([tm,tn] in ``sibling``: its finished tile, which the epilogue reads) and, with ``colscale``, gcolscale
    (its weights' per-column scales).

    ``chain`` (V's format, dv, the chained matmul's result format): a matmul the kernel computes from each finished
    tile of its softmax epilogue (attention's P @ V, decided after tiling): va vb ([tn, dv] V of a batch, by batch
    parity; not a double buffer of the kernel's steps, so not named 0/1), pacc (fp32 [tm, dv]) and pout ([tm, dv]
    its result tile, stored instead of out).

    ``prologue``: a norm the kernel applies to its A tiles (whole rows, tk = K), :func:`prologue_buffers`.

    ``resident`` (part rows, K steps): the M/N-split kernel keeps its core's part of the A tiles of the current
    row of output tiles, every K step, for the next tiles of that row (:func:`matmul_cycles`): ``ares`` [steps
    x part rows, tk], a0 a1 then in the format the PT array multiplies (parts arrive converted), and ``as``
    [part rows, tk] in A's format stages a part before its conversion (no ``pa``)."""
    tm, tn, tk = tile
    out_fmt = out_fmt or fmt
    b_fmt = b_fmt or fmt
    if resident:
        prow, steps = resident
        pa = _pt_fmt(fmt)
        bufs = [Buffer(f"a{i}", tile_bytes(tm, tk, pa)) for i in range(nbuf)]
        bufs.append(Buffer("ares", tile_bytes(steps * prow, tk, pa)))
        if pa != fmt:
            bufs.append(Buffer("as", tile_bytes(prow, tk, fmt)))
    else:
        bufs = [Buffer(f"a{i}", tile_bytes(tm, tk, fmt)) for i in range(nbuf)]
    bufs += [Buffer(f"b{i}", b_tile_bytes(tk, tn, b_fmt, trans_b)) for i in range(nbuf)]
    if sibling:
        bufs += [Buffer(f"g{i}", b_tile_bytes(tk, tn, b_fmt, trans_b)) for i in range(nbuf)]
        bufs += [Buffer("gacc", tile_bytes(tm, tn, FP32)), Buffer("gout", tile_bytes(tm, tn, sibling))]
        if split_k > 1:
            bufs.append(Buffer("gred", tile_bytes(tm, tn, FP32)))
        if colscale:
            bufs.append(Buffer("gcolscale", tile_bytes(1, tn, colscale)))
    # Formats the PT array does not multiply (fp32 in fp32-reference, bf16) are converted to DLFloat16 first.
    if Format.parse(fmt) not in PT_FORMATS and not resident:
        bufs.append(Buffer("pa", tile_bytes(tm, tk, "dlf16")))
    if Format.parse(b_fmt) not in PT_FORMATS:
        bufs.append(Buffer("pb", b_tile_bytes(tk, tn, "dlf16", trans_b)))
    bufs.append(Buffer("acc", tile_bytes(tm, tn, FP32)))
    if split_k > 1:
        bufs.append(Buffer("red", tile_bytes(tm, tn, FP32)))
    bufs.append(Buffer("out", tile_bytes(tm, tn, round_fmt or out_fmt)))
    if round_fmt:
        bufs.append(Buffer("outf", tile_bytes(tm, tn, out_fmt)))
    if bias:
        bufs.append(Buffer("bias", tile_bytes(1, tn, _bias_fmt(bias))))
    if colscale:
        bufs.append(Buffer("colscale", tile_bytes(1, tn, colscale)))
    bufs += [Buffer("ep" + chr(ord("a") + i), tile_bytes(tm, tn, f)) for i, f in enumerate(epi_in)]
    if epi_temps:
        bufs.append(Buffer("ept", tile_bytes(tm, tn, FP32)))
    if softmax:         # a softmax epilogue's row statistics (its fp32 work tile is the accumulator)
        bufs += [Buffer(n, tile_bytes(tm, 1, FP32)) for n in softmax_stats(softmax)]
    if chain:
        v_fmt, dv, p_fmt = chain
        bufs += [Buffer(n, tile_bytes(tn, dv, v_fmt)) for n in CHAIN_V]
        bufs += [Buffer("pacc", tile_bytes(tm, dv, FP32)), Buffer("pout", tile_bytes(tm, dv, p_fmt))]
    if prologue:
        bufs += prologue_buffers(prologue, tk)
    return bufs


CHAIN_V = ("va", "vb")      # a chained matmul's V buffers, by batch parity


def prologue_rows(grid: Sequence[int], tile: Sequence[int]) -> int:
    """The most rows of A a matmul core computes at once with a norm prologue on (gm, gn, gk) in (tm, tn, tk):
    its part of the A tile, which an M/N split shares over the ring (1/gn of the rows each), else the tile."""
    gm, gn, gk = grid
    tm = tile[0]
    return tm if gk > 1 or gm * gn == 1 else _ceil(tm, gn)


def prologue_buffers(prologue, K: int) -> list[Buffer]:
    """The buffers of a norm prologue (codegen Prologue): ``prologue`` = (rows, input format, [(weight / bias,
    format)], row statistics): ``nx`` [rows, K] the norm's input, ``nsq`` and (a layernorm's: two statistics)
    ``nxf`` fp32 [rows, K] (an rmsnorm works in ``nsq``), an fp32 [rows, 1] ``n<stat>`` per statistic, a [1, K]
    ``n<weight>`` per parameter."""
    rows, x_fmt, params, stats = prologue
    work = ["nxf", "nsq"] if len(stats) > 1 else ["nsq"]
    return ([Buffer("nx", tile_bytes(rows, K, x_fmt))] + [Buffer(w, tile_bytes(rows, K, FP32)) for w in work]
            + [Buffer("n" + s, tile_bytes(rows, 1, FP32)) for s in stats]
            + [Buffer("n" + n, tile_bytes(1, K, f)) for n, f in params])


def prologue_sfu(rows: int, K: int, stats: int, target: Target) -> float:
    """SFU cycles of a norm prologue on ``rows`` rows of ``K`` (rows.norm_body): an rmsnorm (one row statistic)
    takes four passes over the rows (square, mean, scale, weight), a layernorm (two) seven (mean, center,
    square, mean, scale, weight, bias), and two on the [rows, 1] statistic (+eps, rsqrt)."""
    full = 4 if stats == 1 else 7
    return full * (rows * K * target.sfu_cycles("simple") / target.sfu_lanes_per_core + target.sfu_latency_cycles) \
        + 2 * target.sfu_latency_cycles


def softmax_stats(softmax: str) -> tuple[str, ...]:
    """The [rows, 1] fp32 buffers of a softmax applied by a matmul kernel: max, sum and, safe, the live rows."""
    return ("smax", "ssum", "slive") if softmax == "safe" else ("smax", "ssum")


def _bias_fmt(bias) -> str:
    """``bias`` is False, True (an fp32 bias) or the bias operand's format."""
    return bias if isinstance(bias, str) else FP32


def matmul_cycles(M: int, N: int, K: int, grid: Sequence[int], tile: Sequence[int] | None, target: Target,
                  fmt: str = "dlf16", out_fmt: str | None = None, *, batch: int = 1, bias: bool = False,
                  double_buffer: bool = True, active: int | None = None, b_fmt: str | None = None,
                  round_fmt: str | None = None, epi_in: Sequence[str] = (), resident: bool = False,
                  trans_b: bool = False, softmax: str | None = None, sibling: str | None = None,
                  prologue: float = 0.0, epi_ops: Sequence[str] = (), chain_dv: int = 0) -> Cycles:
    """Cycles of ``[batch x] M x K @ K x N`` with ``grid`` = (gm, gn, gk) or (gb, gm, gn, gk) and per-core
    ``tile`` = (tm, tn, tk) (None: one tile per core block). ``active``: cores sharing DRAM (default: the
    grid's). ``fmt`` / ``b_fmt`` are A's / B's formats in device memory (a format the PT array does not multiply
    is converted to DLFloat16 on the SFU every step); ``round_fmt``: the result is rounded to it on write-back
    and widened to ``out_fmt`` on the SFU before the store (spyre.convert_result); ``epi_in``: the formats of an
    epilogue's further inputs, a [tm, tn] block of each loaded per output tile; ``resident``: the M/N-split
    kernel keeps its part of A across a row of output tiles (:func:`matmul_buffers`); ``sibling``: the kernel also
    multiplies each A tile by a second B of the same shape (a sibling matmul sharing A: an MLP's gate beside its
    up projection), twice the B tiles and PT work, its tile written back in that format for the epilogue;
    ``prologue``: the SFU cycles of a norm prologue on each A tile (part, when an M/N split shares it) it loads
    (:func:`prologue_sfu`); ``epi_ops``, ``chain_dv``: the work finishing each output tile (:func:`finish_cycles`)."""
    gb, gm, gn, gk = (1, *grid) if len(grid) == 3 else grid
    nmul = 2 if sibling else 1
    out_fmt = out_fmt or fmt
    b_fmt = b_fmt or fmt
    bb, mb, nb, kb = _ceil(batch, gb), _ceil(M, gm), _ceil(N, gn), _ceil(K, gk)
    if N % gn:          # a ragged split: the busiest core's block
        nb = n_block(N, gn, n_quantum(fmt, out_fmt, b_fmt, target, trans_b)) or nb
    tm, tn, tk = tile or (mb, nb, kb)
    tiles = bb * _ceil(mb, tm) * _ceil(nb, tn)
    steps = _ceil(kb, tk)
    # The epilogue map, softmax and chained matmul: work per output tile, after the last step's write-back.
    finish = finish_cycles(tm, tn, target, softmax, epi_ops, chain_dv)
    if gk == 1 and gm * gn > 1:
        return _shared_matmul_cycles(gm, gn, tiles, steps, (tm, tn, tk), target, fmt, out_fmt, bias,
                                     double_buffer, active or gb * gm * gn, b_fmt, round_fmt, epi_in,
                                     _ceil(nb, tn) if resident else 0, trans_b, finish, nmul,
                                     prologue)
    pt = tiles * steps * nmul * (_pad(tm, target.pt_rows) * _pad(tn, target.pt_cols) * tk
                                 / pt_rate(target, _pt_fmt(fmt)) + target.pt_latency_cycles)
    pt += tiles * steps * _convert_step(tm, tn, tk, target, fmt, b_fmt, nmul) + tiles * _convert_out(
        tm, tn, target, round_fmt)
    pt += tiles * (finish[0] + steps * prologue)
    loads = tiles * (steps * (tile_bytes(tm, tk, fmt) + nmul * b_tile_bytes(tk, tn, b_fmt, trans_b))
                     + (tile_bytes(1, tn, _bias_fmt(bias)) if bias else 0) + _epi_bytes(tm, tn, epi_in))
    stores = tiles * tile_bytes(tm, tn, out_fmt)
    transfers = tiles * ((1 + nmul) * steps + 1 + bool(bias) + len(epi_in))
    share = _bytes_per_cycle(target, active or gb * gm * gn * gk)
    if gk > 1:
        # The split-K group meets at a barrier per output tile. The first tile's loads run with no store in
        # flight, at the read-only bandwidth; every later tile's share their segment with the root's store of
        # the tile before, priced at the mixed bandwidth (runtime/cycles.py does so while that store is in
        # flight: an upper bound).
        loads *= (target.dram_mixed_gbps / target.dram_read_gbps + tiles - 1) / tiles
    dma = (loads + stores) / share + transfers * target.dma_latency_cycles
    ring = sfu = 0.0
    if gk > 1:
        ring = nmul * tiles * (tile_bytes(tm, tn, FP32) / target.ring_bytes_per_cycle
                               + (gk - 1) * target.hop_latency_cycles)
        sfu = nmul * tiles * (tm * tn * target.sfu_cycles("simple") / target.sfu_lanes_per_core
                              + target.sfu_latency_cycles)
    total = _overlap(pt + sfu, dma, tiles * steps, double_buffer) + ring + sync_cycles(gb * gm * gn * gk, target)
    return Cycles(pt=pt, sfu=sfu, dma=dma, ring=ring, total=total)


def _softmax_ops(softmax: str) -> int:
    """SFU instructions of a softmax on a tile (rows.apply_softmax), each paying the SFU's latency."""
    return 6 + (3 if softmax == "safe" else 0)


def softmax_sfu(tm: int, tn: int, target: Target, softmax: str) -> float:
    """SFU cycles of a softmax epilogue on a [tm, tn] tile (rows.apply_softmax): 3 elementwise passes (sub, exp,
    mul), 2 row reductions, the per-row reciprocal (and the safe softmax's 3 per-row selects)."""
    lanes = target.sfu_lanes_per_core
    full = tm * tn * (2 * target.sfu_cycles("simple") + target.sfu_cycles("transcendental")) / lanes
    rows = tm * (target.sfu_cycles("reciprocal") + (3 if softmax == "safe" else 0)) / lanes
    return full + 2 * tm * tn / lanes + rows + _softmax_ops(softmax) * target.sfu_latency_cycles


def finish_cycles(tm: int, tn: int, target: Target, softmax: str | None = None, epi_ops: Sequence[str] = (),
                  chain_dv: int = 0) -> tuple[float, float]:
    """Cycles that finish a [tm, tn] output tile after its last multiply, and the fixed part of them (each
    instruction's latency): the epilogue map's SFU micro-ops (their classes ``epi_ops``, its rounding among
    them), a softmax epilogue, and the matmul chained to the softmax ([tm, tn] @ [tn, chain_dv] on the PT
    array)."""
    lanes = target.sfu_lanes_per_core
    fixed = len(epi_ops) * target.sfu_latency_cycles
    work = sum(target.sfu_cycles(c) for c in epi_ops) * tm * tn / lanes + fixed
    if softmax:
        work += softmax_sfu(tm, tn, target, softmax)
        fixed += _softmax_ops(softmax) * target.sfu_latency_cycles
    if chain_dv:
        work += _pad(tm, target.pt_rows) * _pad(chain_dv, target.pt_cols) * tn / pt_rate(target, "dlf16") \
            + target.pt_latency_cycles
        fixed += target.pt_latency_cycles
    return work, fixed


def _epi_bytes(tm: int, tn: int, epi_in: Sequence[str]) -> int:
    return sum(tile_bytes(tm, tn, f) for f in epi_in)


def _pt_fmt(fmt: str) -> str:
    """The format the PT array multiplies an operand stored in ``fmt`` in (others are converted to DLFloat16)."""
    return fmt if Format.parse(fmt) in PT_FORMATS else "dlf16"


def _convert_step(tm: int, tn: int, tk: int, target: Target, fmt: str, b_fmt: str, nmul: int = 1) -> float:
    """SFU cycles of one K step's operand conversions (A / B tiles in a format the PT array does not multiply;
    ``nmul`` B tiles); the kernel issues them between the loads and the multiply, so they add to the step's
    compute."""
    c = 0.0
    for elems, f in ((tm * tk, fmt),) + ((tk * tn, b_fmt),) * nmul:
        if _pt_fmt(f) != f:
            c += elems * target.sfu_cycles("simple") / target.sfu_lanes_per_core + target.sfu_latency_cycles
    return c


def _convert_out(tm: int, tn: int, target: Target, round_fmt: str | None) -> float:
    """SFU cycles of widening a rounded output tile before its store (spyre.convert_result)."""
    if not round_fmt:
        return 0.0
    return tm * tn * target.sfu_cycles("simple") / target.sfu_lanes_per_core + target.sfu_latency_cycles


def store_parts(tm: int, tn: int, steps: int, out_fmt: str, active: int, target: Target) -> int:
    """Parts of its rows an M/N-split core of ``active`` stores a finished [tm, tn] output tile in, one per segment
    of the next tile's ``steps``: each part moves for at least four times a DMA's fixed latency at the core's
    share of DRAM bandwidth, so that latency stays small next to its bytes (a small tile is stored whole)."""
    least = 4 * target.dma_latency_cycles * _bytes_per_cycle(target, active)
    return max(1, min(steps, tm, int(tile_bytes(tm, tn, out_fmt) // least)))


def last_pieces(tm: int, tn: int, tk: int, fmt: str, out_fmt: str, active: int, target: Target, nmul: int = 1,
                finish: tuple[float, float] = (0.0, 0.0)) -> tuple[tuple[int, int], ...]:
    """Rows [lo, hi) of the pieces an M/N-split core multiplies, finishes and stores its last [tm, tn] output tile
    in (its last K step ``tk`` deep, ``nmul`` products; ``finish``: :func:`finish_cycles` of the tile), so each
    piece's store overlaps the next piece's work instead of the whole store waiting for the whole tile. Pieces
    are whole PT-array row blocks (a smaller one would pad the array); their number minimizes the pipeline's
    span (:func:`pipeline_span`), each piece paying every instruction's fixed latency."""
    blocks = _ceil(tm, target.pt_rows)
    fixed = nmul * target.pt_latency_cycles + finish[1]
    work = nmul * _pad(tm, target.pt_rows) * _pad(tn, target.pt_cols) * tk / pt_rate(target, _pt_fmt(fmt)) \
        + finish[0] - finish[1]
    out = tile_bytes(tm, tn, out_fmt) * active / (target.dram_write_gbps / target.clock_ghz)
    q = min(range(1, blocks + 1), key=lambda q: pipeline_span(work / q + fixed, out / q + target.dma_latency_cycles, q))
    return tuple((lo * target.pt_rows, min(tm, hi * target.pt_rows)) for lo, hi in row_blocks(blocks, q))


def row_blocks(n: int, q: int) -> tuple[tuple[int, int], ...]:
    """[lo, hi) of ``q`` near-equal, non-empty parts of ``n`` (the last ones one longer)."""
    q = max(1, min(n, q))
    cuts = [i * n // q for i in range(q + 1)]
    return tuple(zip(cuts, cuts[1:]))


def pipeline_span(compute: float, store: float, pieces: int) -> float:
    """Span of ``pieces`` pieces that each compute, then store (two in-order units): the first compute and the
    last store are exposed, and the longer stage sets the pace in between."""
    return compute + store + (pieces - 1) * max(compute, store)


def b_first(gm: int, gn: int, a_part: int, b_part: int, a_lead: float = 0.0) -> bool:
    """Whether a shared-operand matmul step loads its B parts before its A part: when B's exchange (to the gm - 1
    other cores of a grid column) moves more bytes than A's (to the gn - 1 of a grid row), so the longer
    exchange overlaps the other operand's load. ``a_lead``: the bytes the ring would carry while the SFU works on
    the A part before it can be sent (a norm prologue), which A's exchange takes longer by."""
    return (gm - 1) * b_part > (gn - 1) * a_part + a_lead


def _shared_matmul_cycles(gm: int, gn: int, tiles: int, steps: int, tile: Sequence[int], target: Target,
                          fmt: str, out_fmt: str, bias: bool, double_buffer: bool, active: int,
                          b_fmt: str | None = None, round_fmt: str | None = None,
                          epi_in: Sequence[str] = (), passes: int = 0, trans_b: bool = False,
                          finish: tuple[float, float] = (0.0, 0.0), nmul: int = 1,
                          prologue: float = 0.0) -> Cycles:
    """The M/N-split kernel with operand sharing (``codegen/kernels/matmul.py``): each of the ``tiles * steps``
    steps is a barrier segment in which every core loads 1/gn of the A tile and 1/gm of the B tile and
    ring-sends its parts to the cores of its grid row / column, while the PT array multiplies the previous
    step; a finished output tile is stored a part of its rows per segment over the next tile's segments.

    ``passes`` > 0: A is resident (:func:`matmul_buffers`) across each row's ``passes`` output tiles. The first
    tile of a row loads its A part from device memory and converts it to the PT format (the ring carries the
    converted part, each core converts only its own); the others send it again from the scratchpad, so A's
    bytes leave device memory once. Every step also copies the core's own part into its A tile (SFU).
    ``nmul`` = 2: each step also loads and exchanges a sibling's B parts and multiplies twice. ``prologue``: SFU
    cycles of a norm prologue on each A part between its load and its exchange (:func:`prologue_sfu`)."""
    tm, tn, tk = tile
    n = tiles * steps
    b_fmt = b_fmt or fmt
    pa = _pt_fmt(fmt) if passes else fmt
    prow = _ceil(tm, gn)
    # B parts are rows of the B tile: of K, or of N when it is held transposed.
    b_part = nmul * (tile_bytes(_ceil(tn, gm), tk, b_fmt) if trans_b else tile_bytes(_ceil(tk, gm), tn, b_fmt))
    a_load = tile_bytes(prow, tk, fmt)
    a_part = tile_bytes(prow, tk, pa)             # what the ring carries
    read_bw = target.dram_read_gbps / target.clock_ghz / max(1, active)
    mixed_bw = _bytes_per_cycle(target, active)
    rate = target.ring_bytes_per_cycle
    ring_a = (gn - 1) * (a_part / rate + target.hop_latency_cycles)
    ring_b = (gm - 1) * (b_part / rate + nmul * target.hop_latency_cycles)
    first = 1 / passes if passes else 1.0         # share of the steps that load A from device memory
    loads = a_load * first + b_part + ((tile_bytes(1, tn, _bias_fmt(bias)) if bias else 0.0)
                                       + _epi_bytes(tm, tn, epi_in)) / steps
    part_sfu = prow * tk * target.sfu_cycles("simple") / target.sfu_lanes_per_core + target.sfu_latency_cycles
    convert_a = (part_sfu if passes and pa != fmt else 0.0) + prologue

    def fetch(bw, load_a=True):
        dma_b = b_part / bw + nmul * target.dma_latency_cycles
        if not load_a:
            return max(dma_b, ring_a) + ring_b
        dma_a = a_load / bw + target.dma_latency_cycles + convert_a
        if b_first(gm, gn, a_part, b_part, prologue * rate):
            return dma_b + max(dma_a, ring_b) + ring_a
        return dma_a + max(dma_b, ring_a) + ring_b

    pt_step = nmul * (_pad(tm, target.pt_rows) * _pad(tn, target.pt_cols) * tk / pt_rate(target, _pt_fmt(fmt))
                      + target.pt_latency_cycles)
    tile_work = _convert_out(tm, tn, target, round_fmt) + finish[0]       # once per output tile
    pt_step += _convert_step(tm, tn, tk, target, pa, b_fmt, nmul) + tile_work * tiles / n
    pt_step += part_sfu if passes else 0.0        # the own part's copy into the A tile
    out = tile_bytes(tm, tn, out_fmt)
    parts = store_parts(tm, tn, steps, out_fmt, active, target)
    store = out / parts / mixed_bw + target.dma_latency_cycles
    stores_mid = max(0, tiles - 1) * parts    # segments that also store a part of a finished tile

    def segments(count, extra):
        """``count`` middle segments, ``extra`` cycles added to each one's transfers, as the loads go."""
        cost_ = 0.0
        for share, load_a in ((first, True), (1 - first, False)):
            f = fetch(mixed_bw if extra else read_bw, load_a) + extra
            cost_ += share * count * (max(pt_step, f) if double_buffer and n > 1 else pt_step + f)
        return cost_

    mid = segments(n - 1 - stores_mid, 0.0) + segments(stores_mid, store)
    # The last segment stores alone (write bandwidth), each piece of the last tile (last_pieces) behind its work.
    q = len(last_pieces(tm, tn, tk, pa, out_fmt, active, target, nmul, finish))
    fixed = nmul * target.pt_latency_cycles + finish[1]
    work = pt_step - tile_work * tiles / n + tile_work - fixed
    last = pipeline_span(work / q + fixed,
                     out / q * active / (target.dram_write_gbps / target.clock_ghz) + target.dma_latency_cycles, q)
    total = fetch(read_bw) + mid + last + n * target.barrier_latency_cycles + sync_cycles(active, target)
    dma = (n * loads / read_bw + tiles * tile_bytes(tm, tn, out_fmt) / mixed_bw
           + ((nmul + first) * n + stores_mid + q + tiles * len(epi_in)) * target.dma_latency_cycles)
    return Cycles(pt=n * pt_step, dma=dma, ring=n * (ring_a + ring_b), total=total)


def matmul_span(M: int, N: int, K: int, grid: Sequence[int], fmt: str = "dlf16", out_fmt: str | None = None,
                batch: int = 1, b_fmt: str | None = None, trans_b: bool = False, nmul: int = 1) -> int:
    """Device-memory bytes one core addresses: its slices of A, B (``nmul`` of them) and the result (whole
    sticks)."""
    gb, gm, gn, gk = (1, *grid) if len(grid) == 3 else grid
    bb, mb, nb, kb = _ceil(batch, gb), _ceil(M, gm), _ceil(N, gn), _ceil(K, gk)
    return bb * (tile_bytes(mb, kb, fmt) + nmul * b_tile_bytes(kb, nb, b_fmt or fmt, trans_b)
                 + tile_bytes(mb, nb, out_fmt or fmt))


def _split_ok(total: int, parts: int, quantum: int) -> bool:
    """An even split into ``parts`` whose pieces are whole multiples of ``quantum`` (any split of 1 is fine)."""
    return parts == 1 or (total % parts == 0 and (total // parts) % quantum == 0)


def matmul_tile_candidates(mb: int, nb: int, kb: int, target: Target, fmt: str, out_fmt: str,
                           b_fmt: str | None = None, trans_b: bool = False):
    """Tile sizes along each dim: multiples of the PT array that keep DMA rows whole sticks (tn for the result
    and B sticked on N, tk for A and, stored transposed, B sticked on K), :func:`tile_sizes`."""
    pt = max(target.pt_rows, target.pt_cols)
    qn = max(pt, n_quantum(fmt, out_fmt, b_fmt, target, trans_b))
    qk = max(pt, k_quantum(fmt, b_fmt, target, trans_b))
    return tile_sizes(mb, target.pt_rows), tile_sizes(nb, qn), tile_sizes(kb, qk)


def tile_sizes(n: int, q: int) -> list[int]:
    """Tile sizes along a block dim of ``n``, ascending: the multiples of ``q`` dividing it. When ``q`` does not
    divide ``n`` (K = 700 in sticks of 64, M = 300 in PT rows of 8), the whole block and ``q`` times powers of two
    below it: the kernels walk a last, shorter tile (the model costs it as a whole one), so a block too big for
    the scratchpad still has tiles that fit."""
    if n % q == 0:
        return [d for d in divisors(n) if d % q == 0]
    return [q << j for j in range((n // q).bit_length()) if q << j < n] + [n]


def matmul_plan(mb: int, nb: int, kb: int, tile: Sequence[int], target: Target, fmt: str = "dlf16",
                out_fmt: str | None = None, *, batch: int = 1, split_k: int = 1, bias: bool = False,
                b_fmt: str | None = None, round_fmt: str | None = None,
                colscale: str | None = None, epi_in: Sequence[str] = (),
                resident: tuple[int, int] | None = None, trans_b: bool = False,
                softmax: str | None = None, epi_temps: int = 0,
                sibling: str | None = None, chain: tuple | None = None,
                prologue: tuple | None = None) -> tuple[int, list[Buffer]] | None:
    """(buffer count, buffers) of a core's [mb, nb, kb] block (``batch`` of them) in ``tile``: double-buffered
    when there is more than one load step, single-buffered for one; None when they do not fit."""
    tm, tn, tk = tile
    nbuf = nbuf_for(batch * _ceil(mb, tm) * _ceil(nb, tn) * _ceil(kb, tk), True)
    bufs = matmul_buffers(tile, fmt, out_fmt, nbuf=nbuf, split_k=split_k, bias=bias, b_fmt=b_fmt,
                          round_fmt=round_fmt, colscale=colscale, epi_in=epi_in, resident=resident,
                          trans_b=trans_b, softmax=softmax, epi_temps=epi_temps, sibling=sibling, chain=chain,
                          prologue=prologue)
    return (nbuf, bufs) if footprint(bufs, target) <= target.scratchpad_usable_bytes else None


@functools.lru_cache(maxsize=1 << 14)
def _buffer_count(mb, nb, kb, tile, target, fmt, out_fmt, batch, split_k, bias, b_fmt, round_fmt, colscale,
                  epi_in, resident=None, trans_b=False, softmax=None, epi_temps=0, sibling=None) -> int | None:
    """:func:`matmul_plan`'s buffer count, remembered: the grid search asks for the same blocks again and again
    (every grid with the same per-core block, every layer of the same shape)."""
    plan = matmul_plan(mb, nb, kb, tile, target, fmt, out_fmt, batch=batch, split_k=split_k, bias=bias, b_fmt=b_fmt,
                       round_fmt=round_fmt, colscale=colscale, epi_in=epi_in, resident=resident, trans_b=trans_b,
                       softmax=softmax, epi_temps=epi_temps, sibling=sibling)
    return None if plan is None else plan[0]


def clear_cache() -> None:
    """Forget the remembered buffer counts, tiles and grids (a benchmark timing cold compiles of the same model
    twice)."""
    for f in (_buffer_count, _best_tile, _best_batch_matmul_grid, best_rows_tile, best_rows_grid, best_conv_grid):
        f.cache_clear()


def best_tile(mb: int, nb: int, kb: int, target: Target, fmt: str = "dlf16", out_fmt: str | None = None, *,
              batch: int = 1, split_k: int = 1, bias: bool = False, active: int = 1,
              force: Sequence[int | None] = (None, None, None), grid: Sequence[int] | None = None,
              b_fmt: str | None = None, round_fmt: str | None = None,
              colscale: str | None = None, epi_in: Sequence[str] = (), trans_b: bool = False,
              softmax: str | None = None, epi_temps: int = 0, sibling: str | None = None
              ) -> tuple[tuple[int, int, int], int, tuple[int, int] | None] | None:
    """The cheapest matmul tile (tm, tn, tk) for a core's [mb, nb, kb] block that fits the usable scratchpad,
    with its buffer count (2: double-buffered) and whether A stays resident (:func:`matmul_buffers`'
    ``resident``, None: not); None when nothing fits. Ties go to the larger tile, then to no resident A.

    ``force`` pins any of the three sizes (0/None: free). ``active`` is the number of cores sharing DRAM.
    ``grid`` = (gm, gn): the block's place in an M/N split, whose cores share A and B tiles over the ring
    (costed as that kernel, A resident when a row has several output tiles); None or a split-K block: the
    block as a one-core problem.
    """
    return _best_tile(mb, nb, kb, target, fmt, out_fmt or fmt, batch, split_k, bias, active, tuple(force),
                      tuple(grid) if grid else None, b_fmt, round_fmt, colscale, tuple(epi_in), trans_b, softmax,
                      epi_temps, sibling)


def _tile_floor(mb: int, nb: int, kb: int, gm: int, gn: int, batch: int, target: Target, fmt: str, out_fmt: str,
                active: int, b_fmt: str | None, trans_b: bool, nmul: int):
    """A lower bound on :func:`matmul_cycles`' total for a tile of a core's [mb, nb, kb] block (as
    :func:`_best_tile` asks for it: on the grid (gm, gn, 1), or alone when gm * gn = 1; any resident mode, bias,
    epilogue, conversion or finishing work): f(tm, tn, tk). The PT array's work, and on an M/N grid each segment's
    ring exchange and B load, are terms of the model that nothing there subtracts, so the model is never below
    them: the tile search skips a tile whose bound exceeds a total it has (test_cost checks the bound against the
    model)."""
    b_fmt = b_fmt or fmt
    pr, pc, lat = target.pt_rows, target.pt_cols, target.pt_latency_cycles
    rate = pt_rate(target, _pt_fmt(fmt))
    dma_lat = target.dma_latency_cycles
    if gm * gn == 1:
        share = _bytes_per_cycle(target, active)

        def floor(tm, tn, tk):
            tiles, steps = batch * _ceil(mb, tm) * _ceil(nb, tn), _ceil(kb, tk)
            pt = tiles * steps * nmul * (_pad(tm, pr) * _pad(tn, pc) * tk / rate + lat)
            moved = tiles * (steps * (tile_bytes(tm, tk, fmt) + nmul * b_tile_bytes(tk, tn, b_fmt, trans_b))
                             + tile_bytes(tm, tn, out_fmt))
            return max(pt, moved / share + tiles * ((1 + nmul) * steps + 1) * dma_lat)
        return floor
    bw = max(target.dram_read_gbps, target.dram_mixed_gbps) / target.clock_ghz / max(1, active)
    rr, hop = target.ring_bytes_per_cycle, target.hop_latency_cycles
    fixed = target.barrier_latency_cycles
    pa = _pt_fmt(fmt)

    def floor(tm, tn, tk):
        n = batch * _ceil(mb, tm) * _ceil(nb, tn) * _ceil(kb, tk)
        pt = nmul * (_pad(tm, pr) * _pad(tn, pc) * tk / rate + lat)
        prow = _ceil(tm, gn)
        a_part = min(tile_bytes(prow, tk, fmt), tile_bytes(prow, tk, pa))
        b_part = nmul * (tile_bytes(_ceil(tn, gm), tk, b_fmt) if trans_b else tile_bytes(_ceil(tk, gm), tn, b_fmt))
        ring = (gn - 1) * (a_part / rr + hop) + (gm - 1) * (b_part / rr + nmul * hop)
        # A's part leaves device memory once per row of output tiles when it stays resident.
        a_load = (tile_bytes(prow, tk, fmt) / bw + dma_lat) / (_ceil(nb, tn) if nb > tn else 1)
        return (n - 1) * max(pt, ring, b_part / bw + nmul * dma_lat + a_load) + pt + n * fixed
    return floor


@functools.lru_cache(maxsize=1 << 12)
def _best_tile(mb, nb, kb, target, fmt, out_fmt, batch, split_k, bias, active, force, grid, b_fmt, round_fmt,
               colscale, epi_in, trans_b, softmax, epi_temps, sibling):
    """:func:`best_tile`, remembered: the passes ask for the same blocks again (spyre-divide-work's grid search,
    spyre-siblings' comparison, spyre-tile, the op model's cost of a grid), and a model's layers share shapes.

    Candidates are costed in the order of a lower bound on their cycles (:func:`_tile_floor`) until that bound
    exceeds the cheapest total found: the rest cannot win. The winner is the one an exhaustive search in
    candidate order (tk innermost, ascending; not resident first) keeps: the least (cycles, -tile size,
    resident), the earliest of equals."""
    cands = matmul_tile_candidates(mb, nb, kb, target, fmt, out_fmt, b_fmt, trans_b)
    cands = [[f] if f else c for f, c in zip(force, cands)]
    gm, gn = grid if grid and split_k == 1 else (1, 1)
    nmul = 2 if sibling else 1
    floor = _tile_floor(mb, nb, kb, gm, gn, batch, target, fmt, out_fmt, active, b_fmt, trans_b, nmul)
    # Every buffer of a matmul is live throughout (matmul_buffers): a tile whose A, B and accumulator alone
    # exceed the scratchpad cannot fit.
    pa, bf, usable = _pt_fmt(fmt), b_fmt or fmt, target.scratchpad_usable_bytes
    order = sorted((floor(*tile), i, tile) for i, tile in enumerate(itertools.product(*cands))
                   if min(tile_bytes(tile[0], tile[2], fmt), tile_bytes(tile[0], tile[2], pa))
                   + b_tile_bytes(tile[2], tile[1], bf, trans_b) + tile_bytes(tile[0], tile[1], FP32) <= usable)
    best = None
    for low, i, tile in order:
        # The bound and the model sum the same terms in other orders: a margin for their rounding.
        if best is not None and low > best[0][0] * (1 + 1e-9):
            break
        tm, tn, tk = tile
        modes = [None]
        if gm * gn > 1 and nb > tn:
            modes.append((_ceil(tm, gn), _ceil(kb, tk)))
        # Double-buffered when there is a next tile (matmul_plan): the cost is known before the fit, which
        # (packing the buffers) is only worth checking for a tile that would win.
        nbuf = nbuf_for(batch * _ceil(mb, tm) * _ceil(nb, tn) * _ceil(kb, tk), True)
        for resident in modes:
            # The block in its grid (operands shared across it), or as a one-core problem with the DRAM share of
            # `active` cores.
            c = matmul_cycles(mb * gm, nb * gn, kb, (gm, gn, 1), tile, target, fmt, out_fmt, batch=batch, bias=bias,
                              double_buffer=nbuf == 2, active=active, b_fmt=b_fmt, round_fmt=round_fmt,
                              epi_in=epi_in, resident=resident is not None, trans_b=trans_b, softmax=softmax,
                              sibling=sibling)
            key = (c.total, -math.prod(tile), resident is not None, i)
            if best is not None and key >= best[0]:
                continue
            if _buffer_count(mb, nb, kb, tile, target, fmt, out_fmt, batch, split_k, bias, b_fmt, round_fmt,
                             colscale, tuple(epi_in), resident, trans_b, softmax, epi_temps, sibling) is not None:
                best = (key, (tuple(tile), nbuf, resident))
    return None if best is None else best[1]


def _matmul_grids(B: int, M: int, N: int, K: int, cores: int, target: Target, fmt: str, out_fmt: str,
                  allow_k: bool, b_fmt: str | None = None, trans_b: bool = False):
    qm = target.pt_rows
    qn = n_quantum(fmt, out_fmt, b_fmt, target, trans_b)
    qk = k_quantum(fmt, b_fmt, target, trans_b)
    for gb in divisors(B):
        for gm in (d for d in divisors(M) if _split_ok(M, d, qm)):
            for gn in range(1, cores // (gb * gm) + 1):
                nb = n_block(N, gn, qn)
                if nb is None:
                    continue
                for gk in (d for d in divisors(K) if _split_ok(K, d, qk) and (allow_k or d == 1)):
                    # A ragged N split only without a K split (the M/N kernel's lock-step).
                    if gb * gm * gn * gk <= cores and (nb * gn == N or gk == 1):
                        yield gb, gm, gn, gk


def best_batch_matmul_grid(B: int, M: int, N: int, K: int, cores: int, target: Target, fmt: str = "dlf16",
                           out_fmt: str | None = None, bias: bool = False, b_fmt: str | None = None,
                           round_fmt: str | None = None, colscale: str | None = None, split_k: int | None = None,
                           split_m: int | None = None, epi_in: Sequence[str] = (),
                           trans_b: bool = False, softmax: str | None = None,
                           epi_temps: int = 0, sibling: str | None = None, epi_ops: Sequence[str] = (),
                           chain_dv: int = 0, prune: bool = True) -> tuple[int, int, int, int] | None:
    """The cheapest (gb, gm, gn, gk) with product <= cores, stick-aligned splits (M evenly in multiples of the PT
    rows, N in whole sticks of B and the result, evenly or ragged (:func:`n_block`, one tile column per core),
    K evenly in whole sticks of A), each core's span within the target's
    ``core_span_bytes``, and a tile that fits. K is split only when the batch, M and N together cannot use
    every core; ``split_k`` and ``split_m`` force the K and M splits (a card's share of a matmul keeps the whole
    op's, so each core computes the same tiles). ``epi_ops``, ``chain_dv``: the work finishing each output tile
    (:func:`finish_cycles`), weighed where grids compete; each grid's tile is picked without it, so matmuls of
    one shape on one grid get one tile. None when no division keeps each core's span in range. ``prune`` False
    costs every grid (the exhaustive search the pruned one must agree with)."""
    return _best_batch_matmul_grid(B, M, N, K, cores, target, fmt, out_fmt or fmt, bias, b_fmt, round_fmt, colscale,
                                   split_k, split_m, tuple(epi_in), trans_b, softmax, epi_temps, sibling,
                                   tuple(epi_ops), chain_dv, prune)


@functools.lru_cache(maxsize=1 << 12)
def _best_batch_matmul_grid(B, M, N, K, cores, target, fmt, out_fmt, bias, b_fmt, round_fmt, colscale, split_k,
                            split_m, epi_in, trans_b, softmax, epi_temps, sibling, epi_ops, chain_dv, prune):
    """:func:`best_batch_matmul_grid`, remembered: every pass that models an op asks for its grid (through
    the op model), and a model's layers share shapes."""
    full = max((gb * gm * gn for gb, gm, gn, _ in _matmul_grids(B, M, N, K, cores, target, fmt, out_fmt, False,
                                                                b_fmt, trans_b)), default=0)
    grids = []
    for g in _matmul_grids(B, M, N, K, cores, target, fmt, out_fmt, full < cores or (split_k or 1) > 1, b_fmt,
                           trans_b):
        gb, gm, gn, gk = g
        if (split_k is not None and gk != split_k) or (split_m is not None and gm != split_m):
            continue
        if softmax and (gn > 1 or gk > 1):
            continue        # a softmax epilogue needs whole rows on one core
        if matmul_span(M, N, K, g, fmt, out_fmt, B, b_fmt, trans_b, 2 if sibling else 1) > target.core_span_bytes:
            continue
        nb = n_block(N, gn, n_quantum(fmt, out_fmt, b_fmt, target, trans_b))
        tn = nb if nb * gn != N or softmax else None
        grids.append((_grid_floor(B, M, K, g, nb, target, fmt, sibling) if prune else 0.0, len(grids), g, nb, tn))
    # Grids in the order of a lower bound on their cost, until it exceeds the cheapest found: the rest cannot win
    # (and then no tile search runs for them). The winner is the exhaustive search's: ties keep the order above.
    best = None
    for low, i, g, nb, tn in sorted(grids):
        if best is not None and low > best[0][0] * (1 + 1e-9):
            break
        gb, gm, gn, gk = g
        active = gb * gm * gn * gk
        fit = best_tile(M // gm, nb, K // gk, target, fmt, out_fmt, batch=B // gb, split_k=gk, bias=bias,
                        active=active, grid=(gm, gn), b_fmt=b_fmt, round_fmt=round_fmt, colscale=colscale,
                        epi_in=epi_in, force=(None, tn, None), trans_b=trans_b, softmax=softmax,
                        epi_temps=epi_temps, sibling=sibling)
        if fit is None:
            continue
        c = matmul_cycles(M, N, K, g, fit[0], target, fmt, out_fmt, batch=B, bias=bias, double_buffer=fit[1] == 2,
                          b_fmt=b_fmt, round_fmt=round_fmt, epi_in=epi_in, resident=fit[2] is not None,
                          trans_b=trans_b, softmax=softmax, sibling=sibling, epi_ops=epi_ops, chain_dv=chain_dv)
        key = (c.total, gk, active, i)       # ties: no K split, then fewer cores, then the first
        if best is None or key < best[0]:
            best = (key, g)
    return None if best is None else best[1]


def _grid_floor(B: int, M: int, K: int, grid: Sequence[int], nb: int, target: Target, fmt: str,
                sibling: str | None) -> float:
    """A lower bound on what :func:`best_batch_matmul_grid` costs ``grid`` (``nb``: its busiest core's N block):
    that core's multiply-accumulates at the PT array's rate, which every tile's PT work (:func:`_tile_floor`)
    pads and adds latency to; 0 for a K split, whose kernel is not bounded that way. test_cost checks it against
    the grid's model."""
    gb, gm, gn, gk = grid
    if gk > 1:
        return 0.0
    return _ceil(B, gb) * _ceil(M, gm) * nb * K * (2 if sibling else 1) / pt_rate(target, _pt_fmt(fmt))


def best_matmul_grid(M: int, N: int, K: int, cores: int, target: Target, fmt: str = "dlf16",
                     out_fmt: str | None = None, bias: bool = False) -> tuple[int, int, int] | None:
    """The cheapest matmul grid (gm, gn, gk); see :func:`best_batch_matmul_grid`."""
    g = best_batch_matmul_grid(1, M, N, K, cores, target, fmt, out_fmt, bias)
    return None if g is None else g[1:]


# ------------------------------------------------------------------------------------------------------------
# Row-wise ops: grid (gr,), tile (tr,)


@dataclasses.dataclass(frozen=True)
class RowOperand:
    """A tensor a row-wise kernel moves through the scratchpad.

    ``elems`` elements per row (the whole tensor when not ``streamed``), laid out in rows of ``cols`` (the
    innermost dim). Streamed operands get a new tile per row tile and two buffers when double-buffered
    (``<role>0``, ``<role>1``); the others load once into one buffer named ``role``.
    """

    role: str
    elems: int
    cols: int
    fmt: str
    streamed: bool = True
    buffered: bool = True        # False: moved by DMA straight into another operand's tile (a row gather)

    def tile_bytes(self, tr: int) -> int:
        n = self.elems * (tr if self.streamed else 1)
        if n >= self.cols and n % self.cols == 0:
            return tile_bytes(n // self.cols, self.cols, self.fmt)
        return tile_bytes(_ceil(n, self.cols), min(self.cols, n), self.fmt)


@dataclasses.dataclass(frozen=True)
class RowTemp:
    """A single-buffered temporary of ``elems`` per row in rows of ``cols``, live in steps first..last."""

    name: str
    elems: int
    cols: int
    fmt: str
    first: int
    last: int


@dataclasses.dataclass(frozen=True)
class RowKernel:
    """A row-wise kernel: ``rows`` split across cores and tiles, whole rows on a core.

    ``inputs`` and ``outputs`` are the operands (streamed ones double-buffered), ``temps`` the fp32 working
    tiles with their lifetimes in the kernel's steps (``steps`` per tile), ``sfu`` the SFU passes per element
    of the largest streamed operand as (cost class, count); ``extra_span`` device bytes every core addresses besides its rows (a
    gather's table). ``prefetch`` False: the kernel loads a tile's rows inside its work (a gather per window
    row or per reduced row), so nothing is double-buffered.
    """

    rows: int
    inputs: tuple[RowOperand, ...]
    outputs: tuple[RowOperand, ...]
    temps: tuple[RowTemp, ...] = ()
    sfu: tuple[tuple[str, float], ...] = ()
    steps: int = 2
    extra_span: int = 0
    prefetch: bool = True


def rowwise_buffers(k: RowKernel, tr: int, nbuf: int = 2) -> list[Buffer]:
    """Streamed inputs and outputs (``in0 in1``, ``out0 out1``, ...) live across the whole kernel because the
    next tile's DMA overlaps this tile's compute; fixed operands (weights) too; temporaries only in their steps,
    so temporaries whose steps do not overlap share bytes."""
    end = k.steps
    bufs: list[Buffer] = []
    for o in (*k.inputs, *k.outputs):
        if not o.buffered:
            continue
        if o.streamed:
            bufs += [Buffer(f"{o.role}{i}", o.tile_bytes(tr), 0, end) for i in range(nbuf)]
        else:
            bufs.append(Buffer(o.role, o.tile_bytes(tr), 0, end))
    bufs += [Buffer(t.name, RowOperand(t.name, t.elems, t.cols, t.fmt).tile_bytes(tr), t.first, t.last)
             for t in k.temps]
    return bufs


def rowwise_cycles(k: RowKernel, grid: Sequence[int], tile: Sequence[int] | None, target: Target,
                   double_buffer: bool = True, active: int | None = None) -> Cycles:
    """Cycles of a row-wise kernel on ``grid`` = (gr,) in tiles of ``tile`` = (tr,) rows (None: one tile)."""
    (gr,) = grid
    rb = _ceil(k.rows, gr)
    tr = tile[0] if tile else rb
    tiles = _ceil(rb, tr)
    streamed = [o for o in (*k.inputs, *k.outputs) if o.streamed]
    work = max((o.elems for o in streamed), default=0)
    per_elem = sum(n * target.sfu_cycles(cls) for cls, n in k.sfu)
    sfu = tiles * (tr * work * per_elem / target.sfu_lanes_per_core + target.sfu_latency_cycles * len(k.sfu))
    fixed = [o for o in k.inputs if not o.streamed]
    latency = (tiles * len(streamed) + len(fixed)) * target.dma_latency_cycles
    if tiles == 1 and gr > 1 and k.prefetch:
        # One tile a core (codegen rows.run_tiles): every core loads, a barrier, then computes and stores, so each
        # phase moves at the read or the write bandwidth (runtime/cycles.py prices a barrier segment by what it
        # moves), and nothing overlaps.
        cores = max(1, active or gr) / target.clock_ghz
        loads = sum(o.tile_bytes(tr) for o in k.inputs)
        stores = sum(o.tile_bytes(tr) for o in k.outputs if o.streamed)
        dma = loads * cores / target.dram_read_gbps + stores * cores / target.dram_write_gbps + latency
        return Cycles(sfu=sfu, dma=dma, total=sfu + dma + 2 * sync_cycles(gr, target))
    moved = tiles * sum(o.tile_bytes(tr) for o in streamed) + sum(o.tile_bytes(tr) for o in fixed)
    dma = moved / _bytes_per_cycle(target, active or gr) + latency
    return Cycles(sfu=sfu, dma=dma, total=_overlap(sfu, dma, tiles, double_buffer and k.prefetch)
                  + sync_cycles(gr, target))


def rowwise_span(k: RowKernel, gr: int) -> int:
    rb = _ceil(k.rows, gr)
    return sum(o.tile_bytes(rb) for o in (*k.inputs, *k.outputs)) + k.extra_span


def _rows_cut_ok(k: RowKernel, n: int, target: Target) -> bool:
    """Cutting after ``n`` rows keeps every streamed operand's DMA rows whole sticks: a row of an operand whose
    rows are narrower than its innermost dim (a reduction's [R] result) must end on a stick boundary."""
    return all((n * o.elems) % o.cols == 0 or (n * o.elems) % stick_elems(o.fmt, target) == 0
               for o in (*k.inputs, *k.outputs) if o.streamed)


def rows_plan(k: RowKernel, gr: int, tr: int, target: Target) -> tuple[int, list[Buffer]] | None:
    """(buffer count, buffers) for tiles of ``tr`` rows on ``gr`` cores; None when they do not fit."""
    tiles = _ceil(_ceil(k.rows, gr), tr)
    for nbuf in (2, 1):
        bufs = rowwise_buffers(k, tr, nbuf)
        if nbuf == nbuf_for(tiles, k.prefetch) and footprint(bufs, target) <= target.scratchpad_usable_bytes:
            return nbuf, bufs
    return None


# Remembered, as _best_tile: every pass that models an op asks again, and a model's layers share shapes.
@functools.lru_cache(maxsize=1 << 12)
def best_rows_tile(k: RowKernel, gr: int, target: Target, force: int | None = None
                   ) -> tuple[tuple[int], int] | None:
    """The cheapest rows-per-tile ``(tr,)`` dividing a core's rows whose buffers fit, and the buffer count
    (2: double-buffered). Ties go to the larger tile. None when not even one row fits."""
    rb = _ceil(k.rows, gr)
    cands = [force] if force else [d for d in divisors(rb) if d == rb or _rows_cut_ok(k, d, target)]
    best = None
    for tr in cands:
        plan = rows_plan(k, gr, tr, target)
        if plan is None:
            continue
        key = (rowwise_cycles(k, (gr,), (tr,), target, plan[0] == 2).total, -tr)
        if best is None or key < best[0]:
            best = (key, ((tr,), plan[0]))
    return None if best is None else best[1]


# Remembered, as _best_tile: every pass that models an op asks again, and a model's layers share shapes.
@functools.lru_cache(maxsize=1 << 12)
def best_rows_grid(k: RowKernel, cores: int, target: Target) -> tuple[int] | None:
    """The cheapest ``(gr,)``: gr <= cores dividing the rows evenly, each core's span in range, a tile that
    fits. Ties go to fewer cores, so tiny ops stay on one core."""
    best = None
    for gr in divisors(k.rows):
        if gr > cores or rowwise_span(k, gr) > target.core_span_bytes or \
                (gr > 1 and not _rows_cut_ok(k, k.rows // gr, target)):
            continue
        fit = best_rows_tile(k, gr, target)
        if fit is None:
            continue
        key = (rowwise_cycles(k, (gr,), fit[0], target, fit[1] == 2).total, gr)
        if best is None or key < best[0]:
            best = (key, (gr,))
    return None if best is None else best[1]


# ------------------------------------------------------------------------------------------------------------
# conv2d as an implicit GEMM: grid (gn, gf, goh), tile (tn, tf, toh) with tn = 1


@dataclasses.dataclass(frozen=True)
class ConvKernel:
    """NCHW conv2d as an implicit GEMM on the PT array (``codegen/kernels/conv.py``): batch n, filters f, output
    rows oh x cols ow; c input channels in c // groups per group, kh x kw window, h input rows counting the
    padding, w input columns (stored: the W padding is the window's zeros), strides/dilations along H.

    A tile is one image's [tf filters x toh output rows]. Its input patch (rows (input row, channel) of the
    channels its filters read, ``in_channels(tf)``) is loaded once; for every output row and kernel column (and
    kernel row when dilated along H) the PT array multiplies the tile's filters [tf, ``rows_per_product`` x
    channels] by ``rows_per_product`` consecutive input rows of the patch read through a column window (the
    kernel column's shift, the stride, the zero padding), accumulating [tf, ow] in fp32. Groups other than 1
    multiply block-diagonal filters (zero where a channel is not the filter's group). Data in a format the PT
    array does not multiply (fp32 in fp32-reference, or an fp32 input whose cast spyre-fuse folded, its filters
    in ``w_fmt``) is converted to DLFloat16 on the SFU after each load.

    ``pool`` (window rows, window cols): a non-overlapping max/avg pool (``pool_avg``) the kernel applies to each
    output tile before its store (``codegen/kernels/conv.py``), so the tile's pooled rows, in ``pool_fmt``, are
    what goes to device memory; the tile's output rows are then whole windows."""

    n: int
    f: int
    oh: int
    ow: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    groups: int = 1
    stride_h: int = 1
    dil_h: int = 1
    fmt: str = "dlf16"
    out_fmt: str = "dlf16"
    bias: bool = False
    pool: tuple[int, int] | None = None
    pool_avg: bool = False
    pool_fmt: str = "dlf16"
    w_fmt: str | None = None         # the filters' format when not the input's (an f32 input converted on chip)
    epi_ops: tuple[str, ...] = ()    # the SFU classes of the epilogue map it applies to each tile (a ReLU)
    patches: int = 1                 # input patches a0 holds at once (spyre-chain-convs: every one of a core's)

    @property
    def filter_fmt(self) -> str:
        return self.w_fmt or self.fmt

    @property
    def pool_ow(self) -> int:
        """Columns of the stored rows: the pooled width with a pool, else the output width."""
        return self.ow // self.pool[1] if self.pool else self.ow

    def stored_rows(self, toh: int) -> int:
        """Rows per filter a tile of ``toh`` output rows stores (its pooled rows with a pool)."""
        return toh // self.pool[0] if self.pool else toh

    def in_rows(self, toh: int) -> int:
        return min(self.h, (toh - 1) * self.stride_h + self.dil_h * (self.kh - 1) + 1)

    def patches_per_core(self, grid: Sequence[int], tile: Sequence[int]) -> int:
        """The distinct input patches of a core's tiles: its images x output-row tiles, x its filter tiles when
        groups > 1 (each reads other channels; with groups 1 every filter tile reads the same patch)."""
        gn, gf, goh = grid
        _, tf, toh = tile
        per = _ceil(self.n, gn) * _ceil(_ceil(self.oh, goh), toh)
        return per * (_ceil(_ceil(self.f, gf), tf) if self.groups > 1 else 1)

    def in_channels(self, tf: int) -> int:
        cg, fg = self.c // self.groups, self.f // self.groups
        return cg * min(self.groups, _ceil(tf, fg))

    @property
    def rows_per_product(self) -> int:
        """Kernel rows one product folds into its K: all of them when they are consecutive input rows."""
        return self.kh if self.dil_h == 1 else 1

    @property
    def products(self) -> int:
        """PT products per output row."""
        return self.kw * (self.kh // self.rows_per_product)


def conv_buffers(k: ConvKernel, tile: Sequence[int], nbuf: int = 2) -> list[Buffer]:
    """a0 a1: input patch [input rows x channels, w]; b0 b1: filters [products x tf, rows_per_product x
    channels] (one block per product); pa pb: their DLFloat16 copies when the data is in a format the PT array
    does not multiply; acc fp32 and out [toh x tf, ow] (rows (output row, filter)); bias fp32 [tf, 1]. All live
    throughout. a0 holds ``k.patches`` patches one after another (spyre-chain-convs)."""
    _, tf, toh = tile
    cin = k.in_channels(tf)
    a = tile_bytes(cin * k.in_rows(toh), k.w, k.fmt)
    b = tile_bytes(k.products * tf, k.rows_per_product * cin, k.filter_fmt)
    bufs = [Buffer(f"a{i}", a * (k.patches if i == 0 else 1)) for i in range(nbuf)]
    bufs += [Buffer(f"b{i}", b) for i in range(nbuf)]
    if _pt_fmt(k.fmt) != k.fmt:
        bufs.append(Buffer("pa", tile_bytes(cin * k.in_rows(toh), k.w, "dlf16")))
    if _pt_fmt(k.filter_fmt) != k.filter_fmt:
        bufs.append(Buffer("pb", tile_bytes(k.products * tf, k.rows_per_product * cin, "dlf16")))
    bufs += [Buffer("acc", tile_bytes(toh * tf, k.ow, FP32)), Buffer("out", tile_bytes(toh * tf, k.ow, k.out_fmt))]
    if k.bias:
        bufs.append(Buffer("bias", tile_bytes(tf, 1, FP32)))
    if k.pool:
        # psel: the 0/1 column selections [ow, pooled ow], one per window column, stacked (loaded once, by one
        # DMA); pct (a selection's product) and pres (the window so far) fp32 and pout (the stored tile)
        # [pooled rows x tf, pooled ow].
        rows = k.stored_rows(toh) * tf
        bufs.append(Buffer("psel", tile_bytes(k.pool[1] * k.ow, k.pool_ow, k.out_fmt)))
        bufs += [Buffer("pct", tile_bytes(rows, k.pool_ow, FP32)), Buffer("pres", tile_bytes(rows, k.pool_ow, FP32)),
                 Buffer("pout", tile_bytes(rows, k.pool_ow, k.pool_fmt))]
    return bufs


def conv_cycles(k: ConvKernel, grid: Sequence[int], tile: Sequence[int] | None, target: Target,
                double_buffer: bool = True, active: int | None = None) -> Cycles:
    """A core walks its filter tiles (loading their filters and bias once), and for each its images and
    output-row tiles: load the patch, ``toh x products`` PT products, the bias (SFU, per output row) and one
    rounding (the last product's write-back, or an SFU cast after the bias), one store; with a pool, per window
    cell a selection product of each pooled row and an SFU combine, one rounding, and the pooled rows stored."""
    gn, gf, goh = grid
    nb, fb, ohb = _ceil(k.n, gn), _ceil(k.f, gf), _ceil(k.oh, goh)
    _, tf, toh = tile or (1, fb, ohb)
    nft = _ceil(fb, tf)
    tiles = nb * nft * _ceil(ohb, toh)
    depth = k.rows_per_product * k.in_channels(tf)
    pt_tile, sfu_tile, _ = _conv_tile_work(k, tf, toh, target)
    pt, sfu = tiles * pt_tile, tiles * sfu_tile
    lanes, simple = target.sfu_lanes_per_core, target.sfu_cycles("simple")
    if _pt_fmt(k.fmt) != k.fmt:            # the patch every tile
        sfu += tiles * (k.in_rows(toh) * k.in_channels(tf) * k.w * simple / lanes + target.sfu_latency_cycles)
    if _pt_fmt(k.filter_fmt) != k.filter_fmt:       # the filters every filter tile
        sfu += nft * (k.products * tf * depth * simple / lanes + target.sfu_latency_cycles)
    bufs = {b.name: b.nbytes for b in conv_buffers(k, (1, tf, toh), 1)}
    consts = bufs["b0"] + bufs.get("bias", 0)                  # per filter tile
    sel = bufs["psel"] if k.pool else 0           # once per core
    moved = tiles * (bufs["a0"] + bufs["out"])
    transfers = 2 * tiles
    if k.pool:
        moved += tiles * (bufs["pout"] - bufs["out"])
    cores = gn * gf * goh
    bw = _bytes_per_cycle(target, active or cores)
    if conv_shares(k, grid, tile):
        # Each core loads its part of the constants and multicasts it (a copy per destination), one barrier.
        g = gn * goh
        parts = (1 + k.bias) + bool(k.pool)
        ring = ((g - 1) * (consts / g / target.ring_bytes_per_cycle + target.hop_latency_cycles)
                + (cores - 1) * (sel / cores / target.ring_bytes_per_cycle + target.hop_latency_cycles))
        if conv_phased(k, grid, tile):
            # The patch loads with the constants (reads only), the segment after the barrier stores (writes only).
            # The tile is computed and stored in pieces (conv_pieces), each piece's store behind the next one's work.
            # Rows the patches share are loaded once and sent on (conv_patch_sharing); a patch that arrives over
            # the ring whole (spyre-chain-convs) is priced as loaded (the cost model does not know chains).
            share = max(1, active or cores) / target.clock_ghz
            patch, passed, sends = conv_patch_sharing(k, grid, tile)
            ring += passed / target.ring_bytes_per_cycle + sends * target.hop_latency_cycles
            loads = (consts / g + sel / cores + patch) * share / target.dram_read_gbps
            pre = loads + (parts + 1) * target.dma_latency_cycles + ring + target.barrier_latency_cycles
            q = len(conv_pieces(k, (1, tf, toh), target, active or cores))
            work, store = _conv_piece_spans(k, tf, toh, target, active or cores, q)
            return Cycles(pt=pt, sfu=sfu, dma=loads + q * (store - target.dma_latency_cycles)
                          + (parts + 1 + q) * target.dma_latency_cycles, ring=ring,
                          total=pre + (sfu - sfu_tile) + pipeline_span(work, store, q) + sync_cycles(cores, target))
        pre = (consts / g + sel / cores) / bw + parts * target.dma_latency_cycles + ring \
            + target.barrier_latency_cycles
        dma = moved / bw + transfers * target.dma_latency_cycles
        return Cycles(pt=pt, sfu=sfu, dma=dma + pre - ring, ring=ring,
                      total=pre + _overlap(pt + sfu, dma, tiles, double_buffer) + sync_cycles(cores, target))
    moved += nft * consts + sel
    transfers += nft * (1 + k.bias) + bool(k.pool)
    dma = moved / bw + transfers * target.dma_latency_cycles
    return Cycles(pt=pt, sfu=sfu, dma=dma,
                  total=_overlap(pt + sfu, dma, tiles, double_buffer) + sync_cycles(cores, target))


def _conv_tile_work(k: ConvKernel, tf: int, toh: int, target: Target) -> tuple[float, float, float]:
    """(PT cycles, SFU cycles, the SFU's fixed latency part) of one [tf x toh] conv tile after its loads: the
    products, the bias (per output row) and its rounding, the epilogue map, the pool's selections and
    combines."""
    depth = k.rows_per_product * k.in_channels(tf)
    pt = toh * k.products * (_pad(tf, target.pt_rows) * _pad(k.ow, target.pt_cols) * depth
                             / pt_rate(target, _pt_fmt(k.fmt)) + target.pt_latency_cycles)
    lanes, simple, lat = target.sfu_lanes_per_core, target.sfu_cycles("simple"), target.sfu_latency_cycles
    sfu = fixed = 0.0
    if k.bias:
        fixed = (toh + 1) * lat
        sfu = fixed + 2 * toh * tf * k.ow * simple / lanes
    if k.epi_ops:
        sfu += sum(target.sfu_cycles(c) for c in k.epi_ops) * toh * tf * k.ow / lanes + len(k.epi_ops) * lat
        fixed += len(k.epi_ops) * lat
    if k.pool:
        ph, pw = k.pool
        prow = k.stored_rows(toh)
        pt += toh * pw * (_pad(tf, target.pt_rows) * _pad(k.pool_ow, target.pt_cols) * k.ow
                          / pt_rate(target, _pt_fmt(k.out_fmt)) + target.pt_latency_cycles)
        combines = ph * pw + k.pool_avg + 1          # the window's cells, the average's scale, the rounding
        sfu += combines * (prow * tf * k.pool_ow * simple / lanes + lat)
        fixed += combines * lat
    return pt, sfu, fixed


def _conv_piece_spans(k: ConvKernel, tf: int, toh: int, target: Target, active: int, q: int
                      ) -> tuple[float, float]:
    """(work, store) cycles of each of ``q`` pieces of a [tf x toh] conv tile (:func:`conv_pieces`)."""
    pt, sfu, fixed = _conv_tile_work(k, tf, toh, target)
    out = tile_bytes(k.stored_rows(toh) * tf, k.pool_ow if k.pool else k.ow, k.pool_fmt if k.pool else k.out_fmt)
    store = out * active / (target.dram_write_gbps / target.clock_ghz)
    # Each piece pays its SFU ops' latencies again (the bias's per-row ones are per row anyway).
    per_piece = fixed - (toh * target.sfu_latency_cycles if k.bias else 0.0)
    return (pt + sfu - per_piece) / q + per_piece, store / q + target.dma_latency_cycles


def conv_pieces(k: ConvKernel, tile: Sequence[int], target: Target, active: int) -> tuple[tuple[int, int], ...]:
    """Output rows [lo, hi) of the pieces a core holding one conv tile (:func:`conv_phased`) computes, finishes
    and stores it in, whole pool windows each, so each piece's store overlaps the next piece's products: the
    count that minimizes the pipeline's span (:func:`pipeline_span`)."""
    _, tf, toh = tile
    unit = k.pool[0] if k.pool else 1
    units = max(1, toh // unit)
    q = min(range(1, units + 1), key=lambda q: pipeline_span(*_conv_piece_spans(k, tf, toh, target, active, q), q))
    return tuple((lo * unit, hi * unit) for lo, hi in row_blocks(units, q))


def conv_shares(k: ConvKernel, grid: Sequence[int], tile: Sequence[int]) -> bool:
    """Whether the conv kernel shares its constants over the ring (``codegen/kernels/conv.py``): on several cores
    each with one filter tile, the cores of a filter block load a part of its filters and bias each and
    multicast it, all cores likewise the pool's selections, once before the loop."""
    gn, gf, goh = grid
    return gn * gf * goh > 1 and tile[1] == _ceil(k.f, gf)


def conv_phased(k: ConvKernel, grid: Sequence[int], tile: Sequence[int]) -> bool:
    """Whether the conv kernel loads each core's patch before the barrier that delivers the shared constants
    (``codegen/kernels/conv.py``): it shares them (:func:`conv_shares`) and every core has one tile, so the
    segment after that barrier only computes and stores."""
    gn, gf, goh = grid
    _, tf, toh = tile
    return conv_shares(k, grid, tile) and _ceil(k.n, gn) * _ceil(_ceil(k.f, gf), tf) * _ceil(_ceil(k.oh, goh), toh) == 1


def shared_rows(ranges: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Who loads which rows when several cores need overlapping row ranges [lo, hi) of one tensor (the input
    patches of a phased conv's cores, :func:`conv_patch_sharing`): each needed row is loaded by one core that needs
    it and sent to the others. The rows, in order, are cut into len(ranges) even runs, the i-th taken by the i-th
    range in (lo, index) order when that range holds it (else by the first range holding it), so neighbours' halo
    rows are loaded once and cores with the same range split it. Returns each range's loaded runs [(lo, hi)]."""
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], i))
    rows = sorted({r for lo, hi in ranges for r in range(lo, hi)})
    owned: list[list[tuple[int, int]]] = [[] for _ in ranges]
    for n, r in enumerate(rows):
        i = order[n * len(order) // len(rows)]
        if not ranges[i][0] <= r < ranges[i][1]:
            i = next(j for j in order if ranges[j][0] <= r < ranges[j][1])
        runs = owned[i]
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return owned


def conv_patch_groups(grid: Sequence[int]) -> list[list[int]]:
    """The cores of a phased conv (:func:`conv_phased`: one tile each) that share their patches' halo rows: those of
    one image and filter block, along the output rows. (Filter blocks of a groups-1 conv read the same rows too,
    but a conv sharing them gets picked wide where its input then crosses the ring once per filter block:
    spyre-chain-convs, which the cost model does not see.)"""
    gn, gf, goh = grid
    return [list(range(b * goh, (b + 1) * goh)) for b in range(gn * gf)]


def conv_patch_sharing(k: ConvKernel, grid: Sequence[int], tile: Sequence[int]) -> tuple[float, float, int]:
    """For a phased conv reading its input from device memory, whose cores load the rows their patches share once
    (:func:`shared_rows`) and pass them on over the ring before its barrier: (patch bytes a core loads, bytes it
    receives, on average over the cores; the most sends a core makes). Every group of :func:`conv_patch_groups`
    has the same patches. Rows counted with the padding's (an upper bound: a core zero-fills those)."""
    goh, ohb, sh = grid[2], _ceil(k.oh, grid[2]), k.stride_h
    ranges = [(l * ohb * sh, min(k.h, l * ohb * sh + k.in_rows(ohb))) for l in range(goh)]
    owned = shared_rows(ranges)
    loaded = sum(b - a for runs in owned for a, b in runs)
    received = sum(hi - lo for lo, hi in ranges) - loaded
    sends = max(sum(1 for a, b in runs for j, (lo, hi) in enumerate(ranges) if j != i and min(b, hi) > max(a, lo))
                for i, runs in enumerate(owned))
    row = tile_bytes(k.in_channels(tile[1]), k.w, k.fmt)
    return loaded * row / goh, received * row / goh, sends


def conv_constants_cycles(k: ConvKernel, grid: Sequence[int], tile: Sequence[int], target: Target) -> float:
    """Cycles a ring-sharing conv (:func:`conv_shares`) spends loading its constants and multicasting them before
    its work: what loading them during an earlier kernel (spyre-prefetch) takes off its critical path."""
    gn, gf, goh = grid
    cores, g = gn * gf * goh, gn * goh
    bufs = {b.name: b.nbytes for b in conv_buffers(k, tile, 1)}
    consts, sel = bufs["b0"] + bufs.get("bias", 0), bufs["psel"] if k.pool else 0
    share = cores / target.clock_ghz
    ring = ((g - 1) * (consts / g / target.ring_bytes_per_cycle + target.hop_latency_cycles)
            + (cores - 1) * (sel / cores / target.ring_bytes_per_cycle + target.hop_latency_cycles))
    return ((consts / g + sel / cores) * share / target.dram_read_gbps
            + ((1 + k.bias) + bool(k.pool)) * target.dma_latency_cycles + ring)


def conv_last_segment(k: ConvKernel, grid: Sequence[int], tile: Sequence[int], target: Target
                      ) -> tuple[float, float]:
    """(compute, store) cycles of a phased conv's segment after its barrier (:func:`conv_phased`): the PT and SFU
    work of its one tile, and its stores (write-only DRAM traffic)."""
    cores = grid[0] * grid[1] * grid[2]
    q = len(conv_pieces(k, tile, target, cores))
    work, store = _conv_piece_spans(k, tile[1], tile[2], target, cores, q)
    return q * work, q * store


def conv_span(k: ConvKernel, grid: Sequence[int]) -> int:
    gn, gf, goh = grid
    nb, fb, ohb = _ceil(k.n, gn), _ceil(k.f, gf), _ceil(k.oh, goh)
    out = tile_bytes(fb * k.stored_rows(ohb), k.pool_ow, k.pool_fmt if k.pool else k.out_fmt)
    filters = tile_bytes(k.products * fb, k.rows_per_product * k.in_channels(fb), k.fmt)
    return nb * (tile_bytes(k.in_channels(fb) * k.in_rows(ohb), k.w, k.fmt) + out) + filters


def conv_plan(k: ConvKernel, grid: Sequence[int], tile: Sequence[int], target: Target
              ) -> tuple[int, list[Buffer]] | None:
    gn, gf, goh = grid
    tiles = _ceil(k.n, gn) * _ceil(_ceil(k.f, gf), tile[1]) * _ceil(_ceil(k.oh, goh), tile[2])
    for nbuf in (2, 1):
        bufs = conv_buffers(k, tile, nbuf)
        if nbuf == nbuf_for(tiles, True) and footprint(bufs, target) <= target.scratchpad_usable_bytes:
            return nbuf, bufs
    return None


def conv_tile_candidates(k: ConvKernel, grid: Sequence[int], target: Target,
                         force: Sequence[int | None] = (None, None, None)) -> tuple[list[int], list[int]]:
    """Filters per tile (multiples of the PT rows, the product's M, dividing the core's filters) and output rows
    per tile (whole pool windows with a pool)."""
    fb, ohb = _ceil(k.f, grid[1]), _ceil(k.oh, grid[2])
    tfs = [force[1]] if force[1] else ([d for d in divisors(fb) if d % target.pt_rows == 0] or [fb])
    tohs = [force[2]] if force[2] else [d for d in divisors(ohb) if not k.pool or d % k.pool[0] == 0]
    return tfs, tohs


def best_conv_tile(k: ConvKernel, grid: Sequence[int], target: Target,
                   force: Sequence[int | None] = (None, None, None)) -> tuple[tuple[int, int, int], int] | None:
    """The cheapest conv tile (1, tf, toh): filters in multiples of the PT rows, output rows dividing the
    core's block; with its buffer count. None when nothing fits."""
    tfs, tohs = conv_tile_candidates(k, grid, target, force)
    best = None
    for tile in ((1, tf, toh) for tf in tfs for toh in tohs):
        plan = conv_plan(k, grid, tile, target)
        if plan is None:
            continue
        key = (conv_cycles(k, grid, tile, target, plan[0] == 2).total, -(tile[1] * tile[2]))
        if best is None or key < best[0]:
            best = (key, (tile, plan[0]))
    return None if best is None else best[1]


# Remembered, as _best_tile: every pass that models an op asks again, and a model's layers share shapes.
@functools.lru_cache(maxsize=1 << 12)
def best_conv_grid(k: ConvKernel, cores: int, target: Target) -> tuple[int, int, int] | None:
    """The cheapest (gn, gf, goh): even splits, filters in multiples of the PT columns."""
    best = None
    for gn in divisors(k.n):
        for gf in (d for d in divisors(k.f) if _split_ok(k.f, d, target.pt_cols)):
            for goh in divisors(k.oh):
                g = (gn, gf, goh)
                if k.pool and (k.oh // goh) % k.pool[0]:
                    continue            # a core's output rows are whole pool windows
                if gn * gf * goh > cores or conv_span(k, g) > target.core_span_bytes:
                    continue
                fit = best_conv_tile(k, g, target)
                if fit is None:
                    continue
                key = (conv_cycles(k, g, fit[0], target, fit[1] == 2).total, gn * gf * goh)
                if best is None or key < best[0]:
                    best = (key, g)
    return None if best is None else best[1]
