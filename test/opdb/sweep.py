"""PyTorch's op database as the compiler's coverage suite.

Every ``OpInfo`` of ``torch.testing._internal.common_methods_invocations.op_db``, for each dtype of
``DTYPES`` the op supports on the CPU, its first ``--samples`` sample inputs (forward only, no grad, at most
``MAX_ELEMENTS`` elements per tensor) become a small ``nn.Module`` that is compiled with ``spyre_mlir.compile``,
run on the emulator and compared with eager PyTorch:

* ``fp32-reference``: ``torch.testing.assert_close`` with PyTorch's dtype-aware default tolerances;
* ``dlf16``: floating results within a bound derived from the format (``DLF16_RTOL`` of max|ref| per element,
  plus the result dtype's own default), other results exactly as assert_close wants them.

Each case ends in one class: ``pass``; ``mismatch`` (ran, wrong values, dtype or shape); ``unsupported``
(torch.export or Torch-MLIR cannot take the program to linalg: outside what this compiler can be asked to do,
counted apart); ``error:<Type>`` (a project error: CompileError, SpyreRuntimeError, ...); or
``crash:<Type>`` (any other exception escaped: always a bug). Results are JSON lines, one per case.

    python test/opdb/sweep.py --precision fp32-reference --shard 0/4 --out build/opdb/fp32-0.jsonl
    python test/opdb/report.py build/opdb/*.jsonl       # writes docs/coverage.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
import warnings

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool)
MAX_ELEMENTS = 4096
# Rounding to DLFloat16 costs at most 2^-10 relative per step; a few steps on the longest path.
DLF16_RTOL = 8 * 2.0 ** -10


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def iter_cases(samples: int = 2, stride: int = 1):
    """(case id, OpInfo, dtype, sample index, SampleInput) for every case of the sweep, in a stable order;
    ``stride`` > 1 keeps every stride-th (op, dtype) pair only (a spread-out slice)."""
    from torch.testing._internal.common_methods_invocations import op_db

    k = 0
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        for dt in DTYPES:
            if dt not in supported:
                continue
            k += 1
            if (k - 1) % stride == 0:
                yield from _op_cases(op, dt, samples)


def _op_cases(op, dt, samples):
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    try:
        torch.manual_seed(0)
        gen = op.sample_inputs("cpu", dt, requires_grad=False)
        taken = 0
        for i, s in enumerate(gen):
            if taken >= samples:
                break
            if not _small(s):
                continue
            taken += 1
            yield f"{name}/{_dtype_name(dt)}/{i}", op, dt, i, s
    except Exception:       # an OpInfo whose sample generator fails on this dtype: nothing to test
        return


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _small(s) -> bool:
    ts = list(_tensors([s.input, s.args, s.kwargs]))
    return bool(ts) and all(t.numel() <= MAX_ELEMENTS for t in ts) and not any(
        t.is_sparse or t.layout != torch.strided or t.is_complex() and False for t in ts)


class _Case(torch.nn.Module):
    """The sample as a module: tensors are inputs (in order), everything else is closed over."""

    def __init__(self, op, sample):
        super().__init__()
        self.op, self.sample = op, sample
        self.slots = list(_tensors([sample.input, sample.args, sample.kwargs]))

    def forward(self, *tensors):
        it = iter(tensors)

        def fill(x):
            if isinstance(x, torch.Tensor):
                return next(it)
            if isinstance(x, list):
                return [fill(y) for y in x]
            if isinstance(x, tuple):
                return tuple(fill(y) for y in x)
            if isinstance(x, dict):
                return {k: fill(v) for k, v in x.items()}
            return x

        inp, args, kwargs = fill([self.sample.input, self.sample.args, self.sample.kwargs])
        return self.op.op(inp, *args, **kwargs)


def _flat_outputs(out):
    return [t for t in _tensors(out)]


def _project_error(e: BaseException) -> bool:
    """A deliberate spyre-mlir error (an InternalError wraps a defect: that is a crash)."""
    from spyre_mlir.errors import InternalError, SpyreError

    return isinstance(e, SpyreError) and not isinstance(e, InternalError)


def _unsupported(e: BaseException) -> bool:
    """torch.export or Torch-MLIR cannot take the program to linalg (counted apart, not as our failure)."""
    from spyre_mlir.errors import UnsupportedModelError

    return isinstance(e, UnsupportedModelError)


# Outputs no compiler can reproduce: uninitialized memory, or values drawn from a random generator.
RANDOM_OPS = ("bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "uniform",
              "rand_like", "randint", "randint_like", "randn", "randn_like", "nn.functional.dropout",
              "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
              "nn.functional.feature_alpha_dropout", "nn.functional.rrelu")


def run_case(op, dt, sample, precision: str, cores: int) -> dict:
    import spyre_mlir

    if getattr(op, "has_nondeterministic_output", False) or op.name in RANDOM_OPS:
        return {"precision": precision, "status": "skip", "error": "nondeterministic output (uninitialized or random)"}

    mod = _Case(op, sample)
    inputs = tuple(t.clone() for t in mod.slots)
    t0 = time.perf_counter()
    res = {"precision": precision}
    try:
        with torch.no_grad():
            ref = _flat_outputs(mod(*[t.clone() for t in inputs]))
    except Exception as e:  # the sample itself does not run eagerly: not a case
        return {**res, "status": "skip", "error": f"eager: {type(e).__name__}: {_first(e)}"}
    if not ref:
        return {**res, "status": "skip", "error": "no tensor output"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exe = spyre_mlir.compile(mod, inputs, precision=precision, cores=cores, cache_dir=False)
            got = exe(*inputs)
    except BaseException as e:  # noqa: BLE001 - the sweep classifies every failure
        if isinstance(e, KeyboardInterrupt):
            raise
        kind = "unsupported" if _unsupported(e) else (
            "error" if _project_error(e) else "crash")
        res.update(status=kind if kind == "unsupported" else f"{kind}:{type(e).__name__}", error=_first(e))
        if kind == "crash":
            res["trace"] = traceback.format_exc(limit=-4)[-1500:]
        res["seconds"] = round(time.perf_counter() - t0, 3)
        return res
    res["seconds"] = round(time.perf_counter() - t0, 3)
    res["host_ops"] = len(exe.compile_info.host_ops)
    res["where"] = "host" if exe.compile_info.host_ops and not exe.compile_info.device_ops else (
        "device" if not exe.compile_info.host_ops else "mixed")
    try:
        compare(ref, got, precision)
        res["status"] = "pass"
    except AssertionError as e:
        res.update(status="mismatch", error=_first(e, 3))
    return res


def compare(ref: list, got, precision: str) -> None:
    got = list(got)
    if len(got) != len(ref):
        raise AssertionError(f"{len(got)} outputs, PyTorch gives {len(ref)}")
    for i, (r, g) in enumerate(zip(ref, got)):
        g = torch.from_numpy(_to_torchable(g)) if not isinstance(g, torch.Tensor) else g
        if g.dtype != r.dtype and _is_bf16(g, r):
            g = g.view(torch.bfloat16)
        if precision == "dlf16" and r.is_floating_point() or precision == "dlf16" and r.is_complex():
            scale = r.abs().max().item() if r.numel() else 0.0
            scale = scale if math.isfinite(scale) else 0.0
            torch.testing.assert_close(g, r, equal_nan=True, atol=DLF16_RTOL * scale + 1e-5,
                                       rtol=DLF16_RTOL, msg=lambda m, i=i: f"output {i}: {m}")
        else:
            torch.testing.assert_close(g, r, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}")


def _is_bf16(g, r):
    return r.dtype == torch.bfloat16


def _to_torchable(a):
    import numpy as np

    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return a.view(np.int16)
    return a


def _first(e: BaseException, lines: int = 1) -> str:
    text = str(e).strip()
    return " | ".join(text.splitlines()[:lines])[:400] if text else type(e).__name__


def _selected(a):
    i, n = (int(x) for x in a.shard.split("/"))
    only = set(filter(None, a.ops.split(",")))
    for k, case in enumerate(iter_cases(a.samples, a.stride)):
        if k % n == i and (not only or case[0].split("/")[0] in only):
            yield case


def _worker(a) -> int:
    """Run the selected cases after ``--skip`` of them, appending a JSON line per case to ``--out``; the case
    about to run is written to ``--out``.running first, so the parent can name a case that kills the process."""
    done = 0
    with open(a.out, "a") as out:
        for cid, op, dt, si, sample in _selected(a):
            done += 1
            if done <= a.skip:
                continue
            with open(a.out + ".running", "w") as f:
                f.write(cid)
            r = {"case": cid, "op": cid.split("/")[0], "dtype": _dtype_name(dt),
                 **run_case(op, dt, sample, a.precision, a.cores)}
            out.write(json.dumps(r) + "\n")
            out.flush()
            if a.limit and done >= a.limit:
                break
    return 0


def main(argv=None) -> int:
    import subprocess

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="fp32-reference")
    p.add_argument("--cores", type=int, default=4)
    p.add_argument("--samples", type=int, default=2, help="sample inputs per (op, dtype)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th case starting at i")
    p.add_argument("--stride", type=int, default=1, help="only every stride-th (op, dtype) pair (a quick slice)")
    p.add_argument("--ops", default="", help="comma-separated op names (default: every op)")
    p.add_argument("--limit", type=int, default=0, help="stop after this many cases")
    p.add_argument("--out", required=True, help="JSON lines file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a)
    # The cases run in a worker process; one that kills it (a signal from native code) is recorded as a
    # crash and the worker restarts after it.
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    open(a.out, "w").close()
    while True:
        n_done = sum(1 for _ in open(a.out))
        args = [sys.executable, os.path.abspath(__file__), "--worker", "--skip", str(n_done)] + [
            x for x in (argv if argv is not None else sys.argv[1:])]
        rc = subprocess.call(args)
        if rc == 0:
            break
        try:
            cid = open(a.out + ".running").read()
        except OSError:
            return rc
        with open(a.out, "a") as out:
            out.write(json.dumps({"case": cid, "op": cid.split("/")[0], "dtype": cid.split("/")[1],
                                  "precision": a.precision, "status": f"crash:exit {rc}",
                                  "error": f"the process died (exit status {rc})"}) + "\n")
    if os.path.exists(a.out + ".running"):
        os.remove(a.out + ".running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
