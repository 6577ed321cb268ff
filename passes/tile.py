"""spyre-tile{tile-m= tile-n= tile-k= tile-rows= target=PATH}: per-core tile sizes of every device op.

Each core of an op's `spyre.grid` walks its block of the iteration space in tiles small enough for the
scratchpad. This pass sets `spyre.tile = array<i64: ...>` in the same iteration space as the grid:

* matmul `[tm, tn, tk]`, batch_matmul `[tb, tm, tn, tk]` (tb = 1): tm a multiple of the PT array's rows, tn
  and tk multiples of the PT array that are also whole sticks (the B/result rows and the A rows are moved by
  DMA in whole 128-byte sticks), each dividing the core's block; along a dimension those do not divide (M = 300,
  K = 700), the whole block (the PT array pads it) or such a power of two of them, the core walking a last,
  shorter tile (`cost.tile_sizes`). A matmul whose cores share operands (an M/N split) and walk several
  output tiles of a row also gets `spyre.resident_a = true` when keeping its A parts on the scratchpad for
  the row's next tiles is cheaper (A leaves device memory once; the buffer `ares`);
* conv2d `[tn, tf, toh]` (tn = 1): filters in multiples of the PT columns, output rows (whole windows of a
  pool the kernel applies);
* row-wise ops `[tr]` rows per tile, dividing the core's rows.

The working set must fit the usable scratchpad (1,589,376 B by default) with double buffering: A and B tiles
twice, the fp32 accumulator (and the split-K reduce tile), the output tile; row ops their streamed inputs and
outputs twice plus fp32 temporaries (sized with `runtime.isa.tile_bytes` in the tensors' element formats and
packed with liveness reuse, exactly as spyre-allocate-scratchpad will). When two buffers cannot fit, or a core
has a single tile, the op is single-buffered. Among the tiles that fit the cost model picks the cheapest.

`tile-m`, `tile-n`, `tile-k` (matmuls; conv2d reads tile-n as filters and tile-m as output rows) and
`tile-rows` (row ops) force sizes (clamped to the core's block, which they must divide, or be such a matmul
size); a forced tile that
cannot fit is an error at the op naming the bytes needed and available, as is an op whose single row cannot
fit. The pass needs `spyre.grid` (run spyre-divide-work first).
"""

from __future__ import annotations

import dataclasses

from torch_mlir import ir

from spyre_mlir import cost
from spyre_mlir.passes.analysis import CORES, GRID, RESIDENT, TILE, device_ops, get_target, require
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import OpModel, check_rank, op_model, reference_k_tile
from spyre_mlir.target import Target


@dataclasses.dataclass
class TilePass(SpyrePass):
    NAME = "spyre-tile"
    SUMMARY = "Set spyre.tile (per-core tile sizes that fit the scratchpad, double-buffered) on every device op"

    tile_m: int = 0
    tile_n: int = 0
    tile_k: int = 0
    tile_rows: int = 0
    target: str = ""

    def run(self, module: ir.Operation) -> None:
        target = get_target(self.target, module)
        for name, v in (("tile-m", self.tile_m), ("tile-n", self.tile_n), ("tile-k", self.tile_k),
                        ("tile-rows", self.tile_rows)):
            if v < 0:
                raise PassError(f"{name}={v} must be positive", module.location)
        # The core count spyre-divide-work divided for (a card's share of a matmul needs the whole op's grid).
        self.cores = ir.IntegerAttr(module.attributes[CORES]).value if CORES in module.attributes \
            else target.num_cores
        for op in device_ops(module):
            model = op_model(op)
            grid = require(op, GRID, "spyre-divide-work")
            check_rank(model, grid, GRID)
            tile = self._tile(model, grid, target)
            op.attributes[TILE] = ir.DenseI64ArrayAttr.get(list(tile))

    def _tile(self, model: OpModel, grid: list[int], target: Target) -> tuple[int, ...]:
        op = model.op
        if model.kind == "matmul":
            gb, gm, gn, gk = model.grid4(grid)
            block = model.block(grid, target)
            force = _force(op, block, (self.tile_m, self.tile_n, self.tile_k), ("tile-m", "tile-n", "tile-k"),
                           cost.matmul_tile_candidates(*block, target, model.fmt, model.out_fmt, model.b_fmt,
                                                       model.trans_b))
            ragged = block[1] * gn != model.N or model.softmax is not None     # one tile column
            if ragged and force[1] not in (None, block[1]):
                raise PassError(f"tile-n={force[1]}: a ragged N split ({gn} blocks of {block[1]} columns, the "
                                f"last shorter) or a softmax epilogue (whole rows) is walked as one tile column",
                                op.location)
            if model.whole is not None and not any(force):
                # A card's share (spyre-partition-cards): the whole op's tile, so every core computes the same
                # tile shapes in the same accumulation order as on one card (bit-identical results).
                whole = model.whole_model()
                wgrid = whole.best_grid(self.cores, target)
                if wgrid is not None:
                    wtile = tuple(self._tile(whole, list(wgrid), target)[-3:])
                    whole_fits = all(b % t == 0 for b, t in zip(block, wtile)) and cost.best_tile(
                        *block, target, model.fmt, model.out_fmt, batch=model.B // gb, split_k=gk, bias=model.bias,
                        active=gb * gm * gn * gk, force=wtile, grid=(gm, gn), b_fmt=model.b_fmt,
                        round_fmt=model.round_fmt, colscale=model.colscale, epi_in=model.epi_in,
                        trans_b=model.trans_b, epi_temps=model.epi_temps, sibling=model.sibling)
                    force = wtile if whole_fits else (0, 0, wtile[2])
            elif (model.fused or model.sibling) and not force[2]:
                # spyre-fuse, or a sibling computed beside: keep the K tile of the op alone, which fixes the order
                # of the fp32 accumulation (results bit-identical); M and N tiles are free.
                tk = reference_k_tile(model, grid, target, force)
                if tk is not None:
                    force = (force[0], force[1], tk)
            if ragged:                          # one tile column per core
                force = (force[0], block[1], force[2])
            fit = cost.best_tile(*block, target, model.fmt, model.out_fmt, batch=model.B // gb, split_k=gk,
                                 bias=model.bias, active=gb * gm * gn * gk, force=force, grid=(gm, gn),
                                 b_fmt=model.b_fmt, round_fmt=model.round_fmt, colscale=model.colscale,
                                 epi_in=model.epi_in, trans_b=model.trans_b, softmax=model.softmax,
                                 epi_temps=model.epi_temps, sibling=model.sibling)
            if fit is None:
                cands = cost.matmul_tile_candidates(*block, target, model.fmt, model.out_fmt, model.b_fmt,
                                                    model.trans_b)
                tile = tuple(f or min(c) for f, c in zip(force, cands))
                bufs = cost.matmul_buffers(tile, model.fmt, model.out_fmt, nbuf=1, split_k=gk, bias=model.bias,
                                           b_fmt=model.b_fmt, round_fmt=model.round_fmt, colscale=model.colscale,
                                           epi_in=model.epi_in, trans_b=model.trans_b, softmax=model.softmax,
                                           epi_temps=model.epi_temps, sibling=model.sibling)
                _no_fit(op, target, tile, cost.footprint(bufs, target), any(force))
            if fit[2] is not None:
                op.attributes[RESIDENT] = ir.BoolAttr.get(True)
            elif RESIDENT in op.attributes:
                del op.attributes[RESIDENT]
            return (1, *fit[0]) if model.batched else fit[0]
        if model.kind == "conv":
            k = model.conv
            block = (1, k.f // grid[1], k.oh // grid[2])
            force = _force(op, block, (0, self.tile_n, self.tile_m), ("", "tile-n", "tile-m"))
            fit = cost.best_conv_tile(k, grid, target, force)
            if fit is None:
                tfs, tohs = cost.conv_tile_candidates(k, grid, target, force)
                tile = (1, min(tfs), min(tohs))
                _no_fit(op, target, tile, cost.footprint(cost.conv_buffers(k, tile, 1), target), any(force))
            return fit[0]
        k = model.rows
        rb = k.rows // grid[0]
        (force,) = _force(op, (rb,), (self.tile_rows,), ("tile-rows",))
        fit = cost.best_rows_tile(k, grid[0], target, force)
        if fit is None:
            needed = cost.footprint(cost.rowwise_buffers(k, force or 1, 1), target)
            if force:
                _no_fit(op, target, (force,), needed, True)
            raise PassError(f"a single row of {model.describe()} needs {needed} bytes of scratchpad, "
                            f"{target.scratchpad_usable_bytes} available", op.location)
        return fit[0]


def fits(model: OpModel, grid, target: Target, cores: int) -> bool:
    """Whether this pass finds a tile (no forced sizes) for ``model``'s op on ``grid`` of ``cores``:
    spyre-divide-work asks it of a fused matmul, whose grid is that of its unfused form (the accumulation
    order) while its buffers are its own. (It may set the op's spyre.resident_a, which this pass sets again.)"""
    tiler = TilePass()
    tiler.cores = cores
    try:
        tiler._tile(model, list(grid), target)
    except PassError:
        return False
    return True


def _force(op: ir.Operation, block, forced, names, sizes=None) -> tuple[int | None, ...]:
    """Forced sizes clamped to the core's block; each must divide it, or be one of the dim's ``sizes`` (a matmul
    dim its quantum does not divide has shorter last tiles, cost.tile_sizes)."""
    out = []
    for i, (b, f, name) in enumerate(zip(block, forced, names)):
        if not f:
            out.append(None)
            continue
        f = min(f, b)
        if b % f and not (sizes and f in sizes[i]):
            raise PassError(f"{name}={f} does not divide the per-core block of {b}", op.location)
        out.append(f)
    return tuple(out)


def _no_fit(op: ir.Operation, target: Target, tile, needed: int, forced: bool) -> None:
    """A forced tile, or the smallest legal one, that does not fit even single-buffered."""
    what = "tile" if forced else "the smallest tile"
    raise PassError(f"{what} {'x'.join(map(str, tile))} of '{op.name}' needs {needed} bytes of scratchpad, "
                    f"{target.scratchpad_usable_bytes} available", op.location)
