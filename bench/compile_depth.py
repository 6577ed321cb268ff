"""Benchmark: compile time against a model's depth (a Hugging Face Llama, hidden 256, 64 positions, dlf16, 32
cores, cache off): does each added layer cost the same?

For each depth, one cold compile (after a warm-up compile of another model, so that imports and set-up are not
counted), in three parts: the frontend (``torch.export``, the decompositions and Torch-MLIR's import, as
``spyre_mlir.frontend.import_model``), the build (our passes and spyre-emit, writing the binary) and the load
(the loader's checks, schedule and emulator plan). The last lines give the marginal cost of a layer between
consecutive depths: equal marginals mean compile time grows linearly with depth; growing ones, that some
stage does work per layer that grows with the model (spyre-convert-linalg's fusions were: 0.05 / 0.20 /
1.71 s at 2 / 8 / 32 layers, until they stopped walking the module again after every match).

    .venv/bin/python bench/compile_depth.py [--layers 2 8 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch

    import spyre_mlir
    from spyre_mlir import cost
    from spyre_mlir.frontend import import_model
    from spyre_mlir.runtime import load, loader

    sys.path.insert(0, HERE)
    from generate import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    args = ap.parse_args(argv)
    spyre_mlir.compile(torch.nn.Linear(8, 8), (torch.randn(2, 8),), cache_dir=False)
    print(f"{'layers':>6} {'frontend s':>10} {'build s':>8} {'load s':>7} {'total s':>8} {'s / layer':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.layers):
            model = build("llama", 256, n, head_dim=64)
            ids = torch.randint(3, 1024, (1, 64), generator=torch.Generator().manual_seed(1))
            cost.clear_cache()
            loader.clear_cache()
            path = os.path.join(tmp, f"{n}.spyre")
            t0 = time.perf_counter()
            imported = import_model(model, (ids,))
            t1 = time.perf_counter()
            spyre_mlir.compile_to_file(imported, output=path, precision="dlf16", cores=32, cache_dir=False)
            t2 = time.perf_counter()
            load(path)
            t3 = time.perf_counter()
            rows.append((n, t1 - t0, t2 - t1, t3 - t2, t3 - t0))
            print(f"{n:6d} {t1 - t0:10.2f} {t2 - t1:8.2f} {t3 - t2:7.2f} {t3 - t0:8.2f} {(t3 - t0) / n:9.3f}",
                  flush=True)
    for (a, *ta), (b, *tb) in zip(rows, rows[1:]):
        per = [(y - x) / (b - a) for x, y in zip(ta, tb)]
        print(f"marginal s per layer, {a} -> {b} layers: frontend {per[0]:.3f}, build {per[1]:.3f}, "
              f"load {per[2]:.3f}, total {per[3]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
