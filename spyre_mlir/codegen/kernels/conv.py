"""Convolution and pooling on the device (NCHW, dlf16/fp8 data): conv2d with known weights (groups 1 or
depthwise) and max/avg pool2d without padding. Input rows are gathered by DMA per kernel row, each kernel
column picks its columns through an exact 0/1 selection matmul on the PT array, and the taps combine in fp32
(PT array accumulation for conv2d, SFU for depthwise convs and pooling) with one rounding on write.
"""

from __future__ import annotations

import numpy as np

from spyre_mlir.runtime.assembler import Tile
from spyre_mlir.runtime.formats import Format

from ..common import _attr, _dequantize, _sub, _tb, _tensor_type
from ..memory import format_of, load_gather, load_rows, store_rows, store_scatter
from .rows import choose_rows_grid, planned

__all__ = ["select", "EMITTERS"]


def select(op, target, known) -> str | None:
    """``"conv2d"`` / ``"pool2d"`` when the device runs ``op``: a conv2d :func:`_conv_plan` accepts (its
    weights and bias among the compile-time values ``known``); pooling without padding of a 4-D dlf16/fp8
    input to dlf16 or fp32. Else None."""
    if op.operation.name == "spyre.conv2d":
        return "conv2d" if _conv_plan(op, target, known) is not None else None
    _, res_elt = _tensor_type(op.operation.results[0])
    ishape, ielt = _tensor_type(op.operation.operands[0])
    return "pool2d" if (len(ishape) == 4 and not any(_attr(op, "padding") or [0]) and
            format_of(ielt) in (Format.DLF16, Format.FP8_E4M3, Format.FP8_E5M2) and
            format_of(res_elt) in (Format.DLF16, Format.FP32)) else None


def _conv_plan(op, target, known):
    """The geometry of a conv2d the device runs (groups 1, dlf16/fp8 data, known weights and bias, and
    working tiles that fit), else None (it runs on the host)."""
    o = op.operation
    x, w = o.operands[0], o.operands[1]
    bias = o.operands[2] if len(o.operands) > 2 else None
    (n_, c_, h, wd), xelt = _tensor_type(x)
    (f_, cg, kh, kw), _ = _tensor_type(w)
    (_, _, oh, ow), oelt = _tensor_type(o.results[0])
    fmt = format_of(xelt)
    groups = _attr(op, "groups", 1)
    depthwise = groups == c_ == f_ and cg == 1
    if ((groups != 1 and not depthwise) or fmt not in (Format.DLF16, Format.FP8_E4M3, Format.FP8_E5M2)
            or format_of(oelt) not in (Format.DLF16, Format.FP32) or w not in known
            or (bias is not None and bias not in known)):
        return None
    t = _tb
    if depthwise:
        rows = n_ * c_ * oh
        need = (t(rows, wd, fmt) + 2 * t(rows, ow, "fp32") + kw * t(wd, ow, fmt) + t(rows, 1, fmt)
                + t(rows, 1, "fp32") + t(rows, ow, format_of(oelt)))
        if need > target.scratchpad_usable_bytes:
            return None
        return dict(n=n_, c=c_, h=h, w=wd, f=f_, kh=kh, kw=kw, oh=oh, ow=ow, fmt=fmt, depthwise=True)
    need = (t(oh * c_, wd, fmt) + t(oh * c_, ow, "fp32") + t(oh * c_, ow, fmt) + kw * t(wd, ow, fmt)
            + kh * kw * t(f_, c_, fmt) + oh * t(f_, ow, "fp32") + t(f_, ow, format_of(oelt))
            + t(f_, 1, "fp32"))
    if need > target.scratchpad_usable_bytes:
        return None
    return dict(n=n_, c=c_, h=h, w=wd, f=f_, kh=kh, kw=kw, oh=oh, ow=ow, fmt=fmt, depthwise=False)


def emit_conv2d(em, op, loc):
    """conv2d (groups 1) on the PT array, on core 0: per kernel tap (i, j) and output row oh,

    1. Z[(oh, c), :] = x[n, c, oh*sh + i*dh - pt, :] gathered by DMA (rows in the padding are zeros),
    2. Y = Z @ S_j picks columns ow*sw + j*dw - pl (an exact 0/1 matmul; the W padding drops out),
    3. acc_oh [F, OW] += W_ij [F, C] @ Y[(oh, .)] contracts the channels, accumulating in fp32,

    then bias per row (SFU), one rounding, and acc_oh is stored to the rows (n, f, oh)."""
    g = _conv_plan(op, em.target, em.known)
    if g is None:
        raise ValueError("conv2d needs its weights (and bias) at compile time and working tiles that fit")
    o = op.operation
    X = em.tensor(o.operands[0])
    O = em.result(op)
    wv = np.asarray(em.known[o.operands[1]], np.float32)
    if o.operands[1] in em.qscale:
        wv = _dequantize(wv, *em.qscale[o.operands[1]])
    bv = np.asarray(em.known[o.operands[2]], np.float32) if len(o.operands) > 2 else None
    n_, c_, h, wd, f_, kh, kw, oh, ow, fmt = (g[k] for k in ("n", "c", "h", "w", "f", "kh", "kw", "oh",
                                                             "ow", "fmt"))
    sh, sw = _attr(op, "strides") or [1, 1]
    dh, dw = _attr(op, "dilations") or [1, 1]
    pt, pl, _, _ = _attr(op, "padding") or [0, 0, 0, 0]
    b = em.b

    def const(name, arr, f=fmt):
        return em._buffer_tensor(b.constant(em._name(f"conv{em._op_index}.{name}"), arr, f))

    sel = []
    for j in range(kw):
        S = np.zeros((wd, ow), np.float32)
        src = np.arange(ow) * sw + j * dw - pl
        ok = (src >= 0) & (src < wd)
        S[src[ok], np.arange(ow)[ok]] = 1
        sel.append(const(f"S{j}", S))
    if g["depthwise"]:
        return _depthwise(em, X, O, wv, bv, sel, g, (sh, dh, pt), loc)
    wts = [const(f"W{i}{j}", wv[:, :, i, j].copy()) for i in range(kh) for j in range(kw)]
    bias_c = const("bias", bv.reshape(f_, 1), "fp32") if bv is not None else None
    if em.cores > 1:
        em.barrier(loc)
    # Output rows oh split evenly over the cores; each core builds only its rows' windows. Every core
    # loads all the weights, so a core gets at least 4 output rows (else the duplicated weight traffic
    # on the shared DRAM costs more than the split saves).
    gr = choose_rows_grid(oh, max(1, min(em.cores, oh // 4)))
    ob = oh // gr
    for core in range(gr):
        _conv_core(em, core, X, O, sel, wts, bias_c, g, (sh, dh, pt), range(core * ob, (core + 1) * ob), loc)
    em._force_barrier = True
    return gr


def _conv_core(em, core, X, O, sel, wts, bias_c, g, hgeom, ohs, loc):
    """One core's share of a groups-1 conv2d: output rows ``ohs`` of every image and filter."""
    b, fmt = em.b, g["fmt"]
    n_, c_, h, wd, f_, kh, kw, oh, ow = (g[k] for k in ("n", "c", "h", "w", "f", "kh", "kw", "oh", "ow"))
    sh, dh, pt = hgeom
    nb = len(ohs)
    b.reset_scratchpad(core)
    S_t = [b.alloc(core, wd, ow, fmt) for _ in range(kw)]
    W_t = [b.alloc(core, f_, c_, fmt) for _ in range(kh * kw)]
    for tiles, srcs in ((S_t, sel), (W_t, wts)):
        for t, src in zip(tiles, srcs):
            load_rows(b, core, t, src, 0, loc=loc)
    BI = None
    if bias_c is not None:
        BI = b.alloc(core, f_, 1, "fp32")
        load_rows(b, core, BI, bias_c, 0, loc=loc)
    Z = b.alloc(core, nb * c_, wd, fmt)
    YC = b.alloc(core, nb * c_, ow, "fp32")
    Y = b.alloc(core, nb * c_, ow, fmt)
    ACC = [b.alloc(core, f_, ow, "fp32") for _ in range(nb)]
    R = b.alloc(core, f_, ow, O.fmt)
    rows_oh = np.repeat(np.asarray(ohs), c_)          # Z row (oh, c)
    rows_c = np.tile(np.arange(c_), nb)
    for n in range(n_):
        tap = 0
        for i in range(kh):
            ih = rows_oh * sh + i * dh - pt
            valid = (ih >= 0) & (ih < h)
            if not valid.all():
                b.sfu(core, "fill", Z, imm=0.0, loc=loc)
            src = (n * c_ + rows_c) * h + ih
            r = 0
            while r < len(src):              # runs of rows inside the image
                if not valid[r]:
                    r += 1
                    continue
                e = r
                while e < len(src) and valid[e]:
                    e += 1
                load_gather(b, core, Tile(Z.addr + r * Z.pitch, e - r, wd, fmt), X, src[r:e], loc=loc)
                r = e
            for j in range(kw):
                b.matmul(core, Z, S_t[j], YC, out=Y, loc=loc)
                for k in range(nb):
                    b.matmul(core, W_t[tap], Y.row_slice(k * c_, (k + 1) * c_), ACC[k],
                             accumulate=tap > 0, loc=loc)
                tap += 1
        for k, r0 in enumerate(ohs):
            if BI is not None:
                b.sfu(core, "add", ACC[k], ACC[k], BI, loc=loc)
            b.sfu(core, "cast", R, ACC[k], loc=loc)
            store_scatter(b, core, R, O, (n * f_ + np.arange(f_)) * oh + r0, loc=loc)


def _depthwise(em, X, O, wv, bv, sel, g, hgeom, loc):
    """Depthwise conv2d (one filter per channel): rows (n, c, oh) gathered per kernel row, columns picked
    per kernel column by a 0/1 matmul, then scaled by the per-row (per channel) weight and summed on
    the SFU in fp32 (one rounding)."""
    b, fmt = em.b, g["fmt"]
    n_, c_, h, wd, kh, kw, oh, ow = (g[k] for k in ("n", "c", "h", "w", "kh", "kw", "oh", "ow"))
    sh, dh, pt = hgeom
    rows = n_ * c_ * oh
    r_nc, r_oh = np.arange(rows) // oh, np.arange(rows) % oh
    chan = r_nc % c_
    # weights as [taps, C, 1] rows (one value per channel), gathered per output row with repeats
    wc = em._buffer_tensor(b.constant(em._name(f"conv{em._op_index}.w"),
                                      wv.reshape(c_, kh * kw).T.reshape(kh * kw, c_, 1).copy(), fmt))
    bc = em._buffer_tensor(b.constant(em._name(f"conv{em._op_index}.b"), bv.reshape(c_, 1), "fp32")) \
        if bv is not None else None
    if em.cores > 1:
        em.barrier(loc)
    gr = choose_rows_grid(rows, max(1, min(em.cores, rows // 32)))   # >= 32 rows per core
    rb = rows // gr
    for core in range(gr):
        blk = slice(core * rb, (core + 1) * rb)
        b.reset_scratchpad(core)
        S_t = [b.alloc(core, wd, ow, fmt) for _ in range(kw)]
        for t, src in zip(S_t, sel):
            load_rows(b, core, t, src, 0, loc=loc)
        Z = b.alloc(core, rb, wd, fmt)
        YC, ACC = b.alloc(core, rb, ow, "fp32"), b.alloc(core, rb, ow, "fp32")
        WT, BT = b.alloc(core, rb, 1, fmt), b.alloc(core, rb, 1, "fp32")
        OUT = b.alloc(core, rb, ow, O.fmt)
        tap = 0
        for i in range(kh):
            ih = r_oh[blk] * sh + i * dh - pt
            valid = (ih >= 0) & (ih < h)
            if not valid.all():
                b.sfu(core, "fill", Z, imm=0.0, loc=loc)
            src = r_nc[blk] * h + ih
            r = 0
            while r < rb:
                if not valid[r]:
                    r += 1
                    continue
                e = r
                while e < rb and valid[e]:
                    e += 1
                load_gather(b, core, Tile(Z.addr + r * Z.pitch, e - r, wd, fmt), X, src[r:e], loc=loc)
                r = e
            for j in range(kw):
                b.matmul(core, Z, S_t[j], YC, loc=loc)
                load_gather(b, core, WT, wc, tap * c_ + chan[blk], loc=loc)
                if tap == 0:
                    b.sfu(core, "mul", ACC, YC, WT, loc=loc)
                else:
                    b.sfu(core, "mul", YC, YC, WT, loc=loc)
                    b.sfu(core, "add", ACC, ACC, YC, loc=loc)
                tap += 1
        if bc is not None:
            load_gather(b, core, BT, bc, chan[blk], loc=loc)
            b.sfu(core, "add", ACC, ACC, BT, loc=loc)
        b.sfu(core, "cast", OUT, ACC, loc=loc)
        store_rows(b, core, OUT, O, core * rb, loc=loc)
    em._force_barrier = True
    return gr


def emit_pool2d(em, op, loc):
    """Max/avg pooling without padding: for each kernel row i the input rows (n, c, oh*sh + i) are
    gathered by DMA, each kernel column j picks columns ow*sw + j through an exact 0/1 selection matmul,
    and the window combines with SFU max/add in fp32 (one rounding on write)."""
    X = em.tensor(op.operation.operands[0])
    O = em.result(op)
    n_, c_, h, w = X.shape
    oh, ow = O.shape[2], O.shape[3]
    kh, kw = _attr(op, "kernel")
    sh, sw = _attr(op, "strides") or [kh, kw]
    is_max = _attr(op, "kind") == "max"
    b = em.b
    sel = []
    for j in range(kw):
        P = np.zeros((w, ow), np.float32)
        P[np.arange(ow) * sw + j, np.arange(ow)] = 1
        sel.append(em._buffer_tensor(b.constant(em._name(f"select{em._op_index}.{j}"), P, X.fmt)))
    R = n_ * c_ * oh
    kp, plan = planned(em, op, R)
    gr, tr = kp.grid[0], kp.tile[0]
    out_rows = np.arange(R)
    for core in range(gr):
        S = [kp.tile_at(f"sel{chr(ord('a') + j)}", w, ow, X.fmt) for j in range(kw)]
        for St, src in zip(S, sel):
            load_rows(b, core, St, src, 0, loc=loc)
        XT, CT = kp.tile_at("in0", tr, w, X.fmt), kp.tile_at("ct", tr, ow, "fp32")
        RES, OT = kp.tile_at("res", tr, ow, "fp32"), kp.tile_at("out0", tr, ow, O.fmt)
        for c2, r0, n in plan:
            if c2 != core:
                continue
            rows = out_rows[r0:r0 + n]
            xt, ct, res, ot = _sub(XT, n, w), _sub(CT, n, ow), _sub(RES, n, ow), _sub(OT, n, ow)
            first = True
            for i in range(kh):
                load_gather(b, core, xt, X, (rows // oh) * h + (rows % oh) * sh + i, loc=loc)
                for j in range(kw):
                    b.matmul(core, xt, S[j], ct, loc=loc)
                    if first:
                        b.sfu(core, "cast", res, ct, loc=loc)
                        first = False
                    else:
                        b.sfu(core, "max" if is_max else "add", res, res, ct, loc=loc)
            if not is_max:
                b.sfu(core, "mul", res, res, 1.0 / (kh * kw), loc=loc)
            b.sfu(core, "cast", ot, res, loc=loc)
            store_rows(b, core, ot, O, r0, loc=loc)
    return gr


EMITTERS = {"spyre.conv2d": emit_conv2d, "spyre.pool2d": emit_pool2d}
KERNELS = {"spyre.conv2d": ("conv2d",), "spyre.pool2d": ("pool2d",)}
