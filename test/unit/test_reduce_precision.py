"""spyre-reduce-precision and spyre-layout on the three example models, every policy: the contract holds.

docs/compiler.md ("After spyre-reduce-precision", "After spyre-layout") is checked op by op on real graphs, where
the lit tests only cover small hand-written ones: device ops compute in the policy's formats with the format
changes all explicit casts, 8-bit weights are quantized along their output channel, the signature keeps the
model's types, every device tensor between device ops is sticked on its innermost dim, no transpose_rhs is left.
"""

import importlib
import os
import sys

import pytest

from torch_mlir import ir

from spyre_mlir.context import make_context
from spyre_mlir.dialects import spyre
from spyre_mlir.frontend import import_model
from spyre_mlir.passes import create_pass
from spyre_mlir.codegen.memory import format_of
from spyre_mlir.passes.analysis import device_ops, is_device_op, is_param_derived, producer
from spyre_mlir.passes.base import OptionError
from spyre_mlir.passes.manager import run_pipeline
from spyre_mlir.passes.reduce_precision import ACC_OPS, F32_OPERANDS, PRECISIONS
from spyre_mlir.pipeline import graph_pipeline

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

EXAMPLES = ["mlp", "cnn", "transformer"]
WEIGHT_FORMAT = {"fp8": "f8E4M3FN", "int8-weights": "i8"}


@pytest.fixture(scope="module")
def graphs():
    """name -> the example's graph IR (after the spyre stage), as text; each example is imported once."""
    out = {}
    for name in EXAMPLES:
        model, inputs = importlib.import_module(name).build(0)
        linalg_ir = import_model(model, inputs).linalg_ir
        with make_context():
            module = ir.Module.parse(linalg_ir)
            run_pipeline(module, graph_pipeline())
            out[name] = str(module)
            SIGNATURES[name] = str(module.body.operations[0].attributes["function_type"])
    return out


# name -> @main's function type in the graph IR, read where the graph is made (re-parsing the text in a fresh
# context per test crashed a worker twice inside ir.Module.parse; see the closing note of that session).
SIGNATURES: dict = {}


def _run(text: str, precision: str, layout: bool):
    ctx = make_context()
    with ctx:
        module = ir.Module.parse(text)
        passes = f"spyre-reduce-precision{{precision={precision}}}" + (",spyre-layout,spyre-select-kernels"
                                                                       if layout else "")
        run_pipeline(module, f"builtin.module({passes},canonicalize,cse)")
        assert module.operation.verify()
    return ctx, module


def _elt(v: ir.Value) -> ir.Type:
    return ir.RankedTensorType(v.type).element_type


def _is_float(v: ir.Value) -> bool:
    return isinstance(v.type, ir.RankedTensorType) and spyre.is_float_like(_elt(v))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_reduce_precision(graphs, name, precision):
    ctx, module = _run(graphs[name], precision, layout=False)
    with ctx:
        assert str(module.body.operations[0].attributes["function_type"]) == SIGNATURES[name]
        ops = device_ops(module.operation)
        for op in ops:
            if op.name in ACC_OPS:
                assert str(op.attributes["acc_type"]) == "f32", op
            if op.name == "spyre.cast":
                assert precision != "fp32-reference", op
                continue
            # Only casts change formats: every other device op reads and writes the activation format, but for
            # the operands its kernel reads in f32 (a conv's bias).
            act = "f32" if precision == "fp32-reference" else "!spyre.dlf16"
            for i, v in enumerate(op.operands):
                if _is_float(v):
                    assert str(_elt(v)) == ("f32" if (op.name, i) in F32_OPERANDS else act), op
            for v in op.results:
                if _is_float(v):
                    assert str(_elt(v)) == act, op
        if precision in WEIGHT_FORMAT:
            # Every matmul/conv of the examples has a parameter weight: quantized along its output channel, then
            # read through the dequantizing cast.
            weighted = [op for op in ops if op.name in ("spyre.matmul", "spyre.conv2d")]
            assert weighted
            for op in weighted:
                deq = producer(op.operands[1])
                q = producer(deq.operands[0])
                axis = 0 if op.name == "spyre.conv2d" or "transpose_rhs" in op.attributes else 1
                for cast in (deq, q):
                    assert cast.name == "spyre.cast" and str(cast.attributes["scale_mode"]) == '"per-channel"', op
                    assert ir.IntegerAttr(cast.attributes["axis"]).value == axis, op
                assert str(_elt(q.results[0])) == WEIGHT_FORMAT[precision], op
                assert isinstance(q.operands[0].owner, ir.Block), op  # the parameter argument itself


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_layout(graphs, name, precision):
    ctx, module = _run(graphs[name], precision, layout=True)
    with ctx:
        assert str(module.body.operations[0].attributes["function_type"]) == SIGNATURES[name]
        for op in device_ops(module.operation):
            if "transpose_rhs" in op.attributes:
                # Kept only where the kernel reads the [N, K] rhs as it is: a run-time rhs, or a weight that
                # takes fewer sticks so than [K, N].
                t = ir.RankedTensorType(op.operands[1].type)
                n, k = t.shape[-2:]
                per = 128 * 8 // format_of(t.element_type).bits
                assert not is_param_derived(op.operands[1], module.body.operations[0]) or \
                    n * -(-k // per) < k * -(-n // per), op
            for r in op.results:
                t = ir.RankedTensorType(r.type)
                boundary = any(not is_device_op(u.owner) for u in r.uses)
                if t.rank == 0 or boundary:
                    assert t.encoding is None, op
                else:
                    assert str(t.encoding) == f"#spyre.stick<{t.rank - 1} : i64>", op
        for op in module.body.operations[0].regions[0].blocks[0].operations:
            if op.operation.name == "spyre.transpose" and "restickify" in op.operation.attributes:
                # The examples' transposed matmul rhs are all weights: restickified at compile time.
                assert "spyre.const_fold" in op.operation.attributes, op


def test_unknown_precision_names_the_policies():
    with pytest.raises(OptionError, match="dlf16, fp8, int8-weights, fp32-reference, got 'bf16'"):
        create_pass("spyre-reduce-precision", {"precision": "bf16"})
