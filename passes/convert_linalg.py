"""spyre-convert-linalg: linalg-on-tensors (as torch-mlir emits it) to spyre graph ops.

The pass runs in three sweeps over the ops of the module, each a table of op name -> converter. A converter
either replaces its op or leaves it unchanged and returns a short reason, which the pass stores on the op as
`spyre.unconverted = "<reason>"` so that `spyre-place-host` can say why the op stays on the host.

1. Compute ops (matmuls, convolutions, pooling, `linalg.generic`). They run first so that they still see the
   tensor-level producers they fold: a zero `tensor.pad` becomes the conv's `padding`, a `linalg.broadcast`
   init its bias, a `linalg.transpose` rhs the matmul's `transpose_rhs`.
2. Data movement (transpose, broadcast, reshapes, slices, concat, pad, fill). Ops left without uses by the first
   sweep (folded pads, broadcast biases, zero fills) are erased instead.
3. Fusion over the spyre ops just produced: `sum / N` becomes a `mean` reduce, `matmul + bias` a matmul with bias,
   and the chains torch-mlir emits for softmax, F.layer_norm and RMSNorm (`x * rsqrt(mean(x^2) + eps) * w`)
   become `spyre.softmax`, `spyre.layernorm` and `spyre.rmsnorm`.

Every new op gets the location `loc("<source op name>"(<source location>))`, so the placement report and the IR
say which linalg op each spyre op came from.

Coverage (source op -> spyre op; "host" means left for `spyre-place-host`, with the reason it records):

| source op                                        | spyre op                                                 |
|--------------------------------------------------|----------------------------------------------------------|
| linalg.matmul / linalg.batch_matmul              | spyre.matmul / spyre.batch_matmul (`transpose_rhs` when the rhs transposes its last two dims, also behind a collapse of batch dims; a non-zero init is added with a spyre.map) |
| linalg.conv_2d_nchw_fchw                         | spyre.conv2d (strides, dilations; zero `tensor.pad` -> padding; broadcast init -> bias) |
| linalg.depthwise_conv_2d_nchw_chw                | spyre.conv2d groups = C, filter [C,KH,KW] viewed as [C,1,KH,KW] |
| linalg.conv_2d_ngchw_gfchw (groups > 1)          | spyre.conv2d groups = G, input/filter/result reshaped between 5-D and 4-D (bias as above) |
| linalg.pooling_nchw_max                          | spyre.pool2d kind = max (-inf `tensor.pad` -> padding); dilated pooling -> host |
| linalg.pooling_nchw_sum + divf by KH*KW          | spyre.pool2d kind = avg (zero pad -> padding, count_include_pad); a bare sum pool -> host |
| linalg.softmax                                   | spyre.softmax                                            |
| linalg.generic, all parallel                     | spyre.map (<= 4 inputs; arith/math bodies incl. extf/truncf/sitofp); int64/index element types, cf.assert, linalg.index, tensor.extract bodies -> host |
| linalg.generic, reduction (sum/max/min/prod)     | spyre.reduce (dims, keepdim); a non-identity init is combined with a spyre.map; argmax results used -> host |
| linalg.generic, i1 reduction by andi / ori       | uitofp map, spyre.reduce min / max, fptoui map (all / any, e.g. SDPA's fully-masked-row test) |
| linalg.generic embedding (tensor.extract rows)   | spyre.gather (the index bounds asserts are dropped: the gather clamps on device) |
| linalg.transpose                                 | spyre.transpose                                          |
| linalg.broadcast                                 | spyre.reshape (unit dims only) or spyre.reshape + identity spyre.map |
| linalg.fill (not folded into an init)            | spyre.map fill (no inputs); a non-constant fill value -> host |
| tensor.expand_shape / collapse_shape / reshape   | spyre.reshape (of a tensor.empty: a new tensor.empty)    |
| tensor.extract_slice (static)                    | spyre.slice (+ spyre.reshape when rank-reducing); dynamic -> host |
| tensor.concat                                    | chain of binary spyre.concat                             |
| tensor.pad (constant float value)                | spyre.pad; non-constant or integer pad -> host            |
| tensor.insert_slice                              | into a splat constant: spyre.pad; a chain filling a tensor.empty along one dim: spyre.concat; else host |
| chains: sum -> divf N                            | spyre.reduce kind = mean                                 |
| chains: matmul -> map addf bias[N]               | spyre.matmul with bias                                   |
| chains: max, sub, exp, sum, div                  | spyre.softmax                                            |
| chains: select(min(x == -inf), 0, softmax(x))    | spyre.softmax {safe = true} (PyTorch's _safe_softmax)    |
| chains: mean, sub, (f64) variance, +eps, rsqrt, mul, (w), (b) | spyre.layernorm                             |
| chains: x^2, mean, +eps, rsqrt, mul, (w)         | spyre.rmsnorm                                            |
| tensor.extract, scf/cf ops, linalg.index math   | host                                                     |

Int64 index data (positions, masks built from them, argmax results) stays on the host as a whole: elementwise
maps and all data movement (reshapes, slices, fills...) of int64 tensors are declined, so index math does not
bounce between host and device.
`acc_type` of the fused softmax and norms is the input's element type: torch-mlir computes the layer-norm
variance in f64, which the device does not have; it accumulates in f32 at most.
"""

import dataclasses
import math

from torch_mlir import ir
from torch_mlir.dialects import arith

from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import UNCONVERTED_ATTR, clone_mapped, non_device_type, producer
from spyre_mlir.passes.base import SpyrePass

INT64_MOVEMENT = "int64 index math (int64 index data is reshaped, sliced and filled on the host)"
_DYN = ir.ShapedType.get_dynamic_size()


@dataclasses.dataclass
class ConvertLinalgPass(SpyrePass):
    NAME = "spyre-convert-linalg"
    SUMMARY = "Convert linalg-on-tensors ops to spyre graph ops"

    def run(self, module: ir.Operation) -> None:
        for table in (_PATTERNS, _MOVEMENT):
            for op in _collect(module, table):
                if table is _MOVEMENT and _unused(op):
                    op.erase()
                    continue
                bad = non_device_type(op)
                if bad == "f64" and op.name == "linalg.generic" and _norm_arith(op):
                    bad = ""   # layer-norm variance chains are f64: fusion makes them f32 norms; spyre-place-host
                    #            sends what stays f64 to the host
                if bad:
                    why = f"{bad} has no device format"
                elif table is _MOVEMENT and any(_is_int64(_elt(r)) for r in op.results if _static_tensor(r)):
                    why = INT64_MOVEMENT  # moving index data to the device would only bounce it back
                else:
                    why = table[op.name](op)
                if why:
                    op.attributes[UNCONVERTED_ATTR] = ir.StringAttr.get(why)
        # Last op first: a chain is matched from its end, before its own prefix could match a shorter pattern.
        # A fusion replaces its root and erases the root's dead producer chain (it returns the erased ops, which
        # the scan then skips); the ops after the root are untouched and were tried. A fusion can make an op it
        # passed match (its producer became the op the pattern looks for): scans repeat until one finds nothing.
        # (Collecting the ops again after each fusion made the pass quadratic: 206 walks of a 32-layer model.)
        for fuse in _FUSIONS:
            while True:
                gone: set = set()
                ops = _collect(module, ("spyre.map",))[::-1]
                for key, op in [(hash(op.operation), op) for op in ops]:        # keys while all are valid
                    if key not in gone:
                        gone.update(fuse(op) or ())
                if not gone:
                    break


_NORM_ARITH = ("arith.extf", "arith.truncf", "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "math.sqrt",
               "math.rsqrt", "arith.constant", "linalg.yield")


def _norm_arith(op: ir.Operation) -> bool:
    """A generic whose body only holds the arithmetic of a norm's statistics (what its f64 variance uses)."""
    return all(o.operation.name in _NORM_ARITH for o in op.regions[0].blocks[0].operations)


def _collect(module: ir.Operation, names) -> list[ir.Operation]:
    """The ops named ``names``, in order; their bodies are not searched (scalar ops only)."""
    todo: list[ir.Operation] = []

    def visit(op):
        if op.name in names:
            todo.append(op)
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return todo


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _producer(v: ir.Value, *names: str) -> ir.Operation | None:
    op = producer(v)
    return op if op is not None and op.name in names else None


def _unused(op: ir.Operation) -> bool:
    return all(not list(r.uses) for r in op.results)


def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _elt(v: ir.Value) -> ir.Type:
    return ir.RankedTensorType(v.type).element_type


def _static_tensor(v: ir.Value) -> bool:
    return isinstance(v.type, ir.RankedTensorType) and _DYN not in ir.RankedTensorType(v.type).shape


def _is_int64(t: ir.Type) -> bool:
    return isinstance(t, ir.IndexType) or (isinstance(t, ir.IntegerType) and ir.IntegerType(t).width == 64)


def _origin(op: ir.Operation, what: str | None = None) -> ir.Location:
    """`loc("linalg.conv_2d_nchw_fchw"(<op's location>))`: keeps the source position and names the source op."""
    return ir.Location.name(what or op.name, childLoc=op.location)


def _ints(attr) -> list[int]:
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(attr)
    if isinstance(attr, ir.DenseIntElementsAttr):
        return [attr[i] for i in range(len(attr))]
    return [ir.IntegerAttr(a).value for a in ir.ArrayAttr(attr)]


def _i64s(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(x) for x in values])


def _scalar_const(v: ir.Value) -> float | int | None:
    """The value of a scalar arith.constant, looking through extf/truncf (torch-mlir truncates f64 epsilons)."""
    op = producer(v)
    if op is None:
        return None
    if op.name in ("arith.extf", "arith.truncf"):
        return _scalar_const(op.operands[0])
    if op.name != "arith.constant" or isinstance(v.type, ir.ShapedType):
        return None
    a = op.attributes["value"]
    if isinstance(a, ir.FloatAttr):
        return ir.FloatAttr(a).value
    if isinstance(a, ir.BoolAttr):
        return int(ir.BoolAttr(a).value)
    if isinstance(a, ir.IntegerAttr):
        return ir.IntegerAttr(a).value
    return None


def _fill_value(v: ir.Value) -> float | int | None:
    """The constant a linalg.fill (or a spyre.map fill) writes into `v`, or None."""
    op = producer(v)
    if op is None:
        return None
    if op.name == "linalg.fill":
        return _scalar_const(op.operands[0])
    if op.name == "spyre.map" and not list(op.operands):
        y = list(op.regions[0].blocks[0].operations)[-1]
        return _scalar_const(y.operands[0])
    return None


def _is_zero_fill(v: ir.Value) -> bool:
    return _fill_value(v) == 0


def _replace(old: ir.Operation, new: ir.Value) -> None:
    old.results[0].replace_all_uses_with(new)
    old.erase()


def _erase_dead(v: ir.Value) -> list[int]:
    """Erase the producer of `v` (and its producers, recursively) when a fold left it without uses; the erased
    ops' keys (:func:`_done`)."""
    work, erased, ops = [v], set(), []
    while work:
        v = work.pop()
        if v in erased:  # a value reached twice (a diamond, or map(%x, %x)): its op is already gone
            continue
        op = producer(v)
        if op is None or not _unused(op) or op.name in ("func.func", "arith.constant") or \
                not op.name.startswith(("spyre.", "linalg.", "tensor.")):
            continue
        work.extend(op.operands)
        erased.update(op.results)
        ops.append(hash(op.operation))
        op.erase()
    return ops


def _reshape(v: ir.Value, shape: list[int]) -> ir.Value:
    """`v` with `shape`: `v` itself, the source of the reshape that produced `v`, or a new spyre.reshape."""
    if _shape(v) == list(shape):
        return v
    src = _producer(v, "spyre.reshape", "tensor.expand_shape", "tensor.collapse_shape")
    if src is not None and _shape(src.operands[0]) == list(shape):
        return src.operands[0]
    return spyre.ReshapeOp(v, ir.RankedTensorType.get(shape, _elt(v))).result


def _binary_map(lhs: ir.Value, rhs: ir.Value, name: str, t: ir.Type) -> ir.Value:
    """A spyre.map computing `name`(lhs, rhs) elementwise (rhs broadcasting), e.g. an init added to a result."""
    m = spyre.MapOp(t, in0=lhs, in1=rhs)
    block = m.body.blocks.append(_elt(lhs), _elt(rhs))
    with ir.InsertionPoint(block):
        r = ir.Operation.create(name, results=[ir.RankedTensorType(t).element_type],
                                operands=list(block.arguments)).result
        spyre.YieldOp(r)
    return m.result


def _cast_map(x: ir.Value, elt: ir.Type, cast: str) -> ir.Value:
    """A spyre.map converting `x` elementwise to `elt` with the arith cast op `cast`."""
    m = spyre.MapOp(ir.RankedTensorType.get(_shape(x), elt), in0=x)
    block = m.body.blocks.append(_elt(x))
    with ir.InsertionPoint(block):
        spyre.YieldOp(ir.Operation.create(cast, results=[elt], operands=[block.arguments[0]]).result)
    return m.result


def _add_init(result: ir.Value, init: ir.Value) -> ir.Value:
    """result + init as a spyre.map, for contractions whose accumulator is not zero."""
    name = "arith.addf" if spyre.is_float_like(_elt(result)) else "arith.addi"
    return _binary_map(result, init, name, result.type)


def _pad_info(v: ir.Value):
    """(source, low, high, value) when `v` is a constant tensor.pad (or spyre.pad), else None."""
    op = producer(v)
    if op is None:
        return None
    if op.name == "spyre.pad":
        a = op.attributes
        return op.operands[0], _ints(a["low"]), _ints(a["high"]), ir.FloatAttr(a["value"]).value
    if op.name != "tensor.pad" or len(list(op.operands)) != 1:
        return None
    low, high = _ints(op.attributes["static_low"]), _ints(op.attributes["static_high"])
    body = list(op.regions[0].blocks[0].operations)
    if _DYN in low + high or len(body) != 1:  # a computed pad value needs the block arguments: not constant
        return None
    value = _scalar_const(body[0].operands[0])
    return None if value is None else (op.operands[0], low, high, value)


def _spatial_pad(x: ir.Value, value: float):
    """(source, [top, left, bottom, right]) when `x` is an NCHW pad of the spatial dims with `value`."""
    info = _pad_info(x)
    if info is None:
        return x, [0, 0, 0, 0]
    src, low, high, v = info
    if len(low) != 4 or low[:2] != [0, 0] or high[:2] != [0, 0] or v != value:
        return x, [0, 0, 0, 0]
    return src, [low[2], low[3], high[2], high[3]]


# ----------------------------------------------------------------------------------------------------------------
# Sweep 1: compute ops


def _convert_contraction(op: ir.Operation) -> str | None:
    a, b, init = op.operands[0], op.operands[1], op.operands[2]
    t = op.results[0].type
    if not all(_static_tensor(v) for v in (a, b)):
        return "dynamic shapes"
    with ir.InsertionPoint(op), _origin(op):
        rhs = _untransposed(b)
        if op.name == "linalg.matmul":
            r = spyre.MatmulOp(a, rhs or b, t).result
        else:
            r = spyre.BatchMatmulOp(a, rhs or b, t).result
        if rhs is not None:
            r.owner.attributes["transpose_rhs"] = ir.BoolAttr.get(True)
        if not _is_zero_fill(init):
            r = _add_init(r, init)
    _replace(op, r)
    if rhs is not None:
        _erase_dead(b)
    return None


def _untransposed(b: ir.Value) -> ir.Value | None:
    """For a contraction rhs that is a transpose of its last two dims, the tensor before it (for transpose_rhs).

    Two forms: x @ W^T arrives as `linalg.transpose(W)` with permutation [1, 0] (nn.Linear); attention's
    q @ k^T as a transpose of a 4-D [B, H, S, D] tensor collapsed to [B*H, D, S], whose un-transposed rhs is
    the same collapse of k itself.
    """
    rank = len(_shape(b))
    collapse = _producer(b, "tensor.collapse_shape")
    src = collapse.operands[0] if collapse is not None else b
    tr = _producer(src, "linalg.transpose")
    if tr is None:
        return None
    n = len(_shape(src))
    if _ints(tr.attributes["permutation"]) != list(range(n - 2)) + [n - 1, n - 2]:
        return None
    if collapse is None:
        return tr.operands[0]
    groups = [_ints(g) for g in ir.ArrayAttr(collapse.attributes["reassociation"])]
    if groups[-2:] != [[n - 2], [n - 1]]:  # only leading (batch) dims may merge
        return None
    shape = _shape(b)[:rank - 2] + [_shape(b)[-1], _shape(b)[-2]]
    return spyre.ReshapeOp(tr.operands[0], ir.RankedTensorType.get(shape, _elt(b))).result


def _bias_of(init: ir.Value, channels: int) -> ir.Value | None:
    """The [F] bias when a conv's init is `linalg.broadcast` of it along N, H, W (how torch-mlir adds the bias)."""
    op = _producer(init, "linalg.broadcast")
    if op is None or _ints(op.attributes["dimensions"]) != [0, 2, 3] or _shape(op.operands[0]) != [channels]:
        return None
    return op.operands[0]


def _convert_conv(op: ir.Operation) -> str | None:
    x, w, init = op.operands[0], op.operands[1], op.operands[2]
    if not all(_static_tensor(v) for v in (x, w, init)):
        return "dynamic shapes"
    attrs = op.attributes
    strides = _ints(attrs["strides"]) if "strides" in attrs else [1, 1]
    dil = _ints(attrs["dilations"]) if "dilations" in attrs else [1, 1]
    out_shape = _shape(op.results[0])
    with ir.InsertionPoint(op), _origin(op):
        groups = 1
        if op.name == "linalg.depthwise_conv_2d_nchw_chw":
            c, kh, kw = _shape(w)
            groups, w = c, _reshape(w, [c, 1, kh, kw])
        elif op.name == "linalg.conv_2d_ngchw_gfchw":
            n, g, cg, h, wd = _shape(x)
            _, fg, _, kh, kw = _shape(w)
            groups = g
            x = _reshape(x, [n, g * cg, h, wd])
            w = _reshape(w, [g * fg, cg, kh, kw])
            out_shape = [n, g * fg] + out_shape[3:]
        x, pad = _spatial_pad(x, 0.0)
        # The grouped form splits the broadcast bias init into [N, G, F/G, H, W] like the result.
        split = _producer(init, "tensor.expand_shape") if op.name == "linalg.conv_2d_ngchw_gfchw" else None
        bias = _bias_of(split.operands[0] if split is not None else init, out_shape[1])
        conv = spyre.Conv2dOp(x, w, ir.RankedTensorType.get(out_shape, _elt(x)), bias=bias)
        for name, value in (("strides", strides), ("padding", pad), ("dilations", dil)):
            conv.operation.attributes[name] = _i64s(value)
        conv.operation.attributes["groups"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), groups)
        r = _reshape(conv.result, _shape(op.results[0]))
        if bias is None and not _is_zero_fill(init):
            r = _add_init(r, init)
    old_inputs = list(op.operands)
    _replace(op, r)
    for v in old_inputs:
        _erase_dead(v)
    return None


_NEG_INF = float("-inf")


def _convert_max_pool(op: ir.Operation) -> str | None:
    x, window, init = op.operands[0], op.operands[1], op.operands[2]
    if not all(_static_tensor(v) for v in (x, window)):
        return "dynamic shapes"
    attrs = op.attributes
    if "dilations" in attrs and set(_ints(attrs["dilations"])) != {1}:
        return "dilated pooling has no spyre.pool2d form"
    with ir.InsertionPoint(op), _origin(op):
        x, pad = _spatial_pad(x, _NEG_INF)
        try:
            r = _pool(x, "max", _shape(window), _ints(attrs["strides"]) if "strides" in attrs else [1, 1], pad,
                      op.results[0].type)
        except _NoPoolForm:
            return _NO_POOL_FORM
        if _fill_value(init) != _NEG_INF:
            r = _binary_map(r, init, "arith.maximumf", r.type)
    old_inputs = list(op.operands)
    _replace(op, r)
    for v in old_inputs:
        _erase_dead(v)
    return None


_NO_POOL_FORM = "pooling window geometry (ceil mode's partial windows) has no spyre.pool2d form"


class _NoPoolForm(Exception):
    """A pooling window geometry spyre.pool2d cannot express (e.g. ceil mode's partial windows)."""


def _pool(x, kind, kernel, strides, pad, t) -> ir.Value:
    n, c, h, w = _shape(x)
    want = [n, c] + [(size + lo + hi - k) // st + 1 for size, k, st, lo, hi in
                     zip((h, w), kernel, strides, pad[:2], pad[2:])]
    if list(ir.RankedTensorType(t).shape) != want:
        raise _NoPoolForm()
    p = spyre.Pool2dOp(x, t)
    p.operation.attributes["kind"] = ir.StringAttr.get(kind)
    for name, value in (("kernel", kernel), ("strides", strides), ("padding", pad)):
        p.operation.attributes[name] = _i64s(value)
    return p.result


def _decline_sum_pool(op: ir.Operation) -> str:
    """A sum pool converts from the division that follows it (_convert_avg_pool); alone it has no form."""
    return "sum pooling not followed by a division by the window size (no spyre.pool2d form)"


def _convert_softmax(op: ir.Operation) -> str | None:
    x = op.operands[0]
    if not _static_tensor(x):
        return "dynamic shapes"
    with ir.InsertionPoint(op), _origin(op):
        s = spyre.SoftmaxOp(x, op.results[0].type)
        s.operation.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                          ir.IntegerAttr(op.attributes["dimension"]).value)
        s.operation.attributes["acc_type"] = ir.TypeAttr.get(_elt(x))
    _replace(op, s.result)
    return None


# ----------------------------------------------------------------------------------------------------------------
# linalg.generic: gather, reductions, average pooling, elementwise maps


def _convert_generic(op: ir.Operation) -> str | None:
    """Try the generic forms in order of specificity; the last reason explains why none matched."""
    iters = [str(it) for it in op.attributes["iterator_types"]]
    body_ops = {o.name for o in op.regions[0].blocks[0].operations}
    if "tensor.extract" in body_ops:
        return _convert_gather(op)
    if any(it.endswith("<reduction>") for it in iters):
        return _convert_reduction(op)
    if _convert_avg_pool(op) is None:
        return None
    return _convert_elementwise(op)


def _segments(op: ir.Operation) -> tuple[int, int]:
    n_in, n_out = list(op.attributes["operandSegmentSizes"])
    return n_in, n_out


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]


def _dims_of(amap: ir.AffineMap) -> list[int | None] | None:
    """Each result of `amap` as a loop dim or None for the constant 0; None if any result is something else."""
    out: list[int | None] = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            out.append(e.position)
        elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
            out.append(None)
        else:
            return None
    return out


_GATHER_CHECKS = ("arith.index_cast", "arith.cmpi", "cf.assert", "linalg.index", "arith.constant")


def _convert_gather(op: ir.Operation) -> str | None:
    """Embedding: out[i..., j] = table[index_cast(ids[i...]), j], the form torch-mlir emits for aten.embedding.

    The body's bounds checks (cmpi + cf.assert) are dropped: spyre.gather clamps indices on the device.
    """
    reason = "data-dependent tensor.extract in a linalg.generic body (not an embedding row gather)"
    n_in, n_out = _segments(op)
    body = op.regions[0].blocks[0]
    ops = list(body.operations)
    extracts = [o for o in ops if o.name == "tensor.extract"]
    if n_in != 1 or n_out != 1 or len(extracts) != 1 or ops[-1].operands[0] != extracts[0].results[0]:
        return reason
    if any(o.name not in _GATHER_CHECKS + ("tensor.extract", "linalg.yield") for o in ops):
        return reason
    ex = extracts[0]
    table, idx = ex.operands[0], list(ex.operands)[1:]
    ids = op.operands[0]
    out = op.results[0]
    inside = {r for o in ops for r in o.results}
    if table in inside or not _static_tensor(table):
        return reason
    k, t_rank = len(_shape(ids)), len(_shape(table))
    maps = _maps(op)
    if _dims_of(maps[0]) != list(range(k)) or maps[1] != ir.AffineMap.get_identity(k + t_rank - 1):
        return reason
    cast = producer(idx[0])
    if cast is None or cast.name != "arith.index_cast" or cast.operands[0] != body.arguments[0]:
        return reason
    for j, v in enumerate(idx[1:]):
        li = producer(v)
        if li is None or li.name != "linalg.index" or ir.IntegerAttr(li.attributes["dim"]).value != k + j:
            return reason
    with ir.InsertionPoint(op), _origin(op):
        g = spyre.GatherOp(table, ids, out.type)
    _replace(op, g.result)
    return None


_REDUCE_KIND = {
    "arith.addf": "sum", "arith.addi": "sum", "arith.mulf": "prod", "arith.muli": "prod",
    "arith.maximumf": "max", "arith.maxnumf": "max", "arith.maxsi": "max",
    "arith.minimumf": "min", "arith.minnumf": "min", "arith.minsi": "min",
    "arith.andi": "min", "arith.ori": "max",  # on i1 only: all / any, reduced as 0.0/1.0 floats
}
_LOGICAL = ("arith.andi", "arith.ori")
_IDENTITY = {"sum": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}


def _convert_reduction(op: ir.Operation) -> str | None:
    """A one-input reduction whose used result combines `in` with its accumulator by add/mul/max/min.

    Multi-result generics (max with argmax, as torch-mlir emits for aten.max.dim) convert when only the
    value result is used. The accumulator's init becomes the reduce's identity, or is combined after it.
    """
    n_in, n_out = _segments(op)
    iters = [str(it).endswith("<reduction>") for it in op.attributes["iterator_types"]]
    used = [i for i, r in enumerate(op.results) if list(r.uses)]
    argmax = "no spyre form for a multi-result reduction whose index results are used (argmax/argmin)"
    if n_in != 1:
        return f"no spyre form for a reduction with {n_in} inputs"
    if len(used) != 1:
        return argmax
    k = used[0]
    x, init, res = op.operands[0], op.operands[n_in + k], op.results[k]
    body = op.regions[0].blocks[0]
    yielded = list(body.operations)[-1].operands[k]
    comb = producer(yielded)
    inside = {r for o in body.operations for r in o.results}
    name = comb.name if yielded in inside else "a non-binary body"
    kind = _REDUCE_KIND.get(name)
    if kind is None and n_out > 1:
        return argmax  # the used result is the index one (selected, not combined)
    args = {body.arguments[0], body.arguments[n_in + k]}
    if kind is None or len(list(comb.operands)) != 2 or set(comb.operands) != args:
        return f"no spyre form for linalg.generic with reduction iterators of kind {name}"
    maps = _maps(op)
    rank = len(iters)
    out_dims = _dims_of(maps[n_in + k])
    if maps[0] != ir.AffineMap.get_identity(rank) or out_dims is None or _elt(x) != _elt(res):
        return "reduction with a non-identity input map or a change of element type"
    dims = [d for d in range(rank) if iters[d]]
    kept = [d for d in out_dims if d is not None]
    if kept != [d for d in range(rank) if not iters[d]]:
        return "reduction whose result map permutes the kept dims"
    if len(out_dims) == rank:
        if [out_dims[d] is None for d in range(rank)] != iters:
            return "reduction whose result keeps a reduced dim"
        keep = True
    elif len(out_dims) == len(kept):
        keep = False
    else:
        return "reduction whose result map mixes kept and dropped reduced dims"
    if _is_int64(_elt(x)):
        return "int64 index math"
    logical = name in _LOGICAL
    if logical and str(_elt(x)) != "i1":
        return f"no spyre form for linalg.generic with reduction iterators of kind {name} on {_elt(x)}"
    with ir.InsertionPoint(op), _origin(op):
        if logical:  # all(b) = min(float(b)), any(b) = max(float(b)); 0.0 and 1.0 convert back exactly
            f32 = ir.F32Type.get()
            x = _cast_map(x, f32, "arith.uitofp")
        r = spyre.ReduceOp(x, ir.RankedTensorType.get(_shape(res), _elt(x)))
        r.operation.attributes["dims"] = _i64s(dims)
        r.operation.attributes["kind"] = ir.StringAttr.get(kind)
        r.operation.attributes["keepdim"] = ir.BoolAttr.get(keep)
        v = r.result
        identity = _IDENTITY[kind]
        if logical:
            v = _cast_map(v, _elt(res), "arith.fptoui")
            identity = {"arith.andi": (1, -1), "arith.ori": (0,)}[name]  # i1 true may read as -1
        if _fill_value(init) not in (identity if logical else (identity,)):
            v = _binary_map(v, init, name, res.type)
    res.replace_all_uses_with(v)
    op.erase()
    return None


def _convert_avg_pool(op: ir.Operation) -> str | None:
    """`divf(pooling_nchw_sum(x), KH*KW)`: torch-mlir's avg_pool2d (count_include_pad: the divisor is constant)."""
    n_in, _ = _segments(op)
    ops = list(op.regions[0].blocks[0].operations)
    pool = _producer(op.operands[0], "linalg.pooling_nchw_sum")
    if n_in != 1 or pool is None or len(ops) != 2 or ops[0].name != "arith.divf" or \
            ops[0].operands[0] != op.regions[0].blocks[0].arguments[0] or len(list(pool.results[0].uses)) != 1:
        return "not an average pool"
    x, window, init = pool.operands[0], pool.operands[1], pool.operands[2]
    kernel = _shape(window)
    attrs = pool.attributes
    if _scalar_const(ops[0].operands[1]) != math.prod(kernel) or not _is_zero_fill(init) or \
            ("dilations" in attrs and set(_ints(attrs["dilations"])) != {1}) or \
            _maps(op)[0] != _maps(op)[1] or _shape(op.results[0]) != _shape(pool.results[0]):
        return "not an average pool"
    with ir.InsertionPoint(op), _origin(pool):
        x, pad = _spatial_pad(x, 0.0)
        try:
            r = _pool(x, "avg", kernel, _ints(attrs["strides"]) if "strides" in attrs else [1, 1], pad,
                      op.results[0].type)
        except _NoPoolForm:
            return _NO_POOL_FORM
    _replace(op, r)
    old_inputs = list(pool.operands)
    pool.erase()
    for v in old_inputs:
        _erase_dead(v)
    return None


def _input_view(v: ir.Value, amap: ir.AffineMap, out_shape: list[int]) -> ir.Value | None:
    """Rewrite an input read through `amap` as a tensor that NumPy-broadcasts to `out_shape`, or None.

    Each map result is a loop dim or the constant 0 (a size-1 dim). Loop dims in decreasing order need a
    transpose first; the dims the map skips become size-1 dims of a reshape.
    """
    t = ir.RankedTensorType(v.type)
    dims = _dims_of(amap)
    if dims is None:
        return None
    kept = [(d, i) for i, d in enumerate(dims) if d is not None]
    if len({d for d, _ in kept}) != len(kept):
        return None
    order = [i for _, i in sorted(kept)]
    if order != sorted(order):
        perm = order + [i for i in range(t.rank) if i not in order]
        shape = [t.shape[p] for p in perm]
        v = spyre.TransposeOp(v, ir.RankedTensorType.get(shape, t.element_type)).result
        v.owner.attributes["permutation"] = ir.DenseI64ArrayAttr.get(perm)
        dims = [dims[p] for p in perm]
        t = ir.RankedTensorType(v.type)
    size = {d: t.shape[i] for i, d in enumerate(dims) if d is not None}
    target = [size.get(d, 1) for d in range(len(out_shape))]
    if any(s not in (1, o) for s, o in zip(target, out_shape)):
        return None
    lead = len(target) - t.rank
    if not (lead >= 0 and all(x == 1 for x in target[:lead]) and target[lead:] == list(t.shape)):
        v = spyre.ReshapeOp(v, ir.RankedTensorType.get(target, t.element_type)).result
    return v


def _convert_elementwise(op: ir.Operation) -> str | None:
    if any(str(it) != "#linalg.iterator_type<parallel>" for it in op.attributes["iterator_types"]):
        return "not all loops parallel"
    n_in, _ = _segments(op)
    if len(op.results) != 1:
        return "no spyre form for a multi-result elementwise linalg.generic"
    if n_in > spyre.MAP_MAX_INPUTS:
        return f"elementwise linalg.generic with {n_in} inputs (spyre.map streams at most {spyre.MAP_MAX_INPUTS})"
    maps = _maps(op)
    out_t = ir.RankedTensorType(op.results[0].type)
    ins = list(op.operands)[:n_in]
    if not all(isinstance(v.type, ir.RankedTensorType) for v in ins) or not _static_tensor(op.results[0]):
        return "dynamic or unranked operands"
    if maps[-1] != ir.AffineMap.get_identity(out_t.rank):
        return "elementwise linalg.generic with a non-identity output map"
    if any(_is_int64(t) for t in [_elt(v) for v in ins] + [out_t.element_type]):
        return "int64 index math"
    body = op.regions[0].blocks[0]
    args = list(body.arguments)
    if any(len(list(a.uses)) for a in args[n_in:]):
        return "elementwise body reads its output"
    captured = _captured_values(op, body)
    if isinstance(captured, str):
        return captured
    with ir.InsertionPoint(op), _origin(op):
        inputs = []
        for v, amap in zip(ins, maps[:n_in]):
            view = _input_view(v, amap, list(out_t.shape))
            if view is None:
                return "elementwise linalg.generic with a non-broadcasting input map"
            inputs.append(view)
        m = spyre.MapOp(out_t, **{f"in{i}": v for i, v in enumerate(inputs)})
        block = m.body.blocks.append(*[a.type for a in args[:n_in]])
    mapping = {a: b for a, b in zip(args, block.arguments)}
    with ir.InsertionPoint(block):
        for v in captured:
            clone = producer(v).clone()
            mapping[v] = clone.results[0]
        for inner in body.operations:
            if inner.name == "linalg.yield":
                spyre.YieldOp(mapping[inner.operands[0]], loc=inner.location)
                break
            clone_mapped(inner, mapping)
    _replace(op, m.result)
    return None


def _captured_values(op: ir.Operation, body: ir.Block) -> list[ir.Value] | str:
    """Values the body reads from above; only scalar constants can follow it into the isolated spyre.map.

    Returns the reason as a string when the body cannot become a spyre.map body.
    """
    inside = {r for o in body.operations for r in o.results} | set(body.arguments)
    captured = {}
    for o in body.operations:
        if o.name == "linalg.index":
            return "int64 index math (linalg.index in the body)"
        if o.name == "cf.assert":
            return "runtime assertion (cf.assert) in the body"
        if not (o.name.startswith(("arith.", "math.")) or o.name == "linalg.yield"):
            return f"{o.name} in the body (spyre.map bodies hold arith and math ops only)"
        for v in o.operands:
            if v in inside:
                continue
            owner = producer(v)
            if owner is None or owner.name != "arith.constant" or isinstance(v.type, ir.ShapedType):
                return "the body reads a value from above that is not a scalar constant"
            captured[v] = v
    return list(captured.values())


# ----------------------------------------------------------------------------------------------------------------
# Sweep 2: data movement


def _convert_transpose(op: ir.Operation) -> str | None:
    x = op.operands[0]
    if not _static_tensor(x):
        return "dynamic shapes"
    with ir.InsertionPoint(op), _origin(op):
        t = spyre.TransposeOp(x, op.results[0].type)
        t.operation.attributes["permutation"] = _i64s(_ints(op.attributes["permutation"]))
    _replace(op, t.result)
    return None


def _identity_map(x: ir.Value, t: ir.Type) -> ir.Value:
    m = spyre.MapOp(t, in0=x)
    block = m.body.blocks.append(_elt(x))
    with ir.InsertionPoint(block):
        spyre.YieldOp(block.arguments[0])
    return m.result


def _convert_broadcast(op: ir.Operation) -> str | None:
    """Added dims become size-1 dims of a reshape; an identity map then broadcasts them if they are not 1."""
    x, out = op.operands[0], op.results[0]
    if not _static_tensor(x) or not _static_tensor(out):
        return "dynamic shapes"
    added = set(_ints(op.attributes["dimensions"]))
    out_shape = _shape(out)
    src = iter(_shape(x))
    target = [1 if d in added else next(src) for d in range(len(out_shape))]
    with ir.InsertionPoint(op), _origin(op):
        v = _reshape(x, target)
        if target != out_shape:
            v = _identity_map(v, out.type)
    _replace(op, v)
    return None


def _convert_fill(op: ir.Operation) -> str | None:
    value = producer(op.operands[0])
    out = op.results[0]
    if value is None or value.name != "arith.constant" or not _static_tensor(out):
        return "linalg.fill of a non-constant value"
    with ir.InsertionPoint(op), _origin(op):
        m = spyre.MapOp(out.type)
        block = m.body.blocks.append()
        with ir.InsertionPoint(block):
            spyre.YieldOp(value.clone().results[0])
    _replace(op, m.result)
    return None


def _convert_reshape(op: ir.Operation) -> str | None:
    x, out = op.operands[0], op.results[0]
    if not _static_tensor(x) or not _static_tensor(out):
        return "dynamic shapes"
    with ir.InsertionPoint(op), _origin(op):
        if _producer(x, "tensor.empty") is not None:
            r = ir.Operation.create("tensor.empty", results=[out.type]).result
        else:
            inner = _producer(x, "spyre.reshape")  # a reshape of a reshape reads the first one's input
            src = inner.operands[0] if inner is not None else x
            r = src if _shape(src) == _shape(out) else spyre.ReshapeOp(src, out.type).result
    _replace(op, r)
    _erase_dead(x)
    return None


def _convert_extract_slice(op: ir.Operation) -> str | None:
    x, out = op.operands[0], op.results[0]
    a = op.attributes
    off, size, step = _ints(a["static_offsets"]), _ints(a["static_sizes"]), _ints(a["static_strides"])
    if len(list(op.operands)) != 1 or _DYN in off + size + step or not _static_tensor(x):
        return "dynamic tensor.extract_slice"
    with ir.InsertionPoint(op), _origin(op):
        s = spyre.SliceOp(x, ir.RankedTensorType.get(size, _elt(x)))
        for name, value in (("offsets", off), ("sizes", size), ("strides", step)):
            s.operation.attributes[name] = _i64s(value)
        r = _reshape(s.result, _shape(out))  # rank-reducing slices drop unit dims
    _replace(op, r)
    return None


def _convert_concat(op: ir.Operation) -> str | None:
    ins = list(op.operands)
    if not all(_static_tensor(v) for v in ins):
        return "dynamic shapes"
    dim = ir.IntegerAttr(op.attributes["dim"]).value
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint(op), _origin(op):
        acc = ins[0]
        for v in ins[1:]:
            shape = _shape(acc)
            shape[dim] += _shape(v)[dim]
            c = spyre.ConcatOp(acc, v, ir.RankedTensorType.get(shape, _elt(acc)))
            c.operation.attributes["dim"] = ir.IntegerAttr.get(i64, dim)
            acc = c.result
    _replace(op, acc)
    return None


def _splat_value(v: ir.Value) -> float | int | None:
    """The single value of a splat `arith.constant dense<c>` or constant fill, else None."""
    op = producer(v)
    if op is not None and op.name == "arith.constant" and isinstance(op.attributes["value"], ir.DenseElementsAttr):
        a = ir.DenseElementsAttr(op.attributes["value"])
        if a.is_splat:
            c = a.get_splat_value()
            return ir.FloatAttr(c).value if isinstance(c, ir.FloatAttr) else None
        return None
    return _fill_value(v)


def _insert_chain(op: ir.Operation):
    """The (offset, value) pieces of insert_slices that fill a tensor.empty exactly, end to end along one dim.

    This is how a concatenation looks without tensor.concat: each insert_slice writes one input into the
    previous one's result. Returns (dim, pieces in offset order) or None.
    """
    pieces, cur = [], op
    while cur is not None and cur.name == "tensor.insert_slice":
        if len(list(cur.operands)) != 2 or (cur is not op and len(list(cur.results[0].uses)) != 1):
            return None
        a = cur.attributes
        off, size, step = _ints(a["static_offsets"]), _ints(a["static_sizes"]), _ints(a["static_strides"])
        if _DYN in off + size or set(step) != {1} or _shape(cur.operands[0]) != size:
            return None
        pieces.append((off, cur.operands[0]))
        cur = producer(cur.operands[1])
    if cur is None or cur.name != "tensor.empty" or len(pieces) < 2:
        return None
    full = _shape(op.results[0])
    dims = {d for off, v in pieces for d in range(len(full)) if off[d] != 0 or _shape(v)[d] != full[d]}
    if len(dims) != 1:
        return None
    d = dims.pop()
    pieces.sort(key=lambda p: p[0][d])
    at = 0
    for off, v in pieces:
        if off[d] != at:
            return None
        at += _shape(v)[d]
    return (d, [v for _, v in pieces]) if at == full[d] else None


def _convert_insert_slice(op: ir.Operation) -> str | None:
    """insert_slice into a splat constant is a pad; a chain of them filling a tensor.empty is a concat."""
    src, dest, out = op.operands[0], op.operands[1], op.results[0]
    a = op.attributes
    off, size, step = _ints(a["static_offsets"]), _ints(a["static_sizes"]), _ints(a["static_strides"])
    if len(list(op.operands)) != 2 or _DYN in off + size or not _static_tensor(out) or not _static_tensor(src):
        return "dynamic tensor.insert_slice"
    chain = _insert_chain(op)
    if chain is not None:
        d, values = chain
        with ir.InsertionPoint(op), _origin(op):
            acc = values[0]
            for v in values[1:]:
                shape = _shape(acc)
                shape[d] += _shape(v)[d]
                c = spyre.ConcatOp(acc, v, ir.RankedTensorType.get(shape, _elt(acc)))
                c.operation.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d)
                acc = c.result
        _replace(op, acc)
        _erase_dead(dest)
        return None
    value = _splat_value(dest)
    if value is None or set(step) != {1} or not isinstance(_elt(out), ir.FloatType):
        return "tensor.insert_slice into a computed tensor (no spyre form)"
    with ir.InsertionPoint(op), _origin(op):
        x = _reshape(src, size)  # a rank-reducing insert reads a tensor with the unit dims dropped
        p = spyre.PadOp(x, out.type)
        p.operation.attributes["low"] = _i64s(off)
        p.operation.attributes["high"] = _i64s([n - o - s for n, o, s in zip(_shape(out), off, size)])
        p.operation.attributes["value"] = ir.FloatAttr.get(_elt(out), float(value))
    _replace(op, p.result)
    _erase_dead(dest)
    return None


def _convert_pad(op: ir.Operation) -> str | None:
    info = _pad_info(op.results[0])
    if info is None:
        return "tensor.pad with a dynamic size or a non-constant pad value"
    src, low, high, value = info
    if not isinstance(_elt(src), ir.FloatType) or not _static_tensor(src):
        return "tensor.pad of a non-float tensor"
    with ir.InsertionPoint(op), _origin(op):
        p = spyre.PadOp(src, op.results[0].type)
        p.operation.attributes["low"] = _i64s(low)
        p.operation.attributes["high"] = _i64s(high)
        p.operation.attributes["value"] = ir.FloatAttr.get(_elt(src), value)
    _replace(op, p.result)
    return None


# ----------------------------------------------------------------------------------------------------------------
# Sweep 3: fusion of spyre op chains. Each matcher looks at one spyre.map (the chain's last op) and walks up
# through its producers, one small body per map, as torch-mlir emits them (one linalg.generic per aten op).


def _map_expr(v: ir.Value):
    """(expr, inputs) for a spyre.map result: expr is a scalar tree over ("in", i) and ("const", c)."""
    op = _producer(v, "spyre.map")
    if op is None:
        return None, []
    block = op.regions[0].blocks[0]
    env = {a: ("in", i) for i, a in enumerate(block.arguments)}
    for o in block.operations:
        if o.name == "spyre.yield":
            return env.get(o.operands[0]), list(op.operands)
        c = _scalar_const(o.results[0])
        if c is not None:
            env[o.results[0]] = ("const", c)
        else:
            env[o.results[0]] = (o.name, *[env.get(x, ("?",)) for x in o.operands])
    return None, []


def _m_unary(v: ir.Value, name: str) -> ir.Value | None:
    expr, ins = _map_expr(v)
    return ins[0] if expr == (name, ("in", 0)) and len(ins) == 1 else None


def _m_binary(v: ir.Value, name: str) -> tuple[ir.Value, ir.Value] | None:
    expr, ins = _map_expr(v)
    return (ins[0], ins[1]) if expr == (name, ("in", 0), ("in", 1)) and len(ins) == 2 else None


def _m_const(v: ir.Value, name: str, commutative: bool = True):
    """(input, c) when `v` is a one-input map computing name(in, c) (or name(c, in) when commutative)."""
    expr, ins = _map_expr(v)
    if len(ins) != 1 or expr is None or len(expr) != 3 or expr[0] != name:
        return None
    if expr[1] == ("in", 0) and expr[2][0] == "const":
        return ins[0], expr[2][1]
    if commutative and expr[2] == ("in", 0) and expr[1][0] == "const":
        return ins[0], expr[1][1]
    return None


def _pairs(pair):
    return [] if pair is None else [pair, (pair[1], pair[0])]


def _look(v: ir.Value) -> ir.Value:
    """Look through spyre.reshapes that only add or drop size-1 dims (a reduce result re-expanded to keepdim)."""
    op = _producer(v, "spyre.reshape")
    while op is not None and [d for d in _shape(op.operands[0]) if d != 1] == [d for d in _shape(v) if d != 1]:
        v = op.operands[0]
        op = _producer(v, "spyre.reshape")
    return v


def _reduce_of(v: ir.Value, kind: str):
    """(input, dims) when `v` (through unit reshapes) is a spyre.reduce of `kind`."""
    op = _producer(_look(v), "spyre.reduce")
    if op is None or ir.StringAttr(op.attributes["kind"]).value != kind:
        return None
    rank = len(_shape(op.operands[0]))
    return op.operands[0], sorted(d % rank for d in _ints(op.attributes["dims"]))


def _square_of(v: ir.Value) -> ir.Value | None:
    got = _m_const(v, "math.fpowi", False) or _m_const(v, "math.powf", False)
    if got is not None and got[1] == 2:
        return got[0]
    pair = _m_binary(v, "arith.mulf")
    return pair[0] if pair is not None and pair[0] == pair[1] else None


def _rsqrt_plus_eps(v: ir.Value):
    """(inner, eps) for rsqrt(inner + eps)."""
    e = _m_unary(_look(v), "math.rsqrt")
    got = _m_const(e, "arith.addf") if e is not None else None
    return got if got is not None and isinstance(got[1], float) else None


def _strip(v: ir.Value, *casts: str) -> ir.Value:
    for name in casts:
        while (src := _m_unary(v, name)) is not None:
            v = src
    return v


def _set(op: ir.OpView, **attrs) -> None:
    for name, value in attrs.items():
        op.operation.attributes[name] = value


def _f32(x: float) -> ir.Attribute:
    return ir.FloatAttr.get(ir.F32Type.get(), x)


def _fuse_mean(root: ir.Operation) -> list[int] | bool:
    """sum(x, dims) / N with N the number of reduced elements -> reduce mean."""
    got = _m_const(root.results[0], "arith.divf", commutative=False)
    r = _producer(got[0], "spyre.reduce") if got else None
    if r is None or ir.StringAttr(r.attributes["kind"]).value != "sum" or len(list(r.results[0].uses)) != 1:
        return False
    x = r.operands[0]
    shape = _shape(x)
    if math.prod(shape[d] for d in _ints(r.attributes["dims"])) != got[1] or _elt(x) != _elt(root.results[0]):
        return False
    with ir.InsertionPoint(root), r.location:
        m = spyre.ReduceOp(x, root.results[0].type)
        _set(m, dims=r.attributes["dims"], keepdim=r.attributes["keepdim"], kind=ir.StringAttr.get("mean"))
    return _done(root, m.result)


def _fuse_bias(root: ir.Operation) -> list[int] | bool:
    """matmul(a, b) + bias[N] -> spyre.matmul with bias."""
    for mv, b in _pairs(_m_binary(root.results[0], "arith.addf")):
        mm = _producer(mv, "spyre.matmul")
        if mm is None or len(list(mm.operands)) != 2 or len(list(mv.uses)) != 1 or \
                _shape(b) != _shape(mv)[-1:] or _elt(b) != _elt(mv) or _shape(mv) != _shape(root.results[0]):
            continue
        with ir.InsertionPoint(root), mm.location:
            new = spyre.MatmulOp(mm.operands[0], mm.operands[1], mv.type, bias=b)
            if "transpose_rhs" in mm.attributes:
                _set(new, transpose_rhs=mm.attributes["transpose_rhs"])
        return _done(root, new.result)
    return False


def _fuse_softmax(root: ir.Operation) -> list[int] | bool:
    """exp(x - max(x, d)) / sum(exp(...), d) -> spyre.softmax(x) {dim = d}."""
    pair = _m_binary(root.results[0], "arith.divf")
    if pair is None:
        return False
    e, s = pair
    summed = _reduce_of(s, "sum")
    d = _m_unary(e, "math.exp")
    sub = _m_binary(d, "arith.subf") if d is not None else None
    if summed is None or sub is None or summed[0] != e or len(summed[1]) != 1:
        return False
    x, mx = sub
    maxed = _reduce_of(mx, "max")
    if maxed is None or maxed[0] != x or maxed[1] != summed[1] or _shape(x) != _shape(root.results[0]):
        return False
    with ir.InsertionPoint(root), _origin(root, "softmax pattern"):
        s = spyre.SoftmaxOp(x, root.results[0].type)
        _set(s, dim=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), summed[1][0]),
             acc_type=ir.TypeAttr.get(_elt(x)))
    return _done(root, s.result)


def _neg_inf_test(v: ir.Value) -> ir.Value | None:
    """x when `v` is a one-input map computing x == -inf (oeq, possibly in f64), as i1 or as 0/1 (uitofp)."""
    expr, ins = _map_expr(v)
    if len(ins) != 1 or expr is None:
        return None
    if expr[0] == "arith.uitofp":
        expr = expr[1]
    if expr[0] != "arith.cmpf" or len(expr) != 3 or expr[2] != ("const", -math.inf):
        return None
    a = expr[1][1] if expr[1][0] == "arith.extf" else expr[1]
    cmps = [o for o in _producer(v, "spyre.map").regions[0].blocks[0].operations if o.name == "arith.cmpf"]
    if a != ("in", 0) or len(cmps) != 1 or ir.IntegerAttr(cmps[0].attributes["predicate"]).value != 1:
        return None
    return ins[0]


def _fuse_safe_softmax(root: ir.Operation) -> list[int] | bool:
    """select(min(x == -inf, d) (all masked), 0, softmax(x, d)), PyTorch's _safe_softmax as torch-mlir
    decomposes it -> spyre.softmax(x) {dim = d, safe = true}: a row whose every element is -inf gives zeros."""
    expr, ins = _map_expr(root.results[0])
    if expr != ("arith.select", ("in", 0), ("in", 1), ("in", 2)) or len(ins) != 3:
        return False
    m, z, s = ins
    sm = _producer(s, "spyre.softmax")
    if sm is None or "safe" in sm.attributes or _splat_value(z) != 0 or _shape(s) != _shape(root.results[0]):
        return False
    x = sm.operands[0]
    d = ir.IntegerAttr(sm.attributes["dim"]).value % len(_shape(x))
    b = _m_unary(m, "arith.fptoui")
    red = _reduce_of(b, "min") if b is not None else None
    if red is None or red[1] != [d] or [n for i, n in enumerate(_shape(m)) if i != d] != \
            [n for i, n in enumerate(_shape(x)) if i != d]:
        return False
    src = _m_unary(red[0], "arith.uitofp")
    if _neg_inf_test(red[0] if src is None else src) != x:
        return False
    with ir.InsertionPoint(root), _origin(root, "safe softmax pattern"):
        new = spyre.SoftmaxOp(x, root.results[0].type)
        _set(new, dim=sm.attributes["dim"], acc_type=sm.attributes["acc_type"], safe=ir.BoolAttr.get(True))
    return _done(root, new.result)


def _mean_of(v: ir.Value):
    return _reduce_of(v, "mean")


def _layernorm_core(v: ir.Value):
    """(x, axis, eps) for (x - mean(x)) * rsqrt(var(x) + eps), var = mean((y - mean(y))^2), y = x or extf(x)."""
    for c, r in _pairs(_m_binary(v, "arith.mulf")):
        sub, inner = _m_binary(c, "arith.subf"), _rsqrt_plus_eps(r)
        if sub is None or inner is None:
            continue
        x, m = sub
        mean = _mean_of(m)
        rank = len(_shape(x))
        if mean is None or mean[0] != x or mean[1] != list(range(mean[1][0], rank)):
            continue
        var = _mean_of(_strip(inner[0], "arith.truncf"))
        d = _square_of(var[0]) if var is not None and var[1] == mean[1] else None
        centred = _m_binary(d, "arith.subf") if d is not None else None
        if centred is None:
            continue
        y, my = centred
        ymean = _mean_of(my)
        if ymean is None or ymean[0] != y or ymean[1] != mean[1] or _strip(y, "arith.extf") != x:
            continue
        return x, mean[1][0], inner[1]
    return None


def _fuse_layernorm(root: ir.Operation) -> list[int] | bool:
    """[[core] * weight] + bias -> spyre.layernorm(x, weight, bias), trying the longest chain first."""
    v = root.results[0]
    candidates = []
    for n1, b in _pairs(_m_binary(v, "arith.addf")):
        for n0, w in _pairs(_m_binary(n1, "arith.mulf")):
            candidates.append((n0, w, b))
        candidates.append((n1, None, b))
    for n0, w in _pairs(_m_binary(v, "arith.mulf")):
        candidates.append((n0, w, None))
    candidates.append((v, None, None))
    for core_v, w, b in candidates:
        core = _layernorm_core(core_v)
        if core is None:
            continue
        x, axis, eps = core
        norm = _shape(x)[axis:]
        if eps < 0:         # spyre.layernorm's epsilon is non-negative: the maps compute PyTorch's NaNs
            continue
        if any(p is not None and (_shape(p) != norm or _elt(p) != _elt(x)) for p in (w, b)) or \
                _shape(x) != _shape(v) or _elt(x) != _elt(v):
            continue
        with ir.InsertionPoint(root), _origin(root, "layernorm pattern"):
            ln = spyre.LayerNormOp(x, v.type, weight=w, bias=b)
            _set(ln, axis=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), axis), epsilon=_f32(eps),
                 acc_type=ir.TypeAttr.get(_elt(x)))
        return _done(root, ln.result)
    return False


def _rmsnorm_core(v: ir.Value):
    """(x, eps) for x * rsqrt(mean(x^2, last dim) + eps)."""
    for x, r in _pairs(_m_binary(v, "arith.mulf")):
        inner = _rsqrt_plus_eps(r)
        mean = _mean_of(inner[0]) if inner is not None else None
        if mean is None or mean[1] != [len(_shape(x)) - 1] or _square_of(mean[0]) != x:
            continue
        return x, inner[1]
    return None


def _fuse_rmsnorm(root: ir.Operation) -> list[int] | bool:
    v = root.results[0]
    candidates = [(y, w) for y, w in _pairs(_m_binary(v, "arith.mulf"))] + [(v, None)]
    for y, w in candidates:
        core = _rmsnorm_core(y)
        if core is None:
            continue
        x, eps = core
        if eps < 0:
            continue
        if (w is not None and (_shape(w) != _shape(x)[-1:] or _elt(w) != _elt(x))) or _shape(x) != _shape(v) \
                or _elt(x) != _elt(v):
            continue
        with ir.InsertionPoint(root), _origin(root, "rmsnorm pattern"):
            rn = spyre.RMSNormOp(x, v.type, weight=w)
            _set(rn, epsilon=_f32(eps), acc_type=ir.TypeAttr.get(_elt(x)))
        return _done(root, rn.result)
    return False


def _done(root: ir.Operation, new: ir.Value) -> list[int]:
    """Replace ``root`` by ``new`` and erase what fed only it; the erased ops' keys, the root's first (never
    empty). A key is the hash of the op's handle while the op lives, which compares operations by address (a
    handle of an erased op hashes otherwise, or raises)."""
    operands = list(root.operands)
    erased = [hash(root.operation)]
    _replace(root, new)
    for v in operands:
        erased += _erase_dead(v)
    return erased


_PATTERNS = {
    "linalg.matmul": _convert_contraction,
    "linalg.batch_matmul": _convert_contraction,
    "linalg.conv_2d_nchw_fchw": _convert_conv,
    "linalg.depthwise_conv_2d_nchw_chw": _convert_conv,
    "linalg.conv_2d_ngchw_gfchw": _convert_conv,
    "linalg.pooling_nchw_max": _convert_max_pool,
    "linalg.pooling_nchw_sum": _decline_sum_pool,
    "linalg.softmax": _convert_softmax,
    "linalg.generic": _convert_generic,
}

_MOVEMENT = {
    "linalg.transpose": _convert_transpose,
    "linalg.broadcast": _convert_broadcast,
    "linalg.fill": _convert_fill,
    "tensor.expand_shape": _convert_reshape,
    "tensor.collapse_shape": _convert_reshape,
    "tensor.reshape": _convert_reshape,
    "tensor.extract_slice": _convert_extract_slice,
    "tensor.concat": _convert_concat,
    "tensor.pad": _convert_pad,
    "tensor.insert_slice": _convert_insert_slice,
}

# Each returns the ops its match erased (_done), False when the root does not match. Order matters: means first
# (the norms match mean reduces), layernorm before rmsnorm (its core has the x * rsqrt(... + eps) shape too).
_FUSIONS = [_fuse_mean, _fuse_bias, _fuse_softmax, _fuse_safe_softmax, _fuse_layernorm, _fuse_rmsnorm]
