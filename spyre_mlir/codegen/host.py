"""What the emitter does not run as a device kernel: ops folded at compile time, and ops run on the host.

* :func:`fold`: an op whose operands are all known computes its result at compile time with the numpy folder
  (:mod:`.hostprog`); a parameter quantized by ``spyre.cast {scale_mode}`` keeps its codes and scales, and so
  do its reshapes and transposes.
* :func:`emit_host`: a ``spyre.host`` region becomes a ``jit`` host op (a function of the host module,
  :mod:`.hostcode`) when it lowers; a device op without a kernel runs through the runtime's own
  ``gather``/``copy`` when they compute it; anything else is an ``eval`` host program (:mod:`.hostprog`).
  Host ops are fenced by barriers and read buffers of their operands' own shapes
  (:func:`materialize_for_host`).
"""

from __future__ import annotations

import numpy as np

from spyre_mlir.runtime.formats import Format, quantize_int, symmetric_scale

from spyre_mlir.passes.analysis import reads as values_read

from . import hostprog
from .common import EmitError, _attr, _dequantize, _expand, _same_dims, _sub, _tensor_type
from .memory import format_of, load_rows, store_rows

__all__ = ["fold", "emit_host", "materialize_for_host"]


def fold(em, op):
    """Compute op's results at compile time (every value it reads is known) into ``em.known``; raises
    ``hostprog.Unsupported`` when the numpy folder cannot compute it."""
    name = op.operation.name
    if name == "spyre.cast" and _attr(op, "scale_mode") is not None and len(op.operation.operands) == 1:
        _fold_quantize(em, op)
        return
    reads = values_read(op)
    if name == "spyre.host":
        body = list(op.operation.regions[0].blocks[0].operations)
        prog = hostprog.translate_ops(body[:-1], reads, list(body[-1].operation.operands))
    else:
        prog = hostprog.translate_ops([op], reads, list(op.operation.results))
    vals = []
    for v in reads:
        if v in em.qscale:      # a quantized parameter read by a fold sees its real values
            s, axis = em.qscale[v]
            vals.append(_dequantize(em.known[v], s, axis))
        else:
            vals.append(em.known[v])
    res = hostprog.evaluate(prog, *vals)
    for r, val in zip(op.operation.results, res):
        em.known[r] = val
        src = reads[0] if reads else None
        if src is not None and src in em._const_names:
            em._const_names[r] = em._const_names[src]
        # A reshape/transpose of a quantized parameter keeps its scales (axis moves with it).
        if src is not None and src in em.qscale and name in ("spyre.reshape", "spyre.transpose"):
            s, axis = em.qscale[src]
            if axis is not None and name == "spyre.transpose":
                axis = list(_attr(op, "permutation")).index(axis)
            em.qscale[r] = (s, axis)
            em.qfmt[r] = em.qfmt[src]
            em.known[r] = _quant_codes_passthrough(op, em.known[src], name)


def _fold_quantize(em, op):
    """spyre.cast {scale_mode} of a parameter: codes plus symmetric scales computed from its values."""
    v = op.operation.operands[0]
    r = op.operation.results[0]
    if v in em.qscale:
        # The dequantizing cast back to the compute format: keep the codes, the kernel applies the scales.
        em.known[r], em.qscale[r], em.qfmt[r] = em.known[v], em.qscale[v], em.qfmt[v]
        em._const_names[r] = em._const_names.get(v, "const")
        return
    x = np.asarray(em.known[v], np.float32)
    _, elt = _tensor_type(r)
    mode = _attr(op, "scale_mode")
    axis = _attr(op, "axis") if mode == "per-channel" else None
    if axis is not None:
        axis %= x.ndim
    fmt = format_of(elt)
    if fmt is Format.INT8:
        s = symmetric_scale(x, 8, axis=axis)
        q = quantize_int(x, 8, s, axis=axis)
    elif fmt in (Format.FP8_E4M3, Format.FP8_E5M2):
        fmax = 448.0 if fmt is Format.FP8_E4M3 else 57344.0
        amax = np.max(np.abs(x), axis=tuple(d for d in range(x.ndim) if d != axis)) if axis is not None \
            else np.max(np.abs(x))
        s = np.where(amax > 0, amax / fmax, 1.0).astype(np.float32)
        q = x / (s if axis is None else _expand(s, x.ndim, axis))
    else:
        raise EmitError(f"scale_mode cast to {elt} is not supported", op.operation.location)
    em.known[r] = np.asarray(q)
    em.qscale[r] = (np.asarray(s, np.float32), axis)
    em.qfmt[r] = fmt
    em._const_names[r] = em._const_names.get(v, "const")


def _quant_codes_passthrough(op, codes, name):
    """The codes of a quantized parameter after a reshape/transpose (scales are handled by the caller)."""
    shape, _ = _tensor_type(op.operation.results[0])
    if name == "spyre.transpose":
        return np.transpose(np.asarray(codes), _attr(op, "permutation"))
    return np.reshape(np.asarray(codes), shape)


def emit_host(em, op, loc):
    """Run op (a spyre.host region or a device op without a kernel) on the host: through the runtime's
    own gather/copy when they compute it, else through spyre_mlir.eval."""
    name = op.operation.name
    reads = values_read(op)
    if name == "spyre.host":
        body = list(op.operation.regions[0].blocks[0].operations)
        ops, outs = body[:-1], list(body[-1].operation.operands)
        reason = _attr(op, "reason", "")
    else:
        ops, outs = [op], list(op.operation.results)
        reason = _attr(op, "spyre.on_host") or ("computed from parameters given at run time"
                                                if _attr(op, "spyre.const_fold") else "")
    jit = prog = None
    if name == "spyre.host":
        try:
            jit = em.hostmod.add(ops, reads, outs, op.operation.location)
            reads = jit[1]
        except hostprog.Unsupported as e:
            jit, why_not_jit = None, str(e)
    if jit is None:
        try:
            prog = hostprog.translate_ops(ops, reads, outs)
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
    res = [em.result(op, i, host=True) for i in range(len(op.operation.results))]
    native = _native_host_op(op) if name != "spyre.host" else None
    if jit is not None:
        em.b.host(0, "jit", ins, [t.buffer for t in res], loc=loc, fn=jit[0], in_dtypes=jit[2],
                  out_dtypes=jit[3])
    elif native is not None:
        em.b.host(0, native[0], ins, [t.buffer for t in res], loc=loc, **native[1])
    else:
        em.b.host(0, "eval", ins, [t.buffer for t in res], loc=loc, program=prog)
    em.host_ops.append(f"{name}" + (f" ({reason})" if reason else ""))
    em.host_locations.append(str(op.operation.location))
    if em.cores > 1:
        em.barrier(loc)


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
