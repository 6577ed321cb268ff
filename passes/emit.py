"""spyre-emit: write the program (.spyre binary and/or an instruction listing) for a kernel-level module.

    spyre-opt model.kernel.mlir -p 'builtin.module(spyre-emit{output=model.spyre})'

The module is not changed; the work is in :mod:`spyre_mlir.codegen` (see docs/compiler.md for the contract).
Everything the program needs is in the module: parameter values as ``spyre.value`` resources
(:mod:`spyre_mlir.params`), buffer names as ``spyre.name`` argument/result attributes, the core count and target
file as the module's ``spyre.cores`` / ``spyre.target`` (written by spyre-divide-work). So the printed output of
``spyre-compile --emit=kernel`` emits, by hand, the same binary byte for byte as ``spyre-compile`` does.

Options override the module: ``cores=N``, ``target=FILE``, ``params=FILE.npz`` (arrays by parameter name, for
IR whose parameters carry no value). A parameter with no value anywhere becomes a **binary input** named after
it (the caller passes the weights with the activations), so emission still works on hand-written IR.

Host work runs inside the binary, so it runs in a plain ``spyre-run``: a ``spyre.host`` region as a ``jit`` host
op (LLVM-dialect host code, :mod:`spyre_mlir.codegen.hostcode`, that the runtime compiles at load), a device op
without a kernel through the runtime's own ``gather``/``copy`` when they compute it; the rest (and a region the
host code cannot take) as the runtime's ``eval`` host op: a JSON program (``spyre_mlir.runtime.hostprog``) the
runtime interprets with numpy.
"""

from __future__ import annotations

import dataclasses

from spyre_mlir.passes.analysis import CORES, GRID, TARGET
from spyre_mlir.passes.base import PassError, SpyrePass

NAME = "spyre.name"


def _grid_cores(module) -> int:
    """The largest core count any op's spyre.grid uses (1 without grids): hand-written IR without spyre.cores."""
    from torch_mlir import ir

    best = [1]

    def visit(op):
        if GRID in op.attributes:
            n = 1
            for g in ir.DenseI64ArrayAttr(op.attributes[GRID]):
                n *= g
            best[0] = max(best[0], n)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return best[0]


def module_target(module, cores: int = 0, target: str = ""):
    """The Target the module was compiled for (its ``spyre.target`` / ``spyre.cores``), options first."""
    from torch_mlir import ir

    from spyre_mlir.target import load_target

    attrs = module.attributes
    path = target or (ir.StringAttr(attrs[TARGET]).value if TARGET in attrs else None)
    cores = cores or (ir.IntegerAttr(attrs[CORES]).value if CORES in attrs else _grid_cores(module))
    return load_target(path, cores=cores)


def _names(main) -> tuple[list, list]:
    """``spyre.name`` of the inputs (non-parameter arguments) and of the results, in order (None: unnamed)."""
    from torch_mlir import ir

    from spyre_mlir.params import PARAM_ATTR, arg_dicts, result_dicts

    def name(d):
        return ir.StringAttr(d[NAME]).value if NAME in d else None

    return [name(d) for d in arg_dicts(main) if PARAM_ATTR not in d], [name(d) for d in result_dicts(main)]


def emit_module(module, target=None, params=None, output: str = "", listing: str = ""):
    """Emit ``module`` (an ``ir.Operation``); returns the Emitter (its ``b``, ``host_ops``, ``kernels``...).
    ``target``: a Target (default: :func:`module_target`); ``params``: extra values by parameter name."""
    from torch_mlir import ir

    from spyre_mlir import codegen
    from spyre_mlir import params as params_mod

    cards = ir.IntegerAttr(module.attributes["spyre.num_cards"]).value \
        if "spyre.num_cards" in module.attributes else 1
    if cards > 1:
        # The placement is decided and written (spyre-place-cards); no binary can hold it yet: refuse rather
        # than silently emit a single-card program.
        raise PassError(f"the module is placed over {cards} "
                        f"cards (spyre-place-cards), and multi-card binaries are not implemented yet: compile "
                        f"with --cards 1 for a runnable binary, or stop at --emit=kernel and read the placement "
                        f"plan (--placement-plan-out)", module.location)
    main = params_mod.main_func(module)
    if main is None:
        raise PassError("the module has no func.func @main", module.location)
    values = {**params_mod.values(module), **(params or {})}
    ins, outs = _names(main)
    em = codegen.emit(module, target or module_target(module), params=values or None,
                      input_names=[n or f"in{i}" for i, n in enumerate(ins)],
                      output_names=[n or f"out{i}" for i, n in enumerate(outs)])
    if output:
        em.b.write(output)
    if listing:
        text = codegen.listing(em.b.program())
        if listing == "-":
            import sys

            sys.stdout.write(text)
        else:
            with open(listing, "w") as f:
                f.write(text)
    return em


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

        from spyre_mlir.codegen.emitter import EmitError, TileError
        from spyre_mlir.params import ParamError
        from spyre_mlir.target import TargetError

        params = None
        if self.params:
            with np.load(self.params) as f:
                params = {k: f[k] for k in f.files}
        try:
            target = module_target(module, self.cores, self.target)
        except (TargetError, ValueError) as e:
            raise PassError(str(e), module.location) from None
        try:
            emit_module(module, target, params, self.output, self.listing)
        except (EmitError, TileError) as e:
            raise PassError(str(e), getattr(e, "location", None)) from None
        except ParamError as e:
            raise PassError(str(e), module.location) from None
