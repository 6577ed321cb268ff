"""Code generation: an annotated spyre module -> a Spyre program (instruction streams, constants, host ops).

* :func:`emit` runs the :class:`~.emitter.Emitter` and returns it (``.b`` is the ProgramBuilder, ``.host_ops``
  says what runs on the host and why, ``.kernels`` what runs on the device);
* :func:`listing` prints a program's instruction streams, one line per instruction (``--emit=program``).

Modules:

* :mod:`.emitter`: the walk over ``@main`` (values, names, memory slots, barriers, outputs, state updates), the
  placement pre-pass, and the dispatch of each op to a kernel emitter, :mod:`.host` or the folder;
* :mod:`.kernels`: the device kernel emitters, one module per op family (:mod:`.kernels.matmul` matmul and
  batch_matmul, :mod:`.kernels.rows` row-wise SFU ops and the row-tile skeleton, :mod:`.kernels.move` data
  movement, :mod:`.kernels.conv` conv2d and pool2d), registered by op name;
* :mod:`.host`: ops folded at compile time and ops run on the host;
* :mod:`.common` (errors, IR and tile helpers the others share), :mod:`.memory` (device tensors, DMA),
  :mod:`.sfu` (map bodies as SFU micro-ops), :mod:`.hostcode` (``spyre.host`` regions lowered to LLVM),
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


def listing(program) -> str:
    """A readable listing of ``program`` (a runtime ``Program``): buffers, then per core one line per
    instruction: index, opcode, the fields it uses, and its debug location."""
    from spyre_mlir.runtime.isa import FIELDS, Op, SfuFn, ReduceFn

    lines = [f"// program: {program.num_cores} core(s), {program.device_bytes} B device memory, "
             f"{len(program.host_ops)} host op(s)"]
    for buf in program.buffers:
        lines.append(f"// buffer {buf.name}: {buf.kind} {buf.fmt.key}{list(buf.shape)} @ {buf.addr} "
                     f"({buf.nbytes} B)")
    for c, code in enumerate(program.code):
        lines.append(f"core {c}: {len(code)} instructions")
        for i, rec in enumerate(code):
            op = Op(int(rec["op"]))
            parts = []
            for f in FIELDS[op]:
                v = rec[f].item()
                if op is Op.SFU and f == "fn":
                    v = SfuFn(v).name.lower()
                elif op is Op.REDUCE and f == "fn":
                    v = ReduceFn(v).name.lower()
                if v:
                    parts.append(f"{f}={v:g}" if isinstance(v, float) else f"{f}={v}")
            dbg = program.debug[c][i][1] if program.debug and c < len(program.debug) else ""
            lines.append(f"  {c}:{i:<5d} {op.name.lower():<12s} {' '.join(parts)}"
                         + (f"  // {dbg}" if dbg else ""))
    for k, h in enumerate(program.host_ops):
        lines.append(f"// host_op {k}: {h['op']} {h['inputs']} -> {h['outputs']}"
                     + (f" fn={h['attrs'].get('fn')}" if h.get("attrs", {}).get("fn") else "")
                     + (f" ({len(h['attrs']['program']['steps'])} steps)" if h["op"] == "eval" else ""))
    return "\n".join(lines) + "\n"


def __getattr__(name):
    if name in ("EmitError", "TileError"):
        from . import emitter

        return getattr(emitter, name)
    raise AttributeError(name)
