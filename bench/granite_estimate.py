"""Modeled prefill and decode latency of IBM Granite-3.3-8B on one Spyre card, from the static cycle model.

The published config of ibm-granite/granite-3.3-8b-instruct
(https://huggingface.co/ibm-granite/granite-3.3-8b-instruct/blob/main/config.json; typed in here, nothing is
downloaded): hidden_size 4096, intermediate_size 12800, num_hidden_layers 40, num_attention_heads 32,
num_key_value_heads 8 (head_dim 128), vocab_size 49159, rms_norm_eps 1e-5, rope_theta 10000000,
attention_multiplier 0.0078125, embedding_multiplier 12.0, residual_multiplier 0.22, logits_scaling 16.0,
tie_word_embeddings true, hidden_act silu.

One ``GraniteDecoderLayer`` (transformers) at those dimensions, random seeded weights, is compiled twice:

* prefill: batch 1, ``--seq`` tokens, rotary cos/sin and the causal mask built inside the wrapped module;
  outputs the hidden states and the layer's K/V (post-rotary), which a prefill writes to the KV cache;
* decode: batch 1, one new token at position ``seq - 1`` attending to ``seq`` positions: the past K/V
  (``seq - 1`` positions, inputs) concatenated with the new token's K/V; the layer's own modules
  (norms, projections, rotary, MLP) with grouped-query attention (32 query heads over 8 K/V heads, without
  materializing repeated K/V); outputs the hidden state and the new token's K/V (the cache update). It is
  checked against the transformers layer with a ``DynamicCache`` on a tiny config in eager PyTorch first.

Two substitutions inside the layer, both the same arithmetic (checked in eager PyTorch against the stock
layer, see ``check``), because at these sizes the stock forms run the mask on the host or do not compile (see
docs/granite-estimate.md):

* attention is a registered transformers attention function (``causal_gqa``): grouped-query attention on the
  8 K/V heads (no repeat_kv copies) with the causal mask applied as a boolean ``where`` on the scores, instead
  of eager attention's additive [S, S] float mask broadcast over 32 heads;
* ``rotate_half`` (a concat of the two 64-wide halves) is a product with a fixed signed permutation matrix.

Nothing is executed on the emulator: the program is static, so the loaded executable's ``static_profile``
already holds the modeled cycles. The whole model is ``num_hidden_layers`` x one layer, plus (unless
``--layers-only``) the embedding gather (x embedding_multiplier) and the final RMSNorm + LM head
(4096 x 49159, / logits_scaling, see ``Head``) on the last position, each compiled and
modeled separately. A part that does not compile is left out of the total and listed with the compiler's
message. Results go to stdout and to docs/granite-estimate.md.

    .venv/bin/python bench/granite_estimate.py [--seq 1024] [--cores 32] [--precision dlf16] [--layers-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import resource
import subprocess
import tempfile
import time

import torch
from torch import nn

SOURCE = "https://huggingface.co/ibm-granite/granite-3.3-8b-instruct/blob/main/config.json"
GRANITE_3_3_8B = dict(hidden_size=4096, intermediate_size=12800, num_hidden_layers=40, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=49159, rms_norm_eps=1e-5,
                      rope_theta=10000000.0, attention_multiplier=0.0078125, embedding_multiplier=12.0,
                      residual_multiplier=0.22, logits_scaling=16.0, tie_word_embeddings=True, hidden_act="silu")
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "granite-estimate.md")


def granite_config(layers=1, **override):
    from transformers import GraniteConfig

    c = {**GRANITE_3_3_8B, **override}
    theta = c.pop("rope_theta")
    return GraniteConfig(**{**c, "num_hidden_layers": layers}, rope_parameters={"rope_type": "default",
                         "rope_theta": theta}, max_position_embeddings=4096, attn_implementation="eager")


def decoder_layer(cfg):
    from transformers.models.granite.modeling_granite import GraniteDecoderLayer, GraniteRotaryEmbedding

    torch.manual_seed(0)
    layer = GraniteDecoderLayer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                nn.init.normal_(p, std=0.02)
    return layer, GraniteRotaryEmbedding(cfg).eval()


def causal_gqa(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Causal attention for a transformers attention layer: query [b, heads, s, d], key/value [b, kv, s, d];
    the query heads of one K/V head (heads kv*g .. kv*g+g-1, as repeat_kv pairs them) attend together."""
    b, h, s, d = query.shape
    kv = key.shape[1]
    g = h // kv
    scores = torch.matmul(query.reshape(b, kv, g * s, d), key.transpose(2, 3)).view(b, kv, g, s, s)
    keep = torch.arange(s)[:, None] >= torch.arange(s)[None, :]
    scores = torch.where(keep, scores, torch.finfo(scores.dtype).min) * scaling
    p = torch.softmax(scores, dim=-1).view(b, kv, g * s, s)
    return torch.matmul(p, value).view(b, h, s, d).transpose(1, 2).contiguous(), None


def _rotary_by_matmul(q, k, cos, sin, unsqueeze_dim=1):
    """apply_rotary_pos_emb with rotate_half(x) = x @ R (R a signed permutation: exact in any format)."""
    d = q.shape[-1]
    R = torch.zeros(d, d, dtype=q.dtype)
    R[d // 2:, :d // 2] = -torch.eye(d // 2)
    R[:d // 2, d // 2:] = torch.eye(d // 2)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + torch.matmul(q, R) * sin, k * cos + torch.matmul(k, R) * sin


@contextlib.contextmanager
def compilable(layer):
    """Within: ``layer`` attends with causal_gqa and rotates with _rotary_by_matmul (restored on exit)."""
    from transformers import AttentionInterface
    from transformers.models.granite import modeling_granite as mg

    AttentionInterface.register("causal_gqa", causal_gqa)
    cfg = layer.self_attn.config
    saved = cfg._attn_implementation, mg.apply_rotary_pos_emb
    cfg._attn_implementation, mg.apply_rotary_pos_emb = "causal_gqa", _rotary_by_matmul
    try:
        yield
    finally:
        cfg._attn_implementation, mg.apply_rotary_pos_emb = saved


class _Capture:
    """Stands in for the KV cache in prefill: keeps the layer's (post-rotary) K/V so they can be outputs."""

    def update(self, key, value, layer_idx, *args, **kwargs):
        self.key, self.value = key, value
        return key, value


class Prefill(nn.Module):
    """hidden [1, S, H] -> (hidden [1, S, H], K [1, kv, S, d], V [1, kv, S, d]) through the transformers layer."""

    def __init__(self, layer, rotary):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, hidden):
        pos = torch.arange(hidden.shape[1]).unsqueeze(0)
        cache = _Capture()
        with compilable(self.layer):          # causal: the mask is built in causal_gqa
            out = self.layer(hidden, attention_mask=None, position_ids=pos, cache=cache,
                             position_embeddings=self.rotary(hidden, pos))
        return out, cache.key, cache.value


class Decode(nn.Module):
    """One decode step of a Granite decoder layer for batch 1: the new token at position ``pos`` attends to
    the ``pos`` cached positions and itself. (hidden [1, 1, H], past K/V [1, kv, pos, d]) ->
    (hidden [1, 1, H], new K [1, kv, 1, d], new V [1, kv, 1, d])."""

    def __init__(self, layer, rotary, pos):
        super().__init__()
        self.layer, self.rotary, self.pos = layer, rotary, pos
        attn = layer.self_attn
        self.heads, self.kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        self.head_dim, self.scaling = attn.head_dim, attn.scaling

    def forward(self, hidden, past_k, past_v):
        L, a = self.layer, self.layer.self_attn
        g, d = self.heads // self.kv_heads, self.head_dim
        cos, sin = self.rotary(hidden, torch.full((1, 1), self.pos))
        x = L.input_layernorm(hidden)
        q = a.q_proj(x).view(1, 1, self.heads, d).transpose(1, 2)            # [1, heads, 1, d]
        k = a.k_proj(x).view(1, 1, self.kv_heads, d).transpose(1, 2)         # [1, kv, 1, d]
        v = a.v_proj(x).view(1, 1, self.kv_heads, d).transpose(1, 2)
        q, k = _rotary_by_matmul(q, k, cos, sin)
        keys = torch.cat([past_k, k], dim=2)[0]                               # [kv, pos + 1, d]
        values = torch.cat([past_v, v], dim=2)[0]
        qg = q.reshape(self.kv_heads, g, d)                                   # query heads grouped by K/V head
        p = torch.softmax(torch.matmul(qg, keys.transpose(1, 2)) * self.scaling, dim=-1)
        o = torch.matmul(p, values).reshape(1, 1, self.heads * d)
        h = hidden + a.o_proj(o) * L.residual_multiplier
        h = h + L.mlp(L.post_attention_layernorm(h)) * L.residual_multiplier
        return h, k, v


class Embed(nn.Module):
    def __init__(self, vocab, hidden, multiplier):
        super().__init__()
        self.embed, self.multiplier = nn.Embedding(vocab, hidden), multiplier

    def forward(self, ids):
        return self.embed(ids) * self.multiplier


class Head(nn.Module):
    """Final RMSNorm and the LM head on the last position, logits / logits_scaling: ``nn.Linear(4096, 49159)``
    as the stock model holds it (its [vocab, hidden] weight tied to the embedding)."""

    def __init__(self, cfg):
        from transformers.models.granite.modeling_granite import GraniteRMSNorm

        super().__init__()
        self.norm = GraniteRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        self.scale = cfg.logits_scaling

    def forward(self, hidden):
        return self.lm_head(self.norm(hidden)) / self.scale


def check():
    """Prefill and Decode against the stock transformers layer (eager attention with an additive causal mask,
    stock rotary, a DynamicCache for prefill-then-one-step), in eager PyTorch on a tiny config."""
    from transformers import DynamicCache

    cfg = granite_config(hidden_size=64, intermediate_size=96, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=8)
    layer, rotary = decoder_layer(cfg)
    s = 9
    x = torch.randn(1, s + 1, 64)
    pos = torch.arange(s + 1)[None]
    mask = torch.full((s + 1, s + 1), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        full = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, pos))
        cache = DynamicCache(config=cfg)
        layer(x[:, :s], attention_mask=mask[..., :s, :s], position_ids=pos[:, :s], cache=cache,
              position_embeddings=rotary(x[:, :s], pos[:, :s]))
        past_k, past_v = cache.layers[0].keys, cache.layers[0].values
        step = layer(x[:, s:], attention_mask=None, position_ids=pos[:, s:], cache=cache,
                     position_embeddings=rotary(x[:, s:], pos[:, s:]))
        mine, k, v = Decode(layer, rotary, s)(x[:, s:], past_k, past_v)
        pre, pk, pv = Prefill(layer, rotary)(x)
    torch.testing.assert_close(mine, step, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine, full[:, s:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([past_k, k], 2), cache.layers[0].keys, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.cat([past_v, v], 2), cache.layers[0].values, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pre, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pk, cache.layers[0].keys, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pv, cache.layers[0].values, rtol=1e-6, atol=1e-6)


def modeled(name, module, inputs, args, tmp):
    """Compile to a file and load it; the static profile (no call: nothing is executed). A compile or load
    error is returned as {"error": message}: that part is then excluded and the report says why."""
    import spyre_mlir
    from spyre_mlir.errors import SpyreError
    from spyre_mlir.runtime import load

    path = os.path.join(tmp, name.replace(" ", "_").replace("+", "") + ".spyre")
    t0 = time.perf_counter()
    try:
        spyre_mlir.compile_to_file(module, inputs, output=path, precision=args.precision, cores=args.cores,
                                   cache_dir=False)
        t1 = time.perf_counter()
        exe = load(path)
    except SpyreError as e:
        msg = " ".join(str(e).split())
        print(f"  {name}: FAILED after {time.perf_counter() - t0:.0f} s: {msg}", flush=True)
        return dict(name=name, error=msg)
    t2 = time.perf_counter()
    prof = exe.static_profile
    row = dict(name=name, compile_s=t1 - t0, load_s=t2 - t1, file_mb=os.path.getsize(path) / 1e6, prof=prof)
    print(f"  {name}: compiled in {t1 - t0:.0f} s, loaded in {t2 - t1:.0f} s, {row['file_mb']:.0f} MB binary, "
          f"{exe.program.device_bytes / 1e6:.0f} MB device memory, "
          f"{sum(len(c) for c in exe.program.code):,} instructions, {prof.seconds * 1e3:.3f} ms modeled", flush=True)
    del exe
    os.remove(path)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=1024, help="prompt length; decode attends to this many positions")
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--precision", default="dlf16")
    ap.add_argument("--layers-only", action="store_true", help="skip the embedding and the LM head")
    ap.add_argument("--doc", default=DOC, help="markdown report to write ('' for none)")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPYRE_EMU_MAX_DEVICE_BYTES", str(8 << 30))   # one layer's device memory is ~1 GB

    check()
    print("prefill and decode modules match the stock GraniteDecoderLayer + DynamicCache (tiny config, eager)")
    G, S = GRANITE_3_3_8B, args.seq
    cfg = granite_config()
    layer, rotary = decoder_layer(cfg)
    kv, d, H, V = G["num_key_value_heads"], G["head_dim"], G["hidden_size"], G["vocab_size"]
    torch.manual_seed(1)
    jobs = [("layer prefill", lambda: Prefill(layer, rotary), (torch.randn(1, S, H),)),
            ("layer decode", lambda: Decode(layer, rotary, S - 1),
             (torch.randn(1, 1, H), torch.randn(1, kv, S - 1, d), torch.randn(1, kv, S - 1, d)))]
    if not args.layers_only:
        embed = lambda: Embed(V, H, G["embedding_multiplier"])  # noqa: E731
        jobs += [("embedding prefill", embed, (torch.randint(0, V, (1, S)),)),
                 ("embedding decode", embed, (torch.randint(0, V, (1, 1)),)),
                 ("norm + LM head", lambda: Head(cfg), (torch.randn(1, 1, H),))]
    rows = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, build, inputs in jobs:
            rows[name] = modeled(name, build().eval(), inputs, args, tmp)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"  compiling and loading took {time.perf_counter() - t0:.0f} s; peak resident memory {rss:.1f} GB\n")
    text = report(rows, args)
    print(text)
    if args.doc:
        with open(args.doc, "w") as f:
            f.write(doc(text, args))
        print(f"wrote {args.doc}")
    return 0


def report(rows, args) -> str:
    G, n = GRANITE_3_3_8B, GRANITE_3_3_8B["num_hidden_layers"]
    out = [f"Granite-3.3-8B ({SOURCE}): " + ", ".join(f"{k} {v}" for k, v in G.items()) + ".", "",
           f"One card, {args.cores} cores, {args.precision}, batch 1; prefill {args.seq} tokens, decode 1 token "
           f"attending to {args.seq} positions. Modeled by the static cycle model (nothing executed).", "",
           "| program | modeled ms | PT util | SFU util | DMA util | limiter | bound | DRAM read MB | "
           "DRAM write MB | host MB | compile s |",
           "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in rows.values():
        if "error" in r:
            out.append(f"| {r['name']} | failed | | | | | | | | | |")
            continue
        p = r["prof"]
        u = p.utilization
        out.append(f"| {r['name']} | {p.seconds * 1e3:.3f} | {u['PT']:.1%} | {u['SFU']:.1%} | {u['DMA']:.1%} | "
                   f"{p.limiter} | {p.bound} | {p.dram_read_bytes / 1e6:.1f} | {p.dram_write_bytes / 1e6:.1f} | "
                   f"{p.host_bytes / 1e6:.1f} | {r['compile_s']:.0f} |")
    ms = {k: r["prof"].seconds * 1e3 for k, r in rows.items() if "error" not in r}
    out += ["", "| whole model | prefill = time to first token, ms | decode ms / token | decode tokens/s |",
            "|---|---:|---:|---:|"]
    if "layer prefill" not in ms or "layer decode" not in ms:
        out.append("| (a layer failed to compile: no whole-model figure) | | | |")
    else:
        pre, dec = n * ms["layer prefill"], n * ms["layer decode"]
        out.append(f"| {n} x layer | {pre:.2f} | {dec:.3f} | {1e3 / dec:.1f} |")
        parts = {"embedding": ("embedding prefill", "embedding decode"),
                 "norm + LM head": ("norm + LM head", "norm + LM head")}
        extra = [k for k, (p, d) in parts.items() if p in ms and d in ms]
        if extra:
            pre += sum(ms[parts[k][0]] for k in extra)
            dec += sum(ms[parts[k][1]] for k in extra)
            out.append(f"| {n} x layer + {' + '.join(extra)} | {pre:.2f} | {dec:.3f} | {1e3 / dec:.1f} |")
    if args.layers_only:
        out += ["", "Excluded: the embedding gather and the final norm + LM head (--layers-only)."]
    failed = [r for r in rows.values() if "error" in r]
    if failed:
        out += ["", "Excluded because they did not compile (the compiler's message):"]
        out += [f"* {r['name']}: {r['error']}" for r in failed]
    return "\n".join(out)


NOTES = """\
## How the programs differ from the stock layer, and why

* **Attention** runs through a registered transformers attention function (`causal_gqa` in the script):
  grouped-query attention on the 8 K/V heads without `repeat_kv` copies, the causal mask as a boolean
  `where` on the raw scores, then the 0.0078125 scaling and softmax. The stock eager attention adds a float
  [1, 1, S, S] mask broadcast over the 32 heads; `spyre-divide-work` keeps a broadcast map operand whole in
  every core's scratchpad, and at S = 1024 that mask (2-4 MB) exceeds the 1.55 MB usable scratchpad: no
  division of that spyre.map fits, so it runs on the host (it failed the compile before), and so would sdpa's.
  The 1 MB boolean mask fits, but only with the select on 2 cores.
* **Rotary**: `rotate_half` (a concat of the two 64-wide halves) is a product with a fixed signed permutation
  matrix. The stock concat fails at emission for S >= 512: "spyre.concat: a row needs 1024 B of scratchpad
  (+32768 B fixed); not even one row fits" (the tiling pass sized the tile for 512 B a row; the emitter's
  selection-matmul kernel needs 1024 B a row).
* **Decode** is a small module reusing the layer's norms, projections, rotary and MLP, with the new token at
  position S - 1 attending to the S - 1 cached positions (inputs) and itself (S positions in all). It
  outputs the hidden state and the new token's K/V (the cache update).
* **LM head**: `nn.Linear(4096, 49159)` as the stock model has it, one matmul on the device. (An earlier
  compiler rejected it: N = 49159 had no even split in whole sticks, and one core cannot address the 403 MB
  weight; N now splits ragged, whole sticks per core but the last, and the head was two column blocks.)
* **Embedding**: `nn.Embedding(49159, 4096)`. A device gather needs its table within one core's 256 MB span,
  and this one is 403 MB, so the gather runs on the host (the prefill's picked rows, 16.8 MB, cross the host
  link) and the multiplier on the device.

Both substitutions inside the layer are checked against the stock `GraniteDecoderLayer` (eager attention,
stock rotary, a `DynamicCache` prefill then one step) in eager PyTorch on a tiny config at every run.

## What the figures include
Each layer program converts its fp32 inputs to DLFloat16 and its outputs back to fp32 at the program
boundary, and repeats the rotary cos/sin and mask construction; in a whole-model program these would be paid
once, not per layer, so 40 x layer slightly overstates (roughly 0.6 ms of a prefill layer, 0.1 ms of a
decode layer). The layer programs make no host round trip (host MB 0). The LM head runs on the last position
only. The cycle model reports peak-rate busy time (docs/runtime.md).

## Compiler problems met on the way
* Fixed since: the prefill layer's debug section (a source location per instruction; 144 MB for an earlier
  form) exceeded the loader's fixed 64 MB JSON limit (the limit now grows with the code), and an output path
  containing a space broke `compile_to_file` (pass options now take quoted values).
* A first form of `causal_gqa` (scaling, then a `view` to 5-D, then the `where`) compiled to a program the
  loader rejects ("reads device bytes [...] that were never written"): `spyre-schedule` put the barrier on
  the reshape, whose consumer has another work division, and the emitter turns that reshape into an alias
  without emitting its barrier, so the select reads other cores' rows unsynchronized. The form used here
  views right after the batch matmul, which has its own barrier.
* Loading the prefill layer (264,864 instructions) takes 7 s, and this whole run peaks at 5.5 GB resident
  (an earlier form had 480k instructions, took about two minutes to load and peaked near 15 GB).
"""


def doc(text, args) -> str:
    root = os.path.dirname(DOC)

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    commit = git("rev-parse", "HEAD") or "unknown"
    # The report itself may already be rewritten (a run writes it as it goes): it does not count as a change.
    dirty = " with uncommitted changes in the working tree" if git(
        "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)docs/granite-estimate.md") else ""
    cmd = ".venv/bin/python bench/granite_estimate.py" + (f" --seq {args.seq}" if args.seq != 1024 else "") + \
        (f" --cores {args.cores}" if args.cores != 32 else "") + \
        (f" --precision {args.precision}" if args.precision != "dlf16" else "") + \
        (" --layers-only" if args.layers_only else "")
    return (f"# Granite-3.3-8B on one Spyre card: modeled latency\n\nProduced by `{cmd}` on "
            f"{datetime.date.today().isoformat()} at commit {commit}{dirty}. Modeled by the static cycle model "
            f"(docs/runtime.md) from the loaded programs' static profiles; no values were computed.\n\n{text}\n\n"
            f"{NOTES}")


if __name__ == "__main__":
    raise SystemExit(main())
