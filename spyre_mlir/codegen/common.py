"""What the emitter (:mod:`.emitter`) and the kernel emitters (:mod:`.kernels`) share: their errors, reading
the IR (value types, attributes, locations, what an op reads), tile sizes and sub-tiles."""

from __future__ import annotations

import contextlib
import functools
import threading

from spyre_mlir.errors import SpyreError
from spyre_mlir.runtime.assembler import Tile


class EmitError(SpyreError):
    """The module cannot be emitted; ``location`` is the offending op's location."""

    def __init__(self, message, location=None):
        super().__init__(message)
        self.location = location


class TileError(SpyreError, ValueError):
    """No tile fits the scratchpad (the message names the sizes)."""


_DEVICE_FLOATS = ("f32", "!spyre.dlf16", "f16", "bf16")
# What elementwise kernels (maps and epilogues, on the SFU) read besides those: fp8 constants (an attention mask)
SFU_READS = _DEVICE_FLOATS + ("f8E4M3FN", "f8E5M2")


def _tensor_type(v):
    from torch_mlir import ir

    t = v.type              # the bindings give the concrete type class: no need to print it (microseconds each)
    if not isinstance(t, ir.RankedTensorType):
        return None, None
    return tuple(t.shape), t.element_type


def _attr(op, name, default=None):
    from torch_mlir import ir

    attrs = op.operation.attributes
    if name not in attrs:
        return default
    a = attrs[name]
    for cls, conv in ((ir.BoolAttr, lambda x: x.value), (ir.IntegerAttr, lambda x: x.value),
                      (ir.FloatAttr, lambda x: x.value), (ir.StringAttr, lambda x: x.value),
                      (ir.DenseI64ArrayAttr, list), (ir.DenseI32ArrayAttr, list)):
        if isinstance(a, cls):
            return conv(cls(a))
    if isinstance(a, ir.DictAttr):
        return {na.name: ir.IntegerAttr(na.attr).value for na in a}
    return a


def _same_dims(a, b) -> bool:
    """Same buffer dims, a rank-0 tensor counting as one element."""
    return (tuple(a) or (1,)) == (tuple(b) or (1,))


def _loc(op) -> str:
    s = str(op.operation.location)
    if s.startswith("loc(") and s.endswith(")"):
        s = s[4:-1]
    return f"{op.operation.name} {s}"[:200]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _sub(tile, rows, cols):
    """The top-left [rows, cols] of a tile, as a dense tile (a smaller edge tile reuses the big one)."""
    if tile is None:
        return None
    if rows == tile.rows and cols == tile.cols:
        return tile
    return Tile(tile.addr, rows, cols, tile.fmt)


@functools.lru_cache(maxsize=1024)
def row_parts(n: int, g: int) -> tuple[tuple[int, int], ...]:
    """Rows [lo, hi) of ``g`` near-equal parts of ``n`` rows (trailing parts may be empty): what each of ``g``
    cores loads of a tile they share over the ring (asked per core per step of a shared matmul: remembered)."""
    chunk = -(-n // g)
    return tuple((min(n, p * chunk), min(n, (p + 1) * chunk)) for p in range(g))


# Answers of @remembered functions by (function, op) while a `remembering()` block reads the IR: the op model's
# questions about one matmul (its epilogue, softmax, widening cast, sibling, chain) each ask for its epilogue
# and softmax, and spyre-prefetch's about one kernel (its plan, cycles, constants) each ask for its op model.
# Per thread: two threads may compile at once.
_remembered = threading.local()


@contextlib.contextmanager
def remembering():
    """Remember the answers of :func:`remembered` functions until the outermost such block ends; the IR must not
    change inside."""
    if getattr(_remembered, "answers", None) is not None:
        yield
        return
    _remembered.answers = {}
    try:
        yield
    finally:
        _remembered.answers = None


def remembered(fn):
    """``fn(op)``, a function of the IR, remembered by op inside :func:`remembering`."""
    @functools.wraps(fn)
    def wrapper(op):
        answers = getattr(_remembered, "answers", None)
        if answers is None:
            return fn(op)
        key = (fn, op.operation)
        if key not in answers:
            answers[key] = fn(op)
        return answers[key]
    return wrapper
