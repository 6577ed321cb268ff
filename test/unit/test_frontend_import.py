"""Import to torch and linalg IR: the three examples, parameters as arguments, the non-persistent buffer
pitfall, inline small constants, and refusal of stateful graphs."""

import collections
import os
import re
import sys

import numpy as np
import pytest
import torch

from spyre_mlir.frontend import FrontendError, import_model
from spyre_mlir.frontend.importer import PARAM_ATTR

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import cnn  # noqa: E402
import mlp  # noqa: E402
import transformer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

EXAMPLES = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


@pytest.fixture(scope="module")
def imported():
    """Each example built and imported to linalg once for the whole module: {name: (model, inputs, result)}."""
    out = {}
    for name, example in EXAMPLES.items():
        model, inputs = example.build()
        out[name] = (model, inputs, import_model(model, inputs))
    return out


def op_counts(ir_text):
    return collections.Counter(re.findall(r"\b((?:linalg|tensor|tm_tensor)\.[a-z_0-9]+)", ir_text))


def main_args(ir_text):
    """(type, attrs) of each @main argument, read with the MLIR Python bindings."""
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    with ir.Context() as ctx:
        torch_d.register_dialect(ctx)
        module = ir.Module.parse(ir_text)
        func = next(op for op in module.body.operations if op.operation.name == "func.func").operation
        arg_attrs = func.attributes["arg_attrs"] if "arg_attrs" in func.attributes else []
        result = []
        for i, arg in enumerate(func.regions[0].blocks[0].arguments):
            attrs = ir.DictAttr(arg_attrs[i]) if arg_attrs else None
            name = ir.StringAttr(attrs[PARAM_ATTR]).value if attrs is not None and PARAM_ATTR in attrs else None
            result.append((str(arg.type), name))
        return result


@pytest.mark.parametrize(
    "name, expected_ops",
    [
        ("mlp", ["linalg.matmul", "linalg.generic"]),
        ("cnn", ["linalg.conv_2d_nchw_fchw", "linalg.depthwise_conv_2d_nchw_chw", "linalg.pooling_nchw_max",
                 "linalg.matmul", "linalg.generic"]),
        ("transformer", ["linalg.matmul", "linalg.batch_matmul", "linalg.generic"]),
    ],
)
def test_examples_reach_linalg(imported, name, expected_ops):
    _, _, result = imported[name]
    counts = op_counts(result.linalg_ir)
    for op in expected_ops:
        assert counts[op] > 0, f"{op} missing from {name}: {dict(counts)}"
    assert not [op for op in counts if op.startswith("tm_tensor.")]
    assert "torch." not in re.sub(r"\{[^}]*\}", "", result.linalg_ir.split("func.func", 1)[1])
    assert "dense_resource" not in result.torch_ir + result.linalg_ir


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_parameters_are_trailing_arguments(imported, name):
    model, inputs, result = imported[name]
    names = list(result.params)
    expected = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    assert sorted(names) == sorted(n for n in expected if not n.endswith("num_batches_tracked"))
    for level in (result.torch_ir, result.linalg_ir):
        args = main_args(level)
        assert [a for _, a in args[: len(inputs)]] == [None] * len(inputs)
        assert [a for _, a in args[len(inputs):]] == names
    for n, array in result.params.items():
        tensor = model.get_parameter(n) if n in dict(model.named_parameters()) else model.get_buffer(n)
        assert array.shape == tuple(tensor.shape)
        assert np.shares_memory(array, tensor.detach().numpy()), f"{n} was copied"


def test_specs(imported):
    _, (ids,), result = imported["transformer"]
    assert [(s.name, s.shape, s.dtype) for s in result.inputs] == [("input_ids", tuple(ids.shape), "int64")]
    assert [(s.shape, s.dtype) for s in result.outputs] == [((1, 16, 256), "float32")]
    _, _, result = imported["cnn"]
    assert [(s.shape, s.dtype) for s in result.inputs] == [((1, 3, 32, 32), "float32")]


def test_non_persistent_buffer_imports(imported):
    """Hugging Face-style rotary inv_freq is not in the state dict; upstream import_frozen_program fails."""
    model, _, result = imported["transformer"]
    assert "rotary.inv_freq" not in model.state_dict()
    np.testing.assert_array_equal(result.params["rotary.inv_freq"], model.rotary.inv_freq.numpy())
    assert ("tensor<8xf32>", "rotary.inv_freq") in main_args(result.linalg_ir)


RAMP = torch.linspace(0.0, 1.0, 100)


class WithConstants(torch.nn.Module):
    """A 3-element literal (stays inline) and a captured 100-element tensor (becomes a parameter)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 100)

    def forward(self, x):
        return self.lin(x * torch.tensor([1.0, 2.0, 3.0])) + RAMP


def test_small_constants_inline_large_become_params():
    torch.manual_seed(0)
    model = WithConstants().eval()
    result = import_model(model, (torch.randn(2, 3),), stage="torch")
    assert result.linalg_ir is None
    assert "dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]>" in result.torch_ir
    extra = [n for n in result.params if not n.startswith("lin.")]
    assert len(extra) == 1 and result.params[extra[0]].shape == (100,)
    assert "dense_resource" not in result.torch_ir


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)
        return x + self.steps


def test_state_updates_become_inputs_and_outputs():
    result = import_model(Counter(), (torch.randn(2),), stage="torch")
    assert [s.name for s in result.inputs] == ["x", "steps"] and not result.params
    assert [s.name for s in result.outputs] == ["output_0", "steps.updated"]
    assert [(s.kind, s.target, s.output) for s in result.state] == [("buffer", "steps", 1)]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_rebuilt_graph_computes_the_model(name):
    """The graph handed to the FX importer, called with (inputs..., params...) in @main's order, computes
    what the model computes: the argument order and the parameter values are right."""
    from spyre_mlir.frontend.adapters import adapt
    from spyre_mlir.frontend.importer import _parameters_as_arguments

    model, inputs = EXAMPLES[name].build()
    ep, _ = adapt(torch.export.export(model, inputs))
    graph, params, _, _, _ = _parameters_as_arguments(ep)
    (out,) = torch.fx.GraphModule(torch.nn.Module(), graph)(*inputs, *map(torch.from_numpy, params.values()))
    torch.testing.assert_close(out, model(*inputs))


def test_bfloat16_and_tied_weights():
    model, inputs = transformer.build()
    model.lm_head.weight = model.embed_tokens.weight
    model = model.to(torch.bfloat16)
    result = import_model(model, inputs, stage="torch")
    tied = [n for n in result.params if n in ("lm_head.weight", "embed_tokens.weight")]
    assert len(tied) == 1  # one argument for the shared tensor
    array = result.params[tied[0]]
    assert array.dtype.name == "bfloat16"
    assert np.shares_memory(array, model.embed_tokens.weight.detach().view(torch.int16).numpy())
    assert result.outputs[0].dtype == "bfloat16"


def test_dynamic_shapes_are_refused():
    ep = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(3, 4),),
                             dynamic_shapes=({0: torch.export.Dim("batch")},))
    with pytest.raises(FrontendError, match="static shapes"):
        import_model(ep, stage="torch")
