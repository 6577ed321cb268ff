"""The three example models through `spyre-convert-linalg,canonicalize,cse,spyre-place-host`.

What must hold for every example: the heavy ops (matmuls, convolutions, softmax and normalization chains) are
all on the device, and every op left outside the spyre dialect sits in a `spyre.host` with a reason. The
coverage table (source op -> spyre op or host, with the reason) is printed; run with `-s` to see it.
"""

import collections
import importlib
import os
import sys

import pytest

from torch_mlir import ir

from spyre_mlir.context import make_context
from spyre_mlir.frontend import import_model
from spyre_mlir.passes.pipeline import run_pipeline
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
    """name -> (input op counts, converted module, placement rows); each example is imported once."""
    out = {}
    for name in EXAMPLES:
        model, inputs = importlib.import_module(name).build(0)
        linalg_ir = import_model(model, inputs).linalg_ir
        ctx = make_context()
        with ctx:
            module = ir.Module.parse(linalg_ir)
            before = collections.Counter(op.name for op in _ops(module))
            run_pipeline(module, PIPELINE)
            assert module.operation.verify()
            out[name] = (before, module, placement_report(module))
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_nothing_heavy_left(converted, name):
    _, module, _ = converted[name]
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
    _, module, rows = converted[name]
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
        before, _, rows = converted[name]
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
