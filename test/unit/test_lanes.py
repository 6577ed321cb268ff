"""The emulator's worker process (runtime/lanes.py): a segment of many small steps runs as two lanes of cores,
every other core's in a forked process. The outputs are the bits one process computes; the worker lives as long
as its executable, and a failed or killed worker costs one run at most."""

from __future__ import annotations

import gc
import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import spyre_mlir
from spyre_mlir.runtime import emulator, lanes, load_bytes
from spyre_mlir.runtime.binary import program_to_bytes
from spyre_mlir.runtime.link import link
from spyre_mlir.runtime.emulator import SpyreRuntimeError
from spyre_mlir.runtime.isa import Op
from spyre_mlir.runtime.kernels import build_matmul
from spyre_mlir.target import load_target

pytestmark = pytest.mark.skipif(not lanes.available(), reason="worker processes need Linux on x86-64, 2 CPUs")


@pytest.fixture(scope="module")
def target():
    return load_target().with_cores(32)


@pytest.fixture(autouse=True)
def _room_for_workers():
    """Each test starts with room for workers: executables of earlier tests (kept by fixtures, or dropped and not
    yet collected) may hold all of them. A program whose worker is stopped forks again at its next run."""
    for ref in list(lanes._LIVE.values()):
        if (w := ref()) is not None:
            w.close()


def _matmul(target, workers: bool, monkeypatch, numerics="faithful"):
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1" if workers else "0")
    # small tiles: many small steps a segment, as lanes are for (big batches use two threads instead)
    return build_matmul(target, 512, 1024, 256, grid=(4, 8), tile_m=64, tile_n=64, tile_k=64).load(numerics=numerics)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((512, 256)).astype(np.float32), rng.standard_normal((256, 1024)).astype(np.float32)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("numerics", ["faithful", "fp32-reference"])
def test_two_lanes_give_the_bits_of_one_process(target, monkeypatch, numerics):
    one = _matmul(target, False, monkeypatch, numerics)
    two = _matmul(target, True, monkeypatch, numerics)
    assert not one.machine.lanes and two.machine.lanes
    for seed in range(3):           # and again: the worker's state carries over between runs correctly
        x, w = _inputs(seed)
        (a,), (b,) = one(x, w), two(x, w)
        assert np.array_equal(a, b)
    assert _alive(two.machine.worker.pid)


class _Attention(nn.Module):
    """Causal attention with an MLP: shared and reread operands, rereads across lanes, casts on every core."""

    def __init__(self, d=256, heads=4):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.heads = heads

    def forward(self, x):
        s, d = x.shape
        q, k, v = (t.reshape(s, self.heads, -1).transpose(0, 1) for t in self.qkv(x).chunk(3, dim=-1))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(0, 1).reshape(s, d))
        return x + self.down(nn.functional.silu(self.up(x)))


def test_a_compiled_model_gives_the_same_bits_with_a_worker(monkeypatch):
    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(128, 256)
    outs = {}
    for workers in (False, True):
        monkeypatch.setenv("SPYRE_EMU_WORKERS", "1" if workers else "0")
        exe = spyre_mlir.compile(model, (x,), cores=32, cache_dir=False)
        assert bool(exe.machine.lanes) == workers
        outs[workers] = [exe(x)[0] for _ in range(2)]
    for a, b in zip(outs[False], outs[True]):
        assert np.array_equal(a, b)


class _Convs(nn.Module):
    def __init__(self, channels=(3, 16, 32, 64)):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(channels, channels[1:]))

    def forward(self, x):
        for conv in self.convs:
            x = nn.functional.max_pool2d(torch.relu(conv(x)), 2)
        return x


@pytest.mark.parametrize("stop", ["killed", "closed"])
def test_a_worker_forked_again_computes_what_the_first_did(monkeypatch, stop):
    """A worker replaced after runs (killed, or stopped for another executable's: workers are capped) starts
    with nothing the first one kept: the weights its lanes decoded at their first run went with it, and
    some were loaded into scratchpads by this process's lane, at the first run only, and overwritten since. The
    next run is a first run again in both processes, and gives the bits of the first."""
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1")
    torch.manual_seed(0)
    model, x = _Convs().eval(), torch.randn(1, 3, 64, 64)
    exe = spyre_mlir.compile(model, (x,), cores=32, cache_dir=False)
    assert exe.machine.lanes
    (want,) = exe(x)
    for _ in range(2):
        pid = exe.machine.worker.pid
        if stop == "killed":
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        else:
            exe.machine.worker.close()
        for _ in range(2):
            assert np.array_equal(exe(x)[0], want)
        assert exe.machine.worker.pid != pid


def test_a_program_whose_worker_was_taken_runs_its_lanes_here(target, monkeypatch):
    """A program whose worker was stopped for another's, and that finds no room for a new one, runs both lanes
    in this process: a first run here (its weights were decoded in the worker that went), then as any run."""
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1")
    monkeypatch.setattr(lanes, "_LIVE_MAX", 1)
    torch.manual_seed(0)
    model, x = _Convs().eval(), torch.randn(1, 3, 64, 64)
    exe = spyre_mlir.compile(model, (x,), cores=32, cache_dir=False)
    (want,) = exe(x)
    monkeypatch.setattr(lanes, "_STALE", 0)
    other = _matmul(target, True, monkeypatch)
    other(*_inputs())                                   # takes the only worker
    assert not exe.machine.worker.alive and other.machine.worker.alive
    monkeypatch.setattr(lanes, "_STALE", 1 << 30)
    for _ in range(2):
        assert np.array_equal(exe(x)[0], want) and exe.machine.worker is None


def test_a_fork_of_this_process_computes_what_this_one_does(monkeypatch):
    """A user's fork (a data loader, a process pool) that runs a model this process has run forks a worker of its
    own: its first run is a first run again, as for a replaced worker (above)."""
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1")
    torch.manual_seed(0)
    model, x = _Convs().eval(), torch.randn(1, 3, 64, 64)
    exe = spyre_mlir.compile(model, (x,), cores=32, cache_dir=False)
    (want,) = exe(x)
    assert exe.machine.worker is not None
    assert _in_a_fork(lambda: b"1" if np.array_equal(exe(x)[0], want) else b"0") == b"1"
    assert np.array_equal(exe(x)[0], want)


def test_the_worker_stops_with_its_executable(target, monkeypatch):
    exe = _matmul(target, True, monkeypatch)
    exe(*_inputs())
    pid = exe.machine.worker.pid
    assert _alive(pid)
    del exe                 # no collection needed
    assert not _alive(pid)


def test_a_failing_lane_fails_the_run_and_the_next_run_recovers(target, monkeypatch):
    exe = _matmul(target, True, monkeypatch)
    x, w = _inputs()
    (want,) = _matmul(target, False, monkeypatch)(x, w)
    lane = exe.machine.lanes[-1]
    good = lane.second[0]

    def boom():
        raise ValueError("boom")
    lane.second[0] = boom           # the worker forked at the first run holds this plan
    with pytest.raises(SpyreRuntimeError, match=r"worker process: .*ValueError: boom"):
        exe(x, w)
    assert exe.machine.worker is None
    lane.second[0] = good
    (y,) = exe(x, w)
    assert np.array_equal(y, want)


def test_a_killed_worker_is_replaced_before_the_next_run(target, monkeypatch):
    exe = _matmul(target, True, monkeypatch)
    x, w = _inputs()
    (want,) = exe(x, w)
    pid = exe.machine.worker.pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)              # gone for sure before the run
    (y,) = exe(x, w)
    assert exe.machine.worker.pid != pid and np.array_equal(y, want)


def _in_a_fork(fn) -> bytes:
    """``fn()`` (bytes) in a forked child, which then exits without pytest's machinery."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = b"!"
        try:
            out = fn()
        finally:
            os.write(w, out)
            os._exit(0)
    os.close(w)
    out = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return out


def test_a_fork_of_this_process_leaves_its_worker_alone(target, monkeypatch):
    """A user's fork (a data loader, a process pool) has a copy of the executable: dropping it there (as a
    program's exit does) stops nothing of this process's, and running it there forks a worker of its own."""
    exe = _matmul(target, True, monkeypatch)
    x, w = _inputs()
    (want,) = exe(x, w)
    mine = exe.machine.worker.pid

    def drop():
        nonlocal exe
        exe = None              # the copy's finalizers run here
        gc.collect()
        return b"1"

    def run():
        (y,) = exe(x, w)
        return b"1" if np.array_equal(y, want) and exe.machine.worker.pid != mine else b"0"
    assert _in_a_fork(drop) == b"1" and _alive(mine)
    assert _in_a_fork(run) == b"1" and _alive(mine)
    assert np.array_equal(exe(x, w)[0], want) and exe.machine.worker.pid == mine


def test_a_bundle_shares_its_device_memory_when_a_later_entry_has_lanes(target, monkeypatch):
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1")
    small = build_matmul(target, 256, 512, 128, grid=(4, 8)).program()              # no lanes
    big = build_matmul(target, 512, 1024, 256, grid=(4, 8), tile_m=64, tile_n=64, tile_k=64).program()
    bundle = load_bytes(program_to_bytes(link({"small": small, "big": big})), target=target)
    assert not bundle["small"].machine.lanes and bundle["big"].machine.lanes
    x, w = _inputs()
    (want,) = _matmul(target, False, monkeypatch)(x, w)
    assert np.array_equal(bundle["big"](x, w)[0], want)      # what the worker stored is seen here


def test_workers_are_capped_and_a_stale_one_makes_room(target, monkeypatch):
    """At most ``_LIVE_MAX`` workers. A program past the cap runs its lanes in this process while the others were
    run lately (programs called in turn do not fork a worker at every call), and gets one once the least recently
    used one went ``_STALE`` runs unused; that one's program runs its lanes here at its next run. Every output is
    the same."""
    monkeypatch.setattr(lanes, "_STALE", 6)
    x, w = _inputs()
    exes = [_matmul(target, True, monkeypatch) for _ in range(lanes._LIVE_MAX + 1)]
    outs = [exe(x, w)[0] for exe in exes]
    assert len(lanes._LIVE) == lanes._LIVE_MAX
    assert exes[-1].machine.worker is None and all(e.machine.worker.alive for e in exes[:-1])
    pids = [e.machine.worker.pid for e in exes[:-1]]
    for _ in range(3):                  # in turn: no worker stopped, none forked
        for e in exes:
            assert np.array_equal(e(x, w)[0], outs[0])
    assert exes[-1].machine.worker is None and [e.machine.worker.pid for e in exes[:-1]] == pids
    for _ in range(2):                  # the first one unused for 8 runs: the last one takes its place
        for e in exes[1:]:
            assert np.array_equal(e(x, w)[0], outs[0])
    assert not exes[0].machine.worker.alive and exes[-1].machine.worker.alive
    assert np.array_equal(exes[0](x, w)[0], outs[0]) and exes[0].machine.worker is None
    assert len(lanes._LIVE) <= lanes._LIVE_MAX and all(np.array_equal(o, outs[0]) for o in outs)


def test_workers_of_dropped_programs_make_room(target, monkeypatch):
    """Programs dropped but not yet collected (in a reference cycle, as a wrapper with a back reference makes)
    hold no worker another program needs: finding no room, it collects them first (at most once in ``_STALE``
    runs; the test puts the last collection that long ago)."""
    monkeypatch.setattr(lanes, "_COLLECTED", [lanes._RUNS[0] - lanes._STALE])
    x, w = _inputs()
    exes = [_matmul(target, True, monkeypatch) for _ in range(lanes._LIVE_MAX)]
    for e in exes:
        e(x, w)
        e.cycle = [e]
    pids = [e.machine.worker.pid for e in exes]
    gc.disable()
    try:
        del exes, e
        assert all(_alive(p) for p in pids)             # not collected yet
        new = _matmul(target, True, monkeypatch)
        new(x, w)
        assert new.machine.worker is not None and not any(_alive(p) for p in pids)
    finally:
        gc.enable()


def test_a_worker_in_a_run_on_another_thread_is_not_stopped_for_a_new_one(target, monkeypatch):
    """Past the cap, a new worker never stops one in a run on another thread, however stale: that run waits on it
    (it failed: "the emulator's worker process died"). The new program runs its lanes in this process."""
    import threading

    monkeypatch.setattr(lanes, "_LIVE_MAX", 1)
    monkeypatch.setattr(lanes, "_STALE", 0)
    x, w = _inputs()
    first, second = _matmul(target, True, monkeypatch), _matmul(target, True, monkeypatch)
    (want,) = first(x, w)
    inside, leave, got = threading.Event(), threading.Event(), []
    step = first._plan[0]

    def held():
        inside.set()
        leave.wait()
        step()
    first._plan[0] = held

    def run():
        try:
            got.append(first(x, w)[0])
        except Exception as e:          # noqa: BLE001 - checked below
            got.append(e)
    t = threading.Thread(target=run)
    t.start()
    inside.wait()
    try:
        assert np.array_equal(second(x, w)[0], want)        # its lanes here, while the first's worker is busy
        assert first.machine.worker.alive and second.machine.worker is None
    finally:
        leave.set()
        t.join()
    first._plan[0] = step
    assert len(got) == 1 and isinstance(got[0], np.ndarray) and np.array_equal(got[0], want)
    assert np.array_equal(second(x, w)[0], want) and np.array_equal(first(x, w)[0], want)


def test_split_k_sums_parts_made_in_both_lanes(target, monkeypatch):
    x = np.random.default_rng(1).standard_normal((512, 1024)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((1024, 512)).astype(np.float32)
    outs = []
    for workers in (False, True):
        monkeypatch.setenv("SPYRE_EMU_WORKERS", "1" if workers else "0")
        exe = build_matmul(target, 512, 512, 1024, grid=(2, 2), split_k=8, tile_m=64, tile_n=64, tile_k=64).load()
        reducing = [any(b[0].op is Op.RING_REDUCE for b in batches) for batches, _ in emulator.segments(exe.steps)]
        assert reducing[0] and bool(exe.machine.lanes) == workers
        outs.append(exe(x, w)[0])
    assert np.array_equal(*outs)


def _ins(core, op=Op.MATMUL, work=1 << 16):
    return SimpleNamespace(core=core, op=op, useful_macs=work * 64, elems=0, nbytes=0)


def test_a_program_with_little_work_in_lanes_keeps_one_process(target, monkeypatch):
    monkeypatch.setenv("SPYRE_EMU_WORKERS", "1")
    exe = build_matmul(target, 256, 512, 128, grid=(4, 8)).load()     # segments big enough, the run short
    segs = [batches for batches, _ in emulator.segments(exe.steps)]
    assert any(emulator._lane_split(b) is not None for b in segs) and not exe.machine.lanes
    exe(np.ones((256, 128), np.float32), np.ones((128, 512), np.float32))
    assert exe.machine.worker is None


def test_which_segments_run_as_lanes():
    big = [[_ins(c, work=1 << 12) for c in range(0, 32, 8)] for _ in range(8)]
    threaded = [[_ins(c, work=1 << 14) for c in range(32)] for _ in range(8)]     # each batch worth two threads
    first, second = emulator._lane_split(big)       # the first half of the cores the segment runs on, the second
    assert [i.core for i in first[0]] == [0, 8] and [i.core for i in second[0]] == [16, 24]
    # A batch on a few of them would be in one half: every other core, each batch in both lanes.
    first, second = emulator._lane_split(big + [[_ins(c, work=1 << 12) for c in (0, 8)]])
    assert [i.core for i in first[0]] == [0, 16] and [i.core for i in second[-1]] == [8]
    assert emulator._lane_split([[_ins(0, work=1 << 20)]]) is None                  # one core
    assert emulator._lane_split([[_ins(c, work=100) for c in range(32)]]) is None    # too little work
    first, second = emulator._lane_split(threaded)          # big batches too: one handoff for the segment
    assert [len(b) for b in first] == [16] * 8 and {i.core for b in second for i in b} == set(range(16, 32))
    for op in (Op.HOST, Op.GATHER, Op.RESTICK):                                     # this process only
        assert emulator._lane_split(big + [[_ins(0, op, 0)]]) is None
    # Ring transfers move their bytes at the barrier, outside the lanes: big sends do not keep a segment whole.
    sends = [[_ins(c, op, work=1 << 14) for c in range(32)] for op in (Op.RING_SEND, Op.RING_REDUCE)]
    assert not any(emulator._threaded(b) for b in sends)
    assert emulator._lane_split(sends + big)


def test_which_programs_use_a_worker():
    small_steps = [[_ins(c, work=1 << 12) for c in range(32)] for _ in range(16)]      # 2^21 work, no threads
    threaded = [[_ins(c, work=1 << 14) for c in range(32)] for _ in range(8)]        # 2^22 work, two threads
    assert emulator.lane_splits([(small_steps, None)]) is not None
    assert emulator.lane_splits([(small_steps[:4], None)]) is None          # under a millisecond of lanes
    host = threaded + [[_ins(0, Op.HOST, 0)]]                                       # runs in this process
    assert emulator.lane_splits([(small_steps, None), (host, None)]) is None          # mostly outside lanes
