"""The three example models through `spyre-convert-linalg,canonicalize,cse,spyre-place-host`.

What must hold for every example: the heavy ops (matmuls, convolutions, softmax and normalization chains) are
all on the device, and every op left outside the spyre dialect sits in a `spyre.host` with a reason. The
coverage table (source op -> spyre op or host, with the reason) is printed (pytest shows it even without -s).

The numbers are checked too: a small reference interpreter runs the converted IR (spyre ops by their documented
meaning, host regions by linalg's) and must match PyTorch, for the examples and for small models covering the
patterns and options the examples do not use.
"""

import collections
import importlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from torch_mlir import ir

from spyre_mlir.context import make_context
from spyre_mlir.frontend import import_model
from spyre_mlir.passes.manager import run_pipeline
from spyre_mlir.passes.place_host import FREE_OPS, placement_report

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

PIPELINE = "builtin.module(spyre-convert-linalg,canonicalize,cse,spyre-place-host)"
EXAMPLES = ["mlp", "cnn", "transformer"]

# Linalg ops that have a spyre form in every shape the examples use: none may survive, even on the host.
MUST_CONVERT = ("linalg.matmul", "linalg.batch_matmul", "linalg.conv_2d_nchw_fchw",
                "linalg.depthwise_conv_2d_nchw_chw", "linalg.conv_2d_ngchw_gfchw", "linalg.pooling_nchw_max",
                "linalg.softmax", "linalg.transpose", "linalg.broadcast", "tensor.pad", "tensor.concat",
                "tensor.extract_slice")

# The fused ops each example must end up with (the softmax/norm patterns matched, not left as map chains).
EXPECTED = {
    "mlp": {"spyre.layernorm": 1, "spyre.matmul": 3},
    "cnn": {"spyre.conv2d": 4, "spyre.pool2d": 1, "spyre.matmul": 1},
    "transformer": {"spyre.rmsnorm": 5, "spyre.softmax": 2, "spyre.gather": 1, "spyre.matmul": 15,
                    "spyre.batch_matmul": 4},
}


def _ops(module: ir.Module) -> list[ir.Operation]:
    ops = []

    def visit(op):
        ops.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return ops


@pytest.fixture(scope="module")
def converted():
    """name -> (input op counts, converted module, placement rows, @main's arguments, torch's output)."""
    out = {}
    for name in EXAMPLES:
        model, inputs = importlib.import_module(name).build(0)
        imported = import_model(model, inputs)
        with torch.no_grad():
            expected = model(*inputs)
        args = [x.numpy() for x in inputs] + list(imported.params.values())
        ctx = make_context()
        with ctx:
            module = ir.Module.parse(imported.linalg_ir)
            before = collections.Counter(op.name for op in _ops(module))
            run_pipeline(module, PIPELINE)
            assert module.operation.verify()
            out[name] = (before, module, placement_report(module), args, expected)
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_nothing_heavy_left(converted, name):
    _, module, *_ = converted[name]
    left = sorted({op.name for op in _ops(module) if op.name in MUST_CONVERT})
    assert not left, f"{name}: {left} should have been converted"
    # No softmax or norm chain left behind as maps: rsqrt and exp only appear inside fused ops or other maps
    # that are not part of a norm (the transformer's rotary cos/sin use neither).
    counts = collections.Counter(op.name for op in _ops(module))
    for op_name, n in EXPECTED[name].items():
        assert counts[op_name] == n, f"{name}: expected {n} {op_name}, got {counts[op_name]}"
    assert counts["math.rsqrt"] == 0, f"{name}: an rsqrt is left, so a norm pattern was missed"


@pytest.mark.parametrize("name", EXAMPLES)
def test_everything_placed(converted, name):
    """Every op directly in @main is a spyre op, a free op, or a spyre.host with a reason."""
    _, module, rows, *_ = converted[name]
    main = module.body.operations[0]
    for op in main.regions[0].blocks[0].operations:
        op = op.operation
        assert op.name.startswith("spyre.") or op.name in FREE_OPS, f"{name}: {op.name} is not placed"
        if op.name == "spyre.host":
            assert ir.StringAttr(op.attributes["reason"]).value, f"{name}: host op without a reason"
        assert "spyre.unconverted" not in op.attributes
    assert all(r["placement"] in ("device", "host") and (r["placement"] == "device" or r["reason"]) for r in rows)


def test_coverage_table(converted, capsys):
    """Prints source op -> spyre ops or host, per example; checks each source op is accounted for."""
    lines = []
    for name in EXAMPLES:
        before, _, rows, *_ = converted[name]
        by_source = collections.defaultdict(collections.Counter)
        for r in rows:
            if r["placement"] == "device":
                by_source[r["source"] or "(new)"][r["op"]] += 1
            else:
                by_source[r["op"]][f"host: {r['reason']}"] += 1
        device = sum(r["placement"] == "device" for r in rows)
        lines.append(f"== {name}: {device} spyre ops on device, {len(rows) - device} host ops ==")
        # Ops inside bodies (yield, index, extract) go with their op; tensor.empty is free.
        nested = ("linalg.yield", "linalg.index", "tensor.yield", "tensor.extract", "tensor.empty")
        sources = sorted(k for k in before if k.startswith(("linalg.", "tensor.")) and k not in nested)
        for src in sources:
            got = by_source.get(src)
            placed = ", ".join(f"{k} x{n}" for k, n in sorted(got.items())) if got else "folded into another op"
            lines.append(f"  {src:36} x{before[src]:<3} -> {placed}")
        for src in sorted(k for k in by_source if k not in sources):
            placed = ", ".join(f"{k} x{n}" for k, n in sorted(by_source[src].items()))
            lines.append(f"  {src:41}  -> {placed}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert lines


@pytest.mark.parametrize("name", EXAMPLES)
def test_same_numbers_as_torch(converted, name):
    """The converted graph, run by a small reference interpreter (spyre ops by their documented meaning, host
    regions by linalg's), computes what the PyTorch model computes: the patterns kept the semantics."""
    _, module, _, args, expected = converted[name]
    main = module.body.operations[0]
    got = _run_block(main.regions[0].blocks[0], {a: torch.from_numpy(v) for a, v in
                                                  zip(main.regions[0].blocks[0].arguments, args)})
    torch.testing.assert_close(got[0], expected, rtol=1e-4, atol=1e-4)


class _Fn(torch.nn.Module):
    def __init__(self, fn, *modules):
        super().__init__()
        self.fn, self.mods = fn, torch.nn.ModuleList(modules)

    def forward(self, *args):
        return self.fn(self.mods, *args)


# Small models for the patterns and options the examples do not exercise: name -> (model, example inputs).
SMALL = {
    "softmax_dim1": lambda: (_Fn(lambda m, x: torch.softmax(x, 1)), (torch.randn(2, 8, 4),)),
    "log_softmax": lambda: (_Fn(lambda m, x: torch.log_softmax(x, -1)), (torch.randn(2, 8),)),
    "masked_softmax": lambda: (_Fn(lambda m, x: x.masked_fill(x < -1, float("-inf")).softmax(-1)),
                               (torch.randn(3, 6),)),
    "layer_norm_no_affine": lambda: (_Fn(lambda m, x: m[0](x), torch.nn.LayerNorm(32, elementwise_affine=False)),
                                     (torch.randn(3, 32),)),
    "layer_norm_2d": lambda: (_Fn(lambda m, x: F.layer_norm(x, (4, 8))), (torch.randn(3, 4, 8),)),
    "grouped_dilated_conv_bias": lambda: (_Fn(lambda m, x: m[0](x), torch.nn.Conv2d(4, 8, 3, 2, 2, 2, groups=2)),
                                          (torch.randn(1, 4, 9, 9),)),
    "max_pool_padded": lambda: (_Fn(lambda m, x: F.max_pool2d(x, 3, 2, padding=1)), (torch.randn(1, 2, 8, 8),)),
    "avg_pool_padded": lambda: (_Fn(lambda m, x: F.avg_pool2d(x, 3, 1, padding=1)), (torch.randn(1, 2, 6, 6),)),
    "reductions": lambda: (_Fn(lambda m, x: (x.sum(0), x.mean((1, 2), keepdim=True), x.amax(-1), x.amin(1),
                                             x.prod(-1), x.var(-1))), (torch.randn(2, 3, 4),)),
    "split_cat": lambda: (_Fn(lambda m, x: torch.cat(list(x.split(3, -1))[::-1], -1) * 2), (torch.randn(2, 9),)),
    "bmm_transposed": lambda: (_Fn(lambda m, a, b: a @ b.transpose(-1, -2)),
                               (torch.randn(2, 3, 4), torch.randn(2, 5, 4))),
    "embedding_plus_positions": lambda: (
        _Fn(lambda m, i: m[0](i) + torch.arange(i.shape[1])[None, :, None].float(), torch.nn.Embedding(10, 4)),
        (torch.randint(0, 10, (2, 3)),)),
    "expand": lambda: (_Fn(lambda m, x: x[:, None, :].expand(2, 3, 4) + 1), (torch.randn(2, 4),)),
    "gelu_tanh": lambda: (_Fn(lambda m, x: F.gelu(x, approximate="tanh")), (torch.randn(4, 8),)),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_models_same_numbers(name):
    torch.manual_seed(0)
    model, inputs = SMALL[name]()
    imported = import_model(model.eval(), inputs)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    with make_context():
        module = ir.Module.parse(imported.linalg_ir)
        run_pipeline(module, PIPELINE)
        assert module.operation.verify()
        block = module.body.operations[0].regions[0].blocks[0]
        args = [x.numpy() for x in inputs] + list(imported.params.values())
        got = _run_block(block, {a: torch.from_numpy(v) for a, v in zip(block.arguments, args)})
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Reference interpreter: just enough of spyre, linalg, tensor, arith and math for the three examples.


def _attr(op, name, default=None):
    """A spyre op's attribute as a Python value (list, bool, int, float or str)."""
    if name not in op.attributes:
        return default
    a = op.attributes[name]
    if isinstance(a, ir.DenseI64ArrayAttr):
        return list(a)
    return ir.StringAttr(a).value if isinstance(a, ir.StringAttr) else _attr_scalar(a)


def _run_block(block, env):
    """Run `block`'s ops in order; returns the operands of its terminator."""
    for op in block.operations:
        op = op.operation
        if op.name in ("func.return", "spyre.yield", "linalg.yield", "tensor.yield"):
            return [env[v] for v in op.operands]
        outs = _eval(op, [env.get(v) for v in op.operands], env)
        for r, v in zip(op.results, outs):
            env[r] = v
    raise AssertionError("block without terminator")


_DTYPES = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "i1": torch.bool, "index": torch.int64}
_CMP = {"ugt": torch.gt, "ogt": torch.gt, "one": torch.ne, "oeq": torch.eq, "ult": torch.lt, "olt": torch.lt,
        "sle": torch.le, "slt": torch.lt, "sge": torch.ge, "sgt": torch.gt, "eq": torch.eq, "ne": torch.ne}
_PREDICATES_F = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une",
                 "uno", "true"]
_PREDICATES_I = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
_UNARY = {"math.exp": torch.exp, "math.log": torch.log, "math.erf": torch.erf, "math.rsqrt": torch.rsqrt, "math.sqrt": torch.sqrt,
          "math.tanh": torch.tanh, "math.cos": torch.cos, "math.sin": torch.sin, "arith.negf": torch.neg}
_BINARY = {"arith.addf": torch.add, "arith.subf": torch.sub, "arith.mulf": torch.mul, "arith.divf": torch.div,
           "arith.addi": torch.add, "arith.subi": torch.sub, "arith.muli": torch.mul,
           "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum, "arith.andi": torch.logical_and}
_REDUCE = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin,
           "prod": lambda x, dim, keepdim: x.flatten(dim[0], dim[-1]).prod(dim[0], keepdim).reshape(
               [1 if d in dim else n for d, n in enumerate(x.shape)] if keepdim else
               [n for d, n in enumerate(x.shape) if d not in dim])}


def _elt(t):
    t = ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t
    return _DTYPES[str(t)]


def _eval(op, x, env):
    name, a = op.name, op.attributes
    t = op.results[0].type if len(op.results) else None
    if name == "arith.constant":
        v = a["value"]
        if isinstance(v, ir.DenseElementsAttr):
            d = ir.DenseElementsAttr(v)
            return [torch.full(list(ir.ShapedType(t).shape), _attr_scalar(d.get_splat_value()), dtype=_elt(t))]
        return [torch.tensor(_attr_scalar(v), dtype=_elt(t))]
    if name == "tensor.empty":
        return [torch.zeros(list(ir.ShapedType(t).shape), dtype=_elt(t))]
    if name in _UNARY:
        return [_UNARY[name](x[0])]
    if name in _BINARY:
        return [_BINARY[name](x[0], x[1])]
    if name in ("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptoui", "arith.index_cast"):
        return [x[0].to(_elt(t))]
    if name == "math.fpowi":
        return [x[0] ** x[1]]
    if name in ("arith.cmpf", "arith.cmpi"):
        table = _PREDICATES_F if name == "arith.cmpf" else _PREDICATES_I
        return [_CMP[table[ir.IntegerAttr(a["predicate"]).value]](x[0], x[1])]
    if name == "arith.select":
        return [torch.where(x[0], x[1], x[2])]
    if name == "cf.assert":
        assert bool(torch.all(x[0])), ir.StringAttr(a["msg"]).value
        return []
    shape = list(ir.ShapedType(t).shape) if isinstance(t, ir.ShapedType) else None
    if name in ("spyre.reshape", "tensor.expand_shape", "tensor.collapse_shape"):
        return [x[0].reshape(shape)]
    if name == "spyre.host":
        return _run_block(op.regions[0].blocks[0], env)
    if name == "spyre.map":
        block = op.regions[0].blocks[0]
        ins = [v.to(_elt(b.type)) for v, b in zip(x, block.arguments)]
        ins = [v.expand(shape) for v in ins] if ins else []
        r = _run_block(block, {**env, **dict(zip(block.arguments, ins))})[0]
        return [r.expand(shape).clone() if r.dim() < len(shape) or list(r.shape) != shape else r]
    if name == "spyre.matmul":
        rhs = x[1].T if _attr(op, "transpose_rhs", False) else x[1]
        return [x[0] @ rhs + (x[2] if len(x) > 2 else 0)]
    if name == "spyre.batch_matmul":
        return [x[0] @ (x[1].transpose(-1, -2) if _attr(op, "transpose_rhs", False) else x[1])]
    if name == "spyre.conv2d":
        p = _attr(op, "padding", [0, 0, 0, 0])
        xp = F.pad(x[0], [p[1], p[3], p[0], p[2]])
        return [F.conv2d(xp, x[1], x[2] if len(x) > 2 else None, _attr(op, "strides"), 0, _attr(op, "dilations"),
                         _attr(op, "groups"))]
    if name == "spyre.pool2d":
        p, k, st = _attr(op, "padding"), _attr(op, "kernel"), _attr(op, "strides")
        fill = float("-inf") if _attr(op, "kind") == "max" else 0.0
        xp = F.pad(x[0], [p[1], p[3], p[0], p[2]], value=fill)
        pool = F.max_pool2d if _attr(op, "kind") == "max" else F.avg_pool2d
        return [pool(xp, k, st)]
    if name == "spyre.reduce":
        return [_REDUCE[_attr(op, "kind")](x[0], dim=_attr(op, "dims"), keepdim=_attr(op, "keepdim"))]
    if name == "spyre.softmax":
        return [torch.softmax(x[0], _attr(op, "dim"))]
    if name == "spyre.layernorm":
        axis = _attr(op, "axis")
        return [F.layer_norm(x[0], x[0].shape[axis:], *(x[1:] + [None, None])[:2], eps=_attr(op, "epsilon"))]
    if name == "spyre.rmsnorm":
        r = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + _attr(op, "epsilon"))
        return [r * x[1] if len(x) > 1 else r]
    if name == "spyre.pad":
        lo, hi = _attr(op, "low"), _attr(op, "high")
        return [F.pad(x[0], [p for d in reversed(range(len(lo))) for p in (lo[d], hi[d])], value=_attr(op, "value"))]
    if name == "spyre.transpose":
        return [x[0].permute(_attr(op, "permutation"))]
    if name == "spyre.gather":
        return [x[0][x[1]]]
    if name == "spyre.concat":
        return [torch.cat(x, _attr(op, "dim"))]
    if name == "spyre.slice":
        idx = tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s in
                    zip(_attr(op, "offsets"), _attr(op, "sizes"), _attr(op, "strides")))
        return [x[0][idx]]
    if name == "linalg.fill":
        return [torch.full(shape, x[0].item(), dtype=_elt(t))]
    if name == "linalg.generic":
        return _generic(op, x, env)
    if name == "linalg.index":  # bound by _generic to the iteration index along the dim
        return [env[op.results[0]]]
    raise NotImplementedError(name)


def _attr_scalar(a):
    if isinstance(a, ir.BoolAttr):
        return ir.BoolAttr(a).value
    if isinstance(a, ir.IntegerAttr):
        return ir.IntegerAttr(a).value
    return ir.FloatAttr(a).value


def _generic(op, x, env):
    """linalg.generic over a dense iteration domain; a reduction must combine a function of the inputs with
    its accumulator (`comb(f(in), out)`), evaluated as f over the domain then reduced with comb."""
    n_in = list(op.attributes["operandSegmentSizes"])[0]
    maps = [ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
    iters = [str(i).endswith("<reduction>") for i in op.attributes["iterator_types"]]
    size = [1] * len(iters)
    for v, m in zip(x, maps):
        for e, n in zip(m.results, v.shape):
            if isinstance(e, ir.AffineDimExpr):
                size[e.position] = n

    def view(v, m):
        idx = []
        for e in m.results:
            if isinstance(e, ir.AffineDimExpr):
                shape = [1] * len(size)
                shape[e.position] = size[e.position]
                idx.append(torch.arange(size[e.position]).reshape(shape))
            else:
                idx.append(torch.zeros([1] * len(size), dtype=torch.int64))
        return v[tuple(idx)] if idx else v.reshape([1] * len(size))

    block = op.regions[0].blocks[0]
    local = dict(env)
    for b, v, m in zip(block.arguments, x, maps):
        local[b] = view(v, m)
    for o in block.operations:
        if o.name == "linalg.index":
            d = ir.IntegerAttr(o.attributes["dim"]).value
            shape = [1] * len(size)
            shape[d] = size[d]
            local[o.results[0]] = torch.arange(size[d]).reshape(shape)
    ys = _run_block(block, local)
    out = []
    for k, (y, init) in enumerate(zip(ys, x[n_in:])):
        if any(iters):
            # comb(f(in), out): reduce f over the reduction dims with comb, then combine with the init.
            acc = block.arguments[n_in + k]
            comb = _def(list(block.operations)[-1].operands[k])
            inner = local[[v for v in comb.operands if v != acc][0]].expand(size)
            kind = {"arith.andi": "min", "arith.addf": "sum", "arith.maximumf": "max"}[comb.name]
            dims = [d for d, r in enumerate(iters) if r]
            red = _REDUCE[kind](inner.to(torch.int8) if inner.dtype == torch.bool else inner, dim=dims, keepdim=True)
            y = _BINARY[comb.name](red.to(inner.dtype).reshape(list(init.shape)), init)
        out.append(y.expand(list(init.shape)).to(init.dtype))
    return out


def _def(v):
    return v.owner.operation


def test_fusions_walk_the_module_a_few_times_whatever_its_depth(monkeypatch):
    """Each fusion scans the module's maps in rounds until one matches nothing, skipping what a match erased:
    a few walks of the module per fusion, not one per match (which made the pass quadratic in a model's
    depth). Eight transformer blocks fuse four times the norms and softmaxes of two, in as many walks."""
    from spyre_mlir.passes import convert_linalg

    transformer = importlib.import_module("transformer")
    walks = []
    collect = convert_linalg._collect
    monkeypatch.setattr(convert_linalg, "_collect", lambda module, names: walks.append(names) or
                        collect(module, names))
    counts = []          # walks per depth
    for blocks in (2, 8):
        imported = import_model(*transformer.build(0, transformer.Config(layers=blocks)))
        walks.clear()
        with make_context():
            module = ir.Module.parse(imported.linalg_ir)
            run_pipeline(module, "builtin.module(spyre-convert-linalg)")
            fused = collections.Counter(op.name for op in _ops(module))
        assert (fused["spyre.rmsnorm"], fused["spyre.softmax"]) == (2 * blocks + 1, blocks)
        counts.append(len(walks))
    assert counts[1] == counts[0] <= 2 + 2 * len(convert_linalg._FUSIONS)
