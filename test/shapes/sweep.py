"""Shapes the op database's small samples never reach, over core counts: `make shapes`.

Each case is a module built from code and a seed, at a shape that stresses the work division and the tile search:
dims that no whole stick or PT row block divides (M = 300, K = 700, N = 1000), rows longer than a core's
scratchpad (a softmax over 400,000 values, a 1-D map of 3,000,000), blocks that fill the scratchpad on one core,
big convolutions and norms. Every case compiles at each core count and precision, runs on the emulator and is
compared with eager PyTorch (relative to the largest magnitude of the reference: 1e-5 at fp32-reference; at
dlf16 2e-2, as sums over millions of values add up their roundings). One JSON line per (case, cores, precision):
``pass``, ``mismatch``, ``error:<type>`` (a project error: a clear message, not a pass) or ``crash:<type>`` (any
other exception).

    .venv/bin/python test/shapes/sweep.py [--cores 1 2 8 32] [--precision dlf16 fp32-reference] [--stride K]
        [--shard i/n] [--out build/shapes/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

TOLERANCE = {"fp32-reference": 1e-5, "dlf16": 2e-2}


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _r(*shape):
    return torch.randn(*shape)


# name -> (module, inputs); built under torch.manual_seed(0).
CASES = {
    "linear 300x700->1000": lambda: (nn.Linear(700, 1000), (_r(300, 700),)),
    "linear 1000x1000->1000": lambda: (nn.Linear(1000, 1000), (_r(1000, 1000),)),
    "linear 77x3000->1000": lambda: (nn.Linear(3000, 1000), (_r(77, 3000),)),
    "linear 520x200->3000": lambda: (nn.Linear(200, 3000), (_r(520, 200),)),
    "linear 17x4096->11008": lambda: (nn.Linear(4096, 11008, bias=False), (_r(17, 4096),)),
    "linear 5x3->70001": lambda: (nn.Linear(3, 70001), (_r(5, 3),)),
    "matmul 8x1000000x8": lambda: (Fn(lambda a, b: a @ b), (_r(8, 1_000_000), _r(1_000_000, 8))),
    "bmm 3x1000x300x1000": lambda: (Fn(torch.bmm), (_r(3, 1000, 300), _r(3, 300, 1000))),
    "attention s100 d72": lambda: (Fn(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ k),
                                   (_r(1, 4, 100, 72), _r(1, 4, 100, 72))),
    "softmax 1x400000": lambda: (Fn(lambda x: torch.softmax(x, -1)), (_r(1, 400_000),)),
    "layernorm 2x300000": lambda: (nn.LayerNorm(300_000), (_r(2, 300_000),)),
    "layernorm 4097x768": lambda: (nn.LayerNorm(768), (_r(4097, 768),)),
    "rmsnorm 3x5120": lambda: (nn.RMSNorm(5120), (_r(3, 5120),)),
    "groupnorm 32x256 32x32": lambda: (nn.GroupNorm(32, 256), (_r(2, 256, 32, 32),)),
    "sum 1x3000000": lambda: (Fn(lambda x: x.sum(-1)), (_r(1, 3_000_000),)),
    "sum all 2048x2048": lambda: (Fn(lambda x: x.sum()), (_r(2048, 2048),)),
    "map 1-D 300000": lambda: (Fn(lambda x: torch.relu(x) + 1), (_r(300_000),)),
    "map 1x3000000": lambda: (Fn(lambda x: x * 2 + 1), (_r(1, 3_000_000),)),
    "conv 3->1001 20x20": lambda: (nn.Conv2d(3, 1001, 3), (_r(1, 3, 20, 20),)),
    "conv 2048->64 k7 14x14": lambda: (nn.Conv2d(2048, 64, 7, padding=3), (_r(1, 2048, 14, 14),)),
    "conv 3->64 k11 s4 224": lambda: (nn.Conv2d(3, 64, 11, stride=4, padding=2), (_r(1, 3, 224, 224),)),
    "conv1d 80->512 3000": lambda: (nn.Conv1d(80, 512, 3, padding=1), (_r(1, 80, 3000),)),
    "maxpool 3x3 s2 37x111x111": lambda: (nn.MaxPool2d(3, 2), (_r(1, 37, 111, 111),)),
    "embedding 200000x300": lambda: (nn.Embedding(200_000, 300), (torch.randint(0, 200_000, (4, 7)),)),
    "transpose 3000x5000": lambda: (Fn(lambda x: x.t().contiguous() * 2), (_r(3000, 5000),)),
}


def run_case(name: str, cores: int, precision: str) -> dict:
    import spyre_mlir
    from spyre_mlir.errors import SpyreError

    torch.manual_seed(0)
    model, inputs = CASES[name]()
    model = model.eval()
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            refs = model(*inputs)
        refs = refs if isinstance(refs, tuple) else (refs,)
        exe = spyre_mlir.compile(model, inputs, precision=precision, cores=cores, cache_dir=False)
        outs = exe(*inputs)
    except SpyreError as e:
        return {"status": f"error:{type(e).__name__}", "error": " ".join(str(e).split())[:400],
                "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as e:      # anything else is a bug: a traceback from deep inside
        return {"status": f"crash:{type(e).__name__}", "error": " ".join(str(e).split())[:400],
                "seconds": round(time.perf_counter() - t0, 2)}
    worst = 0.0
    for out, ref in zip(outs, refs):
        ref = ref.detach().float().numpy()
        scale = max(float(np.abs(ref).max()), 1e-30)
        worst = max(worst, float(np.abs(np.asarray(out, dtype=np.float64) - ref).max()) / scale)
    return {"status": "pass" if worst <= TOLERANCE[precision] else "mismatch", "error_rel": worst,
            "host_ops": len(exe.compile_info.host_ops), "seconds": round(time.perf_counter() - t0, 2)}


def selected(cores, precisions, stride: int = 1, shard: str = "0/1"):
    """(case, cores, precision) in a stable order: every ``stride``-th, then every n-th of those from i."""
    i, n = (int(x) for x in shard.split("/"))
    runs = [(c, k, p) for c in CASES for k in cores for p in precisions][::stride]
    return runs[i::n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, nargs="+", default=[1, 2, 8, 32])
    ap.add_argument("--precision", nargs="+", default=["dlf16", "fp32-reference"])
    ap.add_argument("--stride", type=int, default=1, help="only every stride-th run (a quick slice)")
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th run from i")
    ap.add_argument("--out", default="build/shapes/results.jsonl")
    a = ap.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    counts: dict[str, int] = {}
    with open(a.out, "w") as out:
        for name, cores, precision in selected(a.cores, a.precision, a.stride, a.shard):
            r = {"case": name, "cores": cores, "precision": precision, **run_case(name, cores, precision)}
            out.write(json.dumps(r) + "\n")
            out.flush()
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            if r["status"] != "pass":
                print(f"{name} ({cores} cores, {precision}): {r['status']} {r.get('error', r.get('error_rel'))}",
                      flush=True)
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0 if set(counts) <= {"pass"} else 1


if __name__ == "__main__":
    sys.exit(main())
