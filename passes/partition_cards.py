"""spyre-partition-cards: one function per card and step, and `@main` the system's schedule of calls to them.

Runs right after spyre-place-cards and follows its plan (`spyre.cards`, `spyre.card_split` on every device op);
every later pass then sees ordinary single-card functions, which spyre-emit turns into one program per card.

```mlir
func.func @main(%x: tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> attributes {spyre.system} {
  %0 = call @card0_step0(%x) : (tensor<8x64x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
  %1 = call @card1_step0(%x) : (tensor<8x64x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
  %2 = "spyre.all_gather"(%0, %1) {dim = 1 : i64} : (tensor<8x32x!spyre.dlf16>, tensor<8x32x!spyre.dlf16>)
      -> tensor<8x64x!spyre.dlf16>
  %3 = call @card0_step1(%2) : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %3 : tensor<8x64x!spyre.dlf16>
}
func.func private @card0_step0(%x: tensor<8x64x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
    attributes {spyre.card = 0 : i64, spyre.step = 0 : i64} { ... }
```

**Steps.** An op placed on card c runs in the earliest step of c at which every value it reads is on c: a value
produced on c is there from its producer's step on; one produced only on other cards (a pipeline stage
boundary), and a split op's result (whole only once its pieces are gathered), arrive one step after the last
step that produces them. The calls in `@main` are in step order, then card order, and each reads only results
of earlier calls, so the system cannot deadlock. A call's argument that comes from another card is a transfer
over the link (spyre-emit writes them into the binary); one from the same card stays in that card's memory.

**Splits** (the op's `spyre.card_split`, over its `spyre.cards` c_0..c_{n-1}):

* `none`: the op is copied into the step of every card listed (one card: a pipeline stage; several: replicated).
* `cols`: card i computes the matmul's columns [i N/n, (i+1) N/n) with its slice of the weight and bias
  (constants, sliced here bit for bit: quantized codes with their scales), and `spyre.all_gather` along the last
  dim makes the result whole. Every output element's accumulation is the one-card one.
* `heads`: card i computes its share of the batch_matmul's first batch dim that divides by n; both operands are
  sliced on the card (`spyre.slice`, a device kernel), the result gathered along that dim.
* `rows`: card i computes a partial product over its K range in f32 (the activation sliced on the card, the
  weight a constant slice; the bias on the first card only); every reader sums the n partials in card order
  (`spyre.map` adds, rounding once to the result type). The sum's order differs from one card's.

Host work (a `spyre.host` region, an op without a device kernel) runs beside every card that reads its result
(card 0 when only the return does). Values known while compiling (constants and what is computed from them) are
copied into every step that reads them. A state buffer or a parameter without a value is an error: neither can
be split over cards yet.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from torch_mlir import ir
from torch_mlir.dialects import func

from spyre_mlir import params
from spyre_mlir.passes.analysis import (CONVERT_RESULT, KERNEL, SHARE_OF, compile_time, device_ops, get_target,
                                        is_param, reads)
from spyre_mlir.passes.base import PassError, SpyrePass

CARDS = "spyre.cards"
CARD_SPLIT = "spyre.card_split"
NUM_CARDS = "spyre.num_cards"
CARD = "spyre.card"           # a step function: the card that runs it
STEP = "spyre.step"           # a step function: its step
SYSTEM = "spyre.system"       # @main of a partitioned module: the schedule of calls
ALL_GATHER = "spyre.all_gather"


def step_name(card: int, step: int) -> str:
    return f"card{card}_step{step}"


def _i64(v: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), v)


def _tensor(shape, like: ir.Type, elt: ir.Type | None = None) -> ir.RankedTensorType:
    t = ir.RankedTensorType(like)
    return ir.RankedTensorType.get(list(shape), elt or t.element_type, t.encoding)


def _attrs(op: ir.Operation) -> dict:
    return {k: op.attributes[k] for k in op.attributes}


@dataclasses.dataclass
class _Step:
    card: int
    level: int
    ops: list = dataclasses.field(default_factory=list)       # (op, split, share index, share count)
    fn: object = None
    block: object = None
    outputs: list = dataclasses.field(default_factory=list)   # original values (or pieces) it returns
    local: dict = dataclasses.field(default_factory=dict)     # original value or piece key -> value in fn
    arg_of: dict = dataclasses.field(default_factory=dict)    # source key (_Partition.value) -> argument, in order

    @property
    def inputs(self) -> list:
        """The source key of each argument, in argument order."""
        return list(self.arg_of)


class _Partition:
    def __init__(self, module, main, target):
        self.main, self.target = main, target
        self.block = main.regions[0].blocks[0]
        _, self.known = compile_time(module)
        self.device = set(device_ops(module))
        self.cards_of: dict = {}          # op -> (cards, split)
        self.where: dict = {}             # whole value -> {card: level}
        self.pieces: dict = {}            # split op's result -> [(card, level)] in share order
        self.steps: dict = {}             # (card, level) -> _Step

    # ---- placement of every op ---------------------------------------------------------------------------

    def assign(self):
        body = [o.operation for o in self.block.operations]
        for op in body:
            if op in self.device:
                if CARDS not in op.attributes:
                    raise PassError("device op without spyre.cards: run spyre-place-cards first", op.location)
                cards = [int(c) for c in ir.DenseI64ArrayAttr(op.attributes[CARDS])]
                split = ir.StringAttr(op.attributes[CARD_SPLIT]).value if CARD_SPLIT in op.attributes else "none"
                self.cards_of[op] = (cards, split if len(cards) > 1 else "none")
        # Host work runs beside the cards that read it; readers come later, so walk backwards.
        for op in reversed(body):
            if op in self.cards_of or op.name == "func.return" or all(r in self.known for r in op.results):
                continue
            if not op.results:
                raise PassError(f"cannot place {op.name} on a card: it has no result", op.location)
            cards = set()
            for r in op.results:
                for use in r.uses:
                    owner = _top(use.owner)
                    if owner in self.cards_of:
                        cards.update(self.cards_of[owner][0])
            self.cards_of[op] = (sorted(cards) or [0], "none")
        for op in body:
            if op.name == "func.return" or op not in self.cards_of:
                continue
            cards, split = self.cards_of[op]
            levels = [max([self.avail(v, c) for v in reads(op) if v not in self.known], default=0) for c in cards]
            if split == "none":
                for r in op.results:
                    self.where[r] = dict(zip(cards, levels))
            else:
                self.pieces[op.results[0]] = list(zip(cards, levels))
            for i, (c, level) in enumerate(zip(cards, levels)):
                self.steps.setdefault((c, level), _Step(c, level)).ops.append((op, split, i, len(cards)))

    def avail(self, v, card: int) -> int:
        """The first step of `card` at which `v` is there."""
        if isinstance(v.owner, ir.Block):
            if v.owner != self.block:
                raise PassError("a value from an enclosing region cannot cross cards", self.main.location)
            return 0                                   # a model input is sent to every card before step 0
        if v in self.pieces:
            return max(level for _, level in self.pieces[v]) + 1
        have = self.where[v]
        return have[card] if card in have else min(have.values()) + 1

    # ---- the step functions ----------------------------------------------------------------------------

    def build(self):
        order = sorted(self.steps.values(), key=lambda s: (s.level, s.card))
        with ir.InsertionPoint(self.main), self.main.location:
            for s in order:
                s.fn = func.FuncOp(step_name(s.card, s.level), ir.FunctionType.get([], []), visibility="private")
                s.fn.attributes[CARD] = _i64(s.card)
                s.fn.attributes[STEP] = _i64(s.level)
                s.block = s.fn.add_entry_block()
        for s in order:
            for op, split, i, n in s.ops:
                with ir.InsertionPoint(s.block), op.location:
                    if split == "none":
                        self.clone(s, op)
                    else:
                        self.share(s, op, split, i, n)
        return order

    def value(self, s: _Step, v):
        """`v` (an original value) as the step function `s` sees it: computed in it, known (copied in), or an
        argument fed by the schedule."""
        if v in s.local:
            return s.local[v]
        if v in self.known:
            return self.constant(s, v)
        if isinstance(v.owner, ir.Block):
            key = ("input", v.arg_number)
        elif v in self.pieces and self.split_of(v) == "rows":
            return self.summed(s, v)
        elif v in self.pieces:
            key = ("gather", v)
        else:
            have = self.where[v]
            src = s.card if s.card in have else _first_holder(have)
            key = ("value", v, src)
            if src == s.card and have[src] == s.level:
                raise PassError("internal: a value of this step is read before it is computed", s.fn.location)
        return self.argument(s, key, v.type)

    def argument(self, s: _Step, key, type_):
        if key not in s.arg_of:
            s.arg_of[key] = s.block.add_argument(type_, ir.Location.unknown())
        return s.arg_of[key]

    def split_of(self, v) -> str:
        return self.cards_of[_top(v.owner)][1]

    def summed(self, s: _Step, v):
        """A `rows` split's result on a reader: the partials summed in card order (at most four inputs a map),
        rounded once to the result type."""
        from torch_mlir.dialects import arith

        op = _top(v.owner)
        f32 = ir.F32Type.get()
        parts = [self.argument(s, ("part", v, k), _tensor(ir.RankedTensorType(v.type).shape, v.type, f32))
                 for k in range(len(self.pieces[v]))]
        with op.location:
            while parts:
                group, parts = parts[:4], parts[4:]
                last = not parts
                rtype = v.type if last else group[0].type
                new = ir.Operation.create("spyre.map", results=[rtype], operands=group, regions=1, attributes={
                    "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1] * len(group) + [0] * (4 - len(group))),
                    CARDS: ir.DenseI64ArrayAttr.get([s.card]), CARD_SPLIT: ir.StringAttr.get("none")})
                body = new.regions[0].blocks.append(*[f32] * len(group))
                with ir.InsertionPoint(body):
                    acc = body.arguments[0]
                    for x in list(body.arguments)[1:]:
                        acc = arith.AddFOp(acc, x).result
                    ir.Operation.create("spyre.yield", operands=[acc])
                self.select(new)
                if not last:
                    parts.insert(0, new.results[0])
        s.local[v] = new.results[0]
        return s.local[v]

    def constant(self, s: _Step, v):
        """Copy the compile-time chain behind `v` into the step (once per step)."""
        if v in s.local:
            return s.local[v]
        op = v.owner
        op = op.operation if isinstance(op, ir.OpView) else op
        if isinstance(op, ir.Block):
            d = params.arg_dicts(self.main)[v.arg_number]
            if params.VALUE_ATTR not in d:      # a parameter without a value: an input of the binary
                return self.argument(s, ("input", v.arg_number), v.type)
            # One with a value that a kernel reads as it is (a conv's fp32 bias): a constant of the step.
            from torch_mlir.dialects import arith

            s.local[v] = arith.ConstantOp(v.type, d[params.VALUE_ATTR]).result
            return s.local[v]
        with op.location:
            operands = [self.constant(s, x) for x in op.operands]
            new = op.clone()
            for k, x in enumerate(operands):
                new.operands[k] = x
        for r, nr in zip(op.results, new.results):
            s.local[r] = nr
        return s.local[v]

    def clone(self, s: _Step, op):
        mapping = {v: self.value(s, v) for v in reads(op)}
        new = op.clone()
        _remap(new, mapping)
        for r, nr in zip(op.results, new.results):
            s.local[r] = nr

    # ---- a share of a split op -------------------------------------------------------------------------

    def share(self, s: _Step, op, split: str, i: int, n: int):
        name = op.name
        lhs, rhs = op.operands[0], op.operands[1]
        rt = ir.RankedTensorType(op.results[0].type)
        attrs = _attrs(op)
        if split == "cols":
            N = rt.shape[-1]
            lo, hi = i * N // n, (i + 1) * N // n
            ops = [self.value(s, lhs), self.sliced(s, op, rhs, 1, lo, hi)]
            if len(op.operands) > 2:
                ops.append(self.sliced(s, op, op.operands[2], 0, lo, hi))
            rtype = _tensor(list(rt.shape[:-1]) + [hi - lo], rt)
        elif split == "heads":
            d = next((k for k in range(rt.rank - 2) if rt.shape[k] % n == 0 and rt.shape[k] >= n), None)
            if d is None:
                raise PassError(f"no batch dim of {rt} divides into {n} cards", op.location)
            B = rt.shape[d]
            lo, hi = i * B // n, (i + 1) * B // n
            ops = [self.slice_on_card(s, op, self.value(s, x), d, lo, hi) for x in (lhs, rhs)]
            rtype = _tensor([hi - lo if k == d else x for k, x in enumerate(rt.shape)], rt)
        elif split == "rows":
            if CONVERT_RESULT in attrs:
                raise PassError("a 'rows' split of a matmul whose result is rounded on the scratchpad "
                                "(spyre.convert_result) is not supported", op.location)
            K = ir.RankedTensorType(lhs.type).shape[-1]
            lo, hi = i * K // n, (i + 1) * K // n
            ops = [self.slice_on_card(s, op, self.value(s, lhs), 1, lo, hi), self.sliced(s, op, rhs, 0, lo, hi)]
            if len(op.operands) > 2 and i == 0:
                ops.append(self.value(s, op.operands[2]))
            attrs["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get([1, 1, len(ops) - 2])
            rtype = _tensor(rt.shape, rt, ir.F32Type.get())
        else:
            raise PassError(f"unknown split '{split}'", op.location)
        if split != "rows":
            # spyre-divide-work and spyre-tile keep the whole op's K split and K tile for the share: the same
            # accumulation order, so the gathered result is the one-card result bit for bit.
            whole = [math.prod(rt.shape[:-2]) if name == "spyre.batch_matmul" else 1, rt.shape[-1]]
            attrs[SHARE_OF] = ir.DenseI64ArrayAttr.get(whole)
        new = ir.Operation.create(name, results=[rtype], operands=ops, attributes=attrs)
        self.select(new)
        s.local[("piece", op.results[0])] = new.results[0]

    def sliced(self, s: _Step, op, v, dim: int, lo: int, hi: int):
        """A compile-time value's slice along `dim`, as a new constant (bits unchanged)."""
        if v not in self.known:
            raise PassError(f"operand #{list(op.operands).index(v)} must be known while compiling to be split "
                            f"over cards", op.location)
        src = v.owner.operation if isinstance(v.owner, ir.OpView) else v.owner
        t = ir.RankedTensorType(v.type)
        shape = [hi - lo if k == dim else x for k, x in enumerate(t.shape)]
        if isinstance(src, ir.Block):           # a weight given as an input: the schedule sends each card its slice
            return self.argument(s, ("input", v.arg_number, dim, lo, hi), _tensor(shape, t))
        with op.location:
            if src.name == "arith.constant" and params.is_resource(src.attributes["value"]):
                arr = params.constant_storage(src.attributes["value"], src.context)
                name = ir.StringAttr(src.attributes["spyre.name"]).value if "spyre.name" in src.attributes \
                    else "const"
                part = np.take(arr, np.arange(lo, hi), axis=dim)
                attr = params.storage_attr(part, _tensor(shape, t), f"{name}.card{s.card}")
                new = ir.Operation.create("arith.constant", results=[_tensor(shape, t)],
                                          attributes={**_attrs(src), "value": attr})
                return new.results[0]
            if src.name == "spyre.cast" and len(src.operands) == 2:        # codes and their scales
                axis = ir.IntegerAttr(src.attributes["axis"]).value if "axis" in src.attributes else None
                codes = self.sliced(s, op, src.operands[0], dim, lo, hi)
                scale = src.operands[1]
                scale = self.sliced(s, op, scale, 0, lo, hi) if axis is not None and axis % t.rank == dim \
                    else self.constant(s, scale)
                new = ir.Operation.create("spyre.cast", results=[_tensor(shape, t)], operands=[codes, scale],
                                          attributes=_attrs(src))
                return new.results[0]
        raise PassError(f"cannot slice {src.name} (an operand of a split op) while compiling", op.location)

    def slice_on_card(self, s: _Step, op, v, dim: int, lo: int, hi: int):
        t = ir.RankedTensorType(v.type)
        shape = [hi - lo if k == dim else x for k, x in enumerate(t.shape)]
        offsets = [lo if k == dim else 0 for k in range(t.rank)]
        new = ir.Operation.create("spyre.slice", results=[_tensor(shape, t)], operands=[v], attributes={
            "offsets": ir.DenseI64ArrayAttr.get(offsets), "sizes": ir.DenseI64ArrayAttr.get(shape),
            "strides": ir.DenseI64ArrayAttr.get([1] * t.rank),
            CARDS: ir.DenseI64ArrayAttr.get([s.card]), CARD_SPLIT: ir.StringAttr.get("none")})
        self.select(new)
        return new.results[0]

    def select(self, op):
        from spyre_mlir.codegen.kernels import select, why_not

        kernel = select(op, self.target, set())
        if kernel is None:
            raise PassError(f"no device kernel runs the share of a split op ({op.name}): "
                            f"{why_not(op, self.target, set()) or 'unsupported shape'}", op.location)
        op.attributes[KERNEL] = ir.StringAttr.get(kernel)

    # ---- the schedule ----------------------------------------------------------------------------------

    def finish(self, order):
        from spyre_mlir.codegen.kernels import applied_by

        # What each step returns: what another step (or the return) reads from it.
        wanted: dict = {}
        for s in order:
            for key in s.inputs:
                if key[0] == "value":
                    wanted.setdefault((key[2], self.where[key[1]][key[2]]), []).append(key[1])
                elif key[0] == "gather":
                    for c, level in self.pieces[key[1]]:
                        wanted.setdefault((c, level), []).append(("piece", key[1]))
                elif key[0] == "part":
                    c, level = self.pieces[key[1]][key[2]]
                    wanted.setdefault((c, level), []).append(("piece", key[1]))
        ret = self.block.operations[len(self.block.operations) - 1].operation
        outs = []
        for v in ret.operands:
            if v in self.known:
                raise PassError("a model output known while compiling cannot be placed over cards", ret.location)
            if isinstance(v.owner, ir.Block):
                outs.append(("input", v.arg_number))
            elif v in self.pieces and self.split_of(v) == "rows":
                raise PassError("a model output made by a 'rows' split (summed by its readers) cannot be placed "
                                "over cards: place its op with split 'cols' or 'none'", _top(v.owner).location)
            elif v in self.pieces:
                outs.append(("gather", v))
                for c, level in self.pieces[v]:
                    wanted.setdefault((c, level), []).append(("piece", v))
            else:
                have = self.where[v]
                src = _first_holder(have)
                outs.append(("value", v, src))
                wanted.setdefault((src, have[src]), []).append(v)
        for s in order:
            seen = []
            for v in wanted.get((s.card, s.level), []):
                if v not in seen:
                    seen.append(v)
            s.outputs = seen
            with ir.InsertionPoint(s.block), ir.Location.unknown():
                func.ReturnOp([s.local[v] for v in s.outputs])
            # A view (an `alias` reshape) the step now returns needs a kernel of its own there, as when a
            # one-card function returns it: choose again now that the return reads it.
            for v in s.outputs:
                op = s.local[v].owner
                if KERNEL in op.attributes and ir.StringAttr(op.attributes[KERNEL]).value == "alias":
                    self.select(op)
            # So does a map, pool or softmax chosen as its producer's epilogue when the split or the step
            # boundary separated them (its producer is now a gather, an argument, or the map is returned).
            for o in s.block.operations:
                op = o.operation
                if KERNEL in op.attributes and ir.StringAttr(op.attributes[KERNEL]).value == "epilogue" \
                        and applied_by(op) is None:
                    self.select(op)
            s.fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
                [a.type for a in s.block.arguments], [s.local[v].type for v in s.outputs]))
        return outs

    def schedule(self, order, outs):
        """Rebuild @main as the calls of the steps, in order, and the all-gathers between them."""
        old = self.main
        # Parameters with values are constants of the steps now; one without that is read is an input of the
        # binary (as in a one-card program).
        ins = [a for a, d in zip(self.block.arguments, params.arg_dicts(old))
               if not is_param(a, old) or (params.VALUE_ATTR not in d and any(True for _ in a.uses))]
        arg_attrs = list(old.attributes["arg_attrs"]) if "arg_attrs" in old.attributes else None
        res_attrs = old.attributes["res_attrs"] if "res_attrs" in old.attributes else None
        ftype = ir.FunctionType(ir.TypeAttr(old.attributes["function_type"]).value)
        with ir.InsertionPoint(old), old.location:
            main = func.FuncOp("main", ir.FunctionType.get([a.type for a in ins], list(ftype.results)))
            if arg_attrs is not None:
                main.attributes["arg_attrs"] = ir.ArrayAttr.get([arg_attrs[a.arg_number] for a in ins])
            if res_attrs is not None:
                main.attributes["res_attrs"] = res_attrs
            main.attributes[SYSTEM] = ir.UnitAttr.get()
            block = main.add_entry_block()
        arg = {a.arg_number: b for a, b in zip(ins, block.arguments)}
        results: dict = {}                 # (card, level, original value or piece key) -> call result
        gathers: dict = {}
        slices: dict = {}

        def source(key):
            if key[0] == "input" and len(key) == 2:
                return arg[key[1]]
            if key[0] == "input":
                return slices.setdefault(key, _slice(block, arg[key[1]], *key[2:]))
            if key[0] == "value":
                v, c = key[1], key[2]
                return results[(c, self.where[v][c], v)]
            if key[0] == "part":
                c, level = self.pieces[key[1]][key[2]]
                return results[(c, level, ("piece", key[1]))]
            v = key[1]
            if v not in gathers:
                parts = [results[(c, level, ("piece", v))] for c, level in self.pieces[v]]
                op = v.owner.operation if isinstance(v.owner, ir.OpView) else v.owner
                split = self.cards_of[op][1]
                with ir.InsertionPoint(block), op.location:
                    gathers[v] = self.collect(op, split, parts)
            return gathers[v]

        for s in order:
            with ir.InsertionPoint(block), s.fn.location:
                operands = [source(k) for k in s.inputs]
                call = func.CallOp([s.local[v].type for v in s.outputs], ir.FlatSymbolRefAttr.get(
                    ir.StringAttr(s.fn.attributes["sym_name"]).value), operands)
            for v, r in zip(s.outputs, call.results):
                results[(s.card, s.level, v)] = r
        with ir.InsertionPoint(block), old.location:
            func.ReturnOp([source(k) for k in outs])
        old.erase()

    def collect(self, op, split: str, parts):
        rt = op.results[0].type
        if split == "rows":
            raise PassError("internal: a 'rows' split is summed by its readers", op.location)
        t = ir.RankedTensorType(rt)
        dim = t.rank - 1 if split == "cols" else next(
            k for k in range(t.rank) if ir.RankedTensorType(parts[0].type).shape[k] != t.shape[k])
        return ir.Operation.create(ALL_GATHER, results=[rt], operands=parts,
                                   attributes={"dim": _i64(dim)}).results[0]


def _slice(block, v, dim: int, lo: int, hi: int):
    """`tensor.extract_slice` of a model input along `dim`: the runtime sends each card its part."""
    t = ir.RankedTensorType(v.type)
    shape = [hi - lo if k == dim else x for k, x in enumerate(t.shape)]
    with ir.InsertionPoint(block), ir.Location.unknown():
        return ir.Operation.create("tensor.extract_slice", results=[_tensor(shape, t)], operands=[v], attributes={
            "static_offsets": ir.DenseI64ArrayAttr.get([lo if k == dim else 0 for k in range(t.rank)]),
            "static_sizes": ir.DenseI64ArrayAttr.get(shape),
            "static_strides": ir.DenseI64ArrayAttr.get([1] * t.rank),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 0, 0, 0])}).results[0]


def _first_holder(have: dict) -> int:
    """Of the cards holding a value ({card: step}), the one that has it first (the lowest card on a tie)."""
    return min(have, key=lambda c: (have[c], c))


def _top(owner) -> ir.Operation:
    """The op of @main's body that holds `owner` (an op, or an op nested in its regions)."""
    op = owner.operation if isinstance(owner, ir.OpView) else owner
    while op.parent is not None and op.parent.name != "func.func":
        op = op.parent
    return op


def _remap(op, mapping):
    """Point the operands of `op` and of the ops nested in it at `mapping` (values from the old function)."""
    def visit(o):
        for k, x in enumerate(o.operands):
            if x in mapping:
                o.operands[k] = mapping[x]
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)


@dataclasses.dataclass
class PartitionCardsPass(SpyrePass):
    NAME = "spyre-partition-cards"
    SUMMARY = "Split the placed module into one function per card and step, @main calling them in order"

    target: str = ""

    def run(self, module: ir.Operation) -> None:
        main = params.main_func(module)
        if main is None:
            raise PassError("the module has no func.func @main", module.location)
        if NUM_CARDS not in module.attributes:
            raise PassError("the module is not placed: run spyre-place-cards first", module.location)
        if SYSTEM in main.attributes:
            raise PassError("the module is already partitioned", main.location)
        for d in params.arg_dicts(main):
            if "spyre.state" in d:
                raise PassError("a model with state buffers (a KV cache) cannot be placed over cards yet",
                                main.location)
        p = _Partition(module, main, get_target(self.target, module))
        p.assign()
        order = p.build()
        outs = p.finish(order)
        p.schedule(order, outs)
