"""spyre-emit: write the program (.spyre binary and/or an instruction listing) for a kernel-level module.

    spyre-opt model.kernel.mlir -p 'builtin.module(spyre-emit{output=model.spyre cores=4})'

The module is not changed; the work is in :mod:`spyre_mlir.codegen` (see docs/compiler.md for the contract).

Parameter values are not in the IR, so the pass takes them from a side channel: :func:`parameters` (used by
``spyre_mlir.compiler`` around the pipeline run) or the ``params=FILE.npz`` option (arrays by parameter name).
Under plain ``spyre-opt`` with neither, every parameter becomes a **binary input** named after it (the caller
passes the weights with the activations), so emission still works on hand-written IR.

Host work runs as the runtime's ``eval`` host op: a JSON program (``spyre_mlir.runtime.hostprog``) the runtime
interprets with numpy, so the binary runs in a plain ``spyre-run``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from spyre_mlir.passes.base import PassError, SpyrePass

_SIDE = threading.local()


@contextlib.contextmanager
def parameters(params=None, input_names=None, output_names=None, target=None):
    """Within the block, spyre-emit uses these parameter values, buffer names and target (a Target object);
    afterwards :func:`last_emitter` returns the emitter of the last run (its ``host_ops``, ``kernels``, ``b``)."""
    prev = getattr(_SIDE, "ctx", None)
    _SIDE.ctx = {"params": params, "input_names": input_names, "output_names": output_names,
                 "target": target, "emitter": None}
    try:
        yield _SIDE.ctx
    finally:
        _SIDE.ctx = prev


def _grid_cores(module) -> int:
    """The largest core count any op's spyre.grid uses (1 without grids)."""
    from torch_mlir import ir

    best = [1]

    def walk(op):
        attrs = op.attributes
        if "spyre.grid" in attrs:
            n = 1
            for g in ir.DenseI64ArrayAttr(attrs["spyre.grid"]):
                n *= g
            best[0] = max(best[0], n)
        for r in op.regions:
            for blk in r.blocks:
                for o in blk.operations:
                    walk(o.operation)

    walk(module)
    return best[0]


@dataclasses.dataclass
class EmitPass(SpyrePass):
    NAME = "spyre-emit"
    SUMMARY = "Emit the program: per-core instruction streams, constants, host ops (output=FILE.spyre)"

    output: str = ""
    listing: str = ""
    cores: int = 0
    target: str = ""
    params: str = ""

    def run(self, module) -> None:
        import numpy as np

        from spyre_mlir import codegen
        from spyre_mlir.codegen.emitter import EmitError, TileError
        from spyre_mlir.target import TargetError, load_target

        ctx = getattr(_SIDE, "ctx", None) or {}
        params = ctx.get("params")
        if self.params:
            with np.load(self.params) as f:
                params = {k: f[k] for k in f.files}
        target = ctx.get("target")
        try:
            if target is None or self.target or self.cores:
                cores = self.cores or (target.num_cores if target is not None else _grid_cores(module))
                target = load_target(self.target or None, cores=cores)
        except (TargetError, ValueError) as e:
            raise PassError(str(e)) from None
        try:
            em = codegen.emit(module, target, params=params, input_names=ctx.get("input_names"),
                              output_names=ctx.get("output_names"))
        except (EmitError, TileError) as e:
            raise PassError(str(e), getattr(e, "location", None)) from None
        if ctx:
            ctx["emitter"] = em
        if self.output:
            em.b.write(self.output)
        if self.listing:
            text = codegen.listing(em.b.program())
            if self.listing == "-":
                import sys

                sys.stdout.write(text)
            else:
                with open(self.listing, "w") as f:
                    f.write(text)
