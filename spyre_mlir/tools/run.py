"""spyre-run: load a .spyre binary, run it on the emulator, save outputs, report the modeled profile.

    spyre-run model.spyre --inputs in.npz -o out.npz [--profile] [--json] [--trace t.json]
              [--numerics faithful|fp32-reference] [--target FILE]
    spyre-run model.spyre --disassemble

Inputs are matched by name (npz keys equal to the program's input names), else by order. Outputs are saved
as output_0, output_1, ..., and state the model updates in place under its name, ``<buffer>.updated`` (feed it
back as the input ``<buffer>`` of the next call). Errors print one line ``spyre-run: error: ...``
and exit 1 (2 for usage errors).
Only numpy, the runtime and (for --profile) rich are imported: no torch, so start-up stays fast.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import zipfile

import numpy as np

PROG = "spyre-run"


class _Parser(argparse.ArgumentParser):
    def error(self, message):     # usage errors: one line after the usage, exit 2
        self.print_usage(sys.stderr)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Run a .spyre binary on the Spyre emulator.")
    p.add_argument("model", help="the .spyre file")
    p.add_argument("-i", "--inputs", help=".npz with the inputs (by name, else in order)")
    p.add_argument("-o", "--output", help="write outputs to this .npz, by output name (output_0, ..., <buffer>.updated)")
    p.add_argument("--profile", action="store_true", help="print the modeled profile as a table")
    p.add_argument("--json", action="store_true", help="print outputs summary and profile as JSON")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    p.add_argument("--numerics", choices=("faithful", "fp32-reference"), default=None,
                   help="default: what the binary was compiled for")
    p.add_argument("--target", help="target TOML file (default: the packaged Spyre target)")
    p.add_argument("--entry", help="the entry to run, in a file with several (prefill, decode, ...); state "
                                   "starts at zero")
    p.add_argument("--disassemble", action="store_true",
                   help="list buffers and instructions (container checks only) instead of running")
    return p


def disassemble(path: str) -> str:
    """Readable listing of a binary (container checks only, so half-valid files can still be inspected)."""
    from spyre_mlir.runtime.assembler import listing
    from spyre_mlir.runtime.binary import is_system, program_from_bytes
    from spyre_mlir.runtime.system import system_from_bytes

    with open(path, "rb") as f:
        data = f.read()
    if not is_system(data):
        return f"// {path}\n" + listing(program_from_bytes(data))
    sys_, progs = system_from_bytes(data)
    out = [f"// {path}: a system of {len(progs)} cards\n// schedule: {json.dumps(sys_.meta['calls'])}\n"]
    for c, p in enumerate(progs):
        out += [f"// ---- card {c}, entry {e.name}\n" + listing(p.entry_program(e.name)) for e in p.entries]
    return "".join(out)


def _inputs(exe, path: str | None) -> list[np.ndarray]:
    """Arrays for the program's inputs from an npz: by name if every name is there, else by order."""
    names = exe.input_names
    if path is None:
        if names:
            raise ValueError(f"missing input '{names[0]}' (the program takes {', '.join(names)}; use --inputs)")
        return []
    with np.load(path, allow_pickle=False) as npz:
        data = {k: npz[k] for k in npz.files}
    if all(n in data for n in names):
        return [data[n] for n in names]
    if len(data) == len(names):
        return list(data.values())
    missing = next(n for n in names if n not in data)
    raise ValueError(f"missing input '{missing}' ({path} has {', '.join(data) or 'no arrays'}; "
                     f"the program takes {', '.join(names)})")


def _save(path: str, names, outs) -> None:
    from spyre_mlir.runtime.binary import atomic_write
    buf = io.BytesIO()
    # Results are output_0, output_1, ...; state a model updates in place keeps its name (<buffer>.updated).
    np.savez(buf, **{n if n.endswith(".updated") else f"output_{i}": o for i, (n, o) in enumerate(zip(names, outs))})
    atomic_write(path, buf.getvalue())


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def print_profile(profile, file=None) -> None:
    """The profile as rich tables: summary, then busy cycles per core and unit."""
    from rich.console import Console
    from rich.table import Table

    from spyre_mlir.runtime.cycles import UNITS

    con = Console(file=file or sys.stdout, width=110)
    t = Table(title=f"Modeled run on '{profile.target}' ({profile.num_cores} cores, {profile.clock_ghz} GHz)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("modeled latency", f"{profile.cycles:,.0f} cycles = {profile.seconds * 1e6:,.2f} us"),
        ("emulator wall time", f"{profile.wall_seconds * 1e3:,.2f} ms" if profile.wall_seconds else "-"),
        *[(f"utilization {u}", f"{v:6.1%}") for u, v in profile.utilization.items()],
        ("limiting unit", profile.limiter),
        ("DRAM read / write", f"{_si(profile.dram_read_bytes, 'B')} / {_si(profile.dram_write_bytes, 'B')}"),
        ("ring / host bytes", f"{_si(profile.ring_bytes, 'B')} / {_si(profile.host_bytes, 'B')}"),
        ("PT MACs (padded)", f"{profile.pt_macs:,} ({profile.pt_padded_macs:,})"),
        ("achieved / peak", f"{_si(profile.achieved_flops, 'FLOP/s')} / {_si(profile.peak_flops, 'FLOP/s')}"),
        ("intensity / ridge", f"{profile.intensity:,.1f} / {profile.ridge:,.1f} FLOP/B"),
        ("roofline bound", profile.bound),
        ("scratchpad peak", f"{_si(profile.scratchpad_peak_bytes, 'B')} per core (of "
                            f"{_si(profile.usable_scratchpad_bytes, 'B')} usable)"
         if profile.usable_scratchpad_bytes else _si(profile.scratchpad_peak_bytes, 'B')),
    ]
    for r in rows:
        t.add_row(*r)
    con.print(t)
    per = Table(title="Busy cycles per core and unit")
    per.add_column("core", justify="right")
    for u in UNITS:
        per.add_column(u, justify="right")
    idle = [c for c, row in enumerate(profile.busy) if not any(row)]
    for c, row in enumerate(profile.busy):
        if any(row):
            per.add_row(str(c), *[f"{v:,.0f}" for v in row])
    if idle:
        per.caption = f"{len(idle)} idle core(s) not shown: {_ranges(idle)}"
    con.print(per)


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], ids[0]
    for prev, cur in zip(ids, ids[1:] + [None]):
        if cur != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ", ".join(out)


def main(argv=None) -> int:
    """Entry point of the console script; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from spyre_mlir.runtime import SpyreRuntimeError, load, write_trace

    try:
        if args.disassemble:
            print(disassemble(args.model), end="")
            return 0
        exe = load(args.model, target=args.target, numerics=args.numerics)
        if hasattr(exe, "entries"):       # a Bundle (a SystemExecutable runs as one)
            if args.entry is None:
                raise ValueError(f"{args.model} has entries {', '.join(exe.entries)}: choose one with --entry")
            exe = exe[args.entry]
        elif args.entry is not None:
            raise ValueError(f"{args.model} has a single program: --entry applies to files with several")
        outs = exe(*_inputs(exe, args.inputs))
        if args.output:
            _save(args.output, exe.output_names, outs)
        if args.trace:
            if hasattr(exe.profile, "num_cards"):
                from spyre_mlir.runtime.system import write_trace as write_system_trace

                write_system_trace(exe.profile, args.trace)
            else:
                write_trace(exe.profile, args.trace)
    except BrokenPipeError:       # e.g. `spyre-run --disassemble m.spyre | head`: the reader left, fine
        _quiet_stdout()
        return 0
    except (ValueError, OSError, SpyreRuntimeError, KeyError, EOFError, zipfile.BadZipFile) as e:
        msg = str(e) if not isinstance(e, OSError) or not e.strerror else f"{e.filename}: {e.strerror}"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 1
    except Exception as e:   # a bug in the runtime: still one line, but say so
        print(f"{PROG}: error: internal error: {e.__class__.__name__}: {e}", file=sys.stderr)
        return 1
    try:
        _report(args, exe, outs)
    except BrokenPipeError:
        _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on a closed pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _report(args, exe, outs) -> None:
    """Print what the user asked for: JSON, or one line per output and optionally the profile table."""
    if args.json:
        doc = {"outputs": [{"name": n, "shape": list(o.shape), "dtype": str(o.dtype)}
                           for n, o in zip(exe.output_names, outs)],
               "numerics": exe.numerics, "profile": exe.profile.to_dict()}
        print(json.dumps(doc, indent=2))
    else:
        for i, (n, o) in enumerate(zip(exe.output_names, outs)):
            print(f"output_{i} ({n}): shape {tuple(o.shape)} {o.dtype}")
        if args.profile:
            if hasattr(exe.profile, "num_cards"):
                print_system_profile(exe.profile)
            else:
                print_profile(exe.profile)


def print_system_profile(profile, file=None) -> None:
    """A system's profile: the modeled latency, then per card its busy time and per link its transfers."""
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file or sys.stdout, width=110)
    us = 1.0 / (profile.clock_ghz * 1e3)
    t = Table(title=f"Modeled run on {profile.num_cards} x '{profile.target}' ({profile.num_cores} cores each, "
                    f"{profile.clock_ghz} GHz): {profile.cycles:,.0f} cycles = {profile.seconds * 1e6:,.2f} us")
    for col in ("card", "busy cycles", "busy", "calls", "link bytes sent", "link busy cycles", "link utilization"):
        t.add_column(col, justify="right")
    for c in range(profile.num_cards):
        t.add_row(str(c), f"{profile.card_busy[c]:,.0f}",
                  f"{profile.card_busy[c] / profile.cycles:.1%}" if profile.cycles else "-",
                  str(sum(1 for call in profile.calls if call[0] == c)), _si(profile.link_bytes[c], "B"),
                  f"{profile.link_busy[c]:,.0f}", f"{profile.link_utilization[c]:.1%}")
    con.print(t)
    con.print(f"{len(profile.transfers)} transfers over the link, {sum(profile.link_bytes):,} bytes; "
              f"{profile.cycles * us:,.2f} us modeled, emulator wall time "
              f"{(profile.wall_seconds or 0) * 1e3:,.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
