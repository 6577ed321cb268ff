"""Text generation on the emulated Spyre card with the KV cache kept in device memory.

    import spyre_mlir
    ids = spyre_mlir.generate(model, input_ids, max_new_tokens=32, attention_mask=mask, precision="dlf16")

``model`` is a Hugging Face causal LM; the result is ``model.generate(..., do_sample=False)``'s: the prompt
(left-padded rows as given) followed by the greedy tokens, rows that reach ``eos_token_id`` padded after it.

How it runs, as a serving stack does (docs/runtime.md, "Generation"):

* Two programs are compiled once per (model, batch, prompt bucket, cache length, precision, cores): a
  **prefill** over the prompt padded on the left to its length bucket, and a one-token **decode** step. Both
  are traced through a static cache (``_CacheStep``): the key/value tensors are module buffers the model
  updates in place at run-time positions, which the compiler turns into **state buffers** of the binary.
* ``runtime.link`` joins the two into one ``.spyre`` with two entries over one device memory: the weights are
  loaded once and the cache stays on the device between calls (prefill fills it, each decode step adds one
  position); nothing but token ids, positions and the mask goes in, and logits come out.
* Positions, cache slots and the attention mask are inputs, so a new prompt or step never recompiles; stale
  cache slots from an earlier prompt are masked out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import weakref

import numpy as np

from spyre_mlir.errors import SpyreError

__all__ = ["generate", "Generator", "GenerateError", "BUCKETS"]

# Prompt and cache lengths are rounded up to these, so different prompts share compiled programs.
BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class GenerateError(SpyreError):
    """A generation request that cannot run (not a causal LM, prompt longer than the largest bucket...)."""


def _bucket(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    raise GenerateError(f"{n} tokens exceed the largest length bucket ({BUCKETS[-1]})")


def _cache_step_class():
    import torch
    from transformers.cache_utils import StaticCache, StaticLayer

    class _SlotLayer(StaticLayer):
        """A static cache layer written at the slots the step is given (``slots``, set per call) rather
        than at its own running length: positions stay inputs of the program."""

        slots = None

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys.index_copy_(2, self.slots, key_states)
            self.values.index_copy_(2, self.slots, value_states)
            return self.keys, self.values

    class _CacheStep(torch.nn.Module):
        """One step of a causal LM over a static KV cache held in buffers (``key_cache_i``, ``value_cache_i``).

        forward(input_ids [B, T], attention_mask [B, L] (1: a real token), position_ids [B, T],
        cache_position [T] (the cache slots of the T tokens)) -> logits [B, T, V]. The 4-D mask (causal over
        cache slots, padding, sliding windows) is built here from the inputs, so it is part of the program."""

        def __init__(self, model, batch: int, max_len: int):
            super().__init__()
            from transformers.configuration_utils import get_head_shapes

            self.model = model
            config = model.config.get_text_config()
            self.config = config
            self.cache = StaticCache(config=config, max_cache_len=max_len)
            self.cache.layers = [_SlotLayer(max_len) for _ in self.cache.layers]
            heads, head_dim = get_head_shapes(config)
            self.cache.early_initialization(batch, heads, head_dim, model.dtype, torch.device("cpu"))
            for i, layer in enumerate(self.cache.layers):
                self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            self.max_len = max_len

        def _mask(self, attention_mask, cache_position, window=None):
            slots = torch.arange(self.max_len, device=attention_mask.device)
            q = cache_position.reshape(-1, 1)
            allowed = slots.reshape(1, -1) <= q
            if window is not None:
                allowed = allowed & (slots.reshape(1, -1) > q - window)
            allowed = allowed.reshape(1, 1, *allowed.shape) & attention_mask.bool()[:, None, None, :]
            # A padding query would see nothing (a NaN row in sdpa): it sees itself. Real tokens never read
            # padding slots, so this changes no real output.
            allowed = allowed | (slots.reshape(1, -1) == q).reshape(1, 1, *allowed.shape[2:])
            if self.config._attn_implementation == "sdpa":
                return allowed
            dtype = self.model.dtype
            return torch.zeros((), dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)

        def forward(self, input_ids, attention_mask, position_ids, cache_position):
            for i, layer in enumerate(self.cache.layers):
                layer.slots = cache_position
                # Through the module's attributes: torch.export traces buffers reached that way (and records
                # their in-place updates); the layer's own references would be lifted as constants.
                layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            # Per layer type when the model has them (Gemma 2/3, Qwen2); else one mask, with the model's
            # sliding window if it has one (Mistral, Phi-3), as Hugging Face's own mask functions do.
            types = getattr(self.config, "layer_types", None)
            window = getattr(self.config, "sliding_window", None)
            if types:
                mask = {t: self._mask(attention_mask, cache_position,
                                      window if t == "sliding_attention" else None) for t in set(types)}
            else:
                mask = self._mask(attention_mask, cache_position, window)
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             cache=self.cache, use_cache=True)
            return out.logits

    return _CacheStep


@dataclasses.dataclass
class Generator:
    """Prefill and decode programs of one model for one (batch, prompt bucket, cache length), loaded once as
    a :class:`~spyre_mlir.runtime.loader.Bundle`. ``prefill(...)``/``step(...)`` run them; the KV cache
    lives in the bundle's state buffers."""

    bundle: object
    batch: int
    prompt_len: int
    max_len: int
    precision: str
    cores: int
    path: str | None         # the linked binary in the compile cache; None without a cache
    compile_seconds: float

    @property
    def prefill_exe(self):
        return self.bundle["prefill"]

    @property
    def decode_exe(self):
        return self.bundle["decode"]

    def prefill(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self.prefill_exe(ids, mask, positions, np.arange(self.prompt_len, dtype=np.int64))[0]

    def step(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, slot: int) -> np.ndarray:
        return self.decode_exe(ids, mask, positions, np.array([slot], dtype=np.int64))[0]


_GENERATORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check_model(model):
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise GenerateError(f"{type(model).__name__} is not a Hugging Face causal language model (no LM head)")
    if getattr(config, "is_encoder_decoder", False):
        raise GenerateError(f"{type(model).__name__} is an encoder-decoder model; generate takes decoder-only "
                            f"causal LMs")


def prepare(model, batch: int, prompt_len: int, max_len: int, precision: str = "dlf16", cores=None,
            cache_dir=None) -> Generator:
    """The generator for these sizes: compiled and loaded on first use, then reused (per model object)."""
    from spyre_mlir import compiler

    _check_model(model)
    tgt, cores = compiler._check_options(precision, cores, None)
    key = (batch, prompt_len, max_len, precision, cores)
    with compiler._COMPILING:       # threads asking for the same generator wait for one, not compile two
        per_model = _GENERATORS.setdefault(model, {})
        if key not in per_model:
            per_model[key] = _prepare(model, batch, prompt_len, max_len, precision, cores, cache_dir, tgt)
        return per_model[key]


def _prepare(model, batch, prompt_len, max_len, precision, cores, cache_dir, tgt) -> Generator:
    import time

    import torch

    from spyre_mlir.compiler import _build, _cache_dir, module_keys
    from spyre_mlir.frontend.fingerprint import digests_remembered
    from spyre_mlir.runtime import load_bytes
    from spyre_mlir.runtime.binary import atomic_write, image_of, program_from_bytes, program_layout
    from spyre_mlir.runtime.link import link

    t0 = time.perf_counter()
    step = _cache_step_class()(model, batch, max_len).eval()
    examples = {name: {"input_ids": torch.zeros(batch, t, dtype=torch.long),
                       "attention_mask": torch.ones(batch, max_len, dtype=torch.long),
                       "position_ids": torch.arange(t).expand(batch, t).contiguous(),
                       "cache_position": torch.arange(t)} for name, t in (("prefill", prompt_len), ("decode", 1))}
    cdir = _cache_dir(cache_dir)
    # Both programs are keyed before either is exported: torch.export rebuilds some of the model's attributes
    # (its `_pp_plan`), which the key records, so the decode program would be keyed otherwise in this process
    # than in the next one.
    programs, keys = {}, []
    with digests_remembered():      # every key of both programs hashes the weights once
        mkeys = dict(zip(examples, module_keys(step, list(examples.values()), None, precision, cores, tgt, True)
                         if cdir else [None] * len(examples)))
        for name, example in examples.items():
            path, _, info, image = _build(step, example, precision, cores, None, cache_dir, None, None,
                                          persistent_state=True, mkey=mkeys[name], keep_image=True)
            keys.append(info.key)
            if image is None:            # a cache hit
                with open(path, "rb") as f:
                    image = f.read()
            programs[name] = program_from_bytes(image)
    # The linked file sits beside its parts in the compile cache; without one it is only loaded.
    image = image_of(program_layout(link(programs)))
    out = None
    if cdir is not None:
        out = os.path.join(cdir, hashlib.sha256("+".join(keys).encode()).hexdigest() + ".generate.spyre")
        if not os.path.exists(out):
            atomic_write(out, image)
    return Generator(load_bytes(image, target=tgt), batch, prompt_len, max_len, precision,
                     cores, out, time.perf_counter() - t0)


def generate(model, input_ids, max_new_tokens: int = 32, attention_mask=None, *, precision: str = "dlf16",
             cores: int | None = None, cache_dir=None):
    """Greedy generation (as ``model.generate(input_ids, attention_mask=..., max_new_tokens=N,
    do_sample=False)``): returns a torch.LongTensor [batch, prompt + new] of token ids. Prompts are padded on
    the left (as Hugging Face requires for decoder-only models); ``attention_mask`` marks the real tokens."""
    import torch

    ids = torch.as_tensor(input_ids).long()
    if ids.dim() != 2:
        raise GenerateError(f"input_ids must be [batch, length], got shape {tuple(ids.shape)}")
    b, s = ids.shape
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).long()
    if mask.shape != ids.shape:
        raise GenerateError(f"attention_mask shape {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}")
    if max_new_tokens < 1:
        return ids.clone()
    if bool((mask[:, -1] == 0).any()):
        raise GenerateError("padding on the right: decoder-only generation needs left padding "
                            "(tokenizer.padding_side = 'left')")
    p = _bucket(s)
    gen = prepare(model, b, p, _bucket(p + max_new_tokens), precision, cores, cache_dir)
    with gen.bundle.lock:       # the KV cache is the generator's: another thread's generation waits for this one
        return _generate(model, gen, ids, mask, max_new_tokens, p)


def _generate(model, gen: Generator, ids, mask, max_new_tokens: int, p: int):
    """:func:`generate`'s loop: prefill the prompt (padded to ``p``), then one decode step per new token."""
    import torch

    b, s = ids.shape
    L = gen.max_len
    cfg = model.generation_config
    eos = cfg.eos_token_id
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (min(eos) if eos else 0)

    ids_np, mask_np = ids.numpy(), mask.numpy()
    prompt = np.full((b, p), pad, np.int64)
    prompt[:, p - s:] = ids_np
    full_mask = np.zeros((b, L), np.int64)
    full_mask[:, p - s:p] = mask_np
    positions = np.cumsum(full_mask[:, :p], -1) - 1
    positions[full_mask[:, :p] == 0] = 1
    logits = gen.prefill(prompt, full_mask, positions)
    last = positions[:, -1].copy()
    out = [ids_np]
    done = np.zeros(b, bool)
    nxt = logits[:, -1].argmax(-1)
    for k in range(max_new_tokens):
        tok = np.where(done, pad, nxt)
        out.append(tok[:, None])
        done |= np.isin(tok, list(eos))
        if done.all() or k == max_new_tokens - 1:
            break
        slot = p + k
        full_mask[:, slot] = 1
        last += 1
        logits = gen.step(tok[:, None].astype(np.int64), full_mask, last[:, None].copy(), slot)
        nxt = logits[:, -1].argmax(-1)
    return torch.from_numpy(np.concatenate(out, axis=1))
