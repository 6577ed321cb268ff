"""Cycle model: how long the program would take on the target, per core and per unit.

The model is static (programs are straight-line), so it runs once at load over the same schedule the
emulator executes. Each core has independent units — DMA, PT, SFU, RING, HOST — that each work through
their instructions in program order; units of one core run concurrently, which is where DMA/compute
overlap comes from. An instruction starts when its unit is free and when the scratchpad sticks it touches
are ready (read-after-write, write-after-read and write-after-write, tracked per 128-byte stick). Device
memory needs no tracking of its own: a core's DMA unit is in order, other cores are ordered only by
barriers (a barrier starts every unit of its members when the last member's units drain, plus
barrier_latency_cycles; ring transfers land at that barrier), and a HOST op fences its core's units.

Durations (cycles), every number from the target: the one the loader checked against the binary's fingerprint,
so the values the compiler planned with (the fixed ``*_latency_cycles`` are [assumed] entries of the target
file, read by ``spyre_mlir/cost.py`` too):

* DMA: bytes / (DRAM bandwidth / cores transferring at the same time) + dma_latency_cycles. The sharing count is
  first every core with DMA work in the barrier segment, then (REFINE_PASSES times) the time-averaged
  number of cores whose transfers overlap this one in the previous pass. Bandwidth is first the read, write or
  mixed figure depending on what the segment moves, then (the same passes) the mixed figure for the part of
  the transfer that transfers the other way overlap in the previous pass and its own direction's for the rest
  (time-weighted): a load after a segment's stores, or beside no store, moves at the read bandwidth.
* RESTICK (on the DMA unit): the larger of its source and destination bytes / (restickify bandwidth /
  cores transferring at the same time) + dma_latency_cycles. It shares DRAM like a DMA and counts as both a read
  and a write (so DMAs of its segment, then those it overlaps, see the mixed bandwidth); its source bytes count as DRAM
  reads and its destination bytes as DRAM writes.
* GATHER (on the DMA unit): as a DMA load of its m rows; it reads the bandwidth of its segment like one.
* PT: M and N padded to the PT array (pt_rows x pt_cols) times K, over ``macs_per_cycle(format)`` (the
  slower input format), + pt_latency_cycles.
* SFU: elements x ``sfu_cycles(class)`` / SFU lanes per core, + sfu_latency_cycles; row reductions are
  "simple".
* RING: bytes / ring_bytes_per_cycle + hops (send: to the farthest destination) or group size - 1 (reduce) x
  hop_latency_cycles. A multicast sends its copies back to back: every copy's bytes, but only the last copy's
  travel is exposed (the copies before it travel while the next ones are sent).
* HOST: bytes / host link bandwidth + host_latency_cycles (the data goes to the host and back).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from .collector import collector_paused
from .emulator import segments
from .formats import STICK_BYTES
from .isa import ROOT_ALL, Op, tile_pitch
from .schedule import Sync

__all__ = ["Profile", "Event", "UNITS", "model_program"]

UNITS = ("DMA", "PT", "SFU", "RING", "HOST")
_SHARED = frozenset({Op.DMA_LOAD, Op.DMA_STORE, Op.RESTICK, Op.GATHER})     # moving DRAM's shared bytes
_HOST = UNITS.index("HOST")
_MAX_RUNS = 16          # stick arrays of more runs than this are indexed as they are
_UNIT = {Op.DMA_LOAD: 0, Op.DMA_STORE: 0, Op.RESTICK: 0, Op.GATHER: 0, Op.MATMUL: 1, Op.SFU: 2, Op.REDUCE: 2,
         Op.RING_SEND: 3, Op.RING_REDUCE: 3, Op.HOST: 4}

REFINE_PASSES = 2      # timeline passes that re-estimate how many cores share DRAM bandwidth


@dataclasses.dataclass(frozen=True)
class Event:
    """One instruction on one unit of one core, in cycles."""

    core: int
    unit: str
    name: str
    start: float
    end: float
    index: int
    loc: str


@dataclasses.dataclass(frozen=True)
class Profile:
    """Modeled performance of one run (static: the same for every call) plus the emulator's wall time."""

    target: str
    num_cores: int
    clock_ghz: float
    cycles: float
    busy: tuple[tuple[float, ...], ...]     # [core][unit] busy cycles, units as UNITS
    dram_read_bytes: int
    dram_write_bytes: int
    ring_bytes: int
    host_bytes: int
    pt_macs: int                            # useful M*N*K
    pt_padded_macs: int                     # as the PT array sees them (padded to the array)
    sfu_elements: int
    peak_flops: float                       # DLFloat16 peak of the cores in use, FLOP/s
    dram_bytes_per_s: float
    scratchpad_peak_bytes: int = 0          # highest scratchpad byte any core's program touches (+1)
    usable_scratchpad_bytes: int = 0        # the target's usable scratchpad per core
    events: tuple[Event, ...] = dataclasses.field(repr=False, default=())
    wall_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return self.cycles / (self.clock_ghz * 1e9)

    @property
    def flops(self) -> int:
        return 2 * self.pt_macs

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.seconds if self.cycles else 0.0

    @property
    def utilization(self) -> dict[str, float]:
        """Busy fraction of each unit, averaged over cores, relative to the modeled latency."""
        if not self.cycles:
            return {u: 0.0 for u in UNITS}
        b = np.asarray(self.busy, dtype=np.float64)
        return {u: float(b[:, i].sum() / (self.num_cores * self.cycles)) for i, u in enumerate(UNITS)}

    @property
    def intensity(self) -> float:
        """FLOPs per byte of device memory traffic (inf when nothing moves)."""
        moved = self.dram_read_bytes + self.dram_write_bytes
        return self.flops / moved if moved else math.inf

    @property
    def ridge(self) -> float:
        """Intensity where the roofline turns from memory-bound to compute-bound."""
        return self.peak_flops / self.dram_bytes_per_s

    @property
    def bound(self) -> str:
        """Roofline verdict from arithmetic intensity: "compute" or "memory" (or "none" without PT work)."""
        if not self.flops:
            return "none"
        return "compute" if self.intensity >= self.ridge else "memory"

    @property
    def limiter(self) -> str:
        """The unit with the most busy cycles on the busiest core: what the model says to optimize."""
        b = np.asarray(self.busy)
        core = int(np.argmax(b.max(axis=1)))
        return UNITS[int(np.argmax(b[core]))]

    def to_dict(self) -> dict:
        """JSON-ready summary (no per-instruction events)."""
        return {
            "target": self.target, "num_cores": self.num_cores, "clock_ghz": self.clock_ghz,
            "cycles": self.cycles, "seconds": self.seconds, "wall_seconds": self.wall_seconds,
            "utilization": self.utilization, "limiter": self.limiter,
            "busy_cycles": [{u: v for u, v in zip(UNITS, row)} for row in self.busy],
            "bytes": {"dram_read": self.dram_read_bytes, "dram_write": self.dram_write_bytes,
                      "ring": self.ring_bytes, "host": self.host_bytes},
            "pt_macs": self.pt_macs, "pt_padded_macs": self.pt_padded_macs, "sfu_elements": self.sfu_elements,
            "flops": self.flops, "achieved_flops_per_s": self.achieved_flops, "peak_flops_per_s": self.peak_flops,
            "intensity_flops_per_byte": None if math.isinf(self.intensity) else self.intensity,
            "ridge_flops_per_byte": self.ridge, "bound": self.bound,
            "scratchpad_peak_bytes": self.scratchpad_peak_bytes,
        }


def _mean_concurrency(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each interval, the time-averaged number of intervals active during it (itself included)."""
    t = np.concatenate([starts, ends])
    d = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.argsort(t, kind="stable")
    t, count = t[order], np.cumsum(d[order])           # active intervals just after each event time
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(t))])

    def integral(x):                                   # integral of the active count from t[0] to x
        i = np.searchsorted(t, x, side="right") - 1
        return area[i] + count[i] * (x - t[i])
    return (integral(ends) - integral(starts)) / (ends - starts)


def _covered(starts: np.ndarray, ends: np.ndarray, ostarts: np.ndarray, oends: np.ndarray) -> np.ndarray:
    """For each interval [starts, ends), the fraction of it during which at least one of the intervals
    [ostarts, oends) is active (0 for an empty interval)."""
    if not ostarts.size:
        return np.zeros(starts.shape)
    order = np.argsort(ostarts, kind="stable")
    lo, hi = ostarts[order], np.maximum.accumulate(oends[order])
    new = np.concatenate([[True], lo[1:] > hi[:-1]])            # a gap before: a new piece of the union
    first = np.flatnonzero(new)
    ps, pe = lo[first], np.append(hi[first[1:] - 1], hi[-1])      # the union as disjoint sorted pieces
    before = np.concatenate([[0.0], np.cumsum(pe - ps)])           # union length before each piece

    def length(x):                                                 # union length below x
        j = np.searchsorted(ps, x, side="right") - 1
        inside = np.clip(x - ps[np.maximum(j, 0)], 0.0, (pe - ps)[np.maximum(j, 0)])
        return np.where(j < 0, 0.0, before[np.maximum(j, 0)] + inside)
    span = ends - starts
    return np.divide(length(ends) - length(starts), span, out=np.zeros(starts.shape), where=span > 0)


def model_program(prog, target, steps) -> Profile:
    """Run the cycle model over the static schedule (a list of Ins and Sync steps, :mod:`.schedule`).

    DRAM bandwidth is shared by the cores transferring at the same time. The first pass assumes every core
    with DMA work in the same barrier segment transfers at once; REFINE_PASSES more passes replace that by
    the time-averaged number of cores whose transfers overlap each transfer in the previous pass."""
    # The collector paused: the model makes an event per instruction, long-lived (:mod:`.collector`).
    with collector_paused():
        return _model_program(prog, target, steps)


def _model_program(prog, target, steps) -> Profile:
    """:func:`model_program`, the collector paused."""
    C = prog.num_cores
    per_cycle = 1.0 / target.clock_ghz        # GB/s -> bytes/cycle is gbps * per_cycle
    # Directions moved in each barrier segment pick the read, write or mixed bandwidth.
    dmas, seg_of, segs = [], [], [[set(), set()]]
    for s in steps:
        if isinstance(s, Sync):
            segs.append([set(), set()])
        elif s.op in _SHARED:
            dmas.append(s)
            seg_of.append(len(segs) - 1)
            segs[-1][0].add(s.core)
            segs[-1][1].update((Op.DMA_LOAD, Op.DMA_STORE) if s.op is Op.RESTICK else
                               (Op.DMA_LOAD,) if s.op is Op.GATHER else (s.op,))
    # Per transfer, in that order: its bytes, bandwidth (GB/s) and the number of cores sharing DRAM.
    moved = np.array([max(s.restick[4], s.restick[5]) if s.op is Op.RESTICK else s.nbytes for s in dmas],
                     dtype=np.float64)
    gbps = np.array([target.restickify_gbps if s.op is Op.RESTICK else
                     target.dram_mixed_gbps if len(segs[g][1]) == 2 else
                     target.dram_write_gbps if Op.DMA_STORE in segs[g][1] else target.dram_read_gbps
                     for s, g in zip(dmas, seg_of)], dtype=np.float64)
    share = np.array([float(len(segs[g][0])) for g in seg_of], dtype=np.float64)
    restick = np.array([s.op is Op.RESTICK for s in dmas], dtype=bool)
    reads = np.array([s.op is not Op.DMA_STORE for s in dmas], dtype=bool)      # RESTICK: both directions
    writes = np.array([s.op in (Op.DMA_STORE, Op.RESTICK) for s in dmas], dtype=bool)
    work = _work(steps, C, target, per_cycle, {id(s): j for j, s in enumerate(dmas)})

    def durations():
        return moved * share / (gbps * per_cycle) + target.dma_latency_cycles

    for _ in range(REFINE_PASSES):
        _, free, busy, (starts, ends) = _timeline(work, C, target, durations(), events=False)
        if not dmas:
            break
        share = np.maximum(1.0, _mean_concurrency(starts, ends))
        # Reads and writes cost each other only while both are in flight: a transfer moves at the mixed
        # bandwidth for the part of it that transfers the other way overlap, at its own for the rest.
        f = np.where(reads, _covered(starts, ends, starts[writes], ends[writes]),
                     _covered(starts, ends, starts[reads], ends[reads]))
        own = np.where(reads, target.dram_read_gbps, target.dram_write_gbps)
        gbps = np.where(restick, gbps, f * target.dram_mixed_gbps + (1.0 - f) * own)
    events, free, busy, _ = _timeline(work, C, target, durations())

    ops = [s for s in steps if not isinstance(s, Sync)]
    total = lambda op_set, attr: sum(getattr(s, attr) for s in ops if s.op in op_set)   # noqa: E731
    rst = [s.restick for s in ops if s.op is Op.RESTICK]
    return Profile(
        target=target.name, num_cores=C, clock_ghz=target.clock_ghz, cycles=float(free.max()),
        busy=tuple(tuple(float(x) for x in row) for row in busy),
        dram_read_bytes=total({Op.DMA_LOAD, Op.GATHER}, "nbytes") + sum(r[4] for r in rst),
        dram_write_bytes=total({Op.DMA_STORE}, "nbytes") + sum(r[5] for r in rst),
        ring_bytes=total({Op.RING_SEND, Op.RING_REDUCE}, "nbytes"), host_bytes=total({Op.HOST}, "nbytes"),
        pt_macs=total({Op.MATMUL}, "useful_macs"), pt_padded_macs=total({Op.MATMUL}, "macs"),
        sfu_elements=total({Op.SFU, Op.REDUCE}, "elems"),
        peak_flops=2.0 * target.macs_per_cycle("dlf16") * C * target.clock_ghz * 1e9,
        dram_bytes_per_s=target.dram_read_gbps * 1e9, events=tuple(events))


def _duration(ins, C: int, target, per_cycle: float) -> float:
    """Cycles one instruction keeps its unit busy (see the module docstring), but a DRAM transfer's, which depends
    on the cores sharing DRAM (:func:`model_program`)."""
    op, lanes = ins.op, target.sfu_lanes_per_core
    if op is Op.MATMUL:
        return ins.macs / target.macs_per_cycle(ins.pt_fmt) + target.pt_latency_cycles
    if op is Op.SFU:
        return ins.elems * target.sfu_cycles(ins.sfu_class) / lanes + target.sfu_latency_cycles
    if op is Op.REDUCE:
        return ins.elems * target.sfu_cycles("simple") / lanes + target.sfu_latency_cycles
    if op is Op.RING_SEND:           # a multicast as its copies one after another
        hops = max(min(d, C - d) for d in (abs(p - ins.core) for p in ins.send[0]))
        return ins.nbytes / target.ring_bytes_per_cycle + hops * target.hop_latency_cycles
    if op is Op.RING_REDUCE:
        return (ins.nbytes / target.ring_bytes_per_cycle
                + (bin(ins.reduce[0]).count("1") - 1) * target.hop_latency_cycles)
    return ins.nbytes / (target.host_link_gbps * per_cycle) + target.host_latency_cycles


def _duration_key(ins) -> tuple:
    """What :func:`_duration` reads of an instruction: equal keys, equal durations."""
    op = ins.op
    if op is Op.RING_SEND:
        return op, ins.nbytes, ins.core, ins.send[0]
    if op is Op.RING_REDUCE:
        return op, ins.nbytes, ins.reduce[0]
    return op, ins.macs, ins.pt_fmt, ins.elems, ins.sfu_class, ins.nbytes


def _timeline(work, C, target, transfers: np.ndarray, events: bool = True):
    """One pass of the per-core, per-unit timeline over ``work`` (:func:`_work`), the DRAM transfers taking
    ``transfers`` cycles (in their order). Returns (events in schedule order, unit free times, busy cycles,
    (start, end) arrays of the transfers); ``events`` False: none made (a refining pass needs the transfers'
    spans only)."""
    nst = -(-target.scratchpad_usable_bytes // STICK_BYTES)
    free = np.zeros((C, len(UNITS)))
    busy = np.zeros((C, len(UNITS)))
    spw = np.zeros((C, nst))            # per stick: when the last write lands
    spr = np.zeros((C, nst))            # per stick: when the last read is done
    starts, ends = np.zeros(len(transfers)), np.zeros(len(transfers))
    made = []
    for w in work:
        if isinstance(w, _Release):     # a barrier release
            t = free[w.members].max() + target.barrier_latency_cycles
            free[w.members] = t
            if w.landed is not None:
                spw[w.landed] = t
            continue
        # One instruction on each of several cores: each core's timeline is its own between barriers (DRAM is
        # shared through the transfers' durations), so they advance together, a numpy operation for all.
        batch, at, cores, u, reads, writes, dur, j = w
        start = free[cores, u]
        for x in reads:
            start = np.maximum(start, spw[x].max(axis=1))
        for x in writes:
            start = np.maximum(start, np.maximum(spw[x].max(axis=1), spr[x].max(axis=1)))
        if u == _HOST:                  # a fence: waits for the core's units, DMA waits for it
            start = np.maximum(start, free[cores].max(axis=1))
        if j is not None:               # DRAM transfers
            dur = transfers[j]
            starts[j], ends[j] = start, start + dur
        end = start + dur
        free[cores, u] = end
        if u == _HOST:
            free[cores, 0] = np.maximum(free[cores, 0], end)
        busy[cores, u] += dur
        for x in writes:
            spw[x] = end[:, None]
        for x in reads:
            spr[x] = np.maximum(spr[x], end[:, None])
        if events:
            made += [(k, Event(i.core, UNITS[u], i.name, a, b, i.idx, i.loc))
                     for k, i, a, b in zip(at, batch, start.tolist(), end.tolist())]
    made.sort(key=lambda e: e[0])
    return [e for _, e in made], free, busy, (starts, ends)


class _Release(NamedTuple):
    """A barrier release as the timeline walks it: its cores, and the (cores, sticks) indices of every stick its
    ring sends and reduces land on (None: none), which all land at the release."""

    members: list
    landed: tuple | None


def _release(sync: Sync, C: int, landing: dict) -> _Release:
    """A barrier release as the timeline walks it, its sticks gathered once for all passes (not indexed a
    destination core at a time, at every pass). ``landing``: (id of a send's
    peer sticks, its destinations) -> their (cores, sticks) indices, kept over one :func:`_work` (the decoder
    hands a loop's sends into the same double buffers one array)."""
    rows, cols = [], []
    for snd in sync.sends:
        key = id(snd.peer_sticks), snd.send[0]
        if key not in landing:
            landing[key] = (np.repeat(np.asarray(snd.send[0]), snd.peer_sticks.size),
                            np.tile(snd.peer_sticks, len(snd.send[0])))
        r, c = landing[key]
        rows.append(r)
        cols.append(c)
    for grp in sync.reduces:
        mask, root, dst, _ = grp[0].reduce
        st = np.arange(dst[0] // STICK_BYTES, (dst[0] + dst[1] * tile_pitch(dst[2], dst[3])) // STICK_BYTES)
        for q in ([i for i in range(C) if mask >> i & 1] if root == ROOT_ALL else [root]):
            rows.append(np.full(st.size, q))
            cols.append(st)
    landed = (np.concatenate(rows), np.concatenate(cols)) if rows else None
    return _Release(list(sync.members), landed)


def _work(steps, C, target, per_cycle, transfer: dict) -> list:
    """The schedule as the timeline walks it, worked out once for all its passes: each barrier release, and
    between two releases the emulator's batches (:func:`.emulator.segments`: one instruction of each of several
    cores, every core's in its order) as (the instructions, their places in the schedule, their cores, unit,
    how to index the sticks they read and write (:func:`_sticks`), their durations, or for DRAM transfers
    None and their indices in ``transfer`` (id(ins) -> index)). A batch whose instructions touch different
    numbers of sticks is split into single instructions."""
    pos = {id(s): k for k, s in enumerate(steps)}
    segs = getattr(steps, "memo", {}).get("segments") or segments(steps)
    out = []
    durations: dict = {}        # _duration_key -> cycles: a loop's trips repeat a few durations
    landing: dict = {}          # of _release

    def duration(ins) -> float:
        key = _duration_key(ins)
        if key not in durations:
            durations[key] = _duration(ins, C, target, per_cycle)
        return durations[key]

    for batches, sync in segs:
        for batch in batches:
            for part in (batch,) if _even(batch) else ([i] for i in batch):
                u = _UNIT[part[0].op]
                if part[0].op in _SHARED:
                    dur, j = None, np.array([transfer[id(i)] for i in part])
                else:
                    dur, j = np.array([duration(i) for i in part]), None
                cores = np.array([i.core for i in part])
                out.append((part, [pos[id(i)] for i in part], cores, u, _sticks(part, cores, "sp_reads"),
                            _sticks(part, cores, "sp_writes"), dur, j))
        if sync is not None:
            out.append(_release(sync, C, landing))
    return out


def _even(batch) -> bool:
    """Whether every instruction of a batch reads as many sticks, and writes as many, as the first."""
    return all(i.sp_reads.size == batch[0].sp_reads.size and i.sp_writes.size == batch[0].sp_writes.size
               for i in batch)


def _sticks(part, cores, field) -> list:
    """How to index the per-stick times of the sticks each instruction of ``part`` reads or writes (``field``):
    [cores, sticks] indices, one per run of consecutive sticks when every instruction has the same ones (an SPMD
    tile: a slice of the cores' rows, a view when they are consecutive, as most are), else one for all."""
    first = getattr(part[0], field)
    if not first.size:
        return []
    # The decoder hands SPMD copies of one record the same arrays: mostly an identity test, else one comparison
    # of all of them (a loop's trips decode to equal arrays of their own).
    arrays = [getattr(i, field) for i in part]          # as many sticks each (_work)
    stacked = None if all(a is first for a in arrays) else np.stack(arrays)
    if stacked is None or (stacked == first).all():
        cut = np.flatnonzero(np.diff(first) != 1) + 1
        if cut.size <= _MAX_RUNS:
            lo, hi = int(cores[0]), int(cores[-1]) + 1
            rows = slice(lo, hi) if np.array_equal(cores, np.arange(lo, hi)) else cores
            bounds = zip(np.concatenate([[0], cut]), np.concatenate([cut, [first.size]]))
            return [(rows, slice(int(first[a]), int(first[b - 1]) + 1)) for a, b in bounds]
    return [(cores[:, None], np.stack(arrays) if stacked is None else stacked)]
