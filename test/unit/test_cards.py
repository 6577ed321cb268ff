"""Systems of several cards, end to end: spyre-place-cards, spyre-partition-cards, the system binary (format
1.5) and the runtime that runs it.

A decoder stack (examples/transformer.py at d256) and a Hugging Face Llama on 1, 2 and 4 cards: with splits
that keep each output's reduction order (`cols`, `heads`, pipeline stages) the outputs are the one-card outputs
bit for bit; a `rows` split sums partial products in another order and agrees within the format's tolerance.
The placements are the cost model's own, on a system whose link is nearly free (so it splits every matmul it
can), or forced plans. Then the loader's checks of the schedule, a fuzz of system files, the trace's tracks.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spyre_mlir.runtime import BinaryFormatError, load_bytes  # noqa: E402
from spyre_mlir.runtime.binary import FLAG_SYSTEM, Section, read_container, write_container  # noqa: E402
from spyre_mlir.runtime.system import SystemExecutable, chrome_trace  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
TOML = os.path.join(os.path.dirname(__file__), "..", "..", "spyre_mlir", "targets", "spyre.toml")


@pytest.fixture(scope="module")
def fast_link(tmp_path_factory):
    """The packaged card with a link 100x faster (20 cycles per transfer, 6.4 TB/s): splitting pays off even
    for these small models, so the cost model's own placement splits every matmul it may."""
    text = open(TOML).read()
    text = re.sub(r"(\[link\.card_latency_cycles\]\nvalue = )\d+", r"\g<1>20", text)
    text = re.sub(r"(\[link\.card_gbps\]\nvalue = )[0-9.]+", r"\g<1>6400.0", text)
    path = tmp_path_factory.mktemp("target") / "fast-link.toml"
    path.write_text(text)
    return str(path)


def _import(model, inputs):
    from spyre_mlir.frontend.importer import import_program, lower_to_linalg
    from spyre_mlir.frontend.load import load_program

    imported = import_program(load_program(model, inputs, None))
    imported.linalg_ir = lower_to_linalg(imported.torch_ir)
    return imported


def _compile(imported, cards, target=None, exact=False, plan=None, plan_out=None, precision="dlf16") -> bytes:
    """The binary of `imported` placed over `cards` cards (the one-card program for 1 without a plan)."""
    from spyre_mlir.compiler import emit, prepare_module, run_stage
    from spyre_mlir.context import make_context
    from spyre_mlir.pipeline import graph_pipeline, kernel_pipeline
    from spyre_mlir.runtime.binary import program_to_bytes

    with make_context():
        module = prepare_module(imported)
        run_stage(module, graph_pipeline(), "graph pipeline")
        pipe = kernel_pipeline(precision, None, target, cards, plan, plan_out)
        if exact:
            pipe = pipe.replace("spyre-place-cards{", "spyre-place-cards{exact=true ")
        run_stage(module, pipe, "kernel pipeline")
        em = emit(module)
        return em.to_bytes() if getattr(em, "system", False) else program_to_bytes(em.b.program())


def _splits(plan_path) -> dict:
    plan = json.load(open(plan_path))
    out = {}
    for o in plan["ops"]:
        if o["split"] != "none":
            out[o["split"]] = out.get(o["split"], 0) + 1
    return out


@pytest.fixture(scope="module")
def decoder():
    from transformer import Config, build

    model, inputs = build(0, Config(vocab=256, dim=256, heads=4, layers=2, hidden=512, seq=16))
    with torch.no_grad():
        want = model(*inputs).numpy()
    return _import(model, inputs), [t.numpy() for t in inputs], want


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = Logits(model)(ids).numpy()
    return _import(Logits(model), (ids,)), [ids.numpy()], want


@pytest.mark.parametrize("which", ["decoder", "llama"])
def test_one_two_four_cards_bit_identical(request, tmp_path, fast_link, which):
    """Placed by the cost model with the order-keeping splits only (`exact`): every matmul it can split is
    split (cols, heads), and 2 and 4 cards give the one-card outputs bit for bit, which match PyTorch."""
    imported, inputs, want = request.getfixturevalue(which)
    one = load_bytes(_compile(imported, 1, target=fast_link), target=fast_link)
    y1 = one(*inputs)[0]
    rel = np.linalg.norm(y1 - want) / np.linalg.norm(want)
    assert rel < 2e-2, rel
    for cards in (2, 4):
        plan = tmp_path / f"plan{cards}.json"
        data = _compile(imported, cards, target=fast_link, exact=True, plan_out=str(plan))
        exe = load_bytes(data, target=fast_link)
        assert isinstance(exe, SystemExecutable) and len(exe.cards) == cards
        splits = _splits(plan)
        assert splits.get("cols", 0) >= 4 and "rows" not in splits, splits
        y = exe(*inputs)[0]
        assert np.array_equal(y, y1), f"{cards} cards: max diff {np.abs(y - y1).max()}"
        p = exe.profile
        assert p.num_cards == cards and len(p.transfers) > 0 and all(b > 0 for b in p.link_bytes)
        assert 0 < max(p.link_utilization) < 1 and p.cycles >= max(p.card_busy)


def test_a_kernel_reading_a_parameter_as_it_is_on_several_cards(tmp_path, fast_link):
    """A conv's fp32 bias is read by the kernel as the parameter itself (no cast folds it into a constant): on
    several cards it becomes a constant of the step that reads it (it used to be left an input no one fed, an
    internal error), and the system gives the one-card outputs bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1)).eval()
    x = torch.randn(1, 3, 16, 16)
    imported = _import(model, (x,))
    y1 = load_bytes(_compile(imported, 1, target=fast_link), target=fast_link)(x.numpy())[0]
    with torch.no_grad():
        np.testing.assert_allclose(y1, model(x).numpy(), rtol=0.05, atol=0.05)
    exe = load_bytes(_compile(imported, 2, target=fast_link), target=fast_link)
    assert isinstance(exe, SystemExecutable)
    assert np.array_equal(exe(x.numpy())[0], y1)


def test_system_runs_from_several_threads_take_turns(fast_link, in_threads):
    """Threads calling one system each get their own inputs' outputs: a run's calls on the cards go in order,
    another thread's after them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1)).eval()
    exe = load_bytes(_compile(_import(model, (torch.randn(1, 3, 16, 16),)), 2, target=fast_link), target=fast_link)
    assert isinstance(exe, SystemExecutable)
    xs = [np.random.default_rng(k).standard_normal((1, 3, 16, 16)).astype(np.float32) for k in range(4)]
    want = [exe(x)[0] for x in xs]
    wrong = []

    def calls(k):
        for _ in range(10):
            wrong.append(not np.array_equal(exe(xs[k])[0], want[k]))
    assert not in_threads(calls, [(k,) for k in range(4)])
    assert len(wrong) == 40 and not any(wrong)


def test_quantized_weights_split_with_their_scales(decoder, tmp_path, fast_link):
    """int8 weights: a card's columns are its codes and their per-column scales; bit-identical on 2 cards."""
    imported, inputs, _ = decoder
    y1 = load_bytes(_compile(imported, 1, target=fast_link, precision="int8-weights"), target=fast_link)(*inputs)
    plan = tmp_path / "plan.json"
    exe = load_bytes(_compile(imported, 2, target=fast_link, exact=True, plan_out=str(plan),
                              precision="int8-weights"), target=fast_link)
    assert _splits(plan).get("cols", 0) >= 4
    assert np.array_equal(exe(*inputs)[0], y1[0])


def test_rows_split_within_tolerance_and_pipeline_identical(decoder, tmp_path):
    """Forced plans: every second matmul split by K (`rows`: partial products summed by the readers in card
    order) agrees with one card within the format's tolerance but not bit for bit; two pipeline stages (the
    first half of the ops on card 0, the rest on card 1) are bit-identical."""
    imported, inputs, want = decoder
    y1 = load_bytes(_compile(imported, 1))(*inputs)[0]
    auto = tmp_path / "auto.json"
    _compile(imported, 2, plan_out=str(auto))
    plan = json.loads(auto.read_text())
    # The projections: rotate_half's selection matmuls (spyre-columns-to-matmul, at the concat's location) have
    # K = the head dim, one stick, which no K split divides over two cards.
    matmuls = [o for o in plan["ops"] if o["op"] == "spyre.matmul" and "tensor.concat" not in o["loc"]]
    for o in plan["ops"]:
        o["cards"], o["split"] = [0, 1], "none"
    for o in matmuls[1::2]:
        o["split"] = "rows"
    (tmp_path / "rows.json").write_text(json.dumps(plan))
    exe = load_bytes(_compile(imported, 2, plan=str(tmp_path / "rows.json")))
    y = exe(*inputs)[0]
    assert not np.array_equal(y, y1)
    assert np.abs(y - y1).max() <= 2 ** -8 * np.abs(y1).max(), np.abs(y - y1).max()
    half = len(plan["ops"]) // 2
    for o in plan["ops"]:
        o["cards"], o["split"] = ([0] if o["id"] < half else [1]), "none"
    (tmp_path / "pipe.json").write_text(json.dumps(plan))
    exe = load_bytes(_compile(imported, 2, plan=str(tmp_path / "pipe.json")))
    assert np.array_equal(exe(*inputs)[0], y1)
    assert len(exe.profile.transfers) >= 1 and exe.profile.link_bytes[1] == 0


def test_python_api_writes_and_forces_a_plan(decoder, tmp_path, fast_link):
    """spyre_mlir.compile(cards=2, placement_plan_out=...) writes the plan and returns a SystemExecutable;
    placement_plan=... forces it (its card count with it) and gives the same binary's outputs."""
    import spyre_mlir

    imported, inputs, _ = decoder
    plan = tmp_path / "plan.json"
    a = spyre_mlir.compile(imported, cards=2, target=fast_link, placement_plan_out=str(plan))
    assert isinstance(a, SystemExecutable) and json.loads(plan.read_text())["cards"] == 2
    b = spyre_mlir.compile(imported, target=fast_link, placement_plan=str(plan))
    assert isinstance(b, SystemExecutable) and not b.compile_info.cache_hit
    assert np.array_equal(a(*inputs)[0], b(*inputs)[0])


# ---- the system file -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def system(decoder, fast_link):
    imported, inputs, _ = decoder
    return _compile(imported, 2, target=fast_link, exact=True), inputs


def _reseal(data: bytes, edit) -> bytes:
    """The system file with its metadata changed by `edit` and valid checksums again."""
    ncores, fp, secs = read_container(data)
    secs = [[k, i, bytes(p)] for k, i, p in secs]
    meta = json.loads(secs[0][2])
    edit(meta)
    secs[0][2] = json.dumps(meta).encode()
    return write_container(ncores, fp, secs, flags=FLAG_SYSTEM)


def _first_remote(meta):
    """(call, arg) of the first argument that comes over the link."""
    for i, c in enumerate(meta["calls"]):
        for k, a in enumerate(c["args"]):
            if "gather" in a or ("call" in a and meta["calls"][a["call"]]["card"] != c["card"]):
                return i, k
    raise AssertionError("no transfer")


def _later(meta):
    i, k = _first_remote(meta)
    meta["calls"][i]["args"][k] = {"call": i, "result": 0}          # itself: not an earlier call


def _shape(meta):
    i, k = _first_remote(meta)
    arg = meta["calls"][i]["args"][k]
    meta["calls"][i]["args"][k] = arg["gather"][0] if "gather" in arg else {"input": 0}


CORRUPT = {
    "reads a later result": (_later, r"is not an earlier call"),
    "send without matching receive": (_shape, r"delivers .* the entry's input"),
    "unknown card": (lambda m: m["calls"][0].update(card=7), r"calls\[0\]\.card: 7 is not a card"),
    "unknown entry": (lambda m: m["calls"][0].update(entry="nope"), r"no entry 'nope'"),
    "missing argument": (lambda m: m["calls"][0]["args"].pop(), r"args: \d+ given, the entry takes"),
    "slice out of bounds": (lambda m: m["calls"][0]["args"].__setitem__(0, {"input": 0, "dim": 1, "start": 0,
                                                                             "stop": 99}), r"outside"),
    "bad link": (lambda m: m["link"].update(bytes_per_cycle=0), r"link\.bytes_per_cycle"),
    "card count": (lambda m: m.update(cards=3), r"metadata\.cards: 3"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_loader_rejects_bad_schedules(system, fast_link, name):
    data, _ = system
    edit, pattern = CORRUPT[name]
    with pytest.raises(BinaryFormatError, match=pattern):
        load_bytes(_reseal(data, edit), target=fast_link)


def test_loader_rejects_damaged_system_files(system, fast_link):
    """Seeded damage: byte flips, truncation, metadata leaves replaced; each ends in BinaryFormatError or a run
    with outputs of the declared shapes."""
    data, inputs = system
    rng = np.random.default_rng(20261201)
    meta = json.loads(bytes(read_container(data)[2][0][2]))
    leaves = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + (k,))
        elif isinstance(o, list):
            for k, v in enumerate(o):
                walk(v, path + (k,))
        else:
            leaves.append(path)
    walk(meta, ())
    rejected = ran = 0
    for n in range(90):
        if n % 3 == 0:
            b = bytearray(data)
            b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
            bad = bytes(b)
        elif n % 3 == 1:
            bad = data[:int(rng.integers(len(data)))]
        else:
            path = leaves[int(rng.integers(len(leaves)))]

            def edit(m, path=path):
                for k in path[:-1]:
                    m = m[k]
                m[path[-1]] = [None, -1, 0, 1, 5, "x", [], {}, 1.5][int(rng.integers(9))]
            bad = _reseal(data, edit)
        try:
            exe = load_bytes(bad, target=fast_link)
        except BinaryFormatError:
            rejected += 1
            continue
        from spyre_mlir.runtime import InputError
        try:
            outs = exe(*inputs)
        except InputError:
            continue
        assert all(o.ndim >= 1 for o in outs)
        ran += 1
    assert rejected >= 60, (rejected, ran)


def test_profile_and_trace_have_a_track_per_card_and_link(system, fast_link):
    data, inputs = system
    exe = load_bytes(data, target=fast_link)
    exe(*inputs)
    trace = chrome_trace(exe.profile)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"card 0", "card 1", "link from card 0", "link from card 1"}
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} == {"card", "link"}
    assert trace["otherData"]["link_utilization"] == list(exe.profile.link_utilization)


def test_one_card_loader_and_system_loader_refuse_each_other(system):
    from spyre_mlir.runtime.binary import program_from_bytes

    data, _ = system
    with pytest.raises(BinaryFormatError, match="a system of several cards"):
        program_from_bytes(data)
    ncores, fp, secs = read_container(data)
    with pytest.raises(BinaryFormatError, match="header: 3 sections for"):      # not a one-card layout
        read_container(write_container(ncores, fp, secs))
    assert [k for k, _, _ in secs] == [Section.METADATA, Section.CARD, Section.CARD]
