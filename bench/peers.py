"""Benchmark: four models through spyre-mlir next to eager PyTorch, torch.compile and (when installed) IREE.

Each model is built from code with a seed (no downloads), compiled by ``spyre_mlir.compile`` (DLFloat16,
32 cores, cache off: the compile time is real), and run on the emulator at steady state (warm-up, then the
median of repeats) in the same process as eager PyTorch fp32 and torch.compile (inductor), so the ratios
compare like with like on whatever this host is doing. Per model it reports the emulator/eager ratio, the
modeled cycles, the fraction of the roofline the modeled run reaches, and the compile times. The roofline is
max(model FLOPs at the cores' DLFloat16 peak, compulsory bytes at DRAM read bandwidth), compulsory bytes being
inputs and outputs in fp32 and weights at their stored width (2 B for dlf16), each moved once; peak and
bandwidth come from the target file. Writes docs/performance.md and, with matplotlib, one roofline plot per
model in docs/perf/.

    .venv/bin/python bench/peers.py [--quick] [--repeat 5] [--models mlp decoder cnn matmul] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORES, PRECISION, WEIGHT_BYTES = 32, "dlf16", 2
# The emulator's warm-up, in seconds of calls: its worker process, forked at the first call, runs at half speed for
# its first ~0.1 s (measured: the CNN's first 37 calls at 2.8 ms, then 1.5 ms; pinning it to a CPU changes
# nothing, so the host's second CPU is what warms up), docs/runtime.md.
EMU_WARM_SECONDS = 0.5
COMPILES = 3          # compiles from linalg (spyre-mlir and IREE) timed per model; the table has the best


# ---- the models -------------------------------------------------------------------------------------------

class MLP(nn.Module):
    """3 x Linear(512) with ReLU between."""

    def __init__(self, d: int = 512):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, 4-head causal attention, RMSNorm, SiLU-gated MLP."""

    def __init__(self, d: int = 256, heads: int = 4, hidden: int = 688):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class CNN(nn.Module):
    """3 x (conv3x3 + ReLU + maxpool 2) then a Linear classifier, on a 64x64 RGB image."""

    def __init__(self, channels=(3, 16, 32, 64), classes: int = 10, size: int = 64):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(channels, channels[1:]))
        self.fc = nn.Linear(channels[-1] * (size // 8) ** 2, classes)

    def forward(self, x):
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return self.fc(x.flatten(1))


class MatMul(nn.Module):
    """a @ b, both operands inputs."""

    def forward(self, a, b):
        return a @ b


def build(name: str, seed: int = 0):
    """``(model, example inputs)``; weights and inputs depend only on ``seed``."""
    g = torch.manual_seed(seed)
    if name == "mlp":
        return MLP().eval(), (torch.randn(8, 512, generator=g),)
    if name == "decoder":
        return DecoderBlock().eval(), (torch.randn(1, 128, 256, generator=g),)
    if name == "cnn":
        return CNN().eval(), (torch.randn(1, 3, 64, 64, generator=g),)
    if name == "matmul":
        return MatMul().eval(), (torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g))
    raise ValueError(name)


MODELS = {"mlp": "MLP 3x Linear(512), batch 8", "decoder": "decoder block d256 seq 128",
          "cnn": "CNN 3x(conv3x3+ReLU+pool)+Linear, 64x64", "matmul": "matmul 1024^3 (both inputs)"}


# ---- measuring --------------------------------------------------------------------------------------------

def median_time(fn, warmup: int, repeat: int, warm_seconds: float = 0.0) -> float:
    """Median wall seconds of ``fn`` after ``warmup`` calls and at least ``warm_seconds`` of calls (the host is
    shared: the median, not the mean)."""
    t0 = time.perf_counter()
    n = 0
    while n < warmup or time.perf_counter() - t0 < warm_seconds:
        fn()
        n += 1
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def min_cpu_time(fn, warmup: int, repeat: int, other=lambda: 0.0) -> float:
    """Least CPU seconds of this process (all its threads) plus ``other()`` (another process's: the emulator's
    worker) over ``repeat`` calls of ``fn`` after ``warmup``: what a call costs, whatever else the shared host
    runs (wall medians swing 2x under load, this hardly moves)."""
    for _ in range(warmup):
        fn()
    best = math.inf
    for _ in range(repeat):
        t0 = time.process_time() + other()
        fn()
        best = min(best, time.process_time() + other() - t0)
    return best


def model_flops(model, inputs) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*inputs)
    return counter.get_total_flops()


def compulsory_bytes(model, inputs, outputs) -> int:
    """Inputs and outputs in fp32, weights (parameters and buffers) at their stored width, each moved once."""
    io = sum(t.numel() for t in list(inputs) + list(outputs)) * 4
    weights = sum(p.numel() for p in list(model.parameters()) + list(model.buffers())) * WEIGHT_BYTES
    return io + weights


def iree_compile_and_run(exe_inputs, imported, warmup: int, repeat: int):
    """IREE llvm-cpu on the same linalg IR spyre-mlir starts from: (compile s, run s), or None when the
    optional ``iree-base-compiler``/``iree-base-runtime`` packages are not importable."""
    try:
        import iree.compiler as ireec
        import iree.runtime as ireert
    except ImportError:
        return None
    out = {}

    def build():
        out["vmfb"] = ireec.compile_str(imported.linalg_ir, target_backends=["llvm-cpu"],
                                        extra_args=["--iree-llvmcpu-target-cpu=host"])
    compile_s = best_of(build)
    vmfb = out["vmfb"]
    config = ireert.Config("local-task")
    ctx = ireert.SystemContext(config=config)
    ctx.add_vm_module(ireert.VmModule.copy_buffer(ctx.instance, vmfb))
    main = ctx.modules.module["main"]
    args = [np.ascontiguousarray(x.numpy()) for x in exe_inputs] + [np.ascontiguousarray(p) for p in
                                                                    imported.params.values()]
    return compile_s, median_time(lambda: main(*args), warmup, repeat)


def best_of(fn, n: int = COMPILES) -> float:
    """The shortest of ``n`` timed calls of ``fn``: a compile's own time, without the host's noise (a garbage
    collection of the whole process, another job) that lands in one call."""
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def warm_up() -> dict:
    """Each compiler's first compile in this process (a Linear(8)): imports and one-time setup, so that the
    table's compile times are each model's own. Returns those first-compile seconds (None: IREE missing)."""
    import spyre_mlir
    from spyre_mlir.frontend import import_model

    model, inputs = nn.Linear(8, 8).eval(), (torch.randn(2, 8),)
    t0 = time.perf_counter()
    spyre_mlir.compile(model, inputs, precision=PRECISION, cores=CORES, cache_dir=False)
    out = {"spyre": time.perf_counter() - t0, "iree": None}
    try:
        import iree.compiler as ireec
    except ImportError:
        return out
    t0 = time.perf_counter()
    ireec.compile_str(import_model(model, inputs).linalg_ir, target_backends=["llvm-cpu"],
                      extra_args=["--iree-llvmcpu-target-cpu=host"])
    out["iree"] = time.perf_counter() - t0
    return out


def measure(name: str, args) -> dict:
    import spyre_mlir
    from spyre_mlir import cost
    from spyre_mlir.frontend import import_model
    from spyre_mlir.runtime import loader
    from spyre_mlir.target import load_target

    model, inputs = build(name)
    with torch.no_grad():
        ref = model(*inputs)
    r = {"name": name, "what": MODELS[name]}
    t0 = time.perf_counter()
    exe = spyre_mlir.compile(model, inputs, precision=PRECISION, cores=CORES, cache_dir=False)
    r["compile_s"] = time.perf_counter() - t0
    # From the linalg IR Torch-MLIR gives, as IREE compiles it below: the compilers alone, like for like.
    imported = import_model(model, inputs)

    def from_linalg():
        cost.clear_cache()          # cold each time: no remembered tile searches, no validated code to reuse
        loader.clear_cache()
        spyre_mlir.compile(imported, precision=PRECISION, cores=CORES, cache_dir=False)
    r["compile_linalg_s"] = best_of(from_linalg)
    (y,) = exe(*inputs)
    r["max_err"] = float(np.max(np.abs(y - ref.numpy())) / max(1e-30, float(ref.abs().max())))
    r["emu_s"] = median_time(lambda: exe(*inputs), args.warmup, args.repeat, EMU_WARM_SECONDS)
    r["emu_cpu_s"] = min_cpu_time(lambda: exe(*inputs), 0, args.repeat * 2, lambda: exe.worker_cpu_seconds)
    with torch.no_grad():
        r["eager_s"] = median_time(lambda: model(*inputs), args.warmup, args.repeat * 4)
        # Also on one thread, as the emulator runs: on a shared host, torch's thread pool waits for
        # descheduled threads and eager times swing by 10-100x; one thread is the steadier yardstick.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        r["eager1_s"] = median_time(lambda: model(*inputs), args.warmup, args.repeat * 4)
        r["eager1_cpu_s"] = min_cpu_time(lambda: model(*inputs), 0, args.repeat * 8)
        torch.set_num_threads(threads)
        if args.quick:
            r["inductor_s"] = r["inductor_compile_s"] = None
        else:
            compiled = torch.compile(model, backend="inductor")
            t0 = time.perf_counter()
            compiled(*inputs)
            r["inductor_compile_s"] = time.perf_counter() - t0
            r["inductor_s"] = median_time(lambda: compiled(*inputs), args.warmup, args.repeat * 4)
    iree = None
    try:
        iree = iree_compile_and_run(inputs, imported, args.warmup, args.repeat)
    except Exception as e:  # noqa: BLE001 - a peer failing is a result to report, not a reason to stop
        r["iree_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    r["iree_compile_s"], r["iree_s"] = iree if iree else (None, None)
    p = exe.profile
    target = load_target(cores=CORES)
    peak = target.peak_tflops_dlf16 * 1e12
    bw = target.dram_read_gbps * 1e9
    r["flops"] = model_flops(model, inputs)
    r["bytes"] = compulsory_bytes(model, inputs, [ref])
    r["roofline_s"] = max(r["flops"] / peak, r["bytes"] / bw)
    r.update(cycles=p.cycles, modeled_s=p.seconds, peak=peak, bw=bw, bound=p.bound,
             roofline_fraction=r["roofline_s"] / p.seconds)
    return r


# ---- reporting --------------------------------------------------------------------------------------------

def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.1f} s"


COLUMNS = ("model", "spyre compile", "spyre compile from linalg", "emulator", "eager fp32", "emulator / eager", "eager fp32 1 thread",
           "emulator / eager 1 thread", "emulator / eager 1 thread, CPU time", "inductor (compile)",
           "IREE llvm-cpu (compile)", "modeled cycles", "roofline fraction", "max rel err")


def rows(results) -> list[list[str]]:
    out = []
    for r in results:
        iree = (f"{_ms(r['iree_s'])} ({_ms(r['iree_compile_s'])})" if r["iree_s"] is not None
                else "failed" if "iree_error" in r else "skipped")
        out.append([r["what"], _ms(r["compile_s"]), _ms(r["compile_linalg_s"]), _ms(r["emu_s"]), _ms(r["eager_s"]),
                    f"{r['emu_s'] / r['eager_s']:.1f}x", _ms(r["eager1_s"]), f"{r['emu_s'] / r['eager1_s']:.1f}x",
                    f"{r['emu_cpu_s'] / r['eager1_cpu_s']:.1f}x",
                    "skipped" if r["inductor_s"] is None else
                    f"{_ms(r['inductor_s'])} ({_ms(r['inductor_compile_s'])})",
                    iree, f"{r['cycles']:,.0f}", f"{r['roofline_fraction']:.1%}", f"{r['max_err']:.1e}"])
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    load = ", load average {:.1f} at the end".format(os.getloadavg()[0]) if hasattr(os, "getloadavg") else ""
    from spyre_mlir.runtime import native

    conversions = "native (torch-mlir JIT)" if native.available() else "numpy (SPYRE_EMU_NATIVE=0)"
    return (f"{cpu}, {os.cpu_count()} logical CPUs{load}, {platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}; the emulator's "
            f"DLFloat16 conversions: {conversions}")


def plot(results, outdir: str) -> list[str]:
    """One roofline plot per model: the target's roofline and the modeled run, at the model's intensity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    paths = []
    for r in results:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        x = np.logspace(-1, 4, 200)
        ax.loglog(x, np.minimum(r["peak"], r["bw"] * x), label="roofline (32 cores, dlf16)")
        intensity = r["flops"] / r["bytes"]
        ax.loglog([intensity], [r["flops"] / r["modeled_s"]], "o", label="modeled run")
        ax.loglog([intensity], [r["flops"] / r["roofline_s"]], "x", label="roofline bound")
        ax.set_xlabel("FLOP per compulsory byte")
        ax.set_ylabel("FLOP/s")
        ax.set_title(r["what"], fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(outdir, f"roofline-{r['name']}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def write_doc(results, path: str, plots: list[str], args, first: dict) -> None:
    iree_first = f", IREE {first['iree']:.2f} s" if first["iree"] is not None else ""
    lines = ["# Performance", "",
             f"Measured by `bench/peers.py{' --quick' if args.quick else ''}` on "
             f"{datetime.date.today().isoformat()}, on {machine()}.", "",
             "Every number of a row comes from one run of one process: spyre-mlir compiles the model (DLFloat16, "
             "32 cores, cache off), the emulator runs it at steady state (a warm-up of at least "
             f"{args.warmup} calls and {EMU_WARM_SECONDS} s, as its worker process runs at half speed for its first "
             f"~0.1 s, then the median of {args.repeat} runs), next to eager PyTorch fp32 and torch.compile (inductor) on the same inputs. "
             "*Modeled cycles* are the cycle model's latency on the card; *roofline fraction* is the roofline "
             "time (the larger of the model's FLOPs at the cores' DLFloat16 peak and its compulsory bytes - "
             "inputs and outputs in fp32, weights at 2 B, each moved once - at DRAM read bandwidth, from the "
             "target file) over the modeled time. The emulator's numbers are wall time of a bit-exact emulation "
             "on the host CPU, not the card's; a run of a big program uses two host processes (the emulator's "
             "worker runs half the cores of each big segment, docs/runtime.md), as eager uses two threads. The "
             "*CPU time* ratio compares the least CPU time of a call (the process's, all its threads, plus the "
             "emulator's worker's, its waits included) over the runs, of the emulator and of eager on one thread, "
             "which a shared host hardly moves. torch.compile's compile time is with inductor's on-disk cache as "
             "the host has it. The host may be shared: the load average is the 1-minute one at the end of the run. "
             "*spyre compile* starts from the PyTorch module (torch.export, Torch-MLIR, our passes, the binary, "
             "the loader); *from linalg* starts from the linalg IR Torch-MLIR gives, the IR IREE compiles, so "
             f"that pair of compile times is like for like (each the best of {COMPILES} compiles, as a garbage "
             "collection or another job on the host can land in one; each of ours cold: the cost model's "
             "remembered searches and the loader's validated programs are cleared first). Compile times are each model's own: a "
             "warm-up compile of a Linear(8) runs first in the process, as "
             "the first compile also imports and sets up the compiler (that first compile took: spyre-mlir "
             f"{first['spyre']:.2f} s{iree_first}).",
             "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    lines += ["", "IREE columns need the optional packages (`pip install -e '.[peers]'`); \"skipped\" means they "
              "were not importable.", ""]
    if plots:
        lines += ["Roofline plots: " + ", ".join(f"[{os.path.basename(p)}](perf/{os.path.basename(p)})"
                                                 for p in plots) + ".", ""]
    lines += ["## Reproduce", "", "```sh", "make bench                        # every bench/*.py, this one included",
              ".venv/bin/python bench/peers.py   # this table only; --quick skips torch.compile",
              ".venv/bin/python bench/compile_matmul.py --sizes 1024 4096   # 1 -> 32 core scaling, DRAM bytes, and "
              "compile time against the size",
              ".venv/bin/python bench/compile_depth.py   # compile time against a model's depth (2, 8, 32 layers)",
              ".venv/bin/python bench/cache_hit.py   # a compile-cache hit against a cold compile", "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip torch.compile, fewer repeats")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per measurement (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = ap.parse_args(argv)
    args.repeat = args.repeat or (3 if args.quick else 7)
    warnings.filterwarnings("ignore")
    console = Console(width=200)
    first = warm_up()
    results = []
    for name in args.models:
        console.print(f"[bold]{MODELS[name]}[/bold] ...", highlight=False)
        results.append(measure(name, args))
        if "iree_error" in results[-1]:
            console.print(f"  IREE failed: {results[-1]['iree_error']}", highlight=False)
    table = Table(title=f"spyre-mlir ({PRECISION}, {CORES} cores) vs peers, {machine()}")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in rows(results):
        table.add_row(*row)
    console.print(table)
    if results[0]["iree_s"] is None and "iree_error" not in results[0]:
        console.print("IREE columns skipped: iree-base-compiler / iree-base-runtime are not importable "
                      "(pip install -e '.[peers]').", markup=False)
    if args.no_write:
        return 0
    plots = []
    try:
        plots = plot(results, os.path.join(ROOT, "docs", "perf"))
    except ImportError:
        console.print("roofline plots skipped: matplotlib is not installed (pip install -e '.[peers]').",
                      markup=False)
    write_doc(results, os.path.join(ROOT, "docs", "performance.md"), plots, args, first)
    console.print(f"wrote docs/performance.md{' and ' + str(len(plots)) + ' plots in docs/perf/' if plots else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
