"""Files with several entries (format 1.3): state buffers persist across calls of any entry, constants are
shared, the linker relocates code, and the loader rejects malformed entry tables."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from spyre_mlir.runtime import BinaryFormatError, ProgramBuilder, load_bytes
from spyre_mlir.runtime.binary import ENTRY_SEP, Section, program_from_bytes, program_to_bytes, read_container, \
    write_container
from spyre_mlir.runtime.formats import Format, decode, encode
from spyre_mlir.runtime.isa import INSTR_DTYPE
from spyre_mlir.runtime.link import LinkError, link
from spyre_mlir.runtime.loader import Bundle
from spyre_mlir.target import load_target

T2 = load_target(cores=2)
W = np.linspace(-2, 2, 4 * 64, dtype=np.float32).reshape(4, 64)


def _dlf16(x):
    return decode(Format.DLF16, encode(Format.DLF16, np.asarray(x, np.float32)))


def _writer():
    """x -> state s; returns 2x. A scratch buffer first, so addresses differ from the reader's."""
    b = ProgramBuilder(T2)
    x = b.input("x", (4, 64))
    b.scratch("pad", (64, 64))
    s = b.state("s", (4, 64))
    b.constant("w", W)
    y = b.output("y", (4, 64))
    t = b.alloc(0, 4, 64)
    b.load_tile(0, t, x)
    b.store_tile(0, t, s)
    b.sfu(0, "mul", t, t, 2.0)
    b.store_tile(0, t, y)
    b.barrier()
    return b.program()


def _reader():
    """() -> s + w, on core 1."""
    b = ProgramBuilder(T2)
    w = b.constant("w", W)
    s = b.state("s", (4, 64))
    y = b.output("y", (4, 64))
    t, u = b.alloc(1, 4, 64), b.alloc(1, 4, 64)
    b.load_tile(1, t, s)
    b.load_tile(1, u, w)
    b.sfu(1, "add", t, t, u)
    b.store_tile(1, t, y)
    b.barrier()
    return b.program()


def _linked() -> bytes:
    return program_to_bytes(link({"write": _writer(), "read": _reader()}))


def test_state_persists_across_entries_and_constants_are_shared():
    data = _linked()
    prog = program_from_bytes(data)
    assert [e.name for e in prog.entries] == ["write", "read"]
    assert [b.name for b in prog.buffers if b.kind == "constant"] == ["w"]       # one copy of the weights
    assert [b.name for b in prog.buffers if b.kind == "state"] == ["s"]
    assert {b.name for b in prog.buffers if ENTRY_SEP in b.name} >= {"write:x", "write:y", "read:y"}
    bundle = load_bytes(data, target=T2)
    assert isinstance(bundle, Bundle) and bundle.entries == ["write", "read"]
    (zero,) = bundle["read"]()
    np.testing.assert_array_equal(zero, _dlf16(W))                              # state starts at zero
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    (twice,) = bundle["write"](x)
    np.testing.assert_array_equal(twice, _dlf16(2 * _dlf16(x)))
    (y,) = bundle["read"]()
    np.testing.assert_array_equal(y, _dlf16(_dlf16(x) + _dlf16(W)))
    np.testing.assert_array_equal(bundle.read_state("s"), _dlf16(x))
    bundle.reset_state()
    np.testing.assert_array_equal(bundle["read"]()[0], _dlf16(W))
    assert bundle["write"].input_names == ["x"] and bundle["read"].input_names == []


def test_link_rejects_disagreeing_state():
    b = ProgramBuilder(T2)
    s = b.state("s", (8, 64))
    y = b.output("y", (8, 64))
    t = b.alloc(0, 8, 64)
    b.load_tile(0, t, s)
    b.store_tile(0, t, y)
    b.barrier()
    with pytest.raises(LinkError, match="state 's'"):
        link({"write": _writer(), "other": b.program()})


def _reseal_meta(data: bytes, edit) -> bytes:
    ncores, fp, secs = read_container(data)
    secs = [[k, i, bytes(p)] for k, i, p in secs]
    meta_sec = next(s for s in secs if s[0] == Section.METADATA)
    meta = json.loads(meta_sec[2])
    edit(meta)
    meta_sec[2] = json.dumps(meta).encode()
    return write_container(ncores, fp, secs)


def _set(path, value):
    def edit(meta):
        obj = meta
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit,match", [
    (_set(("entries", 1, "name"), "write"), "duplicate"),
    (_set(("entries", 0, "inputs"), ["read:y"]), "not a 'input' buffer of this entry"),
    (_set(("entries", 0, "outputs"), []), "every 'output' buffer"),
    (_set(("inputs",), ["write:x"]), "every .input. buffer exactly once"),
    (_set(("host_ops",), [{"op": "copy", "inputs": ["w"], "outputs": ["read:y"]}]), "no top-level"),
    (_set(("entries",), []), "1..64 entries"),
    (lambda m: [b.update(name="write:s") for b in m["buffers"] if b["name"] == "s"], "belongs to one entry"),
])
def test_loader_rejects_bad_entry_tables(edit, match):
    with pytest.raises(BinaryFormatError, match=match):
        load_bytes(_reseal_meta(_linked(), edit), target=T2)


def test_entry_code_is_validated_per_entry():
    prog = link({"write": _writer(), "read": _reader()})
    code = np.array(prog.entries[1].code[1], copy=True)
    code[0]["dev"] = prog.device_bytes + 4096          # a DMA outside device memory
    prog.entries[1] = dataclasses.replace(prog.entries[1], code=[prog.entries[1].code[0], code])
    with pytest.raises(BinaryFormatError, match="entry 'read'"):
        load_bytes(program_to_bytes(prog), target=T2)


def test_fuzzed_linked_files_fail_cleanly():
    """Damaged multi-entry files: a BinaryFormatError, or a bundle whose entries run."""
    good = _linked()
    rng = np.random.default_rng(20261201)
    outcomes = {"rejected": 0, "ran": 0}
    x = np.ones((4, 64), np.float32)
    for k in range(300):
        if k % 2:
            b = bytearray(good)
            b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
            data = bytes(b)
        else:
            prog = link({"write": _writer(), "read": _reader()})
            e = int(rng.integers(2))
            c = int(rng.integers(2))
            code = np.array(prog.entries[e].code[c], copy=True)
            i = int(rng.integers(len(code)))
            field = INSTR_DTYPE.names[int(rng.integers(1, len(INSTR_DTYPE.names)))]
            dt = INSTR_DTYPE.fields[field][0]
            if dt.kind != "f":
                v = int(rng.choice([0, 1, 64, 128, 4096, 1 << 20, 1 << 31]))
                code[i][field] = v % (1 << (8 * dt.itemsize))
            codes = list(prog.entries[e].code)
            codes[c] = code
            prog.entries[e] = dataclasses.replace(prog.entries[e], code=codes)
            data = program_to_bytes(prog)
        try:
            bundle = load_bytes(data, target=T2)
        except BinaryFormatError:
            outcomes["rejected"] += 1
            continue
        for name in bundle.entries:
            exe = bundle[name]
            exe(*([x] * len(exe.input_buffers)))
        outcomes["ran"] += 1
    assert outcomes["rejected"] > 100 and outcomes["ran"] > 10, outcomes


class _Cache(torch.nn.Module):
    """A module updating a cache buffer in place at run-time positions (the KV-cache pattern)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 16, 8))

    def forward(self, x, pos):
        self.cache.index_copy_(2, pos, x)
        return self.cache.sum(-1) * 2


@pytest.mark.parametrize("precision", ["fp32-reference", "dlf16"])
def test_persistent_state_compiles_to_a_state_buffer(precision):
    import spyre_mlir

    x, pos = torch.randn(1, 2, 3, 8), torch.tensor([0, 1, 2])
    exe = spyre_mlir.compile(_Cache(), (x, pos), precision=precision, cores=4, cache_dir=False,
                             persistent_state=True)
    state = [b for b in exe.program.buffers if b.kind == "state"]
    assert [b.name for b in state] == ["cache"] and exe.output_names == ["output_0"]
    # Held in the activation format (its values are that format's), and the new cache is computed into the state
    # buffer itself: no copy of it at the end of a call.
    assert state[0].fmt.key == ("fp32" if precision == "fp32-reference" else "dlf16"), state[0].fmt
    assert "state update" not in exe.compile_info.device_ops, exe.compile_info.device_ops
    for h in exe.program.host_ops:                       # the cache never goes through the host
        assert "cache" not in h["inputs"] + h["outputs"]
    ref = _Cache()
    tol = 0 if precision == "fp32-reference" else 2e-2
    for step in range(4):
        xs = torch.randn(1, 2, 3, 8)
        ps = torch.tensor([3 * step, 3 * step + 1, 3 * step + 2])
        with torch.no_grad():
            r = ref(xs, ps).numpy()
        (o,) = exe(xs, ps)
        np.testing.assert_allclose(o, r, rtol=tol, atol=tol or 1e-5)
    np.testing.assert_allclose(exe.read_state("cache"), ref.cache.numpy(), rtol=tol, atol=tol or 1e-6)


def test_spyre_run_takes_an_entry(tmp_path, capsys):
    from spyre_mlir.tools.run import main

    path = tmp_path / "linked.spyre"
    path.write_bytes(_linked())
    assert main([str(path), "--target", str(_target_file(tmp_path))]) == 1
    assert "entries write, read: choose one with --entry" in capsys.readouterr().err
    assert main([str(path), "--entry", "read", "--target", str(_target_file(tmp_path))]) == 0
    assert "output_0 (y): shape (4, 64)" in capsys.readouterr().out
    assert main([str(path), "--entry", "nope", "--target", str(_target_file(tmp_path))]) == 1
    assert "no entry 'nope'" in capsys.readouterr().err


def _target_file(tmp_path):
    """The packaged target narrowed to 2 cores, as a file spyre-run can take."""
    import shutil

    from spyre_mlir.target import default_target_path

    dst = tmp_path / "spyre.toml"
    shutil.copy(default_target_path(), dst)
    return dst
