"""Benchmark: a 1024x1024x1024 matmul compiled by spyre_mlir.compile, modeled on 1 and 32 cores.

The model is ``torch.nn.Linear(1024, 1024, bias=False)`` on a [1024, 1024] input, compiled end to end (frontend,
graph and kernel pipelines, spyre-emit) for DLFloat16; the emulator runs each binary once and checks it
against numpy, and the cycle model gives the modeled latency. The speedup printed is modeled 1-core cycles over
modeled 32-core cycles (not wall time: the emulator runs cores one after another), for the whole program and
for the matmul kernel alone (first to last instruction at the matmul's source location); DRAM and ring bytes are
the program's. spyre-fuse folds the conversion of the fp32 input to DLFloat16 and of the result back into the
matmul kernel (converted on the scratchpad), so the program is the matmul kernel, reading the input and writing
the result in fp32 once.

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
    base = mm_base = None
    print(f"{'cores':>5} {'compile s':>9} {'modeled cycles':>15} {'modeled us':>10} {'speedup':>8} "
          f"{'matmul cycles':>14} {'speedup':>8} {'DRAM MB':>8} {'ring MB':>8} {'PT util':>8} {'bound':>8} "
          f"{'max rel err':>11}")
    with tempfile.TemporaryDirectory() as cache:
        for cores in args.cores:
            t0 = time.perf_counter()
            exe = spyre_mlir.compile(imported, precision="dlf16", cores=cores, cache_dir=cache)
            t1 = time.perf_counter() - t0
            (y,) = exe(x)
            p = exe.profile
            base = base or p.cycles
            mm = [e for e in p.events if e.loc.startswith("spyre.matmul")]
            mm_cycles = max(e.end for e in mm) - min(e.start for e in mm)
            mm_base = mm_base or mm_cycles
            dram = (p.dram_read_bytes + p.dram_write_bytes) / 2**20
            err = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
            print(f"{cores:5d} {t1:9.2f} {p.cycles:15,.0f} {p.seconds * 1e6:10.1f} {base / p.cycles:7.1f}x "
                  f"{mm_cycles:14,.0f} {mm_base / mm_cycles:7.1f}x {dram:8.1f} {p.ring_bytes / 2**20:8.1f} "
                  f"{p.utilization['PT']:8.1%} {p.bound:>8} {err:11.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
