"""spyre-prefetch end to end: a kernel's constants loaded during the kernel before it change when bytes move, never
what the program computes, and the emitter follows the plan or fails at the op."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spyre_mlir  # noqa: E402
import spyre_mlir.pipeline as pipeline  # noqa: E402
from spyre_mlir.runtime.isa import Op  # noqa: E402

BIN = os.path.dirname(sys.executable)


class ConvStack(torch.nn.Module):
    """Three conv + ReLU + max pool layers and a classifier: each conv shares its filters over the ring, the
    classifier splits along K."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(a, b, 3, padding=1) for a, b in ((3, 8), (8, 16), (16, 16)))
        self.fc = torch.nn.Linear(16 * 4 * 4, 5)

    def forward(self, x):
        for conv in self.convs:
            x = torch.nn.functional.max_pool2d(torch.relu(conv(x)), 2)
        return self.fc(x.flatten(1))


def _build(seed=0):
    torch.manual_seed(seed)
    return ConvStack().eval(), torch.randn(2, 3, 32, 32)


def _without_prefetch(monkeypatch):
    kernel = pipeline.kernel_pipeline
    monkeypatch.setattr(pipeline, "kernel_pipeline",
                        lambda *a, **k: re.sub(r",spyre-prefetch(\{[^}]*\})?", "", kernel(*a, **k)))


@pytest.mark.parametrize("cores", [32, 4])
def test_prefetch_moves_loads_not_results(monkeypatch, cores):
    model, x = _build()
    exe = spyre_mlir.compile(model, (x,), precision="dlf16", cores=cores, cache_dir=False)
    (y,) = exe(x)
    prog = exe.program
    with monkeypatch.context() as m:
        _without_prefetch(m)
        base = spyre_mlir.compile(model, (x,), precision="dlf16", cores=cores, cache_dir=False)
    (y0,) = base(x)
    np.testing.assert_array_equal(y, y0)            # bit for bit: only the order of loads changed
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=0.05, atol=0.05)
    # The same instructions, in another order on some cores, and the program is faster for it.
    assert sorted(len(c) for c in prog.code) == sorted(len(c) for c in base.program.code)
    assert any(not np.array_equal(a, b) for a, b in zip(prog.code, base.program.code))
    assert exe.profile.cycles < base.profile.cycles
    # On core 0 the second conv's constant loads now come before the barrier ending the first conv's work (its
    # second: the first delivers its own shared constants).
    def loads_in_first_conv(p):
        ops = p.code[0]["op"]
        return int(np.count_nonzero(ops[:np.flatnonzero(ops == Op.BARRIER)[1]] == Op.DMA_LOAD))

    assert loads_in_first_conv(prog) > loads_in_first_conv(base.program)


def test_emit_fails_on_a_prefetch_it_cannot_follow(tmp_path):
    """A hand-edited plan asking the first kernel to prefetch (no kernel runs before it): a located error."""
    model, x = _build()
    torch.export.save(torch.export.export(model, (x,)), str(tmp_path / "m.pt2"))
    r = subprocess.run([os.path.join(BIN, "spyre-compile"), "m.pt2", "--emit=kernel", "-o", "k.mlir"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "k.mlir").read_text()
    # The second and third convs load their constants during the conv before, and so does the flatten (its
    # selection matrices); the classifier (split along K, one B tile per core) two kernels back, during the last
    # conv (the flatten is no host: no kernel model says how long it computes without loading).
    assert text.count("spyre.prefetch = [") == 4
    assert 'spyre.prefetch = ["sel"], spyre.prefetch_distance = 1' in text
    assert 'spyre.prefetch = ["b0"], spyre.prefetch_distance = 2' in text
    first = text.index('"spyre.conv2d"')
    text = text[:first] + text[first:].replace("spyre.kernel = \"conv2d\"",
                                               "spyre.kernel = \"conv2d\", spyre.prefetch = [\"b0\"]", 1)
    (tmp_path / "bad.mlir").write_text(text)
    r = subprocess.run([os.path.join(BIN, "spyre-opt"), "bad.mlir", "-p", "builtin.module(spyre-emit{output=b.spyre})"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0
    assert "spyre.prefetch" in r.stderr and "conv" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b.spyre").exists()


class NarrowBetween(torch.nn.Module):
    """A 1x1 conv on three cores (one image each), its GELU a phased row-wise kernel on three cores, then a
    depthwise conv on nine sharing its filters: spyre-prefetch loads those during the 1x1 conv, where the next
    barrier (the GELU's) joins only three cores."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(1, 4, 3, stride=2, padding=1, dilation=2)
        self.b = torch.nn.Conv2d(4, 4, 1)
        self.c = torch.nn.Conv2d(4, 4, 3, groups=4)

    def forward(self, x):
        f = torch.nn.functional
        return torch.relu(self.c(f.gelu(self.b(f.gelu(self.a(x))))))


def test_prefetched_multicasts_reach_cores_the_host_barrier_leaves_out():
    """Used to multicast the prefetched filters in the 1x1 conv's segment, before a barrier that does not join the
    destinations: the loader rejected the binary. The multicasts now wait for the depthwise conv's own barrier."""
    torch.manual_seed(338)
    model, x = NarrowBetween().eval(), torch.randn(3, 1, 24, 20)
    exe = spyre_mlir.compile(model, (x,), precision="dlf16", cores=32, cache_dir=False)
    (y,) = exe(x)
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=0.05, atol=0.05)
