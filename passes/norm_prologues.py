"""spyre-norm-prologues{target=PATH}: a norm computed by the matmul kernel that reads it, as a prologue.

A pre-norm transformer normalizes its residual stream before every projection: `q/k/v(rmsnorm(x))`,
`gate/up(rmsnorm(x))`. Alone, the norm's kernel reads x and writes its result to device memory, and the matmul
kernel reads it back: per norm, rows x K values written and read, and one more kernel with its barrier. Here a
layernorm or rmsnorm over the last dim that only a matmul (and the sibling its kernel computes) reads as its lhs
(`codegen.kernels.matmul.prologue_of`) gets `spyre.kernel = "prologue"`: the matmul kernel loads the norm's
input rows wherever it would load an A tile and runs the norm's micro-ops on them into the A tile
(`matmul.Prologue`, the same micro-ops as the norm's own kernel, so the bits are the same). An M/N-split kernel
normalizes each core's part of the A tile before sharing it over the ring, so each row is normalized once per
tile.

Runs after spyre-tile, because a prologue needs whole rows: a matmul without a K split that keeps no resident
A takes one when a plan with K tile K (one K step) and the prologue's buffers (cost.prologue_buffers) fits the
scratchpad, and the cost model prices the cheapest such plan (M and N tiles among spyre-tile's candidates, its
own first among equals), with the norm's SFU work on each A part (cost.prologue_sfu), below the plan spyre-tile
chose plus the norm's own kernel. That plan's tile replaces spyre-tile's (a tile forced on spyre-tile gives
way), which sums each product in one step: the result is that of the matmul tiled so, not always bit-identical
to the two kernels' with the smaller K tile. The norm's grid and
tile become an epilogue's (`[1]`, its rows): it has no plan of its own.

```mlir
%n = spyre.rmsnorm %x, %w {spyre.kernel = "rows"}          // -> {spyre.kernel = "prologue"}
%q = spyre.matmul %n, %wq {spyre.kernel = "matmul"}         // loads rows of %x, normalizes them, multiplies
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import GRID, TILE, fuse_into_kernel, get_target, int_array, kernel_ops
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir import cost
from spyre_mlir.passes.op_model import matmul_cycles, op_model, plan, prologue_needs


@dataclasses.dataclass
class NormProloguesPass(SpyrePass):
    NAME = "spyre-norm-prologues"
    SUMMARY = "Compute a norm only a matmul reads in that matmul's kernel (kernel `prologue`) where the plans allow"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels.matmul import prologue_of

        target = get_target(self.target, module)
        for op in kernel_ops(module, "matmul"):
            norm = prologue_of(op, chosen=False)
            if norm is None:
                continue
            model, grid, tile = op_model(op), int_array(op, GRID), int_array(op, TILE)
            if grid is None or tile is None or grid[-1] != 1 or model.resident:
                continue
            alone = plan(model, grid, tile, target)
            fused = dataclasses.replace(model, prologue=prologue_needs(norm))
            best = _best_tile(fused, grid, tile, target)
            if alone is None or best is None:
                continue
            before = matmul_cycles(model, grid, tile, target, alone[0] == 2).total + _cycles(norm, target)
            if best[0] >= before:
                continue
            op.attributes[TILE] = ir.DenseI64ArrayAttr.get(best[1])
            fuse_into_kernel(norm, "prologue")


def _cycles(norm: ir.Operation, target) -> float:
    """The modeled cycles of the norm's own kernel on its grid and tile, with the barrier after it."""
    model, grid, tile = op_model(norm), int_array(norm, GRID), int_array(norm, TILE)
    fit = plan(model, grid, tile, target)
    if fit is None:
        return float("inf")
    return cost.rowwise_cycles(model.rows, grid, tile, target, fit[0] == 2).total + target.barrier_latency_cycles


def _best_tile(model, grid, tile, target) -> tuple[float, list[int]] | None:
    """(modeled cycles, tile) of the cheapest plan of matmul ``model`` (its prologue set) on ``grid`` with K tile K
    whose buffers fit: tm and tn free among spyre-tile's candidates (tn kept where a ragged N split or a softmax
    takes one tile column), the tile spyre-tile chose first among equals."""
    mb, nb, kb = model.block(grid, target)
    tms, tns, _ = cost.matmul_tile_candidates(mb, nb, kb, target, model.fmt, model.out_fmt, model.b_fmt,
                                              model.trans_b)
    if nb * model.grid4(grid)[2] != model.N or model.softmax is not None:
        tns = [tile[-2]]
    best = None
    for cand in [list(tile[-3:-1])] + [[tm, tn] for tm in tms for tn in tns]:
        t = list(tile[:-3]) + cand + [model.K]
        fit = plan(model, grid, t, target)
        if fit is not None:
            c = matmul_cycles(model, grid, t, target, fit[0] == 2).total
            if best is None or c < best[0]:
                best = (c, t)
    return best
