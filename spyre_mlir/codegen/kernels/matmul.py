"""The matmul kernel (generalising ``spyre_mlir.runtime.kernels``' reference matmul to arbitrary device tensors).

:func:`matmul` (also each batch of ``batch_matmul``): a ``[gm, gn, gk]`` grid of cores, output tiles
``[tm, tn]`` walked in ``tk`` steps with fp32 accumulation, ping-pong A/B tiles when double buffering, split-K
partial sums combined by a ring reduce-sum on the group's first core, bias (and per-column weight scales of
fp8/int8 weights) applied on write-back. An M/N split shares operands over the ring: the cores of a grid row
load one part each of their common A tile and exchange the parts (all-gather), the cores of a grid column
likewise for B, in barrier-separated segments that overlap the exchange of step s with the multiply of
step s - 1 (:func:`_shared_group`). A sibling matmul (:func:`sibling_of`: the same A, another B, its result
read only by this one's epilogue, as an MLP's gate beside its up projection) is computed by the same kernel: each
A tile multiplies both B tiles, and the sibling's finished tile is written back where its epilogue reads it.
A matmul reading the result of this one's softmax epilogue as its lhs (attention's P @ V, :func:`chained_of`) is
computed by it too: each finished P tile multiplies the batch's V, held on the scratchpad, and only the product is
stored, so P never leaves the core.

Grid and tile come from the op's ``spyre.grid`` / ``spyre.tile`` when the kernel-level passes annotated it;
otherwise they are chosen here (the split with the least work per core, largest tile that fits the usable
scratchpad), so the emitter also works on graph-level IR.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from spyre_mlir.cost import (CHAIN_V, b_first, finish_cycles, last_pieces, n_block, prologue_rows, prologue_sfu,
                             softmax_stats, store_parts)
from spyre_mlir.passes.analysis import NORMS, RING_INPUT
from spyre_mlir.runtime.formats import STICK_BYTES, Format
from spyre_mlir.runtime.isa import PT_FORMATS

from ..common import _DEVICE_FLOATS, EmitError, TileError, _attr, _sub, _tensor_type, row_parts
from ..memory import DevTensor, format_of, load_rows, store_rows
from ..plan import KernelPlan
from .rows import (_one_use, _owner, _precedes, _row_view, _viewed, apply_epilogue, apply_softmax,
                   broadcast_rows, epilogue, epilogue_buffer, epilogue_classes, epilogue_of, norm_body,
                   softmax_kind, softmax_of, widened_by)

__all__ = ["matmul", "select", "prefetchable", "sibling_of", "sibling_applier", "chained_of", "chain_applier",
           "prologue_of", "prologue_applier", "ring_takes", "ring_sticks", "EMITTERS"]


def _stick_elems(*fmts) -> int:
    return max(STICK_BYTES * 8 // Format.parse(f).bits for f in fmts)


def matmul(em, A: DevTensor, B: DevTensor, O: DevTensor, M: int, N: int, K: int, bias=None, colscale=None,
           scale=None, plan=None, batches=((0, 0, 0),), loc=None, round_fmt=None, epi=None, trans_b=False,
           sm=None, widen_last=False, sib=None, chain=None, pro=None, prefetch=None, ring_a=False):
    """O[M,N] = A[M,K] @ B[K,N] (+ bias[N]) for every (a_row0, b_row0, o_row0) in ``batches``. ``trans_b``: B is
    stored transposed, [N, K] (sticks along K; MATMUL TRANS_B), and its B tiles are [tn, tk]. ``sm``: a
    softmax (rows.softmax_of) applied to each finished tile after the epilogue, in the accumulator, with the
    plan's row statistics ``smax``, ``ssum`` (``slive``); its tiles are whole rows.

    A / B in a format the PT array does not multiply (fp32: spyre.convert_operands) are converted to DLFloat16
    on the SFU after each load. ``round_fmt`` (spyre.convert_result): the write-back rounds to that format and
    the SFU widens the tile to O's format before the store, so O holds exactly the rounded values; with
    ``widen_last`` (a widening cast after the epilogue, rows.widened_by) the epilogue's result is rounded to it
    and widened instead.

    ``colscale`` ([N], per output channel) and ``scale`` dequantize fp8/int8 weights on write-back. ``epi``:
    (:class:`.rows.Epilogue`, the device tensors of its further inputs as [rows, N] views like O), a map applied
    to each finished output tile before its store, in the accumulator, its further inputs' blocks of the tile
    loaded where the kernel loads the bias.
    Batches are spread over the plan's ``gb`` groups of ``gm*gn*gk`` cores, in contiguous blocks. The kernel
    follows the op's ``plan``
    (:class:`..plan.KernelPlan`): its grid and tile (the last three dims: M, N, K) and every buffer at its
    planned offset; a plan it cannot follow is a TileError or PlanError (the emitter reports it at the op). The
    per-column scales of quantized weights (fp8, int8-weights) are the plan's ``colscale`` buffer.

    ``sib``: (B2, its column scales or None, its scale or None) of a sibling matmul (:func:`sibling_of`), whose
    entry in the epilogue's further inputs is None: every A tile also multiplies B2's tile (plan buffers
    ``g0 g1``, accumulator ``gacc``), and its finished tile is written back into ``gout`` for the epilogue.

    ``chain``: (V [batches x N, dv], the chained matmul's result [rows, dv]) of a matmul chained to the softmax
    (:func:`chained_of`): each finished tile, softmax applied, multiplies its batch's V (plan buffers ``va vb``,
    loaded once per batch, shared over the ring by the cores of a grid column) into ``pacc``, written back into
    ``pout``, which is stored instead of the tile; O is then never written.

    ``pro``: a :class:`Prologue`, the norm whose result A is (:func:`prologue_of`): every A tile (whole rows: no
    K split, one K step) loads the norm's input rows instead and the norm's micro-ops write it, so A never
    round-trips device memory.

    ``prefetch``: the op, when spyre-prefetch planned each core's one B tile (:func:`prefetchable`) to load during
    the kernel before. ``ring_a``: each core's one A tile arrives over the ring (:func:`ring_takes`): not loaded."""
    b, cores = em.b, em.cores
    fa, fb, fo = A.fmt, B.fmt, O.fmt
    se_n, se_k = (_stick_elems(fo), _stick_elems(fa, fb)) if trans_b else (_stick_elems(fb, fo), _stick_elems(fa))
    grid, tile = plan.grid[-3:], plan.tile[-3:]
    nb = _grid_ok(grid, M, N, K, cores, se_n, se_k)
    if nb is None:
        raise TileError(f"the plan's grid {list(grid)} does not split the {M}x{N}x{K} matmul into blocks of "
                        f"whole sticks on at most {cores} cores")
    gm, gn, gk = grid
    group = gm * gn * gk
    ngroups = plan.grid[0] if len(plan.grid) == 4 else 1      # batch_matmul: gb groups of gm*gn*gk cores
    if ngroups > len(batches) or ngroups * group > cores:
        raise TileError(f"the plan's grid {list(plan.grid)} does not split {len(batches)} batches over at most "
                        f"{cores} cores")
    mb, kb = M // gm, K // gk
    nbuf = plan.nbuf
    if (tile[1] < nb and tile[1] % se_n) or (tile[2] < kb and tile[2] % se_k) \
            or tile[0] > mb or tile[1] > nb or tile[2] > kb or (nb * gn != N and tile[1] != nb):
        raise TileError(f"the plan's tile {list(tile)} is not a tile of the {mb}x{nb}x{kb} per-core block in "
                        f"whole sticks{'' if nb * gn == N else ' (a ragged N split takes one tile column)'}")
    tm, tn, tk = tile
    pa = fa if fa in PT_FORMATS else Format.DLF16
    pb = fb if fb in PT_FORMATS else Format.DLF16
    used = range(ngroups * group)
    fr = Format.parse(round_fmt) if round_fmt is not None else None
    # The same offsets on every core: ring reduce needs equal addresses.
    resident = plan.has("ares")
    if resident and not (gk == 1 and gm * gn > 1):
        raise TileError(f"a resident A (spyre.resident_a) needs an M/N split without a K split, not grid "
                        f"{list(grid)}")
    if chain is not None and sm is None:
        raise TileError("a chained matmul reads a softmax epilogue's tiles, and this matmul applies none")
    if pro is not None and (gk > 1 or tile[2] != K or resident or fa not in PT_FORMATS):
        raise TileError(f"a norm prologue needs whole rows of A in one K step, in a format the PT array "
                        f"multiplies, and no resident A: grid {list(grid)}, tile {list(tile)}, K = {K}, A {fa.key}")
    if sm is not None and (gn > 1 or gk > 1 or tn < nb):
        raise TileError(f"a softmax epilogue needs whole rows on one core: grid {list(grid)} and tile "
                        f"{list(tile)} split the {N} columns")
    stats = {}
    if sm is not None:          # its result is the matmul's output; its statistics keyed as apply_softmax names them
        if chain is None:
            em.dev[sm.results[0]] = O.reshaped(_tensor_type(sm.results[0])[0])
        else:
            em.in_kernel.add(sm.results[0])
        stats = {n.removeprefix("s"): plan.tile_at(n, tm, 1, "fp32")
                 for n in softmax_stats(softmax_kind(sm))}
    T = dict.fromkeys(used, {**_planned_tiles(plan, tm, tn, tk, fa, fb, fo, pa, pb, nbuf, gk, bias, colscale, fr,
                                              (-(-tm // gn), -(-kb // tk)) if resident else None, trans_b),
                             **_sibling_tiles(plan, tm, tn, tk, fb, nbuf, trans_b, sib, epi, gk),
                             "EPI": epi[0] if epi else None, "TB": trans_b, "SM": sm, "ST": stats,
                             "EX": _extra_tiles(plan, tm, tn, epi),
                             "ET": plan.tile_at("ept", tm, tn, Format.FP32) if epi and epi[0].temps > 1 else None,
                             "WL": widen_last, **_chain_tiles(plan, tm, tn, chain)})
    X = epi[1] if epi else []
    Bs = [B] + ([sib[0]] if sib else [])
    nk = -(-kb // tk)
    if gk == 1 and gm * gn > 1:
        per_group = [[bt for bi_, bt in enumerate(batches) if bi_ * ngroups // len(batches) == g]
                     for g in range(ngroups)]
        across = _extras_across_groups(b, T, X, per_group, group, gm, gn, mb, nb, tm, tn, kb, tk, N, loc)
        for g, mine in enumerate(per_group):
            _shared_group(b, T, A, Bs, O, mine, g * group, gm, gn, mb, nb, kb, tm, tn, tk, nbuf, bias, colscale,
                          scale, loc, X, active=len(used), N=N, M=M, sib=sib, chain=chain,
                          sync=list(used) if across else None, pro=pro)
        return list(used), (gm, gn, gk), (tm, tn, tk)
    step = 0
    for bi_, (a0, b0, o0) in enumerate(batches):
        base = (bi_ * ngroups // len(batches)) * group      # contiguous blocks of batches per core group
        if chain is not None:           # one core per group (a softmax epilogue: no N or K split)
            load_rows(b, base, _sub(T[base]["V"][bi_ % 2], tn, T[base]["DV"]), chain[0], o0 // M * N, 0, loc=loc)
        for blk in range(gm * gn):
            bm, bn = divmod(blk, gn)
            members = [base + blk * gk + kk for kk in range(gk)]
            root = members[0]
            for i in range(0, mb, tm):
                rows = min(tm, mb - i)
                for j in range(0, nb, tn):
                    cols = min(tn, nb - j)
                    r0, c0 = bm * mb + i, bn * nb + j
                    for kk, core in enumerate(members):
                        t = T[core]
                        last_here = gk == 1
                        if last_here and t["BI"] is not None:
                            load_rows(b, core, _sub(t["BI"], 1, cols), bias, 0, c0, loc=loc)
                        if last_here and t["CS"] is not None:
                            load_rows(b, core, _sub(t["CS"], 1, cols), colscale, 0, c0, loc=loc)
                        if last_here and t["GCS"] is not None:
                            load_rows(b, core, _sub(t["GCS"], 1, cols), sib[1], 0, c0, loc=loc)
                        if last_here:
                            _load_extra(b, core, t, X, o0 + r0, c0, rows, cols, loc)
                        def k_step(s, step, core=core, t=t, kk=kk, last_here=last_here, r0=r0, c0=c0, rows=rows,
                                   cols=cols, a0=a0, b0=b0, bi_=bi_):
                            k0 = kk * kb + s * tk
                            depth = min(tk, kb - s * tk)
                            At = _sub(t["A"][step % nbuf], rows, depth)
                            Bts = [_b_sub(t, t[key][step % nbuf], depth, cols) for key in ("B", "G")[:len(Bs)]]
                            if not ring_a:
                                _load_a(b, core, At, A, a0 + r0, k0, pro, loc)
                            with em.prefetching(prefetch) if prefetch is not None else contextlib.nullcontext():
                                for Bt, Bx in zip(Bts, Bs):
                                    load_rows(b, core, Bt, Bx, *((b0 + c0, k0) if trans_b else (b0 + k0, c0)),
                                              loc=loc)
                            fin = s == nk - 1 and last_here
                            _multiply(b, core, t, At, Bts, rows, cols, depth, s > 0, fin, scale, loc, sib)
                            if fin and chain is not None:
                                _chained(b, core, t, rows, cols, bi_, loc)

                        s = 0
                        while s < nk:
                            # K steps between the first and the last, whole tk deep, as a loop of bodies of nbuf
                            # steps (the buffers alternate): three trips emitted, the rest only counted.
                            trips = (nk - 1 - s) // nbuf if rolled_loops and prefetch is None and s >= 1 else 0
                            if trips >= _MIN_TRIPS:
                                done = _as_loop(b, [core], lambda u, d=step - s: k_step(u, u + d), s, nbuf, trips)
                                s, step = s + done, step + done
                                continue
                            k_step(s, step)
                            s, step = s + 1, step + 1
                        if gk > 1 and core == root:     # the root's write-back operands load during the products
                            if t["CS"] is not None:
                                load_rows(b, root, _sub(t["CS"], 1, cols), colscale, 0, c0, loc=loc)
                            if t["BI"] is not None:
                                load_rows(b, root, _sub(t["BI"], 1, cols), bias, 0, c0, loc=loc)
                    t = T[root]
                    if gk > 1:
                        R, C = _sub(t["R"], rows, cols), _sub(t["C"], rows, cols)
                        b.ring_reduce(members, R, C, root=root, loc=loc)
                        if sib is not None:
                            b.ring_reduce(members, _sub(t["GR"], rows, cols), _sub(t["GC"], rows, cols), root=root,
                                          loc=loc)
                        b.barrier(members, loc=loc)
                        if sib is not None:
                            _finish_sibling(b, root, t, rows, cols, c0, sib, loc)
                        if t["CS"] is not None:
                            b.sfu(root, "mul", R, R, _sub(t["CS"], 1, cols), loc=loc)
                        if scale is not None:
                            b.sfu(root, "mul", R, R, float(scale), loc=loc)
                        if t["BI"] is not None:
                            b.sfu(root, "add", R, R, _sub(t["BI"], 1, cols), loc=loc)
                        _load_extra(b, root, t, X, o0 + r0, c0, rows, cols, loc)
                        b.sfu(root, "cast", _sub(t["O"], rows, cols), R, loc=loc)
                        _finish(b, root, t, rows, cols, R, loc)
                    if chain is not None:
                        store_rows(b, root, _sub(t["PO"], rows, t["DV"]), chain[1], o0 + r0, 0, loc=loc)
                    else:
                        store_rows(b, root, _sub(t["OF"] or t["O"], rows, cols), O, o0 + r0, c0, loc=loc)
    return list(used), (gm, gn, gk), (tm, tn, tk)


def _device_rows(x, row0: int, n: int) -> tuple:
    """Where rows [row0, row0 + n) of device tensor ``x`` live: (address, source rows of a row view)."""
    if x.rowmap is not None:
        return x.addr, tuple(x._blocks()[row0:row0 + n].ravel().tolist())
    return x.addr + row0 * x.pitch, ()


def _extras_across_groups(b, T, X, per_group, group, gm, gn, mb, nb, tm, tn, kb, tk, N, loc) -> bool:
    """Share the epilogue's further inputs among the core groups of a batched matmul when every group reads the
    same device rows of them (an attention mask every head adds) and every core has one output tile: the cores at
    one grid position of all groups each load a part of the tile's block of each input and multicast it to the
    others, delivered at the groups' first barrier (which then spans every group). Returns whether it did."""
    ngroups = len(per_group)
    if ngroups < 2 or not any(x is not None for x in X) or mb != tm or nb != tn or kb != tk \
            or any(len(mine) != 1 for mine in per_group):
        return False
    for x in X:
        if x is not None and len({_device_rows(x, mine[0][2], gm * mb) for mine in per_group}) != 1:
            return False
    for blk in range(gm * gn):
        bm, bn = divmod(blk, gn)
        members = [g * group + blk for g in range(ngroups)]
        cols = min(tn, N - bn * nb)
        for i, x in enumerate(X):
            if x is None:
                continue
            tile = _sub(T[members[0]]["EX"][i], tm, cols)
            for q, (lo, hi) in enumerate(row_parts(tm, ngroups)):
                if hi > lo:
                    part = tile.row_slice(lo, hi)
                    load_rows(b, members[q], part, x, per_group[q][0][2] + bm * mb + lo, bn * nb, loc=loc)
                    b.ring_send(members[q], [c for c in members if c != members[q]], part.addr, part, loc=loc)
    return True


def _shared_group(b, T, A, Bs, O, batches, base, gm, gn, mb, nb, kb, tm, tn, tk, nbuf, bias, colscale, scale,
                  loc, X, *, active, N, M, sib=None, chain=None, sync=None, pro=None):
    """One core group of an M/N-split matmul with operand sharing over the ring.

    Every core of the ``gm x gn`` group walks the same sequence of steps (output tile, K step) in lock-step.
    The cores of a grid row need the same A tile: each loads 1/gn of its rows from device memory and
    RING_SENDs that part to the other cores of the row (all-gather); B likewise within a grid column, in
    1/gm parts. A send lands at the group's next barrier, so the kernel runs in barrier-separated segments:
    segment s loads and exchanges the tiles of step s while the PT array multiplies step s - 1 (double
    buffering: the two steps use different buffers; single-buffered, the loads follow the multiply). A
    finished output tile is stored over the next tile's segments, a part of its rows each, overlapping its
    multiplies; the last tile, with no later loads to hide behind, is multiplied, finished and stored in pieces
    of whole PT row blocks (cost.last_pieces), each piece's store overlapping the next piece's work. A tile's
    write-back operands (bias, scales, the epilogue's further inputs) are loaded with its
    last K step's operands where their single buffers allow (``early``), so the epilogue does not wait for them.
    With a resident A (the plan's ``ares``), a core keeps its part of every A tile of the current row of output
    tiles: loaded (and converted to the PT format) for the row's first tile, sent again from the scratchpad for
    the others, so A leaves device memory once. Every core multiplies exactly the tiles, in the order, of the
    unshared kernel, so results are bit-identical. A sibling's B (``Bs[1]``) is loaded and exchanged like B. A
    chained matmul's V is loaded with the first step of each batch, a part of its rows per core of the grid
    column, exchanged like B, into the buffer of the batch's parity: the previous batch's last multiply, in that
    segment, reads the other one."""
    nk = -(-kb // tk)
    cores = list(range(base, base + gm * gn))
    resident = T[base]["RES"] is not None

    def width(bn, j, cols):
        """The columns of the step's tile on grid column ``bn`` (fewer on the last one of a ragged split)."""
        return min(cols, N - (bn * nb + j))

    steps = []
    for bi_, (a0, b0, o0) in enumerate(batches):
        for i in range(0, mb, tm):
            rows = min(tm, mb - i)
            for j in range(0, nb, tn):
                cols = min(tn, nb - j)
                for s in range(nk):
                    depth = min(tk, kb - s * tk)
                    steps.append((a0, b0, o0, i, j, s * tk, rows, cols, depth, s == 0, s == nk - 1, bi_))

    def fetch(n):
        """Load this core's parts of step n's A and B tiles and send them to the cores that share them. With a
        resident A the first tile of a row loads (and converts) the core's A part into its block of ``ares``,
        and every tile of the row copies and sends the part from there. The operand whose exchange takes
        longer (cost.b_first: more bytes over the ring) is loaded first, so its sends overlap the other's load
        (each core's DMA and ring units work in program order)."""
        a0, b0, _, i, j, k0, rows, cols, depth, _, _, bi_ = steps[n]
        a_sends, b_sends = [], []
        if chain is not None and (n == 0 or steps[n - 1][11] != bi_):
            _share_v(bi_)

        def a_side(core):
            bm, bn = divmod(core - base, gn)
            t = T[core]
            At = _sub(t["A"][n % nbuf], rows, depth)
            lo, hi = row_parts(rows, gn)[bn]
            part = At.row_slice(lo, hi) if hi > lo else None
            src = part
            if part is not None and resident:
                prow = -(-tm // gn)
                src = _sub(t["RES"].row_slice(k0 // tk * prow, (k0 // tk + 1) * prow), hi - lo, depth)
                if j == 0 and t["AS"] is not None:
                    stage = _sub(t["AS"], hi - lo, depth)
                    load_rows(b, core, stage, A, a0 + bm * mb + i + lo, k0, loc=loc)
                    b.sfu(core, "cast", src, stage, loc=loc)
                elif j == 0:
                    load_rows(b, core, src, A, a0 + bm * mb + i + lo, k0, loc=loc)
                b.sfu(core, "cast", part, src, loc=loc)
            elif part is not None:
                _load_a(b, core, part, A, a0 + bm * mb + i + lo, k0, pro, loc)
            if part is not None and gn > 1:
                a_sends.append((core, [base + bm * gn + q for q in range(gn) if q != bn], part.addr, src))

        def b_side(core):
            bm, bn = divmod(core - base, gn)
            t = T[core]
            # B parts are rows of the B tile: of K, or of N when it is held transposed.
            for key, B in zip(("B", "G"), Bs):
                Bt = _b_sub(t, t[key][n % nbuf], depth, width(bn, j, cols))
                blo, bhi = row_parts(Bt.rows, gm)[bm]
                if bhi > blo:
                    r0, c0 = (b0 + bn * nb + j, k0) if t["TB"] else (b0 + k0, bn * nb + j)
                    load_rows(b, core, Bt.row_slice(blo, bhi), B, r0 + blo, c0, loc=loc)
                if bhi > blo and gm > 1:
                    b_part = Bt.row_slice(blo, bhi)
                    b_sends.append((core, [base + q * gn + bn for q in range(gm) if q != bm], b_part.addr, b_part))

        t0 = T[base]
        a_bytes = -(-rows // gn) * _sub(t0["A"][0], rows, depth).pitch
        b_tile = _b_sub(t0, t0["B"][0], depth, width(0, j, cols))
        b_bytes = len(Bs) * -(-b_tile.rows // gm) * b_tile.pitch
        a_lead = 0.0 if pro is None else pro.sfu(-(-rows // gn), b.target) * b.target.ring_bytes_per_cycle
        first_b = (not resident or j == 0) and b_first(gm, gn, a_bytes, b_bytes, a_lead)
        for core in cores:
            for side in ((b_side, a_side) if first_b else (a_side, b_side)):
                side(core)
        for core, peers, dst, src in (b_sends + a_sends if first_b else a_sends + b_sends):
            b.ring_send(core, peers, dst, src, loc=loc)
        if early(n):
            for core in cores:
                write_back_operands(n, core)

    def early(n) -> bool:
        """Whether the write-back operands (bias, scales, the epilogue's further inputs) of the tile finished at
        step ``n`` are loaded with that step's operands (:func:`fetch`) instead of just before its multiply,
        where the load would stall the epilogue. Their buffers are single: safe unless double buffering puts
        the previous tile's epilogue after this fetch, in the same segment (one K step per tile)."""
        return steps[n][10] and (nbuf == 1 or nk > 1 or n == 0)

    def write_back_operands(n, core):
        """Load core's blocks of the write-back operands of the tile finished at step ``n``."""
        _, _, o0, i, j, _, rows, cols, _, _, _, _ = steps[n]
        bm, bn = divmod(core - base, gn)
        t = T[core]
        c0, w = bn * nb + j, width(bn, j, cols)
        if t["BI"] is not None:
            load_rows(b, core, _sub(t["BI"], 1, w), bias, 0, c0, loc=loc)
        if t["CS"] is not None:
            load_rows(b, core, _sub(t["CS"], 1, w), colscale, 0, c0, loc=loc)
        if t["GCS"] is not None:
            load_rows(b, core, _sub(t["GCS"], 1, w), sib[1], 0, c0, loc=loc)
        if sync is None:                # else shared among the groups (_extras_across_groups)
            _load_extra(b, core, t, X, o0 + bm * mb + i, c0, rows, w, loc)

    def multiply(n, piece=None):
        """Step ``n`` on every core; ``piece``: only rows [lo, hi) of its output tile (:func:`_row_window`)."""
        _, _, o0, i, j, _, rows, cols, depth, first, fin, bi_ = steps[n]
        lo, hi = piece or (0, rows)
        for core in cores:
            bm, bn = divmod(core - base, gn)
            t = T[core]
            c0, w = bn * nb + j, width(bn, j, cols)
            At = _sub(t["A"][n % nbuf], rows, depth).row_slice(lo, hi)
            Bts = [_b_sub(t, t[key][n % nbuf], depth, w) for key in ("B", "G")[:len(Bs)]]
            if fin and not early(n) and lo == 0:
                write_back_operands(n, core)
            if piece is not None:
                t = _row_window(t, rows, w, depth, lo, hi)
            _multiply(b, core, t, At, Bts, hi - lo, w, depth, not first, fin, scale, loc, sib)
            if fin and chain is not None:
                _chained(b, core, t, hi - lo, w, bi_, loc)

    def _share_v(bi_):
        """Load V's rows of the group's batch ``bi_``, a part per core of each grid column, and send each part to the
        column's other cores (gn is 1: a softmax epilogue takes whole rows)."""
        t = T[base]
        Vt = _sub(t["V"][bi_ % 2], nb, t["DV"])
        v0 = batches[bi_][2] // M * N           # the batch's first row of V (its output rows start at o0)
        for core in cores:
            bm = (core - base) // gn
            lo, hi = row_parts(Vt.rows, gm)[bm]
            if hi > lo:
                load_rows(b, core, Vt.row_slice(lo, hi), chain[0], v0 + lo, 0, loc=loc)
                if gm > 1:
                    b.ring_send(core, [c for c in cores if c != core], Vt.row_slice(lo, hi).addr,
                                Vt.row_slice(lo, hi), loc=loc)

    nparts = store_parts(tm, tn, nk, (T[base]["OF"] or T[base]["O"]).fmt.key, active, b.target)

    def store(f, parts):
        """Store rows [lo, hi) of each of ``parts`` of the output tile finished at step ``f``."""
        _, _, o0, i, j, _, rows, cols, _, _, _, _ = steps[f]
        for lo, hi in parts:
            if hi <= lo:
                continue
            for core in cores:
                bm, bn = divmod(core - base, gn)
                t = T[core]
                if chain is not None:
                    store_rows(b, core, _sub(t["PO"], rows, t["DV"]).row_slice(lo, hi), chain[1],
                               o0 + bm * mb + i + lo, 0, loc=loc)
                    continue
                store_rows(b, core, _sub(t["OF"] or t["O"], rows, width(bn, j, cols)).row_slice(lo, hi), O,
                           o0 + bm * mb + i + lo, bn * nb + j, loc=loc)

    # A finished output tile is stored a part per segment over the next tile's first segments (cost.store_parts:
    # at most nk, so the last part precedes the multiply that overwrites the tile), its bytes sharing the DRAM
    # with the loads instead of stalling one segment; the last tile is stored in pieces (below).
    S = len(steps)
    # The last step before each step (itself included) that finished an output tile, -1 before the first: the
    # tile being stored at a segment.
    last_fin, f = [], -1
    for n, st in enumerate(steps):
        f = n if st[10] else f
        last_fin.append(f)

    def segment(seg):
        """Segment ``seg``: fetch step ``seg``, store a part of the last finished tile, multiply step ``seg - 1``."""
        if seg < S and nbuf > 1:
            fetch(seg)
        if seg >= 2:
            fin = last_fin[seg - 2]
            if fin >= 0 and seg - 2 - fin < nparts:
                store(fin, [row_parts(steps[fin][6], nparts)[seg - 2 - fin]])
        if 1 <= seg < S:
            multiply(seg - 1)
        if seg < S:
            if nbuf == 1:
                fetch(seg)
            b.barrier(cores, loc=loc, among=sync)

    def shape(seg):
        """What segment ``seg`` emits but for the addresses that move from a trip of a loop to the next, and where
        those are: the row and column of its steps' output tiles and their K offset, and the tile it stores and
        the rows (a part of one size). Two segments of one shape emit the same instructions but for those
        addresses, which are linear in where they are: along a run of K steps, along a row or column of output
        tiles, they move by constant strides. None for the first two segments and the last."""
        if nbuf == 1 or not 2 <= seg < S:
            return None
        now, prev = steps[seg], steps[seg - 1]
        fin, part, at = last_fin[seg - 2], None, (0, 0, 0)
        if fin >= 0 and seg - 2 - fin < nparts:
            done = steps[fin]
            lo, hi = row_parts(done[6], nparts)[seg - 2 - fin]
            part, at = (hi - lo, done[:3] + done[6:9] + done[11:]), (done[3], done[4], lo)
        # A resident A is loaded by the first tile of a row.
        key = (seg % nbuf, now[:3] + now[6:], resident and now[4] == 0, prev[:3] + prev[6:],
               resident and prev[4] == 0, part)
        return key, now[3:6] + prev[3:6] + at

    # Bodies of loops: nbuf segments (K steps; the double buffers alternate), or when there are few K steps, one
    # output tile or one row of them.
    periods = sorted({p for p in (nbuf, math.lcm(nk, nbuf), math.lcm(nk * -(-nb // tn), nbuf)) if p <= _MAX_BODY})
    seg = 0
    while seg <= S:
        # A run of segments of one shape is emitted as a loop: three trips of its body, then the assembler checks
        # they are one body moving by constant strides, and the other trips are not emitted.
        for period in periods if rolled_loops else ():
            run = _run(shape, seg, S, period)
            if run >= _MIN_TRIPS:
                seg += _as_loop(b, cores, segment, seg, period, run)
                break
        else:
            segment(seg)
            seg += 1
    # The last tile has no later loads to hide its store behind: it is multiplied and stored in pieces
    # (cost.last_pieces), each piece's store overlapping the next one's multiply.
    t, (rows, cols, depth) = T[base], steps[-1][6:9]
    for piece in last_pieces(rows, cols, depth, A.fmt.key, (t["OF"] or t["O"]).fmt.key, active, b.target, len(Bs),
                             _finish_work(t, rows, cols, b.target)):
        multiply(S - 1, piece)
        store(S - 1, [piece])


# Whether kernels emit their K loops and rows of output tiles as loops (:func:`_shared_group`); off, every trip is
# emitted (the tests compare the two).
rolled_loops = True


_MAX_BODY = 32          # segments of a loop body at most (each emitted three times before the loop is known)
_MIN_TRIPS = 4          # a loop's trips at least: three are emitted to find it


def _as_loop(b, cores, emit, at: int, period: int, trips: int) -> int:
    """Emit three trips of a loop body of ``period`` units (``emit(unit)``: a segment, a K step) from unit ``at``
    on, and store them as a loop of ``trips`` trips (:meth:`ProgramBuilder.roll_tail`). Returns the units
    emitted or counted: all the trips', or the three's when the assembler finds them no such loop."""
    starts = {c: b.stream_length(c) for c in cores}
    for u in range(at, at + 3 * period):
        emit(u)
    return (trips if b.roll_tail(cores, starts, 3, trips) else 3) * period


def _run(shape, seg: int, S: int, period: int) -> int:
    """How many bodies of ``period`` segments from ``seg`` on repeat the shapes of the first, each where the one
    before was moved as far as the second from the first (0 when a segment of the first has no shape)."""
    first = [shape(seg + q) for q in range(period)]
    if any(x is None for x in first):
        return 0
    n, step = 1, None
    while seg + (n + 1) * period <= S:
        nxt = [shape(seg + n * period + q) for q in range(period)]
        if any(x is None or x[0] != f[0] for x, f in zip(nxt, first)):
            break
        moved = [tuple(a - b for a, b in zip(x[1], f[1])) for x, f in zip(nxt, first)]
        if step is None:
            step = moved
        elif any(tuple(n * d for d in s1) != m for s1, m in zip(step, moved)):
            break
        n += 1
    return n


def _planned_tiles(plan, tm, tn, tk, fa, fb, fo, pa, pb, nbuf, gk, bias, colscale, fr=None, resident=None,
                   trans_b=False):
    """The kernel's tiles, each at its planned buffer (a PlanError when the plan lacks one or it is too small).
    ``resident`` (part rows, K steps): A tiles in the PT format, ``ares`` and the staging ``as``; ``trans_b``: B
    tiles [tn, tk]."""
    bk, bn = (tn, tk) if trans_b else (tk, tn)
    want = {"a0": (tm, tk, pa if resident else fa), "b0": (bk, bn, fb), "acc": (tm, tn, Format.FP32),
            "out": (tm, tn, fr or fo)}
    if resident:
        want["ares"] = (resident[0] * resident[1], tk, pa)
        if pa is not fa:
            want["as"] = (resident[0], tk, fa)
    elif pa is not fa:
        want["pa"] = (tm, tk, pa)
    if pb is not fb:
        want["pb"] = (bk, bn, pb)
    if fr is not None:
        want["outf"] = (tm, tn, fo)
    if nbuf == 2:
        want.update(a1=want["a0"], b1=want["b0"])
    if gk > 1:
        want["red"] = (tm, tn, Format.FP32)
    if bias is not None:
        want["bias"] = (1, tn, bias.fmt)
    if colscale is not None:
        want["colscale"] = (1, tn, colscale.fmt)
    tiles = {k: plan.tile_at(k, r, c, f) for k, (r, c, f) in want.items()}
    return {"A": [tiles["a0"]] + ([tiles["a1"]] if nbuf == 2 else []), "RES": tiles.get("ares"),
            "AS": tiles.get("as"), "B": [tiles["b0"]] + ([tiles["b1"]] if nbuf == 2 else []), "PA": tiles.get("pa"),
            "PB": tiles.get("pb"), "C": tiles["acc"], "R": tiles.get("red"), "O": tiles["out"],
            "OF": tiles.get("outf"), "BI": tiles.get("bias"), "CS": tiles.get("colscale")}


def _extra_tiles(plan, tm, tn, epi):
    """The tiles of an epilogue's further inputs: ``epa``, ``epb``... for those loaded, in order, and ``gout``
    for the sibling's (its entry None)."""
    if not epi:
        return []
    tiles, i = [], 0
    for x in epi[1]:
        if x is None:
            tiles.append(plan.tile_at("gout", tm, tn, epi[2]))
        else:
            tiles.append(plan.tile_at(epilogue_buffer(i), tm, tn, x.fmt))
            i += 1
    return tiles


def _sibling_tiles(plan, tm, tn, tk, fb, nbuf, trans_b, sib, epi, gk) -> dict:
    """A sibling matmul's tiles: its B tiles ``g0 g1`` (G), accumulator (GC), split-K reduce-sum destination (GR),
    finished tile (GO, the epilogue's ``gout``) and per-column scales (GCS)."""
    if sib is None:
        return {"G": None, "GC": None, "GR": None, "GO": None, "GCS": None}
    bk, bn = (tn, tk) if trans_b else (tk, tn)
    return {"G": [plan.tile_at(f"g{i}", bk, bn, fb) for i in range(nbuf)],
            "GC": plan.tile_at("gacc", tm, tn, Format.FP32), "GO": plan.tile_at("gout", tm, tn, epi[2]),
            "GR": plan.tile_at("gred", tm, tn, Format.FP32) if gk > 1 else None,
            "GCS": plan.tile_at("gcolscale", 1, tn, sib[1].fmt) if sib[1] is not None else None}


def _grid_ok(grid, M, N, K, cores, se_n, se_k) -> int | None:
    """A core's N block (cost.n_block: even, or ragged without a K split) when the grid splits the matmul."""
    gm, gn, gk = grid
    nb = n_block(N, gn, se_n)
    ok = (nb is not None and gm * gn * gk <= cores and M % gm == 0 and K % gk == 0
          and (gk == 1 or (K // gk) % se_k == 0) and (nb * gn == N or gk == 1))
    return nb if ok else None


def _b_sub(t, tile, depth, cols):
    """The [depth, cols] B tile of a step in ``tile``'s buffer: held [cols, depth] when B is stored transposed."""
    return _sub(tile, cols, depth) if t["TB"] else _sub(tile, depth, cols)


def _multiply(b, core, t, At, Bts, rows, cols, depth, accumulate, fin, scale, loc, sib=None):
    """One K step on the PT array: convert operands the PT array cannot multiply, multiply-accumulate, and on
    the last step write back (bias, column scale, scale) and widen to the result type if asked. ``Bts``: the B
    tile, and a sibling's (``sib``), multiplied first, its tile written back into ``gout`` for the epilogue."""
    if t["PA"] is not None:
        At = _cast(b, core, _sub(t["PA"], rows, depth), At, loc)
    if len(Bts) > 1:
        Gt = Bts[1] if t["PB"] is None else _cast(b, core, _b_sub(t, t["PB"], depth, cols), Bts[1], loc)
        b.matmul(core, At, Gt, _sub(t["GC"], rows, cols), accumulate=accumulate, trans_b=t["TB"],
                 out=_sub(t["GO"], rows, cols) if fin else None,
                 col_scale=_sub(t["GCS"], 1, cols) if fin and t["GCS"] is not None else None,
                 scale=sib[2] if fin else None, loc=loc)
    Bt = Bts[0]
    if t["PB"] is not None:
        Bt = _cast(b, core, _b_sub(t, t["PB"], depth, cols), Bt, loc)
    b.matmul(core, At, Bt, _sub(t["C"], rows, cols), accumulate=accumulate, trans_b=t["TB"],
             out=_sub(t["O"], rows, cols) if fin else None,
             bias=_sub(t["BI"], 1, cols) if fin and t["BI"] is not None else None,
             col_scale=_sub(t["CS"], 1, cols) if fin and t["CS"] is not None else None,
             scale=scale if fin else None, loc=loc)
    if fin:                                 # the accumulator is free until the next tile's first step
        _finish(b, core, t, rows, cols, _sub(t["C"], rows, cols), loc)
    if fin and t["SM"] is not None:
        out = _sub(t["OF"] or t["O"], rows, cols)
        apply_softmax(b, core, t["SM"], out, out, _sub(t["C"], rows, cols),
                      {k: _sub(v, rows, 1) for k, v in t["ST"].items()}, loc)


def _row_window(t, rows, cols, depth, lo, hi):
    """``t`` with its row-wise tiles (A's conversion, the accumulators and results, the epilogue's inputs and
    temporaries, the softmax's row statistics, the chained matmul's tiles) cut to rows [lo, hi) of a step's
    [rows, cols] output tile: each piece is multiplied and finished in its own rows. Every op of a piece is a
    row-wise op, so a tile done in pieces holds the bits it holds done whole."""
    def cut(x, c):
        return None if x is None else _sub(x, rows, c).row_slice(lo, hi)

    w = {**t, **{k: cut(t[k], cols) for k in ("C", "O", "OF", "GC", "GO", "ET")}, "PA": cut(t["PA"], depth),
         "EX": [cut(x, cols) for x in t["EX"]], "ST": {k: cut(v, 1) for k, v in t["ST"].items()}}
    if t["PC"] is not None:
        w["PC"], w["PO"] = cut(t["PC"], t["DV"]), cut(t["PO"], t["DV"])
    return w


def _finish_work(t, rows, cols, target) -> tuple[float, float]:
    """cost.finish_cycles of a [rows, cols] output tile: its epilogue map, softmax and chained matmul."""
    sm, epi = t["SM"], t["EPI"]
    return finish_cycles(rows, cols, target, softmax_kind(sm) if sm is not None else None,
                         epilogue_classes(epi) if epi is not None else (), t["DV"])


def _finish(b, core, t, rows, cols, temp, loc):
    """A finished output tile in ``out``: widen it (spyre.convert_result) and apply the epilogue map, or with a
    widening cast after the map (``WL``) the map, then the widening, into ``outf``; ``temp`` is the fp32 tile
    the epilogue works in."""
    out, wide = _sub(t["O"], rows, cols), _sub(t["OF"], rows, cols) if t["OF"] is not None else None
    if wide is not None and not t["WL"]:
        b.sfu(core, "cast", wide, out, loc=loc)
    if t["EPI"] is not None:
        apply_epilogue(b, core, t["EPI"], out if t["WL"] else wide or out, _temps(t, temp), loc,
                       [_sub(x, rows, cols) for x in t["EX"]])
    if t["WL"]:
        b.sfu(core, "cast", wide, out, loc=loc)


def _chained(b, core, t, rows, cols, bi_, loc):
    """The chained matmul on a finished tile (its softmax applied, in ``out``): [rows, cols] @ V of batch ``bi_``
    ([cols, dv]), written back into ``pout``."""
    dv = t["DV"]
    b.matmul(core, _sub(t["OF"] or t["O"], rows, cols), _sub(t["V"][bi_ % 2], cols, dv), _sub(t["PC"], rows, dv),
             out=_sub(t["PO"], rows, dv), loc=loc)


def _chain_tiles(plan, tm, tn, chain) -> dict:
    """A chained matmul's tiles: V of a batch ``va vb`` [tn, dv] (V), its accumulator ``pacc`` (PC) and result
    tile ``pout`` (PO), and dv (DV)."""
    if chain is None:
        return {"V": None, "PC": None, "PO": None, "DV": 0}
    V, R = chain
    dv = V.cols
    return {"V": [plan.tile_at(n, tn, dv, V.fmt) for n in CHAIN_V], "PC": plan.tile_at("pacc", tm, dv, "fp32"),
            "PO": plan.tile_at("pout", tm, dv, R.fmt), "DV": dv}


def _finish_sibling(b, core, t, rows, cols, c0, sib, loc):
    """A split-K sibling's reduced tile (``gred``) on the group's root: column scales, scale, rounded into ``gout``
    as its write-back would."""
    GR = _sub(t["GR"], rows, cols)
    if t["GCS"] is not None:
        load_rows(b, core, _sub(t["GCS"], 1, cols), sib[1], 0, c0, loc=loc)
        b.sfu(core, "mul", GR, GR, _sub(t["GCS"], 1, cols), loc=loc)
    if sib[2] is not None:
        b.sfu(core, "mul", GR, GR, float(sib[2]), loc=loc)
    b.sfu(core, "cast", _sub(t["GO"], rows, cols), GR, loc=loc)


def _temps(t, first):
    """An epilogue's fp32 temporaries for an output tile shaped like ``first`` (the accumulator, or the
    reduce-sum's tile), and the plan's ``ept`` when it needs a second."""
    return [first] + ([_sub(t["ET"], first.rows, first.cols)] if t["ET"] is not None else [])


def _load_extra(b, core, t, X, row0, col0, rows, cols, loc):
    """Load the output tile's block of each further input of the epilogue (its rows of the result's 2-D view)."""
    for tile, x in zip(t["EX"], X):
        if x is not None:                   # None: the sibling's, computed by the kernel
            load_rows(b, core, _sub(tile, rows, cols), x, row0, col0, loc=loc)


def _cast(b, core, dst, src, loc):
    b.sfu(core, "cast", dst, src, loc=loc)
    return dst


def _load_a(b, core, tile, A, row0, k0, pro, loc):
    """Rows [row0, row0 + tile.rows) of A from column ``k0`` into ``tile``: loaded, or computed by the prologue."""
    if pro is None:
        load_rows(b, core, tile, A, row0, k0, loc=loc)
    else:
        pro.apply(b, core, tile, row0, loc)


class Prologue:
    """A layernorm or rmsnorm a matmul kernel applies to its A tiles (:func:`prologue_of`): the norm's input rows
    load into ``nx`` and its micro-ops (rows.norm_body) write the A tile through the fp32 ``nsq`` (and a
    layernorm's ``nxf``) and row statistics ``n<stat>``; its weight and bias rows (``nweight``, ``nbias``) load
    once per core, before its first tile. The plan's buffers hold ``rows`` rows, the most a core computes at
    once."""

    def __init__(self, em, norm, plan, rows: int):
        self.body, consts, stats = norm_body(em, norm)
        self.nstats = len(stats)
        x = em.tensor(norm.operands[0])
        self.K = x.cols
        self.X = x.reshaped((x.rows, self.K))
        f32 = Format.FP32
        self.tiles = {"sq": plan.tile_at("nsq", rows, self.K, f32), **{n: plan.tile_at("n" + n, rows, 1, f32)
                                                                       for n in stats}}
        if self.nstats > 1:         # a layernorm's work tile (an rmsnorm works in its squares' tile)
            self.tiles["xf"] = plan.tile_at("nxf", rows, self.K, f32)
        self.nx = plan.tile_at("nx", rows, self.K, x.fmt)
        self.consts = [(n, t.reshaped((1, self.K)), plan.tile_at("n" + n, 1, self.K, t.fmt)) for n, t in consts]
        self.ready: set[int] = set()

    def sfu(self, rows: int, target) -> float:
        """Modeled SFU cycles of the prologue on ``rows`` rows (cost.prologue_sfu)."""
        return prologue_sfu(rows, self.K, self.nstats, target)

    def apply(self, b, core, tile, row0: int, loc) -> None:
        """The norm of rows [row0, row0 + tile.rows) of its input, written into A tile ``tile`` on ``core``."""
        n, K = tile.rows, self.K
        if tile.cols != K:
            raise TileError(f"a norm prologue computes whole rows of {K} columns, not an A tile of {tile.cols}")
        if core not in self.ready:
            for _, t, dst in self.consts:
                load_rows(b, core, dst, t, 0, loc=loc)
            self.ready.add(core)
        XT = _sub(self.nx, n, K)
        load_rows(b, core, XT, self.X, row0, loc=loc)
        extra = {name: _sub(t, n, t.cols) for name, t in self.tiles.items() if name != "xf"}
        extra.update((name, dst) for name, _, dst in self.consts)
        xf = self.tiles.get("xf")
        self.body(core, n, XT, xf and _sub(xf, n, K), tile, extra, loc)


def select(op, target, known) -> str | None:
    """``"matmul"`` when the device runs ``op`` (a matmul or batch_matmul): a float lhs and a result the device
    holds; else None."""
    res_shape, res_elt = _tensor_type(op.operation.results[0])
    if str(res_elt) not in _DEVICE_FLOATS + ("f8E4M3FN", "f8E5M2", "i8") or res_shape is None:
        return None
    return "matmul" if str(_tensor_type(op.operation.operands[0])[1]) in _DEVICE_FLOATS else None


def _one_tile(op, target) -> bool:
    """Whether each core of the matmul kernel multiplies one output tile in one K step on the unshared path
    (split along K, or one core): it loads everything, then computes."""
    o = op.operation
    if o.name != "spyre.matmul" or sibling_of(op) is not None or chained_of(op) is not None:
        return False
    kp = KernelPlan.of(o, target)
    (gm, gn, gk), (tm, tn, tk) = kp.grid[-3:], kp.tile[-3:]
    shape = _tensor_type(o.operands[1])[0]
    N, K = shape if _attr(op, "transpose_rhs", False) else shape[::-1]
    M = _tensor_type(o.operands[0])[0][0]
    return (gk > 1 or gm * gn == 1) and -(-M // gm) <= tm and -(-N // gn) <= tn and -(-K // gk) <= tk


def prefetchable(op, target) -> tuple[tuple[str, ...], float, float]:
    """``("b0",)`` when the matmul kernel loads a constant B once per core before its work (:func:`_one_tile`,
    single-buffered), with the cycles those loads take (all cores loading at once) and keep it from its work
    (the same). Else ``()``."""
    from spyre_mlir.passes.analysis import producer

    rhs = producer(op.operation.operands[1])
    if rhs is None or rhs.name != "arith.constant" or not _one_tile(op, target):
        return (), 0.0, 0.0
    kp = KernelPlan.of(op.operation, target)
    if kp.nbuf != 1:
        return (), 0.0, 0.0
    load = kp.buffers["b0"][1] * kp.cores / (target.dram_read_gbps / target.clock_ghz) + target.dma_latency_cycles
    return ("b0",), load, load


def last_segment(op, target) -> tuple[float, float] | None:
    """(compute, store) cycles after the matmul kernel's last load when it loads everything first
    (:func:`_one_tile`): its PT and SFU work and its result tile's store. Else None."""
    from spyre_mlir.passes.op_model import planned_cycles

    if not _one_tile(op, target):
        return None
    o = op.operation
    kp = KernelPlan.of(o, target)
    c = planned_cycles(o, target)
    out = "outf" if kp.has("outf") else "out"
    store = kp.buffers[out][1] * kp.cores / (target.dram_write_gbps / target.clock_ghz) + target.dma_latency_cycles
    return c.pt + c.sfu, store


def ring_takes(op, target) -> bool:
    """Whether matmul ``op`` can take its A over the ring (spyre-chain-convs, from the flatten computing it): a
    2-D matmul without a norm prologue whose cores each hold one A tile, loaded in one K step into one buffer, on
    the kernel's loop over K-split groups (not the A-sharing path of an M/N split: gk = 1 and gm x gn > 1)."""
    o = op.operation if hasattr(op, "operation") else op
    if o.name != "spyre.matmul" or _attr(o, "spyre.kernel") != "matmul" or prologue_of(o) is not None:
        return False
    kp = KernelPlan.of(o, target)
    if len(kp.grid) != 3 or kp.has("ares"):
        return False
    (gm, gn, gk), (tm, _, tk) = kp.grid, kp.tile
    (M, K), _ = _tensor_type(o.operands[0])
    return not (gk == 1 and gm * gn > 1) and kp.nbuf == 1 and M % gm == K % gk == 0 and (tm, tk) == (M // gm,
                                                                                                       K // gk)


def ring_sticks(op, target) -> dict[int, list[tuple[int, int]]]:
    """The A tiles of matmul ``op`` marked spyre.ring_input (:func:`ring_takes`): {element of A (row-major) that
    starts a stick: [(core, scratchpad address of that stick in the core's A tile)]}; the cores of one M block and
    K-split slice (one per N block) hold the same tile."""
    o = op.operation if hasattr(op, "operation") else op
    kp = KernelPlan.of(o, target)
    (gm, gn, gk), (tm, _, tk) = kp.grid, kp.tile
    (M, K), elt = _tensor_type(o.operands[0])
    fmt = format_of(elt)
    At = kp.tile_at("a0", tm, tk, fmt)
    unit = STICK_BYTES // fmt.nbytes(1)
    if tk % unit:
        kp.fail(f"spyre.ring_input: its A tiles ({tk} columns) are not whole sticks")
    dest: dict[int, list[tuple[int, int]]] = {}
    for blk in range(gm * gn):
        bm = blk // gn
        for kk in range(gk):
            core = blk * gk + kk
            for r in range(tm):
                for s in range(0, tk, unit):
                    dest.setdefault((bm * tm + r) * K + kk * tk + s, []).append(
                        (core, At.addr + r * At.pitch + s * fmt.nbytes(1)))
    return dest


def emit_matmul(em, op, loc):
    o = op.operation
    lhs, rhs = o.operands[0], o.operands[1]
    bias = o.operands[2] if len(o.operands) > 2 else None
    norm = prologue_of(op)
    if norm is None:
        A, pro = em.tensor(lhs), None
    else:                   # computed tile by tile from the norm's input: A itself never exists
        shape, elt = _tensor_type(lhs)
        A = DevTensor(tuple(shape), format_of(elt), 0, None, 0)
        kp = KernelPlan.of(op, em.target)
        pro = Prologue(em, norm, kp, prologue_rows(kp.grid[-3:], kp.tile[-3:]))
    M, K = A.shape
    B, colscale, scale = _rhs(em, op, rhs)
    trans = bool(_attr(op, "transpose_rhs", False))
    N = B.shape[-2] if trans else B.shape[-1]
    chain = _chain(em, op)
    O, rnd, wide = _output(em, op, chain)
    bias_t = em.tensor(bias) if bias is not None else None
    found, sib = sibling_of(op), None
    epi = _epilogue(em, op, O, chain, found)
    if found is not None:
        g = found[1]
        sib = _rhs(em, g, g.operands[1])
        if (sib[1] is None) != (colscale is None) or (sib[2] is None) != (scale is None):
            raise EmitError(f"the sibling matmul {g.name} at {g.location} is quantized unlike this one's weights",
                            loc)
    plan = KernelPlan.of(op, em.target)
    prefetch = em.prefetched(op, prefetchable)
    ring = bool(_attr(op, RING_INPUT))
    if ring:
        from .move import ring_source

        if ring_source(op) is None or not ring_takes(op, em.target):
            plan.fail("spyre.ring_input, but no flatten sends its A over the ring, or its cores do not each hold "
                      "one A tile loaded in one step")
    used, g, _ = matmul(em, A, B, O, M, N, K, bias=bias_t, colscale=colscale, scale=scale, plan=plan, loc=loc,
                        round_fmt=rnd, epi=epi, trans_b=trans, sm=softmax_of(op), widen_last=wide, sib=sib,
                        chain=chain, pro=pro, prefetch=op if prefetch else None, ring_a=ring)
    return len(used)


def emit_batch_matmul(em, op, loc):
    o = op.operation
    A = em.tensor(o.operands[0])
    B, colscale, scale = _rhs(em, op, o.operands[1])
    chain = _chain(em, op)
    O, rnd, wide = _output(em, op, chain)
    ashape, bshape = A.shape, B.shape
    trans = bool(_attr(op, "transpose_rhs", False))
    M, K, N = ashape[-2], ashape[-1], bshape[-2] if trans else bshape[-1]
    nb = math.prod(ashape[:-2])
    batches = [(i * M, i * (N if trans else K), i * M) for i in range(nb)]
    used, g, _ = matmul(em, A, B, O, M, N, K, colscale=colscale, scale=scale, plan=KernelPlan.of(op, em.target),
                        batches=batches, loc=loc, round_fmt=rnd, epi=_epilogue(em, op, O, chain), trans_b=trans,
                        sm=softmax_of(op), widen_last=wide, chain=chain)
    return len(used)


def _output(em, op, chain=None):
    """(the tensor the kernel stores, the format it rounds to before widening it or None, whether it widens after
    the epilogue): the matmul's result, or with a widening cast after its epilogue map (rows.widened_by) the cast's
    result as the matmul's rows, rounded to the map's format first. With a chained matmul (``chain``) the result
    never leaves the cores: a tensor of its shape and format with no memory, which nothing stores to."""
    if chain is not None:
        shape, elt = _tensor_type(op.operation.results[0])
        em.in_kernel.add(op.operation.results[0])
        return DevTensor(tuple(shape), format_of(elt), 0, None, 0), _round_fmt(op), False
    wide = widened_by(op)
    if wide is None:
        return em.result(op), _round_fmt(op), False
    res = op.operation.results[0]
    em.dev[res] = O = em.result(wide).reshaped(_tensor_type(res)[0])
    return O, format_of(_tensor_type(res)[1]), True


def _chain(em, op):
    """(V, the chained matmul's result) when a matmul chained to this one's softmax (:func:`chained_of`) is
    computed by its kernel, else None."""
    pv = chained_of(op)
    if pv is None:
        return None
    v = pv.operands[1]
    return em.tensor(_viewed(v)).reshaped(_tensor_type(v)[0]), em.result(pv)


def _epilogue(em, op, O, chain=None, sib=None):
    """(the map this matmul applies before its stores (rows.epilogue), the device tensors of its further
    inputs, as [rows, N] views like O's, None for the one its sibling ``sib`` computes (:func:`sibling_of`'s
    answer), the sibling's result format or None), the map's result then being O; or None."""
    found = epilogue_of(op)
    if found is None:
        return None
    epi_op, epi = found
    res = epi_op.operation.results[0]
    shape = _tensor_type(res)[0]
    if chain is None:
        em.dev[res] = O.reshaped(shape)
    else:                               # an attention mask's add before the softmax: on the cores only
        em.in_kernel.add(res)

    def rows_of(v):
        """A further input as O's rows: itself, or (broadcast along leading dims) a row view repeating its rows."""
        t, ishape = em.tensor(v), _tensor_type(v)[0]
        if tuple(ishape) == tuple(shape):
            return t.reshaped(O.shape)
        return t.row_view(broadcast_rows(ishape, shape, 0, math.prod(shape[:-1])), O.shape)
    X = [None if sib is not None and i == sib[0] else rows_of(epi_op.operation.operands[j])
         for i, j in enumerate(epi.extra)]
    return epi, X, None if sib is None else format_of(_tensor_type(sib[1].results[0])[1])


def sibling_of(op, chosen: bool = True):
    """For a matmul whose kernel applies an epilogue map, the further input of that map a sibling matmul computes, as
    (its index in the map's ``Epilogue.extra``, the sibling op); else None. The sibling is a matmul of kernel
    ``sibling`` (spyre-siblings chose it; with ``chosen`` False, of kernel ``matmul``: a candidate) of the same lhs
    value (through row-view reshapes) by a rhs of the same type, layout and quantization, without a bias, with this
    one's result type and operand conversions, whose result only that map reads: an MLP's ``act(gate(x)) * up(x)``.
    This matmul's kernel (no softmax epilogue) multiplies each A tile by both rhs tiles, in the K order of the
    matmul alone (spyre-divide-work and spyre-tile keep its K split and K tile), so the sibling's A is never loaded
    again, its result never round-trips device memory, and both results are bit-identical to two kernels'."""
    o = op.operation
    if o.name != "spyre.matmul" or _attr(o, "spyre.kernel") != "matmul" or len(o.operands) != 2 \
            or softmax_of(op) is not None:
        return None
    found = epilogue_of(op)
    if found is None:
        return None
    epi_op, epi = found
    for i, j in enumerate(epi.extra):
        v = epi_op.operation.operands[j]
        g = _owner(_viewed(v))
        if g is not None and g != o and _attr(g, "spyre.kernel") == ("sibling" if chosen else "matmul") \
                and _twins(o, g) and _one_use(v) is not None \
                and _one_use(_viewed(v)) is not None:
            return i, g
    return None


def sibling_applier(op):
    """The matmul whose kernel computes ``op``, a matmul chosen as kernel ``sibling`` (:func:`sibling_of`), or None
    when none does any more."""
    o = op.operation
    user = _one_use(o.results[0])
    while user is not None and user.operation.name == "spyre.reshape":
        user = _one_use(user.operation.results[0])
    if user is None or _attr(user, "spyre.kernel") != "epilogue":
        return None
    epi = epilogue(user)
    p = _owner(_viewed(user.operation.operands[epi.src])) if epi is not None else None
    found = sibling_of(p) if p is not None and p.name == "spyre.matmul" else None
    return p if found is not None and found[1] == o else None


def chained_of(op, chosen: bool = True):
    """For a matmul whose kernel applies a softmax epilogue (rows.softmax_of), the matmul it computes too from each
    finished tile: one of kernel ``chained`` (spyre-chain-matmuls chose it; with ``chosen`` False, of kernel
    ``matmul``: a candidate) reading the softmax's result, through row-view reshapes each the only reader, as its
    lhs, by a rhs V defined before this matmul (or row-view reshapes of one) in a format the PT array multiplies,
    stored as is (no transpose), without a bias, operand conversions, a rounding to widen or an epilogue of its own,
    over the same batches and rows: attention's ``softmax(q @ k^T + mask) @ v``. Else None."""
    sm = softmax_of(op)
    if sm is None or op.operation.name not in ("spyre.matmul", "spyre.batch_matmul"):
        return None
    v = sm.operation.results[0]
    user = _one_use(v)
    while user is not None and _row_view(user):
        v = user.operation.results[0]
        user = _one_use(v)
    if user is None:
        return None
    pv = user.operation
    if pv.name not in ("spyre.matmul", "spyre.batch_matmul") or pv.operands[0] != v or len(pv.operands) != 2 \
            or _attr(pv, "spyre.kernel") != ("chained" if chosen else "matmul") or _attr(pv, "transpose_rhs") \
            or any(_attr_text(pv, a) is not None for a in ("spyre.convert_operands", "spyre.convert_result")) \
            or epilogue_of(pv) is not None or softmax_of(pv) is not None \
            or not _precedes(_viewed(pv.operands[1]), op):
        return None
    (ps, pelt), (vs, velt) = _tensor_type(pv.operands[0]), _tensor_type(pv.operands[1])
    qs = _tensor_type(op.operation.results[0])[0]
    if format_of(velt) not in PT_FORMATS or format_of(pelt) not in PT_FORMATS or ps[-1] != qs[-1] \
            or ps[-2] != qs[-2] or math.prod(ps[:-2]) != math.prod(qs[:-2]) or vs[:-2] != ps[:-2]:
        return None
    return pv


def chain_applier(op):
    """The matmul whose kernel computes ``op``, a matmul chosen as kernel ``chained`` (:func:`chained_of`), or
    None when none does any more."""
    p = _owner(_viewed(op.operation.operands[0]))
    if p is None or p.name != "spyre.softmax" or _attr(p, "spyre.kernel") != "epilogue":
        return None
    from .rows import softmax_source

    mm = softmax_source(p)
    return mm if mm is not None and chained_of(mm) == op.operation else None


def prologue_of(op, chosen: bool = True):
    """For a matmul (not batched) of kernel ``matmul``, the norm whose result is its lhs (through reshapes keeping
    the innermost dim), applied by its kernel to each A tile it would load (:class:`Prologue`): an rmsnorm, or a
    layernorm over the last dim, of kernel ``prologue`` (spyre-norm-prologues chose it; with ``chosen`` False, of
    kernel ``rows``: a candidate), whose result, in a format the PT array multiplies and converted by no one,
    only this matmul and the sibling its kernel computes (:func:`sibling_of`) read, as their lhs: a decoder's
    ``q/k/v(rmsnorm(x))`` and ``gate/up(rmsnorm(x))``. Else None."""
    o = op.operation
    if o.name != "spyre.matmul" or _attr(o, "spyre.kernel") != "matmul" \
            or "lhs" in (_attr_text(o, "spyre.convert_operands") or ""):
        return None
    v = o.operands[0]
    p = _owner(v)
    while p is not None and _row_view(p):
        p = _owner(p.operands[0])
    if p is None or p.name not in NORMS or _attr(p, "spyre.kernel") != ("prologue" if chosen else "rows"):
        return None
    shape, elt = _tensor_type(p.results[0])
    if format_of(elt) not in PT_FORMATS or not shape or \
            (p.name == "spyre.layernorm" and (_attr(p, "axis", -1) or 0) % len(shape) != len(shape) - 1):
        return None
    found = sibling_of(op)
    readers = {o} | ({found[1]} if found is not None else set())

    def only_lhs(val) -> bool:
        for use in val.uses:
            u = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if _row_view(u):
                if not only_lhs(u.results[0]):
                    return False
            elif u not in readers or use.operand_number != 0:
                return False
        return True
    return p if only_lhs(p.results[0]) else None


def prologue_applier(op):
    """The matmul whose kernel applies norm ``op`` of kernel ``prologue`` (:func:`prologue_of`), or None when none
    does any more."""
    o = op.operation
    todo = [o.results[0]]
    while todo:
        for use in todo.pop().uses:
            u = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if _row_view(u):
                todo.append(u.results[0])
            elif u.name == "spyre.matmul" and use.operand_number == 0:
                norm = prologue_of(u)
                if norm is not None and norm == o:
                    return u
    return None


_TWIN_ATTRS = ("transpose_rhs", "spyre.convert_operands", "spyre.share_of")


def _twins(o, g) -> bool:
    """``g`` may be computed beside matmul ``o`` by its kernel (:func:`sibling_of`)."""
    if g.name != "spyre.matmul" or len(g.operands) != 2 or _attr(g, "spyre.convert_result") is not None:
        return False
    if _viewed(g.operands[0]) != _viewed(o.operands[0]) or g.operands[0].type != o.operands[0].type \
            or g.operands[1].type != o.operands[1].type or g.results[0].type != o.results[0].type:
        return False
    if any(_attr_text(g, a) != _attr_text(o, a) for a in _TWIN_ATTRS):
        return False
    return _weight_kind(g.operands[1]) == _weight_kind(o.operands[1])


def _attr_text(op, name):
    return str(op.attributes[name]) if name in op.attributes else None


def _weight_kind(v):
    """How a rhs is quantized: the dequantizing cast it comes from (through restickifies and reshapes), by its
    operand types and scale attributes; None for a plain tensor."""
    p = _owner(v)
    while p is not None and p.name in ("spyre.transpose", "spyre.reshape") and len(p.operands) == 1:
        p = _owner(p.operands[0])
    if p is None or p.name != "spyre.cast":
        return None
    return tuple(str(x.type) for x in p.operands), _attr_text(p, "scale_mode"), _attr_text(p, "axis")


def _rhs(em, op, rhs):
    """The rhs as a [.., K, N] device tensor ([.., N, K] with ``transpose_rhs``, read with MATMUL TRANS_B); a
    quantized weight brings its per-column (or per-tensor) scale."""
    colscale = scale = None
    if rhs not in em.known:
        return em.tensor(rhs), colscale, scale
    qs = em.qscale.get(rhs)
    shape, elt = _tensor_type(rhs)
    fmt = em.qfmt.get(rhs) or format_of(elt)
    name = em._name(em._const_names.get(rhs, "w"))
    if fmt is Format.INT8:
        buf = em.b.constant(name, np.asarray(em.known[rhs]).astype(np.int8), fmt, encoded=True)
    else:
        buf = em.stored_constant(rhs, name, fmt) or em.b.constant(name, np.asarray(em.known[rhs], np.float32), fmt)
    B = em._buffer_tensor(buf)
    if qs is not None:
        s, axis = qs
        if axis is None:
            scale = float(np.asarray(s).reshape(-1)[0])
        else:
            if axis % len(shape) != len(shape) - (2 if _attr(op, "transpose_rhs", False) else 1):
                raise EmitError("per-channel weight scales must be along the output channels", op.operation.location)
            colscale = em._buffer_tensor(em.b.constant(em._name(name + ".scale"),
                                                       np.asarray(s, np.float32).reshape(1, -1), "fp32"))
    return B, colscale, scale


def _round_fmt(op):
    """The format a matmul's result is rounded to before it is widened to the result type
    (``spyre.convert_result``, set by spyre-fuse), or None."""
    from torch_mlir import ir

    attrs = op.operation.attributes
    if "spyre.convert_result" not in attrs:
        return None
    return format_of(ir.TypeAttr(attrs["spyre.convert_result"]).value)


EMITTERS = {"spyre.matmul": emit_matmul, "spyre.batch_matmul": emit_batch_matmul}
KERNELS = {"spyre.matmul": ("matmul", "sibling", "chained"), "spyre.batch_matmul": ("matmul", "chained")}
