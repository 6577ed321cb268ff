"""Row-wise kernels: the skeleton every row-wise op shares, and the ops that compute on the SFU row by row
(map, reduce, softmax, layernorm, rmsnorm, cast).

Each kernel follows its op's plan (:mod:`spyre_mlir.codegen.plan`): the rows of the 2-D view split over
``spyre.grid = [gr]`` cores in ``spyre.tile = [tr]``-row tiles (:func:`planned`), every scratchpad tile at its
buffer's ``spyre.scratchpad`` offset by the name the op model gives it (``passes/op_model.py``: ``in0 in1``
streamed inputs, ``inb``... further map operands, ``out0 out1``, ``xf``/``sq`` fp32 work tiles, row statistics
``max sum`` / ``mean var`` / ``ms``, map temporaries ``ta tb``..., reduce ``rt acc``), double-buffered when the
plan is. :func:`pipelined` runs a core's tiles, issuing the next tile's load before this tile's work.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..common import _DEVICE_FLOATS, SFU_READS, _attr, _sub, _tensor_type, remembered
from ..plan import KernelPlan
from ..memory import format_of, load_gather, load_rows, store_rows
from ..sfu import NotOnSfu, live_temps, translate, writes_result
from spyre_mlir.runtime.formats import DLF16_MAX, Format
from spyre_mlir.runtime.isa import SFU_CLASS, SfuFn, sfu_fn

__all__ = ["pipelined", "broadcast_rows", "select", "EMITTERS"]


def planned(em, op, rows: int):
    """The op's kernel plan (:mod:`spyre_mlir.codegen.plan`) and its row tiles [(core, first row, rows)]."""
    kp = KernelPlan.of(op, em.target)
    return kp, kp.row_tiles(rows)


def _role(i: int) -> str:
    """Buffer role of a map operand, as the op model names it (passes/op_model.py): in, inb, inc, ..."""
    return "in" if i == 0 else "in" + chr(ord("a") + i)


def _temp(j: int) -> str:
    """A map temporary's buffer: ta, tb, ... (a name ending in 0/1 would read as a double buffer)."""
    return "t" + chr(ord("a") + j)


def pipelined(plan, core, nbuf, load, work):
    """Run ``load(k, r0, n)`` then ``work(k, r0, n)`` for every tile of ``core`` (k = its index on the core).
    With two buffers the next tile's load is issued before this tile's work: the DMA unit processes in
    program order, so only a load placed ahead of the store can overlap the compute (software prefetch)."""
    tiles = [(r0, n) for c, r0, n in plan if c == core]
    if nbuf == 1:
        for k, (r0, n) in enumerate(tiles):
            load(k, r0, n)
            work(k, r0, n)
        return
    if tiles:
        load(0, *tiles[0])
    for k, (r0, n) in enumerate(tiles):
        if k + 1 < len(tiles):
            load(k + 1, *tiles[k + 1])
        work(k, r0, n)


def run_tiles(b, plan, nbuf, kernels, loc, phases: bool = True) -> None:
    """Emit the tiles of every ``(core, load, work)`` of ``kernels``, each core :func:`pipelined`. When every
    core has one tile (nothing to overlap on a core) and ``phases`` (its work loads nothing itself), in two
    phases instead: every core's loads, a barrier, then every core's work and stores, so that no segment mixes
    reads and writes of device memory (each phase moves at the read or write bandwidth rather than the lower
    mixed one, cost.rowwise_cycles)."""
    one = {c: (r0, n) for c, r0, n in plan}
    if phases and 1 < len(plan) == len(one):
        for core, load, _ in kernels:
            load(0, *one[core])
        b.barrier([core for core, _, _ in kernels], loc=loc)
        for core, _, work in kernels:
            work(0, *one[core])
        return
    for core, load, work in kernels:
        pipelined(plan, core, nbuf, load, work)


def broadcast_rows(in_shape, out_shape, r0, n) -> np.ndarray:
    """Source row (in the 2-D view of an input broadcast to ``out_shape``) of result rows r0..r0+n."""
    out_lead = list(out_shape[:-1])
    ins = [1] * (len(out_shape) - len(in_shape)) + list(in_shape)
    in_lead = ins[:-1]
    r = np.arange(r0, r0 + n)
    if not out_lead:
        return np.zeros(n, np.int64)
    idx = np.unravel_index(r, out_lead)
    src = [ix if s != 1 else np.zeros_like(ix) for ix, s in zip(idx, in_lead)]
    return np.ravel_multi_index(src, [max(s, 1) for s in in_lead]) if in_lead else np.zeros(n, np.int64)


def select(op, target, known) -> str | None:
    """``"rows"`` when the device runs ``op`` (a map, reduce, softmax, layernorm, rmsnorm or cast): float data (maps
    also i1) and, for a map, a body the SFU computes; reductions over trailing dims; softmax and layernorm
    over the last dim; casts without scales; else None. ``"epilogue"`` for a map its producer's kernel applies
    (:func:`epilogue`); ``"alias"`` for a map that only repeats its input's rows (:func:`repeated_rows`) when
    every reader takes a row view (``move.views_ok``)."""
    if not _runs(op):
        return None
    if op.operation.name == "spyre.softmax":
        mm = softmax_source(op)
        return "epilogue" if mm is not None and _whole_rows_fit(mm, op, target) else "rows"
    if epilogue(op) is not None or cast_source(op) is not None:
        return "epilogue"
    from .move import views_ok

    return "alias" if repeated_rows(op) is not None and views_ok(op.operation.results[0]) else "rows"


def repeated_rows(op):
    """For a map that copies its one input broadcast along leading dims (repeat_kv's expand of grouped-query
    attention's k and v to every head; a plain copy), the input row of each result row; else None."""
    o = op.operation
    if o.name != "spyre.map" or len(o.operands) != 1:
        return None
    body = [x.operation for x in o.regions[0].blocks[0].operations]
    if len(body) != 1 or body[0].operands[0] != o.regions[0].blocks[0].arguments[0]:
        return None
    (ishape, ielt), (oshape, oelt) = _tensor_type(o.operands[0]), _tensor_type(o.results[0])
    if ielt != oelt or not ishape or not oshape or ishape[-1] != oshape[-1] or len(ishape) > len(oshape) \
            or any(a not in (1, b) for a, b in zip([1] * (len(oshape) - len(ishape)) + list(ishape), oshape)):
        return None
    return broadcast_rows(ishape, oshape, 0, math.prod(oshape[:-1]))


_EPILOGUE_PRODUCERS = {("spyre.conv2d", "conv2d"), ("spyre.matmul", "matmul"), ("spyre.batch_matmul", "matmul")}


class Epilogue(NamedTuple):
    """A map its producer's kernel applies: its SFU micro-ops and result register, the operand ``src`` the
    producer's output tile stands for, the operands ``extra`` the kernel loads from device memory tile by
    tile (matmul producers only), and its fp32 temporaries' slots (``temps`` of them: the producer's
    accumulator, and for a matmul's a second tile of its plan, ``ept``)."""

    ops: list
    result: tuple
    src: int
    extra: tuple
    slots: dict
    temps: int


def _owner(v):
    """The op defining ``v`` (None for a block argument)."""
    return v.owner.operation if hasattr(v.owner, "operation") else None


def _one_use(v):
    uses = list(v.uses)
    return uses[0].owner if len(uses) == 1 else None


def _row_view(op) -> bool:
    """A device reshape keeping the innermost dim: the same rows, so the same 2-D view of the same bytes."""
    o = op.operation
    if o.name != "spyre.reshape" or _attr(o, "spyre.const_fold"):
        return False
    return (_tensor_type(o.operands[0])[0][-1:] or (1,)) == (_tensor_type(o.results[0])[0][-1:] or (1,))


def _viewed(v):
    """``v`` followed back through row-view reshapes that are each the only reader of their operand."""
    p = _owner(v)
    while p is not None and _row_view(p) and _one_use(p.operands[0]) is not None:
        v = p.operands[0]
        p = _owner(v)
    return v


def _precedes(v, op) -> bool:
    """``v`` is a block argument or defined before ``op`` in their block: the producer's kernel may read it."""
    p = _owner(v)
    return p is None or (p.block == op.operation.block and p.is_before_in_block(op.operation))


@remembered
def epilogue(op):
    """The :class:`Epilogue` of a map the conv2d or matmul kernel producing one of its inputs (directly or
    through row-view reshapes) applies to each output tile before storing it (a conv's ReLU, a Linear's
    activation, a residual add, an MLP's silu(gate) * up), or None.

    That input must be the producer's only reader, with the map's element type and rows; the map must be read
    by device ops only and need at most one fp32 temporary (the producer's accumulator tile, free by then), two
    for a matmul's (the second a buffer of its plan: rotary embedding's ``x * cos + rotate_half(x) * sin``). A
    matmul's epilogue may read more inputs of the map's shape (or broadcast to it along leading dims), defined
    before the matmul, from device memory
    tile by tile. It computes what the map kernel would (the tile's values in their format, fp32 micro-ops, one
    rounding to the format), so results are bit-identical, and the result never round-trips device memory."""
    o = op.operation
    if o.name != "spyre.map" or not o.operands:
        return None
    if any(not u.owner.name.startswith("spyre.") or u.owner.name == "spyre.host" for u in o.results[0].uses):
        return None
    shape, elt = _tensor_type(o.results[0])
    for src, v in enumerate(o.operands):
        prod_v = _viewed(v)
        prod = _owner(prod_v)
        if prod is None or (prod.name, _attr(prod, "spyre.kernel")) not in _EPILOGUE_PRODUCERS:
            continue
        pshape, pelt = _tensor_type(prod_v)
        if (_one_use(v) is None or _one_use(prod_v) is None or pelt != elt or pshape[-1:] != shape[-1:]
                or math.prod(pshape) != math.prod(shape) or list(o.operands).count(v) != 1):
            continue
        extra = [j for j in range(len(o.operands)) if j != src]
        if extra and (prod.name == "spyre.conv2d" or any(
                not _tile_input(o.operands[j], shape) or str(_tensor_type(o.operands[j])[1]) not in SFU_READS
                or not _precedes(o.operands[j], prod) for j in extra)):
            continue
        try:
            ops, result, _ = translate(o.regions[0].blocks[0], ["full"] * len(o.operands))
        except NotOnSfu:
            return None
        slots, nslots = live_temps(ops, result)
        if nslots > (1 if prod.name == "spyre.conv2d" else 2) or not (isinstance(result, tuple) and result[0] == "t"):
            return None
        return Epilogue(ops, result, src, tuple(extra), slots, nslots)
    return None


def _tile_input(v, shape) -> bool:
    """A further input an epilogue loads tile by tile from its rows: of the map's shape, or broadcast to it along
    leading dims only (an attention mask every head adds: its rows are gathered again for each head)."""
    s = _tensor_type(v)[0]
    if not s or len(s) > len(shape) or s[-1] != shape[-1]:
        return False
    return all(a in (1, b) for a, b in zip([1] * (len(shape) - len(s)) + list(s), shape))


def apply_epilogue(b, core, epi, out, temps, loc, extra=()) -> None:
    """The epilogue's micro-ops on the output tile ``out`` (its input ``src`` and, rounded once, its result),
    with the fp32 tiles ``temps`` of the same shape holding its temporaries (``epi.temps`` of them) and ``extra``
    the tiles of its other inputs (in ``epi.extra``'s order), loaded by the producer's kernel."""
    tiles = {epi.src: out, **dict(zip(epi.extra, extra))}

    def reg(v):
        if isinstance(v, tuple):
            return tiles[v[1]] if v[0] == "in" else temps[epi.slots[v]]
        return v

    last = writes_result(epi.ops, epi.result)
    for i, (fn, d, s0, s1, imm, swap) in enumerate(epi.ops):
        b.sfu(core, fn, out if last and i == len(epi.ops) - 1 else reg(d), reg(s0), reg(s1), imm=imm, swap=swap,
              loc=loc)
    if not last:
        b.sfu(core, "cast", out, reg(epi.result), loc=loc)


def epilogue_classes(epi: Epilogue) -> tuple[str, ...]:
    """The SFU classes (cost.finish_cycles) of the epilogue's micro-ops, and of its rounding cast when the last
    of them does not write the output itself."""
    cast = () if writes_result(epi.ops, epi.result) else (SFU_CLASS[SfuFn.CAST],)
    return tuple(SFU_CLASS[sfu_fn(fn)] for fn, *_ in epi.ops) + cast


def epilogue_buffer(i: int) -> str:
    """The producer's scratchpad buffer for its epilogue's ``i``-th further input (passes/op_model.py)."""
    return "ep" + chr(ord("a") + i)


def softmax_source(op):
    """The matmul (kernel ``matmul``) whose kernel applies softmax ``op`` to its output tiles, or None: a softmax
    over the last dim whose input is, as its only reader (through row-view reshapes), the matmul's result or the
    result of the map the matmul applies (an attention mask add), in the same element type, read by device ops.
    The matmul then takes whole rows per tile (no N or K split), and the SFU micro-ops are the softmax kernel's on
    the tile's values, so the result is bit-identical."""
    o = op.operation
    if o.name != "spyre.softmax" or not _runs(op) or any(
            not u.owner.name.startswith("spyre.") or u.owner.name == "spyre.host" for u in o.results[0].uses):
        return None
    v = o.operands[0]
    if _one_use(v) is None:
        return None
    p = _owner(_viewed(v))
    if p is not None and p.name == "spyre.map" and _attr(p, "spyre.kernel") == "epilogue":
        epi = epilogue(p)
        p = _owner(_viewed(p.operands[epi.src])) if epi is not None else None
    if p is None or p.name not in ("spyre.matmul", "spyre.batch_matmul") or _attr(p, "spyre.kernel") != "matmul":
        return None
    (pshape, pelt), (shape, elt) = _tensor_type(p.results[0]), _tensor_type(v)
    if pelt != elt or pshape[-1:] != shape[-1:] or _tensor_type(o.results[0])[1] != elt \
            or _attr(p, "spyre.convert_result") is not None:
        return None
    return p


def cast_source(op):
    """The matmul (kernel ``matmul``) whose kernel widens to ``op``'s type the result of the map it applies, or
    None: ``op`` a plain cast from dlf16 to f32 (exact) of that map's result (an epilogue, directly or through
    row-view reshapes, each the only reader), a residual add returned in f32. The kernel rounds the map's values
    to dlf16 as the map kernel would, then widens them before the store: bit-identical, and the dlf16 result
    never round-trips device memory."""
    o = op.operation
    if o.name != "spyre.cast" or len(o.operands) != 1 or _attr(op, "scale_mode") is not None:
        return None
    (_, src), (_, dst) = _tensor_type(o.operands[0]), _tensor_type(o.results[0])
    if str(src) != "!spyre.dlf16" or str(dst) != "f32" or _one_use(o.operands[0]) is None:
        return None
    m = _owner(_viewed(o.operands[0]))
    if m is None or m.name != "spyre.map" or _attr(m, "spyre.kernel") != "epilogue":
        return None
    epi = epilogue(m)
    p = _owner(_viewed(m.operands[epi.src])) if epi is not None else None
    if p is None or p.name not in ("spyre.matmul", "spyre.batch_matmul") or _attr(p, "spyre.kernel") != "matmul" \
            or _attr(p, "spyre.convert_result") is not None or softmax_of(p) is not None:
        return None
    return p


def widened_by(producer):
    """The cast the kernel of matmul ``producer`` applies after its epilogue map (kernel ``epilogue``,
    :func:`cast_source`), or None."""
    found = epilogue_of(producer)
    if found is None:
        return None
    r = found[0].operation.results[0]
    while True:
        user = _one_use(r)
        if user is None:
            return None
        if user.operation.name == "spyre.cast":
            return user if _attr(user, "spyre.kernel") == "epilogue" and cast_source(user) == producer.operation \
                else None
        if not _row_view(user):
            return None
        r = user.operation.results[0]


def _whole_rows_fit(mm, sm, target) -> bool:
    """A tile of whole result rows fits the scratchpad for matmul ``mm`` applying softmax ``sm`` (on one
    core)."""
    from spyre_mlir import cost
    from spyre_mlir.passes.op_model import op_model

    m = op_model(mm)
    return cost.best_tile(m.M, m.N, m.K, target, m.fmt, m.out_fmt, batch=m.B, bias=m.bias, b_fmt=m.b_fmt,
                          colscale=m.colscale, epi_in=m.epi_in, force=(None, m.N, None), trans_b=m.trans_b,
                          softmax=softmax_kind(sm)) is not None


@remembered
def softmax_of(producer):
    """The softmax the kernel of matmul ``producer`` applies (kernel ``epilogue``, :func:`softmax_source`), after
    its epilogue map if any, or None."""
    found = epilogue_of(producer)
    r = (found[0] if found is not None else producer).operation.results[0]
    while True:
        user = _one_use(r)
        if user is None:
            return None
        if user.operation.name == "spyre.softmax":
            src = softmax_source(user) if _attr(user, "spyre.kernel") == "epilogue" else None
            return user if src is not None and src == producer.operation else None
        if not _row_view(user):
            return None
        r = user.operation.results[0]


def softmax_kind(sm) -> str:
    """Which softmax ``sm`` is, as the cost model names it: "safe" (a row of -inf gives zeros) or "plain"."""
    return "safe" if _attr(sm, "safe", False) else "plain"


def apply_softmax(b, core, sm, src, dst, temp, stats, loc) -> None:
    """Softmax ``sm`` over the rows of tile ``src`` (its values in their format) rounded once into ``dst`` (may
    be ``src``), with the fp32 tile ``temp`` of their shape and the [rows, 1] fp32 ``stats`` (max, sum and, for
    a safe softmax, live): what the softmax kernel and a matmul applying it as its epilogue both run."""
    safe = bool(_attr(sm, "safe", False))
    # DLFloat16 has no infinity: a -inf stored in it saturates to -DLF16_MAX (docs/numerics.md), so a row of
    # masked scores read from DLFloat16 has that maximum.
    lowest = -DLF16_MAX if src.fmt is Format.DLF16 else -math.inf
    M, S = stats["max"], stats["sum"]
    # The SFU reads src in its format and computes in fp32: no fp32 copy of it first.
    b.reduce(core, "max", M, src, loc=loc)
    if safe:
        # A row of -inf only: its max becomes 0 and its 1/sum 0, so it gives 0 * 0 and no NaN; other rows
        # compute exactly what the plain softmax does.
        K = stats["live"]
        b.sfu(core, "gt", K, M, lowest, loc=loc)
        b.sfu(core, "select", M, K, M, imm=0.0, loc=loc)
    b.sfu(core, "sub", temp, src, M, loc=loc)
    b.sfu(core, "exp", temp, temp, loc=loc)
    b.reduce(core, "sum", S, temp, loc=loc)
    b.sfu(core, "recip", S, S, loc=loc)
    if safe:
        b.sfu(core, "select", S, K, S, imm=0.0, loc=loc)
    b.sfu(core, "mul", dst, temp, S, loc=loc)       # rounded once, on the write


def epilogue_reader(v):
    """The only reader of ``v``, through row-view reshapes each the only reader, when its kernel is
    ``epilogue`` (a map, a widening cast or a pool the producer's kernel applies), else None."""
    while True:
        user = _one_use(v)
        if user is None:
            return None
        if _attr(user, "spyre.kernel") == "epilogue":
            return user
        if not _row_view(user):
            return None
        v = user.operation.results[0]


@remembered
def epilogue_of(producer):
    """(the map whose kernel is the producer's ``epilogue``: its only reader, through row-view reshapes, and
    its :class:`Epilogue`), or None."""
    user = epilogue_reader(producer.operation.results[0])
    if user is None:
        return None
    # The map may read several producers' results: this producer's must be the one its tile stands for.
    epi = epilogue(user)                # None: a pool the conv kernel applies (conv.pool_of)
    src = _owner(_viewed(user.operation.operands[epi.src])) if epi is not None else None
    return (user, epi) if src is not None and src == producer.operation else None


def _runs(op) -> bool:
    name = op.operation.name
    res_shape, res_elt = _tensor_type(op.operation.results[0])
    elts = [str(_tensor_type(v)[1]) for v in op.operation.operands]
    if name == "spyre.map" and res_shape is not None:
        if str(res_elt) not in _DEVICE_FLOATS + ("i1",) or any(e not in SFU_READS + ("i1",) for e in elts):
            return False
        try:
            translate(op.operation.regions[0].blocks[0], ["full"] * len(elts))
        except NotOnSfu:
            return False
        return True
    if str(res_elt) not in _DEVICE_FLOATS + ("f8E4M3FN", "f8E5M2", "i8") or res_shape is None:
        return False
    if any(e not in _DEVICE_FLOATS for e in elts):
        return False
    rank = len(res_shape)
    if name == "spyre.reduce":
        ishape, _ = _tensor_type(op.operation.operands[0])
        dims = sorted(d % len(ishape) for d in _attr(op, "dims"))
        return (dims == list(range(dims[0], len(ishape))) and _attr(op, "kind") in ("sum", "max", "min", "mean"))
    if name == "spyre.softmax":
        return _attr(op, "dim") % rank == rank - 1
    if name == "spyre.layernorm":
        return _attr(op, "axis") % rank == rank - 1
    if name == "spyre.rmsnorm":
        return True
    if name == "spyre.cast":
        return len(op.operation.operands) == 1 and _attr(op, "scale_mode") is None
    return False


def emit_map(em, op, loc):
    o = op.operation
    out_shape, _ = _tensor_type(o.results[0])
    out_shape = tuple(out_shape) or (1,)
    O = em.result(op)
    C = O.cols
    R = O.rows
    ins, kinds = [], []
    for v in o.operands:
        t = em.tensor(v)
        ishape = tuple(_tensor_type(v)[0]) or (1,)
        lead_bcast = all(s == 1 for s in ishape[:-1])
        last = ishape[-1]
        if last == C and C != 1:
            kind = "col" if lead_bcast and R > 1 else "full"
        elif C == 1:
            kind = "scalar" if lead_bcast and R > 1 else "full"
        else:
            kind = "scalar" if lead_bcast else "row"
        ins.append((t, ishape, kind))
        kinds.append(kind)
    ops, result, _ = translate(o.regions[0].blocks[0], kinds)
    slots, nslots = live_temps(ops, result)
    kp, plan = planned(em, op, R)
    gr, tr, nbuf = kp.grid[0], kp.tile[0], kp.nbuf
    b = em.b
    kernels = []
    for core in range(gr):
        tiles = {}
        for i, (t, ishape, k) in enumerate(ins):
            role = _role(i)
            if k == "col":
                tiles[i] = kp.tile_at(role, 1, C, t.fmt)
                load_gather(b, core, tiles[i], t, [0], loc=loc)
            elif k == "scalar":
                tiles[i] = kp.tile_at(role, 1, 1, t.fmt)
                load_gather(b, core, tiles[i], t, [0], loc=loc)
            else:
                tiles[i] = [kp.tile_at(f"{role}{j}", tr, C if k == "full" else 1, t.fmt) for j in range(nbuf)]
        temps = [kp.tile_at(_temp(j), tr, C, "fp32") for j in range(nslots)]
        outs = [kp.tile_at(f"out{j}", tr, C, O.fmt) for j in range(nbuf)]

        def load(k, r0, n, core=core, tiles=tiles):
            for i, (t, ishape, kind) in enumerate(ins):
                if kind in ("full", "row"):
                    tl = _sub(tiles[i][k % nbuf], n, tiles[i][0].cols)
                    if tuple(ishape) == out_shape:
                        load_rows(b, core, tl, t, r0, loc=loc)
                    else:
                        load_gather(b, core, tl, t, broadcast_rows(ishape, out_shape, r0, n), loc=loc)

        def work(k, r0, n, core=core, tiles=tiles, temps=temps, outs=outs):
            cur = {("in", i): (tiles[i] if kind in ("col", "scalar") else
                               _sub(tiles[i][k % nbuf], n, tiles[i][0].cols))
                   for i, (_, _, kind) in enumerate(ins)}

            def reg(v):
                if isinstance(v, float) or v is None:
                    return v
                if v[0] == "in":
                    return cur[v]
                return _sub(temps[slots[v]], n, C)

            o_t = _sub(outs[k % nbuf], n, C)
            last = writes_result(ops, result)
            for i, (fn, d, s0, s1, imm, swap) in enumerate(ops):
                b.sfu(core, fn, o_t if last and i == len(ops) - 1 else reg(d), reg(s0), reg(s1), imm=imm,
                      swap=swap, loc=loc)
            res = None if last else reg(result)      # None: the last micro-op wrote o_t
            if isinstance(res, float):
                b.sfu(core, "fill", o_t, imm=res, loc=loc)
            elif res is None:
                pass
            elif res.rows == n and res.cols == C:
                b.sfu(core, "cast", o_t, res, loc=loc)
            else:                       # a broadcast input returned as is
                b.sfu(core, "fill", o_t, imm=0.0, loc=loc)
                b.sfu(core, "add", o_t, o_t, res, loc=loc)
            store_rows(b, core, o_t, O, r0, loc=loc)

        kernels.append((core, load, work))
    run_tiles(b, plan, nbuf, kernels, loc)
    return gr


def _rowwise_io(em, op):
    o = op.operation
    X = em.tensor(o.operands[0])
    O = em.result(op)
    return X, O, X.rows, X.cols


def emit_softmax(em, op, loc):
    X, O, R, C = _rowwise_io(em, op)
    safe = bool(_attr(op, "safe", False))

    def body(core, n, XT, XF, OT, extra, loc):
        apply_softmax(em.b, core, op, XT, OT, XF, extra, loc)

    return _rows_emit(em, op, loc, X, O, body, [], ("max", "sum", "live") if safe else ("max", "sum"))


def emit_layernorm(em, op, loc):
    X, O, R, C = _rowwise_io(em, op)
    body, consts, stats = norm_body(em, op)
    return _rows_emit(em, op, loc, X, O, body, consts, stats, sq=True)


def emit_rmsnorm(em, op, loc):
    X, O, R, C = _rowwise_io(em, op)
    body, consts, stats = norm_body(em, op)
    return _rows_emit(em, op, loc, X, O, body, consts, stats, sq=True, xf=False)


def norm_body(em, op):
    """(``body(core, n, XT, XF, OT, extra, loc)``, its weight and bias as [(name, device tensor)], the names of its
    [n, 1] fp32 row statistics) of a layernorm or rmsnorm over the last dim: the micro-ops on ``n`` rows of input
    ``XT`` through the fp32 work tile ``XF`` into ``OT``, ``extra`` holding the statistics, ``sq`` (an fp32 tile
    like ``XF``) and the weight and bias rows. An rmsnorm (one statistic) works in ``sq`` and takes no ``XF``.
    Its rows kernel and a matmul kernel applying it to its A tiles (matmul.prologue_of) run the same micro-ops,
    so their results are bit-identical."""
    eps = float(_attr(op, "epsilon"))
    b = em.b
    rest = list(op.operation.operands[1:])
    if op.operation.name == "spyre.layernorm":
        seg = _attr(op, "operandSegmentSizes") or [1, 0, 0]
        gamma = em.tensor(rest.pop(0)) if seg[1] else None
        beta = em.tensor(rest.pop(0)) if len(seg) > 2 and seg[2] else None

        def body(core, n, XT, XF, OT, extra, loc):
            MU, VAR, SQ = extra["mean"], extra["var"], extra["sq"]
            b.reduce(core, "mean", MU, XT, loc=loc)
            b.sfu(core, "sub", XF, XT, MU, loc=loc)
            b.sfu(core, "mul", SQ, XF, XF, loc=loc)
            b.reduce(core, "mean", VAR, SQ, loc=loc)
            _normalize(b, core, XF, XF, OT, VAR, eps, extra, loc)

        consts = [("weight", gamma), ("bias", beta)]
        return body, [(k, t) for k, t in consts if t is not None], ("mean", "var")
    gamma = em.tensor(rest[0]) if rest else None

    def body(core, n, XT, XF, OT, extra, loc):
        # The squares are dead once their mean is taken: their tile is the work tile (XF is None).
        MS, SQ = extra["ms"], extra["sq"]
        b.sfu(core, "mul", SQ, XT, XT, loc=loc)
        b.reduce(core, "mean", MS, SQ, loc=loc)
        _normalize(b, core, XT, SQ, OT, MS, eps, extra, loc)

    return body, [("weight", gamma)] if gamma is not None else [], ("ms",)


def _normalize(b, core, X, XF, OT, R, eps, extra, loc):
    """The norms' tail: X * rsqrt(R + eps) (R a row statistic, overwritten), then times the weight and plus the
    bias rows when the op has them, through the fp32 tile XF; the last of these writes OT, rounded once. The SFU
    reads the input tiles in their formats and computes in fp32, so no fp32 copy of them comes first."""
    b.sfu(core, "add", R, R, eps, loc=loc)
    b.sfu(core, "rsqrt", R, R, loc=loc)
    steps = [("mul", R)] + [(fn, extra[k]) for fn, k in (("mul", "weight"), ("add", "bias")) if k in extra]
    for i, (fn, y) in enumerate(steps):
        b.sfu(core, fn, OT if i == len(steps) - 1 else XF, X, y, loc=loc)
        X = XF


def _rows_emit(em, op, loc, X, O, body, consts, stats, sq=False, xf=True):
    """Shared loop of softmax and the norms: load, fp32 work tiles ``xf`` and ``sq`` (where asked), row statistics
    (``stats``: [tr, 1] fp32 buffers by name), write back; ``consts`` (name, tensor) load once as [1, C] rows."""
    b = em.b
    C = X.cols
    kp, plan = planned(em, op, X.rows)
    gr, tr, nbuf = kp.grid[0], kp.tile[0], kp.nbuf
    kernels = []
    for core in range(gr):
        extra_full = {}
        for k, t in consts:
            extra_full[k] = kp.tile_at(k, 1, C, t.fmt)
            load_rows(b, core, extra_full[k], t.reshaped((1, C)), 0, loc=loc)
        XTs = [kp.tile_at(f"in{j}", tr, C, X.fmt) for j in range(nbuf)]
        OTs = [kp.tile_at(f"out{j}", tr, C, O.fmt) for j in range(nbuf)]
        XF = kp.tile_at("xf", tr, C, "fp32") if xf else None
        SQ = kp.tile_at("sq", tr, C, "fp32") if sq else None
        ST = {name: kp.tile_at(name, tr, 1, "fp32") for name in stats}

        def load(k, r0, n, core=core, XTs=XTs):
            load_rows(b, core, _sub(XTs[k % nbuf], n, C), X, r0, loc=loc)

        def work(k, r0, n, core=core, XTs=XTs, OTs=OTs, XF=XF, SQ=SQ, ST=ST, extra_full=extra_full):
            extra = dict(extra_full, **{name: _sub(t, n, 1) for name, t in ST.items()})
            if SQ is not None:
                extra["sq"] = _sub(SQ, n, C)
            ot = _sub(OTs[k % nbuf], n, C)
            body(core, n, _sub(XTs[k % nbuf], n, C), XF and _sub(XF, n, C), ot, extra, loc)
            store_rows(b, core, ot, O, r0, loc=loc)

        kernels.append((core, load, work))
    run_tiles(b, plan, nbuf, kernels, loc)
    return gr


def emit_reduce(em, op, loc):
    """Reductions over a suffix of the dims. The innermost dim reduces on the SFU (REDUCE); reduced outer
    dims first combine their rows elementwise into an fp32 tile (rows gathered by DMA), so every result
    row is one [rows, C] reduction and one rounding."""
    o = op.operation
    X = em.tensor(o.operands[0])
    ishape, _ = _tensor_type(o.operands[0])
    dims = sorted(d % len(ishape) for d in _attr(op, "dims"))
    mid = math.prod(ishape[dims[0]:-1]) if len(ishape) > 1 else 1
    R, C = X.rows // mid, X.cols
    oshape, elt = _tensor_type(o.results[0])
    kind = _attr(op, "kind")
    # The result has one value per row: a [R, 1] tensor in the 2-D view (a reshape of it, if keepdim is
    # false and the result's innermost dim is not 1, goes through an [R, 1] scratch tensor and a copy).
    direct = (oshape[-1:] or (1,)) == (1,) or not oshape
    kp, plan = planned(em, op, R)
    gr, tr, nbuf = kp.grid[0], kp.tile[0], kp.nbuf
    if direct:
        O = em.result(op)
        target = O
    else:
        em._next_storage += 1
        buf = em.b.scratch(em._name(f"t{em._op_index}.rows"), (R, 1), format_of(elt))
        target = em._buffer_tensor(buf)
    b = em.b
    kernels = []
    for core in range(gr):
        XTs = [kp.tile_at(f"in{j}", tr, C, X.fmt) for j in range(nbuf)]
        RT = kp.tile_at("rt", tr, 1, "fp32")
        OTs = [kp.tile_at(f"out{j}", tr, 1, format_of(elt)) for j in range(nbuf)]
        ACC = kp.tile_at("acc", tr, C, "fp32") if mid > 1 else None
        combine = {"sum": "add", "mean": "add", "max": "max", "min": "min"}[kind]

        def load(k, r0, n, core=core, XTs=XTs):
            if mid == 1:
                load_rows(b, core, _sub(XTs[k % nbuf], n, C), X, r0, loc=loc)

        def work(k, r0, n, core=core, XTs=XTs, OTs=OTs, RT=RT, ACC=ACC):
            ot, xt = _sub(OTs[k % nbuf], n, 1), _sub(XTs[k % nbuf], n, C)
            if mid > 1:        # combine the reduced outer dims' rows, then reduce the innermost
                acc = _sub(ACC, n, C)
                for m in range(mid):
                    load_gather(b, core, xt, X, np.arange(r0, r0 + n) * mid + m, loc=loc)
                    b.sfu(core, "cast", acc, xt, loc=loc) if m == 0 else \
                        b.sfu(core, combine, acc, acc, xt, loc=loc)
                b.reduce(core, "sum" if kind == "mean" else kind, _sub(RT, n, 1), acc, loc=loc)
                if kind == "mean":
                    b.sfu(core, "mul", _sub(RT, n, 1), _sub(RT, n, 1), 1.0 / (mid * C), loc=loc)
            else:
                b.reduce(core, kind, _sub(RT, n, 1), xt, loc=loc)
            b.sfu(core, "cast", ot, _sub(RT, n, 1), loc=loc)
            store_rows(b, core, ot, target, r0, loc=loc)

        kernels.append((core, load, work))
    run_tiles(b, plan, nbuf, kernels, loc, phases=mid == 1)     # else its work loads rows itself
    if not direct:
        em.barrier(loc)
        O = em.result(op, host=True)
        em.b.host(0, "copy", [target.buffer], [O.buffer], loc=loc, shape=list(oshape),
                  perm=list(range(len(oshape))))
        em.host_ops.append("reduce result relayout (copy)")
        em.host_locations.append(str(op.operation.location))
        em.barrier(loc)
    return gr


def emit_cast(em, op, loc):
    X, O, R, C = _rowwise_io(em, op)
    kp, plan = planned(em, op, R)
    gr, tr, nbuf = kp.grid[0], kp.tile[0], kp.nbuf
    b = em.b
    kernels = []
    for core in range(gr):
        XTs = [kp.tile_at(f"in{j}", tr, C, X.fmt) for j in range(nbuf)]
        OTs = [kp.tile_at(f"out{j}", tr, C, O.fmt) for j in range(nbuf)]

        def load(k, r0, n, core=core, XTs=XTs):
            load_rows(b, core, _sub(XTs[k % nbuf], n, C), X, r0, loc=loc)

        def work(k, r0, n, core=core, XTs=XTs, OTs=OTs):
            b.sfu(core, "cast", _sub(OTs[k % nbuf], n, C), _sub(XTs[k % nbuf], n, C), loc=loc)
            store_rows(b, core, _sub(OTs[k % nbuf], n, C), O, r0, loc=loc)

        kernels.append((core, load, work))
    run_tiles(b, plan, nbuf, kernels, loc)
    return gr


EMITTERS = {"spyre.map": emit_map, "spyre.reduce": emit_reduce, "spyre.softmax": emit_softmax,
            "spyre.layernorm": emit_layernorm, "spyre.rmsnorm": emit_rmsnorm, "spyre.cast": emit_cast}
KERNELS = {name: ("rows",) for name in EMITTERS}
KERNELS["spyre.rmsnorm"] = KERNELS["spyre.layernorm"] = ("rows", "prologue")
KERNELS["spyre.map"] = ("rows", "epilogue", "alias")
KERNELS["spyre.softmax"] = ("rows", "epilogue")
KERNELS["spyre.cast"] = ("rows", "epilogue")
