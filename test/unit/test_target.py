"""The target description file and its loader (spyre_mlir/target.py)."""

import dataclasses
import subprocess
import sys
import tomllib

import pytest

from spyre_mlir.target import MARKS, Target, TargetError, default_target_path, load_target


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def write_target(path, data: dict) -> str:
    """Serialize the target document shape ([target] + section.entry tables) back to TOML."""
    lines = ["[target]"] + [f"{k} = {_toml(v)}" for k, v in data["target"].items()]
    for section, table in data.items():
        if section == "target":
            continue
        for entry, body in table.items():
            lines.append(f"[{section}.{entry}]")
            lines += [f"{k} = {_toml(v)}" for k, v in body.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def doc():
    with open(default_target_path(), "rb") as f:
        return tomllib.load(f)


def test_loads_the_documented_numbers():
    t = load_target()
    assert isinstance(t, Target)
    assert (t.num_cores, t.max_cores, t.corelets_per_core, t.pt_rows, t.pt_cols) == (32, 32, 2, 8, 8)
    assert t.scratchpad_bytes == 2 * 1024 * 1024 and t.scratchpad_usable_bytes == 1_589_376
    assert t.scratchpad_alignment_bytes == 128 and t.stick_bytes == 128
    assert t.clock_ghz == 1.0
    assert t.macs_per_cycle("dlf16") == 1536 and t.macs_per_cycle("bf16") == 1536
    assert t.macs_per_cycle("fp8_e4m3") == t.macs_per_cycle("int8") == 2 * 1536
    assert t.macs_per_cycle("int4") == 4 * 1536
    assert t.sustained_macs_per_cycle("dlf16") == 1140
    assert t.overlap_factor == 0.46
    assert t.sfu_lanes == 64 and t.sfu_cycles("transcendental") >= t.sfu_cycles("simple")
    assert t.dram_bytes == 112 * 2**30 and t.core_span_bytes == 256 * 2**20
    assert (t.dram_read_gbps, t.dram_write_gbps, t.dram_mixed_gbps) == (150.0, 150.0, 105.0)
    assert t.ring_bytes_per_cycle == 128 and t.restickify_gbps == 116.0 and t.cards_per_host == 8
    assert round(t.peak_tflops_dlf16, 1) == 98.3
    latencies = ("dma", "pt", "sfu", "hop", "barrier", "host")
    assert tuple(getattr(t, f"{u}_latency_cycles") for u in latencies) == (64, 16, 8, 4, 32, 10_000)
    assert all(t.marks[f"{u}_latency_cycles"] == "assumed" for u in latencies)
    with pytest.raises(ValueError):
        t.macs_per_cycle("fp32")           # fp32 matmul does not run on the PT array


def test_every_entry_is_marked_and_sourced(doc):
    t = load_target()
    entries = [(s, k, b) for s, tab in doc.items() if s != "target" for k, b in tab.items()]
    assert len(entries) == len(t.marks) == len(t.sources) > 30
    for section, key, body in entries:
        assert set(body) == {"value", "mark", "source"}, f"{section}.{key}"
        assert body["mark"] in MARKS, f"{section}.{key}"
        assert body["source"].strip(), f"{section}.{key}"
    assert set(t.marks.values()) == MARKS                 # the file uses all three
    assert t.marks["scratchpad_usable_bytes"] == "public" and t.marks["clock_ghz"] == "assumed"
    assert t.marks["sustained_macs_per_cycle_dlf16"] == "measured"


def test_fingerprint_is_stable_and_tracks_values(tmp_path, doc):
    a, b = load_target(), load_target()
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 64
    assert a == b and hash(a) == hash(b)
    # Same values in another file (even with another source string): same fingerprint.
    doc["core"]["pt_rows"]["source"] = "rephrased citation"
    assert load_target(write_target(tmp_path / "same.toml", doc)).fingerprint() == a.fingerprint()
    # One value changed: different fingerprint.
    doc["core"]["scratchpad_usable_bytes"]["value"] = 1_589_376 - 128
    assert load_target(write_target(tmp_path / "other.toml", doc)).fingerprint() != a.fingerprint()
    # A fixed latency too: the cost model and the runtime's cycle model both read them from the target.
    doc["core"]["scratchpad_usable_bytes"]["value"] = 1_589_376
    doc["memory"]["dma_latency_cycles"]["value"] = 65
    slower = load_target(write_target(tmp_path / "slower.toml", doc))
    assert slower.dma_latency_cycles == 65 and slower.fingerprint() != a.fingerprint()
    # The active core count is part of the identity (work is divided per core at compile time).
    assert a.with_cores(8).fingerprint() != a.fingerprint()
    # Stable across processes (no dependence on hash randomization or dict order).
    out = subprocess.run([sys.executable, "-c", "from spyre_mlir.target import load_target as l;"
                          "print(l().fingerprint())"], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == a.fingerprint()


def test_with_cores():
    t = load_target()
    four = t.with_cores(4)
    assert four.num_cores == 4 and t.num_cores == 32 and four.max_cores == 32
    assert load_target(cores=1).num_cores == 1
    assert four.marks == t.marks
    for bad in (0, -1, 33, 2.0, True):
        with pytest.raises(TargetError):
            t.with_cores(bad)
    with pytest.raises(TargetError):
        load_target(cores=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.num_cores = 3


@pytest.mark.parametrize("edit,key", [
    (lambda d: d["core"].pop("pt_rows"), "core.pt_rows"),
    (lambda d: d["core"]["pt_cols"].pop("value"), "core.pt_cols"),
    (lambda d: d["core"]["pt_cols"].update(mark="guessed"), "core.pt_cols"),
    (lambda d: d["memory"]["dram_bytes"].update(source=""), "memory.dram_bytes"),
    (lambda d: d["memory"]["dram_bytes"].update(value="lots"), "memory.dram_bytes"),
    (lambda d: d["card"]["max_cores"].update(value=32.5), "card.max_cores"),
    (lambda d: d["layout"]["stick_bytes"].update(value=0), "layout.stick_bytes"),
    (lambda d: d["core"].update(pt_row={"value": 8, "mark": "public", "source": "typo"}), "core.pt_row"),
    (lambda d: d["core"]["scratchpad_usable_bytes"].update(value=1_589_377), "core.scratchpad_usable_bytes"),
    (lambda d: d["target"].update(schema=99), "target.schema"),
])
def test_malformed_file_names_file_and_key(tmp_path, doc, edit, key):
    edit(doc)
    path = write_target(tmp_path / "bad.toml", doc)
    with pytest.raises(TargetError) as e:
        load_target(path)
    assert path in str(e.value) and f"'{key}'" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(TargetError, match="nope.toml"):
        load_target(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[core.pt_rows\nvalue = 8\n")
    with pytest.raises(TargetError, match="broken.toml.*malformed TOML"):
        load_target(broken)


def test_import_is_light():
    code = ("import sys, spyre_mlir.target; "
            "assert not {'torch', 'torch_mlir', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
