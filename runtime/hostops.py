"""Host ops: work a program places on the CPU, run with numpy on whole device-memory tensors.

A HOST instruction names an entry of the metadata ``host_ops`` table: ``{"op", "inputs", "outputs",
"attrs"}`` with buffer names. Four ops exist:

* ``gather``: ``out = table[indices]`` along axis 0 (embedding lookup); indices must be in range.
* ``copy``: ``dst = src.reshape(attrs.shape).transpose(attrs.perm)`` (both optional), converting format.
* ``call``: ``outputs = REGISTRY[attrs.fn](*inputs, **attrs.kwargs)``, the escape hatch for ops the device
  cannot run yet. Register functions with :func:`register_host_function` before loading.
* ``eval``: ``outputs = evaluate(attrs.program, *inputs)``, a host program (:mod:`.hostprog`) the compiler
  wrote: the host work of a compiled model travels in the binary itself.
* ``jit``: ``outputs = attrs.fn(*inputs)``, a function of the binary's host code (:mod:`.hostjit`), native code
  compiled at load; ``in_dtypes``/``out_dtypes`` are the numpy dtypes it takes and gives.

Each entry is checked at load time (:func:`check_host_op`), so a bad table is a load error, not a failure
halfway through a run.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from spyre_mlir.errors import SpyreError

from . import hostprog

__all__ = ["register_host_function", "HOST_FUNCTIONS", "check_host_op", "run_host_op", "HostOpError"]

HOST_FUNCTIONS: dict[str, Callable] = {}
_JIT_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
               "complex64", "complex128")


class HostOpError(SpyreError, ValueError):
    """A host-op table entry is malformed (raised at load time, turned into BinaryFormatError)."""


def register_host_function(name: str, fn: Callable | None = None):
    """Register ``fn(*arrays, **kwargs) -> array | tuple of arrays`` under ``name`` (usable as decorator)."""
    def deco(f):
        HOST_FUNCTIONS[name] = f
        return f
    return deco(fn) if fn is not None else deco


@register_host_function("argmax")
def _argmax(x, axis=-1):
    """Index of the largest value along ``axis`` (ties: first), e.g. greedy decoding."""
    return np.argmax(x, axis=axis).astype(np.int32)


@register_host_function("cumsum")
def _cumsum(x, axis=-1):
    """Running sum along ``axis``, in fp32."""
    return np.cumsum(np.asarray(x, np.float32), axis=axis, dtype=np.float32)


def check_host_op(entry, buffers: dict, host_functions=frozenset()) -> tuple[str, list, list, dict]:
    """Validate one table entry against the declared buffers (and the host code's functions); returns
    (op, inputs, outputs, attrs)."""
    if not isinstance(entry, dict):
        raise HostOpError("expected an object")
    op, ins, outs, attrs = entry.get("op"), entry.get("inputs"), entry.get("outputs"), entry.get("attrs", {})
    if not isinstance(ins, list) or not isinstance(outs, list) or not isinstance(attrs, dict):
        raise HostOpError("inputs/outputs must be lists and attrs an object")
    for n in ins + outs:
        if not isinstance(n, str) or n not in buffers:
            raise HostOpError(f"unknown buffer {n!r:.60}")
    ins = [buffers[n] for n in ins]
    outs = [buffers[n] for n in outs]
    for b in outs:
        if b.kind not in ("output", "scratch", "state"):
            raise HostOpError(f"writes '{b.name}', a {b.kind} buffer")
    if op == "gather":
        if len(ins) != 2 or len(outs) != 1 or set(attrs) - {"axis"} or attrs.get("axis", 0) != 0:
            raise HostOpError("gather takes inputs [table, indices], one output, axis 0")
        table, idx = ins
        if idx.fmt.is_float:
            raise HostOpError("gather indices must have an integer format")
        if outs[0].shape != idx.shape + table.shape[1:]:
            raise HostOpError(f"gather output shape {outs[0].shape} != {idx.shape + table.shape[1:]}")
    elif op == "copy":
        if len(ins) != 1 or len(outs) != 1 or set(attrs) - {"shape", "perm"}:
            raise HostOpError("copy takes one input, one output, attrs shape/perm")
        src, dst = ins[0], outs[0]
        shape = attrs.get("shape") or list(src.shape)
        if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
                or math.prod(shape) != math.prod(src.shape)):
            raise HostOpError(f"copy shape {shape!r:.60} does not hold {src.shape}")
        perm = attrs.get("perm") or list(range(len(shape)))
        if (not isinstance(perm, list) or not all(type(p) is int for p in perm)
                or sorted(perm) != list(range(len(shape)))):
            raise HostOpError(f"copy perm {perm!r:.60} is not a permutation of {len(shape)} dims")
        if tuple(shape[p] for p in perm) != dst.shape and not (dst.shape == () and math.prod(shape) == 1):
            raise HostOpError(f"copy result shape {tuple(shape[p] for p in perm)} != output {dst.shape}")
    elif op == "call":
        fn = attrs.get("fn")
        if fn not in HOST_FUNCTIONS:
            raise HostOpError(f"host function {fn!r:.60} is not registered")
        if not isinstance(attrs.get("kwargs", {}), dict) or set(attrs) - {"fn", "kwargs"}:
            raise HostOpError("call attrs are fn and kwargs (an object)")
    elif op == "eval":
        if set(attrs) != {"program"}:
            raise HostOpError("eval attrs are exactly: program")
        prog = attrs["program"]
        try:
            hostprog.validate(prog)
        except hostprog.Unsupported as e:
            raise HostOpError(f"eval {e}") from None
        if len(prog["args"]) != len(ins) or len(prog["results"]) != len(outs):
            raise HostOpError(f"eval program takes {len(prog['args'])} inputs and gives {len(prog['results'])} "
                              f"results; the entry has {len(ins)} and {len(outs)}")
    elif op == "jit":
        if set(attrs) != {"fn", "in_dtypes", "out_dtypes"}:
            raise HostOpError("jit attrs are exactly: fn, in_dtypes, out_dtypes")
        if attrs["fn"] not in host_functions:
            raise HostOpError(f"jit function {attrs['fn']!r:.60} is not in the binary's host code")
        for key, bufs in (("in_dtypes", ins), ("out_dtypes", outs)):
            dts = attrs[key]
            if not isinstance(dts, list) or len(dts) != len(bufs) or not all(d in _JIT_DTYPES for d in dts):
                raise HostOpError(f"jit {key} must list one known dtype per buffer ({len(bufs)})")
    else:
        raise HostOpError(f"unknown host op {op!r:.60} (known: gather, copy, call, eval, jit)")
    return op, ins, outs, attrs


def run_host_op(op: str, attrs: dict, args: list[np.ndarray], out_shapes: list[tuple]) -> list[np.ndarray]:
    """Compute a host op's outputs from its decoded inputs (shapes were checked at load, data now)."""
    if op == "gather":
        table, idx = args
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
            raise IndexError(f"gather index out of range 0..{table.shape[0] - 1}")
        return [table[idx]]
    if op == "copy":
        (src,) = args
        shape = attrs.get("shape") or list(src.shape)
        return [np.transpose(src.reshape(shape), attrs.get("perm") or list(range(len(shape))))]
    if op == "eval":
        res = hostprog.evaluate(attrs["program"], *args)
        for r, shape in zip(res, out_shapes):
            if np.size(r) != math.prod(shape):
                raise ValueError(f"eval program gave {np.shape(r)} for an output of shape {tuple(shape)}")
        return res
    res = HOST_FUNCTIONS[attrs["fn"]](*args, **attrs.get("kwargs", {}))
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    if len(res) != len(out_shapes):
        raise ValueError(f"host function {attrs['fn']!r} returned {len(res)} arrays, expected {len(out_shapes)}")
    out = []
    for r, shape in zip(res, out_shapes):
        r = np.asarray(r)
        if r.shape != tuple(shape):
            raise ValueError(f"host function {attrs['fn']!r} returned shape {r.shape}, expected {tuple(shape)}")
        out.append(r)
    return out
