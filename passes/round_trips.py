"""spyre-round-trips: host regions that can run at the same point share one call to the host.

Each `spyre.host` region is one round trip to the host when the program runs (a HOST instruction: the host link's
latency, about as long as a small kernel, plus its bytes). A decode step's index math - the cache position
reshaped, the causal mask's compares against it, the padding mask, the positions converted - is six regions read by
device ops all over the program, yet each reads only the function's arguments and the others. Here, in program
order, a region of upstream ops (`analysis.upstream_host`) joins the earliest group whose first region everything
it reads is defined before: an argument, a value defined earlier, a result of the group, or a literal (an op
without operands, which moves up with it). It moves to the end of that group, and each region of a group of two
or more gets the group's `round_trip` number; spyre-emit runs a group as one host call at its first region.
Moving a region up never moves it past a value it reads, and its results are ready sooner than before.

Runs on the kernel-level graph, after the passes that add ops a host region may read (the casts of
spyre-reduce-precision, the links of spyre-partition-cards), so the groups see the program's final data flow, and
before anything is planned.

```mlir
%a = "spyre.host"() ({ ... %arg0 ... }) {reason = "int64 index math"}
%d = spyre.matmul ...
%b = "spyre.host"() ({ ... %arg1 ... %a ... }) {reason = "int64 index math"}
// ->
%a = "spyre.host"() ({ ... }) {reason = "int64 index math", round_trip = 0 : i64}
%b = "spyre.host"() ({ ... }) {reason = "int64 index math", round_trip = 0 : i64}
%d = spyre.matmul ...
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import function_ops, reads, upstream_host
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class RoundTripsPass(SpyrePass):
    NAME = "spyre-round-trips"
    SUMMARY = "Run host regions that can run at the same point as one call to the host"

    def run(self, module: ir.Operation) -> None:
        for func in function_ops(module):
            block = func.regions[0].blocks[0]
            groups: list[list[ir.Operation]] = []
            for o in list(block.operations):
                host = o.operation
                if host.name != "spyre.host" or not upstream_host(host):
                    continue
                pos = {x.operation: i for i, x in enumerate(block.operations)}
                for group in groups:
                    literals = _joins(host, group, pos)
                    if literals is not None:
                        for lit in literals:
                            lit.move_before(group[0])
                        host.move_after(group[-1])
                        group.append(host)
                        break
                else:
                    groups.append([host])
            number = 0
            for group in groups:
                if len(group) > 1:
                    for host in group:
                        host.attributes["round_trip"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), number)
                    number += 1


def _joins(host: ir.Operation, group: list[ir.Operation], pos: dict) -> list[ir.Operation] | None:
    """When ``host`` can join ``group`` (everything it reads is an argument, defined before the group's first
    region, or the group's), the literals it reads that are defined after that region (to move up with it); else
    None."""
    first, literals = pos[group[0]], []
    for v in reads(host):
        if isinstance(v.owner, ir.Block):
            continue
        op = v.owner.operation
        if op in group or pos.get(op, len(pos)) < first:
            continue
        if op in pos and not list(op.operands) and not list(op.regions):
            literals.append(op)          # arith.constant, tensor.empty
            continue
        return None
    return literals
