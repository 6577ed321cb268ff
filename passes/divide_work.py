"""spyre-divide-work{cores=N target=PATH}: choose how many cores run each device op, along which dimensions.

Every device op (a spyre op other than host/yield, not nested in a spyre.host) gets
`spyre.grid = array<i64: ...>`, the number of cores along each dimension of its iteration space:

* matmul `[gm, gn, gk]`, batch_matmul `[gb, gm, gn, gk]`, conv2d `[gn, gf, goh]`;
* every other op is row-wise, `[gr]` over the flattened leading dimensions (the innermost dimension, and for
  softmax / layernorm / reduce every dimension from the normalized or reduced one on, stays whole on a core).

Splits are stick-aligned and even (M in multiples of the PT rows, N and K in whole sticks, see
`spyre_mlir.cost`), except that a matmul's N may split ragged when no even split in sticks exists (an MLP's
hidden 688 = 10.75 sticks: `cost.n_block`, every core ceil(N / gn) rounded up to sticks but the last, which
takes the rest; one tile column per core and no K split), the product is at most N (default: the target's cores) and each core's slice of device
memory stays within the target's 256 MB span. Among the legal divisions the cost model picks the cheapest, so
a tiny op stays on one core (DRAM bandwidth is shared, and every core pays its own transfers and the barrier
at the op's end) and K is split only when M and N cannot use the cores. An M/N-split matmul is costed as the
emitted kernel runs it: the cores of a grid row / column share A / B tiles over the ring, so more cores do not
mean more device-memory traffic. `cores` outside 1..max_cores is an error, as is an op no division can fit.
The module records the machine: `spyre.cores = N` and, with `target=PATH`, `spyre.target = "PATH"`.
Ops spyre-select-kernels marked `spyre.const_fold` (computed while compiling) or `spyre.on_host` (no device
kernel) get no grid; every other device op must carry the `spyre.kernel` that pass chose.
Each op's kernel is described to the cost model by `passes.op_model.op_model`.
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import CORES, GRID, TARGET, device_ops, get_target
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import op_model


@dataclasses.dataclass
class DivideWorkPass(SpyrePass):
    NAME = "spyre-divide-work"
    SUMMARY = "Set spyre.grid (cores per iteration dimension) on every device op with the cost model"

    cores: int = 0
    target: str = ""

    def run(self, module: ir.Operation) -> None:
        target = get_target(self.target, module)
        cores = self.cores or target.num_cores
        if not 1 <= cores <= target.max_cores:
            raise PassError(f"impossible core count {cores}: target '{target.name}' has 1..{target.max_cores} cores",
                            module.location)
        for op in device_ops(module):
            model = op_model(op)
            grid = model.best_grid(cores, target)
            if grid is None:
                raise PassError(f"no division of {model.describe()} over at most {cores} cores keeps each core's "
                                f"device memory within the {target.core_span_bytes}-byte span and its tiles "
                                f"within the {target.scratchpad_usable_bytes}-byte scratchpad", op.location)
            op.attributes[GRID] = ir.DenseI64ArrayAttr.get(list(grid))
        # The later stages (spyre-emit) follow the machine this division was made for.
        module.attributes[CORES] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), cores)
        if self.target:
            module.attributes[TARGET] = ir.StringAttr.get(self.target)
