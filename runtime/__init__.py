"""Spyre runtime: the .spyre binary, its validating loader, the emulator, cycle model and traces.

Importing this package is cheap (numpy and ml_dtypes only; torch is never imported here): tools that only
run binaries start fast. Entry points:

* :func:`load` / :func:`load_bytes` -> :class:`Executable` (call it with inputs; ``.profile`` afterwards)
* :class:`ProgramBuilder` to assemble programs (tests, and the compiler's ``spyre-emit``)
* :class:`BinaryFormatError` for every malformed file, :class:`SpyreRuntimeError` for data-dependent failures
"""

from .assembler import ProgramBuilder, Tile
from .binary import BinaryFormatError, Program
from .cycles import Profile
from .emulator import SpyreRuntimeError
from .hostops import register_host_function
from .loader import Executable, InputError, load, load_bytes
from .trace import chrome_trace, write_trace

__all__ = ["load", "load_bytes", "Executable", "ProgramBuilder", "Tile", "Program", "Profile",
           "BinaryFormatError", "SpyreRuntimeError", "InputError", "register_host_function",
           "chrome_trace", "write_trace"]
