"""spyre-place-host: put every op the device cannot run into a `spyre.host` region, and say why.

After `spyre-convert-linalg`, a function body holds spyre ops (device work) and whatever had no spyre form:
int64 index math (positions, masks), embedding-style `tensor.extract`, runtime assertions, reductions with
combiners the device lacks (`andi`), control flow. This pass makes that split explicit: each such op moves
into a `spyre.host` op whose `reason` attribute says why it stayed on the CPU, so later stages partition the
function at host boundaries and the placement report can explain every op. Nothing is dropped.

Rules, for the ops directly in a function body:

* spyre ops stay (device), unless they hold an element type the device cannot (an f64 map no fusion absorbed):
  those are wrapped like any other op. So do `func.return`, `arith.constant` and `tensor.empty`: they are free (a
  literal or a shape), a host region reads them from above like any other value.
* every other op is wrapped, one `spyre.host` per result, because a host op has exactly one result (IRDL cannot
  type a variadic group of different tensors). A multi-result op whose results are used is cloned into one host
  op per used result (the host recomputes it; keeping it whole is impossible with one result per host op).
  An op whose results are all unused is wrapped by its first result (the wrapper is dead and canonicalize
  removes it, as it would have removed the op). An op with no results (a top-level `cf.assert`) cannot be
  wrapped: it stays in place and the report lists it as host work "not wrapped".
* the reason is the one `spyre-convert-linalg` recorded on the op (`spyre.unconverted`) when it declined it, or
  else one derived from the op: control flow, scalar element access, int64 index math, or "no spyre form".

`placement_report(module)` lists every op with its placement; the pass option `report=true` prints it to
stderr as a table.
"""

import collections
import dataclasses
import re
import sys

from torch_mlir import ir

from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import (NOT_DEVICE, ON_HOST, UNCONVERTED_ATTR, function_ops, is_const_fold,
                                        is_device_op, non_device_type)
from spyre_mlir.passes.base import SpyrePass

FREE_OPS = ("func.return", "arith.constant", "tensor.empty")


@dataclasses.dataclass
class PlaceHostPass(SpyrePass):
    NAME = "spyre-place-host"
    SUMMARY = "Wrap ops without a spyre form into spyre.host regions with the reason; report=true prints a table"

    report: bool = False

    def run(self, module: ir.Operation) -> None:
        for block in _function_blocks(module):
            for op in list(block.operations):
                name = op.operation.name
                if name in NOT_DEVICE or name in FREE_OPS or not list(op.operation.results):
                    continue
                if is_device_op(op):
                    bad = non_device_type(op.operation)
                    if bad:    # e.g. an f64 map no fusion absorbed: the device cannot hold its data
                        _wrap(op.operation, f"{bad} has no device format")
                    continue
                _wrap(op.operation, host_reason(op.operation))
        if self.report:
            print_report(placement_report(module), sys.stderr)


def _function_blocks(module: ir.Operation) -> list[ir.Block]:
    """The bodies of the module's functions, but a multi-card system's schedule (calls of the card steps)."""
    return [block for func in function_ops(module) if "spyre.system" not in func.attributes
            for block in func.regions[0].blocks]


def _wrap(op: ir.Operation, reason: str) -> None:
    if UNCONVERTED_ATTR in op.attributes:
        del op.attributes[UNCONVERTED_ATTR]
    results = list(op.results)
    used = [i for i, r in enumerate(results) if list(r.uses)] or [0]
    if len(results) == 1:
        host, y = _host(op, results[0], reason)
        op.move_before(y)
        results[0].replace_all_uses_except(host.result, y.operation)
        return
    for i in used:
        host, y = _host(op, results[i], reason)
        clone = op.clone(ir.InsertionPoint(y))
        y.operation.operands[0] = clone.results[i]
        results[i].replace_all_uses_with(host.result)
    op.erase()


def _host(op: ir.Operation, result: ir.Value, reason: str):
    """A spyre.host before `op` yielding `result` (patched by the caller), with its block and yield."""
    with ir.InsertionPoint(op), op.location:
        host = spyre.HostOp(result.type)
        host.operation.attributes["reason"] = ir.StringAttr.get(reason)
        block = host.body.blocks.append()
        with ir.InsertionPoint(block):
            y = spyre.YieldOp(result)
    return host, y


def _is_int64(t: ir.Type) -> bool:
    if isinstance(t, ir.ShapedType):
        t = ir.ShapedType(t).element_type
    return isinstance(t, ir.IndexType) or (isinstance(t, ir.IntegerType) and ir.IntegerType(t).width == 64)


def host_reason(op: ir.Operation) -> str:
    """Why `op` has no place on the device: the converter's own reason, or one read off the op."""
    if UNCONVERTED_ATTR in op.attributes:
        return ir.StringAttr(op.attributes[UNCONVERTED_ATTR]).value
    name = op.name
    if name.startswith(("scf.", "cf.")):
        return "data-dependent control flow"
    if name in ("tensor.extract", "tensor.insert"):
        return "scalar tensor element access"
    types = [v.type for v in op.operands] + [r.type for r in op.results]
    if any(_is_int64(t) for t in types):
        return "int64 index math"
    if name.startswith(("arith.", "math.")) and not any(isinstance(t, ir.ShapedType) for t in types):
        return "scalar arithmetic outside a tensor op"
    return f"no spyre form for {name}"


_NAME_LOC = re.compile(r'^loc\("([^"]+)"')


def placement_report(module: ir.Module | ir.Operation) -> list[dict]:
    """One row per op in the function bodies: {op, placement, reason, location, source}.

    `placement` is "device" for spyre ops, "host" for spyre.host regions (`op` names the ops inside), for
    non-spyre ops not (yet) wrapped and for spyre ops spyre-select-kernels found no kernel for (`spyre.on_host`),
    and "compile time" for what it marked `spyre.const_fold`. `source` is the linalg op a spyre op was converted
    from, when its location says so. Free ops (constants, tensor.empty, func.return) are not listed.
    """
    top = module.operation if isinstance(module, ir.Module) else module
    rows = []
    for block in _function_blocks(top):
        for op in block.operations:
            op = op.operation
            name = op.name
            if name in FREE_OPS:
                continue
            location = str(op.location)
            m = _NAME_LOC.match(location)
            row = {"op": name, "placement": "device", "reason": "", "location": location,
                   "source": m.group(1) if m else ""}
            if is_const_fold(op):
                row.update(placement="compile time", reason="computed from weights and literals while compiling")
            elif ON_HOST in op.attributes:
                row.update(placement="host", reason=ir.StringAttr(op.attributes[ON_HOST]).value)
            elif name == "spyre.host":
                inner = [o.operation.name for o in op.regions[0].blocks[0].operations][:-1]
                row.update(op=" + ".join(inner) or "spyre.host", placement="host",
                           reason=ir.StringAttr(op.attributes["reason"]).value if "reason" in op.attributes else "")
            elif not is_device_op(op):
                why = host_reason(op)
                row.update(placement="host", reason=why + (" (not wrapped)" if list(op.results) else
                                                           " (no result: runs on the host in place)"))
            rows.append(row)
    return rows


def print_report(rows: list[dict], out=sys.stderr, title: str = "spyre-place-host") -> None:
    """Counts per (placement, op, reason), then one line per host op with its location."""
    device = sum(r["placement"] == "device" for r in rows)
    host = sum(r["placement"] == "host" for r in rows)
    folded = f", {len(rows) - device - host} computed while compiling" if len(rows) > device + host else ""
    print(f"{title}: {device} ops on device, {host} on host{folded}", file=out)
    counts = collections.Counter((r["placement"], r["op"], r["reason"]) for r in rows)
    width = max([len(op) for _, op, _ in counts] + [2])
    print(f"  {'placement':9}  {'count':>5}  {'op':{width}}  reason", file=out)
    for (placement, op, reason), n in sorted(counts.items()):
        print(f"  {placement:9}  {n:5}  {op:{width}}  {reason}", file=out)
    for r in rows:
        if r["placement"] == "host":
            print(f"  host: {r['op']} at {r['location']}: {r['reason']}", file=out)
