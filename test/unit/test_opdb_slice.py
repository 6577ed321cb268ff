"""A fast slice of the op-database sweep (test/opdb/sweep.py): every program that reaches spyre-mlir runs and
matches eager PyTorch, or fails with a project error; nothing else escapes. `make sweep` runs the whole sweep."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "opdb"))
import sweep  # noqa: E402

# Every STRIDE-th case of the sweep's stable order (one sample per op and dtype): a spread over ops and dtypes.
STRIDE = {"fp32-reference": 23, "dlf16": 61}
MIN_RATE = {"fp32-reference": 0.9, "dlf16": 0.8}


def _slice(precision):
    return [c for k, c in enumerate(sweep.iter_cases(samples=1)) if k % STRIDE[precision] == 0]


@pytest.mark.parametrize("precision", sorted(STRIDE))
def test_opdb_slice(precision):
    results = []
    for cid, op, dt, _, sample in _slice(precision):
        r = sweep.run_case(op, dt, sample, precision, cores=4)
        results.append((cid, r))
    crashes = [(cid, r["status"], r.get("error")) for cid, r in results if r["status"].startswith("crash")]
    assert not crashes, f"non-project exceptions escaped: {crashes[:10]}"
    reached = [(cid, r) for cid, r in results if r["status"] not in ("unsupported", "skip")]
    failed = [(cid, r["status"], r.get("error", "")[:160]) for cid, r in reached if r["status"] != "pass"]
    rate = 1 - len(failed) / max(1, len(reached))
    print(f"{precision}: {len(reached) - len(failed)}/{len(reached)} pass ({rate:.1%}); {len(results)} cases")
    assert len(reached) >= 40
    assert rate >= MIN_RATE[precision], f"{rate:.1%} < {MIN_RATE[precision]:.0%}; failures: {failed[:20]}"
