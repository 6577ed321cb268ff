"""spyre-chain-convs{target=PATH}: a conv's output rows go over the ring into the input patches of the conv reading
them, or into the input tiles of the flatten reading them, and a flatten's into the A tiles of its classifier.

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

A CNN's flatten (a `spyre.reshape` with kernel `select-cols` merging rows narrower than a stick into sticks,
`codegen.kernels.move.ring_merges`) reading such a value is marked the same way: its `in0` then holds every row tile
of its core (`move.ring_slots`), which the conv's kernel fills, and it loads nothing but its selection matrices.
And the classifier reading the flatten's result (rows of whole sticks, `move.ring_sends`), a matmul whose cores
each hold one A tile loaded in one K step (`codegen.kernels.matmul.ring_takes`: a K-split classifier), is marked so
that the flatten sends each core the sticks of its A tile (`matmul.ring_sticks`) instead of storing its result.

The patches are written while the producer's kernel (and any kernel between the two) runs, so `a0` moves where
none of them touches it: above every kernel's buffers (the module's `spyre.scratchpad_peak`, which covers the
buffers spyre-prefetch hoisted too), first fit among the patches of other chains alive at the same time. The conv's
`spyre.scratchpad_bytes` and the module's peak grow to match; a conv whose patches would not fit the usable
scratchpad keeps its loads. Runs after spyre-prefetch (its placements are what the peak covers).

    %p = "spyre.pool2d"(%r) {spyre.kernel = "epilogue", ...}         // applied by the first conv's kernel
    %c = "spyre.conv2d"(%p, %w, %b) {spyre.kernel = "conv2d", spyre.ring_input = true,
           spyre.scratchpad = {a0 = 43008 : i64, ...}, spyre.scratchpad_bytes = 55296 : i64, ...}
    %f = "spyre.reshape"(%q) {spyre.kernel = "select-cols", spyre.ring_input = true,
           spyre.scratchpad = {..., in0 = 94208 : i64, ...}, ...}         // a conv's pooled maps, flattened
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
    SUMMARY = "Send a conv's (a flatten's) output rows over the ring into the input of the op reading them"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels import move
        from spyre_mlir.codegen.kernels.conv import ring_buffer, ring_source
        from spyre_mlir.codegen.kernels.matmul import ring_takes

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
                kernel = ir.StringAttr(op.attributes[KERNEL]).value if KERNEL in op.attributes else None
                if SCRATCHPAD not in op.attributes:
                    continue
                if op.name == "spyre.conv2d" and kernel == "conv2d" or kernel == "select-cols" and \
                        move.ring_merges(op):
                    src = ring_source(op)
                elif kernel == "matmul" and ring_takes(op, target):
                    src = move.ring_source(op)
                    src = src if src is not None and move.ring_sends(src) else None
                else:
                    continue
                if src is None or src not in at:
                    continue
                model, grid, tile = op_model(op), int_array(op, GRID), int_array(op, TILE)
                # The barrier after the producer delivers the sends; two kernels on one core only copy on the SFU.
                if BARRIER not in src.attributes and not math.prod(grid) == math.prod(int_array(src, GRID)) == 1:
                    continue
                buf = ring_buffer(op)
                size = next(b.nbytes for b in plan(model, grid, tile, target)[1] if b.name == buf)
                if model.conv is not None:
                    size *= model.conv.patches_per_core(grid, tile)
                elif model.rows is not None:
                    size *= move.ring_slots(grid, tile, model.rows.rows)
                chains.append((fn, at[src], i, op, buf, -(-size // align) * align))
        placed = []             # (function, first op, last op, first byte, end)
        for func, first, last, op, buf, size in chains:
            lo = base
            for f, a, z, plo, phi in sorted(placed, key=lambda p: p[3]):
                if f == func and a <= last and first <= z and lo < phi and plo < lo + size:
                    lo = phi
            if lo + size > usable:
                continue
            placed.append((func, first, last, lo, lo + size))
            offsets = {a.name: ir.IntegerAttr(a.attr).value for a in ir.DictAttr(op.attributes[SCRATCHPAD])}
            offsets[buf] = lo
            used = max(ir.IntegerAttr(op.attributes[SCRATCHPAD_BYTES]).value, lo + size)
            op.attributes[SCRATCHPAD] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in offsets.items()})
            op.attributes[SCRATCHPAD_BYTES] = ir.IntegerAttr.get(i64, used)
            op.attributes[RING_INPUT] = ir.BoolAttr.get(True)
            peak = max(peak, used)
        module.attributes[SCRATCHPAD_PEAK] = ir.IntegerAttr.get(i64, peak)
