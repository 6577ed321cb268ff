"""spyre-fuse-maps: merge chains of elementwise maps into one map, so their intermediates stay in the SFU.

torch-mlir emits one `linalg.generic` per PyTorch elementwise op, so `F.silu(g) * u` arrives as three maps
(sigmoid, times g, times u). Run as three row kernels each intermediate makes a round trip through device
memory (store, load again) and is rounded to its storage format in between. Merged, the one map loads g and u,
computes in fp32 and rounds once: less traffic, fewer kernels, and closer to PyTorch's fp32 answer.

A device `spyre.map` (the producer) is inlined into the device `spyre.map` that reads it (the consumer) when
* the producer's result has that one use (a value other ops also read is not recomputed);
* it has the consumer's result shape, or the consumer broadcasts it and its body is at most
  `_MAX_RECOMPUTED` simple SFU ops (a mask's compare; no exp, no division): merged, it runs once per element of the consumer's larger
  result, cheaper than a kernel of its own. Broadcasting composes, so its inputs broadcast to the merged map's
  shape;
* it is not known at compile time (spyre-fold-constants computes those; merged, they would run on every call);
* the merged map has at most `MAP_MAX_INPUTS` inputs (one read of an input both maps read) and the SFU
  computes its body (`codegen.sfu.translate`).

The merged map takes the consumer's place and a fused location of both. The consumer's inputs come first in
their order, the producer's inputs replacing the one it fed:

    %s = "spyre.map"(%g) ({ ... sigmoid ... })      %r = "spyre.map"(%g, %u) ({
    %m = "spyre.map"(%g, %s) ({ mulf })       ->     ^bb0(%a: f32, %b: f32):
    %r = "spyre.map"(%m, %u) ({ mulf })               ... sigmoid(%a) * %a * %b ... })
"""

import dataclasses

from torch_mlir import ir

from spyre_mlir.codegen.sfu import NotOnSfu, translate
from spyre_mlir.dialects import spyre
from spyre_mlir.passes.analysis import clone_mapped, compile_time, function_ops, is_device_op, producer
from spyre_mlir.passes.base import SpyrePass
from spyre_mlir.passes.op_model import sfu_counts

_MAX_RECOMPUTED = 2


def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _clone_body(block: ir.Block, mapping: dict) -> ir.Value:
    """Clone ``block``'s ops at the insertion point with its arguments (and values) replaced by ``mapping``;
    the value it yields, in the clone."""
    for inner in block.operations:
        if inner.name == "spyre.yield":
            return mapping[inner.operands[0]]
        clone_mapped(inner, mapping)
    raise AssertionError("spyre.map body without spyre.yield")


def _merge(producer_op: ir.Operation, consumer: ir.Operation, slot: int) -> ir.Operation | None:
    """The map computing ``consumer`` with ``producer_op`` (its input ``slot``) inlined, in consumer's place;
    None (and the IR unchanged) when the merged map breaks a rule of the module docstring."""
    pblock, cblock = producer_op.regions[0].blocks[0], consumer.regions[0].blocks[0]
    sources = ([(v, a) for v, a in zip(consumer.operands[:slot], list(cblock.arguments)[:slot])]
               + list(zip(producer_op.operands, pblock.arguments))
               + [(v, a) for v, a in zip(consumer.operands[slot + 1:], list(cblock.arguments)[slot + 1:])])
    inputs, types = [], []
    for v, a in sources:
        if v in inputs:
            if types[inputs.index(v)] != a.type:
                return None            # one value read at two scalar types: keep both maps
            continue
        inputs.append(v)
        types.append(a.type)
    if len(inputs) > spyre.MAP_MAX_INPUTS:
        return None
    loc = ir.Location.fused([producer_op.location, consumer.location])
    with ir.InsertionPoint(consumer), loc:
        merged = spyre.MapOp(consumer.results[0].type, **{f"in{i}": v for i, v in enumerate(inputs)})
        block = merged.body.blocks.append(*types)
    arg = {v: block.arguments[i] for i, v in enumerate(inputs)}
    with ir.InsertionPoint(block):
        value = _clone_body(pblock, {a: arg[v] for v, a in zip(producer_op.operands, pblock.arguments)})
        cmap = {a: arg[v] for i, (v, a) in enumerate(zip(consumer.operands, cblock.arguments)) if i != slot}
        cmap[list(cblock.arguments)[slot]] = value
        spyre.YieldOp(_clone_body(cblock, cmap), loc=loc)
    try:
        translate(block, ["full"] * len(inputs))
    except NotOnSfu:
        merged.operation.erase()
        return None
    consumer.results[0].replace_all_uses_with(merged.result)
    consumer.erase()
    producer_op.erase()
    return merged.operation


def _cheap(op: ir.Operation) -> bool:
    """The map's body is at most ``_MAX_RECOMPUTED`` simple SFU ops (no reciprocal, no transcendental)."""
    counts = sfu_counts(op.regions[0].blocks[0])
    return counts["simple"] <= _MAX_RECOMPUTED and not counts["reciprocal"] and not counts["transcendental"]


@dataclasses.dataclass
class FuseMapsPass(SpyrePass):
    NAME = "spyre-fuse-maps"
    SUMMARY = "Merge chains of device elementwise maps into one map (one load, fp32 throughout, one rounding)"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            _, known = compile_time(module)
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    # Program order: a consumer's producers have already absorbed their own producers.
                    for op in list(block.operations):
                        op = op.operation
                        while op is not None and op.name == "spyre.map" and is_device_op(op):
                            op = self._fuse_one(op, known)

    @staticmethod
    def _fuse_one(consumer: ir.Operation, known: set) -> ir.Operation | None:
        """Merge the first producer map of ``consumer`` that may be merged; the merged map, or None."""
        for slot, v in enumerate(consumer.operands):
            p = producer(v)
            if (p is None or p.name != "spyre.map" or not is_device_op(p) or v in known
                    or len(list(v.uses)) != 1):
                continue
            if _shape(v) != _shape(consumer.results[0]) and not _cheap(p):
                continue
            merged = _merge(p, consumer, slot)
            if merged is not None:
                return merged
        return None
