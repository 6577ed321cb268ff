"""Torch-MLIR's torch -> linalg lowering, run in a helper process that outlives one compile.

Torch-MLIR's TorchToLinalg dies of native signals on some valid programs (a segfault building 8-bit scalar ops
or integer max-pooling, a SIGFPE folding an integer division by a zero-sized dimension). In-process that ends
the user's Python session, so the stage runs in a child: a crash becomes a :class:`StageError` naming the
signal, and the next compile starts a fresh child. The child imports only torch_mlir (no torch) and serves one
request at a time over its stdin/stdout, so a compile pays the IPC, not a process start (~0.3 s, once).

    python -m spyre_mlir.frontend.lowering     # the child; requests and replies are length-prefixed JSON
"""

from __future__ import annotations

import atexit
import json
import struct
import subprocess
import sys
import threading

from .errors import StageError, mlir_error_detail

_HEADER = struct.Struct("<Q")


def _send(stream, obj) -> None:
    data = json.dumps(obj).encode()
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    return json.loads(stream.read(n))


class _Child:
    """The helper process, started on first use and again after it dies."""

    def __init__(self):
        self.proc = None
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, ir_text: str, pipeline: str) -> str:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            try:
                _send(self.proc.stdin, {"ir": ir_text, "pipeline": pipeline})
                reply = _receive(self.proc.stdout)
            except (BrokenPipeError, OSError):
                reply = None
            if reply is None:
                code = self.proc.wait()
                self.proc = None
                what = f"signal {-code}" if code < 0 else f"exit status {code}"
                raise StageError(f"the linalg stage failed: Torch-MLIR's lowering crashed ({what}) on this program",
                                 input_ir=ir_text, pipeline=pipeline)
        if not reply["ok"]:
            raise StageError(f"the linalg stage failed: {reply['error']}", input_ir=ir_text, pipeline=pipeline)
        return reply["ir"]


_CHILD = _Child()


def lower(ir_text: str, pipeline: str) -> str:
    """Run ``pipeline`` on torch-dialect IR text in the helper process; returns the resulting IR text (with
    locations). Raises StageError with the diagnostics, or naming the signal if Torch-MLIR crashed."""
    return _CHILD.run(ir_text, pipeline)


def _serve() -> None:
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.passmanager import PassManager

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (req := _receive(stdin)) is not None:
        context = ir.Context()
        torch_d.register_dialect(context)
        errors: list[str] = []

        def collect(d, errors=errors):
            if d.severity == ir.DiagnosticSeverity.ERROR:
                errors.append(f"{d.location}: {d.message}")
            return True

        context.attach_diagnostic_handler(collect)
        try:
            module = ir.Module.parse(req["ir"], context)
            with context:
                PassManager.parse(req["pipeline"]).run(module.operation)
            reply = {"ok": True, "ir": module.operation.get_asm(large_elements_limit=None, enable_debug_info=True)}
        except ir.MLIRError as e:
            reply = {"ok": False, "error": "\n".join(errors[:5]) or mlir_error_detail(str(e))}
        _send(stdout, reply)


if __name__ == "__main__":
    _serve()
