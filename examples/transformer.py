"""A small decoder-only transformer in the style of Llama (Hugging Face layout, no downloads).

Token embedding, RMSNorm, rotary position embeddings whose ``inv_freq`` is a *non-persistent* buffer
(not in the state dict, as in Hugging Face models: the frontend must still import it), causal
``scaled_dot_product_attention``, a SiLU-gated MLP and an LM head.

Run as a script to write ``transformer.pt`` (a ``torch.export.save`` archive) for ``spyre-compile``::

    python examples/transformer.py [OUT.pt]
"""

import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    dim: int = 64
    heads: int = 4
    layers: int = 2
    hidden: int = 172
    seq: int = 16
    rope_theta: float = 10000.0
    eps: float = 1e-6


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: normalise in float32, scale by a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, computed in forward from a non-persistent ``inv_freq``."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        # Angles in float32 whatever the model's dtype (as Hugging Face does), tables in the model's dtype.
        freqs = positions[:, None].to(torch.float32) * self.inv_freq[None, :].to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.dim // cfg.heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    """SiLU-gated feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.rotary = Rotary(cfg.dim // cfg.heads, cfg.rope_theta)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def build(seed: int = 0, cfg: Config = Config()):
    """Return ``(model, example_inputs)``; weights and token ids depend only on ``seed``."""
    gen = torch.manual_seed(seed)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for norm in [m for m in model.modules() if isinstance(m, RMSNorm)]:
            norm.weight.copy_(1.0 + 0.1 * torch.randn(cfg.dim, generator=gen))
    example_inputs = (torch.randint(0, cfg.vocab, (1, cfg.seq), generator=gen),)
    return model, example_inputs


def save(path: str, seed: int = 0) -> None:
    """Export the model and write it with ``torch.export.save``."""
    model, example_inputs = build(seed)
    torch.export.save(torch.export.export(model, example_inputs), path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "transformer.pt"
    save(out)
    print(f"wrote {out}")
