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
from spyre_mlir.runtime.collector import collector_paused

NAME = "spyre.name"
SYSTEM = "spyre.system"     # @main of a module partitioned over cards (spyre-partition-cards)


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
    main = params_mod.main_func(module)
    if main is None:
        raise PassError("the module has no func.func @main", module.location)
    if SYSTEM in main.attributes:
        em = SystemEmitter(module, main, target or module_target(module), params)
        if output:
            em.write(output)
        if listing:
            _write_listing(em.listing(), listing)
        return em
    if cards > 1:
        # Placed (spyre-place-cards) but not partitioned: refuse rather than emit a one-card program.
        raise PassError(f"the module is placed over {cards} cards but not partitioned: run "
                        f"spyre-partition-cards after spyre-place-cards", module.location)
    values = {**params_mod.values(module), **(params or {})}
    ins, outs = _names(main)
    with collector_paused():         # a record per instruction, made and kept: nothing for the collector
        em = codegen.emit(module, target or module_target(module), params=values or None,
                          input_names=[n or f"in{i}" for i, n in enumerate(ins)],
                          output_names=[n or f"out{i}" for i, n in enumerate(outs)])
        if output:
            em.b.write(output)
    if listing:
        _write_listing(codegen.listing(em.b.program()), listing)
    return em


def _write_listing(text: str, listing: str) -> None:
    if listing == "-":
        import sys

        sys.stdout.write(text)
    else:
        with open(listing, "w") as f:
            f.write(text)


def _standalone(module, fn):
    """A module holding a copy of step function `fn` as its @main, with the module's attributes (the core count,
    the target): what spyre-emit makes one card's program of."""
    from torch_mlir import ir

    from spyre_mlir.passes.partition_cards import CARD, NUM_CARDS, STEP

    with fn.location:
        m = ir.Module.create()
        for k in module.attributes:
            if k != NUM_CARDS:
                m.operation.attributes[k] = module.attributes[k]
        with ir.InsertionPoint(m.body):
            new = fn.clone()
        new.attributes["sym_name"] = ir.StringAttr.get("main")
        for k in ("sym_visibility", CARD, STEP):
            if k in new.attributes:
                del new.attributes[k]
    return m


class SystemEmitter:
    """The programs of a module partitioned over cards (spyre-partition-cards): each step function emitted as
    one card's program, each card's steps linked into one file with an entry per step (the card's weights
    loaded once), and @main's calls and all-gathers written as the system's schedule (runtime.system)."""

    def __init__(self, module, main, target, params=None):
        from torch_mlir import ir

        from spyre_mlir import codegen
        from spyre_mlir.params import arg_dicts, result_dicts
        from spyre_mlir.passes.partition_cards import ALL_GATHER, CARD, STEP
        from spyre_mlir.runtime.link import link

        self.system = True
        fns = {}
        for o in module.regions[0].blocks[0].operations:
            if o.operation.name == "func.func" and CARD in o.operation.attributes:
                fns[ir.StringAttr(o.operation.attributes["sym_name"]).value] = o.operation
        src: dict = {}
        inputs = []
        for j, (a, d) in enumerate(zip(main.regions[0].blocks[0].arguments, arg_dicts(main))):
            src[a] = {"input": j}
            name = ir.StringAttr(d[NAME]).value if NAME in d else \
                (ir.StringAttr(d["spyre.param"]).value if "spyre.param" in d else f"in{j}")
            inputs.append({"name": name, "shape": list(ir.RankedTensorType(a.type).shape)})
        card_target = target.with_cards(1)      # each card's program is a one-card program
        calls, per_card, outputs = [], {}, []
        self.host_ops, self.kernels, self.host_locations = [], [], []
        self.programs = {}
        ncards = ir.IntegerAttr(module.attributes["spyre.num_cards"]).value
        for o in main.regions[0].blocks[0].operations:
            op = o.operation
            if op.name == "tensor.extract_slice":
                base = src[op.operands[0]]
                off = list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"]))
                size = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
                full = list(ir.RankedTensorType(op.operands[0].type).shape)
                d = next((k for k in range(len(full)) if size[k] != full[k]), 0)
                src[op.results[0]] = {**base, "dim": d, "start": off[d], "stop": off[d] + size[d]}
            elif op.name == "func.call":
                fn = fns[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
                card = ir.IntegerAttr(fn.attributes[CARD]).value
                entry = f"step{ir.IntegerAttr(fn.attributes[STEP]).value}"
                sub = _standalone(module, fn)
                nin, nout = len(fn.regions[0].blocks[0].arguments), len(op.results)
                em = codegen.emit(sub.operation, card_target, params=params or None,
                                  input_names=[f"in{i}" for i in range(nin)],
                                  output_names=[f"out{i}" for i in range(nout)])
                per_card.setdefault(card, {})[entry] = em.b.program()
                self.host_ops += [f"card {card} {entry}: {h}" for h in em.host_ops]
                self.kernels += list(em.kernels)
                self.host_locations += list(em.host_locations)
                calls.append({"card": card, "entry": entry, "args": [src[v] for v in op.operands]})
                for r, v in enumerate(op.results):
                    src[v] = {"call": len(calls) - 1, "result": r}
            elif op.name == ALL_GATHER:
                src[op.results[0]] = {"gather": [src[v] for v in op.operands],
                                      "dim": ir.IntegerAttr(op.attributes["dim"]).value}
            elif op.name == "func.return":
                for k, (v, d) in enumerate(zip(op.operands, result_dicts(main))):
                    outputs.append({"name": ir.StringAttr(d[NAME]).value if NAME in d else f"out{k}",
                                    "from": src[v],
                                    **({"dtype": ir.StringAttr(d["spyre.dtype"]).value}
                                       if "spyre.dtype" in d else {})})
            else:
                raise PassError(f"{op.name} in a system's @main (expected calls, all-gathers, input slices)",
                                op.location)
        # A placement may leave the last cards idle (a small model on one card of several); not one between.
        ncards = len(per_card)
        if sorted(per_card) != list(range(ncards)):
            raise PassError(f"the schedule uses cards {sorted(per_card)}: cards 0..{max(per_card)} must each run "
                            f"something", main.location)
        from spyre_mlir.runtime.binary import program_layout
        from spyre_mlir.runtime.system import FORMAT, System

        self.cards = [link(per_card[c], producer="spyre_mlir") for c in range(ncards)]
        first = self.cards[0]
        meta = {"format": FORMAT, "producer": "spyre_mlir", "cards": ncards,
                "link": {"bytes_per_cycle": target.card_link_bytes_per_cycle,
                         "latency_cycles": target.card_link_latency_cycles},
                "inputs": inputs, "calls": calls, "outputs": outputs}
        self.sys = System(meta, [program_layout(p) for p in self.cards], first.num_cores,
                          target.with_cards(ncards).fingerprint())

    def to_bytes(self) -> bytes:
        from spyre_mlir.runtime.system import system_to_bytes

        return system_to_bytes(self.sys)

    def write(self, path) -> None:
        from spyre_mlir.runtime.binary import atomic_write

        atomic_write(path, self.layout())

    def layout(self) -> tuple[int, list]:
        """The system file's image as its pieces (runtime.system.system_layout)."""
        from spyre_mlir.runtime.system import system_layout

        return system_layout(self.sys)

    def listing(self) -> str:
        from spyre_mlir import codegen

        out = []
        for c, p in enumerate(self.cards):
            for e in p.entries:
                out.append(f"// ---- card {c}, entry {e.name}\n" + codegen.listing(p.entry_program(e.name)))
        return "".join(out)


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
