"""spyre-convert-linalg: linalg-on-tensors to spyre graph ops.

Covered here: `linalg.matmul`, `linalg.batch_matmul` (an init that is not a zero fill becomes an added map), and
elementwise `linalg.generic` (all loops parallel, identity output map, inputs read through broadcasting or
transposing projections) as `spyre.map` with the scalar body cloned. What does not match is left unchanged for
later patterns or host placement.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith

from spyre_mlir.dialects import spyre
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class ConvertLinalgPass(SpyrePass):
    NAME = "spyre-convert-linalg"
    SUMMARY = "Convert linalg-on-tensors ops to spyre graph ops"

    def run(self, module: ir.Operation) -> None:
        todo: list[ir.Operation] = []

        def collect(op):
            if op.name in _PATTERNS:
                todo.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op in todo:
            _PATTERNS[op.name](op)


def _def_op(v: ir.Value) -> ir.Operation | None:
    """The operation defining `v`, or None for a block argument."""
    owner = v.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _is_zero_fill(v: ir.Value) -> bool:
    owner = _def_op(v)
    if owner is None or owner.name != "linalg.fill":
        return False
    scalar = _def_op(owner.operands[0])
    if scalar is None or scalar.name != "arith.constant":
        return False
    value = scalar.attributes["value"]
    return (isinstance(value, ir.FloatAttr) and value.value == 0.0) or (
        isinstance(value, ir.IntegerAttr) and value.value == 0)


def _replace(old: ir.Operation, new: ir.Value) -> None:
    old.results[0].replace_all_uses_with(new)
    old.erase()


def _add_init(result: ir.Value, init: ir.Value) -> ir.Value:
    """result + init as a spyre.map, for contractions whose accumulator is not zero."""
    t = ir.RankedTensorType(result.type)
    elt = t.element_type
    m = spyre.MapOp(t, in0=result, in1=init)
    block = m.body.blocks.append(elt, ir.RankedTensorType(init.type).element_type)
    with ir.InsertionPoint(block):
        add = arith.addf if isinstance(elt, ir.FloatType) else arith.addi
        spyre.YieldOp(add(block.arguments[0], block.arguments[1]))
    return m.result


def _convert_contraction(op: ir.Operation) -> None:
    a, b, init = op.operands[0], op.operands[1], op.operands[2]
    t = op.results[0].type
    with ir.InsertionPoint(op), op.location:
        if op.name == "linalg.matmul":
            r = spyre.MatmulOp(a, b, t).result
        else:
            r = spyre.BatchMatmulOp(a, b, t).result
        if not _is_zero_fill(init):
            r = _add_init(r, init)
    _replace(op, r)


def _input_view(v: ir.Value, amap: ir.AffineMap, out_shape: list[int]) -> ir.Value | None:
    """Rewrite an input read through `amap` as a tensor that NumPy-broadcasts to `out_shape`, or None.

    Each map result is a loop dim or the constant 0 (a size-1 dim). Loop dims in decreasing order need a
    transpose first; the dims the map skips become size-1 dims of a reshape.
    """
    t = ir.RankedTensorType(v.type)
    dims: list[int | None] = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            dims.append(e.position)
        elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
            dims.append(None)
        else:
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


def _convert_elementwise(op: ir.Operation) -> None:
    if any(str(it) != "#linalg.iterator_type<parallel>" for it in op.attributes["iterator_types"]):
        return
    n_in = list(op.attributes["operandSegmentSizes"])[0]
    if n_in > spyre.MAP_MAX_INPUTS or len(op.results) != 1:
        return
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    out_t = ir.RankedTensorType(op.results[0].type)
    if maps[-1] != ir.AffineMap.get_identity(out_t.rank) or not all(
            isinstance(v.type, ir.RankedTensorType) for v in list(op.operands)[:n_in]):
        return
    body = op.regions[0].blocks[0]
    args = list(body.arguments)
    if any(len(list(a.uses)) for a in args[n_in:]):
        return  # reads the output: an accumulation, not a map
    captured = _captured_values(op, body)
    if captured is None:
        return
    with ir.InsertionPoint(op), op.location:
        inputs = []
        for v, amap in zip(list(op.operands)[:n_in], maps[:n_in]):
            view = _input_view(v, amap, list(out_t.shape))
            if view is None:
                return
            inputs.append(view)
        m = spyre.MapOp(out_t, **{f"in{i}": v for i, v in enumerate(inputs)})
        block = m.body.blocks.append(*[a.type for a in args[:n_in]])
    mapping = {(a): b for a, b in zip(args, block.arguments)}
    with ir.InsertionPoint(block):
        for v in captured:
            clone = _def_op(v).clone()
            mapping[(v)] = clone.results[0]
        for inner in body.operations:
            if inner.name == "linalg.yield":
                spyre.YieldOp(mapping[(inner.operands[0])], loc=inner.location)
                break
            clone = inner.clone()
            for i, operand in enumerate(clone.operands):
                if (operand) in mapping:
                    clone.operands[i] = mapping[(operand)]
            for old, new in zip(inner.results, clone.results):
                mapping[(old)] = new
    _replace(op, m.result)


def _captured_values(op: ir.Operation, body: ir.Block) -> list[ir.Value] | None:
    """Values the body reads from above; only scalar constants can follow it into the isolated spyre.map."""
    inside = {r for o in body.operations for r in o.results} | set(body.arguments)
    captured = {}
    for o in body.operations:
        if not (o.name.startswith(("arith.", "math.")) or o.name == "linalg.yield"):
            return None
        for v in o.operands:
            if v in inside:
                continue
            owner = _def_op(v)
            if owner is None or owner.name != "arith.constant" or isinstance(v.type, ir.ShapedType):
                return None
            captured[v] = v
    return list(captured.values())


_PATTERNS = {
    "linalg.matmul": _convert_contraction,
    "linalg.batch_matmul": _convert_contraction,
    "linalg.generic": _convert_elementwise,
}
