"""Data movement on the device: transposes, slices, concats and reshapes that :mod:`..emitter` cannot alias.

* whole sticks move by DMA (:func:`_emit_rows`): result rows gathered from the operands' rows (a transpose
  that keeps the innermost dim, a slice taking all of it or whole sticks of it, a concat along an outer dim)
  straight into the output tiles, following the op's plan (``out0 out1`` in ``spyre.tile`` rows);
* a transpose of the last two dims (the innermost dim moving) is a RESTICK instruction (:func:`restick`): a
  restickify through device memory on core 0's DMA engine, fenced by barriers;
* data movement inside the innermost dim, below a stick, is exact 0/1 selection matmuls on the PT array
  (:func:`col_terms`, for dlf16/fp8 data). This kernel still sizes its own row tiles (``rows_plan``): its
  plan does not describe its selection matrices yet.
"""

from __future__ import annotations

import math

import numpy as np

from spyre_mlir.runtime.assembler import Tile
from spyre_mlir.runtime.formats import Format

from ..common import _attr, _sub, _tb, _tensor_type
from ..memory import DevTensor, format_of, load_gather, load_rows, store_rows, store_scatter
from .rows import pipelined, planned, rows_plan

__all__ = ["restick", "col_terms", "row_sources", "has_kernel", "EMITTERS"]


def has_kernel(em, op) -> bool:
    """Whether the device moves ``op``'s data (a transpose, slice or concat): by DMA, RESTICK or selection
    matmuls."""
    return row_sources(op) is not None or _restick_shape(em, op) is not None or col_terms(em, op) is not None


def emit_move(em, op, loc):
    if row_sources(op) is not None:
        return _emit_rows(em, op, loc)
    if _restick_shape(em, op) is not None:
        return _emit_restick(em, op, loc)
    return _emit_cols(em, op, loc)


def row_sources(op):
    """For data movement that keeps the innermost dim whole (a transpose that leaves it in place, a slice
    taking all of it or whole sticks of it, a concat along an outer dim): [(operand index, source row of
    every result row (-1: another operand), first column)] in the 2-D views; None otherwise."""
    o = op.operation
    name = o.name
    oshape, elt = _tensor_type(o.results[0])
    if oshape is None or len(oshape) < 2 or not format_of(elt).on_device:
        return None
    rank = len(oshape)
    idx = np.indices(oshape[:-1]).reshape(rank - 1, -1)
    if name == "spyre.transpose":
        perm = list(_attr(op, "permutation"))
        if perm[-1] != rank - 1:
            return None
        ishape, _ = _tensor_type(o.operands[0])
        src = np.empty_like(idx)
        for i, p in enumerate(perm[:-1]):
            src[p] = idx[i]
        return [(0, np.ravel_multi_index(tuple(src), ishape[:-1]), 0)]
    if name == "spyre.slice":
        ishape, _ = _tensor_type(o.operands[0])
        off, size = list(_attr(op, "offsets")), list(_attr(op, "sizes"))
        step = list(_attr(op, "strides") or [1] * rank)
        fmt = format_of(elt)
        # The innermost dim moves by DMA when the slice starts on a stick and covers whole sticks (or
        # runs to the end of the row, whose padding is zeros).
        if step[-1] != 1 or fmt.nbytes(off[-1]) % 128 or (
                fmt.nbytes(size[-1]) % 128 and off[-1] + size[-1] != ishape[-1]):
            return None
        src = np.array([off[d] + idx[d] * step[d] for d in range(rank - 1)])
        return [(0, np.ravel_multi_index(tuple(src), ishape[:-1]), off[-1])]
    if name == "spyre.concat":
        dim = _attr(op, "dim") % rank
        if dim == rank - 1:
            return None
        lshape, _ = _tensor_type(o.operands[0])
        rshape, _ = _tensor_type(o.operands[1])
        from_l = idx[dim] < lshape[dim]
        li, ri = idx.copy(), idx.copy()
        ri[dim] -= lshape[dim]
        li[dim] = np.where(from_l, li[dim], 0)
        ri[dim] = np.where(from_l, 0, ri[dim])
        lrows = np.ravel_multi_index(tuple(li), lshape[:-1])
        rrows = np.ravel_multi_index(tuple(ri), rshape[:-1])
        return [(0, np.where(from_l, lrows, -1), 0), (1, np.where(from_l, -1, rrows), 0)]
    return None


def _emit_rows(em, op, loc):
    """Data movement by DMA: result rows gathered from the operands' rows (no compute)."""
    sources = row_sources(op)
    srcs = [em.tensor(v) for v in op.operation.operands]
    O = em.result(op)
    R, C = O.rows, O.cols
    which = np.full(R, -1)
    rows = np.zeros(R, np.int64)
    col0 = {}
    for k, r, c0 in sources:
        sel = r >= 0
        which[sel], rows[sel] = k, r[sel]
        col0[k] = c0
    kp, plan = planned(em, op, R)
    gr, tr, nbuf = kp.grid[0], kp.tile[0], kp.nbuf
    b = em.b
    for core in range(gr):
        Ts = [kp.tile_at(f"out{j}", tr, C, O.fmt) for j in range(nbuf)]

        def load(k, r0, n, core=core, Ts=Ts):
            T = Ts[k % nbuf]
            i = r0
            while i < r0 + n:          # runs of rows from one source
                j = i
                while j < r0 + n and which[j] == which[i]:
                    j += 1
                sub = Tile(T.addr + (i - r0) * T.pitch, j - i, C, O.fmt)
                load_gather(b, core, sub, srcs[which[i]], rows[i:j], col0=col0[which[i]], loc=loc)
                i = j

        def work(k, r0, n, core=core, Ts=Ts):
            store_rows(b, core, _sub(Ts[k % nbuf], n, C), O, r0, loc=loc)

        pipelined(plan, core, nbuf, load, work)
    return gr


def _restick_shape(em, op):
    """(batch, rows, cols) of the source of a transpose that swaps the last two dims (any rank: batch is
    the product of the leading dims) of one on-device format, which RESTICK does in device memory;
    else None."""
    o = op.operation
    if o.name != "spyre.transpose":
        return None
    oshape, elt = _tensor_type(o.results[0])
    ishape, ielt = _tensor_type(o.operands[0])
    if oshape is None or ishape is None or len(ishape) < 2 or str(ielt) != str(elt):
        return None
    try:
        fmt = format_of(elt)
    except ValueError:
        return None
    rank = len(ishape)
    if not fmt.on_device or list(_attr(op, "permutation")) != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return None
    n, k = ishape[-2], ishape[-1]
    span = em.target.core_span_bytes
    if n * _tb(1, k, fmt) > span or k * _tb(1, n, fmt) > span:     # one batch per instruction at least
        return None
    return math.prod(ishape[:-2]), n, k


def restick(em, S: DevTensor, O: DevTensor, m: int, n: int, k: int, loc) -> None:
    """O[b] = S[b]^T for b < m, by RESTICK on core 0's DMA engine, in batch chunks a core can address.
    The caller fences it with barriers (it reads what other cores wrote and is read by them)."""
    fmt = S.fmt
    sb, db = n * _tb(1, k, fmt), k * _tb(1, n, fmt)
    per = max(1, em.target.core_span_bytes // max(sb, db))
    for b0 in range(0, m, per):
        nb = min(per, m - b0)
        em.b.restick(0, S.addr + b0 * sb, O.addr + b0 * db, (nb, n, k), fmt, loc=loc)


def _emit_restick(em, op, loc):
    """A transpose of the last two dims (the innermost dim moves): a restickify in device memory."""
    m, n, k = _restick_shape(em, op)
    S = em.tensor(op.operation.operands[0])
    O = em.result(op)
    restick(em, S, O, m, n, k, loc)
    em._force_barrier = True      # one core wrote all of it: every consumer waits
    return 1


def col_terms(em, op):
    """Data movement inside the innermost dim (a slice of it, a concat along it, a reshape that splits or
    merges it), which DMA cannot do below stick granularity, as products with 0/1 selection matrices on
    the PT array: exact, because every output element is one input times 1.0 accumulated in fp32 with
    zeros. Returns [(dst rows, [(operand, src rows, P [Cin, Cout])...])...] (the terms of a group add
    up into the same destination rows), or None (then the host does it)."""
    o = op.operation
    name = o.name
    oshape, elt = _tensor_type(o.results[0])
    if oshape is None or not oshape or format_of(elt) not in (Format.DLF16, Format.FP8_E4M3,
                                                              Format.FP8_E5M2):
        return None
    if any(format_of(_tensor_type(v)[1]) is not format_of(elt) for v in o.operands):
        return None
    cout = oshape[-1]
    rout = math.prod(oshape[:-1])
    lead = np.indices(oshape[:-1]).reshape(len(oshape) - 1, -1) if len(oshape) > 1 else np.zeros((0, 1), int)
    groups = None
    if name == "spyre.slice":
        ishape, _ = _tensor_type(o.operands[0])
        off, size = list(_attr(op, "offsets")), list(_attr(op, "sizes"))
        step = list(_attr(op, "strides") or [1] * len(ishape))
        src = np.array([off[d] + lead[d] * step[d] for d in range(len(ishape) - 1)])
        rows = np.ravel_multi_index(tuple(src), ishape[:-1]) if len(ishape) > 1 else np.zeros(1, int)
        P = np.zeros((ishape[-1], cout), np.float32)
        P[off[-1] + np.arange(cout) * step[-1], np.arange(cout)] = 1
        groups = [(np.arange(rout), [(0, rows, P)])]
    elif name == "spyre.concat" and _attr(op, "dim") % len(oshape) == len(oshape) - 1:
        ca = _tensor_type(o.operands[0])[0][-1]
        pa = np.zeros((ca, cout), np.float32)
        pa[np.arange(ca), np.arange(ca)] = 1
        pb = np.zeros((cout - ca, cout), np.float32)
        pb[np.arange(cout - ca), ca + np.arange(cout - ca)] = 1
        groups = [(np.arange(rout), [(0, np.arange(rout), pa), (1, np.arange(rout), pb)])]
    elif name == "spyre.reshape":
        ishape, _ = _tensor_type(o.operands[0])
        cin = ishape[-1] if ishape else 1
        if cin % cout == 0:            # split the innermost dim: k destination row sets
            k = cin // cout
            groups = []
            for h in range(k):
                P = np.zeros((cin, cout), np.float32)
                P[h * cout + np.arange(cout), np.arange(cout)] = 1
                dst = np.arange(h, rout, k)
                groups.append((dst, [(0, dst // k, P)]))
        elif cout % cin == 0:          # merge k rows into one: k terms add up
            k = cout // cin
            terms = []
            for h in range(k):
                P = np.zeros((cin, cout), np.float32)
                P[np.arange(cin), h * cin + np.arange(cin)] = 1
                terms.append((0, np.arange(rout) * k + h, P))
            groups = [(np.arange(rout), terms)]
    if groups is None:
        return None
    fmt = format_of(elt)
    usable = em.target.scratchpad_usable_bytes
    if sum(_tb(p.shape[0], p.shape[1], fmt) for _, terms in groups for _, _, p in terms) > usable // 4:
        return None
    return groups


def _emit_cols(em, op, loc):
    groups = col_terms(em, op)
    srcs = [em.tensor(v) for v in op.operation.operands]
    O = em.result(op)
    fmt, cout = O.fmt, O.cols
    b = em.b
    consts = {}
    for gi, (_, terms) in enumerate(groups):
        for ti, (_, _, P) in enumerate(terms):
            buf = b.constant(em._name(f"select{em._op_index}.{gi}.{ti}"), P, fmt)
            consts[gi, ti] = em._buffer_tensor(buf)
    used = 1
    for gi, (dst, terms) in enumerate(groups):
        cins = [srcs[s].cols for s, _, _ in terms]
        once = _tb(1, cout, "fp32") + _tb(1, cout, fmt)
        fixed = sum(_tb(c, cout, fmt) for c in cins)
        plan, gr, tr, _ = rows_plan(em, op, len(dst), once + sum(_tb(1, c, fmt) for c in cins), 0,
                                    fixed, op.operation.name)
        used = max(used, gr)
        for core in range(gr):
            b.reset_scratchpad(core)
            Ps = [b.alloc(core, c, cout, fmt) for c in cins]
            for ti, Pt in enumerate(Ps):
                load_rows(b, core, Pt, consts[gi, ti], 0, loc=loc)
            As = [b.alloc(core, tr, c, fmt) for c in cins]
            acc, out = b.alloc(core, tr, cout, "fp32"), b.alloc(core, tr, cout, fmt)
            for c2, r0, n in plan:
                if c2 != core:
                    continue
                for ti, (s, rows, _) in enumerate(terms):
                    At = _sub(As[ti], n, cins[ti])
                    load_gather(b, core, At, srcs[s], rows[r0:r0 + n], loc=loc)
                    last = ti == len(terms) - 1
                    b.matmul(core, At, Ps[ti], _sub(acc, n, cout), accumulate=ti > 0,
                             out=_sub(out, n, cout) if last else None, loc=loc)
                store_scatter(b, core, _sub(out, n, cout), O, dst[r0:r0 + n], loc=loc)
    return used


EMITTERS = {"spyre.transpose": emit_move, "spyre.slice": emit_move, "spyre.concat": emit_move,
            "spyre.reshape": emit_move}
