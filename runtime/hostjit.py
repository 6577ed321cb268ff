"""Host code: the host functions a binary carries (``metadata.host_code``), JIT-compiled once at load.

The compiler lowered them to the LLVM dialect (:mod:`spyre_mlir.codegen.hostcode`) and chose the LLVM
optimization level the JIT compiles them at (module attribute ``spyre.opt_level``, 2 when absent: 0 for
functions that run few operations a call, where LLVM's optimizations cost more than they save); each is
``_mlir_ciface_<fn>(in0*, ..., out0*, ...)`` taking one memref descriptor per argument, inputs first, results
written in place. Here the text is parsed and handed to MLIR's ExecutionEngine (bundled with torch-mlir), and
every ``jit`` host op gets a :class:`HostCall` with its staging arrays and descriptors built once, so a call
only converts data in, calls native code and converts data out.
"""

from __future__ import annotations

import ctypes

import numpy as np

from spyre_mlir.errors import SpyreError

__all__ = ["HostCode", "HostCall", "HostCodeError", "host_dtype"]


class HostCodeError(SpyreError, ValueError):
    """The host code section cannot be used (does not parse, names a missing function, bad dtypes)."""


def host_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise HostCodeError(f"unknown dtype {name!r:.40}") from None


class HostCode:
    """Parsed and JIT-compiled host functions of one binary."""

    def __init__(self, text: str):
        try:
            from torch_mlir import ir
            from torch_mlir.execution_engine import ExecutionEngine
        except ImportError as e:  # pragma: no cover - torch-mlir is a dependency
            raise HostCodeError(f"running host code needs torch-mlir's ExecutionEngine: {e}") from None
        self._context = ir.Context()
        try:
            module = ir.Module.parse(text, self._context)
        except ir.MLIRError as e:
            raise HostCodeError(f"host code does not parse: {str(e).splitlines()[0]}") from None
        self.functions = set()
        for op in module.body.operations:
            if op.operation.name == "llvm.func":
                name = ir.StringAttr(op.operation.attributes["sym_name"]).value
                if name.startswith("_mlir_ciface_"):
                    self.functions.add(name[len("_mlir_ciface_"):])
        attrs = module.operation.attributes
        self.asserts = [ir.StringAttr(m).value for m in ir.ArrayAttr(attrs["spyre.asserts"])] \
            if "spyre.asserts" in attrs else []
        self.failed: list[int] = []
        level = 2
        if "spyre.opt_level" in attrs:
            attr = attrs["spyre.opt_level"]
            if not isinstance(attr, ir.IntegerAttr) or ir.IntegerAttr(attr).value not in range(4):
                raise HostCodeError(f"spyre.opt_level must be an integer 0 to 3, not {str(attr)[:40]}")
            level = ir.IntegerAttr(attr).value
        try:
            self._engine = ExecutionEngine(module, opt_level=level)
        except Exception as e:  # the engine reports LLVM failures as plain exceptions
            raise HostCodeError(f"host code does not compile: {type(e).__name__}: {e}") from None
        if self.asserts:
            # Failed checks in host code call back here instead of aborting the process.
            self._on_assert = ctypes.CFUNCTYPE(None, ctypes.c_int64)(self._assert_failed)
            self._engine.register_runtime("spyre_host_assert", self._on_assert)
        self._module = module

    def _assert_failed(self, k: int) -> None:
        self.failed.append(k)

    def call(self, fn: str, in_dtypes: list, out_dtypes: list, in_shapes: list, out_shapes: list) -> "HostCall":
        if fn not in self.functions:
            raise HostCodeError(f"host function {fn!r:.60} is not in the host code")
        return HostCall(self, fn, [np.zeros(tuple(s), host_dtype(d)) for s, d in zip(in_shapes, in_dtypes)],
                        [np.zeros(tuple(s), host_dtype(d)) for s, d in zip(out_shapes, out_dtypes)])


class HostCall:
    """One host function bound to staging arrays and their descriptors (built once): ``run(args)`` copies the
    arguments in (converting dtype), calls the native code and returns the result arrays (reused by the next
    run)."""

    def __init__(self, code: HostCode, fn: str, ins: list[np.ndarray], outs: list[np.ndarray]):
        self.code, self.fn, self.ins, self.outs = code, fn, ins, outs
        self._descriptors = [_descriptor(a) for a in ins + outs]     # kept alive: the pointers refer to them
        self._ptrs = [ctypes.pointer(ctypes.pointer(d)) for d in self._descriptors]

    def run(self, args: list[np.ndarray]) -> list[np.ndarray]:
        for dst, a in zip(self.ins, args):
            np.copyto(dst, np.reshape(a, dst.shape), casting="unsafe")
        self.code.failed.clear()
        self.code._engine.invoke(self.fn, *self._ptrs)
        if self.code.failed:
            k = self.code.failed[0]
            raise HostCodeError(self.code.asserts[k] if 0 <= k < len(self.code.asserts) else f"check {k} failed")
        return self.outs


_DESCRIPTORS: dict[int, type] = {}


def _descriptor(a: np.ndarray):
    """A ranked memref descriptor over ``a``'s memory (element type does not matter to its layout)."""
    rank = a.ndim
    cls = _DESCRIPTORS.get(rank)
    if cls is None:
        fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_longlong)]
        if rank:
            fields += [("sizes", ctypes.c_longlong * rank), ("strides", ctypes.c_longlong * rank)]
        cls = _DESCRIPTORS[rank] = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
    d = cls()
    d.allocated = d.aligned = a.ctypes.data
    d.offset = 0
    if rank:
        d.sizes = (ctypes.c_longlong * rank)(*a.shape)
        d.strides = (ctypes.c_longlong * rank)(*[s // a.itemsize if a.itemsize else 0 for s in a.strides])
    return d
