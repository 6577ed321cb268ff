"""spyre-chain-convs{target=PATH}: a conv's output rows go over the ring into the input patches of the conv reading
them.

A CNN's layers are convs (with their ReLU and pool) reading each other's outputs. Alone, each conv kernel stores
its output tiles to device memory and the next one loads its input patches back from there (with their halo
rows, read twice): the activations cross DRAM twice per layer, and DRAM is what bounds a small CNN. Here a conv2d
whose input is the stored result of another conv2d's kernel (its own, its epilogue map's or its pool's;
`codegen.kernels.conv.ring_source`), read by nothing else, gets `spyre.ring_input = true` when all of a core's
input patches fit the scratchpad at once: its `a0` then holds every patch of the core's tiles, one after another
(`cost.ConvKernel.patches_per_core`: one per image and output-row tile, and per filter tile when depthwise), and the
producer's kernel sends each stored row over the ring to every core whose patches hold it, at its place there (an
SFU copy on its own core), instead of storing it. The sends land at the barrier after the producer (spyre-schedule's,
which joins every core; two kernels on one core need none), and the conv only zero-fills its padding rows. The same
bytes reach the patches, so the results are bit-identical; the DRAM buffer of the value is never written or read.

The patches are written while the producer's kernel (and any kernel between the two) runs, so `a0` moves where
none of them touches it: above every kernel's buffers (the module's `spyre.scratchpad_peak`, which covers the
buffers spyre-prefetch hoisted too), first fit among the patches of other chains alive at the same time. The conv's
`spyre.scratchpad_bytes` and the module's peak grow to match; a conv whose patches would not fit the usable
scratchpad keeps its loads. Runs after spyre-prefetch (its placements are what the peak covers).

    %p = "spyre.pool2d"(%r) {spyre.kernel = "epilogue", ...}         // applied by the first conv's kernel
    %c = "spyre.conv2d"(%p, %w, %b) {spyre.kernel = "conv2d", spyre.ring_input = true,
           spyre.scratchpad = {a0 = 43008 : i64, ...}, spyre.scratchpad_bytes = 55296 : i64, ...}
"""

from __future__ import annotations

import dataclasses
import math

from torch_mlir import ir

from spyre_mlir.passes.analysis import (BARRIER, GRID, KERNEL, RING_INPUT, SCRATCHPAD, SCRATCHPAD_BYTES,
                                        SCRATCHPAD_PEAK, TILE, function_ops, get_target, int_array)
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import op_model, plan


@dataclasses.dataclass
class ChainConvsPass(SpyrePass):
    NAME = "spyre-chain-convs"
    SUMMARY = "Send a conv's output rows over the ring into the input patches of the conv reading them"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels.conv import ring_source

        target = get_target(self.target, module)
        align, usable = target.scratchpad_alignment_bytes, target.scratchpad_usable_bytes
        i64 = ir.IntegerType.get_signless(64)
        peak = ir.IntegerAttr(module.attributes[SCRATCHPAD_PEAK]).value if SCRATCHPAD_PEAK in module.attributes \
            else 0
        base = -(-peak // align) * align
        # An Operation's hash covers its attributes: find every chain before changing any op.
        chains = []
        for fn, func in enumerate(function_ops(module)):
            ops = [op.operation for op in func.regions[0].blocks[0].operations]
            at = {op: i for i, op in enumerate(ops)}
            for i, op in enumerate(ops):
                if op.name != "spyre.conv2d" or KERNEL not in op.attributes or SCRATCHPAD not in op.attributes \
                        or ir.StringAttr(op.attributes[KERNEL]).value != "conv2d":
                    continue
                src = ring_source(op)
                if src is None or src not in at:
                    continue
                model, grid, tile = op_model(op), int_array(op, GRID), int_array(op, TILE)
                # The barrier after the producer delivers the sends; two kernels on one core only copy on the SFU.
                if BARRIER not in src.attributes and not math.prod(grid) == math.prod(int_array(src, GRID)) == 1:
                    continue
                size = next(b.nbytes for b in plan(model, grid, tile, target)[1] if b.name == "a0")
                size *= model.conv.patches_per_core(grid, tile)
                chains.append((fn, at[src], i, op, -(-size // align) * align))
        placed = []             # (function, first op, last op, first byte, end)
        for func, first, last, op, size in chains:
            lo = base
            for f, a, z, plo, phi in sorted(placed, key=lambda p: p[3]):
                if f == func and a <= last and first <= z and lo < phi and plo < lo + size:
                    lo = phi
            if lo + size > usable:
                continue
            placed.append((func, first, last, lo, lo + size))
            offsets = {a.name: ir.IntegerAttr(a.attr).value for a in ir.DictAttr(op.attributes[SCRATCHPAD])}
            offsets["a0"] = lo
            used = max(ir.IntegerAttr(op.attributes[SCRATCHPAD_BYTES]).value, lo + size)
            op.attributes[SCRATCHPAD] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in offsets.items()})
            op.attributes[SCRATCHPAD_BYTES] = ir.IntegerAttr.get(i64, used)
            op.attributes[RING_INPUT] = ir.BoolAttr.get(True)
            peak = max(peak, used)
        module.attributes[SCRATCHPAD_PEAK] = ir.IntegerAttr.get(i64, peak)
