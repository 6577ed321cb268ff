"""Convolution and pooling on the device (NCHW, dlf16/fp8 data).

conv2d with known weights (groups 1 or depthwise) is an implicit GEMM on the PT array that follows the op's
kernel plan (``spyre.grid`` [gn, gf, goh], ``spyre.tile`` [1, tf, toh], the buffers of ``cost.conv_buffers``):
per tile the input patch is loaded once and every PT product reads its rows through a column window (the
kernel column's sub-stick shift, the stride and the zero padding; MATMUL ``WINDOW``), so no data is copied
per tap. Max/avg pool2d without padding gathers input rows per kernel row, picks columns with exact 0/1
selection matmuls and combines the window on the SFU. A non-overlapping pool of a conv's output (after its
epilogue map) is applied by the conv kernel to each output tile before the store (its kernel is ``epilogue``,
:func:`pool_source`): the conv's full-size output never goes to device memory. A conv marked ``spyre.ring_input``
by spyre-chain-convs receives its input patch from the kernel storing its input, which sends those rows over the
ring instead of storing them (:func:`ring_consumer`; a flatten marked so receives its input rows the same way).
"""

from __future__ import annotations

import contextlib

import numpy as np

from spyre_mlir import cost
from spyre_mlir.passes.analysis import BARRIER, RING_INPUT
from spyre_mlir.runtime.formats import Format
from spyre_mlir.runtime.isa import PT_FORMATS, SfuFn, sfu_fn

from ..common import _attr, _sub, _tensor_type, row_parts
from ..memory import format_of, load_gather, load_rows, store_rows
from ..plan import KernelPlan
from ..sfu import writes_result
from .move import column_selections
from .rows import apply_epilogue, epilogue_of, planned

__all__ = ["select", "why_not", "pool_source", "pool_of", "prefetchable", "core_tiles", "stored_value",
           "ring_source", "ring_consumer", "ring_buffer", "EMITTERS"]


def select(op, target, known) -> str | None:
    """``"conv2d"`` / ``"pool2d"`` when the device runs ``op``: a conv2d :func:`_conv_plan` accepts (its
    weights and bias among the compile-time values ``known``) with a tile that fits the scratchpad; pooling
    without padding of a 4-D dlf16/fp8 input to dlf16 or fp32, ``"epilogue"`` when the conv kernel producing
    its input applies it (:func:`pool_source`, and the conv's tiles still fit with the pool's buffers). Else
    None."""
    if op.operation.name == "spyre.conv2d":
        return "conv2d" if _conv_plan(op, target, known) is not None and _fits(op, target) else None
    if not _pool_runs(op):
        return None
    conv = pool_source(op)
    return "epilogue" if conv is not None and _fits(conv, target, op.operation) else "pool2d"


def _pool_runs(op) -> bool:
    _, res_elt = _tensor_type(op.operation.results[0])
    ishape, ielt = _tensor_type(op.operation.operands[0])
    return (len(ishape) == 4 and not any(_attr(op, "padding") or [0]) and
            format_of(ielt) in (Format.DLF16, Format.FP8_E4M3, Format.FP8_E5M2) and
            format_of(res_elt) in (Format.DLF16, Format.FP32))


def _owner(v):
    return v.owner.operation if hasattr(v.owner, "operation") else None


def _single_use(v) -> bool:
    return len(list(v.uses)) == 1


def pool_source(pool):
    """The conv2d (kernel ``conv2d``) whose kernel can apply ``pool`` to its output tiles, or None: a max/avg
    pool2d without padding whose windows tile the conv's output exactly (strides = window, the output rows and
    columns multiples of it), reading the conv's result, or its epilogue map's result of the same shape, as
    that value's only reader. It computes what the pool2d kernel would, in the same order (per window cell, a
    0/1 selection product and one fp32 combine; one rounding), so the result is bit-identical."""
    from .rows import epilogue

    o = pool.operation
    if o.name != "spyre.pool2d" or not _pool_runs(pool) or _attr(pool, "kind") not in ("max", "avg"):
        return None
    kernel = _attr(pool, "kernel")
    if (_attr(pool, "strides") or kernel) != kernel:
        return None
    v = o.operands[0]
    p = _owner(v)
    if p is None or not _single_use(v):
        return None
    if p.name == "spyre.map" and _attr(p, "spyre.kernel") == "epilogue":
        epi = epilogue(p)
        p = _owner(p.operands[epi.src]) if epi is not None else None
    if p is None or p.name != "spyre.conv2d" or _attr(p, "spyre.kernel") != "conv2d":
        return None
    shape = _tensor_type(p.results[0])[0]
    if _tensor_type(v)[0] != shape or shape[2] % kernel[0] or shape[3] % kernel[1]:
        return None
    return p


def pool_of(conv):
    """The pool2d the kernel of ``conv`` applies (kernel ``epilogue``, :func:`pool_source`), or None."""
    from .rows import epilogue_of

    found = epilogue_of(conv)
    v = (found[0] if found is not None else conv).operation.results[0]
    uses = list(v.uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner.operation
    if user.name != "spyre.pool2d" or _attr(user, "spyre.kernel") != "epilogue":
        return None
    src = pool_source(user)
    return user if src is not None and src == conv.operation else None


def why_not(op, target, known) -> str | None:
    """Why a conv2d has no device kernel, when it is something else than its types."""
    o = op.operation
    if o.name != "spyre.conv2d":
        return None
    (_, c_, _, _), _ = _tensor_type(o.operands[0])
    (f_, _, _, _), _ = _tensor_type(o.operands[1])
    groups = _attr(op, "groups", 1)
    if groups != 1 and not groups == c_ == f_:
        return f"grouped conv2d (groups {groups}: neither 1 nor depthwise)"
    if any(v not in known for v in list(o.operands)[1:]):
        return "conv2d weights computed at run time (the kernel's filter tiles are built while compiling)"
    if _conv_plan(op, target, known) is not None and not _fits(op, target):
        return "no conv2d tile fits the scratchpad"
    return None


def prefetchable(op, target) -> tuple[tuple[str, ...], float, float]:
    """The constants the conv kernel loads once before its work when it shares them over the ring
    (:func:`cost.conv_shares`): its filters ``b0``, its ``bias`` and the pool's selections ``psel``; the cycles
    their loads take, and the cycles they and their multicasts keep it from its work."""
    from spyre_mlir.passes.op_model import op_model

    kp = KernelPlan.of(op, target)
    k = op_model(op).conv
    if not cost.conv_shares(k, kp.grid, kp.tile):
        return (), 0.0, 0.0
    names = ("b0",) + (("bias",) if k.bias else ()) + (("psel",) if pool_of(op) is not None else ())
    nbytes = sum(kp.buffers[n][1] * (1 if n == "psel" else kp.grid[1]) for n in names)
    load = nbytes / (target.dram_read_gbps / target.clock_ghz) + target.dma_latency_cycles
    return names, load, cost.conv_constants_cycles(k, kp.grid, kp.tile, target)


def last_segment(op, target) -> tuple[float, float] | None:
    """(compute, store) cycles of the conv kernel's last segment when it loads nothing there (it loads its
    constants and its one patch per core before the barrier delivering them, :func:`cost.conv_phased`), else
    None."""
    from spyre_mlir.passes.op_model import op_model

    kp = KernelPlan.of(op, target)
    k = op_model(op).conv
    return cost.conv_last_segment(k, kp.grid, kp.tile, target) if cost.conv_phased(k, kp.grid, kp.tile) else None


def _fits(op, target, pool=None) -> bool:
    """Some tile of the conv (applying ``pool``, when given) fits the scratchpad (on one core: more cores only
    shrink the blocks)."""
    from spyre_mlir.passes.op_model import conv_kernel

    return cost.best_conv_tile(conv_kernel(op.operation, pool), (1, 1, 1), target) is not None


def _conv_plan(op, target, known):
    """The geometry of a conv2d the device runs (groups 1 or depthwise, dlf16/fp8/fp32 data to dlf16/fp32, known
    weights and bias), else None (it runs on the host). Its tiles are the op's kernel plan."""
    o = op.operation
    x, w = o.operands[0], o.operands[1]
    bias = o.operands[2] if len(o.operands) > 2 else None
    (n_, c_, h, wd), xelt = _tensor_type(x)
    (f_, cg, kh, kw), _ = _tensor_type(w)
    (_, _, oh, ow), oelt = _tensor_type(o.results[0])
    fmt = format_of(xelt)
    groups = _attr(op, "groups", 1)
    if ((groups != 1 and not groups == c_ == f_) or fmt not in (Format.DLF16, Format.FP8_E4M3, Format.FP8_E5M2,
                                                                  Format.FP32)
            or format_of(oelt) not in (Format.DLF16, Format.FP32) or w not in known
            or (bias is not None and bias not in known)):
        return None
    return dict(n=n_, c=c_, h=h, w=wd, f=f_, kh=kh, kw=kw, oh=oh, ow=ow, fmt=fmt, groups=groups)


def _filters(wv, k, tf):
    """The weights as the kernel multiplies them: per filter tile t, per product (kernel column j, kernel-row
    group ig), the block [tf, rows_per_product x in_channels(tf)] with columns (kernel row, channel of the
    tile); a filter's weights sit at its group's channels, zero elsewhere (block-diagonal for groups > 1)."""
    ki, kh, kw = k.rows_per_product, k.kh, k.kw
    nig, cin, cg, fg = kh // ki, k.in_channels(tf), k.c // k.groups, k.f // k.groups
    out = np.zeros((k.f // tf, kw, nig, tf, ki, cin), np.float32)
    for f in range(k.f):
        t, fl = divmod(f, tf)
        rel = (f // fg) * cg - (t * tf // fg) * cg
        out[t, :, :, fl, :, rel:rel + cg] = wv[f].reshape(cg, nig, ki, kw).transpose(3, 1, 2, 0)
    return out.reshape(k.f // tf * kw * nig * tf, ki * cin)


def core_tiles(kp, k) -> list[list[tuple[int, int, int]]]:
    """Per core of the plan, its tiles (first filter, image, first output row) in the order its kernel walks them:
    core (i, j, l) of the grid [gn, gf, goh] takes images block i, filters block j, output rows block l."""
    gn, gf, goh = kp.grid
    _, tf, toh = kp.tile
    nb, fb, ohb = k.n // gn, k.f // gf, k.oh // goh
    out = []
    for core in range(kp.cores):
        bi, rest = divmod(core, gf * goh)
        bj, bl = divmod(rest, goh)
        out.append([(f0, n, oh0) for f0 in range(bj * fb, (bj + 1) * fb, tf)
                    for n in range(bi * nb, (bi + 1) * nb) for oh0 in range(bl * ohb, (bl + 1) * ohb, toh)])
    return out


def stored_value(conv):
    """The value the kernel of ``conv`` stores: the result of the pool it applies, else of its epilogue map, else
    its own."""
    from .rows import epilogue_of

    pool = pool_of(conv)
    if pool is not None:
        return pool.results[0]
    found = epilogue_of(conv)
    return (found[0] if found is not None else conv).operation.results[0]


def ring_source(op):
    """The conv2d (kernel ``conv2d``) whose kernel stores operand 0 of ``op`` (through the pool or map it applies),
    when ``op`` (a conv2d, or a flatten on the PT array: :func:`move.ring_merges`) is that value's only reader:
    the producer spyre-chain-convs may let send ``op``'s input rows over the ring. None otherwise."""
    from .rows import epilogue

    v = op.operation.operands[0]
    p = _owner(v)
    if p is None or not _single_use(v):
        return None
    if p.name == "spyre.pool2d" and _attr(p, "spyre.kernel") == "epilogue":
        p = pool_source(p)
    elif p.name == "spyre.map" and _attr(p, "spyre.kernel") == "epilogue":
        epi = epilogue(p)
        p = _owner(p.operands[epi.src]) if epi is not None else None
    if p is None or p.name != "spyre.conv2d" or _attr(p, "spyre.kernel") != "conv2d" or stored_value(p) != v:
        return None
    return p


def ring_consumer(conv):
    """The op whose input rows the kernel of ``conv`` sends over the ring instead of storing its result: that
    result's only reader, a conv2d or a select-cols flatten marked ``spyre.ring_input`` by spyre-chain-convs.
    None otherwise."""
    uses = list(stored_value(conv).uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner.operation
    if user.name not in ("spyre.conv2d", "spyre.reshape") or uses[0].operand_number != 0 \
            or not _attr(user, RING_INPUT):
        return None
    return user


def ring_buffer(op) -> str:
    """The buffer of ``op``'s plan its input rows arrive in over the ring: a conv's patches ``a0``, a flatten's
    ``in0``, a matmul's A tile ``a0``."""
    return "in0" if op.name == "spyre.reshape" else "a0"


def _patch_origin(op, k, tile) -> tuple[int, int]:
    """(first channel, first input row) of the input patch of ``tile`` (f0, n, oh0); the row is negative where
    the patch starts in the top padding."""
    f0, _, oh0 = tile
    sh = (_attr(op, "strides") or [1, 1])[0]
    pt = (_attr(op, "padding") or [0, 0, 0, 0])[0]
    return (f0 // (k.f // k.groups)) * (k.c // k.groups), oh0 * sh - pt


def _patches(op, kp, k) -> list[tuple[list[tuple[int, int, int]], list[int]]]:
    """Per core, (the distinct (first channel, image, first input row) of its tiles' input patches in the order its
    kernel first reads them, which of them each tile reads): with spyre.ring_input, patch j sits at row j x (its
    rows) of a0, which the plan sized for ``k.patches``."""
    out = []
    for tiles in core_tiles(kp, k):
        index = {}
        which = [index.setdefault((c0, t[1], p0), len(index)) for t in tiles for c0, p0 in [_patch_origin(op, k, t)]]
        if len(index) > k.patches:
            kp.fail(f"spyre.ring_input: a core reads {len(index)} input patches, its a0 holds {k.patches}")
        out.append((list(index), which))
    return out


def _shared_loads(op, kp, k, H: int, rows_in: int) -> list[tuple[int, list[tuple[int, int]], list[tuple]]]:
    """For a phased conv (one tile a core) loading its patches from device memory: per core, its patch's first
    input row (negative in the padding), the runs of input rows [lo, hi) it loads (``cost.shared_rows``: the halo
    rows the cores of ``cost.conv_patch_groups`` share are loaded once, by one of them) and its sends of them
    [(destination cores, first input row, rows, their first row in the destinations' patches)]: one RING_SEND per
    run and destination place (a multicast when several cores take the rows at the same place)."""
    tiles = [ts[0] for ts in core_tiles(kp, k)]
    origin = [_patch_origin(op, k, t) for t in tiles]
    need = [(max(p0, 0), min(p0 + rows_in, H)) for _, p0 in origin]
    out = [(p0, [], []) for _, p0 in origin]
    for cores in cost.conv_patch_groups(kp.grid):
        if len({(tiles[c][1], origin[c][0]) for c in cores}) != 1:
            kp.fail("the cores of cost.conv_patch_groups read different images or channels")
        for c, runs in zip(cores, cost.shared_rows([need[c] for c in cores])):
            by_place = {}
            for a, z in runs:
                for d in cores:
                    lo, hi = max(a, need[d][0]), min(z, need[d][1])
                    if d != c and hi > lo:
                        by_place.setdefault((lo, hi, lo - origin[d][1]), []).append(d)
            out[c] = (origin[c][1], runs, [(dests, lo, hi - lo, place) for (lo, hi, place), dests in by_place.items()])
    return out


def _patch_rows(to, target):
    """The input patches of conv ``to`` marked spyre.ring_input: (its ``a0`` tile, {row of its input (n, c, h) as
    stored: [(core, row of a0)]})."""
    from spyre_mlir.passes.op_model import op_model

    kp, k = KernelPlan.of(to, target), op_model(to).conv
    (_, c_, h, w), elt = _tensor_type(to.operands[0])
    cin, rows_in = k.in_channels(kp.tile[1]), k.in_rows(kp.tile[2])
    dest = {}
    for core, (keys, _) in enumerate(_patches(to, kp, k)):
        for j, (c0, n, p0) in enumerate(keys):
            at = j * cin * rows_in
            for r in range(max(p0, 0), min(p0 + rows_in, h)):
                for c in range(c0, c0 + cin):
                    dest.setdefault((n * c_ + c) * h + r, []).append((core, at + (r - p0) * cin + c - c0))
    return kp.tile_at("a0", cin * rows_in * k.patches, w, format_of(elt)), dest


def _ring_sender(em, op, kp, tf, loc):
    """For a conv whose result goes over the ring into its consumer's input rows (:func:`ring_consumer`),
    ``send(core, n, f0, T, lo, hi, base)``: rows [lo, hi) of the stored tile ``T`` (rows (row, filter): stored
    row base + r of filters f0.. f0 + tf of image n) to every consumer core that reads them, at their place in
    its buffer (:func:`ring_buffer`); a RING_SEND per run of rows contiguous on both sides, an SFU copy on the
    sending core itself. None for a conv that stores its result."""
    from .move import ring_rows

    to = ring_consumer(op)
    if to is None:
        return None
    kp2 = KernelPlan.of(to, em.target)
    if not _attr(op, BARRIER) and not kp.cores == kp2.cores == 1:
        kp.fail("its result goes over the ring (spyre.ring_input on its reader), but no barrier follows it to "
                "deliver the rows (spyre.barrier)")
    IN, dest = _patch_rows(to, em.target) if to.name == "spyre.conv2d" else ring_rows(to, em.target)
    (_, F, H, _), _ = _tensor_type(stored_value(op))
    b = em.b

    def send(core, n, f0, T, lo, hi, base):
        if T.pitch != IN.pitch or T.fmt != IN.fmt:
            kp.fail(f"its stored rows ({T.cols} {T.fmt.key} columns) are not its consumer's input rows")
        runs = {}               # (core, destination - source row): [[source row, destination row, rows]]
        for r in range(lo, hi):
            for f in range(tf):
                src = r * tf + f
                for c, dst in dest.get(((n * F + f0 + f) * H + base + r), ()):
                    run = runs.setdefault((c, dst - src), [])
                    if run and run[-1][0] + run[-1][2] == src:
                        run[-1][2] += 1
                    else:
                        run.append([src, dst, 1])
        for c, dst, src, rows in sorted((c, d, s, k) for (c, _), run in runs.items() for s, d, k in run):
            if c == core:
                b.sfu(core, "cast", IN.row_slice(dst, dst + rows), T.row_slice(src, src + rows), loc=loc)
            else:
                b.ring_send(core, c, IN.row_slice(dst, dst + rows).addr, T.row_slice(src, src + rows), loc=loc)
    return send


def emit_conv2d(em, op, loc):
    """conv2d on the grid and tiles of its plan. Core (i, j, l) of the grid [gn, gf, goh] takes images block i,
    filters block j, output rows block l; it walks its filter tiles (filters and bias loaded once each) and,
    for each, its images and output-row tiles:

    1. the patch: input rows of the tile (padding rows zero-filled) x the channels its filters read, one DMA;
    2. per output row r and product (kernel column j, kernel-row group): acc_r [tf, OW] (+)= filters
       [tf, rows x channels] @ patch rows of those input rows read through the window (offset j*dw - pad_left,
       stride sw), fp32, the last product rounding into out_r on write-back (or the bias added on the SFU,
       then one cast);
    3. one store of the tile's toh x tf rows to the output rows (n, f, oh); with a pool (:func:`pool_of`), per
       window cell (i, j) and pooled row p, the 0/1 selection of columns ow*pw + j of output row p*ph + i into
       ``pct``, combined into ``pres`` (max/add, fp32), one rounding into ``pout``, whose rows (p, f) are stored
       to the pool's output rows (n, f, oh / ph + p) instead."""
    from spyre_mlir.passes.op_model import op_model

    g = _conv_plan(op, em.target, em.known)
    if g is None:
        raise ValueError("conv2d needs its weights (and bias) at compile time")
    o = op.operation
    kp = KernelPlan.of(op, em.target)
    k = op_model(o).conv
    X, O = em.tensor(o.operands[0]), em.result(op)
    gn, gf, goh = kp.grid
    _, tf, toh = kp.tile
    nb, fb, ohb = k.n // gn, k.f // gf, k.oh // goh
    if (kp.cores > em.cores or k.n % gn or k.f % gf or k.oh % goh or fb % tf or ohb % toh or kp.tile[0] != 1):
        kp.fail(f"grid {list(kp.grid)} and tile {list(kp.tile)} do not tile the {k.n}x{k.f}x{k.oh} conv on "
                f"{em.cores} cores")
    wv = np.asarray(em.known[o.operands[1]], np.float32)
    fmt, b = g["fmt"], em.b

    def const(name, arr, f=fmt):
        return em._buffer_tensor(b.constant(em._name(f"conv{em._op_index}.{name}"), arr, f))

    wfmt = Format.parse(k.filter_fmt)       # the input's, unless spyre-fuse folded an f32 input's cast
    W = const("w", _filters(wv, k, tf), wfmt)
    BC = const("bias", np.asarray(em.known[o.operands[2]], np.float32).reshape(k.f, 1), "fp32") if k.bias else None
    sh, sw = _attr(op, "strides") or [1, 1]
    dh, dw = _attr(op, "dilations") or [1, 1]
    pl = (_attr(op, "padding") or [0, 0, 0, 0])[1]
    ki, cin, rows_in = k.rows_per_product, k.in_channels(tf), k.in_rows(toh)
    nig, nprod = k.kh // ki, k.products
    H, C, OH = g["h"], k.c, k.oh
    A = [kp.tile_at(f"a{i}", cin * rows_in, k.w, fmt) for i in range(kp.nbuf)]
    B = [kp.tile_at(f"b{i}", nprod * tf, ki * cin, wfmt) for i in range(kp.nbuf)]
    ACC, OUT = kp.tile_at("acc", toh * tf, k.ow, "fp32"), kp.tile_at("out", toh * tf, k.ow, O.fmt)
    BI = kp.tile_at("bias", tf, 1, "fp32") if k.bias else None
    # fp32 data (fp32-reference, or an f32 input whose cast spyre-fuse folded) is converted to DLFloat16 for the
    # PT array after each load.
    convert, convert_w = fmt not in PT_FORMATS, wfmt not in PT_FORMATS
    PA = kp.tile_at("pa", cin * rows_in, k.w, "dlf16") if convert else None
    PB = kp.tile_at("pb", nprod * tf, ki * cin, "dlf16") if convert_w else None
    # A map applied to each output tile before its store (rows.epilogue): the tile's values, fp32 micro-ops in
    # the accumulator tile (free by then), one rounding back into the tile; the map's result is this output.
    epi_op, epi = epilogue_of(op) or (None, None)
    if epi_op is not None:
        em.dev[epi_op.operation.results[0]] = O.reshaped(_tensor_type(epi_op.operation.results[0])[0])
    # A ReLU epilogue rounds the accumulator itself: relu(round(x)) is round(relu(x)) bit for bit for a float
    # result (rounding is monotone and odd, +0 and NaN stay), so one RELU does the cast's and the map's work.
    relu = epi is not None and _is_relu(epi) and O.fmt.is_float
    pool = pool_of(op)
    if pool is not None:
        if k.pool is None or toh % k.pool[0]:
            kp.fail(f"tile {list(kp.tile)} does not hold whole windows of the pool it applies ({k.pool})")
        ph, pw = k.pool
        P = em.result(pool)
        em.dev[pool.results[0]] = P
        prow, POW = toh // ph, k.pool_ow
        psel = const("psel", column_selections(k.ow, POW, pw, pw), O.fmt)
        PCT, PRES = kp.tile_at("pct", prow * tf, POW, "fp32"), kp.tile_at("pres", prow * tf, POW, "fp32")
        POUT = kp.tile_at("pout", prow * tf, POW, P.fmt)
        PSELS = kp.tile_at("psel", pw * k.ow, POW, O.fmt)
        PSEL = [PSELS.row_slice(j * k.ow, (j + 1) * k.ow) for j in range(pw)]

    send = _ring_sender(em, op, kp, tf, loc)
    ring_in = bool(_attr(op, RING_INPUT))
    if ring_in:
        if ring_source(op) is None:
            kp.fail("spyre.ring_input, but no conv kernel storing its input sends it over the ring")
        PATCHES = kp.tile_at("a0", cin * rows_in * k.patches, k.w, fmt)
        which = [w for _, w in _patches(op, kp, k)]
        first_read = [[j not in w[:i] for i, j in enumerate(w)] for w in which]

    def patch(core, i):
        """(the input patch of the core's tile i, whether no earlier tile of the core read it)."""
        if not ring_in:
            return A[i % kp.nbuf], True
        j, rows = which[core][i], cin * rows_in
        return PATCHES.row_slice(j * rows, (j + 1) * rows), first_read[core][i]

    def store(core, n, f0, oh0, r0, r1):
        """Output rows [r0, r1) of the tile (whole pool windows) to device memory, pooled when it pools."""
        if pool is None:                # rows (r, f) of the tile -> output rows (n, f0 + f, oh0 + r)
            if send is not None:
                send(core, n, f0, OUT, r0, r1, oh0)
                return
            pitch = OUT.pitch
            b.dma_store(core, O.addr + ((n * k.f + f0) * OH + oh0 + r0) * pitch, OUT.addr + r0 * tf * pitch,
                        (r1 - r0, tf, pitch), (pitch, OH * pitch), (tf * pitch, pitch), loc=loc)
            return
        # The pool2d kernel's order per element: cell (0, 0) copied, then combined cell by cell, one rounding.
        q0, q1 = r0 // ph, r1 // ph
        pct, pres, pout = (t.row_slice(q0 * tf, q1 * tf) for t in (PCT, PRES, POUT))
        for c in range(ph * pw):
            i, j = divmod(c, pw)
            for q in range(q0, q1):
                r = q * ph + i
                b.matmul(core, OUT.row_slice(r * tf, (r + 1) * tf), PSEL[j], PCT.row_slice(q * tf, (q + 1) * tf),
                         loc=loc)
            if c == 0:
                b.sfu(core, "cast", pres, pct, loc=loc)
            else:
                b.sfu(core, "add" if k.pool_avg else "max", pres, pres, pct, loc=loc)
        if k.pool_avg:
            b.sfu(core, "mul", pres, pres, 1.0 / (ph * pw), loc=loc)
        b.sfu(core, "cast", pout, pres, loc=loc)
        if send is not None:
            send(core, n, f0, POUT, q0, q1, oh0 // ph)
            return
        pitch, PH = POUT.pitch, OH // ph        # rows (q, f) -> pooled rows (n, f0 + f, oh0 / ph + q)
        b.dma_store(core, P.addr + ((n * k.f + f0) * PH + oh0 // ph + q0) * pitch, pout.addr, (q1 - q0, tf, pitch),
                    (pitch, PH * pitch), (tf * pitch, pitch), loc=loc)
    cores = []
    for core, tiles in enumerate(core_tiles(kp, k)):
        first = [i == 0 or tiles[i - 1][0] != t[0] for i, t in enumerate(tiles)]
        wslot = np.cumsum(first) - 1            # which filter tile (weight buffer) each tile uses

        def load(i, runs=None, core=core, tiles=tiles, first=first, wslot=wslot):
            """The tile's filters (unshared) and patch: its padding rows zero-filled, its input rows loaded (only
            ``runs`` of them when its cores share their patches' rows: _shared_loads)."""
            f0, n, _ = tiles[i]
            if first[i] and not shared:
                load_rows(b, core, B[wslot[i] % kp.nbuf], W, f0 // tf * nprod * tf, loc=loc)
            a, fresh = patch(core, i)
            if not fresh:                       # a patch received over the ring that an earlier tile read
                return
            c0, p0 = _patch_origin(op, k, tiles[i])     # p0 negative: the patch starts in the padding
            lo, hi = max(0, -p0), min(rows_in, H - p0)
            for r0, r1 in ((0, min(lo, rows_in)), (max(hi, 0), rows_in)):
                if r1 > r0:
                    b.sfu(core, "fill", a.row_slice(r0 * cin, r1 * cin), imm=0.0, loc=loc)
            if hi > lo and not ring_in:         # else the producer's kernel sent those rows
                pitch = a.pitch
                for r0, r1 in runs if runs is not None else [(p0 + lo, p0 + hi)]:
                    b.dma_load(core, X.addr + ((n * C + c0) * H + r0) * pitch, a.addr + (r0 - p0) * cin * pitch,
                               (r1 - r0, cin, pitch), (pitch, H * pitch), (cin * pitch, pitch), loc=loc)

        def work(i, pieces=((0, toh),), core=core, tiles=tiles, first=first, wslot=wslot):
            f0, n, oh0 = tiles[i]
            if first[i] and BI is not None and not shared:
                load_rows(b, core, BI, BC, f0, loc=loc)
            a, wt = patch(core, i)[0], B[wslot[i] % kp.nbuf]
            if convert_w:
                if first[i]:
                    b.sfu(core, "cast", PB, wt, loc=loc)
                wt = PB
            if convert:
                b.sfu(core, "cast", PA, a, loc=loc)
                a = PA
            for r0, r1 in pieces:
                for r in range(r0, r1):
                    acc, out = ACC.row_slice(r * tf, (r + 1) * tf), OUT.row_slice(r * tf, (r + 1) * tf)
                    for q in range(nprod):
                        j, ig = divmod(q, nig)
                        p = r * sh + ig * ki * dh
                        fin = q == nprod - 1 and BI is None and not relu
                        b.matmul(core, wt.row_slice(q * tf, (q + 1) * tf), a.row_slice(p * cin, (p + ki) * cin),
                                 acc, accumulate=q > 0, out=out if fin else None, window=(j * dw - pl, sw, k.ow),
                                 loc=loc)
                    if BI is not None:
                        b.sfu(core, "add", acc, acc, BI, loc=loc)
                acc, out = ACC.row_slice(r0 * tf, r1 * tf), OUT.row_slice(r0 * tf, r1 * tf)
                if relu:
                    b.sfu(core, "relu", out, acc, loc=loc)
                elif BI is not None:
                    b.sfu(core, "cast", out, acc, loc=loc)
                if epi is not None and not relu:
                    apply_epilogue(b, core, epi, out, [acc], loc)
                store(core, n, f0, oh0, r0, r1)

        cores.append((core, len(tiles), load, work))
    # With one filter tile per core (cost.conv_shares), the constants the cores need alike are read from device
    # memory once: each core of a group loads a part of their rows and multicasts it to the others, delivered at
    # one barrier before the loop: the filters and bias across the cores of a filter block, the pool's
    # selections across all cores.
    shared = cost.conv_shares(k, kp.grid, kp.tile)
    prefetch = em.prefetched(o, prefetchable)
    # One tile a core (cost.conv_phased): its patch is loaded before that barrier too, so the segment after it only
    # computes and stores, and no segment mixes device-memory reads and writes.
    early = cost.conv_phased(k, kp.grid, kp.tile)
    if shared:
        parts = []
        for bj in range(gf):
            group = [c for c in range(kp.cores) if (c % (gf * goh)) // goh == bj]
            parts.append((group, B[0], W, bj * fb // tf * nprod * tf))
            if BI is not None:
                parts.append((group, BI, BC, bj * fb))
        parts += [(list(range(kp.cores)), PSELS, psel, 0)] if pool is not None else []
        # spyre-prefetch may have planned these loads during an earlier kernel. A multicast goes with its load
        # when the first barrier after it there joins its destinations (it lands there), else before this kernel's
        # own barrier below (a phased row-wise kernel or a K-split group between may meet on fewer cores).
        later = []
        with em.prefetching(op) if prefetch else contextlib.nullcontext():
            for group, t, src, row0 in parts:
                for q, (lo, hi) in enumerate(row_parts(t.rows, len(group))):
                    others = [c for c in group if c != group[q]]
                    if hi > lo:
                        load_rows(b, group[q], t.row_slice(lo, hi), src, row0 + lo, loc=loc)
                    if hi > lo and others:          # a filter block on one core (gn x goh = 1) shares nothing
                        mask = b.next_barrier(group[q]) if prefetch else None
                        if mask is None or all(mask >> c & 1 for c in others):
                            b.ring_send(group[q], others, t.row_slice(lo, hi).addr, t.row_slice(lo, hi), loc=loc)
                        else:
                            later.append((group[q], others, t.row_slice(lo, hi)))
        for core, others, t in later:
            b.ring_send(core, others, t.addr, t, loc=loc)
        if early and not ring_in:
            # The rows neighbouring cores' patches share (the halo; the whole patch for cores of other filter
            # blocks) are read from device memory once and sent on, delivered at the barrier below.
            for (core, _, load, _), (p0, runs, sends) in zip(cores, _shared_loads(op, kp, k, H, rows_in)):
                load(0, runs)
                for dests, r0, rows, place in sends:
                    src = A[0].row_slice((r0 - p0) * cin, (r0 - p0 + rows) * cin)
                    b.ring_send(core, dests, A[0].row_slice(place * cin, (place + rows) * cin).addr, src, loc=loc)
        elif early:
            for core, _, load, _ in cores:
                load(0)
        b.barrier(range(kp.cores), loc=loc)
    for core, ntiles, load, work in cores:
        if pool is not None and not shared:
            load_rows(b, core, PSELS, psel, 0, loc=loc)
        if early:
            # One tile: in pieces (cost.conv_pieces), each piece's store behind the next piece's products.
            work(0, cost.conv_pieces(k, kp.tile, em.target, kp.cores))
            continue
        # Double-buffered, the next tile's loads are issued before this tile's products (DMA runs in order).
        if kp.nbuf == 2:
            load(0)
        for i in range(ntiles):
            if kp.nbuf == 1:
                load(i)
            elif i + 1 < ntiles:
                load(i + 1)
            work(i)
    return kp.cores


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
    sel = em._buffer_tensor(b.constant(em._name(f"select{em._op_index}"), column_selections(w, ow, sw, kw), X.fmt))
    R = n_ * c_ * oh
    kp, plan = planned(em, op, R)
    gr, tr = kp.grid[0], kp.tile[0]
    out_rows = np.arange(R)
    for core in range(gr):
        whole = kp.tile_at("sel", kw * w, ow, X.fmt)
        load_rows(b, core, whole, sel, 0, loc=loc)
        S = [whole.row_slice(j * w, (j + 1) * w) for j in range(kw)]
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


def _is_relu(epi) -> bool:
    """Whether epilogue ``epi`` is RELU of the producer's tile alone."""
    return (len(epi.ops) == 1 and not epi.extra and sfu_fn(epi.ops[0][0]) is SfuFn.RELU
            and epi.ops[0][2] == ("in", epi.src) and writes_result(epi.ops, epi.result))


EMITTERS = {"spyre.conv2d": emit_conv2d, "spyre.pool2d": emit_pool2d}
KERNELS = {"spyre.conv2d": ("conv2d",), "spyre.pool2d": ("pool2d", "epilogue")}
