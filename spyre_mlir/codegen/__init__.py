"""Code generation: an annotated spyre module -> a Spyre program (instruction streams, constants, host ops).

* :func:`emit` runs the :class:`~.emitter.Emitter` and returns it (``.b`` is the ProgramBuilder, ``.host_ops``
  says what runs on the host and why, ``.kernels`` what runs on the device);
* :func:`listing` prints a program's instruction streams, one line per instruction (``--emit=program``):
  the runtime's disassembler, :func:`spyre_mlir.runtime.assembler.listing`;
* :mod:`.kernels` (matmul, row-wise skeleton), :mod:`.sfu` (map bodies), :mod:`.memory` (device tensors, DMA),
  :mod:`.hostprog` (what runs on the host, as a numpy-evaluated program).

Importing this package imports neither torch nor MLIR; :func:`emit` needs the MLIR bindings (it walks IR).
"""

from __future__ import annotations

__all__ = ["emit", "listing", "EmitError", "TileError"]


def emit(module, target, params=None, input_names=None, output_names=None):
    """Emit ``module`` (an ``ir.Module`` at kernel level, or graph level: missing grids/tiles are chosen
    here) for ``target``; ``params`` maps parameter names to arrays (None: parameters become inputs)."""
    from .emitter import Emitter

    em = Emitter(module, target, params=params, input_names=input_names, output_names=output_names)
    em.run()
    return em


def __getattr__(name):
    if name == "listing":               # the runtime's disassembler, next to the ISA it reads
        from spyre_mlir.runtime.assembler import listing

        return listing
    if name in ("EmitError", "TileError"):
        from . import emitter

        return getattr(emitter, name)
    raise AttributeError(name)
