"""spyre-chain-convs end to end: a conv's output rows sent over the ring into the next conv's input patches move the
same bytes as a store and a load, so the results are bit for bit those without it, with less DRAM traffic; the
emitter follows the plan or fails at the op."""

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


class Convs(torch.nn.Module):
    """conv + ReLU + max pool, a conv without a pool (its padding rows are the patch's zero fill), a strided conv
    with a sigmoid: every kind of stored value (pool, epilogue map, plain) feeds the next conv."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.c3 = torch.nn.Conv2d(16, 16, 3, padding=1, stride=2)
        self.c4 = torch.nn.Conv2d(16, 8, 3, padding=1, bias=False)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        x = self.c2(x)
        x = torch.sigmoid(self.c3(x))
        return self.c4(x)


def _without_chains(monkeypatch):
    kernel = pipeline.kernel_pipeline
    monkeypatch.setattr(pipeline, "kernel_pipeline",
                        lambda *a, **k: re.sub(r",spyre-chain-convs(\{[^}]*\})?", "", kernel(*a, **k)))


def _stored_and_loaded(exe):
    """Bytes each device buffer gets from DMA stores and gives to DMA loads, by name."""
    prog = exe.program
    spans = [(b.addr, b.addr + b.nbytes, b.name) for b in prog.buffers]
    moved = {}
    for code in prog.code:
        for r in code[np.isin(code["op"], (Op.DMA_LOAD, Op.DMA_STORE))]:
            name = next((n for lo, hi, n in spans if lo <= int(r["dev"]) < hi), None)
            moved.setdefault(name, set()).add(Op(int(r["op"])).name)
    return moved


def _with_and_without(monkeypatch, model, x, precision, cores, atol=0.05):
    """The model compiled with and without spyre-chain-convs; checks both give the same bits, near PyTorch's."""
    exe = spyre_mlir.compile(model, (x,), precision=precision, cores=cores, cache_dir=False)
    (y,) = exe(x)
    with monkeypatch.context() as m:
        _without_chains(m)
        base = spyre_mlir.compile(model, (x,), precision=precision, cores=cores, cache_dir=False)
    (y0,) = base(x)
    np.testing.assert_array_equal(y.view(np.uint32), y0.view(np.uint32))
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=0.05, atol=atol)
    return exe, base


# One core: several patches per core in a0, copied there on the SFU (no ring, no barrier).
@pytest.mark.parametrize("cores,precision", [(32, "dlf16"), (4, "fp8"), (8, "fp32-reference"), (1, "dlf16")])
def test_chains_move_bytes_not_results(monkeypatch, cores, precision):
    torch.manual_seed(0)
    exe, base = _with_and_without(monkeypatch, Convs().eval(), torch.randn(2, 3, 32, 32), precision, cores)
    p, p0 = exe.profile, base.profile
    assert p.dram_read_bytes < p0.dram_read_bytes and p.dram_write_bytes < p0.dram_write_bytes
    # (Ring bytes are no witness: without chains, phased convs pass their halo rows over the ring instead.)
    assert p.cycles < p0.cycles
    # Some intermediate activations are never stored nor loaded: they only crossed the ring.
    assert len(_stored_and_loaded(exe)) < len(_stored_and_loaded(base))


class Head(torch.nn.Module):
    """A CNN's classifier head: conv + ReLU + pool (or a plain conv: 16-wide rows, four to a stick) flattened into
    a Linear; the flatten merges the conv's rows into sticks on the PT array."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.conv = torch.nn.Conv2d(8, 64 if pool else 16, 3, padding=1)
        self.fc = torch.nn.Linear(4096, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return self.fc((torch.nn.functional.max_pool2d(x, 2) if self.pool else x).flatten(1))


# On one core the classifier walks K in several steps through one A buffer: it loads its A tiles.
@pytest.mark.parametrize("pool,cores,precision,want", [(True, 32, "dlf16", 2), (True, 2, "fp8", 2),
                                                       (True, 1, "dlf16", 1), (False, 8, "dlf16", 2)])
def test_a_flatten_takes_the_conv_rows_over_the_ring(monkeypatch, pool, cores, precision, want):
    torch.manual_seed(0)
    exe, base = _with_and_without(monkeypatch, Head(pool).eval(), torch.randn(1 if pool else 2, 8, 16, 16), precision,
                                  cores, atol=0.05 if precision == "dlf16" else 0.3)
    p, p0 = exe.profile, base.profile
    assert p.dram_read_bytes < p0.dram_read_bytes and p.dram_write_bytes < p0.dram_write_bytes
    # The conv's stored value (the flatten's input) is neither stored nor loaded, nor is the flatten's result when
    # the classifier's cores each hold one A tile (it goes to them over the ring too).
    moved, moved0 = _stored_and_loaded(exe), _stored_and_loaded(base)
    assert set(moved) < set(moved0) and len(moved0) - len(moved) == want


def _kernel_ir(tmp_path, model, x, *flags) -> str:
    """The model's kernel IR, as spyre-compile --emit=kernel writes it."""
    torch.export.save(torch.export.export(model, (x,)), str(tmp_path / "m.pt2"))
    r = subprocess.run([os.path.join(BIN, "spyre-compile"), "m.pt2", "--emit=kernel", *flags, "-o", "k.mlir"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "k.mlir").read_text()


def _emit_error(tmp_path, text: str) -> str:
    """spyre-emit on the hand-edited kernel IR ``text``: it must fail without a traceback or a binary; its stderr."""
    (tmp_path / "bad.mlir").write_text(text)
    r = subprocess.run([os.path.join(BIN, "spyre-opt"), "bad.mlir", "-p", "builtin.module(spyre-emit{output=b.spyre})"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert not (tmp_path / "b.spyre").exists()
    return r.stderr


def test_emit_fails_on_a_ring_input_it_cannot_follow(tmp_path):
    """A hand-edited plan asking the first conv (whose input is the model's) to receive its patches: a located
    error, no binary."""
    torch.manual_seed(0)
    text = _kernel_ir(tmp_path, Convs().eval(), torch.randn(2, 3, 32, 32))
    assert "spyre.ring_input = true" in text
    first = text.index('"spyre.conv2d"')
    text = text[:first] + text[first:].replace('spyre.kernel = "conv2d"',
                                               'spyre.kernel = "conv2d", spyre.ring_input = true', 1)
    err = _emit_error(tmp_path, text)
    assert "spyre.ring_input" in err and "conv" in err


def test_emit_fails_on_a_classifier_ring_input_it_cannot_follow(tmp_path):
    """A hand-edited plan asking the one-core classifier (its K in several steps through one A buffer) to take its A
    over the ring: a located error, no binary."""
    torch.manual_seed(0)
    text = _kernel_ir(tmp_path, Head(True).eval(), torch.randn(1, 8, 16, 16), "--cores=1")
    at = text.index('"spyre.matmul"')
    assert "spyre.ring_input" not in text[at:at + 2000]
    text = text[:at] + text[at:].replace('spyre.kernel = "matmul"',
                                         'spyre.kernel = "matmul", spyre.ring_input = true', 1)
    err = _emit_error(tmp_path, text)
    assert "spyre.ring_input" in err and "spyre.matmul" in err
