"""Per-op device kernels: each turns one annotated spyre op into per-core instruction streams.

* :mod:`.matmul`: the matmul kernel (``[gm, gn, gk]`` core grids, operand sharing over the ring, split-K);
* :mod:`.rows`: the row-wise skeleton (rows of the 2-D view split over cores in row tiles) and the row-wise ops;
* :mod:`.move`: data movement (DMA row gathers, RESTICK, selection matmuls).
"""

from . import conv, matmul, move, rows

FAMILIES = (matmul, rows, move, conv)
EMITTERS = {name: fn for fam in FAMILIES for name, fn in fam.EMITTERS.items()}
HAS_KERNEL = {name: fam.has_kernel for fam in FAMILIES for name in fam.EMITTERS}
