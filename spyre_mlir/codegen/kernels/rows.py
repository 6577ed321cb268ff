"""The row-wise kernel skeleton (generalising ``spyre_mlir.runtime.kernels``' reference row-wise kernels).

:func:`rowwise`: the skeleton of every row-wise op (map, reduce, softmax, layernorm, rmsnorm, cast): rows of
the 2-D view split over ``[gr]`` cores in ``tr``-row tiles, with a per-op ``body`` emitting SFU work.

Grid and tile come from the op's ``spyre.grid`` / ``spyre.tile`` when the kernel-level passes annotated it;
otherwise they are chosen here (largest even split, largest tile that fits the usable scratchpad), so the
emitter also works on graph-level IR.
"""

from __future__ import annotations

import numpy as np

from ..common import TileError, _divisors

__all__ = ["rowwise", "choose_rows_grid", "broadcast_rows"]


def choose_rows_grid(rows: int, cores: int) -> int:
    """Cores for a row-wise op: the largest divisor of ``rows`` not above ``cores`` (even split)."""
    return max(d for d in _divisors(rows) if d <= cores)


def rowwise(em, rows: int, cols_bytes_per_row: int, fixed_bytes: int, grid=None, tile_rows=None,
            what="op"):
    """Yield (core, first row, rows) of every tile of a row-wise op over ``rows`` rows.

    ``cols_bytes_per_row``: scratchpad bytes one row of all the op's tiles takes (inputs, temporaries,
    output); ``fixed_bytes``: tiles independent of the row count (gamma/beta, COL broadcasts)."""
    cores = em.cores
    gr = grid[0] if grid else choose_rows_grid(rows, cores)
    rb = -(-rows // gr)
    usable = em.target.scratchpad_usable_bytes
    if tile_rows:
        tr = tile_rows
    else:
        tr = min(rb, max(0, (usable - fixed_bytes) // max(cols_bytes_per_row, 1)))
    if tr < 1 or fixed_bytes + tr * cols_bytes_per_row > usable:
        raise TileError(f"{what}: a row needs {cols_bytes_per_row} B of scratchpad (+{fixed_bytes} B fixed); "
                        f"not even one row fits the {usable} B usable scratchpad")
    plan = []
    for core in range(gr):
        end = min(rows, (core + 1) * rb)
        for r0 in range(core * rb, end, tr):
            plan.append((core, r0, min(tr, end - r0)))
    return plan, gr, tr


def broadcast_rows(in_shape, out_shape, r0, n) -> np.ndarray:
    """Source row (in the 2-D view of an input broadcast to ``out_shape``) of result rows r0..r0+n."""
    out_lead = list(out_shape[:-1])
    ins = [1] * (len(out_shape) - len(in_shape)) + list(in_shape)
    in_lead = ins[:-1]
    r = np.arange(r0, r0 + n)
    if not out_lead:
        return np.zeros(n, np.int64)
    idx = np.unravel_index(r, out_lead)
    src = [ix if s != 1 else np.zeros_like(ix) for ix, s in zip(idx, in_lead)]
    return np.ravel_multi_index(src, [max(s, 1) for s in in_lead]) if in_lead else np.zeros(n, np.int64)
