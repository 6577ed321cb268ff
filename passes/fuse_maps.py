"""spyre-fuse-maps: merge chains of elementwise maps into one map, so their intermediates stay in the SFU.

torch-mlir emits one `linalg.generic` per PyTorch elementwise op, so `F.silu(g) * u` arrives as three maps
(sigmoid, times g, times u). Run as three row kernels each intermediate makes a round trip through device
memory (store, load again) and is rounded to its storage format in between. Merged, the one map loads g and u,
computes in fp32 and rounds once: less traffic, fewer kernels, and closer to PyTorch's fp32 answer.

A device `spyre.map` (the producer) is inlined into the device `spyre.map` that reads it (the consumer) when
* the producer's result has that one use (a value other ops also read is not recomputed);
* it has the consumer's result shape, or the consumer broadcasts it and its body is at most
  `_MAX_RECOMPUTED` simple SFU ops (a mask's compare; no exp, no division): merged, it runs once per element
  of the consumer's larger result, cheaper than a kernel of its own. Broadcasting composes, so its inputs broadcast to the merged map's
  shape;
* it is not known at compile time (spyre-fold-constants computes those; merged, they would run on every call);
* the merged map has at most `MAP_MAX_INPUTS` inputs (one read of an input both maps read) and the SFU
  computes its body (`codegen.sfu.translate`).

A scalar scale of a matmul operand moves to the product first (`(c x) @ y = c (x @ y)`): a one-input map
computing `x * c` whose result (through reshapes) is only a bias-free device matmul's lhs or rhs becomes the
same map on the product (after the reshapes the product goes through), where it merges with the chain reading
it. scaled_dot_product_attention scales q and k by `d ** -0.25` each: two kernels over q and k become two
multiplies inside the mask add's map. Only a scale computed in f32 moves: one in f16 rounds to f16 before the
product, which on the f32 product it would not.

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
from spyre_mlir.passes.analysis import (MATMULS, clone_mapped, compile_time, function_ops, is_device_op, producer,
                                        single_use)
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
    reads = list(zip(consumer.operands, cblock.arguments))
    sources = reads[:slot] + list(zip(producer_op.operands, pblock.arguments)) + reads[slot + 1:]
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


def _scale(op: ir.Operation) -> bool:
    """The map multiplies its one input by a scalar constant (one SFU multiply by an immediate)."""
    if len(op.operands) != 1:
        return False
    try:
        ops, result, _ = translate(op.regions[0].blocks[0], ["full"])
    except NotOnSfu:
        return False
    return (len(ops) == 1 and ops[0][0].name == "MUL" and ops[0][1] == result
            and ("in", 0) in ops[0][2:4] and any(isinstance(x, float) for x in ops[0][2:4]))


def _hoist_scale(op: ir.Operation, block: ir.Block) -> None:
    """Move a scalar scale of a matmul operand to the product (module docstring)."""
    if not _scale(op):
        return
    use = single_use(op.results[0])
    while use is not None and use.owner.name == "spyre.reshape" and is_device_op(use.owner):
        use = single_use(use.owner.results[0])
    mm = use.owner if use is not None else None
    if mm is None or mm.name not in MATMULS or not is_device_op(mm) or len(mm.operands) != 2 \
            or not isinstance(ir.RankedTensorType(mm.results[0].type).element_type, ir.F32Type):
        return                          # a bias does not commute with the scale
    if any(not isinstance(ir.RankedTensorType(v.type).element_type, ir.F32Type)
           for v in (op.operands[0], op.results[0])):
        return                          # a scale in f16 (bf16...) rounds there: on the f32 product it would not
    r = mm.results[0]
    while (u := single_use(r)) is not None and u.owner.name == "spyre.reshape" and is_device_op(u.owner):
        r = u.owner.results[0]
    users = [u.owner.operation for u in r.uses]
    if not users or any(u.block != block for u in users):
        return                          # read inside a region too (or not at all): leave it
    at = next(o for o in block.operations if o.operation in users)
    with ir.InsertionPoint(at), op.location:
        moved = spyre.MapOp(r.type, in0=r)
        body = moved.body.blocks.append(*[a.type for a in op.regions[0].blocks[0].arguments])
    old = op.regions[0].blocks[0]
    with ir.InsertionPoint(body):
        spyre.YieldOp(_clone_body(old, {old.arguments[0]: body.arguments[0]}), loc=op.location)
    r.replace_all_uses_with(moved.result)
    moved.operation.operands[0] = r
    op.results[0].replace_all_uses_with(op.operands[0])
    op.erase()


@dataclasses.dataclass
class FuseMapsPass(SpyrePass):
    NAME = "spyre-fuse-maps"
    SUMMARY = "Merge chains of device elementwise maps into one map (one load, fp32 throughout, one rounding)"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            _, known = compile_time(module)
            for func in function_ops(module):
                for block in func.regions[0].blocks:
                    for op in list(block.operations):
                        if op.operation.name == "spyre.map" and is_device_op(op) and op.results[0] not in known:
                            _hoist_scale(op.operation, block)
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
            if p is None or p.name != "spyre.map" or not is_device_op(p) or v in known or single_use(v) is None:
                continue
            if _shape(v) != _shape(consumer.results[0]) and not _cheap(p):
                continue
            merged = _merge(p, consumer, slot)
            if merged is not None:
                return merged
        return None
