"""spyre-compile: compile a PyTorch model file, stopping at a named stage.

    spyre-compile MODEL --emit=torch|linalg|spyre|kernel|program|binary [-o OUT]
                  [--precision dlf16|fp8|int8-weights|fp32-reference] [--cores N] [--cards N] [--target FILE]
                  [--placement-plan-out PLAN.json] [--placement-plan PLAN.json]
                  [--input-shape 1x3x224x224xf32 ...] [--trust-pickle] [--dump-dir DIR]

The compiler is a list of named stages (``STAGES``); ``--emit=NAME`` runs the stages up to NAME and prints
(or writes, with ``-o``) that stage's output: IR for torch/linalg/spyre/kernel, the instruction listing for
``program``, and for ``binary`` (the default) the .spyre file itself, written atomically to ``-o`` or to
``<model name>.spyre`` in the current directory. A stage is
``def _stage_x(job, previous_output)`` appended as ``("x", _stage_x)`` to ``STAGES``; it returns text (the
frontend's stages, the listing) or the job's module (from the spyre stage on, the stages change one module in
one context: no text round trips). IR is printed only for ``--emit`` and ``--dump-dir``, with its
parameters as resources, so a printed stage is a complete input to the next (``spyre-opt``).

``--dump-dir DIR`` keeps every stage's output (``01-torch.mlir``, ``02-linalg.mlir``, ...). When a stage
fails it also writes the stage's input IR (``NN-<stage>.input.mlir``) and the exact command that reproduces
the failure (``NN-<stage>.repro.sh``).

Exit status: 0 success; 1 a stage failed (e.g. a tile that cannot fit); 2 bad usage (unknown precision,
impossible core count, unreadable target file) or a model file that
cannot be loaded (the message names the file and the accepted formats; no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time
import warnings
from typing import Callable, Sequence

# torch and the frontend are imported inside the stages: `spyre-compile --help` stays instant.


@dataclasses.dataclass
class Job:
    """What the stages share: the parsed command line and the imported model once the torch stage ran."""

    args: argparse.Namespace
    imported: object = None  # spyre_mlir.frontend.ImportedModel
    target: object = None    # spyre_mlir.target.Target narrowed to --cores
    context: object = None   # the MLIR context of the spyre stage on
    module: object = None    # the module the spyre, kernel and program stages change in place
    program_emitter: object = None  # spyre_mlir.codegen.emitter.Emitter of the program stage


def _stage_torch(job: Job, _ir: str | None) -> str:
    """Load the model file, apply adapters, import with Torch-MLIR's FX importer, run the torch backend
    pipeline."""
    from spyre_mlir.frontend import import_model

    job.imported = import_model(
        job.args.model, input_shapes=job.args.input_shape, trust_pickle=job.args.trust_pickle, stage="torch"
    )
    return job.imported.torch_ir


def _stage_linalg(job: Job, torch_ir: str) -> str:
    """Torch backend IR -> linalg-on-tensors (upstream pipeline)."""
    from spyre_mlir.frontend.importer import lower_to_linalg

    return lower_to_linalg(torch_ir)


def _stage_spyre(job: Job, linalg_ir: str):
    """linalg-on-tensors -> spyre graph ops, the rest placed on the host (spyre_mlir.pipeline.graph_pipeline).
    From here on the stages change one module in one context: parsed once, parameters attached as resources."""
    from spyre_mlir.compiler import prepare_module
    from spyre_mlir.context import make_context
    from spyre_mlir.pipeline import graph_pipeline

    job.imported.linalg_ir = linalg_ir
    job.context = make_context()
    with job.context:
        job.module = prepare_module(job.imported)
        _run(job, graph_pipeline())
        if job.args.emit == "spyre":
            _report_placement(job)
    return job.module


def _run(job: Job, pipeline: str) -> None:
    """Run a pipeline on the job's module; a failure is a StageError (``main`` adds the stage's input IR for
    the reproducer)."""
    from torch_mlir import ir

    from spyre_mlir.frontend.errors import StageError, mlir_error_detail
    from spyre_mlir.passes.manager import PipelineError, run_pipeline

    try:
        run_pipeline(job.module, pipeline)
    except (ir.MLIRError, PipelineError) as e:
        raise StageError(mlir_error_detail(str(e)), pipeline=pipeline) from None


def _report_placement(job: Job) -> None:
    """Nothing lands on the host silently: after the last graph or kernel stage that runs (spyre-select-kernels
    sends ops without a device kernel to the host too), one line when anything does, or the full table with
    --placement-report."""
    from spyre_mlir.passes.place_host import placement_report, print_report

    rows = placement_report(job.module)
    if job.args.placement_report:
        print_report(rows, sys.stderr, title="spyre-compile")
        return
    host = [r for r in rows if r["placement"] == "host"]
    if host:
        reasons = sorted({r["reason"] for r in host})
        print(f"spyre-compile: {len(rows) - len(host)} ops on the device, {len(host)} on the host "
              f"({'; '.join(reasons)}); --placement-report lists them", file=sys.stderr)


def _stage_kernel(job: Job, module):
    """Graph IR -> kernel level: precision, layout, work division, tiles, scratchpad, schedule
    (spyre_mlir.pipeline.kernel_pipeline)."""
    from spyre_mlir.pipeline import kernel_pipeline

    a = job.args
    with job.context:
        # A forced plan without --cards brings its own card count.
        cards = None if a.placement_plan and a.cards is None else job.target.num_cards
        _run(job, kernel_pipeline(a.precision, job.target.num_cores, a.target, cards, a.placement_plan,
                                  a.placement_plan_out))
        _report_placement(job)
    return module


def _stage_program(job: Job, module) -> str:
    """Kernel IR -> the program (spyre-emit), printed as a listing: one line per instruction and core."""
    from spyre_mlir import codegen
    from spyre_mlir.compiler import CompileError, emit
    from spyre_mlir.frontend.errors import StageError

    with job.context:
        try:
            job.program_emitter = emit(module, job.target)
        except CompileError as e:
            raise StageError(str(e), pipeline="builtin.module(spyre-emit)") from None
    em = job.program_emitter
    return em.listing() if getattr(em, "system", False) else codegen.listing(em.b.program())


def _stage_binary(job: Job, listing: str) -> str:
    """Write the .spyre binary (atomically) to -o; prints what runs on the host."""
    em = job.program_emitter
    system = getattr(em, "system", False)
    (em.write if system else em.b.write)(job.args.output)
    where = f"{len(em.cards)} cards of {job.target.num_cores} cores" if system else f"{job.target.num_cores} cores"
    lines = [f"wrote {job.args.output} ({where}, precision {job.args.precision})"]
    lines += [f"host: {h}" for h in em.host_ops]
    return "\n".join(lines) + "\n"


# The compiler, in order. Each stage takes the previous stage's output and returns its own.
STAGES: list[tuple[str, Callable[[Job, str | None], str]]] = [
    ("torch", _stage_torch),
    ("linalg", _stage_linalg),
    ("spyre", _stage_spyre),
    ("kernel", _stage_kernel),
    ("program", _stage_program),
    ("binary", _stage_binary),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spyre-compile",
        description="Compile a PyTorch model for Spyre, stopping at the stage named by --emit.",
    )
    p.add_argument("model", help="torch.export archive (.pt2/.pt), TorchScript file, or pickle (--trust-pickle)")
    p.add_argument(
        "--emit",
        choices=[name for name, _ in STAGES],
        default="binary",
        help="stage whose output to print or write (default: %(default)s)",
    )
    p.add_argument("-o", "--output", help="write the output here (atomically) instead of stdout")
    p.add_argument(
        "--input-shape",
        action="append",
        metavar="SHAPE",
        help="shape and element type of one input, e.g. 1x3x224x224xf32 or 1x16xi64; repeat once per input "
        "(needed by TorchScript files without stored inputs and by pickles)",
    )
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow loading a whole-module torch.save pickle (unpickling runs code from the file)",
    )
    p.add_argument("--dump-dir", help="keep every stage's IR here, and a reproducer when a stage fails")
    p.add_argument("--mlir-print-debuginfo", action="store_true",
                   help="print the IR on stdout with its locations (the model's source lines); IR written "
                   "with -o always keeps them: a stage's file is a complete input to the next, whose "
                   "diagnostics and binary debug info keep pointing at the model")
    p.add_argument("--precision", default="dlf16", choices=["dlf16", "fp8", "int8-weights", "fp32-reference"],
                   help="number formats of device tensors (kernel stage on; default: %(default)s)")
    p.add_argument("--cores", type=int, help="cores to use (default: all cores of the target)")
    p.add_argument("--cards", type=int, help="cards of the system to place the model over (default: the target's "
                   "system.cards, 1); with more, one binary holds every card's program and the schedule between them")
    p.add_argument("--placement-plan-out", metavar="PLAN.json", help="write the multi-card placement plan here")
    p.add_argument("--placement-plan", metavar="PLAN.json", help="force this placement plan (as written by "
                   "--placement-plan-out, edited)")
    p.add_argument("--target", metavar="FILE", help="target description TOML (default: the packaged card)")
    p.add_argument("--placement-report", action="store_true",
                   help="print which ops run on the device, which on the host and why, and which are computed "
                   "while compiling (after the kernel stage, or the spyre stage with --emit=spyre)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.emit == "binary" and not args.output:
        # Like a C compiler's a.out: the binary lands beside the user, named after the model.
        args.output = os.path.splitext(os.path.basename(args.model))[0] + ".spyre"
    from spyre_mlir.target import TargetError, load_target

    try:
        target = load_target(args.target)
    except TargetError as e:
        print(f"spyre-compile: error: {e}", file=sys.stderr)
        return 2
    if args.cores is not None and not 1 <= args.cores <= target.max_cores:
        print(f"spyre-compile: error: --cores {args.cores} is impossible: the target ({target.name}) has "
              f"1..{target.max_cores} cores", file=sys.stderr)
        return 2
    if args.cards is not None and not 1 <= args.cards <= target.cards_per_host:
        print(f"spyre-compile: error: --cards {args.cards} is impossible: the target ({target.name}) has "
              f"1..{target.cards_per_host} cards", file=sys.stderr)
        return 2
    # torch and torch.export warn about their own internals (deprecations); users cannot act on those.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")

    from spyre_mlir.frontend.errors import FrontendError, StageError

    stages = STAGES[: [name for name, _ in STAGES].index(args.emit) + 1]
    job = Job(args)
    job.target = target.with_cores(args.cores or target.max_cores).with_cards(args.cards or target.num_cards)
    progress = _Progress(len(stages))
    ir_text = None
    dumped = None    # with --dump-dir: the last stage's output as text, the next stage's input for a reproducer
    for index, (name, stage) in enumerate(stages, start=1):
        progress.start(index, name)
        try:
            ir_text = stage(job, ir_text)
        except FrontendError as e:
            progress.fail(index, name)
            # A StageError is the compiler's failure: keep a reproducer. Any other FrontendError is about the
            # input (unreadable file, missing shapes): the message says what to do, exit 2.
            if isinstance(e, StageError) and args.dump_dir:
                _write_reproducer(args, index, name, e.input_ir if e.input_ir is not None else dumped, e)
            print(f"spyre-compile: error: {e}", file=sys.stderr)
            return 1 if isinstance(e, StageError) else 2
        except BaseException as e:
            # A bug: keep the reproducer, then let the traceback through.
            progress.fail(index, name)
            if args.dump_dir and not isinstance(e, KeyboardInterrupt):
                _write_reproducer(args, index, name, dumped, e)
            raise
        progress.done(index, name)
        if args.dump_dir and name != "binary":
            ext = "txt" if name == "program" else "mlir"
            dumped = _text(job, ir_text, True)
            _write_atomic(os.path.join(args.dump_dir, f"{index:02d}-{name}.{ext}"), dumped)

    if args.emit == "binary":
        sys.stderr.write(ir_text)
        return 0
    ir_text = _text(job, ir_text, args.mlir_print_debuginfo or bool(args.output) or args.emit == "program")
    if args.output:
        _write_atomic(args.output, ir_text)
    else:
        sys.stdout.write(ir_text)
    return 0


def _text(job: Job, out, debuginfo: bool) -> str:
    """A stage's output as text: a module printed (with its resources), frontend IR with or without locations."""
    if not isinstance(out, str):
        with job.context:
            return out.operation.get_asm(enable_debug_info=debuginfo, large_elements_limit=None)
    return out if debuginfo else _without_locations(out)


def _without_locations(text: str) -> str:
    """Stages hand each other IR with the model's source locations; users read it without, like mlir-opt."""
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    from spyre_mlir.context import make_context

    with make_context() as ctx:
        torch_d.register_dialect(ctx)
        return ir.Module.parse(text).operation.get_asm(large_elements_limit=None)


def _write_atomic(path: str, text: str) -> None:
    """Write via a temporary file in the same directory and os.replace, so readers never see half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _write_reproducer(args, index: int, name: str, input_ir: str | None, error: Exception) -> None:
    """Write the failing stage's input IR and a shell script with the exact command that fails again."""
    stem = os.path.join(args.dump_dir, f"{index:02d}-{name}")
    pipeline = getattr(error, "pipeline", None)
    if pipeline and input_ir is not None:
        input_path = os.path.abspath(stem + ".input.mlir")
        _write_atomic(input_path, input_ir)
        tool = "spyre-opt" if "spyre-" in pipeline else "torch-mlir-opt"
        command = shlex.join([tool, f"--pass-pipeline={pipeline}", input_path])
    else:
        # The failure is in Python (loading, export, FX import): rerun the compiler itself on the model.
        command = [
            "spyre-compile", os.path.abspath(args.model), f"--emit={name}",
            *(f"--input-shape={s}" for s in args.input_shape or []),
            *(["--trust-pickle"] if args.trust_pickle else []),
        ]
        command = shlex.join(command)
    script = f"#!/bin/sh\n# spyre-compile stage {name!r} failed:\n" + "".join(
        f"#   {line}\n" for line in str(error).splitlines()[:20]
    ) + command + "\n"
    _write_atomic(stem + ".repro.sh", script)
    os.chmod(stem + ".repro.sh", 0o755)


class _Progress:
    """One line per stage on stderr (rich spinner while it runs); silent when stderr is not a terminal, so
    pipes, logs and tests see only real output and errors."""

    def __init__(self, total: int):
        self.total = total
        self.console = None
        self.status = None
        if sys.stderr.isatty():
            from rich.console import Console

            self.console = Console(stderr=True)

    def start(self, index: int, name: str) -> None:
        self.t0 = time.perf_counter()
        if self.console:
            self.status = self.console.status(f"[{index}/{self.total}] {name}")
            self.status.start()

    def _end(self, index: int, name: str, mark: str) -> None:
        if self.console:
            self.status.stop()
            self.console.print(f"{mark} [{index}/{self.total}] {name} ({time.perf_counter() - self.t0:.2f}s)")

    def done(self, index: int, name: str) -> None:
        self._end(index, name, "[green]ok[/green]")

    def fail(self, index: int, name: str) -> None:
        self._end(index, name, "[red]failed[/red]")


if __name__ == "__main__":
    sys.exit(main())
