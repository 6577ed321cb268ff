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
mean more device-memory traffic. `cores` outside 1..max_cores is an error. An op no division can fit (a slice
beyond a core's span on few cores, a softmax or norm row, an elementwise op's single row too long for the
scratchpad) runs on the host: it gets `spyre.on_host` with the reason instead of a grid, and so does what its
kernel would have computed with it (an epilogue map or pool, a sibling matmul). So does a fused matmul (operand
conversions, a sibling) whose own buffers find no tile on the grid of the op alone, which it must keep.
The module records the machine: `spyre.cores = N` and, with `target=PATH`, `spyre.target = "PATH"`.
Ops spyre-select-kernels marked `spyre.const_fold` (computed while compiling) or `spyre.on_host` (no device
kernel) get no grid; every other device op must carry the `spyre.kernel` that pass chose.
Each op's kernel is described to the cost model by `passes.op_model.op_model`.
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import CORES, GRID, KERNEL, ON_HOST, TARGET, device_ops, get_target
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import op_model
from spyre_mlir.passes.tile import fits


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
            if ON_HOST in op.attributes:        # sent to the host below with the op whose kernel applied it
                continue
            model = op_model(op)
            grid = model.best_grid(cores, target)
            if grid is None:
                _to_host(op, f"no division of {model.describe()} over at most {cores} cores keeps each core's "
                             f"device memory within the {target.core_span_bytes}-byte span and its tiles within "
                             f"the {target.scratchpad_usable_bytes}-byte scratchpad")
                continue
            if model.kind == "matmul" and (model.fused or model.sibling) and not fits(model, grid, target, cores):
                # The grid is the op alone's (bit-identical accumulation); its conversions or sibling need more
                # scratchpad than that op's tiles.
                _to_host(op, f"{model.describe()} with its operand conversions or sibling does not fit the "
                             f"{target.scratchpad_usable_bytes}-byte scratchpad on grid {list(grid)}, the grid of "
                             f"the op alone")
                continue
            op.attributes[GRID] = ir.DenseI64ArrayAttr.get(list(grid))
        # The later stages (spyre-emit) follow the machine this division was made for.
        module.attributes[CORES] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), cores)
        if self.target:
            module.attributes[TARGET] = ir.StringAttr.get(self.target)


def _to_host(op: ir.Operation, reason: str) -> None:
    """Run ``op`` on the host (``spyre.on_host``, as spyre-select-kernels marks an op no kernel runs), and with it
    what its kernel would have computed: the map or pool it applied as an epilogue, the sibling or chained
    matmul it computed beside it."""
    from spyre_mlir.codegen.kernels.matmul import chained_of, sibling_of
    from spyre_mlir.codegen.kernels.rows import epilogue_reader

    applied = []
    if op.name in ("spyre.matmul", "spyre.batch_matmul"):
        sib = sibling_of(op)
        applied = [x for x in (sib and sib[1], chained_of(op)) if x is not None]
    if len(op.results) == 1 and (epi := epilogue_reader(op.results[0])) is not None:
        applied.append(epi)
    del op.attributes[KERNEL]
    op.attributes[ON_HOST] = ir.StringAttr.get(reason)
    for other in applied:
        other = other.operation
        if ON_HOST not in other.attributes:
            _to_host(other, f"computed by the kernel of a {op.name} that runs on the host")
