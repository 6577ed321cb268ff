"""The static schedule: the order in which the emulator runs a program's instructions, and the proof that every
read is initialized.

Programs are straight-line per core, so the interleaving is fixed: each core runs until it reaches a barrier;
a barrier releases when all its members wait on it, and the ring sends and reduce-sums pending among the
members complete at that moment (a :class:`Sync` step). Deadlocks and mismatched collectives are load errors.
Over that order, one bit per 128-byte stick of every scratchpad and of device memory records what has been
written: a read of bytes never written, or an output the program does not fully write, is a load error.

The steps (:class:`Ins` and :class:`Sync`) are what the loader builds, the emulator runs
(:mod:`.emulator`) and the cycle model times (:mod:`.cycles`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .binary import BinaryFormatError, Program
from .formats import STICK_BYTES
from .isa import ROOT_ALL, Op, tile_pitch

__all__ = ["Ins", "Sync", "schedule", "sticks", "bits", "EMPTY"]


@dataclasses.dataclass(eq=False, slots=True)
class Ins:
    """One validated instruction with everything later stages need: the raw record, the stick indices it
    reads and writes (own scratchpad and device memory), and cost facts for the cycle model."""

    core: int
    idx: int
    op: Op
    rec: np.void
    name: str
    loc: str
    sp_reads: np.ndarray
    sp_writes: np.ndarray
    dev_reads: np.ndarray
    dev_writes: np.ndarray
    nbytes: int = 0            # DMA / ring / host bytes moved
    macs: int = 0              # PT multiply-accumulates (padded to the PT array)
    useful_macs: int = 0       # M*N*K as written
    pt_fmt: str = ""
    elems: int = 0             # SFU elements
    sfu_class: str = "simple"
    peer_sticks: np.ndarray | None = None   # RING_SEND: sticks written on each destination core
    sp_end: int = 0            # highest scratchpad byte touched on this core (+1)
    # Decoded operands, one of these per opcode; tiles are (addr, rows, cols, Format).
    dma: tuple | None = None       # (dev, (dev strides), sp, (sp strides), (m, n, k))
    mm: tuple | None = None        # (flags, A, B, C, out, bias, colscale, imm, int path)
    sfu: tuple | None = None       # (SfuFn, Bcast, swap, dst, src0, src1, imm)
    red: tuple | None = None       # (ReduceFn, dst, src)
    send: tuple | None = None      # ((destination cores), dst addr, src addr, bytes)
    reduce: tuple | None = None    # (mask, root, dst, src)
    host: tuple | None = None      # (op, input buffers, output buffers, attrs)
    restick: tuple | None = None   # (src addr, dst addr, (m, n, k), Format, src bytes, dst bytes)
    gather: tuple | None = None    # (table addr, row stride, dst addr, indices addr, index Format, m, n, k)

    @property
    def label(self) -> str:
        return f"core {self.core} instruction {self.idx} ({self.name}{' at ' + self.loc if self.loc else ''})"


EMPTY = np.zeros(0, dtype=np.int64)


def sticks(lo: int, hi: int) -> np.ndarray:
    """Indices of the 128-byte sticks that bytes [lo, hi) touch."""
    return np.arange(lo // STICK_BYTES, -(-hi // STICK_BYTES), dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def bits(mask: int) -> tuple[int, ...]:
    """The cores of a core mask, in index order (a program uses a few masks many times: remembered)."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


@dataclasses.dataclass
class Sync:
    """A barrier release: ``members`` meet; ring sends and reduce groups pending among them complete."""

    members: tuple[int, ...]
    barriers: list[Ins]
    sends: list[Ins]
    reduces: list[list[Ins]]     # each: the matched RING_REDUCE of every group member, in core order


def _uninit(mask: np.ndarray, idx: np.ndarray) -> int | None:
    if idx.size == 0:
        return None
    got = mask[idx]
    return None if got.all() else int(idx[np.argmin(got)])


class _Unproven(Exception):
    """A round's proof at once (:meth:`_Races.round`) found a possible fault."""


def schedule(prog: Program, streams: list[list[Ins]], sp_sticks: int, dev_sticks: int) -> list:
    """Order all instructions as the emulator runs them, prove every read initialized and every device-memory
    access ordered (:class:`_Races`). The device-memory proofs run a round at a time (every core's run up to
    its next barrier: :meth:`_Races.round`); where one fails, or anything else does, the schedule is proven
    again an instruction at a time, which names the first fault."""
    try:
        return _schedule(prog, streams, sp_sticks, dev_sticks, by_round=True)
    except (_Unproven, BinaryFormatError):
        return _schedule(prog, streams, sp_sticks, dev_sticks, by_round=False)


def _schedule(prog: Program, streams: list[list[Ins]], sp_sticks: int, dev_sticks: int, by_round: bool) -> list:
    C = prog.num_cores
    races = _Races(C, dev_sticks)
    sp_init = [np.zeros(sp_sticks, dtype=bool) for _ in range(C)]
    dev_init = np.zeros(dev_sticks, dtype=bool)
    for b in prog.buffers:
        if b.kind in ("input", "constant", "state"):     # state: zero at load, then what the last call left
            dev_init[b.addr // STICK_BYTES:(b.addr + b.nbytes) // STICK_BYTES] = True
    pos, ended, waiting = [0] * C, [False] * C, {}
    # Where each core's runs end: its barriers, then its END (the loader checked that the stream ends so).
    stops = [[i for i, ins in enumerate(s) if ins.op is Op.BARRIER or ins.op is Op.END] for s in streams]
    nxt = [0] * C
    sends = [[] for _ in range(C)]
    reds = [[] for _ in range(C)]
    steps: list = []
    # Per core, the stick arrays whose sticks are all initialized there. Written bits are never cleared, and
    # the decoder hands one array to every instruction with the same operands (a loop's trips reuse its double
    # buffers): each array is tested or set once per core, not once per trip.
    done = [set() for _ in range(C)]
    landed: set = set()         # (sticks, cores) a ring send landed on so far (_release)
    # Device accesses (an instruction, or a round's: a list) and barrier releases, in order: for the proof run
    # backwards.
    accesses: list = []

    def check(ins: Ins):
        # Empty sets skip their numpy calls: most instructions touch only the scratchpad.
        ok = done[ins.core]
        r, w = ins.sp_reads, ins.sp_writes
        if r.size and id(r) not in ok:
            s = _uninit(sp_init[ins.core], r)
            if s is not None:
                raise BinaryFormatError(f"code {ins.label}: reads scratchpad bytes [{s * STICK_BYTES}, "
                                        f"{(s + 1) * STICK_BYTES}) that were never written")
            ok.add(id(r))
        if w.size and id(w) not in ok:
            sp_init[ins.core][w] = True
            ok.add(id(w))
        if not by_round and (ins.dev_reads.size or ins.dev_writes.size):
            s = _uninit(dev_init, ins.dev_reads)
            if s is not None:
                raise BinaryFormatError(f"code {ins.label}: reads device bytes [{s * STICK_BYTES}, "
                                        f"{(s + 1) * STICK_BYTES}) that were never written")
            dev_init[ins.dev_writes] = True
            races.access(ins)
            accesses.append(ins)

    while not all(ended):
        device = []
        for c in range(C):
            if ended[c] or c in waiting:
                continue
            stop = stops[c][nxt[c]]
            run = streams[c][pos[c]:stop]
            for ins in run:
                check(ins)
                if ins.op is Op.RING_SEND:
                    sends[c].append(ins)
                elif ins.op is Op.RING_REDUCE:
                    reds[c].append(ins)
            steps += run
            if by_round:
                device += [ins for ins in run if ins.dev_reads.size or ins.dev_writes.size]
            pos[c] = stop
            ins = streams[c][stop]
            if ins.op is Op.END:
                ended[c] = True
                if sends[c] or reds[c]:
                    p = (sends[c] + reds[c])[0]
                    raise BinaryFormatError(f"code {p.label}: ring transfer not followed by a barrier")
            else:
                waiting[c] = ins
                nxt[c] += 1
        if device:
            races.round(device, dev_init)
            accesses.append(device)
        released = False
        for c in sorted(waiting):
            if c not in waiting:
                continue
            mask = int(waiting[c].rec["mask"])
            members = bits(mask)
            if not all(m in waiting and int(waiting[m].rec["mask"]) == mask for m in members):
                continue
            steps.append(_release(members, waiting, sends, reds, sp_init, landed))
            races.sync(members)
            accesses.append(members)
            for m in members:
                pos[m] += 1
                del waiting[m]
            released = True
        if not released and not all(ended):
            c = min(waiting)
            ins = waiting[c]
            others = [m for m in bits(int(ins.rec["mask"])) if m not in waiting or
                      int(waiting[m].rec["mask"]) != int(ins.rec["mask"])]
            state = ", ".join(f"core {m} " + ("has ended" if ended[m] else
                                              f"waits at instruction {waiting[m].idx} with another mask"
                                              if m in waiting else "is running") for m in others)
            raise BinaryFormatError(f"code {ins.label}: deadlock: barrier mask 0x{int(ins.rec['mask']):x} "
                                    f"can never be met ({state})")
    backwards = _Races(C, dev_sticks, backwards=True)
    for a in reversed(accesses):
        if isinstance(a, Ins):
            backwards.access(a)
        elif isinstance(a, list):
            backwards.round(a)
        else:
            backwards.sync(a)
    for b in prog.buffers:
        if b.kind == "output":
            s = _uninit(dev_init, sticks(b.addr, b.addr + b.nbytes))
            if s is not None:
                raise BinaryFormatError(f"program: output '{b.name}' is not fully written (device bytes "
                                        f"[{s * STICK_BYTES}, {(s + 1) * STICK_BYTES}) never stored)")
    return steps


class _Races:
    """Proof that no two cores touch the same device-memory bytes unordered (a read of bytes another core
    writes, before or after it, or two writes, with no barrier between them), so the program's result does not
    depend on how the cores interleave (nor on which of the emulator's lanes, runtime/lanes.py, runs first).
    Vector clocks: ``clock[c, w]`` is the last barrier interval of core ``w`` that core ``c``
    has met since; a write records its core and that core's interval, and a later access by another core is
    ordered after it only when that core has met the writer at a barrier since."""

    def __init__(self, cores: int, dev_sticks: int, backwards: bool = False):
        # ``backwards``: fed the schedule in reverse, it proves reads ordered before other cores' later writes
        # (a read then another core's write is, reversed, a write then a read); writes alone were proven forwards.
        self.backwards = backwards
        self.alone = cores == 1           # one core: nothing to order, nothing to prove (and no per-stick state)
        self.clock = np.full((cores, cores), -1, dtype=np.int64)
        np.fill_diagonal(self.clock, 0)
        n = 0 if self.alone else dev_sticks
        self.writer = np.full(n, -1, dtype=np.int64)
        self.interval = np.zeros(n, dtype=np.int64)
        self.index = np.zeros(n, dtype=np.int64)
        self.owner = np.full(n, -1, dtype=np.int32)     # scratch of round(): -1 between uses

    def access(self, ins: Ins) -> None:
        if self.alone:
            return
        c = ins.core
        for what, st in (("reads", ins.dev_reads), ("writes", ins.dev_writes))[:1 if self.backwards else 2]:
            if not st.size:
                continue
            w = self.writer[st]
            if w.max() < 0:         # bytes no core wrote (inputs, constants): nothing to order
                continue
            bad = (w >= 0) & (w != c)
            if bad.any():
                bad &= self.clock[c, np.where(bad, w, 0)] < self.interval[st]
            if bad.any():
                s = int(st[np.argmax(bad)])
                raise BinaryFormatError(
                    f"code {ins.label}: {what} device bytes [{s * STICK_BYTES}, {(s + 1) * STICK_BYTES}) that "
                    f"core {int(self.writer[s])} {'later ' if self.backwards else ''}writes (instruction "
                    f"{int(self.index[s])}) with no barrier between them: the result would depend on how the "
                    f"cores interleave")
        if ins.dev_writes.size:
            self.writer[ins.dev_writes] = c
            self.interval[ins.dev_writes] = self.clock[c, c]
            self.index[ins.dev_writes] = ins.idx

    def round(self, devs: list[Ins], dev_init: np.ndarray | None = None) -> None:
        """The device accesses of one round at once: ``devs``, every core's run up to its next barrier, in the
        schedule's order (no barrier releases within it, so each core's clock is fixed). Raises
        :class:`_Unproven` where :meth:`access` (and, given ``dev_init``, the check that each read's bytes
        were written before it) one by one might raise. A stick one core writes and another accesses in the
        same round is a race whichever runs first; otherwise each access sees the state at the round's start
        but for its own core's writes, which cannot make a race of it."""
        if self.alone and dev_init is None:
            return
        nr = np.array([i.dev_reads.size for i in devs])
        nw = np.array([i.dev_writes.size for i in devs])
        rs = np.concatenate([i.dev_reads for i in devs])
        ws = np.concatenate([i.dev_writes for i in devs])
        if dev_init is not None and not dev_init[rs].all():
            # Bytes this round writes before it reads them (its own core's: another core's would race).
            miss = np.flatnonzero(~dev_init[rs])
            if not ws.size:
                raise _Unproven
            written, first = np.unique(ws, return_index=True)      # each stick's first write
            j = np.minimum(np.searchsorted(written, rs[miss]), written.size - 1)
            at = np.arange(len(devs))
            if not ((written[j] == rs[miss]) & (np.repeat(at, nw)[first[j]] < np.repeat(at, nr)[miss])).all():
                raise _Unproven
        if self.alone:
            # A 1-core 4096^3 matmul reads 34M device sticks in one round: only the reads' initialization counts.
            dev_init[ws] = True
            return
        core = np.array([i.core for i in devs], dtype=np.int64)
        rc, wc = np.repeat(core, nr), np.repeat(core, nw)
        if ws.size:
            owner = self.owner
            owner[ws] = wc
            clash = (owner[ws] != wc).any() or ((owner[rs] >= 0) & (owner[rs] != rc)).any()
            owner[ws] = -1
            if clash:
                raise _Unproven
        st, c = (rs, rc) if self.backwards else (np.concatenate([rs, ws]), np.concatenate([rc, wc]))
        w = self.writer[st]
        other = np.flatnonzero((w >= 0) & (w != c))
        if other.size and (self.clock[c[other], w[other]] < self.interval[st[other]]).any():
            raise _Unproven
        if ws.size:
            if dev_init is not None:
                dev_init[ws] = True
            self.writer[ws] = wc
            self.interval[ws] = self.clock[wc, wc]
            self.index[ws] = np.repeat([i.idx for i in devs], nw)

    def sync(self, members) -> None:
        merged = self.clock[list(members)].max(axis=0)
        for m in members:
            self.clock[m] = merged
        for m in members:
            self.clock[m, m] += 1


def _release(members, waiting, sends, reds, sp_init, landed: set) -> Sync:
    """Complete the ring transfers pending among ``members`` as their barrier releases (``landed``: the
    (sticks, destination cores) of the sends landed so far, whose bits are set already)."""
    group = set(members)
    done_sends = []
    for m in members:
        for s in sends[m]:
            peers = s.send[0]
            if not group.issuperset(peers):
                peer = next(p for p in peers if p not in group)
                raise BinaryFormatError(f"code {s.label}: destination core {peer} is not in the next "
                                        f"barrier of core {m}")
            # A loop's sends land on the same sticks of the same cores again and again: set once.
            if (id(s.peer_sticks), peers) not in landed:
                for peer in peers:
                    sp_init[peer][s.peer_sticks] = True
                landed.add((id(s.peer_sticks), peers))
            done_sends.append(s)
        sends[m] = []
    done_reds = []
    while any(reds[m] for m in members):
        first = next(reds[m][0] for m in members if reds[m])
        mask, root, dst, src = first.reduce
        grp = bits(mask)
        if not set(grp) <= group:
            raise BinaryFormatError(f"code {first.label}: group 0x{mask:x} is not inside the barrier it "
                                    f"completes at (cores {sorted(group)})")
        matched = []
        for g in grp:
            cand = next((r for r in reds[g] if r.reduce[0] == mask), None)
            if cand is None:
                raise BinaryFormatError(f"code {first.label}: core {g} of group 0x{mask:x} issued no matching "
                                        f"ring_reduce before this barrier")
            if (cand.reduce[1], cand.reduce[2], cand.reduce[3]) != (root, dst, src):
                raise BinaryFormatError(f"code {cand.label}: ring_reduce fields differ from {first.label}")
            reds[g].remove(cand)
            matched.append(cand)
        receivers = grp if root == ROOT_ALL else [root]
        st = sticks(dst[0], dst[0] + dst[1] * tile_pitch(dst[2], dst[3]))
        for r in receivers:
            sp_init[r][st] = True
        done_reds.append(matched)
    return Sync(tuple(members), [waiting[m] for m in members], done_sends, done_reds)

