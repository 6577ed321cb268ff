"""One place that makes an MLIR context ready for spyre IR: upstream dialects plus the spyre dialect."""

from torch_mlir import ir

from spyre_mlir.dialects import spyre


def asm(module) -> str:
    """IR text as stages hand it to each other: with locations, so diagnostics and the binary's debug info
    keep pointing at the model's source lines, and with every constant printed in full."""
    return module.operation.get_asm(enable_debug_info=True, large_elements_limit=None)


def make_context() -> ir.Context:
    """A fresh Context with the spyre dialect loaded (upstream dialects register themselves on creation)."""
    ctx = ir.Context()
    spyre.load(ctx)
    return ctx
