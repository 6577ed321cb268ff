"""Benchmark: a 1024x1024x1024 matmul compiled by spyre_mlir.compile, modeled on 1 and 32 cores.

The model is ``torch.nn.Linear(1024, 1024, bias=False)`` on a [1024, 1024] input, compiled end to end (frontend,
graph and kernel pipelines, spyre-emit) for DLFloat16; the emulator runs each binary once and checks it
against numpy, and the cycle model gives the modeled latency. The speedup printed is modeled 1-core cycles over
modeled 32-core cycles (not wall time: the emulator runs cores one after another).

    .venv/bin/python bench/compile_matmul.py [--cores 1 8 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main(argv=None) -> int:
    import torch

    import spyre_mlir
    from spyre_mlir.frontend import import_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, nargs="+", default=[1, 32])
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024, bias=False).eval()
    x = torch.randn(1024, 1024)
    imported = import_model(model, (x,))
    with torch.no_grad():
        ref = model(x).numpy()
    base = None
    print(f"{'cores':>5} {'compile s':>9} {'modeled cycles':>15} {'modeled us':>10} {'speedup':>8} "
          f"{'PT util':>8} {'bound':>8} {'max rel err':>11}")
    with tempfile.TemporaryDirectory() as cache:
        for cores in args.cores:
            t0 = time.perf_counter()
            exe = spyre_mlir.compile(imported, precision="dlf16", cores=cores, cache_dir=cache)
            t1 = time.perf_counter() - t0
            (y,) = exe(x)
            p = exe.profile
            base = base or p.cycles
            err = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
            print(f"{cores:5d} {t1:9.2f} {p.cycles:15,.0f} {p.seconds * 1e6:10.1f} {base / p.cycles:7.1f}x "
                  f"{p.utilization['PT']:8.1%} {p.bound:>8} {err:11.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
