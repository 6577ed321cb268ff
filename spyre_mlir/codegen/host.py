"""What the emitter does not run as a device kernel: ops run on the host.

* :func:`emit_host`: a ``spyre.host`` region becomes a ``jit`` host op (a function of the host module,
  :mod:`.hostcode`) when it lowers; a device op without a kernel runs through the runtime's own
  ``gather``/``copy`` when they compute it; anything else is an ``eval`` host program (:mod:`.hostprog`).
  Host ops are fenced by barriers and read buffers of their operands' own shapes
  (:func:`materialize_for_host`).
"""

from __future__ import annotations

from torch_mlir.ir import WalkResult

from spyre_mlir.passes.analysis import ON_HOST, ROUND_TRIP, producer
from spyre_mlir.passes.analysis import reads as values_read

from . import hostprog
from .common import EmitError, _attr, _same_dims, _sub, _tensor_type
from .memory import load_rows, store_rows

__all__ = ["emit_host", "materialize_for_host"]


def emit_host(em, op, loc, group=()):
    """Run op (a spyre.host region or a device op without a kernel) on the host: through the runtime's
    own gather/copy when they compute it, else through spyre_mlir.eval. ``group``: the rest of op's round trip
    (spyre-round-trips: more spyre.host regions, or more device ops without a kernel), computed in the same host
    call."""
    name = op.operation.name
    members = (op, *group)
    ops, outs, aliases = [], [], {}
    for member in members:
        if name == "spyre.host":
            body = list(member.operation.regions[0].blocks[0].operations)
            ops += body[:-1]
            outs.append(body[-1].operation.operands[0])
            # A later member reads an earlier one's result: inside the call, the value that member yields.
            aliases[member.operation.results[0]] = outs[-1]
        else:
            ops.append(member)
            outs += list(member.operation.results)
    inner = set(aliases) | {r for m in members for r in m.operation.results}
    reads = list(dict.fromkeys(v for m in members for v in values_read(m) if v not in inner))
    for v in reads if group else ():
        if v not in em.dev and v not in em.known and not _literal(v):
            raise EmitError(f"host work of round trip {_attr(op, ROUND_TRIP)} reads a value computed after the "
                            f"round trip's first op (spyre-round-trips places them together)", op.operation.location)
    if name == "spyre.host":
        reason = _attr(op, "reason", "")
    else:
        reason = _attr(op, "spyre.on_host") or ("computed from parameters given at run time"
                                                if _attr(op, "spyre.const_fold") else "")
    if any(_draws_random(o) for o in ops):
        raise EmitError(f"{name} draws random numbers (torch.rand*, or dropout/rrelu in training mode): the "
                        f"generator's state is global and its numbers could not be PyTorch's; call model.eval() "
                        f"or pass the random tensor as an input", op.operation.location)
    jit = prog = None
    if name == "spyre.host":
        try:
            jit = em.hostmod.add(ops, reads, outs, op.operation.location, aliases)
            reads = jit[1]
        except hostprog.Unsupported as e:
            jit, why_not_jit = None, str(e)
    if jit is None:
        try:
            prog = hostprog.translate_ops(ops, reads, outs, aliases)
        except hostprog.Unsupported as e:
            why = f"{why_not_jit}; {e}" if name == "spyre.host" else str(e)
            raise EmitError(f"cannot run {name} on the host: {why}", op.operation.location) from None
    if em.cores > 1:
        em.barrier(loc)
    ins = []
    for v in reads:
        t = em.tensor(v)
        buf = t.buffer
        if not _same_dims(buf.shape, t.shape) or buf.fmt is not t.fmt or buf.addr != t.addr:
            # An alias (reshape view) or a slot: give the host its own copy of the right shape.
            t = materialize_for_host(em, v, t, loc)
            buf = t.buffer
        ins.append(buf)
    res = [em.result(member, i, host=True) for member in members for i in range(len(member.operation.results))]
    native = _native_host_op(op) if name != "spyre.host" and not group else None
    if jit is not None:
        em.b.host(0, "jit", ins, [t.buffer for t in res], loc=loc, fn=jit[0], in_dtypes=jit[2],
                  out_dtypes=jit[3])
    elif native is not None:
        em.b.host(0, native[0], ins, [t.buffer for t in res], loc=loc, **native[1])
    else:
        em.b.host(0, "eval", ins, [t.buffer for t in res], loc=loc, program=prog)
    for member in members:
        why = reason if not group else _attr(member, "reason" if name == "spyre.host" else ON_HOST, "")
        em.host_ops.append(f"{name}" + (f" ({why})" if why else ""))
        em.host_locations.append(str(member.operation.location))
    if em.cores > 1:
        em.barrier(loc)


def _draws_random(op) -> bool:
    """``op`` reads the random generator's seed (Torch-MLIR's ml_program global), itself or in its regions."""
    found = []

    def visit(o):
        if o.name == "ml_program.global_load":
            found.append(o)
        return WalkResult.INTERRUPT if found else WalkResult.ADVANCE

    op.operation.walk(visit)
    return bool(found)


def _literal(v) -> bool:
    """A literal numpy cannot hold (the host code clones it): no home, yet no value computed later either."""
    src = producer(v)
    return src is not None and src.name in ("arith.constant", "tensor.empty")


def _native_host_op(op):
    """(op, attrs) of the runtime's own host ops that compute ``op`` (a gather of rows, a transpose or
    reshape as a copy); else None (the op runs as an eval host program)."""
    name = op.operation.name
    shape, elt = _tensor_type(op.operation.results[0]) if op.operation.results else (None, None)
    if shape is None:
        return None
    ishape, ielt = _tensor_type(op.operation.operands[0])
    if name == "spyre.gather" and str(_tensor_type(op.operation.operands[1])[1]) in ("i64", "i32"):
        return "gather", {}
    if str(ielt) != str(elt):
        return None
    if name == "spyre.transpose":
        return "copy", {"perm": list(_attr(op, "permutation"))}
    if name == "spyre.reshape":
        return "copy", {"shape": list(shape) or [1], "perm": list(range(len(shape) or 1))}
    return None


def materialize_for_host(em, v, t, loc):
    """A buffer of v's own shape holding t (device DMA copy on core 0, row tiles of the 2-D view)."""
    shape, _ = _tensor_type(v)
    if em.cores > 1:
        em.barrier(loc)
    dst = em._buffer_tensor(em.b.scratch(em._name(f"h{em._op_index}"), shape or (1,), t.fmt))
    tile_rows = max(1, min(t.rows, em.target.scratchpad_usable_bytes // t.pitch))
    em.b.reset_scratchpad(0)
    tile = em.b.alloc(0, tile_rows, t.cols, t.fmt)
    for r0 in range(0, t.rows, tile_rows):
        n = min(tile_rows, t.rows - r0)
        load_rows(em.b, 0, _sub(tile, n, t.cols), t, r0, loc=loc)
        store_rows(em.b, 0, _sub(tile, n, t.cols), dst, r0, loc=loc)
    if em.cores > 1:
        em.barrier(loc)
    return dst
