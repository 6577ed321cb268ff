"""The kernel plan of one device op, as the kernel passes wrote it: what a kernel emitter follows.

* ``grid`` (``spyre.grid``, spyre-divide-work) and ``tile`` (``spyre.tile``, spyre-tile), in the op's iteration
  space;
* ``buffers``: name -> (offset, bytes), the offsets of ``spyre.scratchpad`` (spyre-allocate-scratchpad) with
  the sizes of the op model's buffer description (``passes.op_model.plan``: the one description spyre-tile fitted
  and spyre-allocate-scratchpad placed);
* ``double_buffer`` (the allocation holds both buffers of a pair, as spyre-schedule's flag says) and ``barrier``
  (spyre-schedule).

A kernel emitter asks the plan for its row tiles and for scratchpad tiles by buffer name. A plan it cannot
follow (no plan, a buffer the plan does not have, a tile bigger than its planned buffer) is a
:class:`PlanError` at the op's location, never a silent re-plan.
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir.errors import SpyreError
from spyre_mlir.runtime.assembler import Tile
from spyre_mlir.runtime.formats import Format


class PlanError(SpyreError):
    def __init__(self, message, location=None):
        super().__init__(message)
        self.location = location


@dataclasses.dataclass
class KernelPlan:
    op_name: str
    location: object
    grid: tuple[int, ...]
    tile: tuple[int, ...]
    buffers: dict[str, tuple[int, int]]
    double_buffer: bool
    barrier: bool

    @classmethod
    def of(cls, op, target) -> "KernelPlan":
        """The plan the kernel passes wrote on ``op`` (an ir.Operation or OpView)."""
        from spyre_mlir.passes.op_model import buffers, op_model

        o = op.operation if hasattr(op, "operation") else op
        attrs = o.attributes
        missing = [a for a in ("spyre.grid", "spyre.tile", "spyre.scratchpad") if a not in attrs]
        if missing:
            raise PlanError(f"'{o.name}' has no {', '.join(missing)}: run the kernel pipeline "
                            f"(spyre_mlir.pipeline.kernel_pipeline) before spyre-emit", o.location)
        grid = tuple(ir.DenseI64ArrayAttr(attrs["spyre.grid"]))
        tile = tuple(ir.DenseI64ArrayAttr(attrs["spyre.tile"]))
        offsets = {a.name: ir.IntegerAttr(a.attr).value for a in ir.DictAttr(attrs["spyre.scratchpad"])}
        # The allocation says whether streamed operands are double-buffered (a pair ending in 0 and 1).
        double = any(n.endswith("1") and n[:-1] + "0" in offsets for n in offsets)
        sizes = {b.name: b.nbytes for b in buffers(op_model(o), list(grid), list(tile), 2 if double else 1)}
        if set(sizes) != set(offsets):
            raise PlanError(f"'{o.name}': spyre.scratchpad has buffers {sorted(offsets)}, its kernel "
                            f"{sorted(sizes)} for grid {list(grid)} and tile {list(tile)}", o.location)
        barrier = "spyre.barrier" in attrs and ir.BoolAttr(attrs["spyre.barrier"]).value
        return cls(o.name, o.location, grid, tile, {k: (offsets[k], sizes[k]) for k in offsets}, double, barrier)

    @property
    def cores(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    @property
    def nbuf(self) -> int:
        """Buffers per streamed operand."""
        return 2 if self.double_buffer else 1

    def fail(self, message: str):
        raise PlanError(f"'{self.op_name}': {message}", self.location)

    def has(self, name: str) -> bool:
        return name in self.buffers

    def tile_at(self, name: str, rows: int, cols: int, fmt) -> Tile:
        """The scratchpad tile [rows, cols] of ``fmt`` at buffer ``name``'s planned offset."""
        if name not in self.buffers:
            self.fail(f"its kernel needs a buffer '{name}' the plan does not have (plan: {sorted(self.buffers)})")
        off, size = self.buffers[name]
        t = Tile(off, int(rows), int(cols), Format.parse(fmt) if isinstance(fmt, str) else fmt)
        if t.nbytes > size:
            self.fail(f"a [{rows}, {cols}] {t.fmt.key} tile ({t.nbytes} B) does not fit the planned buffer "
                      f"'{name}' ({size} B)")
        return t

    def row_tiles(self, rows: int) -> list[tuple[int, int, int]]:
        """(core, first row, rows) of every tile of a row-wise op: ``grid[0]`` even blocks, ``tile[0]`` rows a
        tile (the last tile of a block may be shorter)."""
        (gr,), (tr,) = self.grid[-1:], self.tile[-1:]
        if rows % gr:
            self.fail(f"grid {list(self.grid)} does not split its {rows} rows evenly")
        rb = rows // gr
        out = []
        for core in range(gr):
            for r0 in range(core * rb, (core + 1) * rb, tr):
                out.append((core, r0, min(tr, (core + 1) * rb - r0)))
        return out
