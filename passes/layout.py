"""spyre-layout: give every device tensor its stick layout and make restickifies explicit ops.

Device memory holds tensors in 128-byte sticks along one dimension, padded to whole sticks (64 dlf16, 32 f32 or
128 fp8 elements per stick). Tiling, scratchpad sizes and the emitter's DMA all depend on which dimension is
sticked, so after this pass the type says it: `tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>`.

Rules (docs/compiler.md, "After spyre-layout"):
* Every result of a device op (a spyre op other than host/yield, not inside a host region; casts
  included) gets `#spyre.stick<rank - 1>`: the innermost dimension is the stick dimension. That is also what
  the PT array wants: matmul reads A sticked on K and B sticked on N and writes the result sticked on N.
* A matmul / batch_matmul with `transpose_rhs = true` has its rhs as [N, K], sticked on K. The matmul kernel
  reads it so (MATMUL `TRANS_B`), and the flag stays, when the rhs is computed at run time (attention's k for
  q @ k^T: no restickify kernel) or when a weight takes fewer sticks so (a classifier's [10, 4096]: 10 rows
  of 64 sticks instead of 4096 rows of one mostly empty stick). Otherwise it gets an explicit
  `spyre.transpose {restickify = true}` of its rhs (swapping the last two dims) and loses the flag. One
  transpose per rhs value, placed before its first use. When the rhs is a parameter (possibly through the casts
  of spyre-reduce-precision), spyre-select-kernels marks the transpose `spyre.const_fold`: spyre-emit does it
  at compile time, so it costs nothing at run time.
* A matmul rhs that is a swap of the last two dims (maybe behind a reshape of the batch dims), the swap's only
  reader, is read from the tensor before the swap with `transpose_rhs` (then as above): attention's k^T.
* A transpose that moves the innermost dimension to the second-to-last place and permutes the others
  (`[0, 2, 3, 1]`: attention's K^T after the head split) becomes a transpose that keeps the innermost dim
  (row moves) followed by a `restickify` swap of the last two dims: the two forms the device has.
* The boundary keeps the model's types: function arguments are not touched, and a device value read by
  anything that is not a device op (`func.return`, the body of a `spyre.host`) keeps its plain type. After
  spyre-reduce-precision such values are the cast-backs to the model's types; under `fp32-reference` they are
  the device results themselves, left un-encoded so func.return still matches the signature.
* Rank-0 tensors get no encoding (no dimension to stick); a type that already has an encoding keeps it.
"""

import dataclasses

from torch_mlir import ir

from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import MATMULS, function_ops, is_device_op, is_param_derived, producer, single_use
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.runtime.formats import STICK_BYTES


@dataclasses.dataclass
class LayoutPass(SpyrePass):
    NAME = "spyre-layout"
    SUMMARY = "Stick layout encodings on device tensors; explicit restickify transposes for transpose_rhs"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    transposes: dict[ir.Value, ir.Value] = {}
                    for op in list(block.operations):
                        if op.operation.name in MATMULS and is_device_op(op) and not _transpose_rhs(op.operation):
                            _fold_rhs_transpose(op.operation)
                        if op.operation.name in MATMULS and is_device_op(op) and _transpose_rhs(op.operation) \
                                and not _reads_transposed(op.operation, func):
                            _restickify_rhs(op.operation, func, transposes)
                        elif op.operation.name == "spyre.transpose" and is_device_op(op):
                            _split_innermost_transpose(op.operation)
                    for op in block.operations:
                        if is_device_op(op):
                            for r in op.operation.results:
                                _set_stick(r)


def _transpose_rhs(op: ir.Operation) -> bool:
    return "transpose_rhs" in op.attributes and ir.BoolAttr(op.attributes["transpose_rhs"]).value


def _fold_rhs_transpose(op: ir.Operation) -> None:
    """A matmul rhs that is its only reader's swap of the last two dims of a tensor, maybe behind a reshape of
    the leading (batch) dims (attention's k^T after the head split): the matmul reads that tensor transposed
    (transpose_rhs) instead, and the swap goes."""
    rhs = op.operands[1]
    chain, v = [], rhs
    p = producer(v)
    if p is not None and p.name == "spyre.reshape" and single_use(v) is not None:
        chain.append(p)
        v, p = p.operands[0], producer(p.operands[0])
    if p is None or p.name != "spyre.transpose" or single_use(v) is None or "restickify" in p.attributes:
        return
    perm = list(ir.DenseI64ArrayAttr(p.attributes["permutation"]))
    r = len(perm)
    if r < 2 or perm != list(range(r - 2)) + [r - 1, r - 2]:
        return
    src = p.operands[0]
    st, bt = ir.RankedTensorType(src.type), ir.RankedTensorType(rhs.type)
    if list(st.shape[-2:]) != list(bt.shape[-2:])[::-1]:
        return
    if list(st.shape) != list(bt.shape[:-2]) + list(bt.shape[-2:])[::-1]:
        with ir.InsertionPoint(op), op.location:
            src = spyre.ReshapeOp(src, ir.RankedTensorType.get(list(bt.shape[:-2]) + list(st.shape[-2:]),
                                                               st.element_type)).result
    op.operands[1] = src
    op.attributes["transpose_rhs"] = ir.BoolAttr.get(True)
    for dead in chain + [p]:
        dead.erase()


def _reads_transposed(op: ir.Operation, func: ir.Operation) -> bool:
    """The matmul reads its [N, K] rhs as it is (TRANS_B): a run-time rhs (a restickify would be a kernel of
    its own), or a weight that takes fewer sticks [N, K] than [K, N]."""
    rhs = op.operands[1]
    if not is_param_derived(rhs, func):
        return True
    t = ir.RankedTensorType(rhs.type)
    n, k = t.shape[-2], t.shape[-1]
    from spyre_mlir.codegen.memory import format_of

    per_stick = STICK_BYTES * 8 // format_of(t.element_type).bits
    return n * -(-k // per_stick) < k * -(-n // per_stick)


def _restickify_rhs(op: ir.Operation, func: ir.Operation, transposes: dict) -> None:
    rhs = op.operands[1]
    if rhs not in transposes:
        t = ir.RankedTensorType(rhs.type)
        perm = list(range(t.rank))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        shape = [t.shape[p] for p in perm]
        with ir.InsertionPoint(op), op.location:
            tr = spyre.TransposeOp(rhs, ir.RankedTensorType.get(shape, t.element_type)).operation
        tr.attributes["permutation"] = ir.DenseI64ArrayAttr.get(perm)
        tr.attributes["restickify"] = ir.BoolAttr.get(True)
        transposes[rhs] = tr.results[0]
    op.operands[1] = transposes[rhs]
    del op.attributes["transpose_rhs"]


def _split_innermost_transpose(op: ir.Operation) -> None:
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    r = len(perm)
    if r < 3 or perm[-1] == r - 1 or perm[-2] != r - 1 or perm[:-2] + [perm[-1], perm[-2]] == list(range(r)):
        return      # keeps the innermost dim, is already the last-two swap, or is not of this form
    t = ir.RankedTensorType(op.operands[0].type)
    first = perm[:-2] + [perm[-1], perm[-2]]          # keeps the innermost dim (perm[-2] == r - 1)
    with ir.InsertionPoint(op), op.location:
        rows = spyre.TransposeOp(op.operands[0], ir.RankedTensorType.get([t.shape[p] for p in first],
                                                                         t.element_type)).operation
    rows.attributes["permutation"] = ir.DenseI64ArrayAttr.get(first)
    swap = list(range(r))
    swap[-2], swap[-1] = swap[-1], swap[-2]
    op.operands[0] = rows.results[0]
    op.attributes["permutation"] = ir.DenseI64ArrayAttr.get(swap)
    op.attributes["restickify"] = ir.BoolAttr.get(True)


def _set_stick(v: ir.Value) -> None:
    if not isinstance(v.type, ir.RankedTensorType):
        return
    t = ir.RankedTensorType(v.type)
    if t.rank == 0 or t.encoding is not None:
        return
    if any(not is_device_op(use.owner) for use in v.uses):
        return  # read at the boundary (func.return, a host body): keeps the model's plain type
    v.set_type(ir.RankedTensorType.get(list(t.shape), t.element_type, spyre.stick(t.rank - 1)))
