"""ProgramBuilder: the Python API that assembles .spyre programs (used by tests and by ``spyre-emit``).

It owns the bookkeeping a hand-written program gets wrong: device addresses (4 KiB aligned, in declaration
order), the canonical stick layout of every buffer, scratchpad tiles (a bump allocator per core), record
encoding, and debug info (op name + source location, by default the caller's ``file:line``). Semantic
checks (bounds, formats, initialized reads) are the loader's job; ``ProgramBuilder.load()`` runs them.

Example::

    b = ProgramBuilder(load_target(cores=1))
    x = b.input("x", (64, 64), "dlf16"); y = b.output("y", (64, 64), "dlf16")
    t = b.alloc(0, 64, 64, "dlf16")
    b.load_tile(0, t, x)
    b.sfu(0, "exp", t, t)
    b.store_tile(0, t, y)
    exe = b.load()
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

import numpy as np

from .binary import (BUFFER_ALIGN, Buffer, Program, buffer_layout, program_layout, program_to_bytes, rolled_code,
                     write_program)
from .formats import STICK_BYTES, Format, encode
from .isa import (INSTR_DTYPE, ROOT_ALL, Bcast, MatmulFlag, Op, ReduceFn, SFU_SWAP, SfuFn, describe, sfu_fn,
                  tile_bytes, tile_pitch)
from .loops import MAX_TRIPS, STEPPED, roll_streams

__all__ = ["ProgramBuilder", "Tile", "listing"]

_FIELDS = frozenset(INSTR_DTYPE.names)
_MNEMONIC = {op: op.name.lower() for op in Op}
_WIDTH = {f: (1 << 8 * INSTR_DTYPE.fields[f][0].itemsize) - 1 for f in STEPPED}


@dataclasses.dataclass
class _Loop:
    """A loop a kernel emitted as one (:meth:`ProgramBuilder.roll_tail`): ``body`` (records) runs ``trips``
    times, its stepped fields advanced by ``steps`` (per body record, field -> advance modulo the field's width)
    per trip. One entry of a core's stream: insertion points never fall inside it."""

    trips: int
    body: list[dict]
    debug: list[tuple[str, str]]
    steps: list[dict]

    def last(self) -> dict:
        """The loop's last instruction as it runs (its last trip's last record)."""
        rec = dict(self.body[-1])
        for f, d in self.steps[-1].items():
            rec[f] = (rec.get(f, 0) + (self.trips - 1) * d) & _WIDTH[f]
        return rec


@dataclasses.dataclass(frozen=True)
class Tile:
    """A dense [rows, cols] tile in one core's scratchpad (row pitch padded to sticks)."""

    addr: int
    rows: int
    cols: int
    fmt: Format

    @property
    def pitch(self) -> int:
        return tile_pitch(self.cols, self.fmt)

    @property
    def nbytes(self) -> int:
        return tile_bytes(self.rows, self.cols, self.fmt)

    def row_slice(self, r0: int, r1: int) -> "Tile":
        """Rows [r0, r1) of this tile as a tile of its own (same pitch, so still dense)."""
        if not 0 <= r0 < r1 <= self.rows:
            raise ValueError(f"row slice [{r0}, {r1}) outside a {self.rows}-row tile")
        return Tile(self.addr + r0 * self.pitch, r1 - r0, self.cols, self.fmt)


def _fmt(f) -> Format:
    return Format.parse(f)


def _caller_loc() -> str:
    """file:line of the first frame outside this module, as the default debug location."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" if f is not None else ""


class ProgramBuilder:
    """Assemble a program for ``target`` (its ``num_cores`` is the program's core count)."""

    def __init__(self, target, producer: str = "spyre_mlir.runtime.assembler"):
        self.target = target
        self.producer = producer
        self.numerics = "faithful"   # the numerics the program is meant to run with (recorded in the file)
        self.buffers: list[Buffer] = []
        self.constants: dict[str, bytes] = {}
        self.host_ops: list[dict] = []
        self.host_code = ""          # LLVM-dialect MLIR of the host functions that ``jit`` host ops call
        self.output_order: list[str] | None = None   # outputs in call-result order (default: declaration order)
        self._records: list[list[dict]] = [[] for _ in range(target.num_cores)]
        self._debug: list[list[tuple[str, str]]] = [[] for _ in range(target.num_cores)]
        self._next_addr = 0
        self._sp_top = [0] * target.num_cores
        self._at: dict[int, int] | None = None     # insertion points while :meth:`inserting`

    # ---- device buffers ---------------------------------------------------------------------------------

    def _buffer(self, name: str, kind: str, shape, fmt, addr: int | None = None, dtype: str = "") -> Buffer:
        if any(b.name == name for b in self.buffers):
            raise ValueError(f"buffer {name!r} already declared")
        fmt = _fmt(fmt)
        shape = tuple(int(d) for d in shape)
        if not all(d >= 0 for d in shape):
            raise ValueError(f"buffer {name!r}: dims must be >= 0, got {shape}")
        strides, nbytes = buffer_layout(shape, fmt)
        if addr is None:
            addr = self._next_addr
        elif addr % BUFFER_ALIGN:
            raise ValueError(f"buffer {name!r}: address {addr} is not {BUFFER_ALIGN}-byte aligned")
        buf = Buffer(name, kind, fmt, shape, addr, nbytes, strides, dtype)
        self._next_addr = max(self._next_addr, addr + -(-nbytes // BUFFER_ALIGN) * BUFFER_ALIGN)
        self.buffers.append(buf)
        return buf

    def input(self, name: str, shape, fmt="dlf16", dtype: str = "") -> Buffer:
        """Declare an input tensor; callers pass values, the runtime encodes them into ``fmt``. ``dtype``: the
        numpy dtype callers use for it when it is not the format's own (float16 data held as dlf16)."""
        return self._buffer(name, "input", shape, fmt, dtype=dtype)

    def output(self, name: str, shape, fmt="dlf16", dtype: str = "") -> Buffer:
        """Declare an output tensor; the program must write all of it. The runtime returns it as ``dtype``
        (default: the format's value dtype)."""
        return self._buffer(name, "output", shape, fmt, dtype=dtype)

    def state(self, name: str, shape, fmt="dlf16") -> Buffer:
        """Declare persistent state (a KV cache): zero when the program is loaded, then what the last call
        left there; programs read and write it, callers never pass or receive it."""
        return self._buffer(name, "state", shape, fmt)

    def scratch(self, name: str, shape, fmt="dlf16", addr: int | None = None) -> Buffer:
        """Declare device memory for intermediates (readable only after the program wrote it). ``addr`` places
        it explicitly (4 KiB aligned): scratch buffers may share memory with each other, which is how a
        compiler reuses device memory across tensors whose lifetimes do not overlap."""
        return self._buffer(name, "scratch", shape, fmt, addr)

    def constant(self, name: str, values, fmt="dlf16", encoded: bool = False) -> Buffer:
        """Declare a constant (weights). ``values`` are real values (encoded here, rounding to ``fmt``) or,
        with ``encoded=True``, already the format's storage array (e.g. int8 codes, packed int4)."""
        fmt = _fmt(fmt)
        arr = np.asarray(values)
        shape = arr.shape if not (encoded and fmt is Format.INT4) else arr.shape[:-1] + (arr.shape[-1] * 2,)
        buf = self._buffer(name, "constant", shape or (1,), fmt)
        bits = arr if encoded else encode(fmt, arr)
        self.constants[name] = _to_device_image(buf, np.asarray(bits))
        return buf

    # ---- scratchpad -------------------------------------------------------------------------------------

    def alloc(self, core: int, rows: int, cols: int, fmt="dlf16") -> Tile:
        """Reserve a [rows, cols] tile on ``core`` (bump allocation; see :meth:`reset_scratchpad`)."""
        fmt = _fmt(fmt)
        t = Tile(self._sp_top[core], int(rows), int(cols), fmt)
        if t.addr + t.nbytes > self.target.scratchpad_usable_bytes:
            raise ValueError(f"core {core}: a [{rows}, {cols}] {fmt.key} tile at {t.addr} overflows the usable "
                             f"scratchpad ({self.target.scratchpad_usable_bytes} B)")
        self._sp_top[core] += t.nbytes
        return t

    def reset_scratchpad(self, core: int, top: int = 0) -> None:
        """Let later :meth:`alloc` calls on ``core`` reuse the scratchpad from byte ``top`` on."""
        self._sp_top[core] = top

    def scratchpad_top(self, core: int) -> int:
        """The next free scratchpad byte of ``core`` (its high-water mark so far)."""
        return self._sp_top[core]

    # ---- raw emission -----------------------------------------------------------------------------------

    def emit(self, core: int, op: Op, loc: str | None = None, /, **fields) -> int:
        """Append one raw record to ``core``'s stream; returns its index. Fields are INSTR_DTYPE names."""
        if not _FIELDS.issuperset(fields):
            raise ValueError(f"unknown instruction field(s) {sorted(fields.keys() - _FIELDS)}")
        rec, dbg = {"op": int(op), **fields}, (_MNEMONIC[op], loc if loc is not None else _caller_loc())
        if self._at is None:
            self._records[core].append(rec)
            self._debug[core].append(dbg)
            return len(self._records[core]) - 1
        if core not in self._at:
            raise ValueError(f"no insertion point on core {core}")
        at = self._at[core]
        self._records[core].insert(at, rec)
        self._debug[core].insert(at, dbg)
        self._at[core] = at + 1
        return at

    @contextlib.contextmanager
    def inserting(self, points: dict[int, int]):
        """Within the block, instructions of core ``c`` go at index ``points[c]`` of its stream (each after the one
        before) instead of at its end: work issued earlier than the code emitted before it (spyre-prefetch)."""
        self._at = dict(points)
        try:
            yield
        finally:
            self._at = None

    def next_barrier(self, core: int) -> int | None:
        """The mask of the first barrier ``core`` meets after the instructions emitted now (inside
        :meth:`inserting`, after its insertion point), or None when none follows yet."""
        at = self._at.get(core) if self._at is not None else None
        if at is None:
            return None
        recs = (r for e in self._records[core][at:] for r in (e.body if isinstance(e, _Loop) else (e,)))
        return next((r["mask"] for r in recs if r["op"] == int(Op.BARRIER)), None)

    def stream_length(self, core: int) -> int:
        """The entries of ``core``'s stream so far: records, and loops (:meth:`roll_tail`) as one each."""
        return len(self._records[core])

    def opcodes(self, core: int, start: int = 0) -> list[int]:
        """The opcodes of ``core``'s stream entries so far, from index ``start`` on. A loop whose body ends at a
        barrier is a BARRIER (what follows it starts a segment), any other a LOOP."""
        return [(Op.BARRIER if e.body[-1]["op"] == Op.BARRIER else Op.LOOP) if isinstance(e, _Loop) else e["op"]
                for e in self._records[core][start:]]

    def roll_tail(self, cores, starts: dict[int, int], bodies: int, trips: int) -> bool:
        """Store what each core of ``cores`` emitted since entry ``starts[core]`` as a loop of ``trips`` trips, when
        it is ``bodies`` (at least 3) trips of one body: equal records, whose address fields (:data:`.loops.STEPPED`)
        advance by the same amount from each trip to the next. The kernel then emits none of the other
        ``trips - bodies`` trips, and continues after the loop. False, with nothing changed, when the records are
        no such trips (or a loop cannot hold them): the kernel emits the rest one by one."""
        if self._at is not None or bodies < 3 or not bodies <= trips <= MAX_TRIPS:
            return False
        loops = {}
        for c in cores:
            tail, dbg = self._records[c][starts[c]:], self._debug[c][starts[c]:]
            n = len(tail) // bodies
            if n == 0 or len(tail) % bodies or any(isinstance(e, _Loop) for e in tail):
                return False
            steps = []
            for j in range(n):
                recs = tail[j::n]
                if any(d != dbg[j] for d in dbg[j::n]):
                    return False
                step = {}
                for f in set().union(*recs):
                    vals = [r.get(f, 0) for r in recs]
                    if f not in _WIDTH:
                        if any(v != vals[0] for v in vals):
                            return False
                        continue
                    d = (vals[1] - vals[0]) & _WIDTH[f]
                    if any((b - a) & _WIDTH[f] != d for a, b in zip(vals, vals[1:])):
                        return False
                    if d:
                        step[f] = d
                steps.append(step)
            loops[c] = _Loop(trips, tail[:n], dbg[:n], steps)
        for c, loop in loops.items():
            del self._records[c][starts[c]:], self._debug[c][starts[c]:]
            self._records[c].append(loop)
            self._debug[c].append(None)
        return True

    # ---- DMA --------------------------------------------------------------------------------------------

    def dma_load(self, core: int, dev: int, sp: int, shape, dev_strides=(0, 0), sp_strides=(0, 0),
                 loc=None) -> int:
        """Device -> scratchpad. ``shape`` = (outer, rows, row_bytes) or (rows, row_bytes); strides in
        bytes for (outer, row)."""
        return self._dma(Op.DMA_LOAD, core, dev, sp, shape, dev_strides, sp_strides, loc)

    def dma_store(self, core: int, dev: int, sp: int, shape, dev_strides=(0, 0), sp_strides=(0, 0),
                  loc=None) -> int:
        """Scratchpad -> device; fields as :meth:`dma_load`."""
        return self._dma(Op.DMA_STORE, core, dev, sp, shape, dev_strides, sp_strides, loc)

    def _dma(self, op, core, dev, sp, shape, dev_strides, sp_strides, loc):
        shape = tuple(shape)
        if len(shape) == 2:
            shape = (1,) + shape
            dev_strides = (0, dev_strides[-1])
            sp_strides = (0, sp_strides[-1])
        m, n, k = shape
        return self.emit(core, op, loc or _caller_loc(), dev=dev, a0=sp, m=m, n=n, k=k,
                         a1=dev_strides[0], a2=dev_strides[1], a3=sp_strides[0], a4=sp_strides[1])

    def gather(self, core: int, dst: Tile, table: Buffer, idx_addr: int, idx_fmt, table_row0: int = 0,
               table_rows: int | None = None, loc=None) -> int:
        """GATHER on ``core``'s DMA engine: scratchpad rows ``dst[r] = table[table_row0 + ids[r]]`` for the
        ``dst.rows`` indices (``idx_fmt``: int32 or int64) at scratchpad address ``idx_addr``; ``table`` is a
        constant or input buffer of rows of whole sticks, its rows from ``table_row0`` on (``table_rows`` of them,
        default all) the ones an index may pick."""
        fmt = Format.parse(idx_fmt)
        if dst.fmt is not table.fmt or dst.pitch != table.pitch:
            raise ValueError(f"gather: tile [{dst.rows}, {dst.cols}] {dst.fmt.key} does not hold rows of "
                             f"'{table.name}' ({table.fmt.key}, {table.pitch} B rows)")
        rows = table.rows - table_row0 if table_rows is None else table_rows
        return self.emit(core, Op.GATHER, loc or _caller_loc(), dev=table.addr + table_row0 * table.pitch,
                         a0=dst.addr, a1=idx_addr, f0=int(fmt), a2=table.pitch, m=dst.rows, n=rows,
                         k=table.pitch)

    def _tile_dma(self, op, core, tile: Tile, buf: Buffer, row0: int, col0: int, index, loc):
        if tile.fmt is not buf.fmt:
            raise ValueError(f"tile format {tile.fmt.key} != buffer '{buf.name}' format {buf.fmt.key}")
        if len(buf.shape) < 2 and (row0 or tile.rows != 1):
            raise ValueError(f"buffer '{buf.name}' has one row")
        if (col0 * buf.fmt.bits) % (STICK_BYTES * 8):
            raise ValueError(f"column offset {col0} is not on a stick boundary")
        col_bytes = buf.fmt.nbytes(col0)
        if col_bytes + tile.pitch > buf.pitch:
            raise ValueError(f"tile columns [{col0}, {col0}+{tile.cols}) run past the row of '{buf.name}'")
        index = tuple(index)
        outer = buf.strides[:-1] if len(buf.shape) >= 2 else ()
        if len(index) != len(outer):
            raise ValueError(f"buffer '{buf.name}' needs {len(outer)} leading indices, got {len(index)}")
        dev = buf.addr + sum(i * s for i, s in zip(index, outer)) + col_bytes
        dev += row0 * (buf.strides[-1] if len(buf.shape) >= 2 else 0)
        return self._dma(op, core, dev, tile.addr, (tile.rows, tile.pitch), (0, buf.pitch),
                         (0, tile.pitch), loc or _caller_loc())

    def load_tile(self, core: int, tile: Tile, buf: Buffer, row0: int = 0, col0: int = 0, index=(),
                  loc=None) -> int:
        """Load ``buf[*index, row0:row0+tile.rows, col0:col0+tile.cols]`` (whole sticks) into ``tile``."""
        return self._tile_dma(Op.DMA_LOAD, core, tile, buf, row0, col0, index, loc)

    def store_tile(self, core: int, tile: Tile, buf: Buffer, row0: int = 0, col0: int = 0, index=(),
                   loc=None) -> int:
        """Store ``tile`` to ``buf[*index, row0:..., col0:...]`` (whole sticks, padding included)."""
        return self._tile_dma(Op.DMA_STORE, core, tile, buf, row0, col0, index, loc)

    def restick(self, core: int, src, dst, shape=None, fmt=None, loc=None) -> int:
        """RESTICK on ``core``'s DMA engine: device ``dst[b, j, i] = src[b, i, j]`` (a transpose of the last
        two dims through device memory, canonical stick layout on both sides). ``src`` and ``dst`` are
        buffers (``shape`` defaults to the source buffer's: [.., n, k], batch = product of the leading dims)
        or device byte addresses (then ``shape`` = (m, n, k) or (n, k), and ``fmt`` are required)."""
        if shape is None:
            if not isinstance(src, Buffer):
                raise ValueError("restick: give shape (and fmt) with raw addresses")
            shape = src.shape if len(src.shape) >= 2 else (1,) + tuple(src.shape)
        shape = tuple(int(d) for d in shape)
        if len(shape) < 2:
            raise ValueError(f"restick needs at least 2 dims, got {shape}")
        m, n, k = int(np.prod(shape[:-2], dtype=np.int64)), shape[-2], shape[-1]
        fmt = _fmt(fmt if fmt is not None else src.fmt)
        for b_ in (src, dst):
            if isinstance(b_, Buffer) and b_.fmt is not fmt:
                raise ValueError(f"buffer '{b_.name}' is {b_.fmt.key}, the restick moves {fmt.key}")
        s = src.addr if isinstance(src, Buffer) else int(src)
        d = dst.addr if isinstance(dst, Buffer) else int(dst)
        return self.emit(core, Op.RESTICK, loc or _caller_loc(), dev=s, a0=d & 0xFFFFFFFF, a1=d >> 32, m=m, n=n,
                         k=k, f0=int(fmt))

    # ---- compute ----------------------------------------------------------------------------------------

    def matmul(self, core: int, a: Tile, b: Tile, c: Tile, accumulate: bool = False, out: Tile | None = None,
               bias: Tile | None = None, scale: float | None = None, col_scale: Tile | None = None,
               window: tuple[int, int, int] | None = None, trans_b: bool = False, loc=None) -> int:
        """PT matmul: ``c (+)= a @ b``; with ``out``, also ``out = fmt(c * scale * col_scale + bias)``.
        ``window`` = (offset, stride, n): the B operand is ``b[:, offset + j * stride]`` for j < n, zero where
        that column is outside ``b`` (a convolution's shifted, strided, zero-padded input columns).
        ``trans_b``: ``b`` holds B transposed, [N, K] (the product is ``a @ b.T``)."""
        flags = MatmulFlag.TRANS_B if trans_b else MatmulFlag(0)
        f = dict(m=a.rows, n=b.rows if trans_b else b.cols, k=a.cols, a0=a.addr, f0=int(a.fmt), a1=b.addr,
                 f1=int(b.fmt), a2=c.addr, f2=int(c.fmt))
        if window is not None:
            off, stride, n = window
            flags |= MatmulFlag.WINDOW
            f.update(n=n, mask=b.cols, fn=stride, dev=off & (2**64 - 1))
        if accumulate:
            flags |= MatmulFlag.ACC
        if out is not None:
            flags |= MatmulFlag.OUT
            f.update(a3=out.addr, f3=int(out.fmt))
        if bias is not None:
            flags |= MatmulFlag.BIAS
            f.update(a4=bias.addr, f4=int(bias.fmt))
        if scale is not None:
            flags |= MatmulFlag.SCALE
            f.update(imm=float(scale))
        if col_scale is not None:
            flags |= MatmulFlag.COLSCALE
            f.update(a5=col_scale.addr, f5=int(col_scale.fmt))
        return self.emit(core, Op.MATMUL, loc or _caller_loc(), flags=int(flags), **f)

    def sfu(self, core: int, fn, dst: Tile, src0: Tile | None = None, src1: Tile | float | None = None,
            imm: float | None = None, swap: bool = False, loc=None) -> int:
        """SFU op ``dst = fn(src0[, src1])``. ``src1`` may be a tile shaped [m,n], [m,1] (per row), [1,n]
        (per column), [1,1], or a Python number (the immediate). ``imm`` is the scalar of CAST (scale),
        POWS (exponent), FILL (value) and SELECT (else-value)."""
        fn = sfu_fn(fn)
        f = dict(fn=int(fn), m=dst.rows, n=dst.cols, a0=dst.addr, f0=int(dst.fmt))
        if src0 is not None:
            f.update(a1=src0.addr, f1=int(src0.fmt))
        flags = 0
        if isinstance(src1, Tile):
            shape = (src1.rows, src1.cols)
            if shape == (dst.rows, dst.cols):
                mode = Bcast.FULL
            elif shape == (dst.rows, 1):
                mode = Bcast.ROW
            elif shape == (1, dst.cols):
                mode = Bcast.COL
            elif shape == (1, 1):
                mode = Bcast.SCALAR
            else:
                raise ValueError(f"src1 shape {shape} does not broadcast to {(dst.rows, dst.cols)}")
            flags = int(mode)
            f.update(a2=src1.addr, f2=int(src1.fmt))
        elif src1 is not None:
            flags = int(Bcast.IMM)
            imm = float(src1)
        if swap:
            flags |= SFU_SWAP
        if fn is SfuFn.CAST and imm is None:
            imm = 1.0
        if imm is not None:
            f["imm"] = float(imm)
        return self.emit(core, Op.SFU, loc or _caller_loc(), flags=flags, **f)

    def reduce(self, core: int, fn, dst: Tile, src: Tile, loc=None) -> int:
        """Row reduction ``dst[m,1] = fn(src[m,n], axis=1)`` (sum, max, min, mean), accumulating in fp32."""
        fn = ReduceFn[fn.upper()] if isinstance(fn, str) else ReduceFn(fn)
        return self.emit(core, Op.REDUCE, loc or _caller_loc(), fn=int(fn), m=src.rows, n=src.cols,
                         a0=dst.addr, f0=int(dst.fmt), a1=src.addr, f1=int(src.fmt))

    # ---- synchronization and the ring -------------------------------------------------------------------

    def barrier(self, cores=None, loc=None, among=None) -> None:
        """Every core in ``cores`` (default: all) meets here: one BARRIER appended to each of their streams, unless
        each one's last instruction is this very barrier (an op that moves nothing, a view, asks for one too).
        ``among``: the cores the barrier joins when more than these (the rest get theirs from another call, as
        kernels emitted group by group do)."""
        cores = range(self.target.num_cores) if cores is None else list(cores)
        mask = sum(1 << c for c in (cores if among is None else among))
        if all(self._records[c] and self._last(c) == {"op": int(Op.BARRIER), "mask": mask} for c in cores):
            return      # the same cores just met, and nothing happened on them since
        loc = loc or _caller_loc()
        for c in cores:
            self.emit(c, Op.BARRIER, loc, mask=mask)

    def _last(self, core: int) -> dict:
        """The last instruction ``core`` runs so far."""
        e = self._records[core][-1]
        return e.last() if isinstance(e, _Loop) else e

    def ring_send(self, core: int, to, dst_addr: int, src: Tile | int, nbytes: int | None = None,
                  loc=None) -> int:
        """Copy ``nbytes`` (default: the whole tile) from ``core``'s scratchpad to ``dst_addr`` on core ``to``,
        or on each core of ``to`` when it is a collection (one multicast instruction). Delivered at the
        sender's next barrier, which must include every destination."""
        addr = src.addr if isinstance(src, Tile) else int(src)
        nbytes = src.nbytes if nbytes is None else nbytes
        to = sorted(set(to)) if isinstance(to, (list, tuple, set, frozenset, range)) else [int(to)]
        dest = dict(core=to[0]) if len(to) == 1 else dict(mask=sum(1 << c for c in to))
        return self.emit(core, Op.RING_SEND, loc or _caller_loc(), a0=dst_addr, a1=addr, k=nbytes, **dest)

    def ring_reduce(self, cores, dst: Tile, src: Tile, root: int | None = None, loc=None) -> None:
        """Reduce-sum ``src`` over ``cores`` into ``dst`` on ``root`` (or on every member if None).
        Emitted on every member (same addresses on each core); completes at their next common barrier."""
        cores = list(cores)
        mask = sum(1 << c for c in cores)
        loc = loc or _caller_loc()
        for c in cores:
            self.emit(c, Op.RING_REDUCE, loc, mask=mask, core=ROOT_ALL if root is None else root,
                      m=src.rows, n=src.cols, a0=dst.addr, f0=int(dst.fmt), a1=src.addr, f1=int(src.fmt))

    # ---- host -------------------------------------------------------------------------------------------

    def host(self, core: int, op: str, inputs, outputs, loc=None, **attrs) -> int:
        """Run a host op (``gather``, ``copy``, ``call``) on device buffers, in ``core``'s stream order.
        Surround it with barriers if other cores produce its inputs or consume its outputs."""
        self.host_ops.append({"op": op, "inputs": [b.name for b in inputs],
                              "outputs": [b.name for b in outputs], "attrs": attrs})
        return self.emit(core, Op.HOST, loc or _caller_loc(), k=len(self.host_ops) - 1)

    # ---- output -----------------------------------------------------------------------------------------

    def program(self) -> Program:
        """The assembled program (END appended to every stream that lacks one). A stream holds the loops kernels
        emitted as such (:meth:`roll_tail`) as LOOP and STEP records, the form a file stores."""
        code, debug = [], []
        for c, entries in enumerate(self._records):
            recs, dbg = [], []
            for e, d in zip(entries, self._debug[c]):
                if isinstance(e, _Loop):
                    recs += [{"op": int(Op.LOOP), "m": e.trips, "n": len(e.body)}, *e.body,
                             *({"op": int(Op.STEP), **s} for s in e.steps)]
                    dbg += [("", "")] + e.debug + [("", "")] * len(e.steps)
                else:
                    recs.append(e)
                    dbg.append(d)
            if not recs or recs[-1]["op"] != Op.END:
                recs.append({"op": int(Op.END)})
                dbg.append(("end", ""))
            arr = np.zeros(len(recs), dtype=INSTR_DTYPE)
            # Records with the same fields (an opcode's, mostly) together, then a column at a time: one numpy
            # call per field of each such group.
            groups: dict[tuple, tuple[list, list]] = {}
            for i, r in enumerate(recs):
                at, rows = groups.setdefault(tuple(r), ([], []))
                at.append(i)
                rows.append(tuple(r.values()))
            for keys, (at, rows) in groups.items():
                for key, vals in zip(keys, zip(*rows)):
                    arr[key][at] = np.array(vals, dtype=INSTR_DTYPE.fields[key][0])
            code.append(arr)
            debug.append(dbg)
        return Program(
            num_cores=self.target.num_cores, fingerprint=self.target.fingerprint(),
            device_bytes=max(self._next_addr, BUFFER_ALIGN), buffers=list(self.buffers),
            inputs=[b.name for b in self.buffers if b.kind == "input"],
            outputs=self.output_order or [b.name for b in self.buffers if b.kind == "output"],
            constants=dict(self.constants),
            host_ops=list(self.host_ops), code=code, debug=debug, producer=self.producer,
            numerics=self.numerics, host_code=self.host_code)

    def to_bytes(self) -> bytes:
        """The .spyre image."""
        return program_to_bytes(self.program())

    def write(self, path) -> None:
        """Write the .spyre file atomically."""
        write_program(self.program(), path)

    def layout(self) -> tuple[int, list]:
        """The .spyre image as its pieces (:func:`.binary.program_layout`): written or joined without a copy
        of each constant made first."""
        return program_layout(self.program())

    def load(self, numerics: str | None = None):
        """Serialize, then load through the full validating loader (what a real run does)."""
        from .loader import load_bytes
        return load_bytes(self.to_bytes(), target=self.target, numerics=numerics)


def listing(prog: Program) -> str:
    """A program as text: buffers, then per core one line per record as the file stores it (``core:record``,
    then :func:`isa.describe`, loop bodies and steps indented) with its source location, then the host ops.
    The one disassembler: what ``spyre-run --disassemble`` and ``spyre-compile --emit=program`` print. Reads
    only the container and the loop structure (no semantic checks), so half-valid files can be inspected too."""
    lines = [f"// program: {prog.num_cores} core(s), {prog.device_bytes} B device memory, "
             f"{len(prog.host_ops)} host op(s)"]
    for buf in prog.buffers:
        lines.append(f"// buffer {buf.name}: {buf.kind} {buf.fmt.key}{list(buf.shape)} @ {buf.addr} "
                     f"({buf.nbytes} B)")
    debug = prog.debug or None
    rolled, _ = rolled_code(list(prog.code), debug, {})
    if rolled is None:              # debug info that does not match the code: left out
        rolled, debug = roll_streams(list(prog.code)), None
    for c, (code, (stored, origin)) in enumerate(zip(prog.code, rolled)):
        lines.append(f"core {c}: {len(code)} instructions"
                     + (f" stored in {len(stored)} records" if len(stored) != len(code) else ""))
        ends: list[int] = []            # where each enclosing loop's records end: the indentation
        for r, rec in enumerate(stored):
            while ends and ends[-1] <= r:
                ends.pop()
            dbg = debug[c][origin[r]][1] if debug is not None and origin[r] >= 0 else ""
            lines.append(f"  {c}:{r:<5d} {'  ' * len(ends)}{describe(rec, 12)}" + (f"  // {dbg}" if dbg else ""))
            if rec["op"] == Op.LOOP:
                ends.append(r + 1 + 2 * int(rec["n"]))
    for k, h in enumerate(prog.host_ops):
        attrs = h.get("attrs") or {}
        steps = attrs.get("program", {}).get("steps") if h["op"] == "eval" else None
        lines.append(f"// host_op {k}: {h['op']} {h['inputs']} -> {h['outputs']}"
                     + (f" fn={attrs.get('fn')}" if attrs.get("fn") else "")
                     + (f" ({len(steps)} steps)" if steps is not None else ""))
    return "\n".join(lines) + "\n"


def _to_device_image(buf: Buffer, bits: np.ndarray) -> np.ndarray:
    """Lay a storage array out in the buffer's stick layout (innermost rows padded with zeros), as bytes (uint8):
    the array itself when its rows are whole sticks (a model's weights are not copied once more)."""
    raw = np.ascontiguousarray(bits).view(np.uint8)
    rows = buf.rows
    raw = raw.reshape(rows, buf.row_bytes if raw.size == 0 else -1)   # an empty constant has no bytes to infer
    if raw.shape[1] != buf.row_bytes:
        raise ValueError(f"constant '{buf.name}': {raw.shape[1]} bytes per row, expected {buf.row_bytes}")
    if buf.pitch == buf.row_bytes:
        return raw.reshape(-1)          # rows of whole sticks: the array is the image
    img = np.zeros((rows, buf.pitch), dtype=np.uint8)
    img[:, :buf.row_bytes] = raw
    return img.reshape(-1)
