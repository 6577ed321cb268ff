"""The `spyre` dialect: graph-level dataflow ops for the Spyre accelerator.

Defined in Python through IRDL (`torch_mlir.dialects.ext`), so ops print and parse in MLIR's generic form.
IRDL only checks arity here; every op's real invariants (ranks, shapes, element types, attributes) live in its
`verify_invariants`, which reports through the op's location with the op name first, like C++ `emitOpError`.

Attributes are plain discardable attributes checked by the verifiers rather than IRDL-declared ones, because
IRDL cannot express optional attributes and ops such as `spyre.matmul {transpose_rhs}` need defaults.
Ops with optional operands (a bias, a weight, a scale, a map's inputs) declare each as an optional operand slot
and carry `operandSegmentSizes` (1 per required slot, 0 or 1 per optional one), which their verifier requires.
"""


import math
from typing import Any, Optional, Sequence

from torch_mlir import ir
from torch_mlir.dialects import irdl
from torch_mlir.dialects._ods_common import _cext
from torch_mlir.dialects.ext import Dialect, Operand, Pure, Region, Result

# OpView casts look dialect modules up by prefix; without this every cast retries a failing import (~70 us).
_cext.globals.append_dialect_search_prefix("spyre_mlir.dialects")


class Spyre(Dialect, name="spyre"):
    pass


# ----------------------------------------------------------------------------------------------------------------
# Types and attributes


class DLFloat16Type(Spyre.Type, name="dlf16"):
    """IBM DLFloat16: 1 sign, 6 exponent (bias 31), 9 fraction bits; no subnormals, one NaN/Inf pattern.

        tensor<64x128x!spyre.dlf16>
    """


class StickAttr(Spyre.Attribute, name="stick"):
    """Stick layout encoding: `dim` is laid out in 128-byte sticks and padded to whole sticks.

        tensor<64x100xf32, #spyre.stick<1 : i64>>
    """

    dim: ir.IntegerAttr


def dlf16(context: ir.Context | None = None) -> ir.Type:
    return DLFloat16Type.get(context=context)


def stick(dim: int, context: ir.Context | None = None) -> ir.Attribute:
    return StickAttr.get(ir.IntegerAttr.get(ir.IntegerType.get_signless(64, context), dim), context=context)


def is_dlf16(t: ir.Type) -> bool:
    return isinstance(t, DLFloat16Type) or str(t) == "!spyre.dlf16"


def is_float_like(t: ir.Type) -> bool:
    return isinstance(t, ir.FloatType) or is_dlf16(t)


def is_reduced_float(t: ir.Type) -> bool:
    """Float formats narrower than f32: stored reduced, computed in f32 by the SFU."""
    return is_dlf16(t) or (isinstance(t, ir.FloatType) and t.width < 32)


def compute_type(t: ir.Type) -> ir.Type:
    """The scalar type the SFU computes a tensor element of type `t` in."""
    return ir.F32Type.get() if is_reduced_float(t) else t


def is_integer(t: ir.Type) -> bool:
    return isinstance(t, ir.IntegerType) or isinstance(t, ir.IndexType)


def load(context: ir.Context | None = None) -> None:
    """Load the dialect into `context` (or the current one); a second call is a no-op.

    Unlike `Dialect.load`, the IRDL module is not canonicalized: CSE would merge every field's `irdl.any` into
    one constraint variable, and IRDL requires all uses of one variable to bind the same type, so an op could
    not take, say, a 32x64 lhs and a 64x16 rhs.
    """
    ctx = context or ir.Context.current
    if ctx.is_dialect_loaded(Spyre.DIALECT_NAMESPACE):
        return
    with ctx, ir.Location.unknown(ctx):
        Spyre._mlir_module = Spyre._emit_module()
        irdl.load_dialects(Spyre._mlir_module)
        for op in Spyre.operations:
            op._attach_traits()
        _cext.globals._register_dialect_impl(Spyre.DIALECT_NAMESPACE, Spyre, replace=True)
        for t in Spyre.types:
            _cext.register_type_caster(ir.DynamicType.lookup_typeid(t.type_name), replace=True)(t)
        for a in Spyre.attributes:
            _cext.register_type_caster(ir.DynamicAttr.lookup_typeid(a.attr_name), replace=True)(a)
        for op in Spyre.operations:
            _cext.register_operation(Spyre, replace=True)(op)
            _cext.register_op_adaptor(op, replace=True)(op.Adaptor)


# ----------------------------------------------------------------------------------------------------------------
# Verifier helpers. Each raises _Invalid with the message; SpyreOp turns it into a located diagnostic.


class _Invalid(Exception):
    pass


def _tensor(v: ir.Value, what: str) -> ir.RankedTensorType:
    t = v.type
    if not isinstance(t, ir.RankedTensorType):
        raise _Invalid(f"{what} must be a ranked tensor, got {t}")
    t = ir.RankedTensorType(t)
    if any(d == ir.ShapedType.get_dynamic_size() for d in t.shape):
        raise _Invalid(f"{what} must have a static shape, got {t}")
    return t


def _shape(t: ir.RankedTensorType) -> list[int]:
    return list(t.shape)


def _fmt(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _rank(t: ir.RankedTensorType, what: str, *ranks: int) -> None:
    if t.rank not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise _Invalid(f"{what} must be rank {want}, got rank {t.rank}")


def _same_elt(a: ir.RankedTensorType, b: ir.RankedTensorType, what: str) -> None:
    if a.element_type != b.element_type:
        raise _Invalid(f"{what}: element types differ ({a.element_type} vs {b.element_type})")


def _matmul_operands_elt(op, a: ir.RankedTensorType, b: ir.RankedTensorType) -> None:
    """lhs and rhs multiply in one element type: their own, or what `spyre.convert_operands = {lhs = T, rhs = T}`
    (set by spyre-fuse) converts them to on the scratchpad."""
    conv = _attr(op, "spyre.convert_operands")
    ea, eb = a.element_type, b.element_type
    if conv is not None:
        if not isinstance(conv, ir.DictAttr):
            raise _Invalid(f"attribute 'spyre.convert_operands' must be a dictionary, got {conv}")
        d = {na.name: na.attr for na in ir.DictAttr(conv)}
        ea = ir.TypeAttr(d["lhs"]).value if "lhs" in d else ea
        eb = ir.TypeAttr(d["rhs"]).value if "rhs" in d else eb
    if ea != eb:
        raise _Invalid(f"lhs and rhs: element types differ ({ea} vs {eb})")


def _conv_operands_elt(op, x: ir.RankedTensorType, w: ir.RankedTensorType) -> None:
    """Input and filter multiply in one element type: their own, or the input converted on the scratchpad to
    what `spyre.convert_operands = {input = T}` (set by spyre-fuse) says."""
    conv = _attr(op, "spyre.convert_operands")
    ex = x.element_type
    if conv is not None:
        if not isinstance(conv, ir.DictAttr):
            raise _Invalid(f"attribute 'spyre.convert_operands' must be a dictionary, got {conv}")
        d = {na.name: na.attr for na in ir.DictAttr(conv)}
        ex = ir.TypeAttr(d["input"]).value if "input" in d else ex
    if ex != w.element_type:
        raise _Invalid(f"input and filter: element types differ ({ex} vs {w.element_type})")


def _expect_shape(t: ir.RankedTensorType, shape: Sequence[int], what: str) -> None:
    if _shape(t) != list(shape):
        raise _Invalid(f"{what} shape {_fmt(_shape(t))} does not match expected {_fmt(shape)}")


def _attr(op: ir.OpView, name: str, default: Any = None, required: bool = False):
    attrs = op.operation.attributes
    if name not in attrs:
        if required:
            raise _Invalid(f"requires attribute '{name}'")
        return default
    return attrs[name]


def _int_attr(op, name, default=None, required=False) -> int | None:
    a = _attr(op, name, default, required)
    if a is default:
        return default
    if not isinstance(a, ir.IntegerAttr):
        raise _Invalid(f"attribute '{name}' must be an integer, got {a}")
    return ir.IntegerAttr(a).value


def _bool_attr(op, name, default=False) -> bool:
    a = _attr(op, name, None)
    if a is None:
        return default
    if not isinstance(a, ir.BoolAttr):
        raise _Invalid(f"attribute '{name}' must be a bool, got {a}")
    return ir.BoolAttr(a).value


def _float_attr(op, name, default=None, required=False) -> float | None:
    a = _attr(op, name, None, required)
    if a is None:
        return default
    if not isinstance(a, ir.FloatAttr):
        raise _Invalid(f"attribute '{name}' must be a float, got {a}")
    return ir.FloatAttr(a).value


def _str_attr(op, name, default=None, required=False, choices: Sequence[str] = ()) -> str | None:
    a = _attr(op, name, None, required)
    if a is None:
        return default
    if not isinstance(a, ir.StringAttr):
        raise _Invalid(f"attribute '{name}' must be a string, got {a}")
    v = ir.StringAttr(a).value
    if choices and v not in choices:
        raise _Invalid(f"attribute '{name}' must be one of {', '.join(choices)}, got '{v}'")
    return v


def _ints_attr(op, name, default=None, required=False, length: int | None = None) -> list[int] | None:
    a = _attr(op, name, None, required)
    if a is None:
        return default
    if isinstance(a, ir.DenseI64ArrayAttr):
        vals = list(ir.DenseI64ArrayAttr(a))
    elif isinstance(a, ir.ArrayAttr) and all(isinstance(e, ir.IntegerAttr) for e in ir.ArrayAttr(a)):
        vals = [ir.IntegerAttr(e).value for e in ir.ArrayAttr(a)]
    else:
        raise _Invalid(f"attribute '{name}' must be an array of integers, e.g. array<i64: 0, 1>, got {a}")
    if length is not None and len(vals) != length:
        raise _Invalid(f"attribute '{name}' must have {length} entries, got {len(vals)}")
    return vals


def _norm_dim(d: int, rank: int, what: str) -> int:
    if not -rank <= d < max(rank, 1):
        raise _Invalid(f"{what} {d} is out of range for rank {rank}")
    return d % rank if rank else 0


def _result(op) -> ir.RankedTensorType:
    return _tensor(op.operation.results[0], "result")


# ----------------------------------------------------------------------------------------------------------------
# Op base


class SpyreOp(Spyre.Operation, traits=[Pure]):
    """Shared verifier plumbing: subclasses implement `_verify`, raising `_Invalid(message)`.

    Every spyre op is Pure (tensor semantics), so CSE and dead-code elimination apply to it.
    """

    def verify_invariants(self) -> bool:
        try:
            self._check_segments()
            self._verify()
        except _Invalid as e:
            self.location.emit_error(f"'{self.operation.name}' op {e}")
            return False
        return True

    def _check_segments(self) -> None:
        """Ops with optional operand slots need `operandSegmentSizes`; IRDL accepts the op without it."""
        slots = self._ODS_OPERAND_SEGMENTS
        if not slots:
            return
        attrs = self.operation.attributes
        if "operandSegmentSizes" not in attrs:
            raise _Invalid(f"requires attribute 'operandSegmentSizes' with {len(slots)} entries (1 for each "
                           f"required operand, 0 or 1 for each optional one)")
        sizes = list(attrs["operandSegmentSizes"])
        if len(sizes) != len(slots) or sum(sizes) != len(self.operation.operands) or any(
                want == 1 and got != 1 or want == 0 and got not in (0, 1) for want, got in zip(slots, sizes)):
            raise _Invalid(f"attribute 'operandSegmentSizes' {sizes} does not describe the "
                           f"{len(self.operation.operands)} operands in {len(slots)} slots")

    def _verify(self) -> None:  # pragma: no cover - every op overrides
        pass


# ----------------------------------------------------------------------------------------------------------------
# Linear algebra


class MatmulOp(SpyreOp, name="matmul"):
    """Matrix product on the PT array, with an optional fused bias: `result = lhs @ rhs (+ bias)`.

        %r = "spyre.matmul"(%a, %b, %bias) {transpose_rhs = false, operandSegmentSizes = array<i32: 1, 1, 1>}
            : (tensor<32x64xf32>, tensor<64x16xf32>, tensor<16xf32>) -> tensor<32x16xf32>

    Operands: lhs [M, K], rhs [K, N] (or [N, K] with `transpose_rhs = true`), optional bias [N].
    `lhs` and `rhs` share an element type (after `spyre.convert_operands`, see docs/compiler.md); the result
    may be wider (accumulation format).
    """

    lhs: Operand[Any]
    rhs: Operand[Any]
    result: Result[Any]
    bias: Optional[Operand[Any]] = None

    def _verify(self):
        a, b, r = _tensor(self.lhs, "lhs"), _tensor(self.rhs, "rhs"), _result(self)
        _rank(a, "lhs", 2)
        _rank(b, "rhs", 2)
        _matmul_operands_elt(self, a, b)
        m, k = a.shape
        kb, n = reversed(b.shape) if _bool_attr(self, "transpose_rhs") else b.shape
        if k != kb:
            raise _Invalid(f"contraction sizes differ: lhs {_fmt(a.shape)} and rhs {_fmt(b.shape)}")
        _expect_shape(r, [m, n], "result")
        if self.bias is not None:
            _expect_shape(_tensor(self.bias, "bias"), [n], "bias")


class BatchMatmulOp(SpyreOp, name="batch_matmul"):
    """Batched matrix product over leading batch dimensions: `result[b] = lhs[b] @ rhs[b]`.

        %r = "spyre.batch_matmul"(%a, %b)
            : (tensor<4x32x64xf32>, tensor<4x64x16xf32>) -> tensor<4x32x16xf32>

    Operands: lhs [B..., M, K], rhs [B..., K, N] (or [B..., N, K] with `transpose_rhs`), same batch dims.
    """

    lhs: Operand[Any]
    rhs: Operand[Any]
    result: Result[Any]

    def _verify(self):
        a, b, r = _tensor(self.lhs, "lhs"), _tensor(self.rhs, "rhs"), _result(self)
        if a.rank < 3:
            raise _Invalid(f"lhs must be rank 3 or more, got rank {a.rank}")
        if b.rank != a.rank:
            raise _Invalid(f"lhs and rhs ranks differ ({a.rank} vs {b.rank})")
        _matmul_operands_elt(self, a, b)
        if a.shape[:-2] != b.shape[:-2]:
            raise _Invalid(f"batch dimensions differ: {_fmt(a.shape[:-2])} vs {_fmt(b.shape[:-2])}")
        m, k = a.shape[-2:]
        kb, n = reversed(b.shape[-2:]) if _bool_attr(self, "transpose_rhs") else b.shape[-2:]
        if k != kb:
            raise _Invalid(f"contraction sizes differ: lhs {_fmt(a.shape)} and rhs {_fmt(b.shape)}")
        _expect_shape(r, list(a.shape[:-2]) + [m, n], "result")


def _window_out(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int = 1) -> int:
    return (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


class Conv2dOp(SpyreOp, name="conv2d"):
    """2-D convolution, NCHW input and FCHW filter, with groups (depthwise when groups == C) and optional bias.

        %r = "spyre.conv2d"(%x, %w, %bias) {strides = array<i64: 1, 1>, padding = array<i64: 1, 1, 1, 1>,
                                             dilations = array<i64: 1, 1>, groups = 1 : i64,
                                             operandSegmentSizes = array<i32: 1, 1, 1>}
            : (tensor<1x3x8x8xf32>, tensor<16x3x3x3xf32>, tensor<16xf32>) -> tensor<1x16x8x8xf32>

    `padding` is [top, left, bottom, right]; strides and dilations default to 1, groups to 1. With
    `spyre.convert_operands = {input = !spyre.dlf16}` (spyre-fuse) an f32 input is converted to the filter's
    type on the scratchpad.
    """

    input: Operand[Any]
    filter: Operand[Any]
    result: Result[Any]
    bias: Optional[Operand[Any]] = None

    def _verify(self):
        x, w, r = _tensor(self.input, "input"), _tensor(self.filter, "filter"), _result(self)
        _rank(x, "input", 4)
        _rank(w, "filter", 4)
        _conv_operands_elt(self, x, w)
        strides = _ints_attr(self, "strides", [1, 1], length=2)
        dil = _ints_attr(self, "dilations", [1, 1], length=2)
        pad = _ints_attr(self, "padding", [0, 0, 0, 0], length=4)
        groups = _int_attr(self, "groups", 1)
        if min(strides) < 1 or min(dil) < 1 or min(pad) < 0 or groups < 1:
            raise _Invalid("strides, dilations and groups must be positive and padding non-negative")
        n, c, h, wd = x.shape
        f, cg, kh, kw = w.shape
        if c % groups or f % groups:
            raise _Invalid(f"groups {groups} must divide input channels {c} and filters {f}")
        if cg != c // groups:
            raise _Invalid(f"filter has {cg} channels per group, expected {c // groups} (input {c} / groups {groups})")
        oh = _window_out(h, kh, strides[0], pad[0], pad[2], dil[0])
        ow = _window_out(wd, kw, strides[1], pad[1], pad[3], dil[1])
        if oh < 1 or ow < 1:
            raise _Invalid(f"filter {kh}x{kw} does not fit the padded input {h}x{wd}")
        _expect_shape(r, [n, f, oh, ow], "result")
        if self.bias is not None:
            _expect_shape(_tensor(self.bias, "bias"), [f], "bias")


class Pool2dOp(SpyreOp, name="pool2d"):
    """2-D max or average pooling over NCHW.

        %r = "spyre.pool2d"(%x) {kind = "max", kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>,
                                  padding = array<i64: 0, 0, 0, 0>}
            : (tensor<1x16x8x8xf32>) -> tensor<1x16x4x4xf32>

    Average pooling divides by the window size including padding (`count_include_pad`).
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        _rank(x, "input", 4)
        _same_elt(x, r, "input and result")
        _str_attr(self, "kind", required=True, choices=("max", "avg"))
        k = _ints_attr(self, "kernel", required=True, length=2)
        s = _ints_attr(self, "strides", k, length=2)
        p = _ints_attr(self, "padding", [0, 0, 0, 0], length=4)
        if min(k) < 1 or min(s) < 1 or min(p) < 0:
            raise _Invalid("kernel and strides must be positive and padding non-negative")
        n, c, h, w = x.shape
        _expect_shape(r, [n, c, _window_out(h, k[0], s[0], p[0], p[2]), _window_out(w, k[1], s[1], p[1], p[3])],
                      "result")


# ----------------------------------------------------------------------------------------------------------------
# Elementwise and reductions

_SCALAR_DIALECTS = ("arith.", "math.")


def broadcastable(src: Sequence[int], dst: Sequence[int]) -> bool:
    """NumPy broadcasting of `src` to exactly `dst` (right-aligned; each dim equal or 1)."""
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


MAP_MAX_INPUTS = 4


class MapOp(SpyreOp, name="map", traits=[ir.IsIsolatedFromAboveTrait]):
    """Elementwise map: a scalar region of arith/math ops applied to every element, so fused chains stay one op.

        %r = "spyre.map"(%x, %bias) ({
        ^bb0(%a: f32, %b: f32):
          %s = arith.addf %a, %b : f32
          %t = math.tanh %s : f32
          "spyre.yield"(%t) : (f32) -> ()
        }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>

    Up to four inputs (the SFU streams at most four operands; a longer chain becomes two maps), which broadcast
    to the result shape with NumPy rules. The block takes one scalar per input (its element type) and yields
    one scalar of the result's element type; for reduced-precision floats (dlf16, bf16, f16, fp8) the scalars
    may be f32, because the SFU computes in fp32 and rounds on write. No inputs makes a fill. The inputs are optional operand slots
    rather than one variadic group because IRDL binds every value of a variadic group to one type.
    """

    result: Result[Any]
    in0: Optional[Operand[Any]] = None
    in1: Optional[Operand[Any]] = None
    in2: Optional[Operand[Any]] = None
    in3: Optional[Operand[Any]] = None
    body: Region

    @property
    def inputs(self) -> list[ir.Value]:
        return list(self.operation.operands)

    def _verify(self):
        r = _result(self)
        slots = [self.in0, self.in1, self.in2, self.in3]
        n = sum(v is not None for v in slots)
        if any(v is None for v in slots[:n]):
            raise _Invalid("inputs must fill the first operand slots without gaps")
        ins = [_tensor(v, f"input #{i}") for i, v in enumerate(slots[:n])]
        for i, t in enumerate(ins):
            if not broadcastable(t.shape, r.shape):
                raise _Invalid(f"input #{i} shape {_fmt(t.shape)} does not broadcast to result {_fmt(r.shape)}")
        blocks = list(self.operation.regions[0].blocks)
        if len(blocks) != 1:
            raise _Invalid(f"body must have exactly one block, got {len(blocks)}")
        args = list(blocks[0].arguments)
        if len(args) != len(ins) or any(a.type not in (t.element_type, compute_type(t.element_type))
                                        for a, t in zip(args, ins)):
            got = ", ".join(str(a.type) for a in args)
            want = ", ".join(str(t.element_type) for t in ins)
            raise _Invalid(f"body arguments ({got}) must be the input element types ({want}), "
                           f"or f32 for reduced-precision floats")
        ops = list(blocks[0].operations)
        for o in ops[:-1]:
            if not o.operation.name.startswith(_SCALAR_DIALECTS):
                raise _Invalid(f"body may only hold arith and math ops, found '{o.operation.name}'")
        if not ops or ops[-1].operation.name != "spyre.yield":
            raise _Invalid("body must end with spyre.yield")
        if ops[-1].operation.operands[0].type not in (r.element_type, compute_type(r.element_type)):
            raise _Invalid(f"body must yield one {compute_type(r.element_type)} value")


REDUCE_KINDS = ("sum", "mean", "max", "min", "prod")


class ReduceOp(SpyreOp, name="reduce"):
    """Reduction over `dims` with `kind` in sum, mean, max, min, prod; `keepdim` keeps reduced dims as 1.

        %r = "spyre.reduce"(%x) {dims = array<i64: 1>, kind = "sum", keepdim = false}
            : (tensor<8x64xf32>) -> tensor<8xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        _str_attr(self, "kind", required=True, choices=REDUCE_KINDS)
        dims = sorted({_norm_dim(d, x.rank, "dim") for d in _ints_attr(self, "dims", required=True)})
        if not dims:
            raise _Invalid("attribute 'dims' must not be empty")
        keep = _bool_attr(self, "keepdim")
        out = [1 if i in dims else d for i, d in enumerate(x.shape)] if keep else \
              [d for i, d in enumerate(x.shape) if i not in dims]
        _expect_shape(r, out, "result")


class SoftmaxOp(SpyreOp, name="softmax"):
    """Softmax along `dim`, computed as exp(x - max) / sum; `acc_type` is the accumulation precision. With
    `safe = true` a row whose every element is -inf gives zeros rather than NaN (PyTorch's `_safe_softmax`,
    what scaled_dot_product_attention uses: a fully masked query attends to nothing).

        %r = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
        %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, safe = true} : (tensor<8x64xf32>) -> tensor<8x64xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        if not is_float_like(x.element_type):
            raise _Invalid(f"input must have a float element type, got {x.element_type}")
        _norm_dim(_int_attr(self, "dim", required=True), x.rank, "dim")
        _expect_shape(r, x.shape, "result")
        _verify_acc_type(self)
        _bool_attr(self, "safe")


def _verify_acc_type(op) -> None:
    a = _attr(op, "acc_type")
    if a is not None and not (isinstance(a, ir.TypeAttr) and is_float_like(ir.TypeAttr(a).value)):
        raise _Invalid(f"attribute 'acc_type' must be a float type, got {a}")


class LayerNormOp(SpyreOp, name="layernorm"):
    """Layer normalization over the trailing dims from `axis`, with optional weight and bias.

        %r = "spyre.layernorm"(%x, %w, %b) {axis = 1 : i64, epsilon = 1.0e-05 : f32, acc_type = f32,
                                            operandSegmentSizes = array<i32: 1, 1, 1>}
            : (tensor<8x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<8x64xf32>

    weight and bias have the normalized shape `input.shape[axis:]`.
    """

    input: Operand[Any]
    result: Result[Any]
    weight: Optional[Operand[Any]] = None
    bias: Optional[Operand[Any]] = None

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        axis = _norm_dim(_int_attr(self, "axis", required=True), x.rank, "axis")
        eps = _float_attr(self, "epsilon", required=True)
        if eps < 0:
            raise _Invalid(f"epsilon must be non-negative, got {eps}")
        _expect_shape(r, x.shape, "result")
        for name, v in (("weight", self.weight), ("bias", self.bias)):
            if v is not None:
                _expect_shape(_tensor(v, name), x.shape[axis:], name)
        _verify_acc_type(self)


class RMSNormOp(SpyreOp, name="rmsnorm"):
    """RMS normalization over the last dim: x / sqrt(mean(x^2) + epsilon) (* weight).

        %r = "spyre.rmsnorm"(%x, %w) {epsilon = 1.0e-06 : f32, acc_type = f32, operandSegmentSizes = array<i32: 1, 1>}
            : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
    """

    input: Operand[Any]
    result: Result[Any]
    weight: Optional[Operand[Any]] = None

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        if x.rank < 1:
            raise _Invalid("input must have rank 1 or more")
        eps = _float_attr(self, "epsilon", required=True)
        if eps < 0:
            raise _Invalid(f"epsilon must be non-negative, got {eps}")
        _expect_shape(r, x.shape, "result")
        if self.weight is not None:
            _expect_shape(_tensor(self.weight, "weight"), x.shape[-1:], "weight")
        _verify_acc_type(self)


# ----------------------------------------------------------------------------------------------------------------
# Data movement


class TransposeOp(SpyreOp, name="transpose"):
    """Permute dimensions: result.shape[i] = input.shape[permutation[i]]. `restickify = true` marks a
    transpose inserted by spyre-layout to change which dimension is sticked.

        %r = "spyre.transpose"(%x) {permutation = array<i64: 1, 0>} : (tensor<8x64xf32>) -> tensor<64x8xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        perm = _ints_attr(self, "permutation", required=True)
        _bool_attr(self, "restickify")
        if sorted(perm) != list(range(x.rank)):
            raise _Invalid(f"permutation {perm} is not a permutation of 0..{x.rank - 1}")
        _same_elt(x, r, "input and result")
        _expect_shape(r, [x.shape[p] for p in perm], "result")


class ReshapeOp(SpyreOp, name="reshape"):
    """Reinterpret the shape; the element count and type stay.

        %r = "spyre.reshape"(%x) : (tensor<8x64xf32>) -> tensor<2x4x64xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        _same_elt(x, r, "input and result")
        if math.prod(x.shape) != math.prod(r.shape):
            raise _Invalid(f"element count changes from {math.prod(x.shape)} ({_fmt(x.shape)}) "
                           f"to {math.prod(r.shape)} ({_fmt(r.shape)})")


class GatherOp(SpyreOp, name="gather"):
    """Row gather (embedding lookup): result[i..., :] = table[indices[i...], :].

        %r = "spyre.gather"(%table, %ids) : (tensor<256x64xf32>, tensor<1x16xi64>) -> tensor<1x16x64xf32>
    """

    table: Operand[Any]
    indices: Operand[Any]
    result: Result[Any]

    def _verify(self):
        t, i, r = _tensor(self.table, "table"), _tensor(self.indices, "indices"), _result(self)
        if t.rank < 1:
            raise _Invalid("table must have rank 1 or more")
        if not is_integer(i.element_type):
            raise _Invalid(f"indices must have an integer element type, got {i.element_type}")
        _same_elt(t, r, "table and result")
        _expect_shape(r, list(i.shape) + list(t.shape[1:]), "result")


class ConcatOp(SpyreOp, name="concat"):
    """Concatenate two tensors along `dim`; other dims must agree. Longer concats chain.

        %r = "spyre.concat"(%a, %b) {dim = 1 : i64} : (tensor<8x32xf32>, tensor<8x16xf32>) -> tensor<8x48xf32>
    """

    lhs: Operand[Any]
    rhs: Operand[Any]
    result: Result[Any]

    def _verify(self):
        _concatenates(self, [_tensor(self.lhs, "lhs"), _tensor(self.rhs, "rhs")], "input")


def _concatenates(op, ins, what: str) -> None:
    """`ins` concatenated along the op's `dim` make its result: same element type, equal outside `dim`."""
    r = _result(op)
    dim = _norm_dim(_int_attr(op, "dim", required=True), r.rank, "dim")
    for i, t in enumerate(ins):
        _same_elt(t, r, f"{what} #{i} and result")
        if t.rank != r.rank or any(a != b for k, (a, b) in enumerate(zip(t.shape, r.shape)) if k != dim):
            raise _Invalid(f"{what} #{i} shape {_fmt(t.shape)} does not match result {_fmt(r.shape)} "
                           f"outside dim {dim}")
    if sum(t.shape[dim] for t in ins) != r.shape[dim]:
        raise _Invalid(f"{what}s sum to {sum(t.shape[dim] for t in ins)} along dim {dim}, "
                       f"result has {r.shape[dim]}")


class SliceOp(SpyreOp, name="slice"):
    """Static strided slice: result = input[offsets : offsets + sizes * strides : strides].

        %r = "spyre.slice"(%x) {offsets = array<i64: 0, 16>, sizes = array<i64: 8, 32>, strides = array<i64: 1, 1>}
            : (tensor<8x64xf32>) -> tensor<8x32xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        off = _ints_attr(self, "offsets", required=True, length=x.rank)
        size = _ints_attr(self, "sizes", required=True, length=x.rank)
        step = _ints_attr(self, "strides", [1] * x.rank, length=x.rank)
        _same_elt(x, r, "input and result")
        for d, (o, s, st, n) in enumerate(zip(off, size, step, x.shape)):
            if o < 0 or s < 0 or st < 1 or (s and o + (s - 1) * st >= n):
                raise _Invalid(f"slice of dim {d} (offset {o}, size {s}, stride {st}) is out of bounds for size {n}")
        _expect_shape(r, size, "result")


class PadOp(SpyreOp, name="pad"):
    """Constant padding: `low[d]` and `high[d]` elements of `value` around each dim.

        %r = "spyre.pad"(%x) {low = array<i64: 0, 1>, high = array<i64: 0, 1>, value = 0.0 : f32}
            : (tensor<8x62xf32>) -> tensor<8x64xf32>
    """

    input: Operand[Any]
    result: Result[Any]

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        lo = _ints_attr(self, "low", required=True, length=x.rank)
        hi = _ints_attr(self, "high", required=True, length=x.rank)
        _float_attr(self, "value", required=True)
        if min(lo + hi, default=0) < 0:
            raise _Invalid("padding must be non-negative")
        _same_elt(x, r, "input and result")
        _expect_shape(r, [n + a + b for n, a, b in zip(x.shape, lo, hi)], "result")


class CastOp(SpyreOp, name="cast"):
    """Format conversion, with an optional scale for quantized formats (per-tensor, or per-channel along `axis`).

        %q = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
        %w8 = "spyre.cast"(%w, %s) {axis = 0 : i64, operandSegmentSizes = array<i32: 1, 1>}
            : (tensor<16x64xf32>, tensor<16xf32>) -> tensor<16x64xi8>
        %wq = "spyre.cast"(%w) {scale_mode = "per-channel", axis = 0 : i64, operandSegmentSizes = array<i32: 1, 0>}
            : (tensor<16x64xf32>) -> tensor<16x64xi8>

    Quantizing divides by the scale; dequantizing (integer or fp8 input) multiplies by it. Without a scale
    operand, `scale_mode` ("per-tensor" or "per-channel" along `axis`) asks the emitter to compute symmetric
    scales from the values at compile time, which is how parameters are quantized.
    """

    input: Operand[Any]
    result: Result[Any]
    scale: Optional[Operand[Any]] = None

    def _verify(self):
        x, r = _tensor(self.input, "input"), _result(self)
        _expect_shape(r, x.shape, "result")
        if self.scale is not None:
            s = _tensor(self.scale, "scale")
            axis = _int_attr(self, "axis")
            if axis is None:
                if math.prod(s.shape) != 1:
                    raise _Invalid(f"per-tensor scale must have one element, got {_fmt(s.shape)}")
            else:
                axis = _norm_dim(axis, x.rank, "axis")
                _expect_shape(s, [x.shape[axis]], "per-channel scale")
        else:
            mode = _str_attr(self, "scale_mode", choices=("per-tensor", "per-channel"))
            axis = _int_attr(self, "axis")
            if mode == "per-channel":
                if axis is None:
                    raise _Invalid("scale_mode 'per-channel' needs attribute 'axis'")
                _norm_dim(axis, x.rank, "axis")
            elif axis is not None:
                raise _Invalid("attribute 'axis' needs a scale operand or scale_mode 'per-channel'")


# ----------------------------------------------------------------------------------------------------------------
# Systems of several cards


class AllGatherOp(SpyreOp, name="all_gather"):
    """The pieces of a value split over cards, made whole on every card that reads it (`@main` of a module
    partitioned by spyre-partition-cards): the pieces, in card order, concatenated along `dim`.

        %r = "spyre.all_gather"(%p0, %p1) {dim = 1 : i64}
            : (tensor<8x32x!spyre.dlf16>, tensor<8x32x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>

    It moves data over the card-to-card link and computes nothing; it is no device op of any one card.
    """

    pieces: Sequence[Operand[Any]]
    result: Result[Any]

    def _check_segments(self) -> None:   # one variadic group: IRDL needs no segment sizes
        pass

    def _verify(self):
        ins = [_tensor(v, f"piece #{i}") for i, v in enumerate(self.operation.operands)]
        if len(ins) < 2:
            raise _Invalid(f"needs at least two pieces, got {len(ins)}")
        _concatenates(self, ins, "piece")


# ----------------------------------------------------------------------------------------------------------------
# Regions


class HostOp(SpyreOp, name="host"):
    """Work placed on the CPU: the original ops, kept whole, computing one value on the host.

        %r = "spyre.host"() ({
          %c = arith.constant dense<1> : tensor<1x16xi64>
          %s = arith.addi %ids, %c : tensor<1x16xi64>
          "spyre.yield"(%s) : (tensor<1x16xi64>) -> ()
        }) {reason = "int64 index math"} : () -> tensor<1x16xi64>

    The region reads values from above (like `scf.execute_region`), so its inputs are exactly the values it
    captures. One result per host op: IRDL cannot type a variadic group of different tensors. `reason` says why
    the work stayed on the host; the placement report prints it. Host work with the same `spyre.round_trip`
    (spyre-round-trips) runs as one call to the host, at the first of it: what the rest reads is computed before
    it, or by an earlier op of the group.
    """

    result: Result[Any]
    body: Region

    def _verify(self):
        blocks = list(self.operation.regions[0].blocks)
        if len(blocks) != 1 or list(blocks[0].arguments):
            raise _Invalid("body must be one block without arguments")
        ops = list(blocks[0].operations)
        if not ops or ops[-1].operation.name != "spyre.yield":
            raise _Invalid("body must end with spyre.yield")
        if ops[-1].operation.operands[0].type != self.result.type:
            raise _Invalid("yielded type must match the result type")
        _str_attr(self, "reason")


class YieldOp(SpyreOp, name="yield", traits=[ir.IsTerminatorTrait]):
    """Terminates a `spyre.map` or `spyre.host` body, yielding its value.

        "spyre.yield"(%v) : (f32) -> ()
    """

    value: Operand[Any]

    def _verify(self):
        parent = self.operation.parent
        if parent is None or parent.name not in ("spyre.map", "spyre.host"):
            raise _Invalid("must be nested in spyre.map or spyre.host")
