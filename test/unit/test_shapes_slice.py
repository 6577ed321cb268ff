"""A fast slice of the shapes sweep (test/shapes/sweep.py, `make shapes`): big and awkward shapes on few cores
compile, run and give PyTorch's answer, on the device where a division fits, on the host where none does."""

import importlib.util
import os

import pytest

pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location(
    "shapes_sweep", os.path.join(os.path.dirname(__file__), "..", "shapes", "sweep.py"))
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


@pytest.mark.parametrize("name, cores, precision", sweep.selected([1, 2], ["dlf16"], stride=2))
def test_shape(name, cores, precision):
    r = sweep.run_case(name, cores, precision)
    assert r["status"] == "pass", r


def test_fused_matmul_that_does_not_fit_its_grid_runs_on_the_host():
    """Linear(3, 70001) on 2 cores: the matmul alone splits N ragged (one 35008-column tile column a core), and
    with its fp32 input converted on the scratchpad that column does not fit. It failed in spyre-tile; it runs
    on the host."""
    import spyre_mlir
    import torch

    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 70001).eval(), torch.randn(5, 3)
    exe = spyre_mlir.compile(model, (x,), cores=2, cache_dir=False)
    (out,) = exe(x)
    torch.testing.assert_close(torch.as_tensor(out), model(x).detach(), rtol=0, atol=2e-2)
    assert any("does not fit" in h for h in exe.compile_info.host_ops), exe.compile_info.host_ops
