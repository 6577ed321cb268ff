"""spyre-chain-matmuls{target=PATH}: attention's P @ V computed by the kernel that computes P.

After spyre-select-kernels, `softmax(q @ k^T + mask)` is one kernel: the q @ k^T matmul applies the mask add and
the softmax to each finished tile of whole rows (`rows.softmax_of`) and stores P, which the P @ V matmul loads
again: per layer, heads x S x S values written and read back. Here that P @ V matmul gets
`spyre.kernel = "chained"` (`codegen.kernels.matmul.chained_of`: it reads the softmax's result as its lhs, through
row-view reshapes, by a V defined before q @ k^T in a PT format, with no bias, conversions or epilogue of its own,
over the same batches and rows): q @ k^T's kernel multiplies each finished P tile by the batch's V, held on the
scratchpad (`va vb`, loaded once per batch and shared over the ring by the cores of a grid column), and stores only
the product (`pacc`, `pout`). P never leaves the cores.

Runs after spyre-tile, because it keeps the numerics: P @ V is chained only when its own plan multiplies whole
rows of P in one K step without a K split, so each product is the same one-step sum over a row of P (the
emulator's BLAS may group the fp32 sums of a tile with another row count differently in the last bit), and only
when q @ k^T's plan, tiles and buffer count unchanged, still fits the scratchpad with the chain's buffers. The
chained op's grid and tile become an epilogue's (`[1]`, its rows): it has no plan of its own.

```mlir
%s = spyre.batch_matmul %q, %k {transpose_rhs, spyre.kernel = "matmul"}   // stores P @ V now
%p = spyre.softmax(%s) {spyre.kernel = "epilogue"}
%o = spyre.batch_matmul %p, %v {spyre.kernel = "matmul"}                  // -> {spyre.kernel = "chained"}
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import GRID, TILE, fuse_into_kernel, get_target, int_array, kernel_ops
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import chain_needs, op_model, plan


@dataclasses.dataclass
class ChainMatmulsPass(SpyrePass):
    NAME = "spyre-chain-matmuls"
    SUMMARY = "Compute attention's P @ V in the kernel that computes P (kernel `chained`) where the plans allow"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels.matmul import chained_of

        target = get_target(self.target, module)
        for op in kernel_ops(module, "matmul"):
            pv = chained_of(op, chosen=False)
            if pv is None or not _one_step(pv):
                continue
            model, grid, tile = op_model(op), int_array(op, GRID), int_array(op, TILE)
            alone = plan(model, grid, tile, target)
            chained = plan(dataclasses.replace(model, chain=chain_needs(pv)), grid, tile, target)
            if alone is None or chained is None or chained[0] != alone[0]:
                continue
            fuse_into_kernel(pv, "chained")


def _one_step(pv: ir.Operation) -> bool:
    """P @ V's own plan multiplies whole rows of P in one K step, without a K split."""
    grid, tile = int_array(pv, GRID), int_array(pv, TILE)
    k = ir.RankedTensorType(pv.operands[0].type).shape[-1]
    return grid is not None and tile is not None and grid[-1] == 1 and tile[-1] == k
