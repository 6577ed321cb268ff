"""torch.compile(backend="spyre"): Dynamo's graphs compile for Spyre, run on the emulator, and match eager."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import mlp  # noqa: E402

import spyre_mlir.backend  # noqa: E402,F401  (registers "spyre")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPYRE_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()


def _rel_err(y, ref):
    return ((y - ref).abs().max() / ref.abs().max()).item()


def test_fp32_reference_matches_eager():
    model, (x,) = mlp.build(seed=1)
    fast = torch.compile(model, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=4))
    y = fast(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == model(x).shape
    assert _rel_err(y, model(x)) < 1e-5


def test_registered_backend_in_dlf16():
    model, (x,) = mlp.build(seed=2)
    fast = torch.compile(model, backend="spyre")
    # Eight DLFloat16 roundings of 2^-10 relative each bound the MLP's error relative to its largest output.
    assert _rel_err(fast(x), model(x)) < 8 * 2.0**-10


def test_new_shape_recompiles():
    model, (x,) = mlp.build(seed=3)
    fast = torch.compile(model, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=2),
                         dynamic=False)
    x2 = torch.randn(2 * x.shape[0], *x.shape[1:], generator=torch.Generator().manual_seed(4))
    assert _rel_err(fast(x), model(x)) < 1e-5
    assert _rel_err(fast(x2), model(x2)) < 1e-5


def test_graph_breaks_give_eagers_answer():
    """Data-dependent Python (.item()) and shapes (boolean masking) split the graph; the pieces compile (or run
    eagerly when torch.export cannot take them) and the answer is eager's."""

    def fn(x):
        s = x.sum().item()                      # a graph break: a Python float from a tensor
        y = x * s
        return y[y > 0].sum() + y.double().mean()

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    fast = torch.compile(fn, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=2))
    torch.testing.assert_close(fast(x), fn(x))


def test_bf16_outputs_come_back_as_bf16():
    fast = torch.compile(lambda a: a * 2 + 1, backend=spyre_mlir.backend.make_backend(precision="fp32-reference"))
    a = torch.randn(3, 5).bfloat16()
    y = fast(a)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, a * 2 + 1)
