"""Every stage's printed output is a complete input to the next (issue: one source of truth).

`spyre-compile m.pt --emit=kernel -o k.mlir` then `spyre-opt k.mlir -p 'builtin.module(spyre-emit{output=...})'`
writes the binary `spyre-compile m.pt -o m.spyre` writes, byte for byte: parameters travel in the IR as
resources (spyre_mlir.params), names, core count and target too. And `spyre_mlir.params` round-trips values of
every dtype a model holds.
"""

import hashlib
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_mlir import ir  # noqa: E402

from spyre_mlir import params  # noqa: E402
from spyre_mlir.context import make_context  # noqa: E402
from test_compile_e2e import _example  # noqa: E402

BIN = os.path.dirname(sys.executable)


class Heavy(torch.nn.Module):
    """Parameter-heavy (1.3M weights) with buffers of other dtypes: an int64 position table and a bool mask."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(512, 1024)
        self.down = torch.nn.Linear(1024, 512)
        self.register_buffer("pos", torch.arange(16, dtype=torch.int64))
        self.register_buffer("keep", torch.rand(16, 512) > 0.25)

    def forward(self, x):
        y = self.down(torch.relu(self.up(x)))
        return torch.where(self.keep, y, x) + self.pos[:, None].float()


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _run(args, cwd, seed):
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("name,opts", [("mlp", []), ("cnn", ["--cores", "8"]),
                                       ("transformer", ["--precision", "fp32-reference"]), ("heavy", []),
                                       # Quantized weights travel as codes and scales (spyre-fold-constants).
                                       ("heavy", ["--precision", "int8-weights"]),
                                       ("cnn", ["--precision", "fp8", "--cores", "8"])])
def test_kernel_ir_emits_the_same_binary_by_hand(tmp_path, name, opts):
    torch.manual_seed(0)
    m, ex = (Heavy(), (torch.randn(16, 512),)) if name == "heavy" else _example(name)
    torch.export.save(torch.export.export(m, ex), str(tmp_path / "m.pt2"))
    # Different hash seeds in each process: the binary must not depend on Python's hash order.
    _run([os.path.join(BIN, "spyre-compile"), "m.pt2", "-o", "a.spyre", *opts], tmp_path, 1)
    _run([os.path.join(BIN, "spyre-compile"), "m.pt2", "--emit=kernel", "-o", "k.mlir", *opts], tmp_path, 2)
    kernel = (tmp_path / "k.mlir").read_text()
    # The weights are in the IR: folded into constants (spyre-fold-constants) held as resources.
    assert "dialect_resources" in kernel and "arith.constant {spyre.name" in kernel
    if "int8" in opts or "fp8" in opts:
        assert "xi8>" in kernel or "xf8E4M3FN>" in kernel
    _run([os.path.join(BIN, "spyre-opt"), "k.mlir", "-p", "builtin.module(spyre-emit{output=b.spyre})"],
         tmp_path, 3)
    assert _sha(tmp_path / "a.spyre") == _sha(tmp_path / "b.spyre")


def test_params_round_trip_every_dtype():
    values = {"w.f32": np.arange(6, dtype=np.float32).reshape(2, 3), "w.bf16": np.ones(4, ml_dtypes.bfloat16),
              "b.i64": np.arange(3, dtype=np.int64), "m.bool": np.array([[True, False]]),
              "h.f16": np.full((2,), 0.5, np.float16), "s": np.array(2.5, np.float32)}
    types = {"w.f32": "tensor<2x3xf32>", "w.bf16": "tensor<4xbf16>", "b.i64": "tensor<3xi64>",
             "m.bool": "tensor<1x2xi1>", "h.f16": "tensor<2xf16>", "s": "tensor<f32>"}
    sig = ", ".join(f'%a{i}: {t} {{spyre.param = "{n}"}}' for i, (n, t) in enumerate(types.items()))
    text = f"func.func @main({sig}) {{ return }}"
    with make_context():
        m = ir.Module.parse(text)
        params.attach(m, values)
        got = params.values(m.operation)
        assert all(got[k] is not None and np.array_equal(got[k], v) for k, v in values.items())
        printed = m.operation.get_asm()
    with make_context():
        back = params.values(params.parse(printed).operation)
    for k, v in values.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v), k


def test_params_missing_bytes_is_a_clear_error():
    text = ('func.func @main(%a: tensor<2xf32> {spyre.param = "w", spyre.value = dense_resource<w> : tensor<2xf32>})'
            ' { return }\n{-#\n  dialect_resources: {\n    builtin: {\n      w: "0x0400000000000000"\n    }\n  }\n#-}')
    with make_context():
        m = ir.Module.parse(text)          # parsed without spyre_mlir.params: the bytes are MLIR's only
        with pytest.raises(params.ParamError, match="parameter 'w'"):
            params.values(m.operation)
    with make_context():
        with pytest.raises(params.ParamError, match="holds 4 bytes"):
            params.values(params.parse(text).operation)


def test_params_inline_values_and_bad_values():
    """Hand-written IR may give a parameter's values inline (``dense<...>``); any other attribute is an error
    naming the parameter."""
    text = ('func.func @main(%a: tensor<2x2xf32> {spyre.param = "w", spyre.value = dense<0.5> : tensor<2x2xf32>}, '
            '%b: tensor<2xi64> {spyre.param = "i", spyre.value = dense<[3, 4]> : tensor<2xi64>}) { return }')
    with make_context():
        got = params.values(ir.Module.parse(text).operation)
    assert np.array_equal(got["w"], np.full((2, 2), 0.5, np.float32)) and got["w"].dtype == np.float32
    assert np.array_equal(got["i"], [3, 4])
    bad = 'func.func @main(%a: tensor<2xf32> {spyre.param = "w", spyre.value = 1.0 : f32}) { return }'
    with make_context():
        with pytest.raises(params.ParamError, match="parameter 'w': spyre.value must be"):
            params.values(ir.Module.parse(bad).operation)
