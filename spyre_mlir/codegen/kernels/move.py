"""Data movement on the device: transposes, slices, concats and reshapes that :mod:`..emitter` cannot alias.

* whole sticks move by DMA (:func:`_emit_rows`): result rows gathered from the operands' rows (a transpose
  that keeps the innermost dim, a slice taking all of it or whole sticks of it, a concat along an outer dim)
  straight into the output tiles, following the op's plan (``out0 out1`` in ``spyre.tile`` rows);
* a transpose of the last two dims (the innermost dim moving) is a RESTICK instruction (:func:`restick`): a
  restickify through device memory on core 0's DMA engine, fenced by barriers;
* data movement inside the innermost dim, below a stick, is exact 0/1 selection matmuls on the PT array
  (:func:`col_terms`, for dlf16/fp8 data), every selection matrix loaded once per core;
* a gather of a weight's rows by indices computed at run time (an embedding lookup) is GATHER instructions
  (:func:`emit_gather`): the indices' stick loaded, the rows they pick copied into the output tile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from spyre_mlir.passes.analysis import KERNEL, RING_INPUT
from spyre_mlir.runtime.assembler import Tile
from spyre_mlir.runtime.formats import STICK_BYTES, Format
from spyre_mlir.runtime.isa import tile_bytes

from ..common import EmitError, _attr, _sub, _tensor_type
from ..plan import KernelPlan
from ..memory import DevTensor, format_of, load_gather, load_rows, store_rows, store_scatter
from .rows import _role, planned, run_tiles

__all__ = ["restick", "col_terms", "in_width", "out_width", "term_cols", "column_selections", "row_sources",
           "ring_merges", "ring_slots", "ring_rows", "ring_source", "ring_sends", "ring_consumer", "prefetchable",
           "last_segment", "select", "EMITTERS"]


def select(op, target, known) -> str | None:
    """How the device moves ``op``'s data (a transpose, slice, concat or reshape): ``"alias"`` (a reshape
    keeping the innermost dim, a slice of contiguous whole rows (:func:`slice_rows`): the same bytes; or a
    transpose keeping the innermost dim whose readers all take a row view, :func:`views_ok`: its operand's
    rows, read in place), ``"dma-rows"``, ``"restick"`` or ``"select-cols"``; None when
    it cannot (then the host does). A reshape or slice of a row view is an alias only where a view may go (a
    reshape of one keeps its innermost dim or merges whole source rows, :func:`_keeps_rows`)."""
    name, view = op.operation.name, _is_view(op.operation.operands[0])
    if name == "spyre.gather":
        return "gather" if _gathers(op, known, target) else None
    if name == "spyre.reshape" and _is_alias(op) and (same_innermost(op) or not _leaves(op)) and (
            not view or (_keeps_rows(op) and views_ok(op.operation.results[0]))):
        return "alias"
    if name == "spyre.slice" and slice_rows(op) is not None and not _leaves(op) and (
            not view or views_ok(op.operation.results[0])):
        return "alias"
    if name == "spyre.transpose" and row_sources(op) is not None and views_ok(op.operation.results[0]):
        return "alias"
    if row_sources(op) is not None:
        return "dma-rows"
    if _restick_shape(op, target) is not None:
        return "restick"
    if _selections_fit(op, target):
        return "select-cols"
    return None


_GATHER_TABLES = ("f32", "!spyre.dlf16", "f16", "bf16", "f8E4M3FN", "f8E5M2", "i8", "i32")


def _gathers(op, known, target) -> bool:
    """A gather the device runs (kernel ``gather``): rows of a 2-D table known at compile time (a weight: a
    constant buffer nothing writes) in a format of whole bytes, within a core's span of device memory, picked by
    int32/int64 indices the device holds as they are (not a row view)."""
    table, ids = op.operation.operands
    (tshape, telt), (ishape, ielt) = _tensor_type(table), _tensor_type(ids)
    if not (table in known and tshape is not None and len(tshape) == 2 and str(telt) in _GATHER_TABLES
            and str(ielt) in ("i32", "i64") and ishape is not None and not _is_view(ids)):
        return False
    return target is None or tile_bytes(tshape[0], tshape[1], format_of(telt)) <= target.core_span_bytes


def emit_gather(em, op, loc):
    """Rows of a weight picked by indices (an embedding lookup): output row r of the [indices, D] view is table
    row ids[r]. The plan's row tiles (``out0``) split the indices over cores; per tile, each run of indices
    inside one stick of one row of the indices' tensor loads that stick into ``idx`` and one GATHER copies the
    rows it picks into the tile, which is then stored. An index outside the table stops the run with an error
    (the runtime checks each one)."""
    o = op.operation
    T, I = em.tensor(o.operands[0]), em.tensor(o.operands[1])
    if T.rowmap is not None or T.addr != T.buffer.addr or T.buffer.kind not in ("constant", "input") \
            or T.buffer.rows != T.rows or I.rowmap is not None:
        raise EmitError(f"spyre.gather reads a table that is not a whole constant or input buffer "
                        f"('{T.buffer.name}', {T.buffer.kind}), or indices through a view", o.location)
    O = em.result(op)
    b, R, D = em.b, O.rows, T.cols
    kp, tiles = planned(em, op, R)
    S, w = I.cols, I.fmt.nbytes(1)
    per = STICK_BYTES // w                     # indices per stick
    for core, r0, n in tiles:
        idx = kp.tile_at("idx", 1, per, I.fmt)
        out = _sub(kp.tile_at("out0", kp.tile[0], D, T.fmt), n, D)
        r = r0
        while r < r0 + n:
            i, s = divmod(r, S)
            cnt = min(r0 + n - r, S - s, per - s % per)
            b.dma_load(core, I.addr + i * I.pitch + s // per * STICK_BYTES, idx.addr, (1, STICK_BYTES), loc=loc)
            b.gather(core, out.row_slice(r - r0, r - r0 + cnt), T.buffer, idx.addr + s % per * w, I.fmt, loc=loc)
            r += cnt
        store_rows(b, core, out, O, r0, loc=loc)
    return kp.cores


def _is_view(v) -> bool:
    """``v`` is a row view: the result of a transpose or a row-repeating map chosen as ``alias``, or of an alias
    of one."""
    owner = v.owner.operation if hasattr(v.owner, "operation") else None
    if owner is None or KERNEL not in owner.attributes or _attr(owner, KERNEL) != "alias":
        return False
    return owner.name in ("spyre.transpose", "spyre.map") or _is_view(owner.operands[0])


def views_ok(v) -> bool:
    """Every reader of ``v`` can take it as a row view (``memory.DevTensor.rowmap``): it reads rows through
    the DMA gathers of ``load_rows``/``load_gather`` (a matmul, a row-wise op, or a data movement by rows, which
    passes the view on when its own readers can and else gathers a copy; a reshape merging whole source rows
    into wider rows, when its own readers can), never by addressing its bytes (a restick, a convolution, the
    host, a return). A transpose whose readers all can is read in place."""
    from . import matmul, rows

    for use in v.uses:
        user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        name = user.name
        if name in ("spyre.matmul", "spyre.batch_matmul"):
            ok = matmul.select(user, None, set()) == "matmul"
        elif name in rows.EMITTERS:     # rows gathered by its kernel, its producer's (an epilogue) or its readers'
            ok = rows.select(user, None, set()) in ("rows", "epilogue", "alias")
        elif name == "spyre.reshape" and not same_innermost(user):
            ok = _keeps_rows(user) and not _leaves(user) and views_ok(user.results[0])
        elif name in ("spyre.slice", "spyre.transpose", "spyre.concat", "spyre.reshape"):
            ok = row_sources(user) is not None        # a view of it in turn, or its rows gathered (a copy)
        else:
            ok = False
        if not ok:
            return False
    return True


def _view_width(v) -> int:
    """The columns of the source rows a view of ``v`` reads in place: those of the rows an alias chain reads
    (a merged row view's ``block``), else ``v``'s innermost dim."""
    owner = v.owner.operation if hasattr(v.owner, "operation") else None
    if owner is not None and owner.name in ("spyre.transpose", "spyre.reshape", "spyre.slice", "spyre.map") \
            and _is_view(owner.operands[0]):
        return _view_width(owner.operands[0])
    shape, _ = _tensor_type(v)
    return (shape[-1:] or (1,))[0]


def _keeps_rows(op) -> bool:
    """A reshape that a row view of its operand passes through (``DevTensor.reshaped``): it keeps the innermost
    dim, or its rows are whole source rows of whole sticks side by side (attention's [s, h, d] -> [s, h*d])."""
    if same_innermost(op):
        return True
    oshape, elt = _tensor_type(op.operation.results[0])
    w = _view_width(op.operation.operands[0])
    return _is_alias(op) and bool(oshape) and oshape[-1] % w == 0 and format_of(elt).nbytes(w) % STICK_BYTES == 0


def _is_alias(op) -> bool:
    """The reshape's result has its operand's bytes: the innermost dim stays, or both innermost dims are whole
    sticks (no padding on either side, so both layouts are the same row-major bytes: splitting [.., 768] into
    [.., 12, 64] dlf16 heads, or merging them back)."""
    ishape, elt = _tensor_type(op.operation.operands[0])
    oshape, _ = _tensor_type(op.operation.results[0])
    inner, outer = (ishape[-1:] or (1,))[0], (oshape[-1:] or (1,))[0]
    if inner == outer:
        return True
    try:
        fmt = format_of(elt)
    except ValueError:
        return False
    return fmt.nbytes(inner) % STICK_BYTES == 0 and fmt.nbytes(outer) % STICK_BYTES == 0


def slice_rows(op) -> int | None:
    """The first row (of the operand's rows: every dim but the innermost) of a slice whose result is a
    contiguous block of whole rows of its operand (dims before one are 1 in the slice, the dims after it and the
    innermost whole, unit strides: a split of the leading dim, like q, k, v of a permuted qkv), else None. Its
    bytes are the operand's from that row on (the canonical layout keeps rows contiguous)."""
    ishape, _ = _tensor_type(op.operation.operands[0])
    off, size = list(_attr(op, "offsets")), list(_attr(op, "sizes"))
    step = list(_attr(op, "strides") or [1] * len(ishape))
    if not ishape or any(s != 1 for s in step) or min(size) < 1 or size[-1] != ishape[-1]:
        return None
    lead = len(ishape) - 1
    d = max((i for i in range(lead) if size[i] != ishape[i]), default=0)     # the last partial dim
    if any(size[i] != 1 for i in range(d)):
        return None
    return int(np.ravel_multi_index(tuple(off[:lead]), ishape[:lead])) if lead else 0


def _leaves(op) -> bool:
    """The result is returned or read by host code: an alias would need a host copy into a buffer of its own
    shape, so a reshape that moves whole sticks between rows keeps a device kernel there."""
    return any(u.owner.name in ("func.return", "spyre.host") or not u.owner.name.startswith("spyre.")
               for u in op.operation.results[0].uses)


def same_innermost(op) -> bool:
    """A reshape that keeps its innermost dim (its rows are its operand's rows, split or merged)."""
    ishape, _ = _tensor_type(op.operation.operands[0])
    oshape, _ = _tensor_type(op.operation.results[0])
    return (ishape[-1:] or (1,)) == (oshape[-1:] or (1,))


def emit_move(em, op, loc):
    kernel = _attr(op, KERNEL)
    emit = {"dma-rows": _emit_rows, "restick": _emit_restick, "select-cols": _emit_cols}.get(kernel)
    if emit is None:
        raise ValueError(f"{op.operation.name} has no data movement kernel '{kernel}'")
    return emit(em, op, loc)


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
    if name == "spyre.reshape":          # keeping the innermost dim: row r is row r (a row view's copy)
        ishape, _ = _tensor_type(o.operands[0])
        return [(0, np.arange(idx.shape[1]), 0)] if (ishape[-1:] or (1,)) == oshape[-1:] else None
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
    kernels = []
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

        kernels.append((core, load, work))
    run_tiles(b, plan, nbuf, kernels, loc)
    return gr


def _restick_shape(op, target):
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
    span = target.core_span_bytes
    if n * tile_bytes(1, k, fmt) > span or k * tile_bytes(1, n, fmt) > span:     # one batch per instruction at least
        return None
    return math.prod(ishape[:-2]), n, k


def restick(em, S: DevTensor, O: DevTensor, m: int, n: int, k: int, loc) -> None:
    """O[b] = S[b]^T for b < m, by RESTICK on core 0's DMA engine, in batch chunks a core can address.
    The caller fences it with barriers (it reads what other cores wrote and is read by them)."""
    fmt = S.fmt
    sb, db = n * tile_bytes(1, k, fmt), k * tile_bytes(1, n, fmt)
    per = max(1, em.target.core_span_bytes // max(sb, db))
    for b0 in range(0, m, per):
        nb = min(per, m - b0)
        em.b.restick(0, S.addr + b0 * sb, O.addr + b0 * db, (nb, n, k), fmt, loc=loc)


def _emit_restick(em, op, loc):
    """A transpose of the last two dims (the innermost dim moves): a restickify in device memory."""
    shape = _restick_shape(op, em.target)
    if shape is None:
        raise ValueError("the transpose is not a restickify of one on-device format the cores can address")
    m, n, k = shape
    S = em.tensor(op.operation.operands[0])
    O = em.result(op)
    restick(em, S, O, m, n, k, loc)
    return 1


def col_terms(op):
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
        terms, c0 = [], 0
        for i, v in enumerate(o.operands):
            c = _tensor_type(v)[0][-1]
            P = np.zeros((c, cout), np.float32)
            P[np.arange(c), c0 + np.arange(c)] = 1
            terms.append((i, np.arange(rout), P))
            c0 += c
        groups = [(np.arange(rout), terms)]
    elif name == "spyre.reshape":
        cin = in_width(op)             # rows of whole sticks split into pieces of sticks: see in_width
        if cin % cout == 0:            # split the innermost dim: k destination row sets
            k = cin // cout
            groups = []
            for h in range(k):
                P = np.zeros((cin, cout), np.float32)
                P[h * cout + np.arange(cout), np.arange(cout)] = 1
                dst = np.arange(h, rout, k)
                groups.append((dst, [(0, dst // k, P)]))
        elif cout % cin == 0:          # merge k rows into one: k terms add up
            width = out_width(op)      # rows longer than a stick: built stick by stick (see out_width)
            rows = rout * cout // width
            k = width // cin
            terms = []
            for h in range(k):
                P = np.zeros((cin, width), np.float32)
                P[np.arange(cin), h * cin + np.arange(cin)] = 1
                terms.append((0, np.arange(rows) * k + h, P))
            groups = [(np.arange(rows), terms)]
    return groups


def _widths(op) -> tuple[int, int, int]:
    """(cin, cout, stick): the innermost dims of a reshape's operand and result, and a stick's elements of its
    format (0 for formats below a byte)."""
    o = op.operation
    (ishape, elt), (oshape, _) = _tensor_type(o.operands[0]), _tensor_type(o.results[0])
    nbytes = format_of(elt).nbytes(1)
    return (ishape[-1] if ishape else 1, oshape[-1] if oshape else 1, STICK_BYTES // nbytes if nbytes else 0)


def _stick_rows(piece: int, whole: int, stick: int) -> int:
    """lcm(piece, stick), the narrowest rows of whole sticks that hold whole pieces, when rows of ``whole``
    elements are several of them; else ``whole``."""
    w = math.lcm(piece, stick) if stick else 0
    return w if w and piece < w < whole and whole % w == 0 else whole


def out_width(op) -> int:
    """The width of the rows a selection kernel writes: the result's innermost dim, except for a reshape that
    merges rows that are not whole sticks into rows of whole sticks (a CNN's flatten, [1, 64, 8, 8] -> [1, 4096];
    attention's heads of 96 merged back, [32, 8, 96] -> [32, 768]). That one writes its result as rows of ``w`` =
    lcm(cin, stick) elements (the same bytes: whole sticks have no padding), each merged from w / cin input
    rows, so its selection matrices are w / cin of [cin, w], not cout / cin of [cin, cout] that may not fit the
    scratchpad."""
    cin, cout, stick = _widths(op)
    return _stick_rows(cin, cout, stick) if op.operation.name == "spyre.reshape" else cout


def in_width(op) -> int:
    """The width of the operand rows a selection kernel reads: the operand's innermost dim, except for a reshape
    that splits rows of whole sticks into rows that are not whole sticks (attention's heads of 32 or 96 in
    DLFloat16: [128, 384] -> [128, 12, 32], [.., 3072] -> [.., 32, 96]). That one reads its operand as rows of
    ``w`` = lcm(cout, stick) elements (the same bytes: whole sticks have no padding), each split into w / cout
    result rows, so its selection matrices are w / cout of [w, cout], not cin / cout of [cin, cout] that may
    not fit the scratchpad. Not for a row view, whose rows are not its bytes."""
    o = op.operation
    cin, cout, stick = _widths(op)
    return _stick_rows(cout, cin, stick) if o.name == "spyre.reshape" and not _is_view(o.operands[0]) else cin


def _selections_fit(op, target) -> bool:
    """The selection matrices, loaded once per core, take at most a quarter of the scratchpad."""
    groups = col_terms(op)
    if groups is None:
        return False
    fmt = format_of(_tensor_type(op.operation.results[0])[1])
    need = sum(tile_bytes(p.shape[0], p.shape[1], fmt) for _, terms in groups for _, _, p in terms)
    return need <= target.scratchpad_usable_bytes // 4


def column_selections(w: int, ow: int, stride: int, k: int) -> np.ndarray:
    """A pool's 0/1 column selections, stacked: [k x w, ow], block j picking columns j, j + stride, ... (window
    column j), as the plan's one selection buffer holds them."""
    m = np.zeros((k, w, ow), np.float32)
    for j in range(k):
        m[j, np.arange(ow) * stride + j, np.arange(ow)] = 1
    return m.reshape(k * w, ow)


def _stacked(em, name: str, mats, fmt):
    """The 0/1 selection matrices ``mats`` (each [rows, cols], the same cols) as one constant, stacked by rows as
    the plan's ``sel`` buffer holds them (one DMA loads them all), and each one's first row."""
    first = [0]
    for m in mats:
        first.append(first[-1] + m.shape[0])
    const = em._buffer_tensor(em.b.constant(em._name(name), np.concatenate(mats, axis=0), fmt))
    return const, first


def merged_terms(groups) -> int:
    """The number of terms a group adds when every term of every group reads rows of one operand and some group
    has several (a reshape merging rows, a CNN's flatten): their rows are then gathered into one tile, ``in0``,
    term after term, in one 3-D DMA where their row patterns allow, instead of a DMA per term; else 0."""
    if len({s for _, terms in groups for s, _, _ in terms}) != 1:
        return 0
    k = max(len(terms) for _, terms in groups)
    return k if k > 1 and all(len(terms) == k for _, terms in groups) else 0


def term_cols(op, groups) -> list[int]:
    """The source width of each term position of the groups (the ``in0``, ``inb0``... tiles)."""
    width = max(len(terms) for _, terms in groups)
    cols = [_tensor_type(v)[0][-1] if _tensor_type(v)[0] else 1 for v in op.operation.operands]
    cols[0] = in_width(op)
    return [max(cols[terms[t][0]] for _, terms in groups if t < len(terms)) for t in range(width)]


def prefetchable(op, target) -> tuple[tuple[str, ...], float, float]:
    """``("sel",)``: the selection matrices select-cols loads once per core before its work, with the cycles
    those loads take (every core loading its copy) and keep it from its work (the same)."""
    kp = KernelPlan.of(op, target)
    load = kp.buffers["sel"][1] * kp.cores / (target.dram_read_gbps / target.clock_ghz) + target.dma_latency_cycles
    return ("sel",), load, load


def last_segment(op, target) -> None:
    """None: select-cols loads in its last segment (a gather per row tile)."""
    return None


def ring_merges(op) -> bool:
    """Whether select-cols ``op`` can take its input rows over the ring (spyre-chain-convs): a reshape merging rows
    (one group, its terms all reading operand 0 into ``in0``: :func:`merged_terms`), so a tile loads nothing else."""
    groups = col_terms(op) if op.name == "spyre.reshape" else None
    return groups is not None and len(groups) == 1 and merged_terms(groups) > 0


def ring_slots(grid, tile, rows: int) -> int:
    """The row tiles of one core (KernelPlan.row_tiles): with spyre.ring_input ``in0`` holds all of them at once."""
    return -(-(rows // grid[-1]) // tile[-1])


def ring_rows(op, target):
    """The input rows of select-cols ``op`` marked spyre.ring_input: (its ``in0`` tile, {row of its operand as
    stored: [(core, row of in0)]}). A core's tile i sits at row i x (terms x tile rows) of ``in0``, term after
    term as :func:`_emit_cols` reads them."""
    (_, terms), = col_terms(op)
    kp = KernelPlan.of(op, target)
    rows, tr, k = len(terms[0][1]), kp.tile[-1], len(terms)
    S = _tensor_type(op.operands[0])
    slots = ring_slots(kp.grid, kp.tile, rows)
    dest, seen = {}, {}
    for core, r0, n in kp.row_tiles(rows):
        at = seen.setdefault(core, 0) * k * tr
        seen[core] += 1
        for t, (_, src, _) in enumerate(terms):
            for i, s in enumerate(src[r0:r0 + n].tolist()):
                dest.setdefault(s, []).append((core, at + t * n + i))
    return kp.tile_at("in0", slots * k * tr, S[0][-1], format_of(S[1])), dest


def ring_source(op):
    """The select-cols flatten (:func:`ring_merges`) computing the A operand of matmul ``op`` when the matmul is its
    only reader: the producer spyre-chain-convs may let send ``op``'s A tiles over the ring. None otherwise."""
    o = op.operation if hasattr(op, "operation") else op
    v = o.operands[0]
    p = v.owner.operation if hasattr(v.owner, "operation") else None
    if p is None or p.name != "spyre.reshape" or _attr(p, KERNEL) != "select-cols" or len(list(v.uses)) != 1:
        return None
    return p


def ring_sends(op) -> bool:
    """Whether select-cols ``op`` writes rows of whole sticks, which it can send into a matmul's A tiles."""
    return (out_width(op) * format_of(_tensor_type(op.results[0])[1]).nbytes(1)) % STICK_BYTES == 0


def ring_consumer(op):
    """The matmul whose A tiles select-cols ``op`` sends over the ring instead of storing its result: that result's
    only reader, marked spyre.ring_input by spyre-chain-convs. None otherwise."""
    uses = list(op.results[0].uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner.operation
    if user.name != "spyre.matmul" or uses[0].operand_number != 0 or not _attr(user, RING_INPUT):
        return None
    return user


def _ring_sender(em, op, kp, cout: int, fmt, loc):
    """For a flatten whose result goes over the ring into its matmul's A tiles (:func:`ring_consumer`),
    ``send(core, T, rows)``: the rows of the finished tile ``T`` (result rows ``rows``, as rows of ``cout``) to every
    core whose A tile holds them, at their place there (matmul.ring_sticks), a RING_SEND per run of sticks
    contiguous on both sides (an SFU copy on the sending core itself). None for a flatten that stores it."""
    from .matmul import ring_sticks

    to = ring_consumer(op)
    if to is None:
        return None
    if not _attr(op, "spyre.barrier") and not kp.cores == KernelPlan.of(to, em.target).cores == 1:
        kp.fail("its result goes over the ring (spyre.ring_input on its reader), but no barrier follows it to "
                "deliver the rows (spyre.barrier)")
    dest = ring_sticks(to, em.target)
    unit = STICK_BYTES // fmt.nbytes(1)
    if not ring_sends(op):
        kp.fail("its rows are not whole sticks of its matmul's A")
    b = em.b

    def send(core, T, rows):
        runs = {}               # destination core: [[source address, destination address, bytes]]
        for i, d in enumerate(rows):
            for s in range(0, cout, unit):
                src = T.addr + i * T.pitch + s * fmt.nbytes(1)
                for c, dst in dest.get(int(d) * cout + s, ()):
                    run = runs.setdefault(c, [])
                    if run and run[-1][0] + run[-1][2] == src and run[-1][1] + run[-1][2] == dst:
                        run[-1][2] += STICK_BYTES
                    else:
                        run.append([src, dst, STICK_BYTES])
        for c in sorted(runs):
            for src, dst, n in runs[c]:
                if c == core:
                    rows_ = n // STICK_BYTES
                    b.sfu(core, "cast", Tile(dst, rows_, unit, fmt), Tile(src, rows_, unit, fmt), loc=loc)
                else:
                    b.ring_send(core, c, dst, src, n, loc=loc)
    return send


def _emit_cols(em, op, loc):
    """Movement inside the innermost dim as its plan says: the selection matrices loaded once per core, by one
    DMA (stacked in ``sel``), then per row tile and group the terms' source rows gathered (``in0``, ``inb0``...;
    all of a group's terms into ``in0`` at once when they read one operand, :func:`merged_terms`), multiplied
    into the fp32 ``acc`` (accumulating over a group's terms) and rounded into ``out0``, scattered to the
    group's destination rows. With spyre.ring_input the rows are in ``in0`` already (:func:`ring_rows`, sent by
    the conv storing them); a result whose matmul takes its A over the ring is sent there instead of stored
    (:func:`_ring_sender`)."""
    groups = col_terms(op)
    if groups is None:
        raise ValueError("it is no slice, concat or reshape inside the innermost dim")
    srcs = [em.tensor(v) for v in op.operation.operands]
    cin = in_width(op)
    if cin != srcs[0].cols:            # read as rows of in_width elements: the same bytes
        srcs[0] = dataclasses.replace(srcs[0], shape=(srcs[0].rows * srcs[0].cols // cin, cin))
    O = em.result(op)
    cout = out_width(op)
    if cout != O.cols:                 # written as rows of out_width elements: the same bytes
        O = dataclasses.replace(O, shape=(O.rows * O.cols // cout, cout))
    fmt = O.fmt
    b = em.b
    mats = [(gi, ti, P) for gi, (_, terms) in enumerate(groups) for ti, (_, _, P) in enumerate(terms)]
    const, sel_row = _stacked(em, f"select{em._op_index}", [P for _, _, P in mats], fmt)
    kp, plan = planned(em, op, len(groups[0][0]))
    tr = kp.tile[-1]
    ring_in = bool(_attr(op, RING_INPUT))
    if ring_in:
        from .conv import ring_source as conv_source

        if not ring_merges(op) or conv_source(op) is None:
            kp.fail("spyre.ring_input, but it is no flatten whose input a conv kernel sends over the ring")
    send = _ring_sender(em, op.operation, kp, cout, fmt, loc)
    whole = kp.tile_at("sel", sel_row[-1], cout, fmt)
    # spyre-prefetch may have planned the selections' loads during an earlier kernel.
    with em.prefetching(op) if em.prefetched(op, prefetchable) else contextlib.nullcontext():
        for core in range(kp.cores):
            load_rows(b, core, whole, const, 0, loc=loc)
    for core in range(kp.cores):
        sel = {(gi, ti): whole.row_slice(sel_row[j], sel_row[j + 1]) for j, (gi, ti, _) in enumerate(mats)}
        merged = merged_terms(groups)
        if ring_in:                     # every tile's rows arrive over the ring (ring_rows)
            whole_in = kp.tile_at("in0", ring_slots(kp.grid, kp.tile, len(groups[0][0])) * merged * tr,
                                  srcs[0].cols, fmt)
        elif merged:
            whole_in = kp.tile_at("in0", merged * tr, srcs[groups[0][1][0][0]].cols, fmt)
        else:
            ins = [kp.tile_at(_role(t) + "0", tr, c, fmt) for t, c in enumerate(term_cols(op, groups))]
        acc, out = kp.tile_at("acc", tr, cout, "fp32"), kp.tile_at("out0", tr, cout, fmt)
        for i, (r0, n) in enumerate((r0, n) for c2, r0, n in plan if c2 == core):
            for gi, (dst, terms) in enumerate(groups):
                if ring_in:
                    both = whole_in.row_slice(i * merged * tr, i * merged * tr + merged * n)
                elif merged:
                    S = srcs[terms[0][0]]
                    both = _sub(whole_in, merged * n, S.cols)
                    load_gather(b, core, both, S, np.concatenate([rows[r0:r0 + n] for _, rows, _ in terms]),
                                loc=loc)
                for ti, (s, rows, _) in enumerate(terms):
                    if merged:
                        At = both.row_slice(ti * n, (ti + 1) * n)
                    else:
                        At = _sub(ins[ti], n, srcs[s].cols)
                        load_gather(b, core, At, srcs[s], rows[r0:r0 + n], loc=loc)
                    last = ti == len(terms) - 1
                    b.matmul(core, At, sel[gi, ti], _sub(acc, n, cout), accumulate=ti > 0,
                             out=_sub(out, n, cout) if last else None, loc=loc)
                if send is not None:
                    send(core, _sub(out, n, cout), dst[r0:r0 + n])
                else:
                    store_scatter(b, core, _sub(out, n, cout), O, dst[r0:r0 + n], loc=loc)
    return kp.cores


EMITTERS = {"spyre.transpose": emit_move, "spyre.slice": emit_move, "spyre.concat": emit_move,
            "spyre.reshape": emit_move, "spyre.gather": emit_gather}
KERNELS = {name: ("dma-rows", "restick", "select-cols") for name in EMITTERS}
KERNELS["spyre.gather"] = ("gather",)
KERNELS["spyre.reshape"] = ("alias", "dma-rows", "select-cols")
KERNELS["spyre.slice"] = ("alias", "dma-rows", "restick", "select-cols")
KERNELS["spyre.transpose"] = ("alias", "dma-rows", "restick", "select-cols")
