"""Loop records (format 1.10, runtime/loops.py): streams stored with loops read back as the instructions that run,
malformed loops are load errors naming the record, and compiled kernels are stored rolled."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spyre_mlir.runtime import BinaryFormatError, load_bytes
from spyre_mlir.runtime.assembler import listing
from spyre_mlir.runtime.binary import Section, program_from_bytes, program_to_bytes, read_container, write_container
from spyre_mlir.runtime.isa import INSTR_DTYPE, Op
from spyre_mlir.runtime.kernels import build_matmul
from spyre_mlir.runtime.loops import STEPPED, LoopError, roll, roll_streams, unroll
from spyre_mlir.target import load_target

FIELDS = ("m", "n", "k", "a0", "a1", "a2", "a3", "a4", "a5", "dev")


def _rec(op, **fields) -> np.ndarray:
    r = np.zeros(1, dtype=INSTR_DTYPE)
    r["op"] = op
    for f, v in fields.items():
        r[f] = v
    return r


def _loop(trips: int, body: list, steps: list[dict]) -> list:
    """A stored loop: its LOOP record, body records and one STEP per body record (``steps``: field -> step)."""
    return [_rec(Op.LOOP, m=trips, n=len(body)), *body, *(_rec(Op.STEP, **s) for s in steps)]


def _trips(body: list, trips: int, step) -> list:
    """``trips`` trips of ``body``, its fields STEPPED moved by ``step`` (one per field) each trip."""
    out = []
    for t in range(trips):
        for r in body:
            r = r.copy()
            for f, s in zip(STEPPED, step):
                r[f] = (int(r[f][0]) + t * s) % (1 << (64 if f == "dev" else 32))
            out.append(r)
    return out


record = st.builds(lambda op, vals: _rec(op, **dict(zip(FIELDS, vals))),
                   st.sampled_from([Op.SFU, Op.DMA_LOAD, Op.MATMUL, Op.BARRIER]),
                   st.lists(st.sampled_from([0, 1, 128, 4096, 2**31, 2**32 - 128]), min_size=10, max_size=10))
segment = st.tuples(st.lists(record, min_size=1, max_size=5), st.integers(1, 9),
                    st.lists(st.sampled_from([0, 128, 2**32 - 256, 8192]), min_size=7, max_size=7))


@settings(max_examples=150, deadline=None)
@given(st.lists(segment, min_size=1, max_size=6), st.booleans())
def test_a_rolled_stream_unrolls_to_what_runs(segments, with_keys):
    """Bodies repeated with steps that may wrap (negative), and records that repeat without a loop: stored with
    loops, read back record for record, each from the stored record that holds it, with its source location."""
    code = np.concatenate([r for body, trips, step in segments for r in _trips(body, trips, step)] + [_rec(Op.END)])
    keys = np.arange(len(code)) % 3 if with_keys else None
    stored, origin = roll(code, keys)
    assert len(stored) <= len(code)
    run, orig = unroll(stored)
    assert run.tobytes() == code.tobytes()
    # Each instruction comes from a stored record of its own opcode, storing it or an earlier trip of it.
    assert (stored["op"][orig] == code["op"]).all()
    assert (0 <= origin[orig]).all() and (origin[orig] <= np.arange(len(code))).all()
    if keys is not None:
        assert (keys[origin[orig]] == keys).all()


def _wrong_trips(stored, origin):
    stored = stored.copy()
    stored["m"][np.flatnonzero(stored["op"] == Op.LOOP)[0]] += 1
    return stored, origin


def _wrong_step(stored, origin):
    stored = stored.copy()
    stored["a1"][np.flatnonzero(stored["op"] == Op.STEP)[0]] += 128
    return stored, origin


def _wrong_field(stored, origin):
    stored = stored.copy()
    stored["k"][np.flatnonzero(stored["op"] == Op.LOOP)[0] + 1] += 1      # a field a loop repeats as stored
    return stored, origin


def _reordered(stored, origin):
    return stored[::-1].copy(), origin[::-1].copy()


@pytest.mark.parametrize("wrong", [_wrong_trips, _wrong_step, _wrong_field, _reordered, "keys"])
def test_a_roll_that_stores_another_program_is_not_kept(monkeypatch, wrong):
    """The loops are found by hashes: a stored stream that would read back as other instructions (a collision, or
    a bug) is caught record by record (loops._stores), and the stream is stored as it came."""
    from spyre_mlir.runtime import loops

    code = np.concatenate(_trips([_rec(Op.SFU, a0=0, a1=4096), _rec(Op.MATMUL, a0=256, k=3)], 6, [0, 128, 0, 0, 0,
                                                                                                   0, 0])
                          + [_rec(Op.END)])
    keys = np.zeros(len(code), dtype=np.int64)
    assert len(roll(code, keys)[0]) < len(code)
    real = loops._roll
    if wrong == "keys":
        keys[5] = 1                  # one trip's source location differs, and the roll does not see it
        monkeypatch.setattr(loops, "_roll", lambda c, k: real(c, None))
    else:
        monkeypatch.setattr(loops, "_roll", lambda c, k: wrong(*real(c, k)))
    stored, origin = roll(code, keys)
    assert stored.tobytes() == code.tobytes() and (origin == np.arange(len(code))).all()


def test_a_repeated_step_is_stored_once():
    """A body of 2 run 100 times with a double-buffered address is 5 records: LOOP, body, STEPs."""
    code = np.concatenate([_rec(Op.SFU, m=8, n=8, a0=4096 * (t % 2), a1=128 * t) for t in range(100)]
                          + [_rec(Op.END)])
    stored, _ = roll(code)
    assert [Op(o).name for o in stored["op"]] == ["LOOP", "SFU", "SFU", "STEP", "STEP", "END"]
    assert (stored[0]["m"], stored[0]["n"]) == (50, 2)
    assert (stored["a1"][3], stored["a0"][3]) == (256, 0)


def test_nested_loops_unroll_inner_first():
    """A loop of a loop: the outer step moves every trip of the inner loop."""
    inner = _loop(3, [_rec(Op.SFU, a0=0, a1=1000)], [{"a0": 128}])
    stored = np.concatenate(_loop(2, inner, [{}, {"a1": 10}, {}]) + [_rec(Op.END)])
    run, orig = unroll(stored)
    assert run["a0"].tolist() == [0, 128, 256, 0, 128, 256, 0]
    assert run["a1"].tolist() == [1000] * 3 + [1010] * 3 + [0]
    assert orig.tolist() == [2] * 6 + [7]


def test_streams_roll_apart():
    """Two cores with the same instructions: each stream's loops stay in it."""
    code = np.concatenate([_rec(Op.SFU, a1=128 * t) for t in range(10)] + [_rec(Op.END)])
    (s0, o0), (s1, o1) = roll_streams([code, code.copy()])
    for s, o in ((s0, o0), (s1, o1)):
        run, orig = unroll(s)
        assert run.tobytes() == code.tobytes() and (o[orig] == [0] * 10 + [10]).all()
        assert len(s) == 4


BAD = {
    "one trip": (lambda: _loop(1, [_rec(Op.SFU)], [{}]), 0, r"trip count 1 out of range"),
    "past the end": (lambda: [_rec(Op.LOOP, m=2, n=3), _rec(Op.SFU), _rec(Op.STEP)], 0, r"run past the end"),
    "stray step": (lambda: [_rec(Op.SFU), _rec(Op.STEP)], 1, r"STEP record outside"),
    "not a step": (lambda: [_rec(Op.LOOP, m=2, n=1), _rec(Op.SFU), _rec(Op.SFU)], 2, r"expected the STEP record"),
    "steps a size": (lambda: _loop(2, [_rec(Op.SFU)], [{"m": 1}]), 2, r"advances only dev, a0"),
    "loop field": (lambda: [_rec(Op.LOOP, m=2, n=1, k=1), _rec(Op.SFU), _rec(Op.STEP)], 0, r"field 'k'"),
    "moved loop": (lambda: _loop(2, _loop(2, [_rec(Op.SFU)], [{}]), [{"a0": 128}, {}, {}]), 4,
                   r"STEP of a LOOP or STEP record must be zero"),
}


@pytest.mark.parametrize("case", BAD)
def test_malformed_loops_are_named(case):
    build, where, msg = BAD[case]
    with pytest.raises(LoopError, match=msg) as e:
        unroll(np.concatenate(build() + [_rec(Op.END)]))
    assert e.value.record == where


def test_unrolled_size_is_bounded():
    """A few bytes of trip counts cannot make the loader allocate without limit."""
    stored = np.concatenate(_loop(1 << 20, _loop(1 << 20, [_rec(Op.SFU)], [{}]), [{}, {}, {}]) + [_rec(Op.END)])
    with pytest.raises(LoopError, match=r"unrolls to more than 1000 instructions"):
        unroll(stored, limit=1000)


def _matmul_program():
    """One core walking a [64, 2048] x [2048, 256] matmul in 2 x 32 K steps: a stream with loops."""
    w = np.random.default_rng(0).standard_normal((2048, 256)).astype(np.float32)
    return build_matmul(load_target(cores=1), 64, 256, 2048, grid=(1, 1), tile_m=64, tile_n=128,
                        tile_k=64, weights=w).program()


def test_a_compiled_kernel_is_stored_rolled_and_runs_the_same():
    prog = _matmul_program()
    data = program_to_bytes(prog)
    stored = [len(p) // INSTR_DTYPE.itemsize for k, i, p in read_container(data)[2] if k == Section.CODE]
    assert stored[0] < len(prog.code[0]) / 2
    back = program_from_bytes(data)
    assert back.code[0].tobytes() == prog.code[0].tobytes()
    assert back.debug == [list(map(tuple, d)) for d in prog.debug]
    x = np.random.default_rng(1).standard_normal((64, 2048)).astype(np.float32)
    assert np.array_equal(load_bytes(data)(x)[0], load_bytes(program_to_bytes(back))(x)[0])


@pytest.mark.parametrize("step, message", [
    (1 << 40, "field 'dev': address .* is outside device memory"),
    (64, "field 'dev': .* is not a multiple of the 128-byte stick"),
    (None, r"field 'dev': device range \[.*\) is not inside one allocated buffer"),
])
def test_a_bad_instruction_in_a_loop_names_its_record(step, message):
    """An instruction unrolled from a loop body is checked in every trip (a DMA's later trips, decoded from its
    first, by the checks of the address that moves); the error names the stored record and the field."""
    prog = _matmul_program()
    data = bytearray(program_to_bytes(prog))
    ncores, fp, secs = read_container(data)
    secs = [[k, i, np.frombuffer(p, dtype=INSTR_DTYPE).copy() if k == Section.CODE else bytes(p)] for k, i, p in secs]
    code = next(p for k, _, p in secs if k == Section.CODE)
    head = int(np.flatnonzero(code["op"] == Op.LOOP)[0])
    body = head + 1 + int(np.flatnonzero(code["op"][head + 1:] == Op.DMA_LOAD)[0])
    step_at = head + 1 + int(code["n"][head]) + (body - head - 1)
    if step is None:        # the second trip starts a stick before the end of the buffer the first reads
        buf = next(b for b in prog.buffers if b.addr <= int(code["dev"][body]) < b.addr + b.nbytes)
        step = buf.addr + buf.nbytes - 128 - int(code["dev"][body])
    code["dev"][step_at] = step
    secs = [[k, i, p.tobytes() if k == Section.CODE else p] for k, i, p in secs]
    with pytest.raises(BinaryFormatError, match=re.escape(f", record {body} (dma_load") + ".*" + message):
        load_bytes(write_container(ncores, fp, secs))


def test_the_listing_shows_loops_as_stored():
    """``spyre-run --disassemble``: records as the file stores them, loop bodies and steps indented, each record
    numbered as load errors name it."""
    prog = _matmul_program()
    data = program_to_bytes(prog)
    stored = np.frombuffer(next(p for k, _, p in read_container(data)[2] if k == Section.CODE), dtype=INSTR_DTYPE)
    lines = listing(program_from_bytes(data)).splitlines()
    assert f"core 0: {len(prog.code[0])} instructions stored in {len(stored)} records" in lines
    head = int(np.flatnonzero(stored["op"] == Op.LOOP)[0])
    at = lines.index(next(line for line in lines if line.startswith(f"  0:{head:<5d} loop")))
    assert lines[at].split()[2:] == [f"m={stored['m'][head]}", f"n={stored['n'][head]}"]
    assert lines[at + 1].startswith(f"  0:{head + 1:<5d}   ")          # the body, indented
    assert lines[-1].split() == [f"0:{len(stored) - 1}", "end"]


def test_a_malformed_loop_in_a_file_is_a_format_error():
    data = program_to_bytes(_matmul_program())
    ncores, fp, secs = read_container(data)
    secs = [[k, i, bytes(p)] for k, i, p in secs]
    sec = next(s for s in secs if s[0] == Section.CODE)
    code = np.frombuffer(sec[2], dtype=INSTR_DTYPE).copy()
    head = int(np.flatnonzero(code["op"] == Op.LOOP)[0])
    code["m"][head] = 1
    sec[2] = code.tobytes()
    with pytest.raises(BinaryFormatError, match=re.escape(f"code core 0 record {head} (loop m=1 n={code['n'][head]})"
                                                          f": trip count 1 out of range 2..")):
        load_bytes(write_container(ncores, fp, secs))


def test_loops_of_loops_are_found():
    """Tiles of 300 K steps (a body longer than roll looks for at once): the K loop, then around it the loop over
    the tiles (an output store after each)."""
    code = []
    for tile in range(4):
        code += [_rec(Op.MATMUL, m=8, n=8, k=64, a0=128 * k, a1=8192 + 65536 * tile + 128 * k) for k in range(300)]
        code.append(_rec(Op.DMA_STORE, dev=1 << 20 | 1024 * tile, a0=65536, m=1, n=1, k=128))
    code = np.concatenate(code + [_rec(Op.END)])
    stored, _ = roll(code)
    # LOOP(tiles) [LOOP(K) matmul STEP] store, the 4 STEPs of the tile loop, END
    assert [Op(o).name for o in stored["op"]] == ["LOOP", "LOOP", "MATMUL", "STEP", "DMA_STORE"] + ["STEP"] * 4 + [
        "END"]
    assert (stored["m"][:2] == [4, 300]).all() and (stored["a1"][6], stored["dev"][8]) == (65536, 1024)
    assert unroll(stored)[0].tobytes() == code.tobytes()


@settings(max_examples=100, deadline=None)
@given(st.lists(segment, min_size=1, max_size=6), st.data())
def test_loops_a_stream_holds_already_are_kept(segments, data):
    """A kernel stores some of its loops itself (ProgramBuilder.roll_tail): rolling the stream finds the others
    around them, and what it stores runs what the stream ran."""
    parts = []
    for body, trips, step in segments:
        steps = [dict(zip(STEPPED, step))] * len(body)
        parts += _loop(trips, body, steps) if trips >= 2 and data.draw(st.booleans()) else _trips(body, trips, step)
    code = np.concatenate(parts + [_rec(Op.END)])
    stored, origin = roll(code)
    assert len(stored) <= len(code)
    assert unroll(stored)[0].tobytes() == unroll(code)[0].tobytes()


def _builder_trips(b, trips: int, step: int = 4096, bad: int | None = None):
    """Emit ``trips`` trips of a load / add / barrier body on cores 0 and 1, the load's device address moving by
    ``step`` (trip ``bad`` by one stick more, when given)."""
    a = b.alloc(0, 8, 64), b.alloc(0, 8, 64)
    for t in range(trips):
        for c in (0, 1):
            dev = 128 * c + t * step + (128 if t == bad else 0)
            b.dma_load(c, dev, a[0].addr, (8, 128), (0, 0), (0, 128), loc="k.py:1")
            b.sfu(c, "add", a[1], a[0], a[0], loc="k.py:2")
        b.barrier([0, 1], loc="k.py:3")


def test_a_kernel_stores_trips_of_one_body_as_a_loop():
    from spyre_mlir.runtime.assembler import ProgramBuilder
    target = load_target(cores=2)
    full = ProgramBuilder(target)
    _builder_trips(full, 7)
    b = ProgramBuilder(target)
    starts = {c: b.stream_length(c) for c in (0, 1)}
    _builder_trips(b, 3)
    assert b.roll_tail((0, 1), starts, 3, 7)
    assert b.stream_length(0) == starts[0] + 1 and b.opcodes(0, starts[0]) == [Op.BARRIER]
    b.barrier([0, 1])                   # the loop's last trip ends at this very barrier: none is added
    prog, want = b.program(), full.program()
    for c in (0, 1):
        assert (prog.code[c]["op"] == Op.LOOP).sum() == 1
        assert unroll(prog.code[c])[0].tobytes() == want.code[c].tobytes()
    back = program_from_bytes(program_to_bytes(prog))
    assert [c.tobytes() for c in back.code] == [c.tobytes() for c in want.code]
    assert back.debug == [list(map(tuple, d)) for d in want.debug]


@pytest.mark.parametrize("case", ["steps differ", "two bodies", "inserting", "fields differ"])
def test_trips_that_are_not_one_body_stay_as_emitted(case):
    from spyre_mlir.runtime.assembler import ProgramBuilder
    b = ProgramBuilder(load_target(cores=2))
    starts = {c: b.stream_length(c) for c in (0, 1)}
    _builder_trips(b, 3, bad=2 if case == "steps differ" else None)
    if case == "fields differ":
        b.dma_load(0, 0, 0, (8, 256), (0, 0), (0, 256), loc="k.py:1")
    before = [b.opcodes(c) for c in (0, 1)]
    if case == "inserting":
        with b.inserting({0: 0, 1: 0}):
            assert not b.roll_tail((0, 1), starts, 3, 7)
    else:
        assert not b.roll_tail((0, 1), starts, 2 if case == "two bodies" else 3, 7)
    assert [b.opcodes(c) for c in (0, 1)] == before


def _compile_code(model, x, tmp_path, name, **kw):
    import spyre_mlir
    path = tmp_path / f"{name}.spyre"
    spyre_mlir.compile_to_file(model, (x,), output=str(path), cache_dir=False, **kw)
    return program_from_bytes(path.read_bytes())


def _model(kind: str, k: int, n: int):
    """A Linear (``relu``: then a ReLU), or (``gated``) silu(x W1) * (x W2): matmuls that share A (siblings)."""
    import torch

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.g, self.u = torch.nn.Linear(k, n, bias=False), torch.nn.Linear(k, n, bias=False)

        def forward(self, x):
            return torch.nn.functional.silu(self.g(x)) * self.u(x)

    torch.manual_seed(0)
    if kind == "gated":
        return Gated().eval()
    return torch.nn.Sequential(torch.nn.Linear(k, n), *([torch.nn.ReLU()] if kind == "relu" else [])).eval()


# Each has loops: K loops of cores sharing operands over the ring (8 cores; 4 cores with two output tiles each, the
# first tile stored while the second's K loop runs), loops over rows of output tiles of 4 K steps (8 cores) and
# over output tiles of 2 K steps (32 cores), K loops of one core alone and of a K split over 32 cores (16 cores,
# each its own loop), siblings, and every precision.
@pytest.mark.parametrize("kind, m, k, n, cores, precision", [
    ("linear", 512, 4096, 512, 8, "dlf16"),
    ("linear", 1024, 4096, 512, 4, "dlf16"),
    ("linear", 4096, 1024, 1024, 8, "dlf16"),
    ("linear", 2048, 512, 2048, 32, "fp8"),
    ("linear", 512, 4096, 512, 8, "fp8"),
    ("relu", 512, 4096, 512, 8, "int8-weights"),
    ("linear", 512, 4096, 512, 8, "fp32-reference"),
    ("gated", 512, 4096, 512, 8, "dlf16"),
    ("linear", 64, 8192, 256, 1, "dlf16"),
    ("linear", 64, 65536, 128, 32, "dlf16"),
])
def test_kernels_emit_k_loops_as_loops_that_run_what_every_trip_emitted_would(tmp_path, monkeypatch, kind, m, k, n,
                                                                             cores, precision):
    """spyre-emit's matmul kernels emit a run of K steps, or of output tiles, as a loop (three trips, then the trip
    count): the program it runs is the one of the kernel emitting every trip, record for record with the same source
    locations (and so the same file once that is read back and written again)."""
    import torch
    from spyre_mlir.codegen.kernels import matmul as mk
    from spyre_mlir.runtime import assembler

    model, x = _model(kind, k, n), torch.randn(m, k)
    rolled = []
    roll_tail = assembler.ProgramBuilder.roll_tail
    monkeypatch.setattr(assembler.ProgramBuilder, "roll_tail", lambda *a: rolled.append(roll_tail(*a)) or rolled[-1])
    looped = _compile_code(model, x, tmp_path, "looped", precision=precision, cores=cores)
    assert rolled and all(rolled)
    monkeypatch.setattr(mk, "rolled_loops", False)
    rolled.clear()
    every = _compile_code(model, x, tmp_path, "every", precision=precision, cores=cores)
    assert not rolled
    assert [c.tobytes() for c in looped.code] == [c.tobytes() for c in every.code]
    assert looped.debug == every.debug
    assert program_to_bytes(looped) == program_to_bytes(every)
