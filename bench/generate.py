"""Generation benchmark: spyre_mlir.generate's first call vs its steady-state decode step, against eager
Hugging Face generate measured in the same run.

    python bench/generate.py                         # llama-style decoder, hidden 256, 4 layers, head_dim 64, dlf16, 32 cores
    python bench/generate.py --family gpt2 --hidden 128 --layers 2 --new-tokens 16

Reports, for one batch of prompts: the first call (compile both programs, link, load, prefill, decode), a
second call of the same sizes (prepared: no compile, no load), the median emulator wall time of one decode
step and its modeled latency on the card, modeled tokens/s, and eager PyTorch's time per token. The step's
time is the emulator executing the program; nothing in it depends on the model's size except that execution.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "models"))


def build(family: str, hidden: int, layers: int, seed: int = 0, head_dim: int = 64):
    import transformers

    torch.manual_seed(seed)
    heads = hidden // head_dim
    common = dict(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                  max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=1024, n_embd=hidden, n_layer=layers, n_head=heads,
                                      n_positions=2048, bos_token_id=1, eos_token_id=2)
        return transformers.GPT2LMHeadModel(cfg).eval()
    cls = {"llama": "Llama", "granite": "Granite", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
    cfg = getattr(transformers, f"{cls}Config")(**common)
    return getattr(transformers, f"{cls}ForCausalLM")(cfg).eval()


def main(argv=None) -> int:
    import spyre_mlir
    from spyre_mlir import generation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama", choices=["llama", "granite", "qwen2", "mistral", "gpt2"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64,
                    help="attention head size (the Hugging Face families use 64-256; 32 is half a DLFloat16 stick, "
                         "which splits heads by selection matmuls)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--precision", default="dlf16")
    ap.add_argument("--cores", type=int, default=32)
    a = ap.parse_args(argv)

    model = build(a.family, a.hidden, a.layers, head_dim=a.head_dim)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1024, (a.batch, a.prompt), generator=g)
    mask = torch.ones_like(ids)

    t0 = time.perf_counter()
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=a.new_tokens, do_sample=False,
                             min_new_tokens=a.new_tokens)
    eager_s = time.perf_counter() - t0

    kw = dict(max_new_tokens=a.new_tokens, attention_mask=mask, precision=a.precision, cores=a.cores,
              cache_dir=False)
    t0 = time.perf_counter()
    out = spyre_mlir.generate(model, ids, **kw)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out2 = spyre_mlir.generate(model, ids, **kw)
    second_s = time.perf_counter() - t0
    gen = next(iter(generation._GENERATORS[model].values()))

    # The steady-state step alone: inputs prepared, the program executed.
    L = gen.max_len
    full = np.zeros((a.batch, L), np.int64)
    full[:, :gen.prompt_len] = 1
    tok = np.full((a.batch, 1), 5, np.int64)
    times = []
    for k in range(8):
        slot = gen.prompt_len + k
        full[:, slot] = 1
        t0 = time.perf_counter()
        gen.step(tok, full, np.full((a.batch, 1), slot, np.int64), slot)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    dec, pre = gen.decode_exe.static_profile, gen.prefill_exe.static_profile
    n_new = out.shape[1] - ids.shape[1]
    agree = float((out[:, ids.shape[1]:] == ref[:, ids.shape[1]:out.shape[1]]).float().mean())

    rows = [
        ("model", f"{a.family} hidden {a.hidden}, {a.layers} layers, head_dim {a.head_dim}, batch {a.batch}, prompt {a.prompt} "
                  f"(bucket {gen.prompt_len}), cache {L}, {a.precision}, {gen.cores} cores"),
        ("tokens identical to eager greedy", f"{agree:.3f} of {n_new} new tokens x {a.batch} rows"),
        ("first call (compile, link, load, prefill, decode)", f"{first_s:.2f} s (compile+load {gen.compile_seconds:.2f} s)"),
        ("second call, same sizes (prepared)", f"{second_s:.2f} s for {n_new} tokens"),
        ("decode step, emulator wall time (median of 8)", f"{step_s * 1e3:.1f} ms"),
        ("decode step, modeled on the card", f"{dec.seconds * 1e6:.1f} us ({1 / dec.seconds:,.0f} tokens/s per row)"),
        ("prefill, modeled on the card", f"{pre.seconds * 1e6:.1f} us for {gen.prompt_len} positions"),
        ("decode host traffic per step", f"{dec.host_bytes} B (the cache: "
                                         f"{sum(b.nbytes for b in gen.decode_exe.state_buffers)} B, stays on the device)"),
        ("eager PyTorch generate, per token", f"{eager_s / a.new_tokens * 1e3:.1f} ms"),
        ("emulator step / eager token", f"{step_s / (eager_s / a.new_tokens):.1f}x"),
        ("first call / steady-state step", f"{first_s / step_s:.0f}x"),
    ]
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    assert torch.equal(out, out2), "a prepared call must give the same tokens"
    return 0


if __name__ == "__main__":
    sys.exit(main())
