"""The Hugging Face model matrix: tiny configs of each family, built in code with seeded random weights.

Nothing is downloaded: each entry builds a ``transformers`` config with small dimensions (2 layers, hidden 64,
4 heads / 2 key-value heads where the family has GQA, vocabulary 256) and instantiates the model class on it.
"""

from __future__ import annotations

import dataclasses

import torch

VOCAB = 256


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    kind: str            # "causal-lm" | "encoder" | "vision"
    build: object        # attn_implementation -> nn.Module
    attn: tuple = ("sdpa", "eager")

    @property
    def causal(self) -> bool:
        return self.kind == "causal-lm"


_DEC = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _llama(attn):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(**_DEC, attn_implementation=attn))


def _granite(attn):
    from transformers import GraniteConfig, GraniteForCausalLM
    return GraniteForCausalLM(GraniteConfig(**_DEC, attn_implementation=attn, embedding_multiplier=12.0,
                                            residual_multiplier=0.22, attention_multiplier=0.0078125,
                                            logits_scaling=8.0))


def _mistral(attn):
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(**_DEC, attn_implementation=attn, sliding_window=None))


def _qwen2(attn):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2ForCausalLM(Qwen2Config(**_DEC, attn_implementation=attn))


def _qwen3(attn):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(**_DEC, head_dim=16, attn_implementation=attn))


def _qwen3_moe(attn):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**_DEC, head_dim=16, moe_intermediate_size=32, num_experts=4,
                                              num_experts_per_tok=2, decoder_sparse_step=1,
                                              attn_implementation=attn))


def _gemma(attn):
    from transformers import GemmaConfig, GemmaForCausalLM
    return GemmaForCausalLM(GemmaConfig(**_DEC, head_dim=16, attn_implementation=attn))


def _gemma2(attn):
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM(Gemma2Config(**_DEC, head_dim=16, sliding_window=4, attn_implementation=attn))


def _gemma3(attn):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return Gemma3ForCausalLM(Gemma3TextConfig(**_DEC, head_dim=16, sliding_window=4, attn_implementation=attn))


def _phi3(attn):
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(**_DEC, attn_implementation=attn))


def _gpt2(attn):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2,
                                      attn_implementation=attn))


_ENC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _bert(attn):
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(**_ENC, attn_implementation=attn))


def _roberta(attn):
    from transformers import RobertaConfig, RobertaModel
    return RobertaModel(RobertaConfig(**{**_ENC, "pad_token_id": 1}, attn_implementation=attn))


def _t5_encoder(attn):
    from transformers import T5Config, T5EncoderModel
    return T5EncoderModel(T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   attn_implementation=attn))


def _vit(attn):
    from transformers import ViTConfig, ViTModel
    return ViTModel(ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128, attn_implementation=attn),
                    add_pooling_layer=False)


FAMILIES = {f.name: f for f in [
    Family("gpt2", "causal-lm", _gpt2),
    Family("llama", "causal-lm", _llama),
    Family("granite", "causal-lm", _granite),
    Family("mistral", "causal-lm", _mistral),
    Family("qwen2", "causal-lm", _qwen2),
    Family("qwen3", "causal-lm", _qwen3),
    Family("qwen3-moe", "causal-lm", _qwen3_moe),
    Family("gemma", "causal-lm", _gemma),
    Family("gemma2", "causal-lm", _gemma2, attn=("eager",)),  # transformers has no sdpa path for Gemma 2
    Family("gemma3", "causal-lm", _gemma3),
    Family("phi3", "causal-lm", _phi3),
    Family("bert", "encoder", _bert),
    Family("roberta", "encoder", _roberta),
    Family("t5-encoder", "encoder", _t5_encoder),
    Family("vit", "vision", _vit),
]}


def build(family: str, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """The family's tiny model with weights drawn from ``seed``, in eval mode."""
    torch.manual_seed(seed)
    model = FAMILIES[family].build(attn)
    return model.eval()


def example_inputs(family: str, batch: int = 2, seq: int = 8, mask: bool = False, seed: int = 1):
    """Keyword inputs for one forward call: ``input_ids``, with ``attention_mask`` when ``mask`` (left
    padding: row i is padded by i tokens), or ``pixel_values`` for ViT."""
    g = torch.Generator().manual_seed(seed)
    if FAMILIES[family].kind == "vision":
        return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=g)}
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    if not mask:
        return {"input_ids": ids}
    am = torch.ones(batch, seq, dtype=torch.int64)
    for i in range(batch):
        am[i, :i] = 0
    return {"input_ids": ids, "attention_mask": am}
