"""Host programs: the binary carries its host work (`eval`), the loader checks it, and a fresh process runs it."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from spyre_mlir.runtime import BinaryFormatError, ProgramBuilder, load_bytes
from spyre_mlir.runtime.hostprog import Unsupported, evaluate, validate
from spyre_mlir.target import load_target

ADD_ONE = {"args": [0], "steps": [
    {"op": "arith.constant", "in": [], "out": 1, "a": {"value": [1], "splat": True}, "shape": [4], "dtype": "int64"},
    {"op": "arith.addi", "in": [0, 1], "out": 2, "a": {}, "shape": [4], "dtype": "int64"}], "results": [2]}


def test_evaluate():
    (r,) = evaluate(ADD_ONE, np.arange(4))
    assert r.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["steps"][1].update(op="arith.frobnicate"), "'arith.frobnicate' has no host implementation"),
    (lambda p: p["steps"][1].update({"in": [0, 7]}), "an input id is not defined before use"),
    (lambda p: p["steps"][0].update(shape=[-1]), "bad shape"),
    (lambda p: p["steps"][0].update(dtype="float99"), "bad dtype"),
    (lambda p: p.update(results=[9]), "a result id is not defined"),
    (lambda p: p.pop("steps"), "needs lists"),
])
def test_validate_rejects(mutate, message):
    import copy

    prog = copy.deepcopy(ADD_ONE)
    mutate(prog)
    with pytest.raises(Unsupported, match=message):
        validate(prog)


def _program(prog):
    b = ProgramBuilder(load_target(cores=1))
    x = b.input("x", (4,), "int32")
    y = b.output("y", (4,), "int32")
    b.host(0, "eval", [x], [y], program=prog)
    return b.to_bytes()


def test_loader_runs_and_checks_eval():
    (y,) = load_bytes(_program(ADD_ONE))(np.arange(4, dtype=np.int32))
    assert y.tolist() == [1, 2, 3, 4]
    bad = dict(ADD_ONE, steps=[dict(ADD_ONE["steps"][0], op="os.system")] + ADD_ONE["steps"][1:])
    with pytest.raises(BinaryFormatError, match=r"metadata\.host_ops\[0\]: eval program step 0: 'os.system'"):
        load_bytes(_program(bad))


def test_compiled_host_work_runs_in_plain_spyre_run(tmp_path):
    """argmax's index math stays on the host; the binary runs in a fresh spyre-run with nothing registered."""
    from spyre_mlir.compiler import compile_to_file

    class ArgmaxScale(torch.nn.Module):
        def forward(self, x):
            return x * x.argmax(-1, keepdim=True).to(x.dtype) + 1.0

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    path = compile_to_file(ArgmaxScale(), (x,), output=str(tmp_path / "m.spyre"), precision="fp32-reference",
                           cache_dir=False)
    np.savez(tmp_path / "in.npz", x.numpy())
    run = os.path.join(os.path.dirname(sys.executable), "spyre-run")
    done = subprocess.run([run, path, "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"),
                           "--numerics", "fp32-reference"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    y = np.load(tmp_path / "out.npz")["output_0"]
    np.testing.assert_allclose(y, ArgmaxScale()(x).numpy(), rtol=1e-6)


def test_binary_records_its_numerics():
    """A program compiled without rounding runs without rounding unless the caller asks otherwise."""
    b = ProgramBuilder(load_target(cores=1))
    x = b.input("x", (4,), "int32")
    y = b.output("y", (4,), "int32")
    b.host(0, "eval", [x], [y], program=ADD_ONE)
    b.numerics = "fp32-reference"
    data = b.to_bytes()
    assert load_bytes(data).numerics == "fp32-reference"
    assert load_bytes(data, numerics="faithful").numerics == "faithful"
    from spyre_mlir.runtime.binary import program_from_bytes, program_to_bytes

    prog = program_from_bytes(data)
    prog.numerics = "fp64-reference"
    with pytest.raises(BinaryFormatError, match="metadata.numerics"):
        load_bytes(program_to_bytes(prog))
