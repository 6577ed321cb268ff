"""spyre-compile: stages, output, --dump-dir and reproducers, and errors without tracebacks.

Subprocess runs cost a torch import each (~3 s), so only the end-to-end paths use them; the other cases call
``main(argv)`` in process.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from spyre_mlir.tools.compile import main

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def spyre_compile(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "spyre_mlir.tools.compile", *args], capture_output=True, text=True, cwd=cwd
    )


class IntPower(torch.nn.Module):
    """aten.pow of integer tensors imports to torch IR but fails the linalg pipeline (it lowers powers of floats
    only; no adapter writes tensor exponents): a stage failure to reproduce."""

    def forward(self, x):
        return torch.pow((x * 10).long(), (x > 0).long())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    # The example script itself writes the archive, as a user would run it.
    subprocess.run([sys.executable, os.path.join(EXAMPLES, "transformer.py"), "tf.pt"], cwd=d, check=True,
                   capture_output=True)
    torch.export.save(torch.export.export(IntPower(), (torch.randn(2, 3),)), str(d / "intpow.pt2"))
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 4)), str(d / "pickled.pt"))
    (d / "garbage.pt").write_bytes(b"\x00garbage")
    return d


def test_emit_linalg_with_dump_dir(models, tmp_path):
    out, dump = tmp_path / "out" / "tf.mlir", tmp_path / "dump"
    r = spyre_compile(str(models / "tf.pt"), "--emit=linalg", "-o", str(out), "--dump-dir", str(dump))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # no progress display when stderr is not a terminal
    assert sorted(os.listdir(dump)) == ["01-torch.mlir", "02-linalg.mlir"]
    text = out.read_text()
    # A file written with -o, like the dump, keeps the model's source locations: it is a complete input to the
    # next stage. Printed on stdout the IR reads like mlir-opt's, without them.
    from spyre_mlir.tools.compile import _without_locations

    dumped = (dump / "02-linalg.mlir").read_text()
    assert "examples/transformer.py" in dumped and text == dumped
    shown = spyre_compile(str(models / "tf.pt"), "--emit=linalg").stdout
    assert "loc(" not in shown and shown == _without_locations(dumped)
    assert "linalg.batch_matmul" in text and 'spyre.param = "rotary.inv_freq"' in text
    assert "torch.aten" in (dump / "01-torch.mlir").read_text()
    assert [p for p in os.listdir(out.parent) if p != "tf.mlir"] == []  # no temporary file left behind


def test_emit_torch_to_stdout(models, capsys):
    assert main([str(models / "intpow.pt2"), "--emit=torch"]) == 0
    out = capsys.readouterr().out
    assert "func.func @main" in out and "torch.aten.pow.Tensor_Tensor" in out


def test_failing_stage_writes_reproducer(models, tmp_path, capsys):
    dump = tmp_path / "dump"
    assert main([str(models / "intpow.pt2"), "--emit=linalg", "--dump-dir", str(dump)]) == 1
    assert "the linalg stage failed" in capsys.readouterr().err
    assert sorted(os.listdir(dump)) == ["01-torch.mlir", "02-linalg.input.mlir", "02-linalg.repro.sh"]
    assert (dump / "02-linalg.input.mlir").read_text() == (dump / "01-torch.mlir").read_text()
    command = (dump / "02-linalg.repro.sh").read_text().strip().splitlines()[-1]
    assert command.startswith("torch-mlir-opt ")
    opt_dir = os.path.dirname(shutil.which("torch-mlir-opt") or os.path.join(os.path.dirname(sys.executable), "x"))
    env = dict(os.environ, PATH=opt_dir + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run(["sh", str(dump / "02-linalg.repro.sh")], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "non-floating point dtype" in r.stderr  # the reproducer fails the same way


def test_pickle_without_opt_in_exits_2_without_traceback(models):
    r = spyre_compile(str(models / "pickled.pt"), "--emit=torch")
    assert r.returncode == 2
    assert "pickled.pt" in r.stderr and "--trust-pickle" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("name, reason", [("missing.pt2", "does not exist"), ("garbage.pt", "not a format")])
def test_bad_file_exits_2(models, capsys, name, reason):
    assert main([str(models / name)]) == 2
    err = capsys.readouterr().err
    assert name in err and reason in err and "Traceback" not in err


def test_pickle_with_opt_in(models, capsys):
    assert main([str(models / "pickled.pt"), "--trust-pickle", "--input-shape", "2x4xf32", "--emit=linalg"]) == 0
    assert "linalg.matmul" in capsys.readouterr().out


def test_unknown_stage_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["model.pt2", "--emit=nonsense"])
    assert e.value.code == 2


def test_placement_summary_names_host_work(models):
    r = spyre_compile(str(models / "tf.pt"), "--emit=spyre")
    assert r.returncode == 0, r.stderr
    assert "ops on the device" in r.stderr and "on the host (int64 index math" in r.stderr
    r = spyre_compile(str(models / "tf.pt"), "--emit=spyre", "--placement-report")
    assert "host: linalg.generic at loc(" in r.stderr and "transformer.py" in r.stderr


def test_cards_plan_written_forced_and_round_tripped(models, tmp_path):
    """--cards 4 places the model (spyre-place-cards) and writes the plan; the plan, edited into a two-stage
    pipeline, is forced with --placement-plan and written back unchanged; its binary (a system of two cards)
    runs in spyre-run with the one-card outputs, a profile per card and a trace with link tracks; an impossible
    card count is a usage error."""
    import json

    plan, kernel = tmp_path / "plan.json", tmp_path / "k.mlir"
    r = spyre_compile(str(models / "tf.pt"), "--cards", "4", "--emit=kernel", "-o", str(kernel),
                      "--placement-plan-out", str(plan))
    assert r.returncode == 0, r.stderr
    p = json.loads(plan.read_text())
    assert p["cards"] == 4 and p["ops"] and all(o["split"] in ("none", "cols", "rows", "heads") for o in p["ops"])
    assert "spyre.cards = array<i64:" in kernel.read_text()
    half = len(p["ops"]) // 2
    for o in p["ops"]:
        o["cards"], o["split"] = ([0] if o["id"] < half else [1]), "none"
    plan.write_text(json.dumps(p))
    again = tmp_path / "again.json"
    r = spyre_compile(str(models / "tf.pt"), "--emit=kernel", "-o", str(kernel), "--placement-plan", str(plan),
                      "--placement-plan-out", str(again))
    assert r.returncode == 0, r.stderr
    back = json.loads(again.read_text())
    assert [(o["cards"], o["split"]) for o in back["ops"]] == [(o["cards"], o["split"]) for o in p["ops"]]
    assert [r["cards"] for r in back["ranges"]] == [[0], [1]] and back["link_us"] > 0
    r = spyre_compile(str(models / "tf.pt"), "--emit=kernel", "-o", str(kernel), "--placement-plan", str(again),
                      "--placement-plan-out", str(tmp_path / "third.json"))
    assert r.returncode == 0 and (tmp_path / "third.json").read_text() == again.read_text()
    import numpy as np

    r = spyre_compile(str(models / "tf.pt"), "--placement-plan", str(again), "-o", str(tmp_path / "m2.spyre"))
    assert r.returncode == 0 and "(2 cards of 32 cores" in r.stderr, r.stderr
    r = spyre_compile(str(models / "tf.pt"), "-o", str(tmp_path / "m1.spyre"))
    assert r.returncode == 0, r.stderr
    ids = np.random.default_rng(0).integers(0, 256, (1, 16))
    np.savez(tmp_path / "in.npz", input_ids=ids)
    outs = {}
    for n in (1, 2):
        r = subprocess.run([sys.executable, "-m", "spyre_mlir.tools.run", str(tmp_path / f"m{n}.spyre"), "-i",
                            str(tmp_path / "in.npz"), "-o", str(tmp_path / f"o{n}.npz"), "--profile", "--trace",
                            str(tmp_path / f"t{n}.json")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs[n] = np.load(tmp_path / f"o{n}.npz")["output_0"]
    assert np.array_equal(outs[1], outs[2])
    assert "Modeled run on 2 x 'spyre'" in r.stdout and "link utilization" in r.stdout
    trace = json.loads((tmp_path / "t2.json").read_text())
    assert "link from card 0" in {e["args"].get("name") for e in trace["traceEvents"] if e["ph"] == "M"}
    r = spyre_compile(str(models / "tf.pt"), "--cards", "9")
    assert r.returncode == 2 and "--cards 9 is impossible" in r.stderr
