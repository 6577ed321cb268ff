"""spyre-fold-constants: compute, while compiling, what spyre-select-kernels marked `spyre.const_fold`.

Every op marked `spyre.const_fold` whose inputs have values here (parameters carrying a `spyre.value`,
literals, earlier folds) is evaluated with the host interpreter's numpy semantics and replaced by an
`arith.constant dense_resource<...>` holding the result in its element type's storage (DLFloat16 as its bits,
see `spyre_mlir.params`), named `spyre.name` after the parameter it comes from. Parameters no longer read lose
their `spyre.value` (the printed IR carries each weight once, in the form the device reads).

Weight quantization is decided here too. A quantizing `spyre.cast {scale_mode}` of a parameter (written by
spyre-reduce-precision) becomes two constants, the codes (int8, or fp8) and the symmetric scales (per tensor, or
per output channel along `axis`), and the dequantizing cast that follows it becomes a cast with a **scale
operand**:

```mlir
%q = "spyre.cast"(%w) {scale_mode = "per-channel", axis = 0} : (tensor<32x64xf32>) -> tensor<32x64xi8>
%d = "spyre.cast"(%q) {scale_mode = "per-channel", axis = 0} : (tensor<32x64xi8>) -> tensor<32x64x!spyre.dlf16>
%t = "spyre.transpose"(%d) {permutation = array<i64: 1, 0>} : ... -> tensor<64x32x!spyre.dlf16>
// becomes
%c = arith.constant {spyre.name = "w"} dense_resource<w> : tensor<64x32xi8>      // the codes, transposed
%s = arith.constant {spyre.name = "w.scale"} dense_resource<w.scale> : tensor<32xf32>
%t = "spyre.cast"(%c, %s) {axis = 1, spyre.const_fold = true} : (...) -> tensor<64x32x!spyre.dlf16>
```

Reshapes and transposes of the weight move onto the codes (the axis follows), so a matmul reads the codes in
8 bits and applies the per-column scales on write-back (the op model's `colscale` buffer). A dequantized
weight that anything else reads (a conv's filter, a host op, a reshape that splits the channel axis) is folded
to its real values instead.

An op left marked (a parameter without a value: it becomes a binary input; an op the interpreter cannot
compute) runs on the host at run time.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from torch_mlir import ir

from spyre_mlir import params
from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import (CONST_FOLD, KERNEL, MATMULS, PARAM_ATTR, function_ops, is_const_fold,
                                        producer, reads, user)
from spyre_mlir.passes.base import PassError, SpyrePass

QUANTIZED = ("i8", "f8E4M3FN", "f8E5M2")
FP8_MAX = {"f8E4M3FN": 448.0, "f8E5M2": 57344.0}


@dataclasses.dataclass
class _Quantized:
    """A dequantized weight kept as codes and scales until its readers are known."""

    codes: np.ndarray
    scale: np.ndarray
    axis: int | None
    name: str
    storage: ir.Type     # the codes' element type (i8, f8E4M3FN, f8E5M2)

    def real(self) -> np.ndarray:
        return np.asarray(self.codes, np.float32) * _along(self.scale, self.codes.ndim, self.axis)


@dataclasses.dataclass
class FoldConstantsPass(SpyrePass):
    NAME = "spyre-fold-constants"
    SUMMARY = "Replace spyre.const_fold ops by constants; quantize weights into codes and scale operands"

    def run(self, module: ir.Operation) -> None:
        for func in function_ops(module):
            _Folder(module, func).run()


class _Folder:
    def __init__(self, module, func):
        self.ctx = module.context
        self.func = func
        self.block = func.regions[0].blocks[0]
        self.known: dict = {}       # value -> numpy values
        self.names: dict = {}       # value -> the parameter it comes from
        self.codes: dict = {}       # codes value -> (scales, axis): a quantizing cast's result
        self.lazy: dict = {}        # dequantized value -> _Quantized
        self.unmade: list = []      # folded ops whose values only other folded ops read: no constant of their own
        for arg, d in zip(self.block.arguments, params.arg_dicts(func)):
            if PARAM_ATTR in d:
                self.names[arg] = ir.StringAttr(d[PARAM_ATTR]).value
        for i, arr in params.arg_values(func).values():
            self.known[self.block.arguments[i]] = np.asarray(arr)

    def run(self):
        for o in list(self.block.operations):
            op = o.operation
            if is_const_fold(op) and all(self._has_value(v) for v in reads(op)):
                self._fold(op)
        for op in self.unmade:
            name = self._name(op)
            for r in op.results:
                if _used(r):      # a reader that could not fold after all
                    self._replace(r, self._constant(op, self.known[r], _narrowed(r, self.known[r]), name), name,
                                  self.known[r])
            op.erase()
        for v in reversed(list(self.lazy)):
            self._settle(v)
        for o in reversed(list(self.block.operations)):
            op = o.operation
            if op.name in ("arith.constant", "tensor.empty") and not any(_used(r) for r in op.results):
                op.erase()
        self._drop_dead_values()

    # ---- values -------------------------------------------------------------------------------------------

    def _has_value(self, v) -> bool:
        if v in self.known or v in self.lazy:
            return True
        op = producer(v)
        if op is None or op.name not in ("arith.constant", "tensor.empty"):
            return False
        from spyre_mlir.codegen import hostprog

        try:
            self.known[v] = hostprog.literal_value(op)
        except (hostprog.Unsupported, params.ParamError):
            return False      # a literal the interpreter cannot read: its readers stay (the host clones it)
        return True

    def _real(self, v) -> np.ndarray:
        return self.lazy[v].real() if v in self.lazy else self.known[v]

    def _name(self, op) -> str:
        return next((self.names[v] for v in reads(op) if v in self.names), "const")

    # ---- folding --------------------------------------------------------------------------------------------

    def _fold(self, op):
        src = op.operands[0] if len(op.operands) else None
        if op.name == "spyre.cast" and "scale_mode" in op.attributes and len(op.operands) == 1:
            if src in self.codes:
                s, axis = self.codes[src]
                self.lazy[op.results[0]] = _Quantized(self.known[src], s, axis, self.names.get(src, "w"),
                                                      ir.RankedTensorType(src.type).element_type)
                return
            if src not in self.lazy:
                self._quantize(op)
                return
        if op.name in ("spyre.transpose", "spyre.reshape") and src in self.lazy:
            moved = _move(op, self.lazy[src])
            if moved is not None:
                self.lazy[op.results[0]] = moved
                return
        from spyre_mlir.codegen import hostprog

        vals = [self._real(v) for v in reads(op)]
        try:
            if op.name == "spyre.host":
                body = list(op.regions[0].blocks[0].operations)
                prog = hostprog.translate_ops(body[:-1], reads(op), list(body[-1].operation.operands))
            else:
                prog = hostprog.translate_ops([op], reads(op), list(op.results))
            results = hostprog.evaluate(prog, *vals)
        except hostprog.Unsupported:
            return        # stays: the host runs it
        name = self._name(op)
        if all(is_const_fold(user(u)) for r in op.results for u in r.uses):
            # Only folded ops read it (a weight's cast, read restickified): its values pass on, and only the end
            # of the chain is made a constant, rounded to its storage once (a real model's weights: ~1 s a GB).
            for r, val in zip(op.results, results):
                self.known[r], self.names[r] = np.asarray(val), name
            self.unmade.append(op)
            return
        for r, val in zip(op.results, results):
            self._replace(r, self._constant(op, val, _narrowed(r, val), name), name, val)
        op.erase()

    def _quantize(self, op):
        """Symmetric scales from the parameter's values; the codes rounded to the storage format."""
        from spyre_mlir.runtime.formats import FORMATS, encode, decode, quantize_int, symmetric_scale

        x = np.asarray(self._real(op.operands[0]), np.float32)
        elt = str(ir.RankedTensorType(op.results[0].type).element_type)
        mode = ir.StringAttr(op.attributes["scale_mode"]).value
        axis = ir.IntegerAttr(op.attributes["axis"]).value % x.ndim if mode == "per-channel" else None
        if elt not in QUANTIZED:
            raise PassError(f"cannot quantize a parameter to {elt} (int8, f8E4M3FN or f8E5M2)", op.location)
        if elt == "i8":
            s = symmetric_scale(x, 8, axis=axis)
            q = quantize_int(x, 8, s, axis=axis)
        else:
            others = tuple(d for d in range(x.ndim) if d != axis)
            amax = np.max(np.abs(x), axis=others) if axis is not None else np.max(np.abs(x))
            s = np.where(amax > 0, amax / FP8_MAX[elt], 1.0).astype(np.float32)
            fmt = FORMATS["fp8_e4m3" if elt == "f8E4M3FN" else "fp8_e5m2"]
            q = decode(fmt, encode(fmt, x / _along(s, x.ndim, axis)))
        s = np.asarray(s, np.float32).reshape(-1)
        name = self._name(op)
        r = op.results[0]
        c = self._constant(op, q, r.type, name)
        self._replace(r, c, name, q)
        self.codes[c] = (s, axis)
        op.erase()

    def _settle(self, v):
        """Decide how a dequantized weight is read: codes and scales by matmul kernels, else real values."""
        op = producer(v)
        q = self.lazy.pop(v)
        users = [u.owner for u in v.uses]
        if not users:
            op.erase()
            return
        rank = len(ir.RankedTensorType(v.type).shape)
        # Per-channel scales scale the matmul's output columns: the last dim of a [K, N] rhs, the one before it
        # of an [N, K] rhs read transposed (transpose_rhs).
        if all(u.name in MATMULS and KERNEL in u.attributes and u.operands[1] == v and u.operands[0] != v and
               q.axis in (None, rank - (2 if "transpose_rhs" in u.attributes else 1)) for u in users):
            with ir.InsertionPoint(op), op.location:
                codes_t = ir.RankedTensorType.get(list(q.codes.shape), q.storage)
                c = self._constant(op, q.codes, codes_t, q.name)
                s_t = ir.RankedTensorType.get([q.scale.size], ir.F32Type.get())
                s = self._constant(op, q.scale, s_t, q.name + ".scale")
                attrs = {"operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1]),
                         CONST_FOLD: ir.BoolAttr.get(True)}
                if q.axis is not None:
                    attrs["axis"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), q.axis)
                new = ir.Operation.create("spyre.cast", results=[v.type], operands=[c, s], attributes=attrs)
            v.replace_all_uses_with(new.results[0])
        else:
            v.replace_all_uses_with(self._constant(op, q.real(), v.type, q.name))
        op.erase()

    # ---- IR -------------------------------------------------------------------------------------------------

    def _constant(self, at, values, type_, name):
        with ir.InsertionPoint(at), at.location:
            attr = params.constant_attr(values, type_, name)
            op = ir.Operation.create("arith.constant", results=[type_],
                                     attributes={"value": attr, "spyre.name": ir.StringAttr.get(name)})
        return op.results[0]

    def _replace(self, r, c, name, val):
        r.replace_all_uses_with(c)
        self.known[c] = np.asarray(val)
        self.names[c] = name

    def _drop_dead_values(self):
        """Parameters nothing reads any more keep no value: the IR carries each weight once."""
        if "arg_attrs" not in self.func.attributes:
            return
        dicts = params.arg_dicts(self.func)
        changed = False
        for i, (arg, d) in enumerate(zip(self.block.arguments, dicts)):
            if PARAM_ATTR in d and params.VALUE_ATTR in d and not _used(arg):
                dicts[i] = ir.DictAttr.get({d[j].name: d[j].attr for j in range(len(d))
                                            if d[j].name != params.VALUE_ATTR})
                changed = True
        if changed:
            self.func.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)


def _narrowed(r: ir.Value, val) -> ir.Type:
    """The type of the constant holding folded value ``r``: its own, or f8E5M2 when ``r`` is an activation
    (DLFloat16) that only device elementwise kernels read (spyre.map operands, which compute in fp32 whatever
    they load) and every value of it is an f8E5M2 value (an attention mask of 0 and -inf, which DLFloat16 cannot
    even hold: it would saturate -inf): the bytes the kernels load halve and the values stay exact."""
    t = ir.RankedTensorType(r.type)
    if not spyre.is_dlf16(t.element_type) or not _used(r):
        return r.type
    for u in r.uses:
        o = user(u)
        if o.name != "spyre.map" or KERNEL not in o.attributes:
            return r.type
    import ml_dtypes      # here, not at the top: its import takes 0.7 s (runtime.formats._ml)

    v = np.asarray(val, np.float32)
    with np.errstate(all="ignore"):
        if not np.array_equal(v.astype(ml_dtypes.float8_e5m2).astype(np.float32), v, equal_nan=True):
            return r.type
    return ir.RankedTensorType.get(list(t.shape), ir.Float8E5M2Type.get(), t.encoding, loc=ir.Location.unknown())


def _used(v) -> bool:
    return any(True for _ in v.uses)


def _along(s, ndim, axis):
    """Scales broadcast along `axis` of an ndim array (a scalar for per-tensor)."""
    s = np.asarray(s, np.float32)
    if axis is None:
        return s.reshape(-1)[0]
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape)


def _move(op, q: _Quantized) -> _Quantized | None:
    """A transpose or reshape applied to the codes (the axis follows), or None when a reshape splits or merges
    the channel axis (the scales no longer lie along one dim)."""
    shape = list(ir.RankedTensorType(op.results[0].type).shape)
    if op.name == "spyre.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        axis = None if q.axis is None else perm.index(q.axis)
        return dataclasses.replace(q, codes=np.transpose(q.codes, perm), axis=axis)
    if q.axis is None:
        return dataclasses.replace(q, codes=q.codes.reshape(shape))
    old = list(q.codes.shape)
    before = int(np.prod(old[:q.axis], dtype=np.int64))
    for i in range(len(shape)):
        if int(np.prod(shape[:i], dtype=np.int64)) == before and shape[i] == old[q.axis]:
            return dataclasses.replace(q, codes=q.codes.reshape(shape), axis=i)
    return None
