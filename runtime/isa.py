"""The Spyre program instruction set: one fixed 64-byte record per instruction.

Every instruction of every core is the same little-endian record (:data:`INSTR_DTYPE`), so a whole stream
decodes with one ``np.frombuffer`` and validation can look at any field without parsing. Fields are generic
(``m``, ``n``, ``k`` sizes; ``a0``..``a5`` scratchpad addresses or strides; ``f0``..``f5`` format codes);
what each one means for each opcode is the table :data:`FIELDS` below, which the assembler, the loader and
``docs/binary-format.md`` all follow. A field an opcode does not use must be zero: that keeps the encoding
canonical and turns most corruption into a clear load error.

Scratchpad tiles are always dense and row-major with the row pitch rounded up to whole 128-byte sticks
(:func:`tile_pitch`), so a tile is fully described by (address, rows, cols, format).
"""

from __future__ import annotations

import enum
import functools

import numpy as np

from .formats import STICK_BYTES, Format

__all__ = [
    "INSTR_DTYPE", "INSTR_BYTES", "Op", "SfuFn", "ReduceFn", "Bcast", "MatmulFlag", "SFU_BCAST_MASK",
    "SFU_SWAP", "FIELDS", "ALL_FIELDS", "ROOT_ALL", "SFU_UNARY", "SFU_BINARY", "SFU_CLASS", "PT_FORMATS",
    "tile_pitch", "tile_bytes", "describe", "sfu_fn",
]

INSTR_DTYPE = np.dtype([
    ("op", "u1"), ("fn", "u1"), ("flags", "<u2"),
    ("f0", "u1"), ("f1", "u1"), ("f2", "u1"), ("f3", "u1"), ("f4", "u1"), ("f5", "u1"),
    ("core", "<u2"), ("mask", "<u4"),
    ("m", "<u4"), ("n", "<u4"), ("k", "<u4"),
    ("a0", "<u4"), ("a1", "<u4"), ("a2", "<u4"), ("a3", "<u4"), ("a4", "<u4"), ("a5", "<u4"),
    ("dev", "<u8"), ("imm", "<f4"),
])
INSTR_BYTES = 64
assert INSTR_DTYPE.itemsize == INSTR_BYTES

ALL_FIELDS = tuple(n for n in INSTR_DTYPE.names if n != "op")
ROOT_ALL = 0xFFFF          # ring_reduce root meaning "every member receives the sum"


class Op(enum.IntEnum):
    """Opcodes. 0 is invalid so that a zeroed record never runs."""

    END = 1          # last instruction of every stream, and only there
    BARRIER = 2      # mask: cores that meet here (must include the issuing core)
    DMA_LOAD = 3     # device memory -> scratchpad, up to 3-D strided, whole sticks
    DMA_STORE = 4    # scratchpad -> device memory, same fields
    MATMUL = 5       # PT array: C[m,n] (+)= A[m,k] @ B[k,n], optional write-back with scale/bias
    SFU = 6          # elementwise unary/binary op on a [m,n] tile, fn = SfuFn
    REDUCE = 7       # row reduction [m,n] -> [m,1] on the SFU, fn = ReduceFn
    RING_SEND = 8    # copy scratchpad bytes into other cores' scratchpads over the ring (one, or a multicast)
    RING_REDUCE = 9  # reduce-sum of a tile across a group of cores (split-K)
    HOST = 10        # run entry k of the metadata host_ops table on the host (numpy)
    RESTICK = 11     # device memory -> device memory: swap the last two dims of [m, n, k] (DMA engine)
    GATHER = 12      # device rows picked by indices on the scratchpad -> scratchpad (an embedding lookup)
    LOOP = 13        # the next n records run m times (then n STEP records): a stored form, see .loops
    STEP = 14        # per trip, how far the matching body record's address fields move


class SfuFn(enum.IntEnum):
    """SFU functions. Unary ones read src0 only (and imm where noted); binary ones combine src0 with src1,
    which is broadcast per :class:`Bcast` (or is the immediate)."""

    CAST = 1        # dst = src0 * imm (imm is the scale; 1.0 for a plain format conversion)
    NEG = 2
    ABS = 3
    EXP = 4
    LOG = 5
    SQRT = 6
    RSQRT = 7
    RECIP = 8
    TANH = 9
    SIGMOID = 10
    GELU_ERF = 11
    GELU_TANH = 12
    SILU = 13
    RELU = 14
    POWS = 15       # dst = src0 ** imm
    FILL = 16       # dst = imm (no source)
    ADD = 32
    SUB = 33
    MUL = 34
    DIV = 35
    MAX = 36
    MIN = 37
    POW = 38
    EQ = 40         # comparisons give 1.0 / 0.0
    NE = 41
    LT = 42
    LE = 43
    GT = 44
    GE = 45
    SELECT = 48     # dst = src1 (broadcast) where src0 != 0 else imm


SFU_UNARY = frozenset(f for f in SfuFn if f < 32)
SFU_BINARY = frozenset(f for f in SfuFn if f >= 32)

# Cost class of each SFU function for the cycle model (target.sfu_cycles(class)).
def sfu_fn(fn) -> SfuFn:
    """An SFU function given by name ("exp") or code."""
    return SfuFn[fn.upper()] if isinstance(fn, str) else SfuFn(fn)


SFU_CLASS = {f: "simple" for f in SfuFn}
SFU_CLASS.update({f: "reciprocal" for f in (SfuFn.SQRT, SfuFn.RSQRT, SfuFn.RECIP, SfuFn.DIV)})
SFU_CLASS.update({f: "transcendental" for f in (SfuFn.EXP, SfuFn.LOG, SfuFn.TANH, SfuFn.SIGMOID,
                                                SfuFn.GELU_ERF, SfuFn.GELU_TANH, SfuFn.SILU,
                                                SfuFn.POWS, SfuFn.POW)})


class ReduceFn(enum.IntEnum):
    SUM = 1
    MAX = 2
    MIN = 3
    MEAN = 4


class Bcast(enum.IntEnum):
    """How SFU src1 is shaped relative to the [m,n] destination (flags bits 0-2)."""

    FULL = 0     # src1 is [m,n]
    ROW = 1      # src1 is [m,1]: one value per row (e.g. a row reduction's result)
    COL = 2      # src1 is [1,n]: one value per column (e.g. layernorm gamma)
    IMM = 3      # src1 is the immediate scalar
    SCALAR = 4   # src1 is a [1,1] tile


SFU_BCAST_MASK = 0x7
SFU_SWAP = 0x8   # binary ops compute f(src1, src0) instead of f(src0, src1)


class MatmulFlag(enum.IntFlag):
    ACC = 1        # C += A @ B (else C = A @ B)
    OUT = 2        # write back out = fmt3(C * scale * colscale + bias) at a3
    BIAS = 4       # bias [1,n] at a4, format f4 (needs OUT)
    SCALE = 8      # multiply by imm on write-back (needs OUT)
    COLSCALE = 16  # per-column scale [1,n] at a5, format f5 (needs OUT)
    WINDOW = 32    # B is read through a column window: B[k,j] = T[k, dev + j*fn] (0 outside T's mask columns)
    TRANS_B = 64   # B is stored transposed, as the tile T [N,K] (sticks along K): B[k,j] = T[j,k]


# Formats the PT array multiplies; bf16/fp16 data is converted to DLFloat16 before it gets here.
PT_FORMATS = frozenset({Format.DLF16, Format.FP8_E4M3, Format.FP8_E5M2, Format.INT8, Format.INT4})

# Field meanings per opcode: the single table the assembler, loader and docs follow. Unlisted fields must
# be zero (MATMUL and SFU list their optional fields; the loader also checks the flags that enable them).
FIELDS: dict[Op, dict[str, str]] = {
    Op.END: {},
    Op.BARRIER: {"mask": "bitmask of cores that meet (bit i = core i); includes the issuing core"},
    Op.DMA_LOAD: {
        "dev": "device byte address of the first row", "a0": "scratchpad byte address of the first row",
        "m": "outer count (3rd dim, >= 1)", "n": "rows per outer step (>= 1)",
        "k": "bytes per row (whole sticks)", "a1": "device outer stride (bytes)",
        "a2": "device row stride (bytes)", "a3": "scratchpad outer stride (bytes)",
        "a4": "scratchpad row stride (bytes)",
    },
    Op.MATMUL: {
        "flags": "MatmulFlag bits", "m": "M", "n": "N", "k": "K",
        "a0": "A tile [M,K]", "f0": "A format", "a1": "B tile [K,N] ([N,K] with TRANS_B)", "f1": "B format",
        "a2": "accumulator C [M,N]", "f2": "accumulator format (fp32, or int32 for int x int)",
        "a3": "write-back tile [M,N] (OUT)", "f3": "write-back format (OUT)",
        "a4": "bias [1,N] (BIAS)", "f4": "bias format (BIAS)",
        "a5": "per-column scale [1,N] (COLSCALE)", "f5": "column scale format (COLSCALE)",
        "imm": "scale (SCALE)",
        "mask": "columns of the stored B tile T [K,mask] (WINDOW)", "fn": "column stride of the window (WINDOW)",
        "dev": "column offset of the window, two's complement (WINDOW)",
    },
    Op.SFU: {
        "fn": "SfuFn", "flags": "bits 0-2 Bcast of src1, bit 3 SWAP", "m": "rows", "n": "cols",
        "a0": "dst [m,n]", "f0": "dst format", "a1": "src0 [m,n] (not FILL)", "f1": "src0 format",
        "a2": "src1 (binary ops and SELECT, shaped by Bcast)", "f2": "src1 format",
        "imm": "scalar operand: CAST scale, POWS exponent, FILL value, IMM src1, SELECT else-value",
    },
    Op.REDUCE: {"fn": "ReduceFn", "m": "rows", "n": "cols", "a0": "dst [m,1]", "f0": "dst format",
                "a1": "src [m,n]", "f1": "src format"},
    Op.RING_SEND: {"core": "destination core (when mask is 0)",
                   "mask": "destination cores of a multicast (two or more; then core is 0)",
                   "a0": "destination scratchpad address (on every destination)",
                   "a1": "source scratchpad address", "k": "bytes (whole sticks)"},
    Op.RING_REDUCE: {"mask": "cores taking part (includes the issuing core)",
                     "core": "root core receiving the sum, or 0xFFFF for every member", "m": "rows",
                     "n": "cols", "a0": "dst [m,n] (on the receivers)", "f0": "dst format",
                     "a1": "src [m,n]", "f1": "src format"},
    Op.HOST: {"k": "index into the metadata host_ops table"},
    Op.RESTICK: {"dev": "device byte address of the source [m, n, k] (canonical stick layout)",
                 "a0": "destination device byte address, bits 0-31", "a1": "destination address, bits 32-63",
                 "m": "batch (>= 1)", "n": "source rows (destination cols)",
                 "k": "source cols (destination rows)", "f0": "format of both tensors"},
}
FIELDS[Op.DMA_STORE] = FIELDS[Op.DMA_LOAD]
FIELDS[Op.LOOP] = {"m": "trip count (2..2^20)", "n": "body records that follow (then as many STEP records)"}
FIELDS[Op.STEP] = {f: "advance per trip of the body record's field, modulo its width"
                   for f in ("a0", "a1", "a2", "a3", "a4", "a5", "dev")}
FIELDS[Op.GATHER] = {
    "dev": "device byte address of the table's first row (a constant or input buffer)",
    "a0": "scratchpad byte address of the first destination row (rows k bytes apart)",
    "a1": "scratchpad byte address of the m indices", "f0": "index format (int32 or int64)",
    "a2": "table row stride (bytes)", "m": "rows to gather (>= 1)",
    "n": "table rows: every index must be in [0, n) (checked when it runs)", "k": "bytes per row (whole sticks)",
}


@functools.lru_cache(maxsize=4096)
def tile_pitch(cols: int, fmt: Format) -> int:
    """Row pitch in bytes of a scratchpad tile: the row's bytes rounded up to whole sticks (called for every
    tile of every instruction at load: cached)."""
    return -(-Format.parse(fmt).nbytes(cols) // STICK_BYTES) * STICK_BYTES


def tile_bytes(rows: int, cols: int, fmt: Format) -> int:
    """Bytes a [rows, cols] tile of ``fmt`` occupies in the scratchpad."""
    return rows * tile_pitch(cols, fmt)


def describe(rec, width: int = 0) -> str:
    """One record as text: the mnemonic, then every non-zero field its opcode uses as ``field=value`` in record
    order, numbers as stored (SFU and reduce functions by name), e.g. ``matmul flags=2 m=32 n=128 k=128 a1=8192
    f0=1 f1=1 a2=16384 f2=7``; an unknown opcode shows every non-zero field. ``width``: left-align the mnemonic
    in that many columns (listings). For reading, not for parsing."""
    try:
        op = Op(int(rec["op"]))
        name, fields = op.name.lower(), FIELDS[op]
    except ValueError:
        op, name, fields = None, f"op?{int(rec['op'])}", ALL_FIELDS
    parts = []
    for f in fields:
        v = rec[f].item()
        if f == "fn" and op in (Op.SFU, Op.REDUCE):
            v = _enum_name(SfuFn if op is Op.SFU else ReduceFn, v)
        elif f == "dev" and op is Op.MATMUL and v >> 63:
            v -= 1 << 64                          # a window's negative column offset
        if v:
            parts.append(f"{f}={v:g}" if isinstance(v, float) else f"{f}={v}")
    if width:
        return f"{name:<{width}s} {' '.join(parts)}"
    return " ".join([name] + parts)


def _enum_name(cls, v) -> str:
    try:
        member = cls(int(v))
    except ValueError:
        return f"?{int(v)}"
    return getattr(member, "key", member.name.lower())
