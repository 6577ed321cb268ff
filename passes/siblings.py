"""spyre-siblings: a matmul another matmul's kernel computes beside its own, from the same A tiles.

An MLP's `act(gate(x)) * up(x)` is two matmuls of the same lhs and a gated map, which spyre-select-kernels made
the later matmul's epilogue (`rows.epilogue`): that kernel loads a block of gate's result per output tile, so
gate's result round-trips device memory and x is read twice. Here the earlier matmul gets
`spyre.kernel = "sibling"` (`codegen.kernels.matmul.sibling_of`: the same lhs value, through row-view reshapes;
a rhs of the same type, layout and quantization; no bias; the same result type and operand conversions; the map
its only reader): the later matmul's kernel multiplies each A tile by both B tiles and writes the sibling's
finished tile back where its epilogue reads it. The sibling has no plan of its own (spyre-divide-work gives it
the row model of an epilogue) and no barrier after it; the applying matmul keeps the K split and K tile of the op
alone (spyre-divide-work, spyre-tile), so both results are bit-identical to two kernels'. A pair is made only
when the cost model (`op_model.best_cycles` on ``cores`` cores, in the tile spyre-tile will choose) finds the
kernel computing both cheaper than the two apart: the sibling's B tiles beside the op's own shrink its output
tiles, and a decode row's split-K MLP (Granite's 4096 -> 12800) then takes a third longer than two kernels.

Runs after spyre-partition-cards, on each card's functions, so that the card placement sees two matmuls (split
alike, they pair again on every card) and before any op is planned.

```mlir
%g = spyre.matmul %x, %wg {spyre.kernel = "matmul"}   // -> {spyre.kernel = "sibling"}
%u = spyre.matmul %x, %wu {spyre.kernel = "matmul"}   // its kernel computes %g too
%h = spyre.map(%g, %u) {spyre.kernel = "epilogue"}    // silu(g) * u, applied by %u's kernel
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import KERNEL, get_target, kernel_ops
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import best_cycles, op_model


@dataclasses.dataclass
class SiblingsPass(SpyrePass):
    NAME = "spyre-siblings"
    SUMMARY = "Give a matmul only another matmul's epilogue reads, of the same lhs, kernel `sibling`"

    cores: int = 0
    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels.matmul import sibling_of

        target = get_target(self.target, module)
        cores = self.cores or target.num_cores
        for op in kernel_ops(module, "matmul"):
            found = sibling_of(op, chosen=False)
            if found is None:
                continue
            apart = [best_cycles(op_model(x), cores, target) for x in (op, found[1])]
            found[1].attributes[KERNEL] = ir.StringAttr.get("sibling")
            together = best_cycles(op_model(op), cores, target)
            if together is None or None in apart or together.total >= sum(c.total for c in apart):
                found[1].attributes[KERNEL] = ir.StringAttr.get("matmul")
