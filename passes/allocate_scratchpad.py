"""spyre-allocate-scratchpad{target=PATH}: byte offsets of every device op's per-core scratchpad buffers.

Each device op gets `spyre.scratchpad = {name = offset : i64, ...}` and `spyre.scratchpad_bytes = N : i64` (its
peak); the module gets `spyre.scratchpad_peak = N : i64`, the largest of them (a core runs one kernel at a
time, so kernels reuse the whole scratchpad; spyre-prefetch later moves the buffers a kernel loads during the one
before it clear of that one's, and spyre-chain-convs moves the patch a conv receives over the ring above every
kernel's). Offsets are 128-byte aligned (the target's alignment); buffers
share bytes when their lifetimes within the kernel do not overlap; the total never exceeds the usable
scratchpad (an error otherwise). Every core of an op uses the same offsets, which is what a ring reduce-sum
needs. The buffers are exactly those spyre-tile fitted (`passes.op_model.plan`, from `spyre_mlir.cost`).

Buffer names, what the emitter reads (sizes as tiles [rows, cols] in row-major stick-padded layout; "x2" is
a double buffer, name ending 0 and 1, single-buffered ops have only the 0 buffer):

* matmul / batch_matmul: `a0 a1` A tile [tm, tk] x2 (lhs format), `b0 b1` B tile [tk, tn] x2, `pa` / `pb`
  DLFloat16 copies of the A / B tile when their format is not a PT-array format (fp32, bf16), `acc` fp32
  [tm, tn], `red` fp32 [tm, tn] ring reduce-sum destination (split-K only, gk > 1), `out` [tm, tn] result
  format (the `spyre.convert_result` format when there is one), `outf` [tm, tn] result format (the widened
  copy of `out` that is stored, with `spyre.convert_result` only), `bias` [1, tn] (with a bias operand, in its
  format), `colscale` fp32 [1, tn] (a quantized weight's per-column scales). With `spyre.resident_a`: `a0 a1`
  in the PT-array format, `ares` [K steps x part rows, tk] the core's A parts of a row of output tiles (part
  rows = tm / gn), `as` [part rows, tk] in the lhs format (staging before the conversion; no `pa`). With a
  softmax epilogue (whole rows): `smax`, `ssum` and, for a safe softmax, `slive`, fp32 [tm, 1]. With an epilogue
  map: `epa epb ...` [tm, tn] its further inputs' blocks, and `ept` fp32 [tm, tn] when it needs a second
  temporary (the first is `acc`). Computing a sibling matmul too (kernel `sibling`): `g0 g1` its B tiles (like
  `b0 b1`), `gacc` fp32 [tm, tn] its accumulator, `gout` [tm, tn] its finished tile in its result format (the
  epilogue's input instead of a loaded block) and, with quantized weights, `gcolscale` [1, tn]. Computing a matmul
  chained to its softmax (P @ V, kernel `chained`): `va vb` [tn, dv] V of a batch (by batch parity), `pacc` fp32
  [tm, dv] and `pout` [tm, dv] the product's tile, stored instead of `out`. Applying a norm prologue (kernel
  `prologue`, K tile K): `nx` [rows, K] the norm's input rows, `nsq` (and a layernorm's `nxf`) fp32 [rows, K],
  its fp32 [rows, 1] row statistics (`nms`, or `nmean nvar`) and its [1, K] `nweight` / `nbias`, rows the core's
  part of the A tile.
* conv2d: `a0 a1` input patch [input rows x channels, W] x2, `b0 b1` filters [products x tf, KH x channels]
  x2 (one block per PT product: KW of them, KW x KH when dilated along H), `pa` / `pb` DLFloat16 copies of both
  (fp32 data only), `acc` fp32 and `out` [toh x tf, OW], `bias` fp32 [tf, 1]; with a pool it applies
  (kernel `epilogue`), `psel` its column selections [pw x OW, OW / pw] (one per window column, stacked: one
  load), `pct` and `pres` fp32 and `pout` [toh / ph x tf, OW / pw].
* row-wise ops, for a tile of tr rows: streamed inputs `in0 in1` (first operand), `inb0 inb1`, `inc0 inc1`,
  `ind0 ind1` (further map inputs; concat's rhs is `inb`; select-cols terms that read one operand all in `in0`,
  term after term), gather's indices `idx` (one stick); the result `out0 out1`.
  Operands every row shares load once into one buffer named by role: `in` / `inb`... (a map input broadcast
  over rows), `weight` and `bias` (layernorm, rmsnorm), `scale` (cast), `sel` (select-cols: its 0/1 matrices stacked,
  one load). fp32 temporaries:
  map `ta tb`... [tr, C] (the body's live temporaries); reduce `rt` [tr, 1] and, over several dims, `acc`
  [tr, C]; softmax `xf` [tr, C], `max`, `sum` [tr, 1] (max and sum share bytes); layernorm `xf`, `sq` [tr, C],
  `mean`, `var` [tr, 1] (mean and sq share); rmsnorm `xf`, `sq` [tr, C], `ms` [tr, 1].
* pool2d, for a tile of tr output rows (n, c, oh): `sel` [KW x W, OW] the column selections stacked (one load),
  `in0` [tr, W] gathered input rows, `ct` and `res` fp32 [tr, OW], `out0` [tr, OW]; loads happen in the work, so never
  double-buffered.
* ops spyre-divide-work marked `spyre.const_fold` (computed while compiling) get none.

These are the buffers spyre-emit's kernels use (spyre_mlir/codegen/plan.py reads them back by name).
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir import cost
from spyre_mlir.codegen.common import remembering
from spyre_mlir.passes.analysis import (GRID, SCRATCHPAD, SCRATCHPAD_BYTES, SCRATCHPAD_PEAK, TILE, device_ops,
                                        get_target, require)
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import buffers, check_rank, op_model, plan


@dataclasses.dataclass
class AllocateScratchpadPass(SpyrePass):
    NAME = "spyre-allocate-scratchpad"
    SUMMARY = "Set spyre.scratchpad (buffer offsets with liveness reuse) and the per-op and module peaks"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        target = get_target(self.target, module)
        i64 = ir.IntegerType.get_signless(64)
        placed = []
        # Every op is planned before any is set: nothing changes meanwhile, so an epilogue map is analysed once for
        # its own model and its producer's.
        with remembering():
            for op in device_ops(module):
                model = op_model(op)
                grid = require(op, GRID, "spyre-divide-work")
                tile = require(op, TILE, "spyre-tile")
                check_rank(model, grid, GRID)
                check_rank(model, tile, TILE)
                fit = plan(model, grid, tile, target)
                if fit is None:
                    bufs = buffers(model, grid, tile, 1)
                    need = cost.footprint(bufs, target)
                    raise PassError(f"the buffers of tile {tile} need {need} bytes of scratchpad, "
                                    f"{target.scratchpad_usable_bytes} available", op.location)
                placed.append((op, *cost.pack(fit[1], target.scratchpad_alignment_bytes)))
        for op, offsets, used in placed:
            op.attributes[SCRATCHPAD] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in offsets.items()})
            op.attributes[SCRATCHPAD_BYTES] = ir.IntegerAttr.get(i64, used)
        module.attributes[SCRATCHPAD_PEAK] = ir.IntegerAttr.get(i64, max((used for *_, used in placed), default=0))
