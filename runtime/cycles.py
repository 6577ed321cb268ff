"""Cycle model: how long the program would take on the target, per core and per unit.

The model is static (programs are straight-line), so it runs once at load over the same schedule the
emulator executes. Each core has independent units — DMA, PT, SFU, RING, HOST — that each work through
their instructions in program order; units of one core run concurrently, which is where DMA/compute
overlap comes from. An instruction starts when its unit is free and when the scratchpad sticks it touches
are ready (read-after-write, write-after-read and write-after-write, tracked per 128-byte stick). Device
memory needs no tracking of its own: a core's DMA unit is in order, other cores are ordered only by
barriers (a barrier starts every unit of its members when the last member's units drain, plus a fixed
latency; ring transfers land at that barrier), and a HOST op fences its core's units.

Durations (cycles), from the target file; fixed latencies are [assumed] model constants below:

* DMA: bytes / (DRAM bandwidth / cores doing DMA in the same barrier segment) + DMA_LATENCY. Bandwidth is
  the read, write or mixed figure depending on what that segment moves.
* PT: M and N padded to the PT array (pt_rows x pt_cols) times K, over ``macs_per_cycle(format)`` (the
  slower input format), + PT_LATENCY.
* SFU: elements x ``sfu_cycles(class)`` / SFU lanes per core, + SFU_LATENCY; row reductions are "simple".
* RING: bytes / ring_bytes_per_cycle + hops (send) or group size - 1 (reduce) x HOP_LATENCY.
* HOST: bytes / host link bandwidth + HOST_LATENCY (the data goes to the host and back).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .formats import STICK_BYTES
from .isa import ROOT_ALL, Op, tile_pitch

__all__ = ["Profile", "Event", "UNITS", "model_program"]

UNITS = ("DMA", "PT", "SFU", "RING", "HOST")
_UNIT = {Op.DMA_LOAD: 0, Op.DMA_STORE: 0, Op.MATMUL: 1, Op.SFU: 2, Op.REDUCE: 2, Op.RING_SEND: 3,
         Op.RING_REDUCE: 3, Op.HOST: 4}

# [assumed] fixed latencies in cycles: nothing public; small next to the bandwidth terms for real tiles.
DMA_LATENCY = 64
PT_LATENCY = 16
SFU_LATENCY = 8
HOP_LATENCY = 4
BARRIER_LATENCY = 32
HOST_LATENCY = 10_000


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
        }


def _max_at(arr: np.ndarray, idx: np.ndarray) -> float:
    return float(arr[idx].max()) if idx.size else 0.0


def model_program(prog, target, steps) -> Profile:
    """Run the cycle model over the loader's schedule (a list of Ins and Sync steps)."""
    from .loader import Sync   # the step types live with the scheduler

    C = prog.num_cores
    per_cycle = 1.0 / target.clock_ghz        # GB/s -> bytes/cycle is gbps * per_cycle
    # Which cores move data in each barrier segment, and in which directions: they share DRAM bandwidth.
    seg_cores: list[set] = [set()]
    seg_dirs: list[set] = [set()]
    for s in steps:
        if isinstance(s, Sync):
            seg_cores.append(set())
            seg_dirs.append(set())
        elif s.op in (Op.DMA_LOAD, Op.DMA_STORE):
            seg_cores[-1].add(s.core)
            seg_dirs[-1].add(s.op)
    seg_bw = []
    for cores, dirs in zip(seg_cores, seg_dirs):
        gbps = (target.dram_mixed_gbps if len(dirs) == 2 else
                target.dram_write_gbps if Op.DMA_STORE in dirs else target.dram_read_gbps)
        seg_bw.append(gbps * per_cycle / max(1, len(cores)))
    lanes = target.sfu_lanes_per_core

    def duration(ins, seg) -> float:
        op = ins.op
        if op in (Op.DMA_LOAD, Op.DMA_STORE):
            return ins.nbytes / seg_bw[seg] + DMA_LATENCY
        if op is Op.MATMUL:
            return ins.macs / target.macs_per_cycle(ins.pt_fmt) + PT_LATENCY
        if op is Op.SFU:
            return ins.elems * target.sfu_cycles(ins.sfu_class) / lanes + SFU_LATENCY
        if op is Op.REDUCE:
            return ins.elems * target.sfu_cycles("simple") / lanes + SFU_LATENCY
        if op is Op.RING_SEND:
            d = abs(ins.send[0] - ins.core)
            return ins.nbytes / target.ring_bytes_per_cycle + min(d, C - d) * HOP_LATENCY
        if op is Op.RING_REDUCE:
            return ins.nbytes / target.ring_bytes_per_cycle + (bin(ins.reduce[0]).count("1") - 1) * HOP_LATENCY
        return ins.nbytes / (target.host_link_gbps * per_cycle) + HOST_LATENCY

    nst = -(-target.scratchpad_usable_bytes // STICK_BYTES)
    free = np.zeros((C, len(UNITS)))
    busy = np.zeros((C, len(UNITS)))
    spw = np.zeros((C, nst))
    spr = np.zeros((C, nst))
    events = []
    totals = dict(rd=0, wr=0, ring=0, host=0, macs=0, pmacs=0, sfu=0)
    seg = 0
    for s in steps:
        if isinstance(s, Sync):
            t = free[list(s.members)].max() + BARRIER_LATENCY
            free[list(s.members)] = t
            for snd in s.sends:
                spw[snd.send[0], snd.peer_sticks] = t
            for grp in s.reduces:
                mask, root, dst, _ = grp[0].reduce
                st = np.arange(dst[0] // STICK_BYTES, (dst[0] + dst[1] * tile_pitch(dst[2], dst[3])) // STICK_BYTES)
                for r in ([i for i in range(C) if mask >> i & 1] if root == ROOT_ALL else [root]):
                    spw[r, st] = t
            seg += 1
            continue
        c, u = s.core, _UNIT[s.op]
        start = max(free[c, u], _max_at(spw[c], s.sp_reads), _max_at(spw[c], s.sp_writes),
                    _max_at(spr[c], s.sp_writes))
        if s.op is Op.HOST:                 # a fence: waits for the core's units, DMA waits for it
            start = max(start, free[c].max())
        dur = duration(s, seg)
        end = start + dur
        free[c, u] = end
        if s.op is Op.HOST:
            free[c, 0] = max(free[c, 0], end)
        busy[c, u] += dur
        if s.sp_writes.size:
            spw[c, s.sp_writes] = end
        if s.sp_reads.size:
            spr[c, s.sp_reads] = np.maximum(spr[c, s.sp_reads], end)
        events.append(Event(c, UNITS[u], s.name, start, end, s.idx, s.loc))
        if s.op is Op.DMA_LOAD:
            totals["rd"] += s.nbytes
        elif s.op is Op.DMA_STORE:
            totals["wr"] += s.nbytes
        elif s.op in (Op.RING_SEND, Op.RING_REDUCE):
            totals["ring"] += s.nbytes
        elif s.op is Op.HOST:
            totals["host"] += s.nbytes
        elif s.op is Op.MATMUL:
            totals["macs"] += s.useful_macs
            totals["pmacs"] += s.macs
        else:
            totals["sfu"] += s.elems
    return Profile(
        target=target.name, num_cores=C, clock_ghz=target.clock_ghz, cycles=float(free.max()),
        busy=tuple(tuple(float(x) for x in row) for row in busy), dram_read_bytes=totals["rd"],
        dram_write_bytes=totals["wr"], ring_bytes=totals["ring"], host_bytes=totals["host"],
        pt_macs=totals["macs"], pt_padded_macs=totals["pmacs"], sfu_elements=totals["sfu"],
        peak_flops=2.0 * target.macs_per_cycle("dlf16") * C * target.clock_ghz * 1e9,
        dram_bytes_per_s=target.dram_read_gbps * 1e9, events=tuple(events))
