"""spyre-round-trips: host work that can run at the same point is one call to the host.

Each `spyre.host` region, and each device op spyre-select-kernels left without a kernel (`spyre.on_host`), is one
round trip to the host when the program runs (a HOST instruction: the host link's latency, about as long as a
small kernel, plus its bytes). A decode step's index math - the cache position reshaped, the causal mask's compares
against it, the padding mask, the positions converted - is six regions read by device ops all over the program,
yet each reads only the function's arguments and the others; RoPE's `cos` and `sin` (no SFU function) are two maps
of one value. Here, in program order, such work joins the earliest group of its kind whose first op everything it
reads is defined before: an argument, a value defined earlier, a result of the group, or a literal (an op without
operands, which moves up with it). It moves to the end of that group, and each op of a group of two or more gets
the group's `spyre.round_trip` number; spyre-emit runs a group as one host function at its first op. Two kinds
never mix, as they run by different paths: host regions of upstream ops (`analysis.upstream_host`, compiled host
code) and maps or reductions without a kernel (interpreted); other host work (a gather, a copy the runtime makes
itself, a region holding a spyre op) keeps its own call. Moving an op up never moves it past a value it reads,
and its results are ready sooner than before.

Runs on the kernel-level graph, after the passes that add ops host work may read (the casts of
spyre-reduce-precision, the links of spyre-partition-cards), so the groups see the program's final data flow, and
before anything is planned.

```mlir
%a = "spyre.host"() ({ ... %arg0 ... }) {reason = "int64 index math"}
%d = spyre.matmul ...
%b = "spyre.host"() ({ ... %arg1 ... %a ... }) {reason = "int64 index math"}
// ->
%a = "spyre.host"() ({ ... }) {reason = "int64 index math", spyre.round_trip = 0 : i64}
%b = "spyre.host"() ({ ... }) {reason = "int64 index math", spyre.round_trip = 0 : i64}
%d = spyre.matmul ...
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import ON_HOST, ROUND_TRIP, function_ops, producer, reads, upstream_host
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class RoundTripsPass(SpyrePass):
    NAME = "spyre-round-trips"
    SUMMARY = "Run host work that can run at the same point as one call to the host"

    def run(self, module: ir.Operation) -> None:
        for func in function_ops(module):
            block = func.regions[0].blocks[0]
            groups: list[tuple[str, list[ir.Operation]]] = []
            for o in list(block.operations):
                op, kind = o.operation, _kind(o.operation)
                if kind is None:
                    continue
                pos = {x.operation: i for i, x in enumerate(block.operations)}
                for k, group in groups:
                    literals = _joins(op, group, pos) if k == kind else None
                    if literals is not None:
                        for lit in literals:
                            lit.move_before(group[0])
                        op.move_after(group[-1])
                        group.append(op)
                        break
                else:
                    groups.append((kind, [op]))
            number = 0
            for _, group in groups:
                if len(group) > 1:
                    for op in group:
                        op.attributes[ROUND_TRIP] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), number)
                    number += 1


def _kind(op: ir.Operation) -> str | None:
    """Which host path runs ``op``: "code" (a host region of upstream ops), "eval" (a map or reduction without a
    kernel), or None (it keeps a call of its own, or is device work)."""
    if op.name == "spyre.host":
        return "code" if upstream_host(op) else None
    if op.name in ("spyre.map", "spyre.reduce") and ON_HOST in op.attributes:
        return "eval"
    return None


def _joins(op: ir.Operation, group: list[ir.Operation], pos: dict) -> list[ir.Operation] | None:
    """When ``op`` can join ``group`` (everything it reads is an argument, defined before the group's first op, or
    the group's), the literals it reads that are defined after that op (to move up with it); else None."""
    first, literals = pos[group[0]], []
    for v in reads(op):
        src = producer(v)
        if src is None:                   # an argument
            continue
        if src in group or pos.get(src, len(pos)) < first:
            continue
        if src in pos and not list(src.operands) and not list(src.regions):
            literals.append(src)          # arith.constant, tensor.empty
            continue
        return None
    return literals
