"""spyre-reduce-precision: give every device tensor the number format the target computes in.

After `spyre-convert-linalg` and `spyre-place-host` the graph computes in the model's types (f32, usually). The
device has no fp32 matmul: the PT array multiplies DLFloat16 (or fp8 / int8) and accumulates in fp32, and the
SFU computes in fp32 and rounds on write. This pass makes that explicit, so later passes (layout, tiling, the
emitter) see the bytes the device moves and the emulator's numerics follow the IR.

Policies (`precision=`):

| policy           | activations | matmul/conv weights (`spyre.param` arguments) | other parameters |
|------------------|-------------|-----------------------------------------------|------------------|
| `dlf16` (default)| dlf16       | dlf16                                         | dlf16            |
| `fp8`            | dlf16       | f8E4M3FN, per-channel scales (then dlf16)     | dlf16            |
| `int8-weights`   | dlf16       | i8, symmetric per-channel scales (then dlf16) | dlf16            |
| `fp32-reference` | f32         | f32                                           | f32              |

In every policy matmul / batch_matmul / conv2d / softmax / layernorm / rmsnorm / reduce get `acc_type = f32`.

Rules (docs/compiler.md, "After spyre-reduce-precision"):
* Device ops (spyre ops other than host/yield, not inside a host region) produce their float results in
  the activation format; integer tensors (indices, masks) are never converted. A conv2d's parameter bias stays
  f32 (`F32_OPERANDS`): the kernel adds it in fp32.
* Every format change is an explicit `spyre.cast`. A float value that no device op produced (function argument,
  host result, `arith.constant`) is cast right before its first device use (a spyre.cast of the model's own
  reads it as it is and becomes that cast); a device value read by anything else (`func.return`,
  the body of a `spyre.host`, which captures values from above) is cast back to its model type right before
  that reader. Each cast is made once per value and target type.
* Quantized weights: `spyre.cast {scale_mode = "per-channel", axis = <output channel>}` to f8E4M3FN / i8 (spyre-fold-constants
  computes the scales from the parameter's values), axis 1 of a matmul rhs [K, N] (0 with
  `transpose_rhs`), the last (second to last) dim of a batch_matmul rhs, 0 of a conv filter [F, C, KH, KW].
  The matmul/conv verifiers require lhs and rhs of one element type while activations stay dlf16, so the
  quantized weight reaches the op through a second cast to dlf16 carrying the same `scale_mode`/`axis`
  (dequantize with the scales of its input); weights are stored and moved in 8 bits.
* `spyre.map` bodies keep computing in f32: block arguments and the yielded value of a reduced-precision tensor
  stay (or become) f32; a body written for another float width (f16, f64) gets an arith.extf/truncf.
* Afterwards identity casts are removed and a plain cast of a plain cast back to the original type folds away.
* Persistent state (`spyre.state`: a KV cache) that a device op computes and only device ops read is held in the
  activation format: the argument and the result of that state get its type, with no cast in or out (its values
  are in that format already). State the host reads or computes keeps its model type.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith

from spyre_mlir import params
from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import function_ops, is_device_op, is_param, is_plain_cast, producer, user
from spyre_mlir.passes.base import OptionError, SpyrePass

PRECISIONS = ("dlf16", "fp8", "int8-weights", "fp32-reference")
ACC_OPS = ("spyre.matmul", "spyre.batch_matmul", "spyre.conv2d", "spyre.softmax", "spyre.layernorm",
           "spyre.rmsnorm", "spyre.reduce")
# Operand index of the weight an op reads: matmul/batch_matmul rhs, conv2d filter.
WEIGHT_SLOT = {"spyre.matmul": 1, "spyre.batch_matmul": 1, "spyre.conv2d": 1}
# Operands a kernel reads in f32 whatever the policy: the conv kernel adds its bias on the SFU from an fp32
# buffer, so a parameter bias keeps its f32 values (rounding it to the activation format would only lose bits).
F32_OPERANDS = {("spyre.conv2d", 2)}


@dataclasses.dataclass
class ReducePrecisionPass(SpyrePass):
    NAME = "spyre-reduce-precision"
    SUMMARY = "Compute device ops in the target's formats (precision=dlf16|fp8|int8-weights|fp32-reference)"

    precision: str = "dlf16"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise OptionError(f"pass '{self.NAME}': option 'precision' must be one of {', '.join(PRECISIONS)}, "
                              f"got '{self.precision}'")

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            act = ir.F32Type.get() if self.precision == "fp32-reference" else spyre.dlf16()
            weight = {"fp8": ir.Float8E4M3FNType.get(),
                      "int8-weights": ir.IntegerType.get_signless(8)}.get(self.precision)
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    _Retyper(act, weight, func).run(block)
                _narrow_device_state(func, act)
            # Later stages (the emitter records it in the binary) need to know the policy.
            module.attributes["spyre.precision"] = ir.StringAttr.get(self.precision)


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def is_float_tensor(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and spyre.is_float_like(ir.RankedTensorType(t).element_type)


def with_element(t: ir.Type, elt: ir.Type) -> ir.Type:
    t = ir.RankedTensorType(t)
    return ir.RankedTensorType.get(list(t.shape), elt, t.encoding)


# ----------------------------------------------------------------------------------------------------------------
# The rewrite of one block


class _Retyper:
    def __init__(self, act: ir.Type, weight: ir.Type | None, func: ir.Operation):
        self.act, self.weight, self.func = act, weight, func
        self.casts: dict[tuple, ir.Value] = {}       # (value, target type, axis) -> cast result
        self.model_type: dict[ir.Value, ir.Type] = {}  # device value -> its type before the pass

    def run(self, block: ir.Block) -> None:
        ops = list(block.operations)
        for op in ops:
            if is_device_op(op):
                self._device_op(op.operation)
        for op in ops:
            if not is_device_op(op):
                self._cast_back_for(op.operation)
        _fold_casts(block)

    def _device_op(self, op: ir.Operation) -> None:
        for i, v in enumerate(op.operands):
            # A spyre.cast (the model's own) reads any format: its input needs no cast of its own.
            if not is_float_tensor(v.type) or self._is_device_value(v) or op.name == "spyre.cast":
                continue
            if (op.name, i) in F32_OPERANDS:
                continue
            axis = self._weight_axis(op, i, v)
            if axis is None:
                op.operands[i] = self._cast(v, self.act, op)
            else:
                q = self._cast(v, self.weight, op, axis)
                op.operands[i] = self._cast(q, self.act, op, axis)
        keep = op.name == "spyre.cast" and not is_plain_cast(op)  # the model's own quantization stays
        for r in op.results:
            if is_float_tensor(r.type) and not keep:
                self.model_type[r] = r.type
                r.set_type(with_element(r.type, self.act))
        if op.name in ACC_OPS:
            op.attributes["acc_type"] = ir.TypeAttr.get(ir.F32Type.get())
        if op.name == "spyre.map":
            _compute_map_in_f32(op)

    def _is_device_value(self, v: ir.Value) -> bool:
        op = producer(v)
        return op is not None and is_device_op(op)

    def _weight_axis(self, op: ir.Operation, i: int, v: ir.Value) -> int | None:
        """The output-channel axis when operand `i` of `op` is a weight to quantize, else None."""
        if self.weight is None or WEIGHT_SLOT.get(op.name) != i or not is_param(v, self.func):
            return None
        rank = ir.RankedTensorType(v.type).rank
        transposed = "transpose_rhs" in op.attributes and ir.BoolAttr(op.attributes["transpose_rhs"]).value
        if op.name == "spyre.conv2d":
            return 0
        return rank - 2 if transposed else rank - 1

    def _cast(self, v: ir.Value, elt: ir.Type, before: ir.Operation, axis: int | None = None) -> ir.Value:
        """`v` converted to element type `elt`, cast right before `before` the first time it is asked for."""
        if ir.RankedTensorType(v.type).element_type == elt:
            return v
        key = (v, elt, axis)
        if key not in self.casts:
            with ir.InsertionPoint(before), before.location:
                c = spyre.CastOp(v, with_element(v.type, elt)).operation
            if axis is not None:
                c.attributes["scale_mode"] = ir.StringAttr.get("per-channel")
                c.attributes["axis"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), axis)
            self.casts[key] = c.results[0]
        return self.casts[key]

    def _cast_back_for(self, op: ir.Operation) -> None:
        """Give `op` (and the ops nested in it: a host body) the model's type of every device value it reads."""
        readers: list[ir.Operation] = []
        op.walk(lambda o: readers.append(o) or ir.WalkResult.ADVANCE)
        for reader in readers:
            for i, v in enumerate(reader.operands):
                model = self.model_type.get(v)
                if model is not None and v.type != model:
                    reader.operands[i] = self._cast(v, ir.RankedTensorType(model).element_type, op)


def _narrow_device_state(func: ir.Operation, act: ir.Type) -> None:
    """Persistent state (a `spyre.state` argument and the result of the same name: a KV cache) whose new value a
    device op computes, and which only device ops read, is held in the activation format. Its values are in that
    format already (computed on the device, widened only to be stored and narrowed again when read), so nothing
    changes but the bytes: a cast of the whole state on the way in and on the way out, and half of every copy. A
    state the host reads or computes keeps its model type (a counter the host increments must stay exact)."""
    block = func.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1].operation
    if ret.name != "func.return" or "function_type" not in func.attributes:
        return
    arg_of = {ir.StringAttr(d["spyre.state"]).value: i for i, d in enumerate(params.arg_dicts(func))
              if "spyre.state" in d}
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    ins, outs = list(ftype.inputs), list(ftype.results)
    for o, d in enumerate(params.result_dicts(func)):
        i = arg_of.get(ir.StringAttr(d["spyre.state"]).value) if "spyre.state" in d else None
        if i is None or not is_float_tensor(block.arguments[i].type):
            continue
        arg, narrow = block.arguments[i], with_element(block.arguments[i].type, act)
        back = producer(ret.operands[o])           # this pass's cast of the new value back to the model type
        if arg.type == narrow or not is_plain_cast(back) or back.operands[0].type != narrow \
                or producer(back.operands[0]) is None or not is_device_op(producer(back.operands[0])):
            continue
        if not all(is_plain_cast(user(u)) and user(u).results[0].type == narrow for u in arg.uses):
            continue
        arg.set_type(narrow)
        ret.operands[o] = back.operands[0]
        ins[i] = outs[o] = narrow
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ins, outs))
    _fold_casts(block)


def _compute_map_in_f32(op: ir.Operation) -> None:
    """Block arguments and yield of a map compute in compute_type(element) (f32 for reduced floats)."""
    block = op.regions[0].blocks[0]
    first = block.operations[0]
    for arg, v in zip(block.arguments, op.operands):
        want = spyre.compute_type(ir.RankedTensorType(v.type).element_type)
        old = arg.type
        if old in (ir.RankedTensorType(v.type).element_type, want) or not isinstance(old, ir.FloatType):
            continue
        arg.set_type(want)
        with ir.InsertionPoint(first), op.location:
            conv = _convert_scalar(arg, old)
        arg.replace_all_uses_except(conv, conv.owner.operation)
    y = block.operations[len(block.operations) - 1]
    r_elt = ir.RankedTensorType(op.results[0].type).element_type
    want = spyre.compute_type(r_elt)
    val = y.operands[0]
    if val.type not in (r_elt, want) and isinstance(val.type, ir.FloatType):
        with ir.InsertionPoint(y), op.location:
            y.operands[0] = _convert_scalar(val, want)


def _convert_scalar(v: ir.Value, to: ir.Type) -> ir.Value:
    if ir.FloatType(v.type).width < ir.FloatType(to).width:
        return arith.ExtFOp(to, v).result
    return arith.TruncFOp(to, v).result


def _fold_casts(block: ir.Block) -> None:
    """Drop identity casts and fold `cast(cast(x))` back to x's own type; erase casts left unused."""
    for op in list(block.operations):
        op = op.operation
        if not is_plain_cast(op):
            continue
        x = op.operands[0]
        inner = producer(x)
        if x.type == op.results[0].type:
            op.results[0].replace_all_uses_with(x)
        elif is_plain_cast(inner) and inner.operands[0].type == op.results[0].type:
            op.results[0].replace_all_uses_with(inner.operands[0])
    for op in reversed(list(block.operations)):
        op = op.operation
        if op.name == "spyre.cast" and not list(op.results[0].uses):
            op.erase()
