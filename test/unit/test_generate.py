"""spyre_mlir.generate: greedy tokens identical to Hugging Face's generate, with the KV cache on the device.

The whole matrix of causal LM families is `make models` (entry "generate", docs/models.md); this is a slice.
"""

import os
import sys

import pytest
import torch

import spyre_mlir
from spyre_mlir import generation

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import zoo  # noqa: E402

NEW = 32


def _eager(model, x):
    with torch.no_grad():
        return model.generate(x["input_ids"], attention_mask=x["attention_mask"], max_new_tokens=NEW,
                              do_sample=False)


# Rotary + GQA (llama), learned positions and fused QKV (gpt2), sliding-window layers (gemma3).
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_greedy_tokens_identical_at_fp32_reference(family):
    model = zoo.build(family)
    x = zoo.example_inputs(family, mask=True)           # batch 2, the second row left-padded
    out = spyre_mlir.generate(model, x["input_ids"], max_new_tokens=NEW, attention_mask=x["attention_mask"],
                              precision="fp32-reference", cores=4)
    ref = _eager(model, x)
    assert out.shape == ref.shape and torch.equal(out, ref), (out, ref)


def test_cache_stays_on_the_device_and_programs_are_prepared_once(monkeypatch):
    model = zoo.build("llama")
    x = zoo.example_inputs("llama", mask=True)
    first = spyre_mlir.generate(model, x["input_ids"], max_new_tokens=8, attention_mask=x["attention_mask"],
                                precision="dlf16", cores=4)
    gen = generation._GENERATORS[model][(2, 8, 16, "dlf16", 4)]
    decode = gen.decode_exe
    state = {b.name for b in decode.state_buffers}
    assert state == {f"{kv}_cache_{i}" for kv in ("key", "value") for i in range(2)}
    assert gen.prefill_exe.state_buffers == decode.state_buffers      # one cache, shared by both programs
    for exe in (gen.prefill_exe, decode):
        for h in exe.program.host_ops:                                # no host op reads or writes the cache
            assert not state & set(h["inputs"] + h["outputs"]), h
        assert not state & set(exe.input_names + exe.output_names)
    # The decode step's host traffic (ids, positions, the mask) is less than one layer's cache.
    assert decode.static_profile.host_bytes < min(b.nbytes for b in decode.state_buffers)
    # Two round trips to the host per step, whatever the layer count: the index math of the positions, masks and
    # cache slots (one call), RoPE's cos and sin (no SFU function: one call).
    assert len(decode.program.host_ops) == 2, [h["op"] for h in decode.program.host_ops]
    # A second prompt of the same sizes reuses the loaded programs: no compile, no load.
    calls = []
    monkeypatch.setattr("spyre_mlir.compiler._build", lambda *a, **k: calls.append(a))
    x2 = zoo.example_inputs("llama", mask=True, seed=7)
    again = spyre_mlir.generate(model, x2["input_ids"], max_new_tokens=8, attention_mask=x2["attention_mask"],
                                precision="dlf16", cores=4)
    assert not calls and again.shape == first.shape
    ref = _eager(model, x2)[:, :again.shape[1]]
    assert (again[:, 8:] == ref[:, 8:]).float().mean() >= 0.9, (again, ref)


def test_generations_from_several_threads_take_turns(in_threads):
    """Threads generating with one model (a server's requests) each get their own prompt's tokens: the KV cache
    is the generator's, so a generation holds it from the prefill to the last step (interleaved, 11 of 12
    generations came out wrong)."""
    model = zoo.build("llama")
    xs = [zoo.example_inputs("llama", mask=True, seed=s) for s in (1, 2, 3)]
    kw = dict(max_new_tokens=8, precision="fp32-reference", cores=4)
    want = [spyre_mlir.generate(model, x["input_ids"], attention_mask=x["attention_mask"], **kw) for x in xs]
    wrong = []

    def run(k):
        for _ in range(2):
            out = spyre_mlir.generate(model, xs[k]["input_ids"], attention_mask=xs[k]["attention_mask"], **kw)
            wrong.append(not torch.equal(out, want[k]))
    assert not in_threads(run, [(k,) for k in range(3)])
    assert len(wrong) == 6 and not any(wrong)


def test_generate_rejects_what_it_cannot_run():
    model = zoo.build("bert")
    with pytest.raises(generation.GenerateError, match="causal language model"):
        spyre_mlir.generate(model, torch.ones(1, 4, dtype=torch.long), max_new_tokens=2)
    llama = zoo.build("llama")
    with pytest.raises(generation.GenerateError, match="left padding"):
        spyre_mlir.generate(llama, torch.ones(1, 4, dtype=torch.long), max_new_tokens=2,
                            attention_mask=torch.tensor([[1, 1, 1, 0]]))


def test_hugging_face_generate_through_torch_compile(monkeypatch):
    """Hugging Face's own generate with a static cache, the model's forward compiled for Spyre (the way
    Hugging Face documents torch.compile for generation): the same greedy tokens, every graph on Spyre."""
    import warnings

    import spyre_mlir.backend as backend

    compiled = []
    real = backend._compile
    monkeypatch.setattr(backend, "_compile", lambda *a, **k: compiled.append(1) or real(*a, **k))
    model = zoo.build("llama")
    x = zoo.example_inputs("llama", mask=True)
    with torch.no_grad():
        ref = model.generate(**x, max_new_tokens=8, do_sample=False)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="spyre",
                                  options={"precision": "fp32-reference", "cores": 4, "cache_dir": False})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(**x, max_new_tokens=8, do_sample=False, cache_implementation="static")
    assert torch.equal(out, ref)
    assert compiled and not [w for w in caught if "running a captured graph eagerly" in str(w.message)]


def test_sliding_window_without_layer_types():
    """Mistral keeps one mask for every layer, with its sliding window (no per-layer types): generation
    past the window must use it too."""
    import transformers

    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(transformers.MistralConfig(**zoo._DEC, sliding_window=4)).eval()
    x = zoo.example_inputs("mistral", mask=True)
    out = spyre_mlir.generate(model, x["input_ids"], max_new_tokens=16, attention_mask=x["attention_mask"],
                              precision="fp32-reference", cores=4)
    with torch.no_grad():
        ref = model.generate(**x, max_new_tokens=16, do_sample=False)
    assert torch.equal(out, ref)


def test_a_fresh_equal_model_finds_both_programs_without_export(tmp_path, monkeypatch):
    """Both programs are keyed before either is exported (torch.export rebuilds some of a Hugging Face model's
    attributes, which the key records): an equal model built afresh, as in the next run of a script, finds the
    prefill and the decode program in the cache without tracing anything."""
    import spyre_mlir.frontend.importer as importer

    x = zoo.example_inputs("llama", mask=True)
    kw = dict(max_new_tokens=4, attention_mask=x["attention_mask"], precision="dlf16", cores=4,
              cache_dir=str(tmp_path))
    first = spyre_mlir.generate(zoo.build("llama"), x["input_ids"], **kw)

    def fail(*args, **kwargs):
        raise AssertionError("torch.export or Torch-MLIR ran on a cache hit")
    monkeypatch.setattr(torch.export, "export", fail)
    monkeypatch.setattr(importer, "import_program", fail)
    again = spyre_mlir.generate(zoo.build("llama"), x["input_ids"], **kw)
    assert torch.equal(first, again)
