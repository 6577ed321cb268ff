"""End to end: PyTorch model -> spyre_mlir.compile -> emulator, compared with eager PyTorch.

Tolerances, relative to the largest magnitude of the reference output (max|ref|):

* ``fp32-reference``: the emulator runs the same program without rounding, so only fp32 reassociation is
  left: ``|err| <= 1e-5 * max|ref|``.
* ``dlf16``: one DLFloat16 rounding is at most 2^-10 relative (docs/numerics.md). Dot products accumulate in
  fp32, so each layer adds about two roundings of its inputs/outputs; the models here have at most ~4 layers
  on the longest path, and errors relative to max|ref| add up to at most ``8 * 2^-10 * max|ref|`` (about
  7.8e-3; measured 0.9e-3 to 1.7e-3).
* ``fp8`` (e4m3, 2^-4 per rounding) and ``int8-weights`` (per-channel scales, scale/2 absolute): the error is
  printed; the loose bounds 0.1 and 0.03 of max|ref| catch a broken scale, not a precision regression.
"""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spyre_mlir  # noqa: E402
from spyre_mlir.frontend import import_model  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
DLF16_BOUND = 8 * 2.0**-10
LOOSE = {"fp8": 0.1, "int8-weights": 0.03}


def _example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(0)


class Attention(torch.nn.Module):
    """One self-attention head with a residual and RMSNorm: batch matmuls, softmax, transposes."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        return x + self.out(a @ v)


class Gated(torch.nn.Module):
    """A SiLU-gated MLP with a per-channel broadcast and a row reduction."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256)
        self.gate = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 64)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 64))

    def forward(self, x):
        h = torch.nn.functional.silu(self.gate(x)) * self.up(x)
        y = self.down(h) * self.scale
        return y - y.mean(dim=-1, keepdim=True)


class Block(torch.nn.Module):
    """A pre-norm decoder block as hand-written models have it: one qkv projection viewed as heads, permuted and
    split on its leading dim (views of its bytes), causal SDPA, residual adds and a SiLU-gated MLP (one map,
    applied by the up projection, reading gate's result)."""

    def __init__(self, d=128, heads=2, hidden=192):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.out = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        y = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


def _custom(name):
    gen = torch.manual_seed(1)
    if name == "attention":
        return Attention().eval(), (torch.randn(2, 16, 64, generator=gen),)
    if name == "block":
        return Block().eval(), (torch.randn(1, 32, 128, generator=gen),)
    return Gated().eval(), (torch.randn(8, 128, generator=gen),)


MODELS = ["mlp", "cnn", "transformer", "attention", "gated", "block"]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    name = request.param
    m, ex = _example(name) if name in ("mlp", "cnn", "transformer") else _custom(name)
    with torch.no_grad():
        ref = m(*ex)
    ref = [r.numpy() for r in (ref if isinstance(ref, (tuple, list)) else (ref,))]
    return name, import_model(m, ex), ex, ref


def _check(name, exe, ex, ref, precision, cores):
    outs = exe(*ex)
    for o, r in zip(outs, ref):
        err = float(np.max(np.abs(o - r)))
        scale = float(np.max(np.abs(r)))
        print(f"{name} {precision} {cores} cores: max abs err {err:.3e} ({err / scale:.2e} of max|ref|), "
              f"{exe.profile.cycles:.0f} cycles, scratchpad peak {exe.profile.scratchpad_peak_bytes} B, "
              f"host ops {len(exe.compile_info.host_ops)}")
        if precision == "fp32-reference":
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5 * scale)
        elif precision == "dlf16":
            assert err <= DLF16_BOUND * scale, f"{err} > {DLF16_BOUND} * {scale}"
        else:
            assert err <= LOOSE[precision] * scale
    assert exe.profile.cycles > 0
    assert 0 < exe.profile.scratchpad_peak_bytes <= exe.target.scratchpad_usable_bytes


@pytest.mark.parametrize("cores", [1, 4, 32])
@pytest.mark.parametrize("precision", ["fp32-reference", "dlf16"])
def test_model_matches_pytorch(model, precision, cores, tmp_path):
    name, imported, ex, ref = model
    exe = spyre_mlir.compile(imported, precision=precision, cores=cores, cache_dir=str(tmp_path))
    assert exe.compile_info.cores == cores and exe.program.num_cores == cores
    _check(name, exe, ex, ref, precision, cores)
    if precision == "dlf16":
        # Everything of these models has a device kernel, the transformer's embedding lookup included (GATHER;
        # the k^T transposes, the innermost dim moving, are RESTICKs in device memory).
        assert exe.compile_info.host_ops == [], exe.compile_info.host_ops


@pytest.mark.parametrize("precision", ["fp8", "int8-weights"])
def test_quantized_weights_report_error(model, precision, tmp_path):
    name, imported, ex, ref = model
    exe = spyre_mlir.compile(imported, precision=precision, cores=4, cache_dir=str(tmp_path))
    _check(name, exe, ex, ref, precision, 4)


def test_compiles_from_several_threads_take_turns(in_threads):
    """Threads that compile at once (a server loading models) each get their model: torch.export keeps its tracing
    state process-wide, and four compiles at once all failed in it."""
    got = {}

    def build(k):
        torch.manual_seed(k)
        m = torch.nn.Sequential(torch.nn.Linear(64 + 32 * k, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
        x = torch.randn(4, 64 + 32 * k)
        (y,) = spyre_mlir.compile(m, (x,), cache_dir=False)(x)
        with torch.no_grad():
            got[k] = np.abs(np.asarray(y) - m(x).numpy()).max() / np.abs(m(x).numpy()).max()
    errors = in_threads(build, [(k,) for k in range(3)])
    assert not errors and sorted(got) == [0, 1, 2] and max(got.values()) < 1e-2, (errors, got)


def test_cache_reuses_the_binary(tmp_path):
    m, ex = _example("mlp")
    imported = import_model(m, ex)
    a = spyre_mlir.compile(imported, precision="dlf16", cores=2, cache_dir=str(tmp_path))
    b = spyre_mlir.compile(imported, precision="dlf16", cores=2, cache_dir=str(tmp_path))
    c = spyre_mlir.compile(imported, precision="fp8", cores=2, cache_dir=str(tmp_path))
    assert not a.compile_info.cache_hit and b.compile_info.cache_hit and not c.compile_info.cache_hit
    assert a.compile_info.key == b.compile_info.key != c.compile_info.key
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".spyre")) == \
        sorted([a.compile_info.key + ".spyre", c.compile_info.key + ".spyre"])
    assert b.compile_info.host_ops == a.compile_info.host_ops
    np.testing.assert_array_equal(a(*ex)[0], b(*ex)[0])


def test_cache_hit_skips_the_import(tmp_path, monkeypatch):
    """A module is found by its exported program and a model file by its bytes, before Torch-MLIR runs (a file
    is not even loaded); other weights or options miss."""
    import spyre_mlir.frontend.importer as importer
    import spyre_mlir.frontend.load as load

    m, ex = _example("mlp")
    a = spyre_mlir.compile(m, ex, cores=2, cache_dir=str(tmp_path))
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(m, ex), str(path))
    f = spyre_mlir.compile(str(path), cores=2, cache_dir=str(tmp_path))
    assert f.compile_info.cache_hit and f.compile_info.key == a.compile_info.key    # the same linalg IR

    def no_import(*args, **kwargs):
        raise AssertionError("Torch-MLIR ran on a cache hit")

    monkeypatch.setattr(importer, "import_program", no_import)
    b = spyre_mlir.compile(m, ex, cores=2, cache_dir=str(tmp_path))
    assert b.compile_info.cache_hit and b.compile_info.key == a.compile_info.key
    np.testing.assert_array_equal(a(*ex)[0], b(*ex)[0])
    monkeypatch.setattr(load, "load_program", no_import)
    assert spyre_mlir.compile(str(path), cores=2, cache_dir=str(tmp_path)).compile_info.cache_hit
    monkeypatch.undo()
    with torch.no_grad():
        next(m.parameters()).add_(1.0)
    c = spyre_mlir.compile(m, ex, cores=2, cache_dir=str(tmp_path))
    d = spyre_mlir.compile(m, ex, cores=4, cache_dir=str(tmp_path))
    assert not c.compile_info.cache_hit and not d.compile_info.cache_hit
    assert len({a.compile_info.key, c.compile_info.key, d.compile_info.key}) == 3


def test_env_cache_dir_and_compile_to_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPYRE_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    m, ex = _example("mlp")
    out = tmp_path / "mlp.spyre"
    path = spyre_mlir.compile_to_file(m, ex, output=str(out), precision="dlf16", cores=4)
    assert path == str(out) and out.exists()
    assert len([f for f in os.listdir(tmp_path / "cache") if f.endswith(".spyre")]) == 1
    from spyre_mlir.runtime import load

    (y,) = load(str(out))(ex[0].numpy())
    assert y.shape == (4, 10)


def test_bad_requests_are_clear():
    m, ex = _example("mlp")
    with pytest.raises(spyre_mlir.CompileError, match="unknown precision"):
        spyre_mlir.compile(m, ex, precision="fp16")
    with pytest.raises(spyre_mlir.CompileError, match="cannot use 33 cores"):
        spyre_mlir.compile(m, ex, cores=33)


@pytest.mark.parametrize("enabled", [True, False])
def test_compile_pauses_the_collector_and_restores_it(enabled, monkeypatch):
    """The garbage collector is paused while a program is built and left as it was found, when the compile
    fails too."""
    import gc

    from spyre_mlir.frontend import importer

    seen = []
    real = importer.import_program
    monkeypatch.setattr(importer, "import_program", lambda ep: (seen.append(gc.isenabled()), real(ep))[1])
    (gc.enable if enabled else gc.disable)()
    try:
        model = torch.nn.Linear(8, 8)
        spyre_mlir.compile(model, (torch.randn(2, 8),), cache_dir=False)
        assert seen == [False] and gc.isenabled() == enabled
        with pytest.raises(spyre_mlir.CompileError, match="unknown precision"):
            spyre_mlir.compile(model, (torch.randn(2, 8),), cache_dir=False, precision="fp4")
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_cli_binary_and_errors(tmp_path):
    m, ex = _example("mlp")
    pt = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(m, ex), str(pt))
    exe = os.path.join(os.path.dirname(sys.executable), "spyre-compile")
    out = tmp_path / "mlp.spyre"
    r = subprocess.run([exe, str(pt), "--emit=binary", "-o", str(out), "--cores", "4"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert out.exists()
    r = subprocess.run([exe, str(pt), "--emit=program", "--cores", "2", "--precision", "fp32-reference"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "core 1:" in r.stdout and "matmul" in r.stdout
    for bad in (["--cores", "0"], ["--precision", "fp4"], ["--target", str(tmp_path / "nope.toml")]):
        r = subprocess.run([exe, str(pt), "--emit=kernel", *bad], capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "error" in r.stderr, bad


def test_cli_default_compiles_to_a_binary_spyre_run_runs(tmp_path):
    """`spyre-compile model.pt` then `spyre-run model.spyre`: PyTorch's answer at the target's precision."""
    m, ex = _example("mlp")
    pt = tmp_path / "model.pt"
    torch.export.save(torch.export.export(m, ex), str(pt))
    bindir = os.path.dirname(sys.executable)
    r = subprocess.run([os.path.join(bindir, "spyre-compile"), str(pt), "--cores", "4"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.savez(tmp_path / "in.npz", *[t.numpy() for t in ex])
    r = subprocess.run([os.path.join(bindir, "spyre-run"), "model.spyre", "-i", "in.npz", "-o", "out.npz"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    y, ref = np.load(tmp_path / "out.npz")["output_0"], m(*ex).detach().numpy()
    assert np.abs(y - ref).max() <= 8 * 2.0**-10 * np.abs(ref).max()


def test_import_stays_light():
    code = "import sys, spyre_mlir; assert 'torch' not in sys.modules and 'torch_mlir' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_compile_to_a_path_with_spaces(tmp_path):
    """The output path travels as a pass option (spyre-emit{output=...}): spaces must survive it."""
    import spyre_mlir

    out = tmp_path / "my models" / "linear model.spyre"
    out.parent.mkdir()
    spyre_mlir.compile_to_file(torch.nn.Linear(8, 4), (torch.randn(2, 8),), output=str(out), cache_dir=False,
                               cores=2)
    assert out.exists() and out.stat().st_size > 0


class MaskedAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_fully_masked_attention_rows_are_zero(precision):
    """A query row whose boolean mask is all False attends to nothing: PyTorch's _safe_softmax gives zeros
    (one spyre.softmax {safe}). In DLFloat16 the -inf fill saturates to -DLF16_MAX, which the kernel reads as
    masked too; before, that row came out as a uniform average of v."""
    g = torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g) for _ in range(3))
    mask = torch.rand(16, 16, generator=g) > 0.3
    mask[5] = False
    with torch.no_grad():
        ref = MaskedAttention()(q, k, v, mask).numpy()
    exe = spyre_mlir.compile(MaskedAttention(), (q, k, v, mask), precision=precision, cores=4, cache_dir=False)
    y = exe(q, k, v, mask)[0]
    assert not np.isnan(y).any()
    np.testing.assert_array_equal(y[0, :, 5], 0.0)
    scale = float(np.abs(ref).max())
    bound = 1e-5 if precision == "fp32-reference" else DLF16_BOUND
    assert float(np.abs(y - ref).max()) <= bound * scale


class _HeadsT(torch.nn.Module):
    """x's heads, each transposed: a head permute (rows moved) feeding a swap of the last two dims (RESTICK)."""

    def forward(self, x):
        return x.view(1, 32, 2, 64).permute(0, 2, 3, 1)


def _kernel_ir(tmp_path, m, ex, name):
    pt = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(m, ex), str(pt))
    bindir = os.path.dirname(sys.executable)
    r = subprocess.run([os.path.join(bindir, "spyre-compile"), str(pt), "--emit=kernel", "--cores", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ops = [ln for ln in r.stdout.splitlines() if '"spyre.transpose"' in ln or '"spyre.reshape"' in ln]
    return r.stdout, ops, [ln.split('spyre.kernel = "')[1].split('"')[0] for ln in ops]


def test_permuted_qkv_is_read_in_place(tmp_path):
    """The block's permuted qkv is a row view of the projection's result (kernel `alias`, no copy): q, k and v
    reach the attention matmuls through strided row gathers, k read transposed (MATMUL TRANS_B), so no data
    movement kernel runs for them. A swap of the last two dims (a RESTICK, which reads by address) gets a copy
    of a permuted view (its reshape moves rows, `dma-rows`); forced into the RESTICK, the view is a located
    compiler error."""
    out, ops, kernel = _kernel_ir(tmp_path, *_custom("block"), "block")
    qkv = next(i for i, ln in enumerate(ops) if "array<i64: 2, 0, 3, 1, 4>" in ln)
    assert kernel[qkv] == "alias"
    assert "restick" not in kernel and "transpose_rhs = true" in out
    out, ops, kernel = _kernel_ir(tmp_path, _HeadsT(), (torch.randn(1, 32, 128),), "heads")
    restick = kernel.index("restick")
    assert kernel[restick - 1] == "dma-rows"
    # The same IR with the copy turned into a view: the RESTICK would read the view's bytes.
    forced = out.replace(ops[restick - 1], ops[restick - 1].replace('"dma-rows"', '"alias"'))
    src = tmp_path / "forced.mlir"
    src.write_text(forced)
    bindir = os.path.dirname(sys.executable)
    r = subprocess.run([os.path.join(bindir, "spyre-opt"), str(src), "-p",
                        f"builtin.module(spyre-emit{{output={tmp_path / 'forced.spyre'}}})"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "forced.mlir:" in r.stderr and "(kernel restick) reads a row view" in r.stderr, r.stderr
    assert not (tmp_path / "forced.spyre").exists()


class Rotary(torch.nn.Module):
    """Rotary position embedding as Hugging Face writes it: q and k rotated with rotate_half."""

    def __init__(self, d=64, heads=4, seq=16):
        super().__init__()
        self.q, self.k, self.h, self.d = torch.nn.Linear(d * heads, d * heads), torch.nn.Linear(d * heads, d * heads), heads, d
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None])
        self.register_buffer("sin", emb.sin()[None, None])

    def forward(self, x):
        def heads(t):
            return t.view(1, -1, self.h, self.d).transpose(1, 2)

        def rotate_half(t):
            return torch.cat((-t[..., self.d // 2:], t[..., :self.d // 2]), dim=-1)

        q, k = heads(self.q(x)), heads(self.k(x))
        q, k = q * self.cos + rotate_half(q) * self.sin, k * self.cos + rotate_half(k) * self.sin
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


@pytest.mark.parametrize("d", [64, 16])
def test_rotate_half_is_one_matmul(d, monkeypatch):
    """rotate_half's slices, negation and concat become one matmul by a constant signed selection
    (spyre-columns-to-matmul) whose kernel applies ``x * cos + rotate_half(x) * sin`` (an epilogue with two fp32
    temporaries): no slice, concat or map kernel runs, the heads' transposes are read in place, and the output
    is bit-identical to the program compiled without the rewrite, in fewer modeled cycles."""
    from spyre_mlir import pipeline

    torch.manual_seed(0)
    model, x = Rotary(d=d).eval(), torch.randn(1, 16, 4 * d)
    exe = spyre_mlir.compile(model, (x,), cache_dir=False, cores=8)
    ops = exe.compile_info.device_ops
    assert not {"spyre.slice", "spyre.concat", "spyre.transpose", "spyre.map"} & set(ops), ops
    assert ops.count("spyre.matmul") == 4      # the projections, and the selections applying x*cos + rot*sin
    full = pipeline.kernel_pipeline
    monkeypatch.setattr(pipeline, "kernel_pipeline",
                        lambda *a, **k: full(*a, **k).replace("spyre-columns-to-matmul,", ""))
    plain = spyre_mlir.compile(model, (x,), cache_dir=False, cores=8)
    assert "spyre.concat" in plain.compile_info.device_ops + plain.compile_info.host_ops
    (y,), (y0,) = exe(x), plain(x)
    assert np.array_equal(y, y0)
    assert exe.static_profile.cycles < plain.static_profile.cycles
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(y - ref).max() <= DLF16_BOUND * np.abs(ref).max()


class Viewed(torch.nn.Module):
    """A Linear over the flattened tokens, its [B*S, N] result returned as [B, S, N]."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(256, 128)

    def forward(self, x):
        return self.lin(x.view(-1, 256)).view(2, 64, 128)


@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_viewed_result_is_written_in_place(precision):
    """The reshape of the matmul's result is the output: the matmul writes the output buffer itself (no host copy)
    and, in dlf16, the widening to f32 folds into its write-back through the reshape (no cast kernel)."""
    torch.manual_seed(0)
    model, x = Viewed().eval(), torch.randn(2, 64, 256)
    exe = spyre_mlir.compile(model, (x,), cache_dir=False, cores=8, precision=precision)
    info = exe.compile_info
    assert info.host_ops == [] and info.device_ops.count("spyre.cast") == (precision == "dlf16"), info
    with torch.no_grad():
        ref = model(x).numpy()
    err = np.abs(exe(x)[0] - ref).max() / np.abs(ref).max()
    assert err <= (DLF16_BOUND if precision == "dlf16" else 1e-5), err


def _with_and_without(pass_name, model, x, monkeypatch, **kw):
    """(the program spyre_mlir.compile builds, the one it builds without kernel-pipeline pass ``pass_name``)."""
    from spyre_mlir import pipeline

    exe = spyre_mlir.compile(model, (x,), cache_dir=False, **kw)
    full = pipeline.kernel_pipeline
    monkeypatch.setattr(pipeline, "kernel_pipeline",
                        lambda *a, **k: re.sub(re.escape(pass_name) + r"(\{[^}]*\})?,", "", full(*a, **k)))
    return exe, spyre_mlir.compile(model, (x,), cache_dir=False, **kw)


def _cheaper(exe, plain) -> bool:
    """``exe`` takes fewer modeled cycles and moves fewer DRAM bytes than ``plain``."""
    p, p0 = exe.static_profile, plain.static_profile
    return p.cycles < p0.cycles and p.dram_read_bytes + p.dram_write_bytes < p0.dram_read_bytes + p0.dram_write_bytes


class SwiGLU(torch.nn.Module):
    """A Llama MLP: down(silu(gate(x)) * up(x)), plus a residual."""

    def __init__(self, d=256, hidden=384):
        super().__init__()
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("precision,cores,shape", [("dlf16", 1, (64, 256, 384)), ("dlf16", 8, (64, 256, 384)),
                                                   ("dlf16", 32, (64, 256, 384)), ("fp8", 8, (64, 256, 384)),
                                                   ("fp32-reference", 4, (64, 256, 384)),
                                                   ("fp8", 32, (8, 2048, 64))])      # K split: gred
def test_gate_is_computed_by_the_up_projection(precision, cores, shape, monkeypatch):
    """The gate projection is the up projection's sibling (spyre-siblings): up's kernel multiplies each A tile
    by both weights and hands gate's finished tile to its epilogue, so gate's result never round-trips device
    memory and its A is read once. Bit-identical to the program with two kernels (the same tiles and K order),
    in fewer modeled cycles and DRAM bytes."""
    rows, d, hidden = shape
    torch.manual_seed(0)
    model, x = SwiGLU(d, hidden).eval(), torch.randn(rows, d)
    exe, plain = _with_and_without("spyre-siblings", model, x, monkeypatch, precision=precision, cores=cores)
    assert exe.compile_info.device_ops.count("spyre.matmul") == 2       # up (with gate) and down
    assert plain.compile_info.device_ops.count("spyre.matmul") == 3
    (y,), (y0,) = exe(x), plain(x)
    assert np.array_equal(y, y0) and _cheaper(exe, plain)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(y - ref).max() <= LOOSE.get(precision, DLF16_BOUND) * np.abs(ref).max()


class PreNorm(torch.nn.Module):
    """A norm feeding a Linear, as before every projection of a pre-norm transformer: RMSNorm, or LayerNorm (and
    a Linear with a bias)."""

    def __init__(self, kind, d, n):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6) if kind == "rms" else torch.nn.LayerNorm(d)
        self.lin = torch.nn.Linear(d, n, bias=kind != "rms")
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            if kind != "rms":
                self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.lin(self.norm(x))


@pytest.mark.parametrize("kind,precision,cores,shape,same_tile", [
    ("rms", "dlf16", 32, (128, 256, 512), True), ("layer", "dlf16", 32, (64, 512, 256), True),
    ("rms", "dlf16", 8, (128, 256, 512), False), ("layer", "fp8", 32, (32, 1024, 256), False),
    ("rms", "dlf16", 1, (128, 256, 512), True)])
def test_norm_is_the_matmuls_prologue(kind, precision, cores, shape, same_tile, monkeypatch):
    """spyre-norm-prologues: the matmul's kernel loads the norm's input rows in place of each A tile and applies
    the norm's micro-ops to them, so the norm's result never round-trips device memory, in fewer modeled cycles and
    DRAM bytes. With the matmul's K tile already K, bit-identical to the two kernels; where the pass made it K (one
    K step), within a DLFloat16 rounding of them. On one core the cost model keeps the norm's own kernel."""
    rows, d, n = shape
    torch.manual_seed(0)
    model, x = PreNorm(kind, d, n).eval(), torch.randn(1, rows, d)
    exe, plain = _with_and_without("spyre-norm-prologues", model, x, monkeypatch, precision=precision, cores=cores)
    norm = "spyre.rmsnorm" if kind == "rms" else "spyre.layernorm"
    assert norm in plain.compile_info.device_ops
    (y,), (y0,) = exe(x), plain(x)
    if cores == 1:
        assert norm in exe.compile_info.device_ops and np.array_equal(y, y0)
    else:
        assert norm not in exe.compile_info.device_ops and _cheaper(exe, plain)
        assert np.array_equal(y, y0) if same_tile else np.abs(y - y0).max() <= 2.0**-9 * np.abs(y0).max()
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(y - ref).max() <= LOOSE.get(precision, DLF16_BOUND) * np.abs(ref).max()


class NormedResidual(torch.nn.Module):
    """A decoder block's start: the model input read by a norm (random weight) before a Linear and by the
    residual add after it."""

    def __init__(self, kind, d=256, n=256):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6) if kind == "rms" else torch.nn.LayerNorm(d)
        self.q = torch.nn.Linear(d, n, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.25, 2.0)

    def forward(self, x):
        return x + self.q(self.norm(x))


@pytest.mark.parametrize("kind,precision,cores", [("rms", "dlf16", 32), ("layer", "dlf16", 8), ("rms", "fp8", 32)])
def test_input_read_by_sfu_work_needs_no_cast(kind, precision, cores):
    """spyre-fuse: the f32 model input only the norm and the residual add read is read by them as it is: no cast
    kernel writes a DLFloat16 copy of it, and the answer is PyTorch's within the format's rounding."""
    torch.manual_seed(0)
    model, x = NormedResidual(kind).eval(), torch.randn(1, 64, 256)
    exe = spyre_mlir.compile(model, (x,), precision=precision, cores=cores, cache_dir=False)
    assert "spyre.cast" not in exe.compile_info.device_ops, exe.compile_info.device_ops
    (y,) = exe(x)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(y - ref).max() <= LOOSE.get(precision, DLF16_BOUND) * np.abs(ref).max()


class NormedProjections(torch.nn.Module):
    """A decoder block's pre-norm projections: one norm (random weight) read by two Linears."""

    def __init__(self, kind, d=256, n=256):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6) if kind == "rms" else torch.nn.LayerNorm(d, bias=False)
        self.q, self.k = torch.nn.Linear(d, n, bias=False), torch.nn.Linear(d, n, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.25, 2.0)

    def forward(self, x):
        y = self.norm(x)
        return self.q(y) * self.k(y)


@pytest.mark.parametrize("kind,precision,cores", [("rms", "dlf16", 32), ("layer", "dlf16", 8), ("rms", "fp8", 32),
                                                  ("rms", "fp32-reference", 4)])
def test_norm_weight_folds_into_the_projections(kind, precision, cores, monkeypatch):
    """spyre-fold-norm-weights: each Linear reading the norm multiplies by diag(w) W, so no kernel loads the
    norm's weight or multiplies by it: fewer DMA transfers and modeled cycles, PyTorch's answer within the
    format's rounding, as without the pass."""
    torch.manual_seed(0)
    model, x = NormedProjections(kind).eval(), torch.randn(1, 64, 256)
    exe, plain = _with_and_without("spyre-fold-norm-weights", model, x, monkeypatch, precision=precision,
                                   cores=cores)
    loads = [sum(1 for e in p.static_profile.events if e.unit == "DMA") for p in (exe, plain)]
    assert loads[0] < loads[1] and exe.static_profile.cycles < plain.static_profile.cycles
    (y,), (y0,) = exe(x), plain(x)
    with torch.no_grad():
        ref = model(x).numpy()
    bound = 1e-5 if precision == "fp32-reference" else LOOSE.get(precision, DLF16_BOUND)
    for out in (y, y0):
        assert np.abs(out - ref).max() <= bound * np.abs(ref).max()


class Heads(torch.nn.Module):
    """Causal multi-head attention, its own projections: softmax(q @ k^T / sqrt(d) + mask) @ v per head."""

    def __init__(self, d=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a.transpose(1, 2).reshape(b, t, d)


@pytest.mark.parametrize("precision,cores", [("dlf16", 1), ("dlf16", 8), ("dlf16", 32), ("fp8", 32)])
def test_attention_probabilities_stay_on_the_cores(precision, cores, monkeypatch):
    """P @ V is chained to the softmax (spyre-chain-matmuls): the kernel computing softmax(q @ k^T + mask)
    multiplies each finished P tile by its head's V and stores only the product, so P never reaches device memory.
    The same P values and one K step: the program with two kernels' result, but for fp32 sums the emulator's BLAS
    may group differently for the P tile's row count (at most one DLFloat16 rounding apart), in fewer modeled
    cycles and DRAM bytes."""
    torch.manual_seed(0)
    model, x = Heads().eval(), torch.randn(1, 64, 256)
    exe, plain = _with_and_without("spyre-chain-matmuls", model, x, monkeypatch, precision=precision, cores=cores)
    assert exe.compile_info.device_ops.count("spyre.batch_matmul") == 1
    assert plain.compile_info.device_ops.count("spyre.batch_matmul") == 2
    (y,), (y0,) = exe(x), plain(x)
    assert np.abs(y - y0).max() <= 2.0**-10 * np.abs(y0).max() and _cheaper(exe, plain)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(y - ref).max() <= LOOSE.get(precision, DLF16_BOUND) * np.abs(ref).max()


@pytest.mark.parametrize("d, heads", [(384, 12), (768, 8)])
def test_heads_that_are_not_whole_sticks_stay_on_the_device(d, heads):
    """Heads of 32 (a MiniLM-style encoder) and 96 (Phi-3) are not whole DLFloat16 sticks (64 elements): the
    view into heads and the merge back are selection matmuls over rows of lcm(head, 64) elements, not the host."""
    torch.manual_seed(0)
    m, x = Heads(d, heads).eval(), torch.randn(1, 32, d)
    exe = spyre_mlir.compile(m, (x,), cores=8, cache_dir=False)
    assert exe.compile_info.host_ops == [], exe.compile_info.host_ops
    (y,) = exe(x)
    with torch.no_grad():
        ref = m(x).numpy()
    assert np.abs(y - ref).max() <= DLF16_BOUND * np.abs(ref).max()


@pytest.mark.parametrize("model, shape, cores", [(SwiGLU, (128, 256), 8), (Heads, (1, 64, 256), 8),
                                                 (SwiGLU, (64, 256), 32)])
def test_last_output_tile_is_multiplied_and_stored_in_pieces(model, shape, cores, monkeypatch):
    """An M/N-split matmul kernel multiplies, finishes (its sibling's product, epilogue map, softmax and chained
    P @ V) and stores its last output tile in pieces of whole PT row blocks (cost.last_pieces), each piece's
    store overlapping the next piece's work: the same bits as the tile done whole, in fewer modeled cycles."""
    from spyre_mlir.codegen.kernels import matmul

    torch.manual_seed(0)
    m, x = model().eval(), torch.randn(*shape)
    exe = spyre_mlir.compile(m, (x,), cores=cores, cache_dir=False)
    pieces = []
    monkeypatch.setattr(matmul, "last_pieces", lambda tm, *a, **k: pieces.append(tm) or ((0, tm),))
    whole = spyre_mlir.compile(m, (x,), cores=cores, cache_dir=False)
    assert max(pieces) > 8              # some kernel's last tile has several PT row blocks
    (y,), (y0,) = exe(x), whole(x)
    assert np.array_equal(y, y0)
    assert exe.static_profile.cycles < whole.static_profile.cycles


class Embed(torch.nn.Module):
    """An embedding lookup followed by a Linear: the lookup runs on the device (GATHER)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(300, 96)
        self.lin = torch.nn.Linear(96, 64)

    def forward(self, ids):
        return self.lin(self.emb(ids))


@pytest.mark.parametrize("precision,cores", [("dlf16", 1), ("dlf16", 32), ("fp32-reference", 4), ("fp8", 8)])
def test_embedding_lookup_runs_on_the_device(precision, cores):
    """The lookup is GATHER instructions reading the table's rows by the indices the device holds: no host op; an
    index outside the table is a clear run-time error naming the instruction, as PyTorch's IndexError is."""
    from spyre_mlir.runtime.emulator import SpyreRuntimeError

    torch.manual_seed(0)
    model, ids = Embed().eval(), torch.randint(0, 300, (2, 40))
    exe = spyre_mlir.compile(model, (ids,), precision=precision, cores=cores, cache_dir=False)
    assert exe.compile_info.host_ops == [] and "spyre.gather" in exe.compile_info.device_ops
    (y,) = exe(ids)
    with torch.no_grad():
        ref = model(ids).numpy()
    bound = 1e-5 if precision == "fp32-reference" else LOOSE.get(precision, DLF16_BOUND)
    assert np.abs(y - ref).max() <= bound * np.abs(ref).max()
    bad = ids.clone()
    bad[1, 7] = 300
    with pytest.raises(SpyreRuntimeError, match=r"gather.*index 300 is outside the table's 300 rows"):
        exe(bad)


@pytest.mark.parametrize("act", ["hardtanh", "relu6"])
@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_clamping_activations_keep_nan(act, precision):
    """hardtanh and relu6 (MobileNet's, in place too) give PyTorch's answer for NaN and infinities: NaN stays NaN
    (Torch-MLIR's compare-and-select lowering made it a bound; the hardtanh-as-clamp adapter keeps it)."""
    f = getattr(torch.nn.functional, act)

    class M(torch.nn.Module):
        def forward(self, x):
            return f(x * 3), f(x.clone(), inplace=True)

    torch.manual_seed(0)
    x = torch.randn(16, 64)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    exe = spyre_mlir.compile(M(), (x,), precision=precision, cache_dir=False)
    for out, ref in zip(exe(x), M()(x)):
        np.testing.assert_array_equal(np.isnan(out), ref.isnan().numpy())
        np.testing.assert_allclose(out, ref.numpy(), rtol=DLF16_BOUND, atol=0, equal_nan=True)


def test_integers_beyond_float_precision_stay_exact():
    """int64 values past 2^24 (where fp32 stops holding every integer): negation (Torch-MLIR lowers it through f32;
    the neg-of-integers adapter), a cumsum and an integer matmul (both host matmuls, which accumulated in f32)
    give PyTorch's exact values."""

    class M(torch.nn.Module):
        def forward(self, a, b):
            return -a, a.cumsum(-1), a @ b, torch.where(a > 0, a, -a)

    a = torch.tensor([[-123456789, 123456789, 2**40 + 3, 16777217], [5, -16777217, 7, 2**35 + 1]])
    b = torch.tensor([[3, 1], [-2, 1], [1, 0], [4, -1]])
    exe = spyre_mlir.compile(M(), (a, b), cache_dir=False)
    for out, ref in zip(exe(a, b), M()(a, b)):
        np.testing.assert_array_equal(out, ref.numpy())


def test_bitwise_and_fmod_with_a_number_compile():
    """x | 3, x ^ 6 and fmod(x, 3) (Torch-MLIR cannot legalize the Python-number forms; the scalar-as-tensor
    adapter gives them a 0-d tensor) on integers, floats and bools, as PyTorch computes them."""

    class M(torch.nn.Module):
        def forward(self, x, f):
            return x | 3, x ^ 6, torch.fmod(x, 3), torch.fmod(f, 0.7), (x > 0) | True

    x, f = torch.arange(-8, 8).reshape(2, 8), torch.linspace(-3, 3, 16).reshape(2, 8)
    exe = spyre_mlir.compile(M(), (x, f), precision="fp32-reference", cache_dir=False)
    for out, ref in zip(exe(x, f), M()(x, f)):
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_rms_norm_without_eps_adds_machine_epsilon(precision):
    """F.rms_norm and nn.RMSNorm without eps add torch.finfo(float32).eps, as PyTorch does (Torch-MLIR's lowering
    added nothing: rows of small values came out scaled to unit RMS, not shrunk by the epsilon)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(64)

        def forward(self, x):
            return torch.nn.functional.rms_norm(x * 1e-5, (64,)), self.norm(x * 1e-4)

    x = torch.randn(8, 64)
    exe = spyre_mlir.compile(M(), (x,), precision=precision, cache_dir=False)
    bound = 1e-6 if precision == "fp32-reference" else DLF16_BOUND
    for out, ref in zip(exe(x), M()(x)):
        np.testing.assert_allclose(out, ref.detach().numpy(), rtol=bound, atol=bound * float(ref.abs().max()))


@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_distances_compile(precision):
    """torch.dist, torch.cdist and F.pdist (which Torch-MLIR cannot legalize; the distances-as-norms adapter writes
    them as p-norms of differences) give PyTorch's distances."""

    class M(torch.nn.Module):
        def forward(self, x, y):
            return (torch.dist(x[0, :5], y[0], 3), torch.cdist(x, y), torch.cdist(x, y, 1.0),
                    torch.nn.functional.pdist(x[0]))

    torch.manual_seed(0)
    x, y = torch.randn(2, 6, 16), torch.randn(2, 5, 16)
    exe = spyre_mlir.compile(M(), (x, y), precision=precision, cache_dir=False)
    bound = 1e-5 if precision == "fp32-reference" else DLF16_BOUND * 4
    for out, ref in zip(exe(x, y), M()(x, y)):
        np.testing.assert_allclose(out, ref.numpy(), rtol=bound, atol=bound * float(ref.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_norms_accumulate_in_float(dtype):
    """A 4-norm and a distance of float16 / bfloat16 values near 15 (their fourth powers overflow float16) give
    PyTorch's finite answer: the half-norm-in-float adapter accumulates in float32, as PyTorch's kernel does
    (Torch-MLIR's lowering computed the powers in the half type: inf, or 304.5 for 30.95)."""

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.linalg.vector_norm(x - y, 4), torch.dist(x, y, 4), x.norm(dim=-1)

    torch.manual_seed(0)
    x, y = (torch.randn(5, 5, 5) * 6).to(dtype), (torch.randn(5, 5, 5) * 6).to(dtype)
    exe = spyre_mlir.compile(M(), (x, y), precision="fp32-reference", cache_dir=False)
    for out, ref in zip(exe(x, y), M()(x, y)):
        np.testing.assert_allclose(np.asarray(out, dtype=np.float32), ref.float().numpy(), rtol=1e-2)


def test_self_equality_is_a_nan_test():
    """``x == x`` is False exactly where x is NaN (Torch-MLIR folds it to True; the self-equal-as-not-nan adapter
    keeps it), and a ``where`` on it replaces the NaNs only."""

    class M(torch.nn.Module):
        def forward(self, x):
            return (x == x).float(), torch.where(x == x, x, torch.zeros_like(x))

    x = torch.randn(8, 64)
    x[0, :5] = float("nan")
    x[1, 0] = float("inf")
    exe = spyre_mlir.compile(M(), (x,), precision="fp32-reference", cache_dir=False)
    for out, ref in zip(exe(x), M()(x)):
        np.testing.assert_array_equal(out, ref.numpy())


@pytest.mark.parametrize("act,fn", [("relu", "relu"), ("silu", "silu"), ("sigmoid", "sigmoid")])
@pytest.mark.parametrize("precision", ["dlf16", "fp32-reference"])
def test_activation_is_one_sfu_op(act, fn, precision):
    """Torch-MLIR's ReLU (select(x > 0 unordered, x, 0)), sigmoid (1 / (1 + exp(-x))) and SiLU (x times that)
    are each one SFU function, none of the compares, selects, exps and divisions they were written with, and give
    PyTorch's answer; ReLU's NaN stays NaN (an ordered compare made it 0), -0.0 and 0.0 give 0."""
    from spyre_mlir.runtime.isa import SfuFn

    f = getattr(torch.nn.functional, act)

    class M(torch.nn.Module):
        def forward(self, x, y):
            return f(x * y) + f(x)

    torch.manual_seed(0)
    x, y = torch.randn(16, 64) * 4, torch.randn(16, 64)
    x[0, :3] = torch.tensor([float("nan"), -0.0, 0.0])
    exe = spyre_mlir.compile(M(), (x, y), precision=precision, cache_dir=False)
    names = {SfuFn(s.sfu[0]).name.lower() for s in exe.steps if getattr(s, "sfu", None) is not None}
    assert fn in names and not names & {"gt", "select", "exp", "neg", "div"}, names
    (out,), ref = exe(x, y), M()(x, y).numpy()
    assert np.isnan(out[0, 0]) and not np.isnan(np.delete(out.ravel(), 0)).any()
    bound = 1e-6 if precision == "fp32-reference" else DLF16_BOUND
    np.testing.assert_allclose(out, ref, rtol=bound, atol=bound * np.abs(ref[1:]).max(), equal_nan=True)


@pytest.mark.parametrize("precision,cores", [("dlf16", 1), ("fp32-reference", 1), ("dlf16", 8)])
def test_matmul_dims_no_tile_divides_compile(precision, cores):
    """A Linear(700, 1000) on 300 rows: no multiple of the PT rows divides M, no whole number of sticks divides N
    or K. On one core the whole block does not fit the scratchpad (B alone is 1.4 MB), and on eight the
    fused fp32 input's A tile did not either: both compile to tiles whose last one is shorter
    (cost.tile_sizes) and give PyTorch's answer."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(700, 1000).eval(), torch.randn(300, 700)
    exe = spyre_mlir.compile(model, (x,), precision=precision, cores=cores, cache_dir=False)
    (out,) = exe(x)
    ref = model(x).detach().numpy()
    bound = 1e-5 if precision == "fp32-reference" else DLF16_BOUND
    np.testing.assert_allclose(out, ref, rtol=0, atol=bound * float(np.abs(ref).max()))
    assert exe.compile_info.host_ops == []


def test_rows_too_long_for_the_scratchpad_run_on_the_host():
    """A 1-D elementwise op on 300,000 values and a softmax over a row of 400,000 keep a row whole on a core, and
    no such row fits the scratchpad: they failed to compile ('no division ...'). They run on the host, say why,
    and give PyTorch's answer; a short row stays on the device."""

    class M(torch.nn.Module):
        def forward(self, x, y, z):
            return torch.relu(x) + 1, torch.softmax(y, -1), torch.relu(z) + 1

    torch.manual_seed(0)
    args = (torch.randn(300_000), torch.randn(1, 400_000), torch.randn(1000))
    exe = spyre_mlir.compile(M(), args, cache_dir=False)
    for out, ref in zip(exe(*args), M()(*args)):
        np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=DLF16_BOUND * float(ref.abs().max()))
    reasons = " ".join(str(h) for h in exe.compile_info.host_ops)
    assert "no division of spyre.map with 1 rows" in reasons and "no division of spyre.softmax" in reasons
    assert any("spyre.map" in str(d) for d in exe.compile_info.device_ops)      # the short row's


@pytest.mark.parametrize("precision", ["fp32-reference", "dlf16"])
def test_group_norm_runs_on_the_device(precision):
    """nn.GroupNorm: Torch-MLIR's decomposition ran every step on the host (float64 statistics, indexed
    gathers); the group-norm-by-layer-norm adapter makes it a device layernorm over each group and the affine
    map. The host only reshapes rows of 16 values (half a stick) to and from the groups' rows."""
    torch.manual_seed(0)
    model, x = torch.nn.GroupNorm(8, 64).eval(), torch.randn(2, 64, 16, 16) * 3 + 1
    exe = spyre_mlir.compile(model, (x,), precision=precision, cache_dir=False)
    (out,) = exe(x)
    ref = model(x).detach().numpy()
    bound = 1e-5 if precision == "fp32-reference" else DLF16_BOUND
    np.testing.assert_allclose(out, ref, rtol=0, atol=bound * float(np.abs(ref).max()))
    assert any("spyre.layernorm" in str(d) for d in exe.compile_info.device_ops)
    assert all(h.startswith("spyre.reshape") for h in exe.compile_info.host_ops), exe.compile_info.host_ops


class _Decomposed(torch.nn.Module):
    """Ops Torch-MLIR cannot lower, each written as ops it can by a frontend adapter."""

    def forward(self, x, y, n, m, a, b):
        return (torch.linalg.norm(x), torch.linalg.norm(x, 1), torch.linalg.norm(x, float("inf"), (1, 0)),
                torch.erfc(y), torch.hypot(x, x.flip(0) * 3), torch.angle(y - 1),
                torch.diagonal_scatter(x, y[:4], 1), n ** 3 + torch.square(n), torch.isclose(n, m, rtol=0.1),
                torch.addbmm(n[:4, None].expand(4, 3), a, b, beta=2),
                torch.searchsorted(y, x), torch.put(x, n[:3], y[:3]), torch.nanmedian(x.log(), 1)[0],
                torch.median(x), torch.special.erfcx(y), torch.special.log_ndtr(y * 3),
                torch.nn.functional.unfold(x[None, None], 2, padding=1), torch.lgamma(y), torch.digamma(n + 3),
                torch.erfinv(y / 7))


@pytest.mark.parametrize("precision", ["fp32-reference", "dlf16"])
def test_ops_written_by_adapters_compile_and_match(precision):
    """linalg.norm (vector and matrix 1/inf norms), erfc, hypot, angle, diagonal_scatter, integer powers,
    isclose and addbmm of integers, searchsorted, put, nanmedian, median, erfcx, log_ndtr, unfold, lgamma,
    digamma and erfinv failed in Torch-MLIR ("unsupported"); frontend adapters write them as ops it lowers,
    and each matches eager."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 5), torch.linspace(-4, 6, 5)
    n, m = torch.arange(-2, 8), torch.arange(-2, 8) + torch.tensor([0, 1] * 5)
    a, b = torch.randint(-3, 3, (2, 4, 6)), torch.randint(-3, 3, (2, 6, 3))
    args = (x, y, n, m, a, b)
    exe = spyre_mlir.compile(_Decomposed(), args, precision=precision, cores=2, cache_dir=False)
    bound = 1e-5 if precision == "fp32-reference" else DLF16_BOUND
    for got, ref in zip(exe(*args), _Decomposed()(*args), strict=True):
        ref = ref.numpy()
        assert got.dtype == ref.dtype and got.shape == ref.shape
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=bound, atol=bound * float(np.nanmax(np.abs(ref))))
        else:
            np.testing.assert_array_equal(got, ref)
