"""Spyre runtime: the .spyre binary, its validating loader, the emulator, cycle model and traces.

Importing this package is cheap (numpy only; ml_dtypes at the first fp8 or bfloat16 conversion; torch
is never imported here): tools that only
run binaries start fast. Entry points:

* :func:`load` / :func:`load_bytes` -> :class:`Executable` (call it with inputs; ``.profile`` afterwards), or a
  :class:`Bundle` of them for a file with several entries (shared constants, persistent state)
* :func:`link` joins programs into one file with entries
* :class:`ProgramBuilder` to assemble programs (tests, and the compiler's ``spyre-emit``)
* :class:`BinaryFormatError` for every malformed file, :class:`SpyreRuntimeError` for data-dependent failures
"""

import importlib

# Submodules load on first use, so the compiler can read the instruction tables (runtime.isa, runtime.formats)
# without importing the loader and emulator.
_EXPORTS = {
    "ProgramBuilder": "assembler", "Tile": "assembler", "BinaryFormatError": "binary", "Program": "binary",
    "Profile": "cycles", "SpyreRuntimeError": "emulator", "register_host_function": "hostops",
    "Executable": "loader", "Bundle": "loader", "InputError": "loader", "load": "loader", "load_bytes": "loader",
    "link": "link",
    "chrome_trace": "trace", "write_trace": "trace",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
