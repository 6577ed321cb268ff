"""spyre-fold-norm-weights: a norm's weight folded into the weights of the matmuls that read the norm.

A pre-norm transformer block reads every norm only through linear layers: ``q/k/v(rmsnorm(x))``,
``gate/up(rmsnorm(x))``. Scaling the normalized rows by the norm's weight ``w`` and then multiplying by ``W`` is
multiplying them by ``diag(w) W``: here each such matmul's weight becomes ``diag(w) W`` (computed in f32 from
the parameters' values, rounded to the device format once, like any weight), and the norm loses its weight
operand. Each kernel applying the norm then neither loads ``w`` (one small DMA, a transfer's fixed latency, on
every core of a matmul kernel with a norm prologue) nor multiplies by it (one SFU pass per A tile). The values
differ from the unfolded program's by rounding only (``x_hat * w`` is no longer rounded before the multiply;
``w * W`` is, once).

Rules (docs/compiler.md):
* the norm is a `spyre.rmsnorm`, or a `spyre.layernorm` over the last dim without a bias, whose weight is a
  parameter argument with a value (`spyre.value`);
* every reader of its result (through reshapes keeping the innermost dim) is the lhs of a 2-D `spyre.matmul`
  outside host regions whose rhs is a parameter argument with a value that this matmul alone reads, ``[K, N]``
  or ``[N, K]`` with `transpose_rhs`;
* then each such parameter's value becomes its scaled value (its name and type stay: a folded weight is still
  the weight the device multiplies by, quantized by the fp8 / int8 policies like any other), and the norm is
  rebuilt without its weight.

Runs first in the kernel pipeline, on the graph's model-typed IR (before spyre-reduce-precision rounds the
parameters).

```mlir
%n = spyre.rmsnorm %x, %w                            // -> spyre.rmsnorm %x
%q = spyre.matmul %n, %wq {transpose_rhs = true}     // %wq's value -> %wq * %w (each row)
```
"""

from __future__ import annotations

import dataclasses

import numpy as np
from torch_mlir import ir

from spyre_mlir import params
from spyre_mlir.passes.analysis import NORMS, function_ops, host_region_of, is_param, user
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class FoldNormWeightsPass(SpyrePass):
    NAME = "spyre-fold-norm-weights"
    SUMMARY = "Fold a norm's weight into the weights of the matmuls that alone read it"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            for func in function_ops(module):
                values = {i: arr for i, arr in params.arg_values(func).values()}
                folded = {}
                for block in func.regions[0].blocks:
                    for op in [o.operation for o in block.operations]:
                        if op.name in NORMS:
                            self._fold(op, func, values, folded)
                if folded:
                    _set_values(func, folded)

    def _fold(self, norm, func, values, folded) -> None:
        w = _weight(norm)
        if w is None or not is_param(w, func) or ir.BlockArgument(w).arg_number not in values:
            return
        K = ir.RankedTensorType(norm.operands[0].type).shape[-1]
        wv = np.asarray(values[ir.BlockArgument(w).arg_number], np.float32)
        if wv.shape != (K,):
            return
        mms = _matmul_readers(norm.results[0], K)
        if not mms:
            return
        scaled = {}
        for mm in mms:
            rhs = mm.operands[1]
            if not is_param(rhs, func) or len(list(rhs.uses)) != 1:
                return
            i = ir.BlockArgument(rhs).arg_number
            if i not in values or i in folded:
                return
            W = np.asarray(values[i], np.float32)
            trans = "transpose_rhs" in mm.attributes and ir.BoolAttr(mm.attributes["transpose_rhs"]).value
            if W.ndim != 2 or W.shape[1 if trans else 0] != K:
                return
            scaled[i] = W * (wv[None, :] if trans else wv[:, None])
        folded.update(scaled)
        _drop_weight(norm)


def _weight(norm) -> ir.Value | None:
    """The norm's weight operand when it has one and nothing else (a layernorm over the last dim, no bias)."""
    seg = list(ir.DenseI32ArrayAttr(norm.attributes["operandSegmentSizes"]))
    if norm.name == "spyre.rmsnorm":
        return norm.operands[1] if seg == [1, 1] else None
    rank = len(ir.RankedTensorType(norm.operands[0].type).shape)
    axis = ir.IntegerAttr(norm.attributes["axis"]).value if "axis" in norm.attributes else -1
    return norm.operands[1] if seg == [1, 1, 0] and axis % rank == rank - 1 else None


def _matmul_readers(v: ir.Value, K: int) -> list | None:
    """The matmuls reading ``v`` (through reshapes keeping the innermost dim ``K``) as their 2-D lhs, or None
    when anything else reads it."""
    out = []
    for use in v.uses:
        u = user(use)
        if host_region_of(u) is not None:
            return None
        if u.name == "spyre.reshape" and ir.RankedTensorType(u.results[0].type).shape[-1:] == [K]:
            more = _matmul_readers(u.results[0], K)
            if more is None:
                return None
            out += more
        elif u.name == "spyre.matmul" and use.operand_number == 0 \
                and len(ir.RankedTensorType(u.operands[1].type).shape) == 2:
            out.append(u)
        else:
            return None
    return out


def _drop_weight(norm) -> None:
    """Rebuild ``norm`` without its weight operand."""
    seg = list(ir.DenseI32ArrayAttr(norm.attributes["operandSegmentSizes"]))
    attrs = {name: norm.attributes[name] for name in norm.attributes}
    attrs["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get([1, 0] + seg[2:])
    with ir.InsertionPoint(norm), norm.location:
        new = ir.Operation.create(norm.name, results=[norm.results[0].type], operands=[norm.operands[0]],
                                  attributes=attrs)
    norm.results[0].replace_all_uses_with(new.results[0])
    norm.erase()


def _set_values(func, folded: dict) -> None:
    """Give the parameter arguments ``folded`` names (index -> array) those values."""
    dicts = params.arg_dicts(func)
    args = func.regions[0].blocks[0].arguments
    for i, arr in folded.items():
        name = ir.StringAttr(dicts[i][params.PARAM_ATTR]).value
        attr = params.constant_attr(arr, args[i].type, name)
        dicts[i] = params.with_entries(dicts[i], {params.VALUE_ATTR: attr})
    func.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)
