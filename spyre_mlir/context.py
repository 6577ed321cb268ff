"""One place that makes an MLIR context ready for spyre IR: upstream dialects plus the spyre dialect."""

from torch_mlir import ir

from spyre_mlir.dialects import spyre


def asm(module) -> str:
    """IR text as stages hand it to each other: with locations, so diagnostics and the binary's debug info
    keep pointing at the model's source lines, and with every constant printed in full."""
    return module.operation.get_asm(enable_debug_info=True, large_elements_limit=None)


def make_context() -> ir.Context:
    """A fresh Context with every dialect a compile meets: upstream ones (registered on creation), torch-mlir's
    (torch, torch_c, tm_tensor: linalg-on-tensors keeps tm_tensor.sort/scatter/scan) and spyre."""
    from torch_mlir._mlir_libs import _torchMlir
    from torch_mlir.passmanager import PassManager

    ctx = ir.Context()
    _torchMlir.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        # tm_tensor has no Python registration hook; a pass depending on it loads it (~1 ms, on an empty module).
        PassManager.parse("builtin.module(func.func(tm-tensor-bufferize))").run(ir.Module.create().operation)
    spyre.load(ctx)
    return ctx
