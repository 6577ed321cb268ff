"""spyre-select-kernels{target=PATH}: decide, once, where every spyre op runs and with which kernel.

Runs when the formats and layouts are final (after spyre-fuse) and before any op is planned:

* an op computed from values known at compile time alone (`analysis.compile_time`: a weight's cast,
  quantization or restickify, a host region building position ids or a mask from literals) is marked
  `spyre.const_fold = true`: spyre-fold-constants computes it next, so it gets no kernel and no plan;
* every other device op gets `spyre.kernel = "<kernel>"`, the device kernel of its family that runs it
  (`codegen.kernels.select`: `matmul`, `rows`, `conv2d`, `pool2d`, and for data movement `alias`,
  `dma-rows`, `restick` or `select-cols`), which the op model describes and spyre-emit follows (`epilogue` for
  an op its producer's kernel applies; spyre-siblings later makes some matmuls `sibling`);
* an op no kernel runs (a gather, an f32 slice below a stick, a quantizing cast of an activation, a grouped
  conv, ...) gets `spyre.on_host = "<why>"` instead: the later kernel passes skip it and spyre-emit runs it
  on the host.

The target matters: whether a restickify fits a core's address span, or selection matrices and conv working
tiles the scratchpad, is decided for the target's sizes.

```mlir
%0 = spyre.matmul %x, %w : ...                  // -> {spyre.kernel = "matmul"}
%1 = spyre.gather %table, %ids : ...           // -> {spyre.on_host = "no device kernel for spyre.gather ..."}
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import (CONST_FOLD, KERNEL, ON_HOST, compile_time, function_ops, get_target,
                                        is_const_fold, is_device_op)
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class SelectKernelsPass(SpyrePass):
    NAME = "spyre-select-kernels"
    SUMMARY = "Mark compile-time ops spyre.const_fold; give every device op its spyre.kernel or spyre.on_host"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels import select, why_not

        target = get_target(self.target, module)
        folded, known = compile_time(module)
        for op in folded:
            op.attributes[CONST_FOLD] = ir.BoolAttr.get(True)
        for func in function_ops(module):
            for o in func.regions[0].blocks[0].operations:
                op = o.operation
                if not is_device_op(op) or is_const_fold(op):
                    continue
                kernel = select(op, target, known)
                if kernel is not None:
                    op.attributes[KERNEL] = ir.StringAttr.get(kernel)
                else:
                    op.attributes[ON_HOST] = ir.StringAttr.get(why_not(op, target, known) or _why(op))


def _why(op: ir.Operation) -> str:
    """The reason, by op and element types (not shapes: the placement report groups by it)."""
    types = []
    for v in list(op.operands) + list(op.results):
        t = v.type
        e = str(ir.ShapedType(t).element_type) if isinstance(t, ir.ShapedType) else str(t)
        if e not in types:
            types.append(e)
    return f"no device kernel for {op.name} on {', '.join(types)}"
