"""spyre-fuse: fold the format conversions around a matmul (or before a conv2d) into the op's kernel.

After spyre-reduce-precision a matmul on model inputs reads them through `spyre.cast` f32 -> dlf16 and returns
through `spyre.cast` dlf16 -> f32. Run as separate kernels those casts are memory-bound round trips through
device memory (read f32, write dlf16, read it again); the matmul kernel can do the same conversions in the
scratchpad instead (the SFU CAST it already uses for operands in formats the PT array does not multiply), so
device memory sees each tensor once.

Rules (docs/compiler.md, "After spyre-fuse"):
* A plain `spyre.cast` (no scale) of a float tensor to a PT format (dlf16), whose only use is the lhs or rhs of
  a device `spyre.matmul` / `spyre.batch_matmul`, is folded into it: the matmul reads the cast's input directly
  and records the format it converts that operand to on the scratchpad in
  `spyre.convert_operands = {lhs = <type>, rhs = <type>}`. A cast of a compile-time value (a parameter,
  possibly through casts, reshapes and transposes) is left alone: the emitter converts it at compile time.
* Likewise a plain `spyre.cast` of a runtime f32 tensor to dlf16 whose only use is a device `spyre.conv2d`'s input:
  the conv reads the f32 input, converts each patch on the scratchpad, and records
  `spyre.convert_operands = {input = <type>}` (its filters stay in their own format).
* A plain `spyre.cast` whose input is the result of such a matmul (its only use; or a reshape of it, each
  reshape the only use of the value before it) and which only widens it (dlf16 -> f32: exact) is folded into the
  matmul's write-back: the matmul (and the reshapes) produce the cast's element type and
  `spyre.convert_result = <type>` records the format the accumulator is rounded to first, so the values are
  bit-identical to the unfused program.
* A plain `spyre.cast` of a runtime f32 tensor to dlf16 that only SFU work reads - at most two device
  `spyre.map` operands and `spyre.rmsnorm` / `spyre.layernorm` inputs (a decoder block's input, read by its
  first norm and its residual add) - is dropped: those kernels load the f32 tensor and compute on it in fp32 as
  they compute on everything, so the conversion kernel and its DRAM round trip (read f32, write and read back
  dlf16 per reader) go, and the readers see the exact values instead of their rounding (a rounding fewer than
  the unfused program; each reader still rounds its result). With three readers or more the f32 reads would
  move more bytes than the round trip, and the cast stays.
"""

import dataclasses

from torch_mlir import ir

from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import (CONVERT_OPERANDS, CONVERT_RESULT, MATMULS, NORMS, function_ops,
                                        is_device_op, is_param_derived, is_plain_cast, producer, single_use, user)
from spyre_mlir.passes.base import SpyrePass

_SLOTS = ("lhs", "rhs")
_SFU_READERS = 2        # more f32 reads than this move more bytes than a cast's round trip


def _elt(v: ir.Value) -> ir.Type:
    return ir.RankedTensorType(v.type).element_type


def _widens(src: ir.Type, dst: ir.Type) -> bool:
    """Converting src -> dst is exact (dlf16 -> f32)."""
    return spyre.is_dlf16(src) and isinstance(dst, ir.F32Type)


def _runtime_value(v: ir.Value, func: ir.Operation) -> bool:
    """`v` is only known at run time: a model input or the result of a device op or host region that is not
    computed from parameters alone (those the emitter converts at compile time)."""
    if is_param_derived(v, func):
        return False
    op = producer(v)
    return op is None or op.name == "spyre.host" or is_device_op(op)


@dataclasses.dataclass
class FusePass(SpyrePass):
    NAME = "spyre-fuse"
    SUMMARY = "Fold operand/result format casts of matmuls into the matmul kernel (spyre.convert_*)"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    for op in [o.operation for o in block.operations]:
                        if is_plain_cast(op) and is_device_op(op):
                            self._drop_for_sfu(op, func)
                    for op in list(block.operations):
                        op = op.operation
                        if op.name in MATMULS and is_device_op(op):
                            self._fuse(op, func)
                        elif op.name == "spyre.conv2d" and is_device_op(op):
                            self._fuse_input(op, func)

    def _drop_for_sfu(self, cast: ir.Operation, func: ir.Operation) -> None:
        """Readers that compute in fp32 on the SFU read a runtime f32 tensor directly (module docstring)."""
        x, v = cast.operands[0], cast.results[0]
        uses = list(v.uses)
        if not (isinstance(_elt(x), ir.F32Type) and spyre.is_dlf16(_elt(v)) and 0 < len(uses) <= _SFU_READERS
                and _runtime_value(x, func) and ir.RankedTensorType(x.type).shape == ir.RankedTensorType(v.type).shape):
            return
        for use in uses:
            u = user(use)
            if not is_device_op(u) or not (u.name == "spyre.map" or (u.name in NORMS and use.operand_number == 0)):
                return
        v.replace_all_uses_with(x)
        cast.erase()

    def _fuse_input(self, op: ir.Operation, func: ir.Operation) -> None:
        """A conv2d reads its model input directly when a plain cast to dlf16 is that value's only reader: its
        kernel converts each input patch on the scratchpad (its filters keep their own format)."""
        v = op.operands[0]
        cast = producer(v)
        if not (is_plain_cast(cast) and is_device_op(cast)) or single_use(v) is None:
            return
        x = cast.operands[0]
        if not isinstance(_elt(x), ir.F32Type) or not spyre.is_dlf16(_elt(v)) or not _runtime_value(x, func):
            return
        op.operands[0] = x
        op.attributes[CONVERT_OPERANDS] = ir.DictAttr.get({"input": ir.TypeAttr.get(_elt(v))})
        cast.erase()

    def _fuse(self, op: ir.Operation, func: ir.Operation) -> None:
        conv = {}
        if CONVERT_OPERANDS in op.attributes:
            conv = {na.name: na.attr for na in ir.DictAttr(op.attributes[CONVERT_OPERANDS])}
        for i, slot in enumerate(_SLOTS):
            v = op.operands[i]
            cast = producer(v)
            if not (is_plain_cast(cast) and is_device_op(cast)) or single_use(v) is None:
                continue
            x = cast.operands[0]
            src, dst = _elt(x), _elt(v)
            if not isinstance(src, ir.FloatType) or not spyre.is_dlf16(dst) or not _runtime_value(x, func):
                continue
            op.operands[i] = x
            conv[slot] = ir.TypeAttr.get(dst)
            cast.erase()
        if conv:
            op.attributes[CONVERT_OPERANDS] = ir.DictAttr.get(conv)
        r = op.results[0]
        if CONVERT_RESULT in op.attributes:
            return
        # The cast may read the result through reshapes (a Linear's [B*S, N] viewed as [B, S, N]), each the only
        # reader of the value before it: they then reshape the widened values.
        chain, v = [], r
        while True:
            use = single_use(v)
            if use is None:
                return
            user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if user.name != "spyre.reshape" or not is_device_op(user):
                break
            chain.append(user)
            v = user.results[0]
        cast = user
        if not (is_plain_cast(cast) and is_device_op(cast)) or not _widens(_elt(v), _elt(cast.results[0])):
            return
        op.attributes[CONVERT_RESULT] = ir.TypeAttr.get(_elt(r))
        wide = cast.results[0].type
        values = [r] + [c.results[0] for c in chain]
        for x in values[:-1]:           # the values before the last (the cast's own type) keep their layout
            t = ir.RankedTensorType(x.type)
            x.set_type(ir.RankedTensorType.get(t.shape, ir.RankedTensorType(wide).element_type, t.encoding))
        v.set_type(wide)
        cast.results[0].replace_all_uses_with(v)
        cast.erase()
