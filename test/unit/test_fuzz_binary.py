"""Seeded fuzzing of the loader: thousands of damaged binaries, each must end in BinaryFormatError or in a
run that completes with outputs of the declared shapes — never another exception, a hang or a crash.

Raw byte damage mostly meets the checksums, so half the cases are *resealed*: a record field or a metadata
value is changed and the file rebuilt with valid checksums, which drives the damage into the semantic
checks (fields, bounds, formats, schedule, initialization) and, when it passes them, into the emulator.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from spyre_mlir.runtime import BinaryFormatError, InputError, ProgramBuilder, SpyreRuntimeError, load_bytes
from spyre_mlir.runtime.binary import Section, program_to_bytes, read_container, write_container
from spyre_mlir.runtime.isa import INSTR_DTYPE, Op
from spyre_mlir.runtime.kernels import build_matmul, build_softmax
from spyre_mlir.target import load_target

SEED = 20261129
T1, T2, T3 = load_target(cores=1), load_target(cores=2), load_target(cores=3)


def _host_and_ring(t):
    """Host gather + restick there and back + ring sends (one, and a multicast) + elementwise work + a matmul
    reading B transposed (TRANS_B), so those paths get fuzzed too."""
    b = ProgramBuilder(t)
    ids = b.input("ids", (4,), "int32")
    emb = b.constant("emb", np.linspace(-1, 1, 16 * 64, dtype=np.float32).reshape(16, 64), "dlf16")
    g = b.scratch("g", (4, 64), "dlf16")
    gt = b.scratch("gt", (64, 4), "dlf16")
    g2 = b.scratch("g2", (4, 64), "dlf16")
    y = b.output("y", (4, 64), "dlf16")
    b.host(0, "gather", [emb, ids], [g])
    b.restick(0, g, gt)
    b.restick(0, gt, g2)
    T0, T1_, T2_ = b.alloc(0, 4, 64), b.alloc(1, 4, 64), b.alloc(2, 4, 64)
    b.load_tile(0, T0, g2)
    b.sfu(0, "gelu_tanh", T0, T0)
    b.ring_send(0, 1, T1_.addr, T0)
    b.barrier()
    b.sfu(1, "mul", T1_, T1_, 3.0)
    b.ring_send(1, [0, 2], T2_.addr, T1_)
    b.barrier()
    b.sfu(2, "add", T2_, T2_, 1.0)
    b.store_tile(2, T2_, y)
    W, C, P = b.alloc(2, 16, 64), b.alloc(2, 4, 16, "fp32"), b.alloc(2, 4, 16)
    b.load_tile(2, W, emb)
    b.matmul(2, T2_, W, C, out=P, trans_b=True)
    b.store_tile(2, P, b.output("p", (4, 16), "dlf16"))
    return b


def _bases():
    rng = np.random.default_rng(SEED)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    mm = build_matmul(T2, 16, 64, 128, grid=(1, 1), split_k=2, weights=w)
    sm = build_softmax(T1, 8, 96)
    hr = _host_and_ring(T3)
    # 16 K steps on one core: a stream stored with loops (LOOP and STEP records to damage).
    lp = build_matmul(T1, 16, 64, 1024, grid=(1, 1), tile_k=64,
                      weights=rng.standard_normal((1024, 64)).astype(np.float32))
    return [
        (mm, T2, [rng.standard_normal((16, 128)).astype(np.float32)]),
        (sm, T1, [rng.standard_normal((8, 96)).astype(np.float32)]),
        (hr, T3, [np.array([0, 3, 15, 7], np.int32)]),
        (lp, T1, [rng.standard_normal((16, 1024)).astype(np.float32)]),
    ]


def _check(data: bytes, target, inputs, stats) -> None:
    """The property under test."""
    try:
        exe = load_bytes(data, target=target)
    except BinaryFormatError:
        stats["rejected"] += 1
        return
    try:
        outs = exe(*inputs)
    except InputError:                         # the damage changed what the program takes: a user error
        stats["loaded"] += 1
        return
    except SpyreRuntimeError as e:             # only data-dependent host failures are acceptable
        assert "gather index" in str(e)
        stats["ran"] += 1
        return
    assert [o.shape for o in outs] == [b.shape for b in exe.output_buffers]
    # The same (damaged but valid) program without rounding: the shadow machinery must cope as well.
    ref = load_bytes(data, target=target, numerics="fp32-reference")(*inputs)
    assert [o.shape for o in ref] == [o.shape for o in outs]
    stats["ran"] += 1


_U32 = [0, 1, 2, 63, 64, 127, 128, 129, 255, 256, 4096, 65535, 65536, 1 << 20, 1589376, 1589248, 1 << 31,
        (1 << 32) - 1]


def _mutate_record(prog, rng):
    c = int(rng.integers(prog.num_cores))
    code = np.array(prog.code[c], copy=True)
    i = int(rng.integers(len(code)))
    field = INSTR_DTYPE.names[int(rng.integers(len(INSTR_DTYPE.names)))]
    dt = INSTR_DTYPE.fields[field][0]
    old = code[i][field]
    if dt.kind == "f":
        v = rng.choice([np.nan, np.inf, -np.inf, 0.0, -1.0, 1e30, float(rng.standard_normal())])
    else:
        bits = 8 * dt.itemsize
        choices = _U32 + [int(old) + 128, max(int(old) - 128, 0), int(old) * 2, int(old) ^ 1,
                          int(rng.integers(0, 1 << min(bits, 62)))]
        if bits == 64:
            choices += [1 << 63, (1 << 64) - 1]
        v = int(choices[int(rng.integers(len(choices)))]) % (1 << bits)
    code[i][field] = v
    prog.code = [code if j == c else prog.code[j] for j in range(prog.num_cores)]
    return program_to_bytes(prog)


def _mutate_stored(data: bytes, rng) -> bytes:
    """A field of a record as the file stores it (LOOP and STEP records included), resealed."""
    ncores, fp, secs = read_container(data)
    secs = [[k, i, bytes(p)] for k, i, p in secs]
    sec = [s for s in secs if s[0] == Section.CODE][int(rng.integers(ncores))]
    code = np.frombuffer(sec[2], dtype=INSTR_DTYPE).copy()
    loops = np.flatnonzero(np.isin(code["op"], (Op.LOOP, Op.STEP)))
    i = int(rng.choice(loops)) if loops.size and rng.random() < 0.7 else int(rng.integers(len(code)))
    field = rng.choice(["op", "m", "n", "k", "a0", "a1", "a4", "dev", "mask", "flags"])
    bits = 8 * INSTR_DTYPE.fields[field][0].itemsize
    old = int(code[i][field])
    choices = _U32 + [old + 1, max(old - 1, 0), old * 2, old + 128, Op.LOOP, Op.STEP, Op.END]
    if bits == 64:
        choices += [1 << 63, (1 << 64) - 128]
    code[i][field] = int(choices[int(rng.integers(len(choices)))]) % (1 << bits)
    sec[2] = code.tobytes()
    return write_container(ncores, fp, secs)


def _json_leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_leaves(v, path + (k,))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield from _json_leaves(v, path + (k,))
    yield path


def _mutate_metadata(data: bytes, rng) -> bytes:
    ncores, fp, secs = read_container(data)
    secs = [[k, i, bytes(p)] for k, i, p in secs]
    meta_sec = next(s for s in secs if s[0] == Section.METADATA)
    meta = json.loads(meta_sec[2])
    leaves = [p for p in _json_leaves(meta) if p]
    path = leaves[int(rng.integers(len(leaves)))]
    parent = meta
    for k in path[:-1]:
        parent = parent[k]
    new = [None, -1, 0, 1, 7, 128, 4096, 1 << 40, 1 << 70, "dlf16", "int8", [], {}, [1, 2], "x", 1.5, True]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new[int(rng.integers(len(new)))]
    meta_sec[2] = json.dumps(meta).encode()
    return write_container(ncores, fp, secs)


@pytest.mark.parametrize("base_index", [0, 1, 2, 3])
def test_fuzz_binary(base_index):
    builder, target, inputs = _bases()[base_index]
    rng = np.random.default_rng(SEED + base_index)
    good = builder.to_bytes()
    stats = dict(rejected=0, loaded=0, ran=0)
    _check(good, target, inputs, stats)
    assert stats["ran"] == 1
    t0 = time.perf_counter()
    cases = 0
    for _ in range(600):                     # raw byte damage
        b = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
        _check(bytes(b), target, inputs, stats)
        cases += 1
    for _ in range(100):                     # truncation and extension
        _check(good[:int(rng.integers(len(good)))], target, inputs, stats)
        _check(good + rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes(), target,
               inputs, stats)
        cases += 2
    for _ in range(500):                     # resealed instruction fields
        _check(_mutate_record(builder.program(), rng), target, inputs, stats)
        cases += 1
    for _ in range(300):                     # resealed stored records (loops)
        _check(_mutate_stored(good, rng), target, inputs, stats)
        cases += 1
    for _ in range(150):                     # resealed metadata values
        _check(_mutate_metadata(good, rng), target, inputs, stats)
        cases += 1
    elapsed = time.perf_counter() - t0
    assert stats["rejected"] + stats["loaded"] + stats["ran"] == cases + 1
    assert stats["rejected"] > cases // 2 and stats["ran"] > 1   # both outcomes really happen
    assert elapsed < 60, f"{cases} cases took {elapsed:.1f}s"
