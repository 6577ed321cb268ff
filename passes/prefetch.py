"""spyre-prefetch{target=PATH}: load a kernel's constants while the kernel before it runs.

A kernel that loads constants once before its work (``codegen.kernels.prefetchable``: a conv2d sharing its
filters, bias and pool selections over the ring; a K-split matmul's one constant B tile per core) starts with DRAM
reads while its PT array and SFU wait. The constants depend on nothing, and the kernel before it may leave its DMA
unit idle while it computes, so those loads can run then: the next layer's weights arrive while this layer
computes. Only into idle time: when the previous kernel's modeled cycles minus its DMA cycles (the cost model on
its plan) do not cover the loads (their bytes at the DRAM read bandwidth, plus a DMA latency), they would share a
DMA-bound kernel's bandwidth and delay it by as much as they save, and the op keeps its plan.

For each such op whose previous device kernel is emitted right before it (nothing but ops its kernel or that
kernel applies in between: an epilogue, a view; no host work), `spyre.prefetch = ["b0", ...]` names the buffers
spyre-emit loads (and multicasts) in the previous kernel's last segment, on each core after that kernel's last
load there, and their `spyre.scratchpad` offsets move to bytes the previous kernel does not touch: at or above
the other buffers of both kernels, clear of the previous kernel's own prefetched buffers. The op's
`spyre.scratchpad_bytes` and the module's `spyre.scratchpad_peak` grow to match; an op whose buffers would not
fit the usable scratchpad keeps its plan. The multicasts land at the barrier after the previous kernel (or, when
it has none, the kernel's own barrier before its work), which joins every core.

    %c = "spyre.conv2d"(%x, %w, %b) {spyre.kernel = "conv2d", spyre.prefetch = ["b0", "bias"],
           spyre.scratchpad = {a0 = 0, b0 = 40960, bias = 43008, ...}, ...}
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import (GRID, KERNEL, ON_HOST, PREFETCH, SCRATCHPAD, SCRATCHPAD_BYTES,
                                        SCRATCHPAD_PEAK, TILE, get_target, is_const_fold, is_device_op)
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import op_model, plan, planned_cycles

# Kernels emitted by another op's kernel (they add at most a barrier where they stand).
_APPLIED = frozenset({"epilogue", "chained", "sibling", "prologue"})


def _offsets(op) -> dict[str, int]:
    return {a.name: ir.IntegerAttr(a.attr).value for a in ir.DictAttr(op.attributes[SCRATCHPAD])}


def _kernel(op) -> str | None:
    return ir.StringAttr(op.attributes[KERNEL]).value if KERNEL in op.attributes else None


def _transparent(op) -> bool:
    """Whether ``op`` emits no instructions between two kernels (at most a barrier)."""
    if op.name in ("arith.constant", "tensor.empty"):
        return True
    if not is_device_op(op) or ON_HOST in op.attributes or is_const_fold(op):
        return False
    kernel = _kernel(op)
    if kernel in _APPLIED:
        return True
    # A view is free unless the host copies it (it is returned, or a host op reads it).
    return kernel == "alias" and all(is_device_op(u.owner) and ON_HOST not in u.owner.attributes
                                     for r in op.results for u in r.uses)


@dataclasses.dataclass
class PrefetchPass(SpyrePass):
    NAME = "spyre-prefetch"
    SUMMARY = "Load a kernel's once-loaded constants during the previous kernel (spyre.prefetch)"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.kernels import prefetchable

        target = get_target(self.target, module)
        align, usable = target.scratchpad_alignment_bytes, target.scratchpad_usable_bytes
        bandwidth = target.dram_read_gbps / target.clock_ghz      # bytes per cycle
        i64 = ir.IntegerType.get_signless(64)
        peak = ir.IntegerAttr(module.attributes[SCRATCHPAD_PEAK]).value if SCRATCHPAD_PEAK in module.attributes \
            else 0

        def sizes(op) -> dict[str, int]:
            grid, tile = (list(ir.DenseI64ArrayAttr(op.attributes[a])) for a in (GRID, TILE))
            return {b.name: b.nbytes for b in plan(op_model(op), grid, tile, target)[1]}

        def rest(op, hoisted) -> int:
            """The end of ``op``'s buffers other than its prefetched ones (those in [hoisted[0], hoisted[1]))."""
            size = sizes(op)
            return max((o + size[n] for n, o in _offsets(op).items() if not hoisted[0] <= o < hoisted[1]),
                       default=0)

        def walk(block):
            nonlocal peak
            prev, prev_hoisted = None, (0, 0)      # the last kernel, and the bytes of its prefetched buffers
            for op in block.operations:
                op = op.operation
                if _transparent(op):
                    continue
                if not is_device_op(op) or SCRATCHPAD not in op.attributes or _kernel(op) in ("alias", None):
                    for region in op.regions:        # a function body; anything else fences
                        for b in region.blocks:
                            walk(b)
                    prev = None
                    continue
                hoisted = (0, 0)
                names, nbytes = prefetchable(op, target) if prev is not None else ((), 0)
                # Only into DMA time the previous kernel leaves idle: a DMA-bound kernel would share its
                # bandwidth with the loads and end later by as much as they save.
                if names:
                    was = planned_cycles(prev, target)
                    if was.total - was.dma < nbytes / bandwidth + target.dma_latency_cycles:
                        names = ()
                if names:
                    offsets, size = _offsets(op), sizes(op)
                    padded = {n: -(-size[n] // align) * align for n in names}
                    mine = max((offsets[n] + size[n] for n in offsets if n not in names), default=0)
                    base = -(-max(mine, rest(prev, prev_hoisted)) // align) * align
                    if base < prev_hoisted[1] and base + sum(padded.values()) > prev_hoisted[0]:
                        base = prev_hoisted[1]
                    if base + sum(padded.values()) <= usable:
                        new, at = dict(offsets), base
                        for n in names:
                            new[n], at = at, at + padded[n]
                        op.attributes[SCRATCHPAD] = ir.DictAttr.get(
                            {k: ir.IntegerAttr.get(i64, v) for k, v in new.items()})
                        op.attributes[SCRATCHPAD_BYTES] = ir.IntegerAttr.get(i64, max(mine, at))
                        op.attributes[PREFETCH] = ir.ArrayAttr.get([ir.StringAttr.get(n) for n in names])
                        peak = max(peak, mine, at)
                        hoisted = (base, at)
                prev, prev_hoisted = op, hoisted

        for region in module.regions:
            for b in region.blocks:
                walk(b)
        module.attributes[SCRATCHPAD_PEAK] = ir.IntegerAttr.get(i64, peak)
