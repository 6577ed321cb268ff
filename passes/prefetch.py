"""spyre-prefetch{target=PATH}: load a kernel's constants while an earlier kernel computes.

A kernel that loads constants once before its work (``codegen.kernels.prefetchable``: a conv2d sharing its
filters, bias and pool selections over the ring; a K-split matmul's one constant B tile per core; a flatten's
selection matrices, select-cols) starts with DRAM reads while its PT array and SFU wait. The constants depend on
nothing, and an earlier kernel may leave its DMA unit idle while it computes, so those loads can run then: the next
layer's weights arrive while this layer computes. Only into idle time, and only where it pays (``codegen.kernels.last_segment``, the cost model on the
plans): the host is the nearest of the last MAX_DISTANCE kernels whose last segment loads nothing (a phased conv,
a matmul with one tile per core) and computes there at least as long as the loads take (less what earlier
prefetches took), and the cycles the loads keep this kernel from its work exceed what they cost the host: the
first reads in a segment that only stored turn its stores to the mixed read/write bandwidth. A streaming
kernel's DMA unit is busy to its last tiles: loads given to it share its bandwidth and delay it by as much as they
save.

Between that kernel and this op there may only be kernels and ops emitting nothing of their own (an epilogue, a
view; no host work). `spyre.prefetch = ["b0", ...]` names the buffers spyre-emit loads (and multicasts) in that
kernel's last segment, on each core after its last load there; `spyre.prefetch_distance = d` says which kernel
(1: the one just before). Their `spyre.scratchpad` offsets move to bytes none of the kernels from there to this op
touches: at or above all their other buffers, clear of the prefetched buffers alive meanwhile. The op's
`spyre.scratchpad_bytes` and the module's `spyre.scratchpad_peak` grow to match; an op whose buffers would not fit
the usable scratchpad keeps its plan. A conv's multicasts of those rows go with the loads when the next barrier
there joins their destinations (they land at it), else before the conv's own barrier, which joins all its cores
(a phased row-wise kernel or a K-split matmul group in between meets on fewer).

    %c = "spyre.conv2d"(%x, %w, %b) {spyre.kernel = "conv2d", spyre.prefetch = ["b0", "bias"],
           spyre.prefetch_distance = 1 : i64, spyre.scratchpad = {a0 = 0, b0 = 40960, bias = 43008, ...}, ...}
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import (GRID, KERNEL, ON_HOST, PREFETCH, PREFETCH_DISTANCE, SCRATCHPAD,
                                        SCRATCHPAD_BYTES, SCRATCHPAD_PEAK, TILE, get_target, is_const_fold,
                                        is_device_op)
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import op_model, plan

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


MAX_DISTANCE = 4      # kernels back a prefetch may go


@dataclasses.dataclass
class _Kernel:
    rest: int                                  # the end of its buffers other than its prefetched ones
    idle: float                                # DMA-idle cycles of its last segment not yet given to a prefetch
    store: float                               # cycles its last segment stores (write-only until it hosts a load)
    hoisted: tuple[int, int] | None = None     # the bytes of its prefetched buffers
    hosts: bool = False                        # it loads another kernel's buffers


@dataclasses.dataclass
class PrefetchPass(SpyrePass):
    NAME = "spyre-prefetch"
    SUMMARY = "Load a kernel's once-loaded constants during an earlier kernel that computes (spyre.prefetch)"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        from spyre_mlir.codegen.common import remembering
        from spyre_mlir.codegen.kernels import last_segment, prefetchable

        target = get_target(self.target, module)
        align, usable = target.scratchpad_alignment_bytes, target.scratchpad_usable_bytes
        # A segment that only wrote reads and writes now: its stores may run at the mixed bandwidth (the cycle
        # model slows them while the hoisted loads overlap them; priced as if they all did: an upper bound).
        mixing = target.dram_write_gbps / target.dram_mixed_gbps - 1
        i64 = ir.IntegerType.get_signless(64)
        peak = ir.IntegerAttr(module.attributes[SCRATCHPAD_PEAK]).value if SCRATCHPAD_PEAK in module.attributes \
            else 0

        def sizes(op) -> dict[str, int]:
            grid, tile = (list(ir.DenseI64ArrayAttr(op.attributes[a])) for a in (GRID, TILE))
            return {b.name: b.nbytes for b in plan(op_model(op), grid, tile, target)[1]}

        def walk(block):
            nonlocal peak
            seen: list[_Kernel] = []      # the kernels since the last fence, in order
            for op in block.operations:
                op = op.operation
                if _transparent(op):
                    continue
                if not is_device_op(op) or SCRATCHPAD not in op.attributes or _kernel(op) in ("alias", None):
                    for region in op.regions:        # a function body; anything else fences
                        for b in region.blocks:
                            walk(b)
                    seen = []
                    continue
                with remembering():      # each of these reads the op's model (its plan, cycles): once
                    names, need, gain = prefetchable(op, target) if seen else ((), 0.0, 0.0)
                    offsets, size = _offsets(op), sizes(op)
                    # A kernel whose last segment loads nothing idles its DMA unit while it computes there (the
                    # cost model on its plan); a streaming kernel's last tiles leave too little to count on.
                    compute, store = last_segment(op, target) or (0.0, 0.0)
                mine = max((offsets[n] + size[n] for n in offsets if n not in names), default=0)
                me = _Kernel(max((o + size[n] for n, o in offsets.items()), default=0), compute, store)
                padded = {n: -(-size[n] // align) * align for n in names}
                # The nearest kernel before whose idle DMA time takes the loads, up to MAX_DISTANCE back, where
                # they save more than they cost (the first loads of a write-only segment slow its stores).
                for j in range(len(seen) - 1, max(-1, len(seen) - 1 - MAX_DISTANCE), -1) if names else ():
                    host = seen[j]
                    if host.idle < need or gain <= (0 if host.hosts else host.store * mixing):
                        continue
                    # Clear of every byte the kernels from there to this one use, and of the prefetched buffers
                    # alive meanwhile (those of the kernels after j: theirs end with them).
                    base = -(-max([mine] + [k.rest for k in seen[j:]]) // align) * align
                    for lo, hi in sorted(k.hoisted for k in seen[j:] if k.hoisted):
                        if base < hi and base + sum(padded.values()) > lo:
                            base = -(-hi // align) * align
                    if base + sum(padded.values()) > usable:
                        break
                    new, at = dict(offsets), base
                    for n in names:
                        new[n], at = at, at + padded[n]
                    op.attributes[SCRATCHPAD] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in new.items()})
                    op.attributes[SCRATCHPAD_BYTES] = ir.IntegerAttr.get(i64, max(mine, at))
                    op.attributes[PREFETCH] = ir.ArrayAttr.get([ir.StringAttr.get(n) for n in names])
                    op.attributes[PREFETCH_DISTANCE] = ir.IntegerAttr.get(i64, len(seen) - j)
                    peak = max(peak, mine, at)
                    host.idle, host.hosts = host.idle - need, True
                    me.rest, me.hoisted = mine, (base, at)
                    break
                seen.append(me)

        for region in module.regions:
            for b in region.blocks:
                walk(b)
        module.attributes[SCRATCHPAD_PEAK] = ir.IntegerAttr.get(i64, peak)
