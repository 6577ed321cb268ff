"""In-place state updates run, as under torch.compile: mutated buffers (training-mode batch norm, a counter) and
mutated inputs become outputs of the compiled program and are written back after each call."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spyre_mlir  # noqa: E402
import spyre_mlir.backend  # noqa: E402,F401


class Counting(torch.nn.Module):
    """A counter buffer, batch-norm statistics in training mode, and an input updated in place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x, y):
        self.count.add_(1)
        y.mul_(2)
        return self.bn(x) + self.count, y.sum()


def _pair(seed=0):
    torch.manual_seed(seed)
    return Counting(), Counting()


def test_compile_writes_state_back():
    m, ref = _pair()
    x, y = torch.randn(4, 3), torch.randn(3)
    y_ref = y.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exe = spyre_mlir.compile(m, (x, y.clone()), precision="fp32-reference", cores=2, cache_dir=False)
    assert [s[:2] for s in exe.compile_info.state] == [("buffer", "count"), ("buffer", "bn.running_mean"),
                                                        ("buffer", "bn.running_var"),
                                                        ("buffer", "bn.num_batches_tracked"), ("input", "y")]
    for _ in range(3):
        got, want = exe(x, y), ref(x, y_ref)
        assert len(got) == 2
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.from_numpy(g), w.detach())
        for a, b in zip(m.buffers(), ref.buffers()):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(y, y_ref)
    assert m.bn.num_batches_tracked.item() == 3


def test_calls_from_several_threads_lose_no_update(in_threads):
    """Threads calling one stateful program each read the buffers, run and write them back in one turn: a counter
    counts every call."""
    m, _ = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exe = spyre_mlir.compile(m, (torch.randn(4, 3), torch.randn(3)), precision="fp32-reference", cores=2,
                                 cache_dir=False)

    def calls():
        for _ in range(10):
            exe(torch.randn(4, 3), torch.randn(3))
    assert not in_threads(calls, [()] * 4)
    assert m.count.tolist() == [40.0] * 3 and m.bn.num_batches_tracked.item() == 40


def test_torch_compile_writes_state_back():
    m, ref = _pair(1)
    fast = torch.compile(m, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=2))
    x, y = torch.randn(4, 3), torch.randn(3)
    y_ref = y.clone()
    for _ in range(2):
        for g, w in zip(fast(x, y), ref(x, y_ref)):
            torch.testing.assert_close(g, w)
        for a, b in zip(m.buffers(), ref.buffers()):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(y, y_ref)


def test_cli_carries_state_in_the_npz(tmp_path):
    m, ref = _pair(2)
    x, y = torch.randn(4, 3), torch.randn(3)
    torch.export.save(torch.export.export(m, (x, y.clone())), tmp_path / "m.pt2")
    bindir = os.path.dirname(sys.executable)
    subprocess.run([os.path.join(bindir, "spyre-compile"), str(tmp_path / "m.pt2"), "--precision", "fp32-reference",
                    "--cores", "2", "-o", str(tmp_path / "m.spyre")], check=True, capture_output=True)
    state = {n: b.numpy() for n, b in m.named_buffers()}
    np.savez(tmp_path / "in.npz", x=x.numpy(), y=y.numpy(), **state)
    r = subprocess.run([os.path.join(bindir, "spyre-run"), str(tmp_path / "m.spyre"), "--inputs",
                        str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    want = ref(x, y.clone())
    np.testing.assert_allclose(out["output_0"], want[0].detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["count.updated"], ref.count.numpy())
    np.testing.assert_allclose(out["bn.running_var.updated"], ref.bn.running_var.numpy(), rtol=1e-5)
