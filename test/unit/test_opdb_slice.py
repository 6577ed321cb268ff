"""A fast slice of the op-database sweep (test/opdb/sweep.py, which runs cases in a worker process so a native
crash is a recorded result, not a dead test run): programs that reach spyre-mlir run and match eager PyTorch, or
fail with a project error; nothing else escapes. `make sweep` runs the whole sweep."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

SWEEP = os.path.join(os.path.dirname(__file__), "..", "opdb", "sweep.py")
# One sample of every STRIDE-th (op, dtype) pair of the sweep's stable order: a spread over ops and dtypes.
STRIDE = {"fp32-reference": 29, "dlf16": 83}
MIN_RATE = {"fp32-reference": 0.9, "dlf16": 0.85}


@pytest.mark.parametrize("precision", sorted(STRIDE))
def test_opdb_slice(precision, tmp_path):
    out = tmp_path / "slice.jsonl"
    subprocess.run([sys.executable, SWEEP, "--precision", precision, "--samples", "1", "--stride",
                    str(STRIDE[precision]), "--out", str(out)], check=True, timeout=900)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    crashes = [(r["case"], r["status"], r.get("error")) for r in results if r["status"].startswith("crash")]
    assert not crashes, f"non-project exceptions or process deaths: {crashes[:10]}"
    reached = [r for r in results if r["status"] not in ("unsupported", "skip")]
    failed = [(r["case"], r["status"], r.get("error", "")[:160]) for r in reached if r["status"] != "pass"]
    rate = 1 - len(failed) / max(1, len(reached))
    print(f"{precision}: {len(reached) - len(failed)}/{len(reached)} pass ({rate:.1%}); {len(results)} cases")
    assert len(reached) >= 25
    assert rate >= MIN_RATE[precision], f"{rate:.1%} < {MIN_RATE[precision]:.0%}; failures: {failed[:20]}"
