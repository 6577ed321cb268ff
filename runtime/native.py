"""Native DLFloat16 conversions for the emulator's hot path, compiled from MLIR by the JIT torch-mlir bundles.

Every tile a unit writes is rounded to its format and every tile it reads is decoded; in numpy each is a few
passes over the tile plus a table gather through 8-byte indices (~2 ns an element, a third of a decoder
block's emulation). Here each is one loop over strided memrefs in vectors of 16 lanes, written in ``arith``
on the bits (the same steps as :func:`formats._dlf16_encode_bits` and :func:`formats._dlf16_decode_bits`, the
definitions) and lowered with upstream passes (~0.25 ns an element), reading and writing the tile's strided
views in place. It is compiled once per process at the first conversion, without LLVM's optimizations
(~0.03 s, and ~0.06 s for torch-mlir's import).

The formats module stays the definition: tests compare these kernels with it on every fp32 rounding class
and every DLFloat16 pattern. ``SPYRE_EMU_NATIVE=0`` turns them off (numpy tables instead: same bits).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import threading

import numpy as np

from .formats import DLF16_BIAS, DLF16_MAX, DLF16_NAN_BITS

__all__ = ["available", "Dlf16Tile", "descriptor"]

_RANK = 4
_LANES = 16                    # one AVX-512 register of float32, two of AVX2
_FIELDS = 3 + 2 * _RANK        # a ranked memref descriptor: allocated, aligned, offset, sizes, strides


def _kernel(name: str, src: str, dst: str, body: list[str]) -> str:
    """An elementwise function ``name(src memref, dst memref)`` over 4-D memrefs whose innermost stride is one
    element (any others); ``body`` maps ``%x`` (loaded ``src`` elements) to ``%y`` (stored to ``dst``) in
    vectors of ``_LANES``. Each row runs whole vectors, then its tail as one masked vector. Written in vectors,
    the module needs no LLVM optimization: at opt level 0 it compiles in ~0.03 s (LLVM's loop vectorizer
    took ~0.18 s over the scalar loops) and runs as fast."""
    def t(elem):
        return f"memref<?x?x?x?x{elem}, strided<[?, ?, ?, 1], offset: ?>>"
    idx = "%i0, %i1, %i2"
    lines = [f"func.func @{name}(%src: {t(src)}, %dst: {t(dst)}) attributes {{llvm.emit_c_interface}} {{",
             "%one = arith.constant 1 : index", f"%lanes = arith.constant {_LANES} : index"]
    for d in range(_RANK):
        lines += [f"%c{d} = arith.constant {d} : index", f"%n{d} = memref.dim %src, %c{d} : {t(src)}"]
    lines += ["%rest = arith.remui %n3, %lanes : index", "%whole = arith.subi %n3, %rest : index",
              f"%mask = vector.create_mask %rest : {_vector('i1')}",
              "%tail = arith.cmpi ne, %rest, %c0 : index",
              f"%pad = arith.constant dense<{'0.0' if src == 'f32' else '0'}> : {_vector(src)}"]
    lines += [f"scf.for %i{d} = %c0 to %n{d} step %one {{" for d in range(_RANK - 1)]
    lines += ["scf.for %i3 = %c0 to %whole step %lanes {",
              f"%x = vector.load %src[{idx}, %i3] : {t(src)}, {_vector(src)}",
              *map(_vector, body),
              f"vector.store %y, %dst[{idx}, %i3] : {t(dst)}, {_vector(dst)}",
              "}",
              "scf.if %tail {",
              f"%x = vector.maskedload %src[{idx}, %whole], %mask, %pad : {t(src)}, {_vector('i1')}, "
              f"{_vector(src)} into {_vector(src)}",
              *map(_vector, body),
              f"vector.maskedstore %dst[{idx}, %whole], %mask, %y : {t(dst)}, {_vector('i1')}, {_vector(dst)}",
              "}"]
    lines += ["}"] * (_RANK - 1) + ["return", "}"]
    return "\n".join(lines)


def _vector(text: str) -> str:
    """``text`` with each element type (f32, i32, i16, i1) made a vector of ``_LANES`` of it."""
    return re.sub(r"\b(f32|i32|i16|i1)\b", lambda m: f"vector<{_LANES}x{m.group(1)}>", text)


def _i32(v: int) -> str:
    return f"arith.constant dense<{int(np.uint32(v).view(np.int32))}> : i32"


_MAX_BITS = int(np.float32(DLF16_MAX).view(np.uint32))
_REBIAS = (127 - DLF16_BIAS) << 23         # fp32's exponent bias over DLFloat16's, in place
# DLFloat16's 9 fraction bits sit 14 bits lower than fp32's 23, and the sign 16 bits lower.

# formats._dlf16_encode_bits after the saturating clip: a NaN keeps the NaN pattern, larger magnitudes (inf
# included) become DLF16_MAX's; add half an ulp, rebias the exponent (below DLFloat16's range: zero), sign.
_ENCODE = [
    "%u = arith.bitcast %x : f32 to i32",
    f"%absmask = {_i32(0x7FFFFFFF)}", f"%inf = {_i32(0x7F800000)}", f"%maxb = {_i32(_MAX_BITS)}",
    f"%half = {_i32(1 << 13)}", f"%rebias = {_i32(_REBIAS)}", f"%zero = {_i32(0)}", f"%c14 = {_i32(14)}",
    f"%c16 = {_i32(16)}", f"%smask = {_i32(0x8000)}", f"%nan = {_i32(DLF16_NAN_BITS)}",
    "%mag0 = arith.andi %u, %absmask : i32",
    "%isnan = arith.cmpi ugt, %mag0, %inf : i32",
    "%big = arith.cmpi ugt, %mag0, %maxb : i32",
    "%mag = arith.select %big, %maxb, %mag0 : i1, i32",
    "%r = arith.addi %mag, %half : i32",
    "%tiny = arith.cmpi ult, %r, %rebias : i32",
    "%b0 = arith.subi %r, %rebias : i32",
    "%b1 = arith.shrui %b0, %c14 : i32",
    "%b2 = arith.select %tiny, %zero, %b1 : i1, i32",
    "%b3 = arith.select %isnan, %nan, %b2 : i1, i32",
    "%s0 = arith.shrui %u, %c16 : i32",
    "%s = arith.andi %s0, %smask : i32",
    "%b4 = arith.ori %b3, %s : i32",
    "%y = arith.trunci %b4 : i32 to i16",
]

# formats._dlf16_decode_bits: sign, then exponent and fraction shifted into place and rebiased; zero and the
# NaN pattern apart.
_DECODE = [
    "%c = arith.extui %x : i16 to i32",
    f"%smask = {_i32(0x8000)}", f"%bmask = {_i32(0x7FFF)}", f"%c14 = {_i32(14)}", f"%c16 = {_i32(16)}",
    f"%rebias = {_i32(_REBIAS)}", f"%zero = {_i32(0)}", f"%nanpat = {_i32(DLF16_NAN_BITS)}",
    f"%qnan = {_i32(0x7FC00000)}",
    "%s0 = arith.andi %c, %smask : i32",
    "%s = arith.shli %s0, %c16 : i32",
    "%body = arith.andi %c, %bmask : i32",
    "%v0 = arith.shli %body, %c14 : i32",
    "%v1 = arith.addi %v0, %rebias : i32",
    "%iszero = arith.cmpi eq, %body, %zero : i32",
    "%isnan = arith.cmpi eq, %body, %nanpat : i32",
    "%v2 = arith.select %iszero, %zero, %v1 : i1, i32",
    "%v3 = arith.select %isnan, %qnan, %v2 : i1, i32",
    "%v4 = arith.ori %v3, %s : i32",
    "%y = arith.bitcast %v4 : i32 to f32",
]

_LOWERING = ("builtin.module(convert-scf-to-cf,convert-vector-to-llvm,expand-strided-metadata,"
             "finalize-memref-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
             "reconcile-unrealized-casts)")


class _Kernels:
    """The JIT-compiled module: one packed entry point per kernel (``void fn(void **args)``)."""

    def __init__(self):
        from torch_mlir import ir
        from torch_mlir.execution_engine import ExecutionEngine
        from torch_mlir.passmanager import PassManager

        self._context = ir.Context()
        module = ir.Module.parse("\n".join([_kernel("encode", "f32", "i16", _ENCODE),
                                            _kernel("decode", "i16", "f32", _DECODE)]), self._context)
        PassManager.parse(_LOWERING, self._context).run(module.operation)
        self._engine = ExecutionEngine(module, opt_level=0)
        proto = ctypes.CFUNCTYPE(None, ctypes.c_int64)
        self.encode = proto(self._engine.raw_lookup("_mlir_ciface_encode"))
        self.decode = proto(self._engine.raw_lookup("_mlir_ciface_decode"))


_STATE: dict = {}          # "enabled": whether to use the kernels; "kernels": them, once compiled
_LOCK = threading.Lock()
_LOCAL = threading.local()


def available() -> bool:
    """Whether the native conversions are in use: torch-mlir is installed and ``SPYRE_EMU_NATIVE`` is not 0.
    The runtime needs only numpy: without them the emulator converts with numpy, to the same bits. Nothing is
    imported or compiled here: the kernels compile at the first conversion, so a load that fails or a run that
    converts nothing never waits for them."""
    if "enabled" not in _STATE:
        try:
            found = importlib.util.find_spec("torch_mlir") is not None
        except (ImportError, ValueError):      # blocked (sys.modules entry None) or broken
            found = False
        _STATE["enabled"] = found and os.environ.get("SPYRE_EMU_NATIVE", "1") != "0"
    return _STATE["enabled"]


def _kernels() -> _Kernels:
    kernels = _STATE.get("kernels")
    if kernels is None:
        with _LOCK:
            kernels = _STATE.get("kernels")
            if kernels is None:
                kernels = _STATE["kernels"] = _Kernels()
    return kernels


def warm() -> None:
    """Compile the kernels now (before a worker process is forked: compiled once, and no lock held there)."""
    _kernels()


def descriptor(a: np.ndarray, shape: tuple | None = None) -> list[int]:
    """The memref descriptor fields of ``a`` (at most 4-D) as a 4-D memref, outer unit dimensions added; with
    ``shape``, of ``a`` broadcast to it (numpy's rules, by zero strides: no view is made)."""
    shape = a.shape if shape is None else shape
    if len(shape) > _RANK:
        raise ValueError(f"native conversions take at most {_RANK}-D arrays, not {len(shape)}-D")
    pad = len(shape) - a.ndim
    if pad < 0:
        raise ValueError(f"cannot broadcast shape {a.shape} to {shape}")
    strides = [0] * pad
    for n, m, s in zip(a.shape, shape[pad:], a.strides):
        if n != m and n != 1:
            raise ValueError(f"cannot broadcast shape {a.shape} to {shape}")
        strides.append(s // a.itemsize if n == m else 0)
    lead = _RANK - len(shape)
    ptr = a.ctypes.data
    return [ptr, ptr, 0, *(1,) * lead, *shape, *(0,) * lead, *strides]


class _Block:
    """An argument block: two descriptors, a pointer to each, and the packed argument array pointing at those
    (``fn(block.args)`` runs kernel ``fn``). Each thread has its own, so threads may convert at once."""

    def __init__(self, src: list[int] | None = None, dst: list[int] | None = None):
        self.words = (ctypes.c_int64 * (2 * _FIELDS + 4))()
        base = ctypes.addressof(self.words)
        self.words[2 * _FIELDS:] = [base, base + 8 * _FIELDS, base + 8 * 2 * _FIELDS, base + 8 * (2 * _FIELDS + 1)]
        self.args = base + 8 * (2 * _FIELDS + 2)
        if src is not None:
            self.words[:_FIELDS] = src
        if dst is not None:
            self.words[_FIELDS:2 * _FIELDS] = dst


def _call(fn, src: list[int], dst: list[int]) -> None:
    """``fn(src, dst)`` with this thread's general argument block."""
    block = getattr(_LOCAL, "block", None)
    if block is None:
        block = _LOCAL.block = _Block()
    block.words[:2 * _FIELDS] = src + dst
    fn(block.args)


_BYTE = ctypes.c_char


def _address(a: np.ndarray) -> int:
    """The address of ``a``'s first byte: through a ctypes view of its buffer where it lends a writable one (a
    fresh or contiguous array), ~0.35 us against ~1.2 us for ``a.ctypes.data``, which a tile's conversion paid
    at every call of a program."""
    try:
        return ctypes.addressof(_BYTE.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class Dlf16Tile:
    """Conversions to and from one fixed strided array of DLFloat16 codes (a tile's bytes, any strides): its
    descriptor, and the shape part of a contiguous float32 array's, are built once; a call only adds the
    float32 array's address (a tile written or read at every call of a program costs ~2 us in Python).
    The kernels read and write rows as vectors: an array whose innermost stride is not one element (codes
    every other byte pair, a transposed or column-broadcast source) is copied through a contiguous one."""

    def __init__(self, codes: np.ndarray):
        self.codes, self.shape = codes, codes.shape
        desc = descriptor(codes)
        self._codes = desc if _rows_unit(desc) else None
        shape = (1,) * (_RANK - codes.ndim) + codes.shape
        strides = [1] * _RANK
        for d in range(_RANK - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        self._dense = [0, *shape, *strides]        # after the two addresses: offset, sizes, strides
        # Per thread: the blocks of a decode into, and an encode from, a contiguous float32 array of the tile's
        # shape, with the codes' descriptor and the array's shape written once; a call sets the array's address.
        self._blocks: dict[int, tuple[_Block, _Block]] = {}

    def _own(self) -> tuple[_Block, _Block]:
        blocks = self._blocks.get(threading.get_ident())
        if blocks is None:
            dense = [0, 0, *self._dense]
            blocks = self._blocks[threading.get_ident()] = (_Block(self._codes, dense), _Block(dense, self._codes))
        return blocks

    def encode(self, x) -> None:
        """``codes[...] = formats.dlf16_encode(x)`` (saturating) for ``x`` broadcastable to the codes (converted
        to float32 first, as the device converts from fp32 only)."""
        x = np.asarray(x, dtype=np.float32)
        if x.shape == self.shape and x.flags.c_contiguous:
            if self._codes is not None:         # the usual case, at every call of a program: two addresses set
                block = self._own()[1]
                block.words[0] = block.words[1] = _address(x)
                _kernels().encode(block.args)
                return
            p = _address(x)
            src = [p, p, *self._dense]
        else:
            src = descriptor(x, self.shape)
            if not _rows_unit(src):
                x = np.ascontiguousarray(np.broadcast_to(x, self.shape))
                src = self._at(x)
        if self._codes is None:
            staged = np.empty(self.shape, np.uint16)
            _call(_kernels().encode, src, self._at(staged))
            self.codes[...] = staged
        else:
            _call(_kernels().encode, src, self._codes)

    def decode(self) -> np.ndarray:
        """``formats.dlf16_decode(codes)``, a new contiguous float32 array."""
        out = np.empty(self.shape, np.float32)
        if self._codes is None:
            staged = np.ascontiguousarray(self.codes)
            _call(_kernels().decode, self._at(staged), self._at(out))
        else:
            block = self._own()[0]
            block.words[_FIELDS] = block.words[_FIELDS + 1] = _address(out)
            _kernels().decode(block.args)
        return out

    def _at(self, a: np.ndarray) -> list[int]:
        """The descriptor of ``a``, a contiguous array of the tile's shape."""
        p = _address(a)
        return [p, p, *self._dense]


def _rows_unit(desc: list[int]) -> bool:
    """Whether a 4-D descriptor's rows are contiguous, as the kernels read and write them (a row of one
    element has any stride)."""
    return desc[3 + _RANK - 1] <= 1 or desc[3 + 2 * _RANK - 1] == 1
