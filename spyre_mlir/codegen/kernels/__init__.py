"""Per-op device kernels: each turns one annotated spyre op into per-core instruction streams.

One module per op family:

* :mod:`.matmul`: matmul and batch_matmul, and the matmul kernel (``[gm, gn, gk]`` core grids, operand
  sharing over the ring, split-K);
* :mod:`.rows`: the row-wise skeleton (rows of the 2-D view split over cores in row tiles, double buffered)
  and the row-wise SFU ops (map, reduce, softmax, layernorm, rmsnorm, cast);
* :mod:`.move`: data movement (transpose, slice, concat, reshape) by DMA row gathers, RESTICK or 0/1
  selection matmuls;
* :mod:`.conv`: conv2d (groups 1 or depthwise) and pool2d.

Each family module has ``EMITTERS``, op name -> ``emit(em, op, loc)``, and ``select(op, target, known)``, the
kernel that runs that op on the device (None: none can). spyre-select-kernels asks it (:func:`select`) and
records the answer as the op's ``spyre.kernel``; the emitter follows that attribute. ``em`` is the
:class:`~spyre_mlir.codegen.emitter.Emitter`: a kernel reads its operands with ``em.tensor(v)`` (known values
in ``em.known``, quantized ones with ``em.qscale``/``em.qfmt``), allocates its result with ``em.result(op)``,
and emits through the ProgramBuilder ``em.b`` on the cores of the op's plan; the barrier after it is
spyre-schedule's (``spyre.barrier``). An emitter returns the number of cores it used.
"""

from torch_mlir import ir

from . import conv, matmul, move, rows

FAMILIES = (matmul, rows, move, conv)
EMITTERS = {name: fn for fam in FAMILIES for name, fn in fam.EMITTERS.items()}
KERNELS = {name: kernels for fam in FAMILIES for name, kernels in fam.KERNELS.items()}   # op -> its kernels
_FAMILY = {name: fam for fam in FAMILIES for name in fam.EMITTERS}


def select(op, target, known) -> str | None:
    """The device kernel that runs ``op`` (its ``spyre.kernel``), or None when no kernel can: the op's family
    decides from its types, attributes and the ``target``; ``known`` holds the values known at compile time
    (a conv2d's weights must be)."""
    fam = _FAMILY.get(op.operation.name)
    return fam.select(op, target, known) if fam is not None else None


def applied_by(op):
    """For an op whose kernel is ``epilogue``, what its producer's kernel applies it as (a pool, a softmax, a
    widening cast or a map's :class:`.rows.Epilogue`), or None when nothing applies it any more."""
    name = op.operation.name if hasattr(op, "operation") else op.name
    if name == "spyre.pool2d":
        return conv.pool_source(op)
    if name == "spyre.softmax":
        return rows.softmax_source(op)
    if name == "spyre.cast":
        return rows.cast_source(op)
    return rows.epilogue(op)


_PREFETCHING = {"conv2d": conv, "matmul": matmul, "select-cols": move}   # kernels with prefetchable and last_segment


def _kernel(op):
    o = op.operation if hasattr(op, "operation") else op
    return o, ir.StringAttr(o.attributes["spyre.kernel"]).value if "spyre.kernel" in o.attributes else None


def prefetchable(op, target) -> tuple[tuple[str, ...], float, float]:
    """The buffers of ``op``'s kernel holding constants it loads once before its work, which spyre-prefetch may
    have it load during an earlier kernel (empty: none); the cycles those loads take, and the cycles they keep
    the kernel from its work (what loading them earlier saves)."""
    o, kernel = _kernel(op)
    fam = _PREFETCHING.get(kernel)
    return fam.prefetchable(o, target) if fam is not None else ((), 0.0, 0.0)


def last_segment(op, target) -> tuple[float, float] | None:
    """(compute, store) cycles of ``op``'s kernel's last segment when it loads nothing there, so its DMA unit
    idles while it computes (where spyre-prefetch may place a later kernel's loads), else None."""
    o, kernel = _kernel(op)
    fam = _PREFETCHING.get(kernel)
    return fam.last_segment(o, target) if fam is not None else None


def why_not(op, target, known) -> str | None:
    """Why no kernel runs ``op``, when its family can say more than its op name and types."""
    fam = _FAMILY.get(op.operation.name)
    return fam.why_not(op, target, known) if hasattr(fam, "why_not") else None
