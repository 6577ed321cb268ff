"""The .spyre container and the loader's validation: round trips, atomic writes, and one test per kind of
corruption, each checking that the message names the problem (section, core/instruction, field)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_mlir.runtime import BinaryFormatError, ProgramBuilder, load, load_bytes
from spyre_mlir.runtime.binary import (CONST_ALIGN, HEADER_BYTES, Section, program_from_bytes, program_to_bytes,
                                       read_container, write_container, write_program)
from spyre_mlir.runtime.isa import INSTR_DTYPE, Op
from spyre_mlir.runtime.kernels import build_matmul
from spyre_mlir.target import load_target

T2 = load_target(cores=2)
T3 = load_target(cores=3)


def _base() -> ProgramBuilder:
    """Two cores, split-K over the ring, constant weights: every section kind and most opcodes."""
    w = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    return build_matmul(T2, 64, 64, 256, grid=(1, 1), split_k=2, weights=w)


@pytest.fixture
def prog():
    return _base().program()


def _find(prog, core, op, nth=0):
    return [i for i, r in enumerate(prog.code[core]) if r["op"] == op][nth]


def _reseal(prog) -> bytes:
    prog.code = [np.array(c, copy=True) for c in prog.code]
    return program_to_bytes(prog)


def _sections(data):
    ncores, fp, secs = read_container(data)
    return ncores, fp, [[k, i, bytes(p)] for k, i, p in secs]


def _with_meta(data, fn, kind=Section.METADATA) -> bytes:
    ncores, fp, secs = _sections(data)
    for s in secs:
        if s[0] == kind:
            meta = json.loads(s[2])
            meta = fn(meta) or meta
            s[2] = json.dumps(meta).encode()
    return write_container(ncores, fp, secs)


def _patch_entry(data: bytes, i: int, offset=None, length=None) -> bytes:
    """Move section i's table entry (recomputing its checksum and the table checksum)."""
    b = bytearray(data)
    pos = HEADER_BYTES + 32 * i
    kind, index, off, ln, crc, res = struct.unpack_from("<IIQQII", b, pos)
    off = off if offset is None else offset
    ln = ln if length is None else length
    crc = zlib.crc32(bytes(b[off:off + ln])) if off + ln <= len(b) else crc
    struct.pack_into("<IIQQII", b, pos, kind, index, off, ln, crc, res)
    nsec = struct.unpack_from("<I", b, 12)[0]
    b[64:68] = bytes(4)
    struct.pack_into("<I", b, 64, zlib.crc32(bytes(b[:HEADER_BYTES + 32 * nsec])))
    return bytes(b)


# ---------------------------------------------------------------------------------------------------------


def test_round_trip(prog):
    data = program_to_bytes(prog)
    back = program_from_bytes(data)
    assert back.buffers == prog.buffers and back.inputs == prog.inputs and back.outputs == prog.outputs
    assert back.fingerprint == T2.fingerprint() and back.num_cores == 2
    for a, b in zip(back.code, prog.code):
        assert a.dtype == INSTR_DTYPE and np.array_equal(a, b)
    assert {k: bytes(v) for k, v in back.constants.items()} == {k: bytes(v) for k, v in prog.constants.items()}
    assert [list(map(tuple, c)) for c in back.debug] == [list(map(tuple, c)) for c in prog.debug]
    assert program_to_bytes(back) == data            # canonical: re-encoding gives the same bytes


def test_debug_section_is_a_table_and_the_form_before_1_9_is_still_read(prog):
    """Each distinct (op, location) pair is written once; a file with one pair per record (<= 1.8) loads the
    same."""
    data = program_to_bytes(prog)
    pairs = {d for core in prog.debug for d in map(tuple, core)}
    (dbg,) = [json.loads(p) for k, _, p in _sections(data)[2] if k == Section.DEBUG]
    assert len(dbg["locations"]) == len(pairs) < sum(map(len, prog.debug))
    old = _with_meta(data, lambda d: [[d["locations"][i] for i in core] for core in d["records"]], Section.DEBUG)
    assert program_from_bytes(old).debug == program_from_bytes(data).debug == [list(map(tuple, c))
                                                                                for c in prog.debug]


def test_constants_are_page_aligned_in_the_file(prog):
    data = program_to_bytes(prog)
    _, _, secs = read_container(data)
    meta = json.loads(bytes(next(p for k, _, p in secs if k == Section.METADATA)))
    const_off = struct.unpack_from("<Q", data, HEADER_BYTES + 32 * 1 + 8)[0]
    assert const_off % CONST_ALIGN == 0
    assert meta["constants"] and all(c["offset"] % CONST_ALIGN == 0 for c in meta["constants"])
    w = prog.buffer("w")
    entry = meta["constants"][0]
    assert entry["buffer"] == "w" and entry["addr"] == w.addr and entry["format"] == "dlf16"


def test_write_is_atomic(tmp_path, prog, monkeypatch):
    path = tmp_path / "m.spyre"
    write_program(prog, path)
    good = path.read_bytes()
    assert good == program_to_bytes(prog)       # the pieces streamed into the file are the image
    assert load(path)  # loads

    def boom(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_program(prog, path)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["m.spyre"]     # no temp file left behind


def test_system_of_layouts_writes_its_image(tmp_path, prog):
    """A system file whose cards are programs' pieces (as the compiler makes it) streams into the file as the
    image system_to_bytes makes, and each card reads back as the program."""
    from spyre_mlir.runtime.binary import atomic_write, program_layout
    from spyre_mlir.runtime.system import System, system_layout, system_to_bytes

    sys_ = System({"format": "spyre-system", "cards": 2}, [program_layout(prog), program_to_bytes(prog)],
                  prog.num_cores, prog.fingerprint)
    atomic_write(tmp_path / "s.spyre", system_layout(sys_))
    data = (tmp_path / "s.spyre").read_bytes()
    assert data == system_to_bytes(sys_)
    _, _, secs = read_container(data)
    assert [bytes(p) for k, _, p in secs if k == Section.CARD] == [bytes(program_to_bytes(prog))] * 2


def _raw(fn):
    return lambda prog: fn(bytearray(program_to_bytes(prog)))


def _set(core, op, field, value, nth=0):
    def mutate(prog):
        prog.code = [np.array(c, copy=True) for c in prog.code]
        prog.code[core][_find(prog, core, op, nth)][field] = value
        return program_to_bytes(prog)
    return mutate


def _drop(core, op, nth=0):
    def mutate(prog):
        i = _find(prog, core, op, nth)
        prog.code[core] = np.delete(prog.code[core], i)
        del prog.debug[core][i]
        return program_to_bytes(prog)
    return mutate


def _bytes_set(off, value: bytes):
    def f(b):
        b[off:off + len(value)] = value
        return bytes(b)
    return _raw(f)


def _meta(fn):
    return lambda prog: _with_meta(program_to_bytes(prog), fn)


def _first_buffer(key, value):
    def f(meta):
        meta["buffers"][0][key] = value
    return _meta(f)


def _swap_second_buffer_addr(meta):
    meta["buffers"][1]["addr"] = meta["buffers"][0]["addr"]


def _missing_core_section(prog):
    ncores, fp, secs = _sections(program_to_bytes(prog))
    return write_container(ncores, fp, [s for s in secs if not (s[0] == Section.CODE and s[1] == 1)])


def _debug(fn):
    return lambda prog: _with_meta(program_to_bytes(prog), fn, Section.DEBUG)


def _bad_debug(prog):
    prog.debug[0] = prog.debug[0][:-1]
    return program_to_bytes(prog)


def _section_out_of_file(prog):
    data = program_to_bytes(prog)
    return _patch_entry(data, 2, offset=len(data) - 64, length=4096)


def _section_overlap(prog):
    data = program_to_bytes(prog)
    ncores, fp, secs = _sections(data)
    off0, len0 = struct.unpack_from("<QQ", data, HEADER_BYTES + 8)
    return _patch_entry(data, 3, offset=off0, length=min(len0, 64))


CORRUPTIONS = {
    # container
    "bad magic": (_bytes_set(0, b"NOTSPYRE"), r"header: bad magic"),
    "future version": (_bytes_set(8, struct.pack("<H", 2)), r"header: unsupported format version 2\.\d+"),
    "truncated": (_raw(lambda b: bytes(b[:-100])), r"header: file is .* \(truncated\)"),
    "extended": (_raw(lambda b: bytes(b) + b"\0" * 7), r"header: file is .* \(extended\)"),
    "header checksum": (_raw(lambda b: bytes(b[:30]) + bytes([b[30] ^ 1]) + bytes(b[31:])),
                        r"header: checksum mismatch"),
    "section checksum": (_raw(lambda b: bytes(b[:-1]) + bytes([b[-1] ^ 0x40])),
                         r"section 4 \(debug\): checksum mismatch"),
    "section outside file": (_section_out_of_file, r"section 2 \(code core 0\): range .* outside the file"),
    "sections overlap": (_section_overlap, r"section 0 \(metadata\): overlaps section 3 \(code core 1\)"),
    "missing code section": (_missing_core_section, r"header: 4 sections for 2 cores|missing code section"),
    # metadata
    "metadata not json": (lambda p: write_container(2, p.fingerprint, [
        [Section.METADATA, 0, b"{not json"], [Section.CONSTANTS, 0, b""], [Section.CODE, 0, b""],
        [Section.CODE, 1, b""]]), r"metadata: not valid JSON"),
    "buffer layout": (_first_buffer("strides", [64]), r"metadata\.buffers\[0\] \('x'\): layout is not the canonical"),
    "buffer misaligned": (_first_buffer("addr", 100), r"metadata\.buffers\[0\] \('x'\)\.addr: 100 is not 4096"),
    "buffer format": (_first_buffer("format", "fp128"), r"metadata\.buffers\[0\] \('x'\)\.format: unknown format"),
    "buffers overlap": (_meta(_swap_second_buffer_addr), r"metadata\.buffers: '.*' overlaps '.*'"),
    "huge device memory": (_meta(lambda m: m.update(device_bytes=1 << 50)),
                           r"metadata\.device_bytes: .* exceeds the limit"),
    "buffer past device memory": (_meta(lambda m: m.update(device_bytes=4096)),
                                  r"metadata\.buffers\[\d\] .*exceeds device_bytes 4096"),
    "constant length": (_meta(lambda m: m["constants"][0].update(length=12)),
                        r"metadata\.constants\[0\]: length/addr/format do not match buffer 'w'"),
    "constant offset": (_meta(lambda m: m["constants"][0].update(offset=1 << 30)),
                        r"metadata\.constants\[0\]: .* outside the constants section"),
    "inputs list": (_meta(lambda m: m.update(inputs=["y"])), r"metadata\.inputs\[0\]: 'y' is not a buffer of kind"),
    "host op": (_meta(lambda m: m.update(host_ops=[{"op": "call", "inputs": [], "outputs": [],
                                                     "attrs": {"fn": "no_such_fn"}}])),
                r"metadata\.host_ops\[0\]: host function 'no_such_fn' is not registered"),
    "debug length": (_bad_debug, r"debug core 0: expected \d+ indices into debug\.locations"),
    "debug index": (_debug(lambda d: d["records"][1].__setitem__(0, len(d["locations"]))),
                    r"debug core 1: expected \d+ indices into debug\.locations \(\d+ pairs\)"),
    "debug table": (_debug(lambda d: d["locations"].append(["op"])), r"debug: expected \{\"locations\""),
    "debug old form": (_debug(lambda d: [[[*d["locations"][i]] for i in core[:-1]] for core in d["records"]]),
                       r"debug core 0: expected \d+ \[op, location\] string pairs"),
    # instructions
    "unknown opcode": (_set(0, Op.MATMUL, "op", 99), r"code core 0 instruction \d+: field 'op': unknown opcode 99"),
    "unused field set": (_set(0, Op.BARRIER, "a0", 128), r"code core 0 instruction \d+ \(barrier at .*\): "
                                                         r"field 'a0': must be zero"),
    "unknown format": (_set(0, Op.MATMUL, "f0", 77), r"\(matmul at .*\): field 'f0': unknown format code 77"),
    "format not for PT": (_set(0, Op.MATMUL, "f0", 2), r"field 'f0': format fp32 is not allowed here"),
    "tile past scratchpad": (_set(0, Op.MATMUL, "a0", 1589376 - 128), r"field 'a0': tile .* exceeds the usable "
                                                                      r"scratchpad \(1589376 B\)"),
    "unaligned tile": (_set(1, Op.MATMUL, "a1", 64), r"code core 1 .*field 'a1': scratchpad address 64 is not stick"),
    "dma outside buffer": (_set(0, Op.DMA_LOAD, "dev", 1 << 20), r"field 'dev': .*(outside device memory|not inside "
                                                                 r"one allocated buffer)"),
    "dma row overlap": (_set(0, Op.DMA_LOAD, "a4", 0), r"\(dma_load at .*\): field 'a4': row stride 0 < row bytes"),
    "dma bad row bytes": (_set(0, Op.DMA_LOAD, "k", 100), r"field 'k': row bytes 100 must be a positive multiple"),
    "store into constant": (_set(0, Op.DMA_STORE, "dev", 4096 * 0), r"field 'dev': stores into 'x', a read-only "
                                                                    r"input buffer"),
    "uninitialized read": (_drop(0, Op.DMA_LOAD), r"code core 0 instruction \d+ \(matmul at .*\): reads scratchpad "
                                                  r"bytes .* never written"),
    "missing END": (_set(1, Op.END, "op", int(Op.BARRIER)), r"code core 1 instruction \d+: field 'op': the stream "
                                                            r"must end with exactly one END"),
    "END in the middle": (_set(0, Op.DMA_LOAD, "op", int(Op.END)), r"must end with exactly one END"),
    "bad core mask": (_set(0, Op.BARRIER, "mask", 0b10), r"field 'mask': core mask 0x2 must include core 0"),
    "reduce group vs barrier": (_set(1, Op.BARRIER, "mask", 0b10), r"code core 1 instruction \d+ \(ring_reduce at "
                                                                   r".*\): group 0x3 is not inside the barrier"),
    "reduce mismatch": (_set(1, Op.RING_REDUCE, "a0", 0), r"\(ring_reduce at .*\): ring_reduce fields differ"),
    "reduce root": (_set(1, Op.RING_REDUCE, "core", 5), r"field 'core': root 5 is not in the group"),
    "store dropped": (_drop(0, Op.DMA_STORE), r"program: output 'y' is not fully written"),
    "matmul flags": (_set(0, Op.MATMUL, "flags", 128), r"field 'flags': unknown bits 0x80"),
    "matmul window with trans_b": (_set(0, Op.MATMUL, "flags", 96), r"field 'flags': WINDOW and TRANS_B together"),
    "matmul imm without flag": (_set(0, Op.MATMUL, "imm", 2.0), r"field 'imm': set but flag SCALE is not"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_loader_rejects(prog, name):
    mutate, pattern = CORRUPTIONS[name]
    data = mutate(prog)
    with pytest.raises(BinaryFormatError, match=pattern):
        load_bytes(data, target=T2)


def test_the_first_bad_instruction_is_named_when_records_repeat(prog):
    """The loader decodes each distinct record once: the error still names the first bad instruction of the
    stream, not a later one, nor a bad record that merely sorts first."""
    code = prog.code[0] = np.array(prog.code[0], copy=True)
    loads = [i for i, r in enumerate(code) if r["op"] == Op.DMA_LOAD]
    code[loads[1]]["k"] = 100
    code[loads[0]] = code[loads[1]]                       # the same bad record twice
    code[_find(prog, 0, Op.BARRIER)]["a0"] = 128         # a bad barrier later (its opcode sorts first)
    with pytest.raises(BinaryFormatError, match=rf"code core 0 instruction {loads[0]} \(dma_load at .*\): "
                                                r"field 'k': row bytes 100"):
        load_bytes(program_to_bytes(prog), target=T2)


def test_fingerprint_mismatch(prog):
    data = program_to_bytes(prog)
    other = dataclasses.replace(T2, clock_ghz=2.0)
    with pytest.raises(BinaryFormatError, match=r"header: target fingerprint .* does not match"):
        load_bytes(data, target=other)
    with pytest.raises(BinaryFormatError, match=r"\(2 cores\) does not match .* \(4 cores\)"):
        load_bytes(data, target=T2.with_cores(4))
    assert load_bytes(data).program.num_cores == 2       # default target narrowed to the file's cores


def _sfu_program(mutate=None):
    b = ProgramBuilder(load_target(cores=1))
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T, V = b.alloc(0, 8, 64), b.alloc(0, 8, 1)
    b.load_tile(0, T, x)
    b.reduce(0, "max", V, T)
    b.sfu(0, "select", T, T, V, imm=-1.0)
    b.store_tile(0, T, y)
    prog = b.program()
    if mutate:
        mutate(prog.code[0])
    return program_to_bytes(prog)


@pytest.mark.parametrize("field,value,pattern", [
    ("fn", 99, r"field 'fn': unknown SFU function 99"),
    ("flags", 3, r"field 'flags': SELECT takes its true-value from a tile"),
    ("flags", 7, r"field 'flags': unknown broadcast mode 7"),
    ("imm", np.nan, r"field 'imm': nan is not a valid immediate"),
    ("m", 0, r"field 'a0': tile shape \[0, 64\] out of range"),
])
def test_sfu_field_checks(field, value, pattern):
    def mutate(code):
        code[2][field] = value
    assert load_bytes(_sfu_program(), target=load_target(cores=1))
    with pytest.raises(BinaryFormatError, match=pattern):
        load_bytes(_sfu_program(mutate), target=load_target(cores=1))


def test_ring_send_needs_barrier_with_destination():
    t = load_target(cores=3)
    b = ProgramBuilder(t)
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T = b.alloc(0, 8, 64)
    b.load_tile(0, T, x)
    b.ring_send(0, 2, 0, T)
    b.barrier([0, 1])
    b.store_tile(0, T, y)
    with pytest.raises(BinaryFormatError, match=r"ring_send at .*\): destination core 2 is not in the next barrier"):
        b.load()
    b2 = ProgramBuilder(t)
    x, y = b2.input("x", (8, 64)), b2.output("y", (8, 64))
    T = b2.alloc(0, 8, 64)
    b2.load_tile(0, T, x)
    b2.store_tile(0, T, y)
    b2.ring_send(0, 1, 0, T)
    with pytest.raises(BinaryFormatError, match=r"ring transfer not followed by a barrier"):
        b2.load()


def _multicast(mask: int, core: int = 0, barrier=(0, 1, 2, 3)):
    b = ProgramBuilder(load_target(cores=4))
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T = b.alloc(0, 8, 64)
    b.load_tile(0, T, x)
    b.emit(0, Op.RING_SEND, "model.py:3", core=core, mask=mask, a0=T.addr, a1=T.addr, k=T.nbytes)
    b.barrier(barrier)
    b.store_tile(0, T, y)
    return b


@pytest.mark.parametrize("mask, core, barrier, pattern", [
    (0b1110, 0, (0, 1, 2, 3), None),
    (0b0111, 0, (0, 1, 2, 3), r"field 'mask': destination mask 0x7 must name two or more cores < 4, not core 0"),
    (0b0010, 0, (0, 1, 2, 3), r"field 'mask': destination mask 0x2 must name two or more"),
    (0b10110, 0, (0, 1, 2, 3), r"field 'mask': destination mask 0x16 must name two or more cores < 4"),
    (0b0110, 1, (0, 1, 2, 3), r"field 'core': must be zero when mask names the destinations"),
    (0b1010, 0, (0, 1, 2), r"ring_send at model.py:3\): destination core 3 is not in the next barrier"),
])
def test_ring_multicast_checks(mask, core, barrier, pattern):
    b = _multicast(mask, core, barrier)
    if pattern is None:
        x = np.ones((8, 64), np.float32)
        assert np.array_equal(b.load()(x)[0], x)
        return
    with pytest.raises(BinaryFormatError, match=pattern):
        b.load()


def test_a_barrier_right_after_the_same_barrier_is_one_barrier():
    """Cores that just met meet again only if something happened since (an op that moves nothing, a view,
    asks for a barrier after its producer's): a barrier on other cores, or after an instruction, is kept."""
    b = ProgramBuilder(load_target(cores=3))
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T = b.alloc(0, 8, 64)
    b.load_tile(0, T, x)
    b.barrier([0, 1])
    b.barrier([0, 1])               # nothing in between: dropped
    b.barrier()                     # other cores: kept
    b.barrier([1, 0])
    b.store_tile(0, T, y)
    b.barrier([0, 1])               # after the store on core 0: kept
    masks = [[r["mask"] for r in recs if r["op"] == Op.BARRIER] for recs in b._records]
    assert masks == [[0b11, 0b111, 0b11, 0b11], [0b11, 0b111, 0b11, 0b11], [0b111]]
    x = np.ones((8, 64), np.float32)
    assert np.array_equal(b.load()(x)[0], x)


def test_deadlock_names_the_waiting_core():
    b = ProgramBuilder(T2)
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    T = b.alloc(0, 8, 64)
    b.load_tile(0, T, x)
    b.emit(0, Op.BARRIER, "model.py:7", mask=0b11)       # core 1 never comes
    b.store_tile(0, T, y)
    with pytest.raises(BinaryFormatError, match=r"code core 0 instruction 1 \(barrier at model.py:7\): deadlock: "
                                                r"barrier mask 0x3 can never be met \(core 1 has ended\)"):
        b.load()


def test_unreadable_file(tmp_path):
    with pytest.raises(BinaryFormatError, match="cannot read"):
        load(tmp_path / "missing.spyre")
    (tmp_path / "short.spyre").write_bytes(b"SPYRE")
    with pytest.raises(BinaryFormatError, match="shorter than the 80-byte header"):
        load(tmp_path / "short.spyre")


def test_scratch_buffers_may_alias_each_other_only():
    """Liveness-based reuse: two scratch tensors share device memory; a scratch buffer may not overlap
    anything else."""
    t = load_target(cores=1)
    b = ProgramBuilder(t)
    x, y = b.input("x", (8, 64)), b.output("y", (8, 64))
    s1 = b.scratch("s1", (8, 64))
    s2 = b.scratch("s2", (4, 64), addr=s1.addr)            # reuses s1's memory
    T, U = b.alloc(0, 8, 64), b.alloc(0, 4, 64)
    b.load_tile(0, T, x)
    b.store_tile(0, T, s1)
    b.load_tile(0, T, s1)                                   # s1 is live
    b.sfu(0, "add", U, T.row_slice(0, 4), 1.0)
    b.store_tile(0, U, s2)                                  # s1 is dead: s2 overwrites its first rows
    b.load_tile(0, U, s2)
    b.sfu(0, "mul", T.row_slice(4, 8), T.row_slice(4, 8), 2.0)
    b.store_tile(0, U, y, row0=0)
    b.store_tile(0, T.row_slice(4, 8), y, row0=4)
    xv = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 64
    (out,) = b.load()(xv)
    from spyre_mlir.runtime.formats import dlf16_round
    xr = dlf16_round(xv)
    assert np.array_equal(out[:4], dlf16_round(xr[:4] + 1)) and np.array_equal(out[4:], dlf16_round(xr[4:] * 2))

    prog = b.program()
    meta_fix = lambda m: m["buffers"][2].update(addr=m["buffers"][0]["addr"])   # noqa: E731  s1 onto x
    with pytest.raises(BinaryFormatError, match=r"scratch 's1' overlaps 'x'"):
        load_bytes(_with_meta(program_to_bytes(prog), meta_fix), target=t)


def _restick_program(mutate=None, shape=(2, 8, 64)):
    """x -> RESTICK -> scratch s -> RESTICK back into y (so the second one reads what the first wrote)."""
    b = ProgramBuilder(T2)
    x = b.input("x", shape, "dlf16")
    s = b.scratch("s", shape[:-2] + (shape[-1], shape[-2]), "dlf16")
    y = b.output("y", shape, "dlf16")
    b.restick(0, x, s)
    b.barrier()
    b.restick(1, s, y)
    prog = b.program()
    if mutate:
        mutate(prog, x, s, y)
    return _reseal(prog)


def _rs(core, field, value):
    def mutate(prog, x, s, y):
        prog.code[core][_find(prog, core, Op.RESTICK)][field] = value(x, s, y) if callable(value) else value
    return mutate


@pytest.mark.parametrize("mutate,pattern", [
    (_rs(0, "f0", 99), r"restick.*field 'f0': unknown format code 99"),
    (_rs(0, "f0", 9), r"restick.*field 'f0': format int64 is not allowed here"),
    (_rs(0, "m", 0), r"restick.*field 'm': batch must be >= 1"),
    (_rs(0, "n", 0), r"restick.*field 'n': 0 out of range"),
    (_rs(0, "k", 1 << 21), r"restick.*field 'k': 2097152 out of range"),
    (_rs(0, "fn", 1), r"restick.*field 'fn': must be zero for restick"),
    (_rs(0, "a2", 128), r"restick.*field 'a2': must be zero for restick"),
    (_rs(0, "dev", lambda x, s, y: x.addr + 64), r"restick.*field 'dev': device address \d+ is not stick"),
    (_rs(0, "m", 3), r"restick.*field 'dev': device range \[\d+, \d+\) is not inside one allocated buffer"),
    (_rs(0, "a0", lambda x, s, y: s.addr + 2048), r"restick.*field 'a0': device range .* not inside one"),
    (_rs(0, "a1", 1), r"restick.*field 'a0': device range .* outside device memory"),
    (_rs(1, "a0", lambda x, s, y: s.addr), r"restick.*field 'a0': .*overlaps the source"),
    (_rs(1, "a0", lambda x, s, y: x.addr), r"restick.*field 'a0': writes into 'x', a read-only input buffer"),
])
def test_restick_field_checks(mutate, pattern):
    assert load_bytes(_restick_program(), target=T2)
    with pytest.raises(BinaryFormatError, match=pattern):
        load_bytes(_restick_program(mutate), target=T2)


def _gather_program(mutate=None):
    """ids (input) -> scratchpad -> GATHER rows of a constant table -> y; a scratch buffer s to point at."""
    b = ProgramBuilder(T2)
    table = b.constant("table", np.arange(20 * 64, dtype=np.float32).reshape(20, 64), "dlf16")
    ids, y = b.input("ids", (1, 8), "int64"), b.output("y", (8, 64), "dlf16")
    s = b.scratch("s", (20, 64), "dlf16")
    idx, rows = b.alloc(0, 1, 8, "int64"), b.alloc(0, 8, 64, "dlf16")
    b.load_tile(0, idx, ids)
    b.gather(0, rows, table, idx.addr, "int64")
    b.store_tile(0, rows, y)
    prog = b.program()
    if mutate:
        mutate(prog, table, s, idx)
    return _reseal(prog)


def _ga(field, value):
    def mutate(prog, table, s, idx):
        prog.code[0][_find(prog, 0, Op.GATHER)][field] = value(table, s, idx) if callable(value) else value
    return mutate


@pytest.mark.parametrize("mutate,pattern", [
    (_ga("f0", 2), r"gather.*field 'f0': index format code 2 is not int32 or int64"),
    (_ga("m", 0), r"gather.*field 'm': count must be >= 1"),
    (_ga("k", 100), r"gather.*field 'k': row bytes 100 must be a positive multiple of 128"),
    (_ga("a2", 64), r"gather.*field 'a2': 64 is not a multiple of the 128-byte stick"),
    (_ga("a1", lambda t, s, i: i.addr + 4), r"gather.*field 'a1': indices at \d+ are not 8-byte aligned"),
    (_ga("a0", 1 << 30), r"gather.*field 'a0': scratchpad range ends at \d+, past the usable scratchpad"),
    (_ga("n", 21), r"gather.*field 'dev': table range \[\d+, \d+\) is not inside one allocated buffer"),
    (_ga("dev", lambda t, s, i: s.addr), r"gather.*field 'dev': gathers from 's', a scratch buffer"),
    (_ga("a3", 128), r"gather.*field 'a3': must be zero for gather"),
])
def test_gather_field_checks(mutate, pattern):
    """GATHER's fields are checked at load; which table rows it reads is checked when it runs."""
    assert load_bytes(_gather_program(), target=T2)
    with pytest.raises(BinaryFormatError, match=pattern):
        load_bytes(_gather_program(mutate), target=T2)


def test_restick_source_must_be_written_and_destination_counts_as_written():
    b = ProgramBuilder(T2)
    x = b.input("x", (8, 64), "fp32")
    s = b.scratch("s", (8, 64), "fp32")
    t = b.scratch("t", (64, 8), "fp32")
    y = b.output("y", (8, 64), "fp32")
    b.restick(0, s, t)                                        # s was never written
    b.restick(0, t, y)
    with pytest.raises(BinaryFormatError, match=r"core 0 instruction 0 \(restick at .*\): reads device bytes"):
        b.load()
    b = ProgramBuilder(T2)
    x, t, y = b.input("x", (8, 64), "fp32"), b.scratch("t", (64, 8), "fp32"), b.output("y", (8, 64), "fp32")
    b.restick(0, x, t)
    b.restick(0, t, y)                                        # y fully written by the restick
    xv = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) - 100.5
    assert np.array_equal(b.load()(xv)[0], xv)


def test_debug_info_may_grow_with_the_code(monkeypatch):
    """A big program's debug section (a source location per record) is bounded by its code, not by the fixed
    JSON limit: the compiler must never write a file its own loader refuses."""
    from spyre_mlir.runtime import binary

    b = ProgramBuilder(load_target(cores=1))
    x, y = b.input("x", (1, 64)), b.output("y", (1, 64))
    t = b.alloc(0, 1, 64)
    for _ in range(20):
        b.load_tile(0, t, x, loc="a/rather/long/source/location.py:123 in some_function_name")
    b.store_tile(0, t, y)
    data = b.to_bytes()
    monkeypatch.setattr(binary, "MAX_JSON_BYTES", 512)
    assert len(json.dumps(b.program().debug)) > 512
    load_bytes(data, target=load_target(cores=1))


def _handoff(barrier_between: bool, core_writes_twice: bool = False):
    """Core 0 stores a scratch tensor, core 1 loads it (with or without a barrier between) and stores y."""
    b = ProgramBuilder(T2)
    x, s, y = b.input("x", (8, 64)), b.scratch("s", (8, 64)), b.output("y", (8, 64))
    T0, T1 = b.alloc(0, 8, 64), b.alloc(1, 8, 64)
    b.load_tile(0, T0, x)
    b.store_tile(0, T0, s)
    if barrier_between:
        b.barrier()
    if core_writes_twice:
        b.load_tile(1, T1, x)
        b.store_tile(1, T1, s)
    else:
        b.load_tile(1, T1, s)
    b.barrier()
    b.load_tile(0, T0, s)
    b.store_tile(0, T0, y)
    return b


def test_cross_core_access_needs_a_barrier():
    """A read of bytes another core writes, or two cores writing the same bytes, with no barrier between them:
    the result would depend on how the cores interleave, so the loader refuses it."""
    assert _handoff(barrier_between=True).load()
    with pytest.raises(BinaryFormatError, match=r"code core 1 instruction 0 \(dma_load.*\): reads device bytes "
                                                r"\[\d+, \d+\) that core 0 writes \(instruction 1\) with no barrier"):
        _handoff(barrier_between=False).load()
    with pytest.raises(BinaryFormatError, match=r"code core 1 instruction 1 \(dma_store.*\): writes device bytes "
                                                r"\[\d+, \d+\) that core 0 writes \(instruction 1\) with no barrier"):
        _handoff(barrier_between=False, core_writes_twice=True).load()


def _overwrite(barrier_between: bool):
    """Core 0 reads a scratch tensor that core 1 then writes again, with or without a barrier between (core 0
    runs first in the loader's schedule: the read comes before the write there)."""
    b = ProgramBuilder(T2)
    x, s, y = b.input("x", (8, 64)), b.scratch("s", (8, 64)), b.output("y", (8, 64))
    T0, T1 = b.alloc(0, 8, 64), b.alloc(1, 8, 64)
    b.load_tile(1, T1, x)
    b.store_tile(1, T1, s)
    b.barrier()
    b.load_tile(0, T0, s)
    if barrier_between:
        b.barrier()
    b.store_tile(1, T1, s)
    b.barrier()
    b.store_tile(0, T0, y)
    return b


def test_a_read_needs_a_barrier_before_another_core_writes_the_bytes():
    """The other way round: which bytes core 0 reads would depend on whether core 1 has overwritten them yet."""
    assert _overwrite(barrier_between=True).load()
    with pytest.raises(BinaryFormatError, match=r"code core 0 instruction \d+ \(dma_load.*\): reads device bytes "
                                                r"\[\d+, \d+\) that core 1 later writes \(instruction \d+\) with no "
                                                r"barrier"):
        _overwrite(barrier_between=False).load()


def test_the_same_bytes_are_validated_once_per_process(prog, monkeypatch):
    """A second load of the same image (a compile-cache hit) or of the same code with other constants reuses the
    decoded, scheduled program: each Executable still has memories and constants of its own and computes what a
    fully validated load computes; other code is validated in full."""
    from collections import OrderedDict

    from spyre_mlir.runtime import loader

    checks = []
    real = loader._check
    monkeypatch.setattr(loader, "_check", lambda *a: checks.append(1) or real(*a))
    monkeypatch.setattr(loader, "_VALIDATED", OrderedDict())
    data = program_to_bytes(prog)
    a, b = load_bytes(data, T2), load_bytes(data, T2)
    assert len(checks) == 1 and a.steps is b.steps and a.device is not b.device
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    (ya,), (yb,) = a(x), b(x)
    assert np.array_equal(ya, yb) and np.array_equal(ya, a(x)[0])
    # Other weights, the same code: validated once, each Executable computing with its own constants.
    other = dataclasses.replace(prog, constants={k: bytes(np.frombuffer(v, np.uint8)[::-1]) for k, v in
                                                 prog.constants.items()})
    c = load_bytes(program_to_bytes(other), T2)
    (yc,) = c(x)
    assert len(checks) == 1 and c.steps is a.steps and not np.array_equal(yc, ya)
    loader.clear_cache()                  # forgotten (a benchmark's cold load): validated again
    d = load_bytes(data, T2)
    assert d.steps is not a.steps and len(checks) == 2
    # Where each load's time went: the reuses neither decoded nor scheduled.
    assert set(a.load_seconds) == set(d.load_seconds) == {"decode", "schedule", "segments", "plan"}
    assert a.load_seconds["decode"] > 0 and d.load_seconds["schedule"] > 0
    assert b.load_seconds["decode"] == b.load_seconds["schedule"] == c.load_seconds["decode"] == 0
    with pytest.raises(BinaryFormatError, match="unknown format code 77"):
        load_bytes(_set(0, Op.MATMUL, "f0", 77)(prog), T2)
    assert len(checks) == 3
    monkeypatch.setattr(loader, "_VALIDATED", OrderedDict())
    monkeypatch.setattr(loader, "VALIDATED_KEEP", 0)          # too big to keep: validated at every load
    load_bytes(data, T2)
    load_bytes(data, T2)
    assert len(checks) == 5
    assert np.array_equal(load_bytes(program_to_bytes(other), T2)(x)[0], yc)      # validated in full: the same


_EVENTS = st.lists(st.one_of(st.tuples(st.sampled_from(["load", "store"]), st.integers(0, 2), st.integers(0, 3)),
                             st.tuples(st.just("barrier"), st.sampled_from([(0, 1), (1, 2), (0, 2), (0, 1, 2)]),
                                       st.just(0))), max_size=12)


def _traffic(events) -> ProgramBuilder:
    """Three cores moving 8-row blocks of a scratch tensor in and out of their tiles, with barriers of two or
    all three of them between."""
    b = ProgramBuilder(T3)
    x, s, y = b.input("x", (8, 64)), b.scratch("s", (32, 64)), b.output("y", (8, 64))
    tiles = [b.alloc(c, 8, 64) for c in range(3)]
    for c in range(3):
        b.load_tile(c, tiles[c], x)
    for what, c, block in events:
        if what == "barrier":
            b.barrier(c)
        else:
            (b.load_tile if what == "load" else b.store_tile)(c, tiles[c], s, row0=8 * block)
    b.barrier()
    b.store_tile(0, tiles[0], y)
    return b


def _both_proofs(b: ProgramBuilder):
    """The schedule proven a round at a time and one instruction at a time: (steps or the exception) of each."""
    from spyre_mlir.runtime import loader, schedule

    prog = program_from_bytes(b.to_bytes())
    streams = loader._decode_streams(loader._Decoder(prog, b.target), prog.code)
    args = (prog, streams, -(-b.target.scratchpad_usable_bytes // 128), prog.device_bytes // 128)
    out = []
    for by_round in (True, False):
        try:
            out.append(schedule._schedule(*args, by_round=by_round))
        except (schedule._Unproven, BinaryFormatError) as e:
            out.append(e)
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_EVENTS)
def test_a_round_at_a_time_proves_what_one_by_one_proves(events):
    """The schedule's device-memory proofs at once per round never accept what the proofs one instruction at a
    time refuse (a read of unwritten bytes, a race between cores); what those accept, they accept alike."""
    by_round, one_by_one = _both_proofs(_traffic(events))
    if isinstance(one_by_one, Exception):
        assert isinstance(by_round, Exception)
    else:
        assert not isinstance(by_round, Exception), by_round
        assert len(by_round) == len(one_by_one)
        assert all(a is b or a.members == b.members for a, b in zip(by_round, one_by_one))


def test_one_core_proves_initialization_only():
    """With one core nothing can race: its round proves only that each device read's bytes were written before
    (a store then a load of the same scratch rows passes; a load of rows never stored is refused), the same as
    one instruction at a time."""
    def program(store_first: bool) -> ProgramBuilder:
        b = ProgramBuilder(load_target(cores=1))
        x, s, y = b.input("x", (8, 64)), b.scratch("s", (16, 64)), b.output("y", (8, 64))
        t = b.alloc(0, 8, 64)
        b.load_tile(0, t, x)
        if store_first:
            b.store_tile(0, t, s, row0=8)
        b.load_tile(0, t, s, row0=8)
        b.store_tile(0, t, y)
        return b

    ok = _both_proofs(program(True))
    assert all(isinstance(x, list) for x in ok) and len(ok[0]) == len(ok[1])
    by_round, one_by_one = _both_proofs(program(False))
    assert isinstance(by_round, Exception)
    assert isinstance(one_by_one, BinaryFormatError) and "never written" in str(one_by_one)


def test_a_round_with_a_race_or_an_unwritten_read_is_proven_one_by_one():
    """Both faults a round's proof finds are then named by the proof one instruction at a time; a handoff with a
    barrier between passes a round at a time."""
    ok, _ = _both_proofs(_traffic([("store", 0, 1), ("barrier", (0, 1), 0), ("load", 1, 1)]))
    assert isinstance(ok, list)
    for events in ([("store", 0, 1), ("load", 1, 1)], [("load", 2, 3)],
                   [("store", 0, 1), ("barrier", (0, 1), 0), ("load", 2, 1)],
                   # core 0's read, then core 2's write a round later: only the proof run backwards sees it
                   [("store", 1, 1), ("barrier", (0, 1, 2), 0), ("load", 0, 1), ("barrier", (1, 2), 0),
                    ("barrier", (0, 1), 0), ("store", 2, 1)]):
        by_round, one_by_one = _both_proofs(_traffic(events))
        assert isinstance(by_round, Exception) and isinstance(one_by_one, BinaryFormatError)
