"""Host programs: the numpy interpreter for the host work a binary carries.

A host program is JSON in the binary's metadata (host op ``eval``): ``{"args": [ids], "steps": [...],
"results": [ids]}`` with one step ``{"op", "in": [ids], "out": id, "outs"?: [ids], "a": {attrs}, "shape", "dtype", "body"?}``
per source op, named as the compiler's IR names it (``arith.addf``, ``linalg.generic``, ``spyre.softmax``...).
Values are numpy arrays in a compute dtype: float32 for every float format (the host computes in fp32; the
device format is applied when the result is written), int64/int32/bool for integers.

The compiler translates IR into programs (``spyre_mlir.codegen.hostprog``) and uses this interpreter to fold
constants at compile time; the runtime runs them. :func:`validate` checks a program's structure at load, so a
malformed one is a load error; :func:`evaluate` needs only numpy.
"""

from __future__ import annotations

import math

import numpy as np

from spyre_mlir.errors import SpyreError

__all__ = ["Unsupported", "validate", "evaluate", "ELEMENTWISE", "CASTS"]


class Unsupported(SpyreError, ValueError):
    """An op or construct the host interpreter does not know (the message names it)."""


ELEMENTWISE = {
    "arith.addf": "add", "arith.addi": "add", "arith.subf": "sub", "arith.subi": "sub",
    "arith.mulf": "mul", "arith.muli": "mul", "arith.divf": "div", "arith.divsi": "divsi",
    "arith.divui": "divsi", "arith.remsi": "remsi", "arith.remf": "remf", "arith.floordivsi": "floordiv",
    "arith.maximumf": "maximum", "arith.maxnumf": "fmax", "arith.maxsi": "maximum", "arith.maxui": "maximum",
    "arith.minimumf": "minimum", "arith.minnumf": "fmin", "arith.minsi": "minimum", "arith.minui": "minimum",
    "arith.negf": "neg", "arith.andi": "and", "arith.ori": "or", "arith.xori": "xor",
    "arith.select": "select", "arith.cmpf": "cmpf", "arith.cmpi": "cmpi",
    "math.exp": "exp", "math.exp2": "exp2", "math.log": "log", "math.log2": "log2", "math.log1p": "log1p",
    "math.expm1": "expm1", "math.sqrt": "sqrt", "math.rsqrt": "rsqrt", "math.tanh": "tanh", "math.erf": "erf",
    "math.sin": "sin", "math.cos": "cos", "math.tan": "tan", "math.atan": "atan", "math.absf": "abs",
    "math.absi": "abs", "math.powf": "pow", "math.fpowi": "pow", "math.ipowi": "pow", "math.floor": "floor",
    "math.ceil": "ceil", "math.round": "round", "math.roundeven": "rint", "math.trunc": "trunc",
    "math.atan2": "atan2", "math.sinh": "sinh", "math.cosh": "cosh", "math.acos": "acos", "math.asin": "asin",
    "math.log10": "log10", "math.erfc": "erfc", "math.acosh": "acosh", "math.asinh": "asinh", "math.atanh": "atanh", "math.cbrt": "cbrt",
    "math.isnan": "isnan", "math.isinf": "isinf", "math.isfinite": "isfinite", "math.copysign": "copysign",
    "arith.remui": "remsi", "arith.ceildivsi": "ceildiv", "arith.shli": "shl", "arith.shrsi": "shr",
}
# Conversions: the result's dtype says everything.
CASTS = ("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.fptoui",
          "arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui",
          "tensor.cast", "arith.bitcast")

# Ops with a dedicated case in _step besides ELEMENTWISE, CASTS and spyre.*.
_STRUCTURAL = {"arith.constant", "cf.assert", "tensor.empty", "linalg.index", "tensor.expand_shape",
               "tensor.collapse_shape", "linalg.fill", "linalg.generic", "linalg.matmul", "linalg.batch_matmul",
               "linalg.transpose", "linalg.broadcast", "tensor.extract", "tensor.from_elements", "tensor.splat",
               "tensor.extract_slice", "tensor.insert_slice", "tensor.concat", "spyre.host", "linalg.yield", "spyre.yield"}
_SPYRE = {"spyre." + n for n in ("matmul", "batch_matmul", "map", "reshape", "transpose", "cast", "gather",
                                 "concat", "slice", "pad", "reduce", "softmax", "layernorm", "rmsnorm", "conv2d",
                                 "pool2d")}
_MAX_STEPS = 1 << 16


def validate(program, where: str = "program", defined: frozenset = frozenset()) -> None:
    """Check a program's structure (known ops, ids defined before use, sane shapes); raise Unsupported."""
    if not isinstance(program, dict) or not all(isinstance(program.get(k), list)
                                                 for k in ("args", "steps", "results")):
        raise Unsupported(f"{where}: needs lists 'args', 'steps' and 'results'")
    if len(program["steps"]) > _MAX_STEPS:
        raise Unsupported(f"{where}: more than {_MAX_STEPS} steps")
    ids = set(defined)
    for i in program["args"]:
        if type(i) is not int:
            raise Unsupported(f"{where}: argument ids must be integers")
        ids.add(i)
    for n, step in enumerate(program["steps"]):
        at = f"{where} step {n}"
        if not isinstance(step, dict) or not isinstance(step.get("op"), str):
            raise Unsupported(f"{at}: a step is an object with an 'op' name")
        op = step["op"]
        if op not in ELEMENTWISE and op not in CASTS and op not in _STRUCTURAL and op not in _SPYRE:
            raise Unsupported(f"{at}: '{op:.60}' has no host implementation")
        ins = step.get("in")
        if not isinstance(ins, list) or any(type(i) is not int or i not in ids for i in ins):
            raise Unsupported(f"{at} ({op}): an input id is not defined before use")
        shape = step.get("shape")
        if shape is not None and (not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape)
                                  or math.prod(shape) > 1 << 28):
            raise Unsupported(f"{at} ({op}): bad shape")
        if "dtype" in step:
            try:
                np.dtype(step["dtype"])
            except (TypeError, ValueError):
                raise Unsupported(f"{at} ({op}): bad dtype") from None
        if not isinstance(step.get("a", {}), dict):
            raise Unsupported(f"{at} ({op}): attributes must be an object")
        if "body" in step:
            validate(step["body"], at + " body", frozenset(ids))
        outs = step.get("outs", [step.get("out")])
        if not isinstance(outs, list) or any(o is not None and type(o) is not int for o in outs):
            raise Unsupported(f"{at} ({op}): output ids must be integers")
        ids.update(o for o in outs if o is not None)
    if any(type(i) is not int or i not in ids for i in program["results"]):
        raise Unsupported(f"{where}: a result id is not defined")




def _erf(x):
    x = np.asarray(x, dtype=np.float64)
    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x


_CMPF = {0: lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), 1: np.equal, 2: np.greater,
         3: np.greater_equal, 4: np.less, 5: np.less_equal, 6: np.not_equal, 7: None, 8: np.equal, 9: np.greater,
         10: np.greater_equal, 11: np.less, 12: np.less_equal, 13: np.not_equal, 14: None,
         15: lambda a, b: np.ones(np.broadcast(a, b).shape, bool)}
_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
         6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}


def _cmpf(p, a, b):
    nan = np.isnan(a) | np.isnan(b)
    if p == 7:
        return ~nan
    if p == 14:
        return nan
    r = _CMPF[p](a, b)
    if 1 <= p <= 6:
        return r & ~nan
    if 8 <= p <= 13:
        return r | nan
    return r


def _unary(fn, x):
    return {
        "neg": np.negative, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
        "expm1": np.expm1, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "tanh": np.tanh, "erf": _erf,
        "sin": np.sin, "cos": np.cos, "tan": np.tan, "atan": np.arctan, "abs": np.abs, "floor": np.floor,
        "ceil": np.ceil, "round": lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5), "rint": np.rint,
        "trunc": np.trunc, "sinh": np.sinh, "cosh": np.cosh, "acos": np.arccos, "asin": np.arcsin,
        "log10": np.log10, "erfc": lambda v: 1 - _erf(v), "acosh": np.arccosh, "asinh": np.arcsinh, "atanh": np.arctanh, "cbrt": np.cbrt, "isnan": np.isnan,
        "isinf": np.isinf, "isfinite": np.isfinite,
    }[fn](x)


def _binary(fn, a, b):
    if fn == "divsi":
        q = np.abs(a) // np.maximum(np.abs(b), 1)
        return np.where((a < 0) != (b < 0), -q, q)
    if fn == "remsi":
        return np.fmod(a, np.where(b == 0, 1, b))
    return {
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "remf": np.fmod,
        "floordiv": np.floor_divide, "maximum": np.maximum, "minimum": np.minimum, "fmax": np.fmax,
        "fmin": np.fmin, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor, "pow": np.power,
        "atan2": np.arctan2, "copysign": np.copysign, "ceildiv": lambda x, y: -((-x) // y),
        "shl": np.left_shift, "shr": np.right_shift,
    }[fn](a, b)


def _eval_affine(e, idx):
    k = e[0]
    if k == "d":
        return idx[e[1]]
    if k == "c":
        return e[1]
    a, b = _eval_affine(e[1], idx), _eval_affine(e[2], idx)
    if k == "+":
        return a + b
    if k == "*":
        return a * b
    if k == "mod":
        return a % b
    if k == "floordiv":
        return a // b
    return -((-a) // b)


def _generic(step, args, env):
    """linalg.generic: parallel dims vectorized, reduction dims walked in order (any combiner works)."""
    a = step["a"]
    n_in = a.get("n_ins", len(args) - 1)
    maps, iters, ndims = a["maps"], a["iters"], a["ndims"]
    sizes = [None] * ndims
    for arr, m in zip(args, maps):
        for d, e in enumerate(m):
            if e[0] == "d" and sizes[e[1]] is None:
                sizes[e[1]] = np.shape(arr)[d]
    if any(s is None for s in sizes):
        raise Unsupported("linalg.generic whose loop sizes do not follow from its operands")
    par = [d for d in range(ndims) if iters[d] == "parallel"]
    red = [d for d in range(ndims) if iters[d] != "parallel"]
    # Open grids over the parallel dims; reduction dims are scalars set per step.
    grids = {}
    for j, d in enumerate(par):
        shp = [1] * len(par)
        shp[j] = sizes[d]
        grids[d] = np.arange(sizes[d]).reshape(shp)
    pshape = tuple(sizes[d] for d in par)
    outs = [np.array(x, copy=True) for x in args[n_in:]]
    out_maps = maps[n_in:]
    body = step["body"]
    red_points = np.ndindex(*[sizes[d] for d in red]) if red else [()]
    # Where each output element lives, as index arrays over the parallel grid.
    out_idx = []
    for m in out_maps:
        idx = {**grids, **{d: 0 for d in red}}
        out_idx.append(tuple(np.broadcast_to(np.asarray(_eval_affine(e, idx)), pshape) for e in m))
    for point in red_points:
        idx = dict(grids)
        idx.update(zip(red, point))
        vals = []
        for arr, m in zip(args[:n_in], maps[:n_in]):
            arr = np.asarray(arr)
            sel = tuple(np.asarray(_eval_affine(e, idx)) for e in m)
            vals.append(np.broadcast_to(arr[sel] if m else arr, pshape))
        for o, oi in zip(outs, out_idx):
            vals.append(o[oi] if oi else np.broadcast_to(o, pshape))
        res = _run(body, vals, [np.broadcast_to(np.asarray(idx[d]), pshape) for d in range(ndims)], env)
        for o, oi, r in zip(outs, out_idx, res):
            if oi:
                o[oi] = r
            else:
                o[...] = r
    return outs


def _spyre(step, args, env):
    """numpy versions of spyre graph ops (what runs on the host when a device op has no kernel yet)."""
    name, a = step["op"][6:], step["a"]
    x = args[0] if args else None
    shape = tuple(step["shape"])
    if name in ("matmul", "batch_matmul"):
        lhs, rhs = args[0], args[1]
        if a.get("transpose_rhs"):
            rhs = np.swapaxes(rhs, -1, -2)
        r = np.matmul(_wide(lhs), _wide(rhs))
        if name == "matmul" and len(args) > 2:
            r = r + args[2]
        return r
    if name == "map":
        # A rank-0 value may live in a one-element buffer: shape [1] broadcasts to a rank-0 map as its scalar.
        ins = [np.broadcast_to(np.reshape(v, ()) if not shape and np.size(v) == 1 else v, shape) for v in args]
        return np.broadcast_to(_run(step["body"], ins, None, env)[0], shape)
    if name == "reshape":
        return np.reshape(x, shape)
    if name == "transpose":
        return np.transpose(x, a["permutation"])
    if name == "cast":
        return _cast(step, args)
    if name == "gather":
        return np.asarray(args[0])[np.asarray(args[1], np.int64)]
    if name == "concat":
        return np.concatenate(list(args), axis=a["dim"])
    if name == "slice":
        st = a.get("strides") or [1] * x.ndim
        return x[tuple(slice(o, o + (s - 1) * k + 1, k) for o, s, k in zip(a["offsets"], a["sizes"], st))]
    if name == "pad":
        return np.pad(x, list(zip(a["low"], a["high"])), constant_values=a["value"])
    if name == "reduce":
        fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[a["kind"]]
        return fn(_wide(x) if x.dtype.kind == "f" else x, axis=tuple(a["dims"]),
                  keepdims=bool(a.get("keepdim")))
    if name == "softmax":
        e = np.exp(x - np.max(x, axis=a["dim"], keepdims=True))
        r = e / np.sum(e, axis=a["dim"], keepdims=True)
        if a.get("safe"):           # a row of -inf only gives zeros (PyTorch's _safe_softmax)
            r = np.where(np.isneginf(x).all(axis=a["dim"], keepdims=True), np.zeros((), r.dtype), r)
        return r
    if name == "layernorm":
        axes = tuple(range(a["axis"] % x.ndim, x.ndim))
        mu = np.mean(x, axis=axes, keepdims=True)
        var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
        r = (x - mu) / np.sqrt(var + a["epsilon"])
        seg = a.get("seg") or [1, 1, 1]
        rest = list(args[1:])
        if seg[1]:
            r = r * rest.pop(0)
        if len(seg) > 2 and seg[2]:
            r = r + rest.pop(0)
        return r
    if name == "rmsnorm":
        r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + a["epsilon"])
        return r * args[1] if len(args) > 1 else r
    if name == "conv2d":
        return _conv2d(x, args[1], args[2] if len(args) > 2 else None, a)
    if name == "pool2d":
        return _pool2d(x, a)
    raise Unsupported(f"spyre.{name} has no host implementation")


def _wide(x):
    """Floats accumulate in at least fp32 (as the device does); f64 data keeps f64; integers and bools in int64,
    exact (a narrower integer result wraps as PyTorch's does when it is stored)."""
    x = np.asarray(x)
    if x.dtype.kind in "iub":
        return x.astype(np.int64)
    return x if x.dtype == np.float64 else x.astype(np.float32)


def _cast(step, args):
    x = np.asarray(args[0])
    dt = step["dtype"]
    a = step["a"]
    scale = args[1] if len(args) > 1 else a.get("scale_values")
    if scale is not None:
        s = np.asarray(scale, np.float32)
        if "axis" in a and s.size > 1:
            shp = [1] * x.ndim
            shp[a["axis"] % x.ndim] = -1
            s = s.reshape(shp)
        if np.dtype(dt).kind == "f" and x.dtype.kind != "f" or a.get("dequantize"):
            return x.astype(np.float32) * s
        q = x / s
        if np.dtype(dt).kind in "iu":
            return np.clip(np.rint(q), -127, 127)
        return q
    return x


def _conv2d(x, w, b, a):
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    pt, pl, pb, pr = a.get("padding", [0, 0, 0, 0])
    g = a.get("groups", 1)
    xp = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, f, oh, ow), np.float32)
    fg = f // g
    for gi in range(g):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w[gi * fg:(gi + 1) * fg].astype(np.float32)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                out[:, gi * fg:(gi + 1) * fg] += np.einsum("nchw,fc->nfhw", patch, ws[:, :, i, j])
    if b is not None:
        out += np.asarray(b, np.float32).reshape(1, -1, 1, 1)
    return out


def _pool2d(x, a):
    kh, kw = a["kernel"]
    sh, sw = a.get("strides") or a["kernel"]
    pt, pl, pb, pr = a.get("padding", [0, 0, 0, 0])
    is_max = a["kind"] == "max"
    xp = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)),
                constant_values=-np.inf if is_max else 0.0)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    wins = [xp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    return np.max(wins, axis=0) if is_max else np.mean(wins, axis=0)


def _step(step, env, index):
    name, a = step["op"], step.get("a", {})
    args = [env[i] for i in step["in"]]
    dt = step.get("dtype")
    shape = step.get("shape")
    if name == "arith.constant":
        v = np.asarray(a["value"], dtype=dt)
        if not shape:
            return v.reshape(())
        return np.broadcast_to(v.reshape(()), shape).copy() if a["splat"] else v.reshape(shape)
    if name == "cf.assert":
        return None
    if name == "tensor.empty":
        return np.zeros(shape, dt)
    if name == "linalg.index":
        return index[a["dim"]]
    if name in ("tensor.expand_shape", "tensor.collapse_shape"):
        return np.reshape(args[0], shape)
    if name in CASTS:
        r = np.asarray(args[0])
        if np.dtype(dt).kind in "iu" and r.dtype.kind == "f":
            r = np.trunc(r)
        return r.astype(dt, copy=False)      # the same dtype: a view (a weight read transposed stays so)
    if name == "linalg.fill":
        return np.full(shape, args[0], dt)
    if name == "linalg.generic":
        res = _generic(step, args, env)
        return res[0] if len(res) == 1 else res
    if name in ("linalg.matmul", "linalg.batch_matmul"):
        return (np.asarray(args[2]) + np.matmul(args[0], args[1])).astype(dt)
    if name == "linalg.transpose":
        return np.transpose(args[0], a["permutation"])
    if name == "linalg.broadcast":
        dims = a["dimensions"]
        src = np.expand_dims(args[0], tuple(dims))
        return np.broadcast_to(src, shape).copy()
    if name == "tensor.extract":
        # Inside a vectorized linalg.generic body the indices are arrays (a gather), else scalars.
        return np.asarray(args[0])[tuple(np.asarray(i, np.intp) for i in args[1:])]
    if name == "tensor.from_elements":
        return np.array([np.asarray(v).item() for v in args], dt).reshape(shape)
    if name == "tensor.splat":
        return np.full(shape, args[0], dt)
    if name == "tensor.concat":
        return np.concatenate([np.asarray(x) for x in args], axis=a["dim"]).astype(dt)
    if name in ("tensor.extract_slice", "tensor.insert_slice"):
        off, size, st = a["static_offsets"], a["static_sizes"], a["static_strides"]
        src = np.asarray(args[0])
        if name == "tensor.extract_slice":
            r = src[tuple(slice(o, o + (s - 1) * k + 1, k) for o, s, k in zip(off, size, st))]
            return r.reshape(shape)
        dst = np.array(args[1], copy=True)
        view = dst[tuple(slice(o, o + (s - 1) * k + 1, k) for o, s, k in zip(off, size, st))]
        view[...] = src.reshape(view.shape)
        return dst
    if name.startswith("spyre."):
        r = _spyre(step, args, env)
        return np.asarray(r).astype(dt, copy=False).reshape(shape)     # a view when it can be (a transposed weight)
    fn = ELEMENTWISE.get(name)
    if fn is None:
        raise Unsupported(f"'{name}' has no host implementation")
    if fn == "select":
        r = np.where(args[0], args[1], args[2])
    elif fn == "cmpf":
        r = _cmpf(a["predicate"], *args)
    elif fn == "cmpi":
        x, y = args
        if a["predicate"] >= 6:
            x, y = np.asarray(x).astype(np.uint64), np.asarray(y).astype(np.uint64)
        r = _CMPI[a["predicate"]](x, y)
    elif len(args) == 1:
        r = _unary(fn, args[0])
    else:
        r = _binary(fn, *args)
    return np.asarray(r).astype(dt)


def _run(prog, args, index=None, env=None):
    env = dict(env or {})
    for i, v in zip(prog["args"], args):
        env[i] = v
    with np.errstate(all="ignore"):
        for step in prog["steps"]:
            if step["op"] in ("spyre.host",):
                r = _run(step["body"], [], index, env)[0]
                r = np.asarray(r).astype(step["dtype"]).reshape(step["shape"])
            else:
                r = _step(step, env, index)
            if "outs" in step:
                env.update(zip(step["outs"], r))
            elif step.get("out") is not None:
                env[step["out"]] = r
    return [env[i] for i in prog["results"]]


def evaluate(program: dict, *arrays) -> list[np.ndarray]:
    """Run a program on numpy arrays; returns its results (compute dtypes: float32 for floats)."""
    return [np.asarray(r) for r in _run(program, [np.asarray(a) for a in arrays])]
