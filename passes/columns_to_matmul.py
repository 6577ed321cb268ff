"""spyre-columns-to-matmul: a concat of (negated) column slices of one tensor is one matmul by a constant.

`rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])`, in every rotary-embedding model (Llama, Qwen, Mistral,
Gemma, Granite), arrives as two slices of the innermost dim, a negating map and a concat: four data movement
kernels, each a round trip through device memory and, below a stick, selection matmuls of its own. Column `j`
of the result is `s_j` times column `c_j` of `x`, so the chain is `x @ P` with `P[c_j, j] = s_j` and zeros
elsewhere: one matmul on the PT array. It is exact: every result is one product by +-1 accumulated in fp32, and
0 and +-1 are exact in every device format.

    %a = "spyre.slice"(%x) {offsets = [0, 32], sizes = [S, 32], ...}   %m = "spyre.reshape"(%x) : [.., 64] -> [R, 64]
    %b = "spyre.slice"(%x) {offsets = [0, 0], sizes = [S, 32], ...}    %p = "spyre.matmul"(%m, %P) : -> [R, 64]
    %n = "spyre.map"(%a) ({ negf })                               ->   %r = "spyre.reshape"(%p) : [R, 64] -> [.., 64]
    %r = "spyre.concat"(%n, %b) {dim = -1}

Rules: a device `spyre.concat` along the innermost dim (a chain of them) whose pieces are each a slice of the
same device float tensor `x` that keeps every outer dim whole and takes a (strided) range of the innermost one,
or a map that only negates such a slice; every slice, map and inner concat has its one reader in the chain
(else it is computed anyway). Run after spyre-reduce-precision: `P` is a constant in `x`'s element type.
"""

import dataclasses

import numpy as np
from torch_mlir import ir

from spyre_mlir import params
from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import ON_HOST, function_ops, is_device_op, producer, single_use
from spyre_mlir.passes.base import SpyrePass


def _ints(op, name) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name])) if name in op.attributes else []


def _on_device(op) -> bool:
    return op is not None and is_device_op(op) and ON_HOST not in op.attributes


def _negates(op) -> bool:
    """A one-input map whose body is `-x`."""
    if op.name != "spyre.map" or len(op.operands) != 1:
        return False
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    return (len(body) == 2 and body[0].name == "arith.negf" and body[1].name == "spyre.yield"
            and body[1].operands[0] == body[0].results[0])


def _columns(piece: ir.Value, rank: int):
    """(x, the columns of x the piece takes, their sign) for a slice of x's innermost dim, possibly negated by a
    map it is the only reader of; None for anything else."""
    op, sign = producer(piece), 1.0
    if op is not None and _negates(op) and _on_device(op) and single_use(op.operands[0]) is not None:
        op, sign = producer(op.operands[0]), -1.0
    if op is None or op.name != "spyre.slice" or not _on_device(op):
        return None
    x = op.operands[0]
    shape = list(ir.RankedTensorType(x.type).shape)
    off, size = _ints(op, "offsets"), _ints(op, "sizes")
    step = _ints(op, "strides") or [1] * rank
    if len(shape) != rank or off[:-1] != [0] * (rank - 1) or size[:-1] != shape[:-1] or step[:-1] != [1] * (rank - 1):
        return None
    return x, off[-1] + step[-1] * np.arange(size[-1]), sign


def _pieces(concat: ir.Operation, rank: int, chain: list) -> list | None:
    """The concat's pieces in order, inner concats along the same dim (each read only by the chain) flattened;
    ``chain`` collects the inner concats."""
    out = []
    for v in concat.operands:
        op = producer(v)
        if op is not None and op.name == "spyre.concat" and _on_device(op) and single_use(v) is not None \
                and _dim(op, rank) == rank - 1:
            chain.append(op)
            inner = _pieces(op, rank, chain)
            if inner is None:
                return None
            out += inner
        else:
            out.append(v)
    return out


def _dim(op, rank: int) -> int:
    return ir.IntegerAttr(op.attributes["dim"]).value % rank


def _outermost(op: ir.Operation) -> bool:
    """A device concat along the innermost dim of a float tensor that is not a piece of another such concat."""
    if op.name != "spyre.concat" or not _on_device(op):
        return False
    rt = ir.RankedTensorType(op.results[0].type)
    if rt.rank < 1 or _dim(op, rt.rank) != rt.rank - 1 or not spyre.is_float_like(rt.element_type):
        return False
    use = single_use(op.results[0])
    user = use.owner.operation if use is not None and hasattr(use.owner, "operation") else None
    return not (user is not None and user.name == "spyre.concat" and _on_device(user)
                and _dim(user, rt.rank) == rt.rank - 1)


def _first_reader(op: ir.Operation) -> ir.Operation:
    """The earliest reader of the op's result in its block (the op itself when one is elsewhere)."""
    first = None
    for use in op.results[0].uses:
        user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        if user.block != op.block:
            return op
        if first is None or user.is_before_in_block(first):
            first = user
    return first or op


def _reshaped(v: ir.Value, t: ir.RankedTensorType) -> ir.Value:
    """``v`` as type ``t`` (a spyre.reshape at the insertion point unless it is one already)."""
    if v.type == t:
        return v
    return ir.Operation.create("spyre.reshape", results=[t], operands=[v]).results[0]


@dataclasses.dataclass
class ColumnsToMatmulPass(SpyrePass):
    NAME = "spyre-columns-to-matmul"
    SUMMARY = "A concat of (negated) column slices of one tensor becomes a matmul by a constant signed selection"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    # The outermost concat of each chain (an inner one is rewritten as part of it); chains share
                    # no op, so rewriting one leaves the others' ops in place.
                    for op in [o.operation for o in block.operations if _outermost(o.operation)]:
                        self._rewrite(op)

    def _rewrite(self, concat: ir.Operation) -> None:
        rt = ir.RankedTensorType(concat.results[0].type)
        rank = rt.rank
        chain = []
        pieces = _pieces(concat, rank, chain)
        found = [_columns(v, rank) for v in pieces] if pieces else [None]
        if any(f is None for f in found) or any(f[0] != found[0][0] for f in found) \
                or any(single_use(v) is None for v in pieces):
            return
        x = found[0][0]
        shape = list(rt.shape)
        d_in = ir.RankedTensorType(x.type).shape[-1]
        P = np.zeros((d_in, shape[-1]), np.float32)
        j = 0
        for _, cols, sign in found:
            P[cols, np.arange(j, j + len(cols))] = sign
            j += len(cols)
        elt, loc = rt.element_type, concat.location
        rows = int(np.prod(shape[:-1])) if rank > 1 else 1
        # Just before the first reader: what it reads besides the product (rotary embedding's cos and sin, cast
        # there by spyre-reduce-precision) is defined by then, so a map reading both can be the matmul's epilogue.
        at = _first_reader(concat)
        with ir.InsertionPoint(at), loc:
            p_t = ir.RankedTensorType.get([d_in, shape[-1]], elt)
            const = ir.Operation.create("arith.constant", results=[p_t], attributes={
                "value": params.constant_attr(P, p_t, "columns"), "spyre.name": ir.StringAttr.get("columns")})
            lhs = _reshaped(x, ir.RankedTensorType.get([rows, d_in], elt))
            mm = ir.Operation.create("spyre.matmul", results=[ir.RankedTensorType.get([rows, shape[-1]], elt)],
                                     operands=[lhs, const.results[0]], attributes={
                                         "acc_type": ir.TypeAttr.get(ir.F32Type.get()),
                                         "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1, 0])})
            out = _reshaped(mm.results[0], rt)
        concat.results[0].replace_all_uses_with(out)
        dead = [concat] + chain          # readers before what they read: the chain is outermost first
        for v in pieces:
            op = producer(v)
            dead.append(op)
            if op.name == "spyre.map":
                dead.append(producer(op.operands[0]))
        for op in dead:
            op.erase()
