"""spyre-opt: parse spyre/MLIR IR, run a pass pipeline, print the result. Behaves like mlir-opt.

Keep this module free of torch and the frontend: every lit test starts it, so start-up time multiplies.
"""

import argparse
import os
import re
import sys
import tempfile

_LOC = re.compile(r'"([^"]*)":(\d+):(\d+)')
_EXPECT = re.compile(r"expected-(error|warning|note|remark)\s*(@[+-]?\w+)?\s*\{\{(.*?)\}\}")
_SPLIT = re.compile(r"^// -----\s*$", re.M)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spyre-opt", description="Run spyre and upstream MLIR passes on IR.")
    p.add_argument("input", nargs="?", default="-", help="input file ('-' for stdin)")
    p.add_argument("-o", dest="output", default="-", help="output file ('-' for stdout)")
    p.add_argument("--pass-pipeline", "-p", dest="pipeline", default="",
                   help="e.g. 'builtin.module(canonicalize,spyre-convert-linalg,cse)'")
    p.add_argument("--split-input-file", action="store_true", help="split the input on '// -----' lines")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics against expected-error/warning/note/remark comments")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print every op in generic form")
    p.add_argument("--list-passes", action="store_true", help="list spyre and upstream passes, then exit")
    p.add_argument("--timing", "--mlir-timing", action="store_true", help="report the time of every pass")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `spyre-opt ... | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.list_passes:
        return _list_passes()
    try:
        text = sys.stdin.read() if args.input == "-" else open(args.input, encoding="utf-8").read()
    except OSError as e:
        print(f"spyre-opt: error: cannot read '{args.input}': {e.strerror}", file=sys.stderr)
        return 1
    filename = "<stdin>" if args.input == "-" else args.input

    from spyre_mlir.passes.manager import PipelineError, build_pass_manager, parse_pipeline
    try:
        elements = parse_pipeline(args.pipeline) if args.pipeline else []
    except PipelineError as e:
        print(f"spyre-opt: error: {e}", file=sys.stderr)
        return 1

    chunks = _split(text) if args.split_input_file else [(0, text)]
    outputs, ok = [], True
    for first_line, chunk in chunks:
        out, chunk_ok = _process(chunk, first_line, filename, elements, args, build_pass_manager, PipelineError)
        ok &= chunk_ok
        if out is not None:
            outputs.append(out)
    result = "// -----\n".join(outputs)
    if not _write(args.output, result):
        return 1
    return 0 if ok else 1


def _split(text: str) -> list[tuple[int, str]]:
    """Chunks with the line (0-based) each starts on, so diagnostics keep the file's line numbers."""
    chunks, start, line = [], 0, 0
    for m in _SPLIT.finditer(text):
        chunks.append((line, text[start:m.start()]))
        line += text.count("\n", start, m.end()) + 1
        start = m.end() + 1
    chunks.append((line, text[start:]))
    return chunks


def _process(chunk, first_line, filename, elements, args, build_pass_manager, PipelineError):
    """Parse and transform one chunk. Returns (printed IR or None, success)."""
    from torch_mlir import ir

    from spyre_mlir import params
    from spyre_mlir.context import make_context

    ctx = make_context()
    diags: list[tuple[str, int, str]] = []  # severity, line, message
    collect = args.verify_diagnostics

    def handler(d):
        _record(d, diags)
        return collect  # handled: do not print it a second time
    ctx.attach_diagnostic_handler(handler)

    padded = "\n" * first_line + chunk
    with ctx:
        module = None
        try:
            module = params.parse(padded)   # keeps the bytes of parameter resources for spyre-emit
            if elements:
                pm = build_pass_manager(elements, ctx)
                if args.mlir_print_ir_after_all:
                    pm.enable_ir_printing(print_after_all=True, enable_debug_info=args.mlir_print_debuginfo)
                if args.timing:
                    pm.enable_timing()
                pm.run(module.operation)
        except ir.MLIRError as e:
            for d in e.error_diagnostics:
                _record(d, diags)
            if not collect:
                _print_diags(e.error_diagnostics, filename)
                return None, False
            return None, _verify(chunk, first_line, diags, filename)
        except PipelineError as e:
            print(f"spyre-opt: error: {e}", file=sys.stderr)
            return None, False
        if collect:
            return None, _verify(chunk, first_line, diags, filename)
        out = module.operation.get_asm(enable_debug_info=args.mlir_print_debuginfo,
                                       print_generic_op_form=args.mlir_print_op_generic)
        return out.replace('"-":', f'"{filename}":') if args.mlir_print_debuginfo else out, True


_SEVERITY = {"DiagnosticSeverity.ERROR": "error", "DiagnosticSeverity.WARNING": "warning",
             "DiagnosticSeverity.NOTE": "note", "DiagnosticSeverity.REMARK": "remark"}


def _severity(d) -> str:
    return _SEVERITY.get(str(d.severity), str(d.severity).rsplit(".", 1)[-1].lower())


def _line(loc) -> int:
    m = _LOC.search(str(loc))
    return int(m.group(2)) if m else 0


def _record(d, diags) -> None:
    entry = (_severity(d), _line(d.location), d.message)
    if entry not in diags:
        diags.append(entry)
    for note in d.notes:
        _record(note, diags)


def _where(loc, filename) -> str:
    m = _LOC.search(str(loc))
    return f"{filename}:{m.group(2)}:{m.group(3)}" if m else filename


def _print_diags(ds, filename, indent="") -> None:
    for d in ds:
        print(f"{indent}{_where(d.location, filename)}: {_severity(d)}: {d.message}", file=sys.stderr)
        _print_diags(d.notes, filename, indent)


def _expectations(chunk: str, first_line: int) -> list[list]:
    """[severity, line, text, matched] for each expected-* comment of the chunk."""
    out = []
    lines = chunk.split("\n")
    for i, line in enumerate(lines):
        for m in _EXPECT.finditer(line):
            kind, at, msg = m.group(1), m.group(2), m.group(3)
            lineno = first_line + i + 1
            if at in ("@above", "@below"):
                step = -1 if at == "@above" else 1
                j = i + step
                while 0 <= j < len(lines) and "expected-" in lines[j]:
                    j += step
                lineno = first_line + j + 1
            elif at:
                lineno += int(at[1:])
            out.append([kind, lineno, msg, False])
    return out


def _verify(chunk, first_line, diags, filename) -> bool:
    expected = _expectations(chunk, first_line)
    ok = True
    for sev, line, msg in diags:
        hit = next((e for e in expected if not e[3] and e[0] == sev and e[1] == line and e[2] in msg), None)
        if hit:
            hit[3] = True
        elif sev != "note":  # like mlir-opt with printOpOnDiagnostic off, stray notes are not failures
            print(f"{filename}:{line}: error: unexpected {sev}: {msg}", file=sys.stderr)
            ok = False
    for sev, line, msg, matched in expected:
        if not matched:
            print(f"{filename}:{line}: error: expected {sev} \"{msg}\" was not produced", file=sys.stderr)
            ok = False
    return ok


def _write(path: str, text: str) -> bool:
    if path == "-":
        sys.stdout.write(text)
        return True
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".spyre-opt-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        return True
    except OSError as e:
        print(f"spyre-opt: error: cannot write '{path}': {e.strerror}", file=sys.stderr)
        return False


def _list_passes() -> int:
    from spyre_mlir import passes

    print("Spyre passes:")
    for name in passes.pass_names():
        cls = passes.get_pass_class(name)
        print(f"  {name:32} {cls.SUMMARY}")
        for f in cls.options():
            print(f"    {f.name.replace('_', '-'):30} {f.type if isinstance(f.type, str) else f.type.__name__}"
                  f" (default {f.default})")
    print("Upstream passes:")
    for name, summary in _upstream_passes():
        print(f"  {name:32} {summary}")
    return 0


def _upstream_passes() -> list[tuple[str, str]]:
    """Upstream pass names, read from the help of the torch-mlir-opt bundled with the same MLIR build."""
    import subprocess

    from torch_mlir import _mlir_libs

    exe = os.path.join(os.path.dirname(_mlir_libs.__file__), "torch-mlir-opt")
    try:
        text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    section = text.split("Passes:", 1)[-1].split("Pass Pipelines:", 1)[0]
    found = {}
    for m in re.finditer(r"^ {6}--([\w.-]+)\s+-\s+(.*)$", section, re.M):
        found.setdefault(m.group(1), m.group(2).strip())
    return sorted(found.items())


if __name__ == "__main__":
    sys.exit(main())
