"""Benchmark: a 1024x1024x1024 DLFloat16 matmul on 32 emulated cores.

Reports, for two work divisions, the emulator's wall time next to a plain numpy fp32 matmul measured in the
same run (the ratio is the emulator's overhead for decoding, rounding and moving bytes faithfully), and the
cycle model's view: modeled latency, per-unit utilization, achieved vs peak FLOP/s and the roofline bound.

    .venv/bin/python bench/emulator_matmul.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from peers import median_time  # bench/: the same timing as the peers table
from spyre_mlir.runtime import load_bytes
from spyre_mlir.runtime.kernels import build_matmul
from spyre_mlir.target import load_target

M = N = K = 1024
CONFIGS = {
    "grid 4x8, K tiles of 256": dict(grid=(4, 8), tile_k=256),
    "grid 2x2 x split-K 8 (ring)": dict(grid=(2, 2), split_k=8, tile_m=128, tile_n=128),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement (median; the host may be busy)")
    args = ap.parse_args(argv)
    target = load_target(cores=32)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    ref = x @ w
    bound = 2 * 2.0**-10 * (np.abs(x) @ np.abs(w)) + 2.0**-10 * np.abs(ref)

    table = Table(title=f"{M}x{N}x{K} DLFloat16 matmul on {target.num_cores} emulated cores")
    for col in ("work division", "load", "emulator", "numpy fp32", "ratio", "modeled", "util DMA/PT/RING",
                "achieved / peak", "bound", "max err / bound"):
        table.add_column(col, justify="right")
    for name, kw in CONFIGS.items():
        t0 = time.perf_counter()
        exe = load_bytes(build_matmul(target, M, N, K, **kw).to_bytes(), target=target)
        load_s = time.perf_counter() - t0
        (y,) = exe(x, w)                                  # warm-up (and the answer)
        emu = median_time(lambda: exe(x, w), 0, args.repeat)
        npt = median_time(lambda: x @ w, 0, args.repeat)    # measured in the same run, same machine state
        p = exe.profile
        u = p.utilization
        table.add_row(name, f"{load_s * 1e3:.0f} ms", f"{emu * 1e3:.0f} ms", f"{npt * 1e3:.1f} ms",
                      f"{emu / npt:.1f}x", f"{p.cycles:,.0f} cyc ({p.seconds * 1e6:.0f} us)",
                      f"{u['DMA']:.0%} / {u['PT']:.0%} / {u['RING']:.0%}",
                      f"{p.achieved_flops / 1e12:.2f} / {p.peak_flops / 1e12:.1f} TFLOP/s", p.bound,
                      f"{np.max(np.abs(y - ref) / bound):.2f}")
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
