"""spyre-merge-host: one host region for a chain of host work, so the device waits for the host once.

spyre-place-host wraps each op the device cannot run in its own `spyre.host` region, and each region is one
round trip to the host when the program runs (a HOST instruction: the host link's latency plus its bytes). An
attention mask built from the model's int64 inputs is such a chain: `mask != 0` in one region, its broadcast to
[B, 1, 1, S] by a data-dependent `tensor.extract` in the next. Here a host region whose result only a later host
region reads (every use inside that region) moves into it: its ops go first in the reader's body and the reader
uses the value they yield, so the chain is one region, one result, one round trip. Repeated until no region has
such a reader. The merged region's `reason` lists the reasons of both, the reader's first. Only regions of
upstream ops merge: one holding a spyre op (an f64 map the device cannot run) is host code the emitter runs by
another path, and stays as it is.

Two kinds of upstream op outside any region would keep a chain apart, and move in first. A `tensor.empty` of
dynamic size (the buffer of a data-dependent result, sized by a host region's `index`) moves into the one host
region that reads it; one nothing reads is erased. A `cf.assert` on a value a host region computes moves to the
front of the next host region: it still runs before anything that follows it reads a result. Without them a region
would yield a scalar (an `index`, an `i1`) to ops outside, and a scalar has no home between host calls.

```mlir
%m = "spyre.host"() ({ ... "spyre.yield"(%ne) }) {reason = "int64 index math"}
%b = "spyre.host"() ({ ... tensor.extract %m[...] ... "spyre.yield"(%g) }) {reason = "data-dependent ..."}
// ->
%b = "spyre.host"() ({ ... %ne = ...; ... tensor.extract %ne[...] ... "spyre.yield"(%g) })
         {reason = "data-dependent ...; int64 index math"}
```
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.passes.analysis import function_ops, host_region_of, upstream_host, user
from spyre_mlir.passes.base import SpyrePass


@dataclasses.dataclass
class MergeHostPass(SpyrePass):
    NAME = "spyre-merge-host"
    SUMMARY = "Move a host region whose result only a later host region reads into that region"

    def run(self, module: ir.Operation) -> None:
        for func in function_ops(module):
            block = func.regions[0].blocks[0]
            merged = True
            while merged:
                merged = _sink_into_host(block)
                for o in list(block.operations):
                    reader = _only_host_reader(o.operation)
                    if reader is not None:
                        _merge(o.operation, reader)
                        merged = True
                        break


def _sink_into_host(block: ir.Block) -> bool:
    """Move dynamic `tensor.empty` ops and `cf.assert`s on host values into the host regions after them (module
    docstring); erase unread dynamic `tensor.empty`s. True when anything moved."""
    moved = False
    ops = [o.operation for o in block.operations]
    for i, o in enumerate(ops):
        if o.name == "tensor.empty" and len(o.operands):
            readers = {host_region_of(user(u)) for u in o.results[0].uses}
            if not readers:
                o.erase()
                moved = True
            elif len(readers) == 1 and None not in readers and upstream_host(reader := readers.pop()):
                o.move_before(reader.regions[0].blocks[0].operations[0])
                moved = True
        elif o.name == "cf.assert" and _from_host(o.operands[0]):
            later = next((h for h in ops[i + 1:] if h.name == "spyre.host" and upstream_host(h)), None)
            if later is not None:
                o.move_before(later.regions[0].blocks[0].operations[0])
                moved = True
    return moved


def _from_host(v: ir.Value) -> bool:
    owner = v.owner
    return not isinstance(owner, ir.Block) and owner.operation.name == "spyre.host"


def _only_host_reader(op: ir.Operation) -> ir.Operation | None:
    """For a `spyre.host` op of upstream ops, the other such host op every use of its result is inside, else
    None."""
    if op.name != "spyre.host" or not list(op.results[0].uses) or not upstream_host(op):
        return None
    readers = {host_region_of(user(u)) for u in op.results[0].uses}
    if len(readers) != 1:
        return None
    reader = readers.pop()
    return reader if reader is not None and reader != op and upstream_host(reader) else None


def _merge(src: ir.Operation, dst: ir.Operation) -> None:
    """Move ``src``'s body to the front of ``dst``'s, ``dst`` using what it yielded; erase ``src``."""
    body, first = src.regions[0].blocks[0], dst.regions[0].blocks[0].operations[0]
    ops = list(body.operations)
    value = ops[-1].operation.operands[0]
    for o in ops[:-1]:
        o.operation.move_before(first)
    src.results[0].replace_all_uses_with(value)
    reasons = [ir.StringAttr(x.attributes["reason"]).value for x in (dst, src)]
    dst.attributes["reason"] = ir.StringAttr.get("; ".join(dict.fromkeys(r for rs in reasons
                                                                          for r in rs.split("; "))))
    src.erase()
