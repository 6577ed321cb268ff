"""Host programs: MLIR ops translated to the JSON program format the runtime's host interpreter runs.

Two jobs need the same thing, "compute these ops with numpy":

* **constant folding** at compile time: any op whose operands are all parameters or literals (a batch-norm's
  ``1/sqrt(var + eps)``, rotary tables, ``int64`` index math, a transpose of a weight) is evaluated once and
  its value becomes a constant of the binary;
* **host ops** at run time: ``spyre.host`` regions and device ops without a kernel run on the CPU as the
  binary's ``eval`` host op, which carries the program.

The format and its interpreter belong to the runtime (:mod:`spyre_mlir.runtime.hostprog`), so a binary is
self-contained: ``spyre-run`` needs nothing from the compiler. This module only knows how MLIR maps onto it.
"""

from __future__ import annotations

import math

import numpy as np

from spyre_mlir.runtime.hostprog import CASTS as _CASTS
from spyre_mlir.runtime.hostprog import ELEMENTWISE as _ELEMENTWISE
from spyre_mlir.runtime.hostprog import Unsupported, evaluate

__all__ = ["Unsupported", "translate_ops", "evaluate", "np_dtype", "literal_value"]


# ---------------------------------------------------------------------------------------------------------
# Types


def np_dtype(elt) -> str:
    """numpy dtype name used on the host for an MLIR element type (floats compute in float32)."""
    s = str(elt)
    if s in ("f64",):
        return "float64"
    if s.startswith("f") or s in ("bf16", "!spyre.dlf16") or "f8" in s:
        return "float32"
    if s == "i1":
        return "bool"
    if s in ("i64", "index"):
        return "int64"
    if s.startswith(("i", "si", "ui")):
        return "int32" if int("".join(c for c in s if c.isdigit()) or 32) <= 32 else "int64"
    raise Unsupported(f"element type {s}")


def _shape_dtype(t) -> tuple[list[int], str]:
    from torch_mlir import ir

    if isinstance(t, ir.RankedTensorType) or str(t).startswith("tensor<"):
        t = ir.RankedTensorType(t)
        return list(t.shape), np_dtype(t.element_type)
    return [], np_dtype(t)


# ---------------------------------------------------------------------------------------------------------
# MLIR -> program


def _attr_py(a):
    """An MLIR attribute as a JSON-able Python value (ints, floats, strings, lists, bools)."""
    from torch_mlir import ir

    for cls, conv in ((ir.BoolAttr, lambda x: x.value), (ir.IntegerAttr, lambda x: x.value),
                      (ir.FloatAttr, lambda x: x.value), (ir.StringAttr, lambda x: x.value),
                      (ir.DenseI64ArrayAttr, list), (ir.DenseI32ArrayAttr, list), (ir.DenseBoolArrayAttr, list),
                      (ir.TypeAttr, lambda x: np_dtype(x.value))):
        if isinstance(a, cls):
            return conv(cls(a))
    if isinstance(a, ir.ArrayAttr):
        return [_attr_py(x) for x in a]
    return str(a)


def _affine(e) -> list:
    """An affine expression as a nested list: ["d", i], ["c", v], [op, lhs, rhs]."""
    from torch_mlir import ir

    if isinstance(e, ir.AffineDimExpr):
        return ["d", e.position]
    if isinstance(e, ir.AffineConstantExpr):
        return ["c", e.value]
    for cls, name in ((ir.AffineAddExpr, "+"), (ir.AffineMulExpr, "*"), (ir.AffineModExpr, "mod"),
                      (ir.AffineFloorDivExpr, "floordiv"), (ir.AffineCeilDivExpr, "ceildiv")):
        if isinstance(e, cls):
            return [name, _affine(e.lhs), _affine(e.rhs)]
    raise Unsupported(f"affine expression {e}")


def dense_values(a) -> np.ndarray:
    """A dense elements attribute as a numpy array. bf16 (which the bindings cannot hand to numpy) is read from
    its printed form: a hex blob of the raw bits, or a nested list of decimal values."""
    from torch_mlir import ir

    try:
        return np.array(a)
    except (TypeError, ValueError):
        pass
    t = ir.RankedTensorType(a.type)
    if str(t.element_type) != "bf16":
        raise Unsupported(f"constant of type {a.type}")
    import ml_dtypes

    body = str(a).split(":")[0].strip()[len("dense<"):-1]
    n = math.prod(t.shape)
    if body.startswith('"0x'):
        bits = np.frombuffer(bytes.fromhex(body[3:-1]), dtype="<u2")
        vals = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    else:
        # Decimal values, or (inf, nan) the bit pattern as a hex integer.
        tokens = body.replace("[", " ").replace("]", " ").replace(",", " ").split()
        vals = np.array([np.array([int(v, 16)], "<u2").view(ml_dtypes.bfloat16)[0] if v.startswith("0x")
                         else float(v) for v in tokens], np.float32)
    return (vals.reshape(t.shape) if vals.size == n else np.full(tuple(t.shape), vals.reshape(-1)[0], np.float32))


class _Translator:
    def __init__(self):
        self.ids: dict = {}
        self.next = 0

    def vid(self, v, create=False) -> int:
        if v not in self.ids:
            if not create:
                raise KeyError(v)
            self.ids[v] = self.next
            self.next += 1
        return self.ids[v]

    def block(self, block, captures_ok: bool) -> dict:
        """Translate a block; its arguments are the program's args; values from above become extra args
        (``captures``) when ``captures_ok``."""
        args = [self.vid(a, create=True) for a in block.arguments]
        steps, results = [], []
        for op in block.operations:
            name = op.operation.name
            if name in ("spyre.yield", "linalg.yield", "func.return", "tensor.yield"):
                results = [self.vid(v) for v in op.operation.operands]
                break
            steps.append(self.op(op))
        return {"args": args, "steps": steps, "results": results}

    def op(self, op) -> dict:
        from torch_mlir import ir

        o = op.operation
        name = o.name
        ins = [self.vid(v) for v in o.operands]
        outs = [self.vid(r, create=True) for r in o.results]
        step = {"op": name, "in": ins, "out": outs[0] if outs else None}
        if len(outs) > 1:
            step["outs"] = outs  # a multi-result op (e.g. max and argmax in one linalg.generic)
        if o.results:
            shape, dtype = _shape_dtype(o.results[0].type)
            step["shape"], step["dtype"] = shape, dtype
        attrs = {}
        if name == "arith.constant":
            from torch_mlir import ir

            a = o.attributes["value"]
            if isinstance(a, (ir.DenseElementsAttr,)) or isinstance(a, ir.DenseFPElementsAttr) or \
                    isinstance(a, ir.DenseIntElementsAttr):
                arr = dense_values(a)
                splat = bool(a.is_splat) and arr.size > 0
                attrs["value"] = [arr.reshape(-1)[0].item()] if splat else arr.reshape(-1).tolist()
                attrs["splat"] = splat
            else:
                attrs["value"] = [_attr_py(a)]
                attrs["splat"] = True
        elif name in _ELEMENTWISE or name in _CASTS or name in ("cf.assert", "tensor.empty", "linalg.index",
                                                                 "tensor.expand_shape", "tensor.collapse_shape",
                                                                 "linalg.fill", "linalg.generic",
                                                                 "tensor.extract_slice", "tensor.insert_slice",
                                                                 "linalg.matmul", "linalg.batch_matmul",
                                                                 "linalg.transpose", "tensor.extract",
                                                                 "tensor.from_elements", "tensor.concat",
                                                                 "tensor.splat", "linalg.broadcast",
                                                                 "spyre.host") or name.startswith("spyre."):
            for na in (o.attributes[i] for i in range(len(o.attributes))):
                if na.name == "operandSegmentSizes":
                    attrs["seg"] = list(ir.DenseI32ArrayAttr(na.attr))
                    attrs["n_ins"] = attrs["seg"][0]
                    continue
                if na.name == "indexing_maps":
                    from torch_mlir import ir

                    attrs["maps"] = [[_affine(e) for e in ir.AffineMapAttr(m).value.results]
                                     for m in na.attr]
                    attrs["ndims"] = ir.AffineMapAttr(na.attr[0]).value.n_dims
                elif na.name == "iterator_types":
                    attrs["iters"] = [str(x).split("<")[-1].rstrip(">") for x in na.attr]
                else:
                    attrs[na.name] = _attr_py(na.attr)
            if name in ("tensor.extract_slice", "tensor.insert_slice"):
                for k in ("static_offsets", "static_sizes", "static_strides"):
                    v = attrs.get(k)
                    if v is not None and any(x < -(2**62) for x in v):
                        raise Unsupported(f"{name} with dynamic {k}")
        else:
            raise Unsupported(f"'{name}' has no host implementation")
        step["a"] = attrs
        if o.regions and len(o.regions[0].blocks):
            if name in ("linalg.generic", "spyre.map", "spyre.host"):
                step["body"] = self.block(o.regions[0].blocks[0], captures_ok=True)
            elif name.startswith("linalg."):
                pass  # named linalg ops: the region is implied by the name
        return step


def translate_ops(ops, inputs, outputs, aliases: dict | None = None) -> dict:
    """Translate ``ops`` (in order) into a program taking ``inputs`` (MLIR values) and returning ``outputs``.
    ``aliases``: values the ops read that are other values they compute (see ``HostModule.add``)."""
    t = _Translator()
    args = [t.vid(v, create=True) for v in inputs]
    steps = []
    for op in ops:
        steps.append(t.op(op))
        for alias, v in (aliases or {}).items():
            if v in t.ids and alias not in t.ids:
                t.ids[alias] = t.ids[v]
    return {"args": args, "steps": steps, "results": [t.vid(v) for v in outputs]}


def literal_value(op) -> np.ndarray:
    """The value of an ``arith.constant`` or ``tensor.empty``: a ``dense_resource`` constant's array (made by
    spyre-fold-constants, or parsed), else what the interpreter computes (Unsupported when it cannot)."""
    from spyre_mlir import params

    op = op.operation
    if len(op.operands):
        raise Unsupported(f"'{op.name}' with dynamic sizes is not a literal")
    value = op.attributes["value"] if "value" in op.attributes else None
    if value is not None and params.is_resource(value):
        return params.constant_value(value, op.context)
    return evaluate(translate_ops([op], [], list(op.results)))[0]
