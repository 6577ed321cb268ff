"""One place that makes an MLIR context ready for spyre IR: upstream dialects plus the spyre dialect."""

from torch_mlir import ir

from spyre_mlir.dialects import spyre


def make_context() -> ir.Context:
    """A fresh Context with the spyre dialect loaded (upstream dialects register themselves on creation)."""
    ctx = ir.Context()
    spyre.load(ctx)
    return ctx
