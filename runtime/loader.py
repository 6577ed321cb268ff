"""Load a .spyre file: validate everything, prepare once, then run with only data movement and compute.

``load(path)`` does all the work that does not depend on input data, once:

1. container and metadata checks (:mod:`.binary`), target fingerprint, memory sizes;
2. every instruction's opcode and fields (unused fields zero, formats known, tiles inside the usable
   scratchpad, DMA ranges inside one allocated device buffer, ...), with errors naming core, instruction
   index, op, source location and field;
3. a static schedule (:mod:`.schedule`): cores advance in lock-step segments between barriers; ring transfers
   and reduce-sums complete at the next common barrier. Deadlocks and mismatched collectives are load errors;
4. initialization tracking over that schedule (one bit per 128-byte stick of every scratchpad and of device
   memory): a read of bytes never written, and an output the program does not fully write, are load
   errors. Programs are straight-line, so this static proof covers every run;
5. the execution plan (numpy views and closures, see :mod:`.emulator`) and the cycle model (:mod:`.cycles`).

Calling the :class:`Executable` then writes the inputs, walks the plan and decodes the outputs.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import operator
import os
import threading
import time
import warnings
import weakref

import numpy as np

from spyre_mlir.errors import SpyreError

from . import lanes, native
from .binary import BinaryFormatError, Buffer, Program, code_digest, is_system, program_from_bytes
from .collector import collector_paused
from .cycles import Profile, model_program
from .emulator import (INT_RANGE, NUMERICS, Machine, Memory, SpyreRuntimeError, TileView, lane_splits,
                       one_blas_thread, segments)
from .formats import STICK_BYTES, Format
from .hostjit import HostCode, HostCodeError, host_dtype
from .hostops import HostOpError, check_host_op
from .isa import (ALL_FIELDS, FIELDS, INSTR_DTYPE, PT_FORMATS, ROOT_ALL, SFU_BCAST_MASK, SFU_BINARY, SFU_CLASS,
                  SFU_SWAP, Bcast, MatmulFlag, Op, ReduceFn, SfuFn, tile_pitch)
from .schedule import EMPTY, Ins, bits, schedule, sticks

__all__ = ["load", "load_bytes", "Executable", "Bundle", "Ins", "InputError", "DEFAULT_MAX_DEVICE_BYTES"]

# The emulator allocates device memory for real; refuse programs that would need more than this on the host
# (override with SPYRE_EMU_MAX_DEVICE_BYTES). The target's own DRAM size is checked as well.
DEFAULT_MAX_DEVICE_BYTES = 4 << 30
MAX_TILE_DIM = 1 << 20


_OPS = {int(op): op for op in Op}
_NAMES = {op: op.name.lower() for op in Op}
_FIELD_NAMES = INSTR_DTYPE.names
_FORMATS = {int(f): f for f in Format}
_MM_ACC, _MM_OUT, _MM_BIAS, _MM_SCALE, _MM_COLSCALE, _MM_WINDOW, _MM_TRANS_B = (int(f) for f in (
    MatmulFlag.ACC, MatmulFlag.OUT, MatmulFlag.BIAS, MatmulFlag.SCALE, MatmulFlag.COLSCALE, MatmulFlag.WINDOW,
    MatmulFlag.TRANS_B))
_MM_ALL = sum(int(f) for f in MatmulFlag)
_MM_FLAGS = {v: MatmulFlag(v) for v in range(_MM_ALL + 1)}
_SFU_FNS = {int(f): f for f in SfuFn}
_BCASTS = {int(b): b for b in Bcast}
_UNUSED = {op: tuple(f for f in ALL_FIELDS if f not in FIELDS[op]) for op in Op}


def _block_sticks(base: int, m: int, n: int, ks: int, s2: int, s1: int) -> np.ndarray:
    """The sticks of an (outer, rows, sticks) strided block starting at stick ``base`` (strides in sticks), in
    transfer order; one ``arange`` when the block is dense, as most are."""
    if (n == 1 or s1 == ks) and (m == 1 or s2 == n * ks):
        return np.arange(base, base + m * n * ks, dtype=np.int64)
    if m == 1:
        return (np.arange(n, dtype=np.int64)[:, None] * s1 + np.arange(base, base + ks, dtype=np.int64)).ravel()
    return (np.arange(m, dtype=np.int64)[:, None, None] * s2 + np.arange(n, dtype=np.int64)[None, :, None] * s1
            + np.arange(ks, dtype=np.int64)[None, None, :]).ravel() + base


class InputError(SpyreError, ValueError):
    """Inputs given to an Executable do not match the program (missing, unknown, wrong shape or type)."""


# Opcodes whose checks and decoded operands do not depend on the issuing core: the identical records of an SPMD
# program (the same tile operation on every core) are checked and decoded once, then copied to each core's place.
# A record of any other opcode is decoded once per core (a barrier, the same ring send in several loop trips).
_CORE_FREE = frozenset({Op.SFU, Op.MATMUL, Op.REDUCE, Op.DMA_LOAD, Op.DMA_STORE})


# An Ins's fields after (core, idx, op, rec, name, loc): what decoding a record gives.
_DECODED = operator.attrgetter(*[f.name for f in dataclasses.fields(Ins)][6:])
_DMA = frozenset({Op.DMA_LOAD, Op.DMA_STORE})
_DEV = _FIELD_NAMES.index("dev")


class _Decoder:
    """Validates records of one program against a target and turns them into :class:`Ins`."""

    def __init__(self, prog: Program, target):
        self.prog, self.target = prog, target
        self.usable = target.scratchpad_usable_bytes
        self._pt_fmts: dict = {}
        self._decoded: dict = {}        # record values (with the core, unless _CORE_FREE) -> its Ins
        self._moved: dict = {}          # a DMA's record values but its device address -> a decoded Ins of them
        self._sp_blocks: dict = {}      # a DMA's scratchpad block (address, counts, strides) -> its sticks
        # Containment queries for DMA ranges. Non-scratch buffers are disjoint: binary search. Scratch buffers
        # may alias each other: sorted by start with a running maximum of their ends.
        fixed = sorted((b.addr, b.addr + b.nbytes, i) for i, b in enumerate(prog.buffers) if b.kind != "scratch")
        self.fixed_starts = [f[0] for f in fixed]
        self.fixed = [(f[1], prog.buffers[f[2]]) for f in fixed]
        scratch = sorted((b.addr, b.addr + b.nbytes, i) for i, b in enumerate(prog.buffers) if b.kind == "scratch")
        self.scratch_starts = [f[0] for f in scratch]
        self.scratch_best: list[tuple[int, Buffer]] = []        # (max end so far, the buffer reaching it)
        for start, end, i in scratch:
            prev = self.scratch_best[-1] if self.scratch_best else (-1, None)
            self.scratch_best.append((end, prog.buffers[i]) if end > prev[0] else prev)

    def fail(self, field: str, msg: str):
        """Reject the current instruction, naming it and the field."""
        c, i, name, loc = self.at
        rec = f", record {self.prog.origin[c][i]}" if self.prog.origin and self.prog.origin[c][i] != i else ""
        raise BinaryFormatError(f"code core {c} instruction {i}{rec} ({name}{' at ' + loc if loc else ''}): "
                                f"field {field!r}: {msg}")

    def decode(self, c: int, i: int, rec: np.void, vals: tuple, fields_checked: bool = False) -> Ins:
        """Check instruction ``i`` of core ``c`` and decode it; ``vals`` is the record as plain Python values
        (in record order, read a column at a time: fast field reads); ``fields_checked``: the fields its opcode
        does not use are known to be zero (:func:`_unused_fields_zero`)."""
        loc = self.prog.debug[c][i][1] if self.prog.debug else ""
        op = _OPS.get(vals[0])
        if op is None:
            raise BinaryFormatError(f"code core {c} instruction {i}: field 'op': unknown opcode {vals[0]}")
        key = vals if op in _CORE_FREE else (c, vals)
        seen = self._decoded.get(key)
        if seen is not None:            # the same record passed every check already
            return Ins(c, i, op, rec, seen.name, loc, *_DECODED(seen))     # a shallow copy in its own place
        name = _NAMES[op]
        self.at = (c, i, name, loc)
        if op in _DMA:
            # A loop's trips move a DMA's device address only: checked and decoded once, then moved.
            where = vals[:_DEV] + vals[_DEV + 1:]
            like = self._moved.get(where)
            if like is not None:
                ins = self._dma_moved(Ins(c, i, op, rec, name, loc, *_DECODED(like)), vals[_DEV])
                self._decoded[key] = ins
                return ins
        ins = Ins(c, i, op, rec, name, loc, EMPTY, EMPTY, EMPTY, EMPTY)
        self.vals = dict(zip(_FIELD_NAMES, vals))
        if not fields_checked:
            for f in _UNUSED[op]:
                if self.vals[f] != 0:
                    self.fail(f, f"must be zero for {name} (is {self.vals[f]})")
        getattr(self, "_" + name)(ins)
        self._decoded[key] = ins
        if op in _DMA:
            self._moved[where] = ins
        return ins

    def _dma_moved(self, ins: Ins, dev: int) -> Ins:
        """``ins``, a copy of a checked DMA of the same fields but its device address, at ``dev``: the checks of
        :meth:`_dma` that read the address, in its order (every other one passed for the copy's original), and its
        device sticks moved along."""
        d0, dstr, sp, sstr, shape = ins.dma
        if dev % STICK_BYTES:
            self.fail("dev", f"{dev} is not a multiple of the {STICK_BYTES}-byte stick")
        store = ins.op is Op.DMA_STORE
        self._device_side(dev, dstr, shape, store)
        moved = (dev - d0) // STICK_BYTES
        if store:
            ins.dev_writes = ins.dev_writes + moved
        else:
            ins.dev_reads = ins.dev_reads + moved
        ins.dma = (dev, dstr, sp, sstr, shape)
        return ins

    # ---- field helpers ----------------------------------------------------------------------------------

    def u(self, f: str) -> int:
        return self.vals[f]

    def fmt(self, f: str, allowed=None) -> Format:
        code = self.u(f)
        fmt = _FORMATS.get(code)
        if fmt is None:
            self.fail(f, f"unknown format code {code}")
        if not fmt.on_device or (allowed is not None and fmt not in allowed):
            self.fail(f, f"format {fmt.key} is not allowed here")
        return fmt

    def tile(self, ins: Ins, fa: str, rows: int, cols: int, ff: str, allowed=None) -> tuple:
        fmt = self.fmt(ff, allowed)
        addr = self.u(fa)
        if not (1 <= rows <= MAX_TILE_DIM and 1 <= cols <= MAX_TILE_DIM):
            self.fail(fa, f"tile shape [{rows}, {cols}] out of range 1..{MAX_TILE_DIM}")
        if addr % STICK_BYTES:
            self.fail(fa, f"scratchpad address {addr} is not stick ({STICK_BYTES} B) aligned")
        end = addr + rows * tile_pitch(cols, fmt)
        if end > self.usable:
            self.fail(fa, f"tile [{addr}, {end}) exceeds the usable scratchpad ({self.usable} B)")
        ins.sp_end = max(ins.sp_end, end)
        return addr, rows, cols, fmt

    def pt_fmt(self, fa: Format, fb: Format) -> str:
        """The operand format the PT array multiplies more slowly (it sets a mixed matmul's rate), by key."""
        key = (fa, fb)
        if key not in self._pt_fmts:
            self._pt_fmts[key] = max((fa, fb), key=lambda f: -self.target.macs_per_cycle(f.key)).key
        return self._pt_fmts[key]

    def sticks_of(self, t: tuple) -> np.ndarray:
        addr, rows, cols, fmt = t
        return sticks(addr, addr + rows * tile_pitch(cols, fmt))

    def _containing(self, lo: int, hi: int) -> Buffer | None:
        """A buffer holding all of [lo, hi), if any."""
        j = bisect.bisect_right(self.fixed_starts, lo) - 1
        if j >= 0 and self.fixed[j][0] >= hi:
            return self.fixed[j][1]
        j = bisect.bisect_right(self.scratch_starts, lo) - 1
        if j >= 0 and self.scratch_best[j][0] >= hi:
            return self.scratch_best[j][1]
        return None

    def cores_mask(self, f: str, core: int) -> int:
        mask = self.u(f)
        n = self.prog.num_cores
        if mask >> n or not mask >> core & 1:
            self.fail(f, f"core mask 0x{mask:x} must include core {core} and only cores < {n}")
        return mask

    # ---- opcodes ----------------------------------------------------------------------------------------

    def _end(self, ins):
        pass

    def _loop(self, ins):
        self.fail("op", "a stored LOOP record: program_from_bytes unrolls loops (runtime.loops), a Program's code "
                        "holds instructions as they run")

    _step = _loop

    def _barrier(self, ins):
        self.cores_mask("mask", ins.core)

    def _dma(self, ins, store: bool):
        m, n, k = self.u("m"), self.u("n"), self.u("k")
        dev, sp = self.u("dev"), self.u("a0")
        ds2, ds1, ss2, ss1 = self.u("a1"), self.u("a2"), self.u("a3"), self.u("a4")
        for f, v in (("m", m), ("n", n)):
            if v < 1:
                self.fail(f, "count must be >= 1")
        if k < STICK_BYTES or k % STICK_BYTES:
            self.fail("k", f"row bytes {k} must be a positive multiple of {STICK_BYTES}")
        for f, v in (("dev", dev), ("a0", sp), ("a1", ds2), ("a2", ds1), ("a3", ss2), ("a4", ss1)):
            if v % STICK_BYTES:
                self.fail(f, f"{v} is not a multiple of the {STICK_BYTES}-byte stick")
        # The scratchpad side (and the device side of a store) must not overlap itself: this bounds the
        # transfer by the scratchpad size and makes every write well defined. Either the blocks are disjoint
        # ranges, or the rows of the blocks interleave (the nest read the other way round: row r of every block
        # before row r + 1 of any; a conv tile held in (row, filter) order stored to (filter, row) rows).
        sides = [("a3", "a4", ss2, ss1)] + ([("a1", "a2", ds2, ds1)] if store else [])
        for f2, f1, s2, s1 in sides:
            if (m > 1 and n > 1 and s2 >= k and s1 >= (m - 1) * s2 + k):
                continue
            if n > 1 and s1 < k:
                self.fail(f1, f"row stride {s1} < row bytes {k}: rows overlap")
            if m > 1 and s2 < (n - 1) * s1 + k:
                self.fail(f2, f"outer stride {s2} overlaps the previous block")
        sp_end = sp + (m - 1) * ss2 + (n - 1) * ss1 + k
        if sp_end > self.usable:
            self.fail("a0", f"scratchpad range [{sp}, {sp_end}) exceeds the usable scratchpad "
                                    f"({self.usable} B)")
        self._device_side(dev, (ds2, ds1), (m, n, k), store)
        S = STICK_BYTES
        # One array per scratchpad block: a loop's trips load into the same buffers (the schedule tests each
        # array once per core).
        key = (sp, m, n, k, ss2, ss1)
        rel = self._sp_blocks.get(key)
        if rel is None:
            rel = self._sp_blocks[key] = _block_sticks(sp // S, m, n, k // S, ss2 // S, ss1 // S)
        drel = _block_sticks(dev // S, m, n, k // S, ds2 // S, ds1 // S)
        if store:
            ins.sp_reads, ins.dev_writes = rel, drel
        else:
            # Rows that step up past each other are already sorted and distinct (the common case).
            increasing = (n == 1 or ds1 >= k) and (m == 1 or ds2 >= (n - 1) * ds1 + k)
            ins.sp_writes, ins.dev_reads = rel, drel if increasing else np.unique(drel)
        ins.nbytes = m * n * k
        ins.sp_end = sp_end
        ins.dma = (dev, (ds2, ds1), sp, (ss2, ss1), (m, n, k))

    def _device_side(self, dev: int, strides, shape, store: bool) -> None:
        """The checks of a DMA's device range: inside device memory and one allocated buffer, within what a core
        addresses, and a store's buffer writable."""
        if dev >= self.prog.device_bytes:
            self.fail("dev", f"address {dev} is outside device memory ({self.prog.device_bytes} B)")
        (m, n, k), (ds2, ds1) = shape, strides
        dev_end = dev + (m - 1) * ds2 + (n - 1) * ds1 + k
        buf = self._containing(dev, dev_end)
        if buf is None:
            self.fail("dev", f"device range [{dev}, {dev_end}) is not inside one allocated buffer")
        if dev_end - dev > self.target.core_span_bytes:
            self.fail("dev", f"device range spans {dev_end - dev} B, more than a core addresses "
                             f"({self.target.core_span_bytes} B)")
        if store and buf.kind not in ("output", "scratch", "state"):
            self.fail("dev", f"stores into '{buf.name}', a read-only {buf.kind} buffer")

    def _dma_load(self, ins):
        self._dma(ins, store=False)

    def _dma_store(self, ins):
        self._dma(ins, store=True)

    def _matmul(self, ins):
        fl = self.u("flags")      # plain int bit tests: IntFlag's & is several times slower
        if fl & ~_MM_ALL:
            self.fail("flags", f"unknown bits 0x{fl:x}")
        m, n, k = self.u("m"), self.u("n"), self.u("k")
        a = self.tile(ins, "a0", m, k, "f0", PT_FORMATS)
        window = None
        if fl & _MM_WINDOW and fl & _MM_TRANS_B:
            self.fail("flags", "WINDOW and TRANS_B together (a window reads the columns of a [K, N] tile)")
        if fl & _MM_WINDOW:
            # B is read from the stored tile [k, mask] through a column window; every read is inside that tile.
            off, stride = self.u("dev"), self.u("fn")
            off = off - (1 << 64) if off >> 63 else off
            if stride < 1:
                self.fail("fn", "window stride must be >= 1")
            if not (1 <= n <= MAX_TILE_DIM) or abs(off) > MAX_TILE_DIM:
                self.fail("dev", f"window of {n} columns at offset {off} out of range")
            b = self.tile(ins, "a1", k, self.u("mask"), "f1", PT_FORMATS)
            window = (off, stride, n)
        else:
            for f in ("mask", "fn", "dev"):
                if self.u(f):
                    self.fail(f, "set but flag WINDOW is not")
            b = self.tile(ins, "a1", *((n, k) if fl & _MM_TRANS_B else (k, n)), "f1", PT_FORMATS)
        ints = not a[3].is_float and not b[3].is_float
        acc_fmt = Format.INT32 if ints else Format.FP32
        c = self.tile(ins, "a2", m, n, "f2", {acc_fmt})
        opt = {}
        for flag, fa, ff, shape in ((_MM_OUT, "a3", "f3", (m, n)), (_MM_BIAS, "a4", "f4", (1, n)),
                                    (_MM_COLSCALE, "a5", "f5", (1, n))):
            if fl & flag:
                opt[flag] = self.tile(ins, fa, *shape, ff)
            elif self.u(fa) or self.u(ff):
                self.fail(fa, f"set but flag {MatmulFlag(flag).name} is not")
        if (fl & (_MM_BIAS | _MM_SCALE | _MM_COLSCALE)) and not fl & _MM_OUT:
            self.fail("flags", "BIAS/SCALE/COLSCALE need OUT")
        imm = float(self.vals["imm"])
        if fl & _MM_SCALE and not np.isfinite(imm):
            self.fail("imm", f"scale {imm} is not finite")
        if not fl & _MM_SCALE and imm != 0:
            self.fail("imm", "set but flag SCALE is not")
        reads = [self.sticks_of(a), self.sticks_of(b)] + [self.sticks_of(t) for f, t in opt.items()
                                                          if f != _MM_OUT]
        if fl & _MM_ACC:
            reads.append(self.sticks_of(c))
        writes = [self.sticks_of(c)] + ([self.sticks_of(opt[_MM_OUT])] if _MM_OUT in opt else [])
        ins.sp_reads, ins.sp_writes = np.concatenate(reads), np.concatenate(writes)
        pr, pc = self.target.pt_rows, self.target.pt_cols
        ins.macs = (-(-m // pr) * pr) * (-(-n // pc) * pc) * k
        ins.useful_macs = m * n * k
        ins.pt_fmt = self.pt_fmt(a[3], b[3])
        ins.mm = (_MM_FLAGS[fl], a, b, c, opt.get(_MM_OUT), opt.get(_MM_BIAS), opt.get(_MM_COLSCALE), imm, ints,
                  window)

    def _sfu(self, ins):
        fn = _SFU_FNS.get(self.u("fn"))
        if fn is None:
            self.fail("fn", f"unknown SFU function {self.u('fn')}")
        flags = self.u("flags")
        if flags & ~(SFU_BCAST_MASK | SFU_SWAP):
            self.fail("flags", f"unknown bits 0x{flags:x}")
        mode = _BCASTS.get(flags & SFU_BCAST_MASK)
        if mode is None:
            self.fail("flags", f"unknown broadcast mode {flags & SFU_BCAST_MASK}")
        binary = fn in SFU_BINARY
        if not binary and flags:
            self.fail("flags", f"{fn.name} takes no broadcast or swap flags")
        if fn is SfuFn.SELECT and (mode is Bcast.IMM or flags & SFU_SWAP):
            self.fail("flags", "SELECT takes its true-value from a tile and cannot swap")
        m, n = self.u("m"), self.u("n")
        dst = self.tile(ins, "a0", m, n, "f0")
        reads = []
        src0 = None
        if fn is SfuFn.FILL:
            if self.u("a1") or self.u("f1"):
                self.fail("a1", "FILL has no source")
        else:
            src0 = self.tile(ins, "a1", m, n, "f1")
            reads.append(self.sticks_of(src0))
        src1 = None
        if binary and mode is not Bcast.IMM:
            shape = {Bcast.FULL: (m, n), Bcast.ROW: (m, 1), Bcast.COL: (1, n), Bcast.SCALAR: (1, 1)}[mode]
            src1 = self.tile(ins, "a2", *shape, "f2")
            reads.append(self.sticks_of(src1))
        elif self.u("a2") or self.u("f2"):
            self.fail("a2", "src1 given but the op takes no src1 tile")
        imm = float(self.vals["imm"])
        uses_imm = fn in (SfuFn.CAST, SfuFn.POWS, SfuFn.FILL, SfuFn.SELECT) or (binary and mode is Bcast.IMM)
        if np.isnan(imm) or (not uses_imm and imm != 0):
            self.fail("imm", f"{imm} is not a valid immediate for {fn.name}")
        ins.sp_reads = np.concatenate(reads) if reads else EMPTY
        ins.sp_writes = self.sticks_of(dst)
        ins.elems = m * n
        ins.sfu_class = SFU_CLASS[fn]
        ins.name = f"sfu.{fn.name.lower()}"
        ins.sfu = (fn, mode, bool(flags & SFU_SWAP), dst, src0, src1, imm)

    def _reduce(self, ins):
        try:
            fn = ReduceFn(self.u("fn"))
        except ValueError:
            self.fail("fn", f"unknown reduction {self.u('fn')}")
        m, n = self.u("m"), self.u("n")
        dst = self.tile(ins, "a0", m, 1, "f0")
        src = self.tile(ins, "a1", m, n, "f1")
        ins.sp_reads, ins.sp_writes = self.sticks_of(src), self.sticks_of(dst)
        ins.elems = m * n
        ins.name = f"reduce.{fn.name.lower()}"
        ins.red = (fn, dst, src)

    def _ring_send(self, ins):
        peer, mask, dst, src, k = self.u("core"), self.u("mask"), self.u("a0"), self.u("a1"), self.u("k")
        n = self.prog.num_cores
        if mask:
            if peer:
                self.fail("core", "must be zero when mask names the destinations")
            if mask >> n or mask >> ins.core & 1 or not mask & (mask - 1):
                self.fail("mask", f"destination mask 0x{mask:x} must name two or more cores < {n}, "
                                  f"not core {ins.core} itself")
            peers = tuple(bits(mask))
        elif peer >= n or peer == ins.core:
            self.fail("core", f"destination core {peer} must be another core < {n}")
        else:
            peers = (peer,)
        if k < STICK_BYTES or k % STICK_BYTES:
            self.fail("k", f"byte count {k} must be a positive multiple of {STICK_BYTES}")
        for f, a in (("a0", dst), ("a1", src)):
            if a % STICK_BYTES or a + k > self.usable:
                self.fail(f, f"range [{a}, {a + k}) is unaligned or exceeds the usable scratchpad")
        ins.sp_reads = sticks(src, src + k)
        ins.peer_sticks = sticks(dst, dst + k)
        ins.sp_end = src + k
        ins.nbytes = k * len(peers)            # what crosses the ring: a copy per destination
        ins.send = (peers, dst, src, k)

    def _ring_reduce(self, ins):
        mask = self.cores_mask("mask", ins.core)
        root = self.u("core")
        if root != ROOT_ALL and not mask >> root & 1:
            self.fail("core", f"root {root} is not in the group 0x{mask:x}")
        floats = {f for f in Format if f.is_float}
        m, n = self.u("m"), self.u("n")
        dst = self.tile(ins, "a0", m, n, "f0", floats)
        src = self.tile(ins, "a1", m, n, "f1", floats)
        ins.sp_reads = self.sticks_of(src)
        ins.nbytes = m * tile_pitch(n, src[3])
        ins.reduce = (mask, root, dst, src)

    def _device_range(self, f: str, lo: int, hi: int, write: bool) -> Buffer:
        """[lo, hi) of device memory: stick aligned, inside one allocated buffer (writable for ``write``)
        and inside a core's span."""
        if lo % STICK_BYTES:
            self.fail(f, f"device address {lo} is not stick ({STICK_BYTES} B) aligned")
        if hi > self.prog.device_bytes:
            self.fail(f, f"device range [{lo}, {hi}) is outside device memory ({self.prog.device_bytes} B)")
        buf = self._containing(lo, hi)
        if buf is None:
            self.fail(f, f"device range [{lo}, {hi}) is not inside one allocated buffer")
        if hi - lo > self.target.core_span_bytes:
            self.fail(f, f"device range spans {hi - lo} B, more than a core addresses "
                         f"({self.target.core_span_bytes} B)")
        if write and buf.kind not in ("output", "scratch", "state"):
            self.fail(f, f"writes into '{buf.name}', a read-only {buf.kind} buffer")
        return buf

    def _gather(self, ins):
        """GATHER: the table is a constant or input buffer (nothing in the program writes it, so its reads need no
        ordering and are not listed); the indices it reads are on the scratchpad, checked against the table's
        rows when it runs."""
        m, n, k = self.u("m"), self.u("n"), self.u("k")
        dev, sp, idx, stride = self.u("dev"), self.u("a0"), self.u("a1"), self.u("a2")
        fmt = _FORMATS.get(self.u("f0"))       # int64 too: the DMA engine reads indices, nothing computes on them
        if fmt not in (Format.INT32, Format.INT64):
            self.fail("f0", f"index format code {self.u('f0')} is not int32 or int64")
        for f, v in (("m", m), ("n", n)):
            if v < 1:
                self.fail(f, "count must be >= 1")
        if k < STICK_BYTES or k % STICK_BYTES:
            self.fail("k", f"row bytes {k} must be a positive multiple of {STICK_BYTES}")
        for f, v in (("dev", dev), ("a0", sp), ("a2", stride)):
            if v % STICK_BYTES:
                self.fail(f, f"{v} is not a multiple of the {STICK_BYTES}-byte stick")
        if stride < k:
            self.fail("a2", f"table row stride {stride} < row bytes {k}: rows overlap")
        width = fmt.nbytes(1)
        if idx % width:
            self.fail("a1", f"indices at {idx} are not {width}-byte aligned")
        idx_end, sp_end = idx + m * width, sp + m * k
        for f, end in (("a1", idx_end), ("a0", sp_end)):
            if end > self.usable:
                self.fail(f, f"scratchpad range ends at {end}, past the usable scratchpad ({self.usable} B)")
        if dev >= self.prog.device_bytes:
            self.fail("dev", f"address {dev} is outside device memory ({self.prog.device_bytes} B)")
        dev_end = dev + (n - 1) * stride + k
        buf = self._containing(dev, dev_end)
        if buf is None:
            self.fail("dev", f"table range [{dev}, {dev_end}) is not inside one allocated buffer")
        if buf.kind not in ("constant", "input"):
            self.fail("dev", f"gathers from '{buf.name}', a {buf.kind} buffer: the table must be a constant or an "
                             f"input, which nothing writes")
        if dev_end - dev > self.target.core_span_bytes:
            self.fail("dev", f"table spans {dev_end - dev} B, more than a core addresses "
                             f"({self.target.core_span_bytes} B)")
        ins.sp_reads, ins.sp_writes = sticks(idx, idx_end), sticks(sp, sp_end)
        ins.nbytes = m * k
        ins.sp_end = max(sp_end, idx_end)
        ins.gather = (dev, stride, sp, idx, fmt, m, n, k)

    def _restick(self, ins):
        m, n, k = self.u("m"), self.u("n"), self.u("k")
        fmt = self.fmt("f0")
        if m < 1:
            self.fail("m", "batch must be >= 1")
        for f, v in (("n", n), ("k", k)):
            if not 1 <= v <= MAX_TILE_DIM:
                self.fail(f, f"{v} out of range 1..{MAX_TILE_DIM}")
        src, dst = self.u("dev"), self.u("a0") | self.u("a1") << 32
        src_bytes, dst_bytes = m * n * tile_pitch(k, fmt), m * k * tile_pitch(n, fmt)
        self._device_range("dev", src, src + src_bytes, write=False)
        self._device_range("a0", dst, dst + dst_bytes, write=True)
        if src < dst + dst_bytes and dst < src + src_bytes:
            self.fail("a0", f"destination [{dst}, {dst + dst_bytes}) overlaps the source "
                            f"[{src}, {src + src_bytes})")
        ins.dev_reads = sticks(src, src + src_bytes)
        ins.dev_writes = sticks(dst, dst + dst_bytes)
        ins.nbytes = src_bytes + dst_bytes
        ins.restick = (src, dst, (m, n, k), fmt, src_bytes, dst_bytes)

    def _host(self, ins):
        k = self.u("k")
        if k >= len(self.host_ops):
            self.fail("k", f"host op {k} not in the table ({len(self.host_ops)} entries)")
        op, ins_bufs, out_bufs, attrs = self.host_ops[k]
        ins.dev_reads = np.concatenate([sticks(b.addr, b.addr + b.nbytes) for b in ins_bufs] or [EMPTY])
        ins.dev_writes = np.concatenate([sticks(b.addr, b.addr + b.nbytes) for b in out_bufs] or [EMPTY])
        ins.nbytes = sum(b.nbytes for b in ins_bufs + out_bufs)
        if op == "gather":      # moves the indexed rows, not the table (an embedding lookup)
            ins.nbytes = ins_bufs[1].nbytes + 2 * sum(b.nbytes for b in out_bufs)
        ins.name = f"host.{op}"
        ins.host = self.host_ops[k]


# ---------------------------------------------------------------------------------------------------------
# Executable
# ---------------------------------------------------------------------------------------------------------


def by_name(names: list[str], args, named) -> dict:
    """The inputs given by position and by name, as {name: value}: each input exactly once, no other."""
    if len(args) > len(names):
        raise InputError(f"{len(args)} inputs given, the program takes {len(names)}")
    vals = dict(zip(names, args))
    for k, v in named.items():
        if k not in names:
            raise InputError(f"unknown input '{k}' (inputs: {', '.join(names)})")
        if k in vals:
            raise InputError(f"input '{k}' given twice")
        vals[k] = v
    for n in names:
        if n not in vals:
            raise InputError(f"missing input '{n}'")
    return vals


def _to_numpy(x) -> np.ndarray:
    """numpy arrays pass through; torch tensors convert without importing torch here."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        t = x.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def _lanes_of(steps) -> list | None:
    """The lanes of a schedule's segments for a worker process (:func:`~.emulator.lane_splits`; None: one process
    runs it), kept with the schedule."""
    if not lanes.available():
        return None
    memo = getattr(steps, "memo", None)
    if memo is None:
        return lane_splits(_segments_of(steps))
    if "lanes" not in memo:
        memo["lanes"] = lane_splits(_segments_of(steps))
    return memo["lanes"]


def _segments_of(steps) -> list:
    """The schedule's segments (:func:`~.emulator.segments`), kept with the schedule when it has a memo."""
    memo = getattr(steps, "memo", None)
    if memo is None:
        return segments(steps)
    if "segments" not in memo:
        memo["segments"] = segments(steps)
    return memo["segments"]


class RunLock:
    """What a run holds, one per device memory (the entries of a bundle share theirs): runs from several threads
    take turns, as each writes its inputs, runs and reads its outputs in the same memories (four threads calling
    the decoder block: 86 of 120 outputs wrong). Re-entrant: a host function may call another entry. A fork's
    copy may be held by a thread the fork does not have, so a forked child makes every one anew."""

    _all: weakref.WeakSet = weakref.WeakSet()

    def __init__(self):
        self.lock = threading.RLock()
        RunLock._all.add(self)

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc) -> None:
        self.lock.release()


def _renew_run_locks() -> None:
    for r in list(RunLock._all):
        r.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_run_locks)


def _stop_worker(machine: Machine) -> None:
    if machine.worker is not None:
        machine.worker.close()


class Executable:
    """A loaded, validated, prepared program. Call it with inputs (positional in declaration order, or by
    name); it returns a tuple of numpy outputs and sets :attr:`profile`. Runs from several threads take turns."""

    def __init__(self, prog: Program, target, numerics: str, streams, steps, host_code=None, device=None,
                 share_device: bool = False, seconds: dict | None = None):
        self.program, self.target, self.numerics = prog, target, numerics
        # Where the load's time went: the decode and checks, the schedule and its proofs (both zero when this
        # process validated the same code before), the emulator's segments (batches and lanes) and its plan.
        self.load_seconds = dict(seconds or {})
        t0 = time.perf_counter()
        self.host_code = host_code
        self.input_buffers = [prog.buffer(n) for n in prog.inputs]
        self.output_buffers = [prog.buffer(n) for n in prog.outputs]
        self.state_buffers = [b for b in prog.buffers if b.kind == "state"]
        self.steps = steps
        shadow = numerics == "fp32-reference"
        memo = getattr(steps, "memo", {})
        segs = _segments_of(steps)
        # Segments of small steps as lanes for a worker process (runtime/lanes.py), which shares the memories.
        splits = _lanes_of(steps)
        self.load_seconds["segments"] = time.perf_counter() - t0
        # Entries of one file share device memory (constants written once, state kept between them); the first
        # entry makes it shared (``share_device``) when some entry has lanes.
        if device is not None and not device.shared:
            splits = None
        self.device = device if device is not None else Memory(prog.device_bytes, shadow,
                                                               splits is not None or share_device)
        if "sp_size" not in memo:
            memo["sp_size"] = _scratchpad_extents(streams, prog.num_cores)
        sp_size = memo["sp_size"]
        # All scratchpads in one memory, equally spaced, so that one tile of many cores is one strided view.
        stride = -(-max(sp_size) // STICK_BYTES) * STICK_BYTES
        sp = Memory(prog.num_cores * stride, shadow, splits is not None)
        self.sp = [sp.part(c * stride, stride) for c in range(prog.num_cores)]
        self.machine = Machine(self.device, sp, stride, numerics, host_code)
        if not hasattr(self.device, "run_lock"):
            self.device.run_lock = RunLock()
        self.lock = self.device.run_lock      # what a run holds; held across calls, no other thread's between
        for name, blob in ({} if device is not None else prog.constants).items():
            b = prog.buffer(name)
            self.device.bytes[b.addr:b.addr + b.nbytes] = np.frombuffer(blob, dtype=np.uint8)
            v = self._buffer_view(b)
            if v.shadow is not None:
                v.shadow[...] = v.read_bytes()
        self._in_views = [self._buffer_view(b) for b in self.input_buffers]
        self._out_views = [self._buffer_view(b) for b in self.output_buffers]
        t0 = time.perf_counter()
        self._plan = self.machine.plan(segs, [(b.addr, b.nbytes) for b in prog.buffers if b.kind == "constant"],
                                       splits)
        self.load_seconds["plan"] = time.perf_counter() - t0
        self._sp_peak = max(sp_size)
        self._wall: float | None = None
        if self.machine.lanes:
            # A worker stops as soon as this executable is dropped: the plan's closures and the machine refer to
            # one another, and the collector may take long to find them (a worker holds the pages this process had
            # at its fork, which this process then copies as it writes them).
            weakref.finalize(self, _stop_worker, self.machine)

    @functools.cached_property
    def static_profile(self) -> Profile:
        """The cycle model's profile of one run (the program is static: it does not depend on the inputs).
        Computed on first use, not at load: a caller who never asks for cycles never pays for the model."""
        return dataclasses.replace(model_program(self.program, self.target, self.steps),
                                   scratchpad_peak_bytes=self._sp_peak,
                                   usable_scratchpad_bytes=self.target.scratchpad_usable_bytes)

    @property
    def profile(self) -> Profile | None:
        """The last run's profile: :attr:`static_profile` with its wall time; None before the first run."""
        return None if self._wall is None else dataclasses.replace(self.static_profile, wall_seconds=self._wall)

    def __repr__(self) -> str:
        sig = lambda bufs: ", ".join(f"{b.name}: {b.fmt.key}{list(b.shape)}" for b in bufs)   # noqa: E731
        return (f"Executable(({sig(self.input_buffers)}) -> ({sig(self.output_buffers)}), "
                f"{self.program.num_cores} cores, numerics={self.numerics!r})")

    # ---- preparation ------------------------------------------------------------------------------------

    def _buffer_view(self, b: Buffer) -> TileView:
        return self.machine.buffer_view(b)

    # ---- running ----------------------------------------------------------------------------------------

    @property
    def input_names(self) -> list[str]:
        return list(self.program.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.program.outputs)

    def _bind(self, args, named) -> list[np.ndarray]:
        bufs = self.input_buffers
        vals = by_name([b.name for b in bufs], args, named)
        out = []
        for b in bufs:
            a = _to_numpy(vals[b.name])
            shape = b.shape if b.shape else (1,)
            if a.shape != shape and not (a.size == 1 and np.prod(shape) == 1):
                raise InputError(f"input '{b.name}': shape {a.shape} does not match {shape}")
            if a.dtype.kind not in "biufc" and a.dtype.name != "bfloat16":
                raise InputError(f"input '{b.name}': dtype {a.dtype} is not numeric")
            if b.fmt.exact_storage:
                a = a.astype(b.fmt.value_dtype)     # held as is; integers wrap like the model's dtype
            elif not b.fmt.is_float and b.fmt is not Format.BOOL:
                if a.dtype.kind == "f":
                    if not np.all(np.isfinite(a)) or not np.all(a == np.rint(a)):
                        raise InputError(f"input '{b.name}': format {b.fmt.key} needs integer values")
                lo, hi = INT_RANGE[b.fmt]
                if a.size and (a.min() < lo or a.max() > hi):
                    raise InputError(f"input '{b.name}': values outside the {b.fmt.key} range {lo}..{hi}")
                a = a.astype(np.int64)
            elif b.fmt.is_float:
                a = a.astype(np.float32, copy=False)      # only read: written into device memory below
            out.append(a)
        return out

    def __call__(self, *args, **named) -> tuple[np.ndarray, ...]:
        """Run once. Inputs are numpy arrays (or torch tensors); returns the outputs in declaration order."""
        values = self._bind(args, named)
        with self.lock:
            return self._run(values)

    def _run(self, values) -> tuple[np.ndarray, ...]:
        t0 = time.perf_counter()
        for v, a in zip(self._in_views, values):
            v.write(a.reshape(v.rows, v.cols))
        with np.errstate(all="ignore"), warnings.catch_warnings(), one_blas_thread():
            warnings.simplefilter("ignore", RuntimeWarning)
            worker = self._worker()
            try:
                if worker is not None:
                    worker.begin()
                for step in self._plan:
                    step()
                if worker is not None:
                    worker.end()
            except BaseException as e:
                if worker is not None:      # stopped wherever it was; the next run starts another
                    worker.close()
                    self.machine.worker = None
                if isinstance(e, (SpyreError, KeyboardInterrupt, SystemExit)):
                    raise
                where = "in the emulator's worker process" if isinstance(e, lanes.WorkerError) else "while running"
                raise SpyreRuntimeError(f"internal error {where}: {type(e).__name__}: {e}") from e
        outs = []
        for v, b in zip(self._out_views, self.output_buffers):
            # A decode is a new array, the result's own (no view of the machine's memory); a shadow is copied. Not
            # copied again: a second large array at once comes from fresh pages (a 1024x1024 fp32 output took
            # 1.6 ms so, 0.2 ms with one copy).
            r = (v.read_new() if b.fmt.is_float and not b.fmt.exact_storage else v.read_bytes()).reshape(b.shape)
            outs.append(np.asarray(r, dtype=host_dtype(b.dtype) if b.dtype else r.dtype))
        self._wall = time.perf_counter() - t0
        return tuple(outs)

    def _worker(self) -> lanes.Worker | None:
        """The process that runs the second lane of the plan's :class:`~.emulator.Lanes` steps, forked at the first
        run that has some (runtime/lanes.py), again after one failed or was stopped for another executable's. None
        while every worker is in use (``lanes.make_room``): both lanes run in this process."""
        m = self.machine
        if not m.lanes:
            return None
        lanes.tick()
        if m.worker is not None and m.worker.alive:
            return m.worker
        m.worker = None
        if lanes.make_room():
            if native.available():
                native.warm()           # compiled once, here, not in each process at its first conversion
            m.first_run_again()         # the worker's first run (or, without one, this process's with its lanes)
            try:
                m.worker = lanes.Worker([x.second for x in m.lanes])
                m.lanes_here = False
                return m.worker
            except OSError as e:        # no process to be had (limits, memory): both lanes run here
                warnings.warn(f"spyre emulator: runs in one process ({e})", stacklevel=3)
                m.lanes = []
                return None
        # Every worker is in use: both lanes run here this time, a first run here the first time.
        if not m.lanes_here:
            m.first_run_again()
            m.lanes_here = True
        return None

    @property
    def worker_cpu_seconds(self) -> float:
        """CPU time this executable's worker process has used in runs (0 without one): a run's CPU cost is this
        process's plus the worker's."""
        w = self.machine.worker
        return 0.0 if w is None else w.cpu_seconds

    def run(self, *args, **named) -> dict[str, np.ndarray]:
        """Like calling, but returns {output name: array}."""
        return dict(zip(self.program.outputs, self(*args, **named)))

    # ---- persistent state -------------------------------------------------------------------------------

    def _state(self, name: str) -> Buffer:
        for b in self.state_buffers:
            if b.name == name:
                return b
        raise InputError(f"no state buffer '{name}' (state: {', '.join(b.name for b in self.state_buffers)})")

    def read_state(self, name: str) -> np.ndarray:
        """A copy of state buffer ``name`` as values (a device-to-host transfer: for inspection and tests)."""
        b = self._state(name)
        v = self._buffer_view(b)
        with self.lock:
            r = v.read() if b.fmt.is_float and not b.fmt.exact_storage else v.read_bytes()
            return np.array(r).reshape(b.shape)

    def reset_state(self) -> None:
        """Zero every state buffer (what a freshly loaded program holds)."""
        with self.lock:
            for b in self.state_buffers:
                self._buffer_view(b).write(np.zeros((b.rows, b.shape[-1] if b.shape else 1), np.float32))


class Bundle:
    """The entries of a file with several programs (format 1.3), loaded over one device memory: constants are
    loaded once and state buffers persist from call to call, whichever entry runs. ``bundle["decode"]`` is an
    :class:`Executable`; ``bundle.entries`` lists the names."""

    def __init__(self, program: Program, executables: dict[str, Executable]):
        self.program = program
        self._exes = executables
        self.entries = list(executables)

    def __getitem__(self, name: str) -> Executable:
        try:
            return self._exes[name]
        except KeyError:
            raise InputError(f"no entry '{name}' (entries: {', '.join(self.entries)})") from None

    def __repr__(self) -> str:
        return f"Bundle({', '.join(self.entries)})"

    @property
    def lock(self) -> RunLock:
        """What its entries' runs hold (they share one device memory): held across several calls, no other
        thread's run comes between them (a generation's prefill and decode steps, which share the KV cache)."""
        return next(iter(self._exes.values())).lock

    def read_state(self, name: str) -> np.ndarray:
        return next(iter(self._exes.values())).read_state(name)

    def reset_state(self) -> None:
        next(iter(self._exes.values())).reset_state()


def _scratchpad_extents(streams, cores: int) -> list[int]:
    """The highest scratchpad byte each core's instructions (and the ring transfers landing there) touch."""
    sp_size = [STICK_BYTES] * cores
    for c, stream in enumerate(streams):
        sp_size[c] = max(sp_size[c], max(i.sp_end for i in stream))
        # Each distinct transfer once: the copies of one decoded record share its operands.
        for send in {id(i.send): i.send for i in stream if i.send is not None}.values():
            peers, dst, _, k = send
            for peer in peers:
                sp_size[peer] = max(sp_size[peer], dst + k)
        for red in {id(i.reduce): i.reduce for i in stream if i.reduce is not None}.values():
            d = red[2]
            for r in bits(red[0]):
                sp_size[r] = max(sp_size[r], d[0] + d[1] * tile_pitch(d[2], d[3]))
    return sp_size


def _device_limit() -> int:
    """Device bytes the emulator may allocate on this host (SPYRE_EMU_MAX_DEVICE_BYTES overrides)."""
    try:
        return int(os.environ.get("SPYRE_EMU_MAX_DEVICE_BYTES", DEFAULT_MAX_DEVICE_BYTES))
    except ValueError:
        return DEFAULT_MAX_DEVICE_BYTES


def load_bytes(data: bytes | memoryview, target=None, numerics: str | None = None):
    """Validate and prepare a .spyre image held in memory: an :class:`Executable`, a :class:`Bundle` for a file
    with entries, or a :class:`~spyre_mlir.runtime.system.SystemExecutable` for a system of cards. See
    :func:`load`."""
    with collector_paused():
        return _load_bytes(data, target, numerics)


def _load_bytes(data, target, numerics):
    if numerics is not None and numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    if is_system(data):
        from .system import load_system

        return load_system(data, target, numerics)
    prog = program_from_bytes(data)
    numerics = numerics or prog.numerics
    from spyre_mlir.target import TargetError, load_target
    if isinstance(target, (str, os.PathLike)):
        target = load_target(target, cores=prog.num_cores)      # a bad target file is a TargetError
    elif target is None:
        try:
            target = load_target(cores=prog.num_cores)
        except TargetError as e:
            raise BinaryFormatError(f"header: {e}") from None
    if prog.num_cores != target.num_cores or prog.fingerprint != target.fingerprint():
        raise BinaryFormatError(f"header: target fingerprint {prog.fingerprint[:12]}... ({prog.num_cores} cores) "
                                f"does not match the runtime target {target.fingerprint()[:12]}... "
                                f"({target.num_cores} cores); compile for this target or pass --target")
    limit = _device_limit()
    if prog.device_bytes > min(target.dram_bytes, limit) or prog.device_bytes % STICK_BYTES:
        raise BinaryFormatError(f"metadata.device_bytes: {prog.device_bytes} is not a stick multiple or "
                                f"exceeds the limit {min(target.dram_bytes, limit)} (target DRAM or "
                                f"SPYRE_EMU_MAX_DEVICE_BYTES)")
    digest = code_digest(data)
    if prog.entries:
        valid = []
        for e in prog.entries:
            view = prog.entry_program(e.name)
            try:
                valid.append((e.name, view, *_validate(view, target, (digest, e.name))))
            except BinaryFormatError as err:
                raise BinaryFormatError(f"entry '{e.name}': {err}") from None
        share = any(_lanes_of(steps) is not None for _, _, _, steps, _, _ in valid)
        exes, device = {}, None
        for name, view, streams, steps, host_code, seconds in valid:
            exes[name] = Executable(view, target, numerics, streams, steps, host_code, device=device,
                                    share_device=share, seconds=seconds)
            device = exes[name].device      # the first entry's view wrote every (shared) constant
        return Bundle(prog, exes)
    streams, steps, host_code, seconds = _validate(prog, target, (digest, ""))
    return Executable(prog, target, numerics, streams, steps, host_code, seconds=seconds)


# Programs this process validated: (code digest, entry, target fingerprint) -> (streams, schedule). The decoded
# instructions and their schedule (with its batches, emulator.segments) are read-only and do not depend on the
# constants' values (binary.code_digest leaves their payload out: hashing a model's weights took half a second
# a load): loading the same code again (a compile-cache hit, a second Executable of one file, other weights)
# reuses them instead of checking every instruction again. Host code is compiled at each load: its functions
# keep per-call state.
_VALIDATED: collections.OrderedDict = collections.OrderedDict()
VALIDATED_KEEP = 100_000       # instructions kept over all programs (about 1 KB each, decoded and scheduled)


def clear_cache() -> None:
    """Forget the programs this process validated (a benchmark timing cold loads of the same bytes)."""
    _VALIDATED.clear()


def _validate(prog: Program, target, key: tuple | None = None):
    """Decode and check one program's host work and code, and order it as the emulator runs it. ``key``
    identifies the image it came from (:data:`_VALIDATED`). Also the seconds its decode and schedule took (zero
    when this process validated it before)."""
    host_code = None
    if prog.host_code:
        try:
            host_code = HostCode(prog.host_code)
        except HostCodeError as e:
            raise BinaryFormatError(f"metadata.host_code: {e}") from None
    key = None if key is None else (*key, target.fingerprint(), target.num_cores)
    if key is not None and key in _VALIDATED:
        _VALIDATED.move_to_end(key)
        return (*_VALIDATED[key], host_code, {"decode": 0.0, "schedule": 0.0})
    streams, steps, seconds = _check(prog, target, host_code)
    steps = _Schedule(steps, streams)
    if key is not None and len(steps) <= VALIDATED_KEEP:
        _VALIDATED[key] = (streams, steps)
        while sum(len(v[1]) for v in _VALIDATED.values()) > VALIDATED_KEEP:
            _VALIDATED.popitem(last=False)
    return streams, steps, host_code, seconds


class _Schedule(list):
    """A validated program's static schedule, with what loads derive from it alone (``memo``: the emulator's
    batches, each core's scratchpad extent), made once."""

    def __init__(self, steps, streams):
        super().__init__(steps)
        self.streams = streams
        self.memo: dict = {}


def _check(prog: Program, target, host_code):
    """Decode and check every host op and instruction of ``prog``; (streams, schedule, seconds of the decode
    and of the schedule)."""
    dec = _Decoder(prog, target)
    bufs = {b.name: b for b in prog.buffers}
    dec.host_code = host_code
    dec.host_ops = []
    for j, entry in enumerate(prog.host_ops):
        try:
            dec.host_ops.append(check_host_op(entry, bufs, host_code.functions if host_code else frozenset()))
        except HostOpError as e:
            raise BinaryFormatError(f"metadata.host_ops[{j}]: {e}") from None
    for c, code in enumerate(prog.code):
        ops = code["op"]
        ends = np.flatnonzero(ops == Op.END)
        if ends.size != 1 or ends[0] != len(code) - 1:
            i = int(ends[0]) if ends.size else len(code) - 1
            raise BinaryFormatError(f"code core {c} instruction {i}: field 'op': the stream must end with "
                                    f"exactly one END, as its last instruction")
    t0 = time.perf_counter()
    streams = _decode_streams(dec, prog.code)
    t1 = time.perf_counter()
    steps = schedule(prog, streams, -(-target.scratchpad_usable_bytes // STICK_BYTES),
                      prog.device_bytes // STICK_BYTES)
    return streams, steps, {"decode": t1 - t0, "schedule": time.perf_counter() - t1}


def _decode_streams(dec: _Decoder, codes: list[np.ndarray]) -> list[list[Ins]]:
    """Every core's instructions, decoded and checked. A loop's trips repeat few distinct records: each record
    of a core is decoded once, in the order of its first use (so the first bad instruction is the one named),
    and every other instruction holding it is a copy in its own place. All cores at once: numpy's per-call cost
    is paid once, not per core."""
    if not codes:
        return []
    sizes = [len(c) for c in codes]
    code = np.concatenate(codes)
    core = np.repeat(np.arange(len(codes)), sizes)
    local = np.arange(len(code)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    size = INSTR_DTYPE.itemsize
    keyed = np.empty((len(code), 8 + size), np.uint8)         # (core, record): equal rows, equal instructions
    keyed[:, :8] = core.astype("<u8")[:, None].view(np.uint8)
    keyed[:, 8:] = np.ascontiguousarray(code).view(np.uint8).reshape(len(code), size)
    _, first, inv = np.unique(keyed.view(f"V{8 + size}").ravel(), return_index=True, return_inverse=True)
    order = np.argsort(first)
    reps = first[order]
    checked = [_unused_fields_zero(c) for c in codes]
    # Plain Python values a column at a time (a structured array's own tolist is several times slower).
    rows = zip(*(code[f][reps].tolist() for f in INSTR_DTYPE.names))
    decoded = [None] * len(first)
    for u, c, i, vals in zip(order.tolist(), core[reps].tolist(), local[reps].tolist(), rows):
        decoded[u] = dec.decode(c, i, codes[c][i], vals, checked[c])
    streams, inv = [], inv.ravel().tolist()
    at = 0
    for c, stream in enumerate(codes):
        debug = dec.prog.debug[c] if dec.prog.debug else None
        out = []
        for i, (u, rec) in enumerate(zip(inv[at:at + len(stream)], stream)):
            d = decoded[u]
            out.append(d if d.idx == i else
                       Ins(c, i, d.op, rec, d.name, debug[i][1] if debug else "", *_DECODED(d)))
        streams.append(out)
        at += len(stream)
    return streams


def _unused_bytes() -> np.ndarray:
    """[256, record bytes]: per opcode value, 0xFF on the bytes of the fields it does not use (every byte for
    an unknown opcode, so that its records fail the check and are decoded one by one)."""
    table = np.full((256, INSTR_DTYPE.itemsize), 0xFF, dtype=np.uint8)
    table[:, 0] = 0                                   # the opcode itself
    for op in Op:
        for f in FIELDS[op]:
            dt, off = INSTR_DTYPE.fields[f][:2]
            table[int(op), off:off + dt.itemsize] = 0
    return table


_UNUSED_BYTES = _unused_bytes()


def _unused_fields_zero(code: np.ndarray) -> bool:
    """Every instruction of a core's stream has zero in the fields its opcode does not use, checked for the
    whole stream at once (the common case, so :meth:`_Decoder.decode` need not check field by field; when this
    is False it does, and names the first instruction and field at fault)."""
    raw = np.ascontiguousarray(code).view(np.uint8).reshape(len(code), INSTR_DTYPE.itemsize)
    return not (raw & _UNUSED_BYTES[code["op"]]).any()


def load(path, target=None, numerics: str | None = None) -> Executable:
    """Load a .spyre file for ``target``: a Target, a target file path (narrowed to the file's core count),
    or None for the packaged Spyre target. Raises BinaryFormatError (a ValueError) naming the problem if
    anything is wrong with the file.
    ``numerics``: "faithful" (device rounding) or "fp32-reference" (same program, no rounding); None takes
    what the binary records (what it was compiled for)."""
    path = os.fspath(path)
    # Constants cannot exceed device memory; allow 1 GiB more for code, metadata and debug info.
    max_file = _device_limit() + (1 << 30)
    try:
        size = os.path.getsize(path)
        if size > max_file:
            raise BinaryFormatError(f"header: file is {size} bytes, more than the {max_file} limit")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BinaryFormatError(f"cannot read {path}: {e.strerror or e}") from None
    return load_bytes(data, target=target, numerics=numerics)
