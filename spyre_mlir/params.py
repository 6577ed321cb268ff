"""Parameters travel in the IR, by reference.

Each parameter argument of ``@main`` (marked ``spyre.param = "<name>"`` by the frontend) carries its value as
``spyre.value = dense_resource<name> : tensor<...>``. In memory the resource's blob *is* the numpy array
(``DenseResourceElementsAttr.get_from_buffer``: no copy, no ``tolist()``); printed IR carries the bytes in the
module's ``dialect_resources`` section, so every stage's printed output is a complete input to the next
(``spyre-compile --emit=kernel`` then ``spyre-opt -p 'builtin.module(spyre-emit{...})'`` writes the same binary
as ``spyre-compile``).

Values computed while compiling (spyre-fold-constants) travel the same way, as ``arith.constant
dense_resource<key>`` (:func:`constant_attr`, read back by :func:`constant_value`). A resource holds the
element type's storage: numpy's own dtype for builtin types, DLFloat16 bits (uint16) for ``!spyre.dlf16``.

MLIR's Python bindings cannot read a resource's bytes back (no buffer access). So the arrays behind the
resources a context holds are kept beside it: :func:`attach` and :func:`constant_attr` record the arrays they
wrap, :func:`parse` the blobs of the text it parses, and :func:`values` / :func:`constant_value` return them.
"""

from __future__ import annotations

import re

import numpy as np
from torch_mlir import ir

PARAM_ATTR = "spyre.param"
VALUE_ATTR = "spyre.value"
DLF16 = "!spyre.dlf16"

_STORE = "_spyre_blobs"        # attribute of the Python Context object: resource key -> ndarray | bytes
_KEY = re.compile(r"dense_resource<(\"(?:[^\"\\]|\\.)*\"|[^>]+)>")
_SECTION = re.compile(r"\{-#\s*dialect_resources:\s*\{\s*builtin:\s*\{(.*?)\}\s*\}\s*#-\}", re.S)
_BLOB = re.compile(r"(\"(?:[^\"\\]|\\.)*\"|[^\s:\"]+)\s*:\s*\"0x([0-9A-Fa-f]*)\"")


class ParamError(ValueError):
    pass


def _store(context) -> dict:
    blobs = getattr(context, _STORE, None)
    if blobs is None:
        blobs = {}
        setattr(context, _STORE, blobs)
    return blobs


def main_func(module):
    """The module's ``func.func @main`` operation, or None."""
    op = module.operation if hasattr(module, "operation") else module
    for f in op.regions[0].blocks[0].operations:
        if f.operation.name == "func.func" and ir.StringAttr(f.operation.attributes["sym_name"]).value == "main":
            return f.operation
    return None


def arg_dicts(main) -> list:
    """The attribute dictionary of each argument of the function ``main`` (empty ones when it has none)."""
    n = len(main.regions[0].blocks[0].arguments)
    if "arg_attrs" not in main.attributes:
        return [ir.DictAttr.get({}) for _ in range(n)]
    return [ir.DictAttr(d) for d in ir.ArrayAttr(main.attributes["arg_attrs"])]


def result_dicts(main) -> list:
    """The attribute dictionary of each result of the function ``main``."""
    n = len(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results)
    if "res_attrs" not in main.attributes:
        return [ir.DictAttr.get({}) for _ in range(n)]
    return [ir.DictAttr(d) for d in ir.ArrayAttr(main.attributes["res_attrs"])]


def with_entries(d, extra: dict):
    """Dictionary attribute ``d`` with ``extra`` (name -> Attribute) added or replaced."""
    return ir.DictAttr.get({**{d[i].name: d[i].attr for i in range(len(d))}, **extra})


def attach(module, params: dict) -> None:
    """Give every ``spyre.param`` argument of ``@main`` its value from ``params`` (name -> array) as a
    ``spyre.value`` resource holding the array itself. Arguments without a value in ``params`` are left as
    they are (the emitter then reads them as binary inputs)."""
    main = main_func(module)
    if main is None or not params:
        return
    ctx = main.context
    blobs = _store(ctx)
    attrs = arg_dicts(main)
    args = main.regions[0].blocks[0].arguments
    with ctx:
        for i, d in enumerate(attrs):
            if PARAM_ATTR not in d:
                continue
            name = ir.StringAttr(d[PARAM_ATTR]).value
            if name not in params:
                continue
            arr = np.asarray(params[name])
            if not arr.flags.c_contiguous:
                arr = arr.copy()       # (ascontiguousarray would make a 0-d array 1-d)
            key = re.sub(r"[^A-Za-z0-9_.]", "_", name) or "param"
            value = ir.DenseResourceElementsAttr.get_from_buffer(arr.reshape(-1).view(np.uint8), key, args[i].type)
            blobs[_key(value)] = arr      # the key MLIR chose (it appends _N when the name is taken)
            attrs[i] = with_entries(d, {VALUE_ATTR: value})
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def constant_attr(values, type_, key: str):
    """A ``dense_resource`` attribute of tensor type ``type_`` holding ``values`` (real values, or integer codes)
    in the element type's storage; ``key`` names the blob (MLIR appends ``_N`` when it is taken)."""
    elt = str(ir.RankedTensorType(type_).element_type)
    shape = tuple(ir.RankedTensorType(type_).shape)
    if elt == DLF16:
        arr = dlf16_bits(np.asarray(values, np.float32))
    else:
        dtype = _dtype(elt)
        if dtype is None:
            raise ParamError(f"no storage for a constant of element type {elt}")
        arr = np.asarray(values).astype(dtype, copy=False)      # a folded weight is hundreds of MB
    return storage_attr(arr.reshape(shape), type_, key)


# From this many elements on, the native kernel saves ~10 ms a weight over the table lookup (14 ms at this
# size), so compiling it (0.04 s) pays after a few such weights; a process that runs the program compiles it
# anyway.
NATIVE_ENCODE_MIN = 1 << 22


def dlf16_bits(x: np.ndarray) -> np.ndarray:
    """``runtime.formats.dlf16_encode(x)``: the same bits, by the runtime's native kernel for a big weight
    (a [12800, 4096] one: 0.100 -> 0.039 s contiguous, 0.181 -> 0.119 s as the transposed view a Linear weight
    is; measured with the scalar kernel, the vector one gives 0.055-0.060 and 0.123-0.133 s). The blocks are
    the tables' (``formats.by_blocks``), but a transposed view's are 1024 x 64 (the fastest measured for the
    kernel; it reads such a block through a contiguous copy)."""
    from spyre_mlir.runtime import formats, native

    if x.size < NATIVE_ENCODE_MIN or x.ndim < 2 or min(x.strides) < 0 or not native.available():
        return formats.dlf16_encode(x)
    return formats.by_blocks(x, np.uint16, lambda block, out, _: native.Dlf16Tile(out).encode(block), (1024, 64))


def storage_attr(arr: np.ndarray, type_, key: str):
    """A ``dense_resource`` attribute of tensor type ``type_`` over ``arr``, already in the element type's
    storage (DLFloat16 as its uint16 bits): a slice of another constant keeps its bits exactly."""
    arr = np.ascontiguousarray(arr)
    key = re.sub(r"[^A-Za-z0-9_.]", "_", key) or "const"
    attr = ir.DenseResourceElementsAttr.get_from_buffer(arr.reshape(-1).view(np.uint8), key, type_)
    _store(ir.Context.current)[_key(attr)] = arr
    return attr


def is_resource(attr) -> bool:
    """``attr`` is a ``dense_resource`` elements attribute (the bindings give this class no typeid or
    isinstance; printing it prints the key, not the bytes)."""
    return str(attr).startswith("dense_resource<")


def constant_storage(attr, context) -> np.ndarray:
    """The stored array of a ``dense_resource`` attribute made by :func:`constant_attr` (or parsed): the element
    type's storage (DLFloat16 as its uint16 bits)."""
    key = _key(attr)
    blobs = _store(context)
    if key not in blobs:
        raise ParamError(f"the bytes of resource '{key}' are not in this module (parse IR text with "
                         f"spyre_mlir.params.parse, or keep the resources section)")
    arr = blobs[key]
    if isinstance(arr, bytes):
        arr = blobs[key] = _decode(arr, ir.RankedTensorType(attr.type), key)
    return arr


def constant_value(attr, context) -> np.ndarray:
    """The values of a ``dense_resource`` attribute made by :func:`constant_attr` (or parsed): float32 for
    floating-point element types, the integer type for integers."""
    arr = constant_storage(attr, context)
    if str(ir.RankedTensorType(attr.type).element_type) == DLF16:
        from spyre_mlir.runtime.formats import dlf16_decode

        return dlf16_decode(arr)
    return arr.astype(np.float32) if arr.dtype.name.startswith(("bfloat", "float8")) else arr


def _key(attr, name: str = "") -> str:
    m = _KEY.search(str(attr))
    if m is None:
        raise ParamError(f"parameter '{name}': spyre.value must be a dense_resource or dense elements attribute, "
                         f"not {attr}")
    key = m.group(1)
    return key[1:-1] if key.startswith('"') else key


def parse(text: str, context=None) -> ir.Module:
    """``ir.Module.parse`` that also keeps the bytes of the text's resource blobs, for :func:`values`."""
    module = ir.Module.parse(text, context=context) if context is not None else ir.Module.parse(text)
    section = _SECTION.search(text)
    if section:
        blobs = _store(module.context)
        for key, hexdata in _BLOB.findall(section.group(1)):
            # A blob is its alignment (a little-endian u32), then the data.
            blobs[key[1:-1] if key.startswith('"') else key] = bytes.fromhex(hexdata[8:])
    return module


def values(module) -> dict[str, np.ndarray]:
    """Parameter name -> value of every ``@main`` argument that carries a ``spyre.value``."""
    main = main_func(module)
    return {} if main is None else {name: arr for name, (_, arr) in arg_values(main).items()}


def arg_values(func) -> dict[str, tuple[int, np.ndarray]]:
    """Parameter name -> (argument index, value) of every argument of ``func`` that carries a ``spyre.value``."""
    blobs = _store(func.context)
    args = func.regions[0].blocks[0].arguments
    out = {}
    for i, d in enumerate(arg_dicts(func)):
        if VALUE_ATTR not in d or PARAM_ATTR not in d:
            continue
        name = ir.StringAttr(d[PARAM_ATTR]).value
        if isinstance(d[VALUE_ATTR], ir.DenseElementsAttr):     # values written inline (hand-written IR)
            out[name] = (i, _inline(d[VALUE_ATTR], name))
            continue
        key = _key(d[VALUE_ATTR], name)
        if key not in blobs:
            raise ParamError(f"parameter '{name}': the bytes of resource '{key}' are not in this module (parse IR "
                             f"text with spyre_mlir.params.parse, or keep the resources section)")
        arr = blobs[key]
        if isinstance(arr, bytes):
            arr = blobs[key] = _decode(arr, args[i].type, name)
        out[name] = (i, arr)
    return out


def _inline(attr, name: str) -> np.ndarray:
    try:
        return np.array(attr)
    except (TypeError, ValueError) as e:
        raise ParamError(f"parameter '{name}': cannot read the values of {attr.type}: {e}") from None


def _decode(data: bytes, type_, name: str) -> np.ndarray:
    t = ir.RankedTensorType(type_)
    dtype = _dtype(str(t.element_type))
    if dtype is None:
        raise ParamError(f"parameter '{name}': no numpy type for element type {t.element_type}")
    shape = tuple(t.shape)
    if len(data) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise ParamError(f"parameter '{name}': resource holds {len(data)} bytes, {type_} needs "
                         f"{int(np.prod(shape, dtype=np.int64)) * dtype.itemsize}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


_NUMPY_TYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i1": np.bool_, "i8": np.int8,
                "ui8": np.uint8, "i16": np.int16, "i32": np.int32, "i64": np.int64}
_ML_TYPES = {"bf16": "bfloat16", "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2"}


def _dtype(elt: str):
    if elt == DLF16:
        return np.dtype(np.uint16)   # the format's bits
    if elt in _ML_TYPES:
        import ml_dtypes             # only here: its import takes 0.7 s (runtime.formats._ml)

        return np.dtype(getattr(ml_dtypes, _ML_TYPES[elt]))
    d = _NUMPY_TYPES.get(elt)
    return np.dtype(d) if d is not None else None
