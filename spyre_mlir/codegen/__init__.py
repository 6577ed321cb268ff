"""Code generation: an annotated spyre module -> a Spyre program (instruction streams, constants, host ops).

* :func:`emit` runs the :class:`~.emitter.Emitter` and returns it (``.b`` is the ProgramBuilder, ``.host_ops``
  says what runs on the host and why, ``.kernels`` what runs on the device);
* :func:`listing` prints a program's instruction streams, one line per instruction (``--emit=program``):
  the runtime's disassembler, :func:`spyre_mlir.runtime.assembler.listing`.

Modules:

* :mod:`.emitter`: the walk over ``@main`` (values, names, memory slots, barriers, outputs, state updates) and
  the dispatch of each op, where spyre-select-kernels placed it, to a kernel emitter, :mod:`.host` or the folder;
* :mod:`.kernels`: the device kernel emitters, one module per op family (:mod:`.kernels.matmul` matmul and
  batch_matmul, :mod:`.kernels.rows` row-wise SFU ops and the row-tile skeleton, :mod:`.kernels.move` data
  movement, :mod:`.kernels.conv` conv2d and pool2d), registered by op name, each saying which kernel runs an
  op (``select``, asked by spyre-select-kernels);
* :mod:`.host`: ops folded at compile time and ops run on the host;
* :mod:`.plan`: an op's kernel plan (grid, tile, scratchpad buffers) as the kernel passes wrote it, which the
  kernel emitters follow;
* :mod:`.common` (errors, IR and tile helpers the others share), :mod:`.memory` (device tensors, DMA),
  :mod:`.sfu` (map bodies as SFU micro-ops), :mod:`.hostcode` (``spyre.host`` regions lowered to LLVM),
  :mod:`.hostprog` (what runs on the host, as a numpy-evaluated program).

Importing this package imports neither torch nor MLIR; :func:`emit` needs the MLIR bindings (it walks IR).
"""

from __future__ import annotations

__all__ = ["emit", "listing", "EmitError", "TileError"]


def emit(module, target, params=None, input_names=None, output_names=None):
    """Emit ``module`` (an ``ir.Module`` at kernel level: every device op carries its kernel plan, see
    :mod:`.plan`) for ``target``; ``params`` maps parameter names to arrays (None: parameters become inputs)."""
    from .common import remembering
    from .emitter import Emitter

    em = Emitter(module, target, params=params, input_names=input_names, output_names=output_names)
    # The emitter reads the IR and never changes it: each op's model and its producers' and consumers' roles
    # (epilogue_of, softmax_of, sibling_of...), asked for by every kernel near it, are worked out once.
    with remembering():
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
