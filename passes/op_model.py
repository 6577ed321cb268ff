"""The kernel-level op model: what the cost model needs to know about a device op's kernel.

`op_model(op)` turns a device op into an `OpModel`: its kind (matmul, conv or row-wise), sizes and number
formats, and the `spyre_mlir.cost` description of its kernel (row-wise ops: streamed and once-loaded operands,
fp32 temporaries, SFU work). spyre-divide-work chooses grids with it, spyre-tile tiles, spyre-allocate-scratchpad
places the buffers of `plan(...)` and spyre-schedule reads which operands a row-wise kernel streams by row block.
"""

from __future__ import annotations

import dataclasses
import math

from torch_mlir import ir

from spyre_mlir import cost
from spyre_mlir.codegen.common import remembered, remembering
from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import (DOUBLE_BUFFER, GRID, KERNEL, RESIDENT, RING_INPUT, SHARE_OF, TILE,
                                        int_array, is_const_fold, producer)
from spyre_mlir.passes.base import PassError
from spyre_mlir.target import Target

# Element type -> device format. f16 computes as DLFloat16 on the device; int64 (and index) narrow to int32.
_FORMATS = {"f32": "fp32", "f16": "dlf16", "bf16": "bf16", "f8E4M3FN": "fp8_e4m3", "f8E5M2": "fp8_e5m2",
            "i8": "int8", "i4": "int4", "i32": "int32", "i64": "int32", "index": "int32", "i1": "bool"}


def fmt_of(t: ir.Type, where: ir.Operation) -> str:
    """The device number format (a `runtime.formats` key) of a tensor or element type."""
    if isinstance(t, ir.RankedTensorType):
        t = ir.RankedTensorType(t).element_type
    if spyre.is_dlf16(t):
        return "dlf16"
    f = _FORMATS.get(str(t))
    if f is None:
        raise PassError(f"element type {t} has no device format", where.location)
    return f


def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _attr_int(op: ir.Operation, name: str, default: int) -> int:
    return ir.IntegerAttr(op.attributes[name]).value if name in op.attributes else default


@dataclasses.dataclass
class OpModel:
    """What the cost model needs to know about one device op's kernel.

    kind "matmul" (batch_matmul included, with `batch` and `batched`), "conv" or "rows". `chunked` lists the
    operand indices a row-wise kernel reads as contiguous row blocks of its own rows (core c reads block c),
    which spyre-schedule uses to see whether data crosses cores.
    """

    op: ir.Operation
    kind: str
    B: int = 1
    M: int = 0
    N: int = 0
    K: int = 0
    fmt: str = "dlf16"
    out_fmt: str = "dlf16"
    bias: bool | str = False          # a matmul's bias operand format (False: none)
    colscale: str | None = None       # matmul: the format of quantized weights' per-column scales
    batched: bool = False
    b_fmt: str | None = None          # matmul rhs format (None: fmt)
    round_fmt: str | None = None      # matmul spyre.convert_result: rounded to this, then widened to out_fmt
    converts: tuple[str | None, str | None] = (None, None)   # spyre.convert_operands formats (lhs, rhs)
    whole: tuple[int, int] | None = None   # matmul: (B, N) of the op this is one card's share of (spyre.share_of)
    epi_in: tuple[str, ...] = ()      # matmul: formats of its epilogue's further inputs (a block loaded per tile)
    epi_temps: int = 0                # matmul: fp32 temporaries its epilogue needs besides the accumulator
    epi_ops: tuple[str, ...] = ()     # matmul: the SFU classes of its epilogue's micro-ops, its rounding included
    sibling: str | None = None        # matmul: result format of the sibling matmul its kernel computes too
    chain: tuple | None = None        # matmul: (V format, dv, result format) of the matmul chained to its softmax
    resident: bool = False            # matmul: A parts stay on the scratchpad across a row of tiles (spyre-tile)
    trans_b: bool = False             # matmul: B stored transposed, [N, K] (transpose_rhs kept by spyre-layout)
    softmax: str | None = None        # matmul: a softmax epilogue ("plain" / "safe"): whole rows per tile
    prologue: tuple | None = None     # matmul: (input format, [(param, format)], row stats) of its norm prologue

    @property
    def finish(self) -> dict:
        """The work finishing each output tile besides a softmax, as cost.finish_cycles takes it."""
        return {"epi_ops": self.epi_ops, "chain_dv": self.chain[1] if self.chain else 0}

    @property
    def fused(self) -> bool:
        """A matmul with conversions spyre-fuse folded into it."""
        return self.round_fmt is not None or any(self.converts)

    def reference(self) -> "OpModel":
        """The model of the unfused op (operands already converted, result not widened, no sibling computed
        beside it): its K split and K tile fix the order of the fp32 accumulation, which the fused op keeps so
        results stay bit-identical."""
        return dataclasses.replace(self, fmt=self.converts[0] or self.fmt, b_fmt=self.converts[1] or self.b_fmt,
                                   out_fmt=self.round_fmt or self.out_fmt, round_fmt=None, converts=(None, None),
                                   sibling=None)
    rows: cost.RowKernel | None = None
    conv: cost.ConvKernel | None = None
    chunked: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.kind == "matmul":
            batch = f"B={self.B} " if self.batched else ""
            return f"{self.op.name} {batch}M={self.M} N={self.N} K={self.K}"
        if self.kind == "conv":
            return f"{self.op.name} {self.conv.n}x{self.conv.f}x{self.conv.oh}x{self.conv.ow}"
        return f"{self.op.name} with {self.rows.rows} rows"

    def whole_model(self) -> "OpModel":
        """A card's share of a matmul (cols or heads): the model of the whole op on one card, whose M and K splits
        and tile the share keeps, so that every core computes tiles of the same shapes in the same order as on
        one card (the emulator's products then round the same way too)."""
        return dataclasses.replace(self, B=self.whole[0], N=self.whole[1], whole=None)

    def best_grid(self, cores: int, target: Target) -> tuple[int, ...] | None:
        split_k = split_m = None
        if self.kind == "matmul" and self.whole is not None:
            g = self.whole_model().best_grid(cores, target)
            if g is None:
                return None
            _, split_m, _, split_k = self.grid4(g)
        if self.kind == "matmul":
            # Fused, or computing a sibling too: the grid of the op alone, the same K split (accumulation order)
            # and division of the work.
            m = self.reference() if self.fused or self.sibling else self
            g = cost.best_batch_matmul_grid(m.B, m.M, m.N, m.K, cores, target, m.fmt, m.out_fmt,
                                            m.bias, b_fmt=m.b_fmt, round_fmt=m.round_fmt,
                                            colscale=m.colscale, split_k=split_k, split_m=split_m,
                                            epi_in=m.epi_in, trans_b=m.trans_b, softmax=m.softmax, **m.finish,
                                            epi_temps=m.epi_temps, sibling=m.sibling)
            return g if g is None or self.batched else g[1:]
        if self.kind == "conv":
            return cost.best_conv_grid(self.conv, cores, target)
        return cost.best_rows_grid(self.rows, cores, target)

    def grid4(self, grid) -> tuple[int, int, int, int]:
        """A matmul grid as (gb, gm, gn, gk)."""
        return tuple(grid) if self.batched else (1, *grid)

    def block(self, grid, target: Target) -> tuple[int, int, int]:
        """A matmul core's (M, N, K) block on ``grid``: N possibly a ragged split (cost.n_block, the busiest
        core's columns); a PassError when the grid does not split N in whole sticks."""
        _, gm, gn, gk = self.grid4(grid)
        nb = cost.n_block(self.N, gn, cost.n_quantum(self.fmt, self.out_fmt, self.b_fmt, target, self.trans_b))
        if nb is None or (nb * gn != self.N and gk > 1):
            raise PassError(f"grid {list(grid)} does not split N = {self.N} of '{self.op.name}' into blocks of whole "
                            f"sticks{' (a ragged N split needs no K split)' if nb is not None else ''}",
                            self.op.location)
        return self.M // gm, nb, self.K // gk


@remembered
def op_model(op: ir.Operation) -> OpModel:
    """The model of the kernel spyre-select-kernels chose for `op` (its `spyre.kernel`)."""
    if KERNEL not in op.attributes:
        raise PassError(f"'{op.name}' has no spyre.kernel: run spyre-select-kernels first", op.location)
    name = op.name.removeprefix("spyre.")
    fn = _MODELS.get(name)
    if fn is None:
        raise PassError(f"no kernel model for '{op.name}'", op.location)
    with remembering():
        return fn(op)


def _kernel(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes[KERNEL]).value


def _matmul(op: ir.Operation) -> OpModel:
    a, b = op.operands[0], op.operands[1]
    if _kernel(op) in ("sibling", "chained"):
        # Computed by the kernel of the matmul whose epilogue reads it (matmul.sibling_of), from that one's A
        # tiles, or chained to a softmax epilogue (matmul.chained_of): nothing of its own moves through a
        # scratchpad.
        return _unbuffered(_rows_model(op, math.prod(_shape(a)[:-1]), [("in", a, True)], chunked=()))
    sa, sb = _shape(a), _shape(b)
    trans = "transpose_rhs" in op.attributes and ir.BoolAttr(op.attributes["transpose_rhs"]).value
    batched = op.name == "spyre.batch_matmul"
    # spyre-fuse: operands in another format are converted on the scratchpad (A / B tiles move in their own
    # format), a result rounded to `spyre.convert_result` is widened on the scratchpad before its store.
    rnd = ir.TypeAttr(op.attributes["spyre.convert_result"]).value if "spyre.convert_result" in op.attributes \
        else None
    conv = {}
    if "spyre.convert_operands" in op.attributes:
        conv = {na.name: fmt_of(ir.TypeAttr(na.attr).value, op)
                for na in ir.DictAttr(op.attributes["spyre.convert_operands"])}
    quant = _quantized(b, op)
    epi_in, epi_temps, sibling, epi_ops = _epilogue_needs(op)
    # A widening cast after its epilogue map (rows.widened_by): the map's values rounded to its format (`out`),
    # then widened (`outf`) and stored in the cast's.
    wide = _widened(op)
    if wide is not None:
        rnd, out_t = op.results[0].type, wide.results[0].type
    else:
        out_t = op.results[0].type
    return OpModel(op, "matmul", B=math.prod(sa[:-2]), M=sa[-2], K=sa[-1], N=sb[-2] if trans else sb[-1],
                   fmt=fmt_of(a.type, op), out_fmt=fmt_of(out_t, op),
                   bias=fmt_of(op.operands[2].type, op) if len(op.operands) > 2 else False, batched=batched,
                   b_fmt=quant[0] if quant else fmt_of(b.type, op), colscale=quant[1] if quant else None,
                   round_fmt=fmt_of(rnd, op) if rnd is not None else None,
                   converts=(conv.get("lhs"), conv.get("rhs")),
                   whole=tuple(ir.DenseI64ArrayAttr(op.attributes[SHARE_OF])) if SHARE_OF in op.attributes
                   else None, epi_in=epi_in, epi_temps=epi_temps, sibling=sibling, epi_ops=epi_ops,
                   resident=RESIDENT in op.attributes and ir.BoolAttr(op.attributes[RESIDENT]).value,
                   trans_b=trans, softmax=_softmax_epilogue(op), chain=_chain(op), prologue=_prologue(op))


def _epilogue(op: ir.Operation):
    """The rows.Epilogue of a map whose kernel is `epilogue` (None for any other op)."""
    from spyre_mlir.codegen.kernels.rows import epilogue

    return epilogue(op) if KERNEL in op.attributes and _kernel(op) == "epilogue" else None


def epilogue_source(op: ir.Operation) -> int | None:
    """The operand of an epilogue (a map, a pool2d or a softmax) its producer's output tile stands for (None: op
    is no epilogue)."""
    if op.name in ("spyre.pool2d", "spyre.softmax", "spyre.cast"):
        return 0 if KERNEL in op.attributes and _kernel(op) == "epilogue" else None
    epi = _epilogue(op)
    return None if epi is None else epi.src


def _chain(op: ir.Operation) -> tuple | None:
    """(V's format, dv, result format) of the matmul chained to this one's softmax epilogue (matmul.chained_of),
    or None."""
    from spyre_mlir.codegen.kernels.matmul import chained_of

    pv = chained_of(op)
    return None if pv is None else chain_needs(pv)


def _prologue(op: ir.Operation) -> tuple | None:
    """What the norm prologue a matmul's kernel applies (matmul.prologue_of) needs of its plan, or None."""
    from spyre_mlir.codegen.kernels.matmul import prologue_of

    norm = prologue_of(op)
    return None if norm is None else prologue_needs(norm)


def prologue_needs(norm: ir.Operation) -> tuple:
    """What a norm applied as a matmul's prologue needs of the matmul's plan: (its input's format, its weight and
    bias as (name, format), its row statistics), cost.prologue_buffers with the rows the grid and tile give."""
    from spyre_mlir.codegen.common import _attr

    params = list(zip(("weight", "bias"), list(norm.operands)[1:]))
    if norm.name == "spyre.layernorm":
        seg = _attr(norm, "operandSegmentSizes") or [1, 0, 0]
        rest = list(norm.operands)[1:]
        params = ([("weight", rest.pop(0))] if seg[1] else []) + ([("bias", rest.pop(0))] if seg[2:] and seg[2] else [])
        stats = ("mean", "var")
    else:
        stats = ("ms",)
    return (fmt_of(norm.operands[0].type, norm), tuple((n, fmt_of(v.type, norm)) for n, v in params), stats)


def chain_needs(pv: ir.Operation) -> tuple:
    """What a matmul chained to a softmax epilogue needs of its applier's plan: (V's format, dv, its result's
    format)."""
    return fmt_of(pv.operands[1].type, pv), _shape(pv.results[0])[-1], fmt_of(pv.results[0].type, pv)


def _widened(op: ir.Operation) -> ir.Operation | None:
    """The widening cast the matmul's kernel applies after its epilogue map (rows.widened_by), or None."""
    from spyre_mlir.codegen.kernels.rows import widened_by

    w = widened_by(op)
    return None if w is None else w.operation


def _softmax_epilogue(op: ir.Operation) -> str | None:
    """"safe" / "plain" when the matmul's kernel applies a softmax (rows.softmax_of), else None."""
    from spyre_mlir.codegen.kernels.rows import softmax_of

    sm = softmax_of(op)
    if sm is None:
        return None
    return "safe" if "safe" in sm.attributes and ir.BoolAttr(sm.attributes["safe"]).value else "plain"


def _epilogue_needs(op: ir.Operation) -> tuple[tuple[str, ...], int, str | None, tuple[str, ...]]:
    """(formats of the further inputs of the epilogue a matmul applies whose blocks load with its tiles, the fp32
    temporaries it needs besides the accumulator, the result format of the sibling matmul computing one of its
    inputs (matmul.sibling_of) or None, the SFU classes of its micro-ops)."""
    from spyre_mlir.codegen.kernels.matmul import sibling_of
    from spyre_mlir.codegen.kernels.rows import epilogue_classes, epilogue_of

    found = epilogue_of(op)
    if found is None:
        return (), 0, None, ()
    epi_op, epi = found
    sib = sibling_of(op)
    loaded = [j for i, j in enumerate(epi.extra) if sib is None or i != sib[0]]
    return (tuple(fmt_of(epi_op.operation.operands[j].type, epi_op.operation) for j in loaded), epi.temps - 1,
            None if sib is None else fmt_of(sib[1].results[0].type, op), epilogue_classes(epi))


def _quantized(v: ir.Value, op: ir.Operation) -> tuple[str, str | None] | None:
    """(storage format, per-column scale format or None) when `v` is a quantized weight: the dequantizing
    `spyre.cast` of fp8 / int8 codes, spyre-fold-constants' (a scale operand; per column with `axis`) or, before
    it ran, spyre-reduce-precision's (`scale_mode`, through restickifies and reshapes). The matmul kernel reads
    such a weight in 8 bits and applies the scales on write-back."""
    p = producer(v)
    while p is not None and p.name in ("spyre.transpose", "spyre.reshape") and len(p.operands) == 1:
        p = producer(p.operands[0])
    if p is None or p.name != "spyre.cast" or not ("scale_mode" in p.attributes or
                                                   (len(p.operands) == 2 and is_const_fold(p))):
        return None
    stored = fmt_of(p.operands[0].type, op)
    if stored not in ("fp8_e4m3", "fp8_e5m2", "int8"):
        return None
    per_column = ("axis" in p.attributes if len(p.operands) == 2
                  else ir.StringAttr(p.attributes["scale_mode"]).value == "per-channel")
    return stored, "fp32" if per_column else None


def _conv(op: ir.Operation) -> OpModel:
    k = conv_kernel(op)
    return OpModel(op, "conv", fmt=k.fmt, out_fmt=k.out_fmt, bias=k.bias, conv=k)


def conv_kernel(op: ir.Operation, pool: ir.Operation | None = None) -> cost.ConvKernel:
    """The implicit-GEMM kernel of a conv2d (codegen/kernels/conv.py), with the pool its kernel applies (the
    pool2d whose kernel is `epilogue`, or ``pool``: one it would apply)."""
    x, w = op.operands[0], op.operands[1]
    n, c, h, wd = _shape(x)
    f, _, kh, kw = _shape(w)
    _, _, oh, ow = _shape(op.results[0])
    pad = int_array(op, "padding") or [0, 0, 0, 0]
    strides = int_array(op, "strides") or [1, 1]
    dil = int_array(op, "dilations") or [1, 1]
    # The W padding costs no bytes: the kernel reads the stored columns through a window that zero-pads.
    k = cost.ConvKernel(n=n, f=f, oh=oh, ow=ow, c=c, h=h + pad[0] + pad[2], w=wd, kh=kh, kw=kw,
                        groups=_attr_int(op, "groups", 1), stride_h=strides[0], dil_h=dil[0],
                        fmt=fmt_of(x.type, op), out_fmt=fmt_of(op.results[0].type, op), bias=len(op.operands) > 2,
                        w_fmt=fmt_of(w.type, op) if fmt_of(w.type, op) != fmt_of(x.type, op) else None)
    from spyre_mlir.codegen.kernels.rows import epilogue_classes, epilogue_of

    found = epilogue_of(op)
    if found is not None:
        k = dataclasses.replace(k, epi_ops=epilogue_classes(found[1]))
    if RING_INPUT in op.attributes:
        k = dataclasses.replace(k, patches=k.patches_per_core(int_array(op, GRID), int_array(op, TILE)))
    if pool is None:
        from spyre_mlir.codegen.kernels.conv import pool_of

        pool = pool_of(op)
    if pool is None:
        return k
    return dataclasses.replace(k, pool=tuple(int_array(pool, "kernel")),
                               pool_avg=ir.StringAttr(pool.attributes["kind"]).value == "avg",
                               pool_fmt=fmt_of(pool.results[0].type, pool))


# ---- row-wise ops ------------------------------------------------------------------------------------------

_TRANSCENDENTAL = {"math.exp", "math.exp2", "math.expm1", "math.log", "math.log1p", "math.log2", "math.tanh",
                   "math.erf", "math.powf", "math.sin", "math.cos", "math.atan", "math.atan2", "math.fpowi"}
_RECIPROCAL = {"math.sqrt", "math.rsqrt", "arith.divf", "arith.remf"}
_FREE = {"arith.constant", "spyre.yield"}


def sfu_counts(block: ir.Block) -> dict[str, int]:
    """The SFU work of a map body per element: its ops by cost class (simple, reciprocal, transcendental)."""
    counts = {"simple": 0, "reciprocal": 0, "transcendental": 0}
    for o in block.operations:
        n = o.operation.name
        if n not in _FREE:
            counts["transcendental" if n in _TRANSCENDENTAL else "reciprocal" if n in _RECIPROCAL else "simple"] += 1
    return counts


def _operand(role: str, v: ir.Value, rows: int, op: ir.Operation, streamed: bool = True) -> cost.RowOperand:
    shape = _shape(v)
    numel, cols = math.prod(shape), (shape[-1] if shape else 1)
    elems = -(-numel // rows) if streamed else numel
    return cost.RowOperand(role, max(1, elems), max(1, cols), fmt_of(v.type, op), streamed)


def _rows_model(op: ir.Operation, rows: int, inputs, temps=(), sfu=(), steps=2, chunked=None,
                extra_span: int = 0) -> OpModel:
    """inputs: (role, value, streamed) triples; the result is the streamed operand `out`."""
    ins = tuple(_operand(role, v, rows, op, s) for role, v, s in inputs)
    out = _operand("out", op.results[0], rows, op)
    if chunked is None:
        chunked = tuple(i for i, (_, v, s) in enumerate(inputs) if s and math.prod(_shape(v)) == rows * ins[i].elems)
    k = cost.RowKernel(rows=max(1, rows), inputs=ins, outputs=(out,), temps=tuple(temps), sfu=tuple(sfu),
                       steps=steps, extra_span=extra_span)
    return OpModel(op, "rows", fmt=out.fmt, out_fmt=out.fmt, rows=k, chunked=chunked)


def _lead(shape, axis: int) -> int:
    return math.prod(shape[:axis])


def _fp32_temp(name: str, elems: int, cols: int, first: int, last: int) -> cost.RowTemp:
    return cost.RowTemp(name, max(1, elems), max(1, cols), "fp32", first, last)


def _role(i: int) -> str:
    """Operand roles of a row-wise kernel's buffers: in, inb, inc, ..."""
    return "in" if i == 0 else "in" + chr(ord("a") + i)


def _temp(j: int) -> str:
    """A map temporary's buffer: ta, tb, ... (a name ending in 0/1 would read as a double buffer)."""
    return "t" + chr(ord("a") + j)


def _map_kind(shape, rows: int, cols: int) -> str:
    """How a map kernel reads an operand of ``shape`` for a [rows, cols] result (codegen/kernels/rows.py):
    "full" [tr, C] and "row" [tr, 1] tiles stream with the rows, "col" [1, C] and "scalar" [1, 1] load once."""
    shape = shape or [1]
    lead_bcast = all(s == 1 for s in shape[:-1])
    if shape[-1] == cols and cols != 1:
        return "col" if lead_bcast and rows > 1 else "full"
    if cols == 1:
        return "scalar" if lead_bcast and rows > 1 else "full"
    return "scalar" if lead_bcast else "row"


def _unbuffered(model: OpModel) -> OpModel:
    """A row model whose operands move through no scratchpad buffer (an alias, an epilogue): no instruction of
    its own runs."""
    off = lambda ops: tuple(dataclasses.replace(o, buffered=False) for o in ops)  # noqa: E731
    model.rows = dataclasses.replace(model.rows, inputs=off(model.rows.inputs), outputs=off(model.rows.outputs))
    return model


def _map(op: ir.Operation) -> OpModel:
    from spyre_mlir.codegen.sfu import NotOnSfu, live_temps, translate

    rs = _shape(op.results[0]) or [1]
    rows, cols = math.prod(rs[:-1]), rs[-1]
    if _kernel(op) == "alias":
        # Its input's rows repeated, read in place (rows.repeated_rows): no scratchpad, not its operand's rows.
        return _unbuffered(_rows_model(op, rows, [("in", op.operands[0], True)], chunked=()))
    epi = _epilogue(op)
    if epi is not None:
        # Applied by its producer's kernel: nothing moves through a scratchpad of its own; its inputs are read as
        # a whole (not in row blocks), so their writers are behind a barrier before the producer reads them.
        return _unbuffered(_rows_model(op, rows, [("in", op.operands[epi.src], True)], chunked=()))
    ins, kinds, chunked = [], [], []
    for i, v in enumerate(op.operands):
        kind = _map_kind(_shape(v), rows, cols)
        kinds.append(kind)
        width = cols if kind in ("full", "col") else 1
        ins.append(cost.RowOperand(_role(i), width, width, fmt_of(v.type, op), kind in ("full", "row")))
        if kind == "full" and (_shape(v) or [1]) == rs:
            chunked.append(i)
    counts = sfu_counts(op.regions[0].blocks[0])
    if not any(counts.values()):
        counts["simple"] = 1            # a copy or a fill still passes through the SFU
    try:
        sfu_ops, result, _ = translate(op.regions[0].blocks[0], kinds)
        nslots = live_temps(sfu_ops, result)[1]
    except NotOnSfu:
        nslots = 0                       # not an SFU body: the op runs on the host
    temps = [_fp32_temp(_temp(j), cols, cols, 1, 2) for j in range(nslots)]
    out = cost.RowOperand("out", cols, cols, fmt_of(op.results[0].type, op))
    k = cost.RowKernel(rows=max(1, rows), inputs=tuple(ins), outputs=(out,), temps=tuple(temps),
                       sfu=tuple((c, n) for c, n in counts.items() if n), steps=3)
    return OpModel(op, "rows", fmt=out.fmt, out_fmt=out.fmt, rows=k, chunked=tuple(chunked))


def _reduce(op: ir.Operation) -> OpModel:
    """Rows of the reduced suffix: [tr, C] input tiles, an fp32 row result `rt` [tr, 1], the result [tr, 1].
    Reduced outer dims (mid > 1) are combined elementwise into `acc` [tr, C] fp32 from rows gathered inside the
    work, so nothing is prefetched."""
    x = op.operands[0]
    xs = _shape(x) or [1]
    dims = sorted(d % len(xs) for d in int_array(op, "dims"))
    cols = xs[-1]
    mid = math.prod(xs[dims[0]:-1]) if len(xs) > 1 else 1
    rows = _lead(xs, dims[0])
    temps = [_fp32_temp("rt", 1, 1, 1, 2)] + ([_fp32_temp("acc", cols, cols, 1, 2)] if mid > 1 else [])
    k = cost.RowKernel(rows=max(1, rows), inputs=(cost.RowOperand("in", cols, cols, fmt_of(x.type, op)),),
                       outputs=(cost.RowOperand("out", 1, 1, fmt_of(op.results[0].type, op)),),
                       temps=tuple(temps), sfu=(("simple", mid),), steps=3, prefetch=mid == 1)
    return OpModel(op, "rows", fmt=k.outputs[0].fmt, out_fmt=k.outputs[0].fmt, rows=k,
                   chunked=(0,) if mid == 1 else ())


def _softmax(op: ir.Operation) -> OpModel:
    x = op.operands[0]
    xs = _shape(x)
    if _kernel(op) == "epilogue":
        # Applied by the matmul kernel producing its input (its softmax): like an epilogue map.
        return _unbuffered(_rows_model(op, _lead(xs, len(xs) - 1), [("in", x, True)], chunked=()))
    a = _attr_int(op, "dim", -1) % len(xs)
    rows, e = _lead(xs, a), math.prod(xs[a:])
    red = e // xs[a]
    rc = xs[-1] if a < len(xs) - 1 else 1
    # steps: 0 load, 1 cast to fp32, 2 max, 3 subtract, 4 exp, 5 sum, 6 reciprocal, 7 scale, 8 cast, 9 store
    temps = [_fp32_temp("xf", e, xs[-1], 1, 8), _fp32_temp("max", red, rc, 2, 3), _fp32_temp("sum", red, rc, 5, 7)]
    simple = 6
    if "safe" in op.attributes and ir.BoolAttr(op.attributes["safe"]).value:
        # A row of -inf only gives zeros: a live-row mask from the max, which selects max and 1/sum.
        temps.append(_fp32_temp("live", red, rc, 2, 7))
        simple += 3
    return _rows_model(op, rows, [("in", x, True)], temps, [("simple", simple), ("transcendental", 1)], steps=9)


def _applied_norm(op: ir.Operation) -> OpModel | None:
    """A norm applied by the matmul kernel reading its result (kernel `prologue`, matmul.prologue_of): nothing of
    its own moves through a scratchpad, and its input is read as a whole by that kernel."""
    if _kernel(op) != "prologue":
        return None
    xs = _shape(op.operands[0])
    return _unbuffered(_rows_model(op, _lead(xs, len(xs) - 1), [("in", op.operands[0], True)], chunked=()))


def _layernorm(op: ir.Operation) -> OpModel:
    applied = _applied_norm(op)
    if applied is not None:
        return applied
    x = op.operands[0]
    xs = _shape(x)
    a = _attr_int(op, "axis", -1) % len(xs)
    rows, e, cols = _lead(xs, a), math.prod(xs[a:]), xs[-1]
    params = [(role, v, False) for role, v in zip(("weight", "bias"), list(op.operands)[1:])]
    # steps: 0 load, 1 cast, 2 mean, 3 subtract, 4 square, 5 mean, 6 +eps, 7 rsqrt, 8 scale, 9 *w, 10 +b,
    # 11 cast, 12 store. mean (2-3) and sq (4-5) never live together, so they share bytes.
    temps = [_fp32_temp("xf", e, cols, 1, 11), _fp32_temp("mean", 1, 1, 2, 3), _fp32_temp("sq", e, cols, 4, 5),
             _fp32_temp("var", 1, 1, 5, 8)]
    return _rows_model(op, rows, [("in", x, True)] + params, temps, [("simple", 9)], steps=12)


def _rmsnorm(op: ir.Operation) -> OpModel:
    applied = _applied_norm(op)
    if applied is not None:
        return applied
    x = op.operands[0]
    xs = _shape(x)
    rows, cols = _lead(xs, len(xs) - 1), xs[-1]
    params = [("weight", v, False) for v in list(op.operands)[1:]]
    # steps: 0 load, 1 cast, 2 square, 3 mean, 4 +eps, 5 rsqrt, 6 scale, 7 *w, 8 cast, 9 store. The squares'
    # tile is the work tile after their mean (rows.norm_body).
    temps = [_fp32_temp("sq", cols, cols, 2, 8), _fp32_temp("ms", 1, 1, 3, 6)]
    return _rows_model(op, rows, [("in", x, True)] + params, temps, [("simple", 7)], steps=9)


def _cast(op: ir.Operation) -> OpModel:
    rs = _shape(op.results[0])
    rows = _lead(rs, len(rs) - 1)
    if _kernel(op) == "epilogue":
        # Applied by the matmul kernel producing its input (rows.cast_source): like an epilogue map.
        return _unbuffered(_rows_model(op, rows, [("in", op.operands[0], True)], chunked=()))
    inputs = [("in", op.operands[0], True)] + [("scale", v, False) for v in list(op.operands)[1:]]
    return _rows_model(op, rows, inputs, sfu=[("simple", 1)])


def _movement(op: ir.Operation) -> OpModel:
    """transpose, reshape, slice, concat, as their `spyre.kernel` moves them (codegen/kernels/move.py):

    * `alias`, a reshape whose result has its operand's bytes: no scratchpad; its rows split like a row-wise
      op's. One that splits or merges whole sticks of the innermost dim has rows of another width, so its row
      blocks are not its operand's: it reads it on no particular cores (a barrier after the producer);
    * `restick`, a transpose of the last two dims: a RESTICK in device memory on one core (no scratchpad);
    * `dma-rows`, whole rows (a transpose keeping the innermost dim, a slice or concat of whole sticks): gathered
      by DMA straight into the output tiles `out0 out1`;
    * `select-cols`, selection matmuls inside the innermost dim: the 0/1 matrices stacked in `sel`, loaded once;
      per row tile and group, each term's source rows gathered into `in0`, `inb0`... (all into `in0`, term after
      term, when they read one operand: move.merged_terms), multiplied into the fp32 `acc` and rounded into
      `out0`. Loads happen inside the work (a gather per group); with `spyre.ring_input` (a flatten of a conv's
      rows, spyre-chain-convs) `in0` holds every row tile of the core, filled over the ring, and nothing loads."""
    rs = _shape(op.results[0])
    rows = _lead(rs, len(rs) - 1)
    kernel = _kernel(op)
    if kernel == "restick":
        return OpModel(op, "rows", rows=cost.RowKernel(rows=1, inputs=(), outputs=()), chunked=())
    if kernel == "alias":
        # Its rows split like its neighbours' (so no barrier), nothing moves through a scratchpad.
        from spyre_mlir.codegen.kernels.move import same_innermost

        # A slice's rows start inside its operand's: not its operand's row blocks.
        return _unbuffered(_rows_model(op, rows, [("in", op.operands[0], True)],
                                       chunked=None if op.name == "spyre.reshape" and same_innermost(op) else ()))
    if kernel == "dma-rows":
        out = cost.RowOperand("out", rs[-1], rs[-1], fmt_of(op.results[0].type, op))
        ins = tuple(dataclasses.replace(_operand(_role(i), v, rows, op), buffered=False)
                    for i, v in enumerate(op.operands))
        k = cost.RowKernel(rows=max(1, rows), inputs=ins, outputs=(out,))
        return OpModel(op, "rows", fmt=out.fmt, out_fmt=out.fmt, rows=k, chunked=())
    return _select_cols(op)


def _select_cols(op: ir.Operation) -> OpModel:
    from spyre_mlir.codegen.kernels.move import col_terms, merged_terms, out_width, ring_slots, term_cols

    groups = col_terms(op)
    if groups is None:
        raise PassError(f"'{op.name}' has no selection-matmul form", op.location)
    fmt = fmt_of(op.results[0].type, op)
    cout = out_width(op)
    mats = [p for _, terms in groups for _, _, p in terms]
    sels = (cost.RowOperand("sel", sum(p.size for p in mats), cout, fmt, streamed=False),)    # one load
    cols = term_cols(op, groups)
    merged = merged_terms(groups)
    # Terms gathered together (one tile, one DMA) or each into its own tile.
    # With spyre.ring_input (spyre-chain-convs) `in0` holds every row tile of the core at once.
    slots = ring_slots(int_array(op, GRID), int_array(op, TILE), len(groups[0][0])) if RING_INPUT in op.attributes \
        else 1
    ins = ((cost.RowOperand("in", slots * merged * cols[0], cols[0], fmt),) if merged else
           tuple(cost.RowOperand(_role(t), c, c, fmt) for t, c in enumerate(cols)))
    k = cost.RowKernel(rows=len(groups[0][0]), inputs=ins + sels, outputs=(cost.RowOperand("out", cout, cout, fmt),),
                       temps=(_fp32_temp("acc", cout, cout, 1, 2),), sfu=(("simple", len(mats)),), steps=3,
                       prefetch=False)
    return OpModel(op, "rows", fmt=fmt, out_fmt=fmt, rows=k, chunked=())


def _pool(op: ir.Operation) -> OpModel:
    """Output rows (n, c, oh): per window row i the input rows are gathered into `in0` [tr, W]; each window
    column j selects its columns with a 0/1 matrix [W, OW] (all KW stacked in `sel`, loaded once) into `ct`
    [tr, OW] fp32, combined into `res` [tr, OW] fp32; the result `out0` [tr, OW]. Loads happen inside the work."""
    x = op.operands[0]
    n, c, _, w = _shape(x)
    _, _, oh, ow = _shape(op.results[0])
    if _kernel(op) == "epilogue":
        # Applied by the conv kernel producing its input (conv_kernel's pool): like an epilogue map.
        return _unbuffered(_rows_model(op, n * c * oh, [("in", x, True)], chunked=()))
    kh, kw = int_array(op, "kernel")
    fmt, out_fmt = fmt_of(x.type, op), fmt_of(op.results[0].type, op)
    sels = (cost.RowOperand("sel", kw * w * ow, ow, fmt, streamed=False),)
    k = cost.RowKernel(rows=n * c * oh, inputs=(cost.RowOperand("in", w, w, fmt),) + sels,
                       outputs=(cost.RowOperand("out", ow, ow, out_fmt),),
                       temps=(_fp32_temp("ct", ow, ow, 1, 2), _fp32_temp("res", ow, ow, 1, 2)),
                       sfu=(("simple", kh * kw),), steps=3, prefetch=False)
    return OpModel(op, "rows", fmt=out_fmt, out_fmt=out_fmt, rows=k, chunked=())


def _gather(op: ir.Operation) -> OpModel:
    """Output rows [indices, D] in row tiles (`out0`): per run of indices inside one stick, that stick loads into
    `idx` (one stick) and a GATHER copies the rows it picks straight into the tile (the table, read in place, is
    the extra span every core addresses and its rows' bytes the tile's loads); nothing is prefetched."""
    table, ids = op.operands
    rows = math.prod(_shape(ids) or [1])
    d = _shape(table)[-1]
    tfmt = fmt_of(table.type, op)
    per = 32                             # a stick of int32 indices (int64 ones fill it at half the count)
    k = cost.RowKernel(rows=max(1, rows),
                       inputs=(cost.RowOperand("table", d, d, tfmt, buffered=False),
                               cost.RowOperand("idx", per, per, "int32", streamed=False)),
                       outputs=(_operand("out", op.results[0], rows, op),), steps=2,
                       extra_span=cost.tile_bytes(_shape(table)[0], d, tfmt), prefetch=False)
    return OpModel(op, "rows", fmt=tfmt, out_fmt=tfmt, rows=k, chunked=())


_MODELS = {
    "matmul": _matmul, "batch_matmul": _matmul, "conv2d": _conv, "map": _map, "reduce": _reduce,
    "softmax": _softmax, "layernorm": _layernorm, "rmsnorm": _rmsnorm, "cast": _cast, "transpose": _movement,
    "reshape": _movement, "slice": _movement, "concat": _movement,
    "pool2d": _pool, "gather": _gather,
}


# ---- An op's grid and tile -------------------------------------------------------------------------------------


def buffers(model: OpModel, grid: list[int], tile: list[int], nbuf: int) -> list[cost.Buffer]:
    """The buffers of an op's kernel on `grid` in `tile` with `nbuf` buffers per streamed operand."""
    if model.kind == "matmul":
        gk = model.grid4(grid)[3]
        return cost.matmul_buffers(tile[-3:], model.fmt, model.out_fmt, nbuf=nbuf, split_k=gk, bias=model.bias,
                                   b_fmt=model.b_fmt, round_fmt=model.round_fmt, colscale=model.colscale,
                                   epi_in=model.epi_in, resident=_resident(model, grid, tile),
                                   trans_b=model.trans_b, softmax=model.softmax, epi_temps=model.epi_temps,
                                   sibling=model.sibling, chain=model.chain,
                                   prologue=_prologue_plan(model, grid, tile))
    if model.kind == "conv":
        return cost.conv_buffers(model.conv, tile, nbuf)
    return cost.rowwise_buffers(model.rows, tile[0], nbuf)


def _resident(model: OpModel, grid: list[int], tile: list[int]) -> tuple[int, int] | None:
    """A matmul's resident A (cost.matmul_buffers): (part rows, K steps), or None."""
    if not model.resident:
        return None
    _, gm, gn, gk = model.grid4(grid)
    if gk > 1 or gm * gn == 1:
        raise PassError(f"{RESIDENT} needs an M/N split without a K split (grid {list(grid)})", model.op.location)
    tm, _, tk = tile[-3:]
    return -(-tm // gn), -(-(model.K // gk) // tk)


def _prologue_plan(model: OpModel, grid: list[int], tile: list[int]) -> tuple | None:
    """A matmul's norm prologue as cost.prologue_buffers takes it (its rows from the grid and tile), or None."""
    if model.prologue is None:
        return None
    return (cost.prologue_rows(model.grid4(grid)[1:], tile[-3:]), *model.prologue)


def plan(model: OpModel, grid: list[int], tile: list[int], target: Target
         ) -> tuple[int, list[cost.Buffer]] | None:
    """(buffer count, buffers) of an op's kernel on `grid` in `tile`: the one description of its scratchpad use
    that spyre-tile fits and spyre-allocate-scratchpad places. None when it does not fit."""
    if model.kind == "matmul":
        gb, gm, gn, gk = model.grid4(grid)
        tm, tn, tk = tile[-3:]
        return cost.matmul_plan(*model.block(grid, target), (tm, tn, tk), target, model.fmt,
                                model.out_fmt, batch=model.B // gb, split_k=gk, bias=model.bias,
                                b_fmt=model.b_fmt, round_fmt=model.round_fmt, colscale=model.colscale,
                                epi_in=model.epi_in, resident=_resident(model, grid, tile),
                                trans_b=model.trans_b, softmax=model.softmax, epi_temps=model.epi_temps,
                                sibling=model.sibling, chain=model.chain,
                                prologue=_prologue_plan(model, grid, tile))
    if model.kind == "conv":
        return cost.conv_plan(model.conv, grid, tile, target)
    return cost.rows_plan(model.rows, grid[0], tile[0], target)


def check_rank(model: OpModel, values: list[int], attr: str) -> None:
    """`values` has one positive size per dimension of the op's iteration space; a grid splits it evenly."""
    want = {"matmul": 4 if model.batched else 3, "conv": 3}.get(model.kind, 1)
    if len(values) != want or min(values) < 1:
        raise PassError(f"{attr} of '{model.op.name}' must be {want} positive sizes, got {values}", model.op.location)
    if attr != GRID:
        return
    if model.kind == "matmul":
        # N may split ragged (OpModel.block checks it with the target's sticks).
        dims = (model.B, model.M, 1, model.K)[-want:]
        values = list(values[:-2]) + [1, values[-1]]
    elif model.kind == "conv":
        dims = (model.conv.n, model.conv.f, model.conv.oh)
    else:
        dims = (model.rows.rows,)
    if any(d % g for d, g in zip(dims, values)):
        raise PassError(f"{attr} {values} does not split the {'x'.join(map(str, dims))} iteration space of "
                        f"'{model.op.name}' evenly", model.op.location)


# A fused op keeps the K tile of the op alone unless that costs it more than this fraction over its own best tile:
# results stay bit-identical to the unfused program wherever that is nearly free.
KEEP_K_SLACK = 0.05


def reference_k_tile(model: OpModel, grid, target: Target, force=(None, None, None)) -> int | None:
    """For a matmul with conversions spyre-fuse folded into it or a sibling computed beside it, the K tile of
    the op alone on ``grid`` (which fixes the order of the fp32 accumulation, so results stay bit-identical):
    spyre-tile keeps it, and the cost of the op is that of a tile with it. None for any other op, when the op
    alone has no tile, or when keeping its K tile would cost an op with conversions folded into it (and no
    sibling) more than KEEP_K_SLACK over the best tile of its own (its fp32 operands may not fit the scratchpad
    in the op alone's tile): the op then chooses its K tile freely, and its results are within a rounding of
    the unfused program's."""
    if model.kind != "matmul" or not (model.fused or model.sibling):
        return None
    gb, gm, gn, gk = model.grid4(grid)
    block = model.block(grid, target)
    ragged = block[1] * gn != model.N or model.softmax is not None
    mn = (force[0], block[1] if ragged else force[1])
    ref = model.reference()
    kw = dict(batch=model.B // gb, split_k=gk, bias=model.bias, active=gb * gm * gn * gk, grid=(gm, gn),
              colscale=model.colscale, epi_in=model.epi_in, trans_b=model.trans_b, epi_temps=model.epi_temps)
    fit = cost.best_tile(*block, target, ref.fmt, ref.out_fmt, force=(*mn, force[2]), b_fmt=ref.b_fmt, **kw)
    if fit is None:
        return None
    tk = fit[0][2]
    if model.sibling:
        return tk           # bit-identical to the two kernels apart, which spyre-siblings weighs it against
    kw.update(b_fmt=model.b_fmt, round_fmt=model.round_fmt, softmax=model.softmax, sibling=model.sibling)
    kept, free = (cost.best_tile(*block, target, model.fmt, model.out_fmt, force=(*mn, k), **kw)
                  for k in (tk, force[2]))
    if kept is None or free is None:
        return tk if kept is not None else None

    def cycles(f):
        return matmul_cycles(model, grid, f[0], target, f[1] == 2, resident=f[2] is not None).total

    return tk if cycles(kept) <= (1 + KEEP_K_SLACK) * cycles(free) else None


def matmul_cycles(model: OpModel, grid, tile, target: Target, double_buffer: bool, resident: bool = False
                  ) -> cost.Cycles:
    """The modeled cycles of matmul ``model`` on ``grid`` in ``tile``, its norm prologue's SFU work included."""
    grid4 = model.grid4(grid)
    pro = 0.0
    if model.prologue is not None:
        pro = cost.prologue_sfu(cost.prologue_rows(grid4[1:], tile[-3:]), model.K, len(model.prologue[2]), target)
    return cost.matmul_cycles(model.M, model.N, model.K, grid4, tile[-3:], target, model.fmt, model.out_fmt,
                              batch=model.B, bias=model.bias, double_buffer=double_buffer, b_fmt=model.b_fmt,
                              round_fmt=model.round_fmt, epi_in=model.epi_in, resident=resident,
                              trans_b=model.trans_b, softmax=model.softmax, sibling=model.sibling, prologue=pro,
                              **model.finish)


def planned_cycles(op: ir.Operation, target: Target) -> cost.Cycles:
    """The modeled cycles of device op ``op`` on the grid and tile its plan holds (spyre-divide-work, spyre-tile,
    spyre-schedule's double buffering)."""
    model = op_model(op)
    grid, tile = (list(ir.DenseI64ArrayAttr(op.attributes[a])) for a in (GRID, TILE))
    double = DOUBLE_BUFFER in op.attributes and ir.BoolAttr(op.attributes[DOUBLE_BUFFER]).value
    if model.kind == "matmul":
        return matmul_cycles(model, grid, tile, target, double, resident=RESIDENT in op.attributes)
    if model.kind == "conv":
        return cost.conv_cycles(model.conv, grid, tile, target, double)
    return cost.rowwise_cycles(model.rows, grid, tile, target, double)


# Kernels that run no instruction of their own: a view of an operand's bytes, or applied by another op's kernel.
_APPLIED = ("alias", "epilogue", "sibling", "chained", "prologue")


def best_cycles(model: OpModel, cores: int, target: Target) -> cost.Cycles | None:
    """The modeled cycles of `model` on the grid spyre-divide-work would choose over `cores` cores, in the tile
    spyre-tile would choose (None when no division fits): what one card spends on the op."""
    grid = model.best_grid(cores, target)
    if grid is None:
        return None
    if KERNEL in model.op.attributes and _kernel(model.op) in _APPLIED:
        return cost.Cycles()                # a view of its operand's bytes / applied by its producer's kernel
    if model.kind == "matmul":
        gb, gm, gn, gk = model.grid4(grid)
        mb, nb, kb = model.block(grid, target)
        fit = cost.best_tile(mb, nb, kb, target, model.fmt, model.out_fmt,
                             batch=model.B // gb, split_k=gk, bias=model.bias, active=gb * gm * gn * gk,
                             grid=(gm, gn), b_fmt=model.b_fmt, round_fmt=model.round_fmt, colscale=model.colscale,
                             epi_in=model.epi_in,
                             force=(None, nb if nb * gn != model.N or model.softmax else None,
                                    reference_k_tile(model, grid, target)),
                             trans_b=model.trans_b, softmax=model.softmax, epi_temps=model.epi_temps,
                             sibling=model.sibling)
        if fit is None:
            return None
        return matmul_cycles(model, grid, fit[0], target, fit[1] == 2, resident=fit[2] is not None)
    if model.kind == "conv":
        fit = cost.best_conv_tile(model.conv, grid, target)
        return None if fit is None else cost.conv_cycles(model.conv, grid, fit[0], target, fit[1] == 2)
    fit = cost.best_rows_tile(model.rows, grid[0], target)
    return None if fit is None else cost.rowwise_cycles(model.rows, grid, fit[0], target, fit[1] == 2)
