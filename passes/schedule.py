"""spyre-schedule: double buffering and cross-core barriers of every device op.

* `spyre.double_buffer = true|false` on every device op: true when its allocation holds two buffers of a
  streamed operand (`a0`/`a1`, `in0`/`in1`, ...), so the DMA of the next tile overlaps compute on this one.
* `spyre.barrier = true` on an op whose result is read where the data crosses cores: by a later device op that
  does not read it on the cores that wrote it, by a host region or by any other non-device op. A map its
  producer's kernel applies (kernel `epilogue`) is looked through: the producer wrote its result. `func.return`
  is no such reader (nor is a sibling matmul, which another matmul's kernel computes on its cores and its epilogue
  reads there; a matmul chained to a softmax epilogue is looked through like an epilogue; nor a matmul applying a
  norm as its prologue, nor any reader of an alias of a value only a kernel holds): the host reads outputs
  after every core has ended, and the copies and state updates the emitter adds at the end bring their own barriers.
  Ops without the attribute need no barrier after them.

Whether data stays on its core is decided from the work division. An op's result is held in contiguous row
blocks, block c on core c, when the op is row-wise (`[gr]`), a matmul split along M only (`[gm, 1, 1]`, as the
matmul kernel numbers its cores) or a conv2d split along the batch only. A consumer reads an operand that way
when it is row-wise and streams the operand row by row (not broadcast, transposed, sliced or gathered), or when
the operand is a matmul's lhs with an M-only split. Producer and consumer agree when both use the same number of
blocks (an op on one core counts as one block on core 0). Everything else crosses cores and needs a barrier: a
different grid, a split along N or K (split-K results live on the group roots), an rhs every core reads, and a
batch_matmul on several cores (how batches map to cores is the emitter's choice).
"""

from __future__ import annotations

import dataclasses
import math

from torch_mlir import ir

from spyre_mlir.codegen.common import remembering
from spyre_mlir.passes.analysis import (BARRIER, DOUBLE_BUFFER, GRID, KERNEL, SCRATCHPAD, device_ops, producer,
                                        require, user)
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import OpModel, epilogue_source, op_model


@dataclasses.dataclass
class SchedulePass(SpyrePass):
    NAME = "spyre-schedule"
    SUMMARY = "Set spyre.double_buffer on every device op and spyre.barrier where results cross cores"

    def run(self, module: ir.Operation) -> None:
        ops = device_ops(module)
        # An Operation's hash covers its attributes: look everything up before setting any. Nothing changes
        # meanwhile, so an epilogue map is analysed once for its own model, its producer's and _crosses.
        models = {}
        decisions = []
        with remembering():
            for op in ops:
                if SCRATCHPAD not in op.attributes:
                    raise PassError(f"'{op.name}' has no {SCRATCHPAD}: run spyre-allocate-scratchpad first",
                                    op.location)
                models[op] = (op_model(op), require(op, GRID, "spyre-divide-work"))
            for op in ops:
                names = {a.name for a in ir.DictAttr(op.attributes[SCRATCHPAD])}
                double = any(n.endswith("1") and n[:-1] + "0" in names for n in names)
                decisions.append((op, double, self._crosses(op, models)))
        for op, double, barrier in decisions:
            op.attributes[DOUBLE_BUFFER] = ir.BoolAttr.get(double)
            if barrier:
                op.attributes[BARRIER] = ir.BoolAttr.get(True)

    @staticmethod
    def _crosses(op: ir.Operation, models: dict) -> bool:
        """Whether any reader of the op's result reads it on other cores than those that wrote it. An epilogue
        map is written by its producer's kernel, so its producer answers for it, through it to its readers."""
        if _kernel_in(op, *_APPLIED) or _in_kernel(op):
            return False
        held = result_blocks(*models[op])
        for use in _readers(op):
            if user(use).name == "func.return":
                continue
            if _kernel_in(user(use), "chained", "prologue"):
                # A chained matmul's V, a norm prologue's operands: read by the kernel applying it, on its cores.
                return True
            reader = models.get(user(use))
            if held is None or reader is None or operand_blocks(*reader, use.operand_number) != held:
                return True
        return False


def _kernel_in(op: ir.Operation, *kernels: str) -> bool:
    return KERNEL in op.attributes and ir.StringAttr(op.attributes[KERNEL]).value in kernels


# Kernels another op's kernel runs (an epilogue; a matmul computed beside or chained to another; a norm a matmul
# applies to its A tiles): none writes its result itself.
_APPLIED = ("epilogue", "sibling", "chained", "prologue")


def _in_kernel(op: ir.Operation) -> bool:
    """An alias of a value only another op's kernel holds (a sibling matmul's tile, a norm prologue's A tile):
    nothing is stored, so nothing crosses cores."""
    while _kernel_in(op, "alias"):
        op = producer(op.operands[0])
        if op is None:
            return False
    return _kernel_in(op, "sibling", "prologue")


def _readers(op: ir.Operation):
    """The uses of op's result, through the epilogue maps its kernel applies and a matmul chained to them (their
    readers instead). A further input of an epilogue is read by the producer's kernel, tile by tile: a reader
    that crosses cores."""
    for use in op.results[0].uses:
        owner = user(use)
        if (_kernel_in(owner, "epilogue") and epilogue_source(owner) == use.operand_number) or \
                (_kernel_in(owner, "chained") and use.operand_number == 0):
            yield from _readers(owner)
        else:
            yield use


def result_blocks(model: OpModel, grid: list[int]) -> int | None:
    """Number of contiguous row blocks the result is held in (block c on core c), or None."""
    if math.prod(grid) == 1:
        return 1
    if model.kind == "rows":
        return grid[0]
    if model.kind == "matmul" and not model.batched:
        gm, gn, gk = grid
        return gm if gn == 1 and gk == 1 else None
    if model.kind == "conv":
        return grid[0] if grid[1] == grid[2] == 1 else None
    return None


def operand_blocks(model: OpModel, grid: list[int], index: int) -> int | None:
    """Number of contiguous row blocks in which core c reads block c of operand `index`, or None."""
    if math.prod(grid) == 1:
        return 1
    if model.kind == "rows":
        return grid[0] if index in model.chunked else None
    if model.kind == "matmul" and not model.batched and index == 0:
        gm, gn, gk = grid
        return gm if gn == 1 and gk == 1 else None
    return None
