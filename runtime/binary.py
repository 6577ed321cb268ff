"""The ``.spyre`` file: a versioned, checksummed container, the only contract between compiler and runtime.

Layout (all integers little-endian; ``docs/binary-format.md`` is the full description)::

    header        80 B   magic, version, section count, core count, target fingerprint, file size, table crc
    section table 32 B x num_sections   kind, index, offset, length, crc32
    sections      metadata (JSON), constants (4096-aligned blobs), one code section per core, debug (JSON)

This module reads and writes the container and checks everything that can be checked without a target:
magic, version, file size, table and section checksums, section bounds and overlaps, the metadata schema and
the device-memory plan (buffers aligned, in bounds, not overlapping, canonical stick layout). Instruction
semantics are checked by the loader. Every problem raises :class:`BinaryFormatError` naming where it is.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import hashlib
import json
import os
import struct
import tempfile
import zlib
from typing import Any

import numpy as np

from spyre_mlir.errors import SpyreError

from .formats import STICK_BYTES, Format
from .isa import INSTR_BYTES, INSTR_DTYPE, describe
from .loops import MAX_UNROLLED, LoopError, roll_streams, unroll

__all__ = [
    "BinaryFormatError", "MAGIC", "VERSION", "Section", "Buffer", "Program", "Entry", "BUFFER_KINDS",
    "CONST_ALIGN", "BUFFER_ALIGN", "buffer_layout", "program_to_bytes", "program_from_bytes",
    "write_program", "read_container", "write_container", "container_layout", "program_layout", "atomic_write",
    "code_digest", "rolled_code", "image_of",
]

MAGIC = b"SPYREBIN"
VERSION = (1, 10)  # 1.1: RESTICK, host op eval, metadata numerics; 1.2: host code, host formats, buffer dtype;
#                  1.3: state buffers, entries (several programs sharing constants and state); 1.4: MATMUL
#                  WINDOW (a column window on B), DMA blocks whose rows interleave; 1.5: systems of several
#                  cards (header flag SYSTEM: the schedule as metadata, one CARD section per card); 1.6:
#                  RING_SEND multicast (a mask of destination cores); 1.7: MATMUL TRANS_B (B stored [N, K]);
#                  1.8: GATHER (rows of a table picked by indices on the scratchpad); 1.9: the debug section
#                  as a table of distinct (op, location) pairs and per record an index into it; 1.10: LOOP
#                  and STEP records (a run of instructions stored once with a trip count and strides)
_HEADER = struct.Struct("<8sHHIII32sQII8x")      # 80 bytes
_CRC_OFFSET = 64                                 # where the header checksum sits
_ENTRY = struct.Struct("<IIQQII")                # 32 bytes
HEADER_BYTES = _HEADER.size
CONST_ALIGN = 4096     # constants are page aligned in the file so they can be memory mapped
BUFFER_ALIGN = 4096    # device buffers start on 4 KiB boundaries
SECTION_ALIGN = 64
MAX_CORES = 32         # the core mask is 32 bits wide
MAX_JSON_BYTES = 64 << 20
BUFFER_KINDS = ("input", "output", "constant", "scratch", "state")
MAX_ENTRIES = 64
MAX_CARDS = 8
FLAG_SYSTEM = 1       # header flag: a system of several cards (runtime.system), not one card's program
ENTRY_SEP = ":"       # an entry's own buffers are named "<entry>:<name>" in a file with entries


class BinaryFormatError(SpyreError, ValueError):
    """A .spyre file (or a program about to be written) is malformed; the message says where and why."""


class Section(enum.IntEnum):
    METADATA = 1
    CONSTANTS = 2
    CODE = 3       # index = core, or entry * 256 + core in a file with entries
    DEBUG = 4
    CARD = 5       # a system file (FLAG_SYSTEM): index = card, the payload that card's whole .spyre file


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A tensor in device memory. ``strides`` are the byte strides of every dim but the innermost, which is
    packed and padded to whole sticks (the canonical Spyre layout, see :func:`buffer_layout`)."""

    name: str
    kind: str            # input | output | constant | scratch | state (persistent: zero at load, kept across calls)
    fmt: Format
    shape: tuple[int, ...]
    addr: int
    nbytes: int
    strides: tuple[int, ...]
    # The numpy dtype callers see (inputs and outputs: float16 data held as DLFloat16, say); "" means the
    # format's own value dtype.
    dtype: str = ""

    @property
    def row_bytes(self) -> int:
        """Meaningful bytes of one innermost row (without the stick padding)."""
        return self.fmt.nbytes(self.shape[-1] if self.shape else 1)

    @property
    def pitch(self) -> int:
        """Bytes from one innermost row to the next (row bytes padded to sticks)."""
        return -(-self.row_bytes // STICK_BYTES) * STICK_BYTES

    @property
    def rows(self) -> int:
        """Number of innermost rows (product of all outer dims)."""
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "format": self.fmt.key, "shape": list(self.shape),
                "addr": self.addr, "nbytes": self.nbytes, "strides": list(self.strides),
                **({"dtype": self.dtype} if self.dtype else {})}


IO_DTYPES = ("", "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
             "complex64", "complex128")


def buffer_layout(shape: tuple[int, ...], fmt: Format) -> tuple[tuple[int, ...], int]:
    """(outer byte strides, total bytes) of the canonical layout: row-major, innermost dim padded to sticks."""
    fmt = Format.parse(fmt)
    inner = shape[-1] if shape else 1
    pitch = -(-fmt.nbytes(inner) // STICK_BYTES) * STICK_BYTES
    strides = []
    acc = pitch
    for d in reversed(shape[:-1]):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides)), acc


@dataclasses.dataclass
class Entry:
    """One program of a file with several (``Program.entries``): its own inputs, outputs, host work and code,
    over the file's buffers. Buffers named ``"<entry>:..."`` belong to it; the others (constants, state) are
    shared by every entry."""

    name: str
    inputs: list[str]
    outputs: list[str]
    host_ops: list[dict]
    code: list[np.ndarray]
    debug: list[list[tuple[str, str]]] | None = None
    host_code: str = ""
    origin: list[np.ndarray] | None = None


@dataclasses.dataclass
class Program:
    """A whole program as the file holds it. ``code[c]`` is core c's instruction array (INSTR_DTYPE) in the
    order the instructions run (the file stores it with loops, :mod:`.loops`), or, from the assembler, holding the
    loops kernels emitted as such (LOOP and STEP records); ``constants`` maps buffer name to its device image
    (exactly ``nbytes`` bytes); ``debug[c][i]`` is (op name, source location) of core c's record i (``("", "")``
    for LOOP and STEP records); ``origin[c][i]``, for a program read from a file, the stored record instruction
    i came from (None: as it runs)."""

    num_cores: int
    fingerprint: str
    device_bytes: int
    buffers: list[Buffer]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, bytes | memoryview | np.ndarray]       # bytes-like (uint8 arrays too)
    host_ops: list[dict]
    code: list[np.ndarray]
    debug: list[list[tuple[str, str]]] | None = None
    producer: str = ""
    # How the compiler meant the program to run: "fp32-reference" for programs compiled without rounding.
    numerics: str = "faithful"
    # The host work as MLIR (LLVM dialect) text, compiled by LLVM when the binary is loaded; "" if none.
    host_code: str = ""
    # Several programs over shared constants and state (1.3): then inputs, outputs, host_ops and code are
    # empty and each entry has its own. Programs are called by entry name.
    entries: list[Entry] = dataclasses.field(default_factory=list)
    origin: list[np.ndarray] | None = None

    def entry_program(self, name: str) -> "Program":
        """The single-entry program an entry runs: the shared buffers plus the entry's own, named without
        the ``"<entry>:"`` prefix, and the entry's inputs, outputs, host work and code."""
        e = next((e for e in self.entries if e.name == name), None)
        if e is None:
            raise KeyError(name)
        pre = e.name + ENTRY_SEP
        strip = lambda n: n[len(pre):] if n.startswith(pre) else n     # noqa: E731
        bufs = [dataclasses.replace(b, name=strip(b.name)) for b in self.buffers
                if ENTRY_SEP not in b.name or b.name.startswith(pre)]
        host_ops = [{**h, "inputs": [strip(n) for n in h.get("inputs", [])],
                     "outputs": [strip(n) for n in h.get("outputs", [])]} for h in e.host_ops]
        return dataclasses.replace(self, buffers=bufs, inputs=[strip(n) for n in e.inputs],
                                   outputs=[strip(n) for n in e.outputs], host_ops=host_ops, code=e.code,
                                   debug=e.debug, host_code=e.host_code, entries=[], origin=e.origin)

    def buffer(self, name: str) -> Buffer:
        """The buffer called ``name`` (KeyError if there is none)."""
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------------------
# Container
# ---------------------------------------------------------------------------------------------------------


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def write_container(num_cores: int, fingerprint: str, sections: list[tuple[int, int, Any]],
                    flags: int = 0) -> bytearray:
    """The image of a container (:func:`container_layout`) in memory."""
    return _image(container_layout(num_cores, fingerprint, sections, flags))


def _image(layout: tuple[int, list[tuple[int, Any]]]) -> bytearray:
    size, pieces = layout
    out = bytearray(size)
    for off, data in pieces:
        out[off:off + len(data)] = data
    return out


def image_of(layout: tuple[int, list[tuple[int, Any]]]) -> memoryview:
    """The bytes of an image given as its pieces (:func:`container_layout`), to be loaded: a read-only view of
    memory numpy allocates, which Linux backs with huge pages (a bytearray's page faults made a Granite layer's
    400 MB image take 0.22 s, this 0.09 s)."""
    size, pieces = layout
    out = np.zeros(size, np.uint8)
    view = memoryview(out).cast("B")
    for off, data in pieces:
        data = memoryview(data).cast("B")
        view[off:off + len(data)] = data
    return memoryview(out).toreadonly()


def container_layout(num_cores: int, fingerprint: str, sections: list[tuple[int, int, Any]],
                     flags: int = 0) -> tuple[int, list[tuple[int, Any]]]:
    """Lay out (kind, index, payload) sections after the header and table, with alignment and checksums: the
    image as ``(size, [(offset, bytes-like), ...])``, its pieces in file order with zeros between. A payload is
    bytes-like, or such a ``(length, pieces)`` itself (the constants section): a real model's weights are
    hundreds of MB, copied once, into the image or straight into the file (:func:`atomic_write`)."""
    table_end = HEADER_BYTES + _ENTRY.size * len(sections)
    pos = table_end
    entries, chunks = [], []
    for kind, index, payload in sections:
        pos = _align(pos, CONST_ALIGN if kind == Section.CONSTANTS else SECTION_ALIGN)
        length, pieces = payload if isinstance(payload, tuple) else (len(payload), [(0, payload)])
        crc, at = 0, 0
        for off, data in pieces:
            crc = zlib.crc32(data, zlib.crc32(bytes(off - at), crc))
            at = off + len(data)
        entries.append((kind, index, pos, length, zlib.crc32(bytes(length - at), crc), 0))
        chunks += [(pos + off, data) for off, data in pieces]
        pos += length
    fp = bytes.fromhex(fingerprint)
    if len(fp) != 32:
        raise BinaryFormatError("header: target fingerprint must be 32 bytes (sha256)")
    table = b"".join(_ENTRY.pack(*e) for e in entries)
    head0 = _HEADER.pack(MAGIC, *VERSION, len(sections), num_cores, flags, fp, pos, 0, 0)
    crc = zlib.crc32(head0 + table)
    head = _HEADER.pack(MAGIC, *VERSION, len(sections), num_cores, flags, fp, pos, crc, 0)
    return pos, [(0, head + table)] + chunks


def code_digest(data: bytes | memoryview) -> bytes:
    """A digest of an image read by :func:`read_container` that leaves out the constants (hashing a model's
    weights is most of the work, and nothing derived from the code depends on their values): the header and
    section table without the checksums that cover the constants, and every other section."""
    data = memoryview(data)
    nsec = _HEADER.unpack_from(data, 0)[3]
    head = bytearray(data[:HEADER_BYTES + nsec * _ENTRY.size])
    head[_CRC_OFFSET:_CRC_OFFSET + 4] = bytes(4)
    h = hashlib.blake2b(digest_size=16)
    for i in range(nsec):
        at = HEADER_BYTES + i * _ENTRY.size
        kind, index, off, length, _, _ = _ENTRY.unpack_from(data, at)
        if kind == Section.CONSTANTS:
            _ENTRY.pack_into(head, at, kind, index, off, length, 0, 0)
        else:
            h.update(data[off:off + length])
    h.update(head)
    return h.digest()


def is_system(data: bytes | memoryview) -> bool:
    """The image's header says it is a system of several cards (FLAG_SYSTEM); nothing else is checked."""
    return len(data) >= HEADER_BYTES and bytes(data[:8]) == MAGIC and \
        _HEADER.unpack_from(memoryview(data), 0)[5] == FLAG_SYSTEM


def read_container(data: bytes | memoryview) -> tuple[int, str, list[tuple[int, int, memoryview]]]:
    """Check the header, the section table and every section checksum. Returns (num_cores, fingerprint hex,
    [(kind, index, payload view)]). A system file (FLAG_SYSTEM) holds metadata and one CARD section per card."""
    data = memoryview(data)
    size = len(data)
    if size < HEADER_BYTES:
        raise BinaryFormatError(f"header: file is {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, vmaj, vmin, nsec, ncores, flags, fp, fsize, crc, _ = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise BinaryFormatError(f"header: bad magic {bytes(magic)!r} (not a .spyre file)")
    if vmaj != VERSION[0] or vmin > VERSION[1]:
        raise BinaryFormatError(f"header: unsupported format version {vmaj}.{vmin} "
                                f"(this runtime reads {VERSION[0]}.0-{VERSION[0]}.{VERSION[1]})")
    if fsize != size:
        raise BinaryFormatError(f"header: file is {size} bytes but the header says {fsize} "
                                f"({'truncated' if size < fsize else 'extended'})")
    if not 1 <= ncores <= MAX_CORES:
        raise BinaryFormatError(f"header: core count {ncores} out of range 1..{MAX_CORES}")
    if flags not in (0, FLAG_SYSTEM):
        raise BinaryFormatError(f"header: unknown flags 0x{flags:x}")
    system = flags == FLAG_SYSTEM
    if system and not 2 <= nsec <= 1 + MAX_CARDS:
        raise BinaryFormatError(f"header: {nsec} sections for a system (expected metadata and 1..{MAX_CARDS} "
                                f"cards)")
    # Metadata, constants, one code section per core per entry, and maybe debug info.
    if not system and not any(2 + e * ncores <= nsec <= 3 + e * ncores for e in range(1, MAX_ENTRIES + 1)):
        raise BinaryFormatError(f"header: {nsec} sections for {ncores} cores (expected 2 + {ncores} per entry, "
                                f"+1 with debug info)")
    table_end = HEADER_BYTES + nsec * _ENTRY.size
    if table_end > size:
        raise BinaryFormatError("section table: runs past the end of the file")
    blank = bytearray(data[:HEADER_BYTES])
    blank[_CRC_OFFSET:_CRC_OFFSET + 4] = bytes(4)
    if zlib.crc32(bytes(blank) + bytes(data[HEADER_BYTES:table_end])) != crc:
        raise BinaryFormatError("header: checksum mismatch over header and section table")
    sections, seen, spans = [], set(), []
    for i in range(nsec):
        kind, index, off, length, scrc, reserved = _ENTRY.unpack_from(data, HEADER_BYTES + i * _ENTRY.size)
        where = f"section {i}"
        try:
            kind = Section(kind)
        except ValueError:
            raise BinaryFormatError(f"{where}: unknown section kind {kind}") from None
        where = f"section {i} ({kind.name.lower()}{f' core {index}' if kind == Section.CODE else ''}" \
                f"{f' {index}' if kind == Section.CARD else ''})"
        if kind == Section.CODE and index >= 256:
            where = f"section {i} (code entry {index // 256} core {index % 256})"
        if reserved:
            raise BinaryFormatError(f"{where}: reserved field is not zero")
        if (kind == Section.CARD and not system) or (kind in (Section.CONSTANTS, Section.CODE, Section.DEBUG)
                                                     and system):
            raise BinaryFormatError(f"{where}: a {kind.name.lower()} section in a "
                                    f"{'system' if system else 'one-card'} file")
        if (kind == Section.CODE and (index % 256 >= ncores or index // 256 >= MAX_ENTRIES)) or \
                (kind == Section.CARD and index >= nsec - 1) or \
                (kind not in (Section.CODE, Section.CARD) and index != 0):
            raise BinaryFormatError(f"{where}: bad index {index}")
        if (kind, index) in seen:
            raise BinaryFormatError(f"{where}: duplicate section")
        seen.add((kind, index))
        if off < table_end or off + length > size:
            raise BinaryFormatError(f"{where}: range [{off}, {off + length}) outside the file "
                                    f"(data area is [{table_end}, {size}))")
        if off % (CONST_ALIGN if kind == Section.CONSTANTS else SECTION_ALIGN):
            raise BinaryFormatError(f"{where}: offset {off} is not aligned")
        payload = data[off:off + length]
        if zlib.crc32(payload) != scrc:
            raise BinaryFormatError(f"{where}: checksum mismatch")
        spans.append((off, off + length, where))
        sections.append((int(kind), index, payload))
    spans.sort()
    for (a0, a1, w0), (b0, b1, w1) in zip(spans, spans[1:]):
        if b0 < a1:
            raise BinaryFormatError(f"{w1}: overlaps {w0}")
    needs = [(Section.METADATA, 0)] + ([(Section.CARD, c) for c in range(nsec - 1)] if system else
                                       [(Section.CONSTANTS, 0)] + [(Section.CODE, c) for c in range(ncores)])
    for need in needs:
        if need not in seen:
            raise BinaryFormatError(f"section table: missing {need[0].name.lower()} section"
                                    + (f" for core {need[1]}" if need[0] == Section.CODE else ""))
    return ncores, bytes(fp).hex(), sections


# ---------------------------------------------------------------------------------------------------------
# Program <-> bytes
# ---------------------------------------------------------------------------------------------------------


def program_to_bytes(prog: Program) -> bytearray:
    """Serialize a program (the image, bytes-like; :func:`program_layout`)."""
    return _image(program_layout(prog))


def program_layout(prog: Program) -> tuple[int, list[tuple[int, Any]]]:
    """A program's image as its pieces (:func:`container_layout`). Constants are placed 4096-aligned inside the
    constants section."""
    const_table, blobs, pos = [], [], 0
    for name in sorted(prog.constants):
        buf = prog.buffer(name)
        data = memoryview(prog.constants[name]).cast("B")
        pos = _align(pos, CONST_ALIGN)
        const_table.append({"buffer": name, "offset": pos, "length": len(data), "addr": buf.addr,
                            "format": buf.fmt.key})
        blobs.append((pos, data))
        pos += len(data)
    meta = {
        "producer": prog.producer, "numerics": prog.numerics, "num_cores": prog.num_cores,
        "device_bytes": prog.device_bytes,
        "buffers": [b.to_json() for b in prog.buffers], "inputs": list(prog.inputs),
        "outputs": list(prog.outputs), "constants": const_table, "host_ops": prog.host_ops,
        **({"host_code": prog.host_code} if prog.host_code else {}),
    }
    streams, debug = [prog.code], [prog.debug]
    if prog.entries:
        meta["entries"] = [{"name": e.name, "inputs": list(e.inputs), "outputs": list(e.outputs),
                            "host_ops": e.host_ops, **({"host_code": e.host_code} if e.host_code else {})}
                           for e in prog.entries]
        streams, debug = [e.code for e in prog.entries], [e.debug for e in prog.entries]
    if any(d is None for d in debug):
        debug = None
    sections = [(Section.METADATA, 0, json.dumps(meta, separators=(",", ":")).encode()),
                (Section.CONSTANTS, 0, (pos, blobs))]
    # A table of the distinct (op, location) pairs and each stored record's index into it (1.9): a program
    # repeats a few dozen pairs over up to millions of instructions. LOOP and STEP records have no location.
    table: dict[tuple[str, str], int] = {}
    records = []
    for j, codes in enumerate(streams):
        codes = [np.ascontiguousarray(c, dtype=INSTR_DTYPE) for c in codes]
        rolled, keys = rolled_code(codes, None if debug is None else debug[j], table)
        if rolled is None:
            # Debug info that does not match the code: written as it is, unrolled (the loader rejects it).
            sections += [(Section.CODE, j * 256 + c, code.tobytes()) for c, code in enumerate(codes)]
            records.append(keys)
            continue
        for c, (stored, origin) in enumerate(rolled):
            sections.append((Section.CODE, j * 256 + c, stored.tobytes()))
        if keys is not None:
            none = table.setdefault(("", ""), len(table)) if any((o < 0).any() for _, o in rolled) else 0
            records.append([np.where(o >= 0, np.asarray(k, dtype=np.int64)[np.maximum(o, 0)], none).tolist()
                            for k, (_, o) in zip(keys, rolled)])
    if debug is not None:
        payload = {"locations": [list(d) for d in table], "records": records if prog.entries else records[0]}
        sections.append((Section.DEBUG, 0, json.dumps(payload, separators=(",", ":")).encode()))
    return container_layout(prog.num_cores, prog.fingerprint, sections)


def rolled_code(codes: list[np.ndarray], debug, table: dict) -> tuple[list | None, list | None]:
    """Each core's instructions as a file stores them (:func:`.loops.roll_streams`; a loop's trips share their
    source location), and the index of each instruction's (op, location) pair in ``table`` (distinct pair ->
    index, grown here; None without ``debug``). The rolled streams are None when ``debug`` does not match the
    code (a core or an instruction more or less)."""
    keys = None if debug is None else [[table.setdefault(tuple(d), len(table)) for d in core] for core in debug]
    if keys is not None and (len(keys) != len(codes) or any(len(k) != len(c) for k, c in zip(keys, codes))):
        return None, keys
    return roll_streams(codes, keys), keys


def write_program(prog: Program, path: str | os.PathLike) -> None:
    """Write a program to a .spyre file atomically (see :func:`atomic_write`), its pieces straight into the
    file."""
    atomic_write(path, program_layout(prog))


def atomic_write(path: str | os.PathLike, data) -> None:
    """Write ``data`` (bytes-like, or an image as ``(size, pieces)``, :func:`container_layout`) atomically: a
    temp file in the same directory, fsync, then os.replace. A failed write leaves the old file (or nothing),
    never half a file."""
    path = os.fspath(path)
    size, pieces = data if isinstance(data, tuple) else (len(data), [(0, data)])
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            at = 0
            for off, piece in pieces:
                f.write(bytes(off - at))            # alignment: a few KB at most
                f.write(piece)
                at = off + len(piece)
            f.write(bytes(size - at))
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)        # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _json(payload: memoryview, where: str, limit: int = MAX_JSON_BYTES) -> Any:
    if len(payload) > limit:
        raise BinaryFormatError(f"{where}: {len(payload)} bytes, larger than the {limit} limit")
    try:
        return json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BinaryFormatError(f"{where}: not valid JSON ({e.__class__.__name__}: {e})") from None


def _get(obj: dict, key: str, typ, where: str):
    if not isinstance(obj, dict):
        raise BinaryFormatError(f"{where}: expected an object")
    if key not in obj:
        raise BinaryFormatError(f"{where}: missing '{key}'")
    v = obj[key]
    ok = (isinstance(v, int) and not isinstance(v, bool) and v >= 0) if typ is int else isinstance(v, typ)
    if not ok:
        raise BinaryFormatError(f"{where}.{key}: expected {'a non-negative integer' if typ is int else typ.__name__}"
                                f", got {v!r:.60}")
    return v


def _parse_buffers(meta: dict, device_bytes: int) -> list[Buffer]:
    bufs, names = [], set()
    for i, b in enumerate(_get(meta, "buffers", list, "metadata")):
        w = f"metadata.buffers[{i}]"
        name = _get(b, "name", str, w)
        if not name or name in names:
            raise BinaryFormatError(f"{w}.name: empty or duplicate buffer name {name!r}")
        names.add(name)
        w = f"metadata.buffers[{i}] ('{name}')"
        kind = _get(b, "kind", str, w)
        if kind not in BUFFER_KINDS:
            raise BinaryFormatError(f"{w}.kind: {kind!r} is not one of {', '.join(BUFFER_KINDS)}")
        fmt_name = _get(b, "format", str, w)
        try:
            fmt = Format.parse(fmt_name)
        except ValueError as e:
            raise BinaryFormatError(f"{w}.format: {e}") from None
        shape = _get(b, "shape", list, w)
        if len(shape) > 8 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 1 << 40
                                     for d in shape):
            raise BinaryFormatError(f"{w}.shape: expected up to 8 dims of 0 or more, got {shape!r:.80}")
        shape = tuple(shape)
        strides, nbytes = buffer_layout(shape, fmt)
        addr = _get(b, "addr", int, w)
        if _get(b, "nbytes", int, w) != nbytes or tuple(_get(b, "strides", list, w)) != strides:
            raise BinaryFormatError(f"{w}: layout is not the canonical stick layout "
                                    f"(expected nbytes {nbytes}, strides {list(strides)})")
        if addr % BUFFER_ALIGN:
            raise BinaryFormatError(f"{w}.addr: {addr} is not {BUFFER_ALIGN}-byte aligned")
        if addr + nbytes > device_bytes:
            raise BinaryFormatError(f"{w}: [{addr}, {addr + nbytes}) exceeds device_bytes {device_bytes}")
        dtype = b.get("dtype", "")
        if dtype not in IO_DTYPES:
            raise BinaryFormatError(f"{w}.dtype: {dtype!r:.40} is not one of {', '.join(filter(None, IO_DTYPES))}")
        bufs.append(Buffer(name, kind, fmt, shape, addr, nbytes, strides, dtype))
    # Scratch buffers may share memory with each other (liveness-based reuse); nothing else may overlap.
    spans = sorted((b.addr, b.addr + b.nbytes, b.name) for b in bufs if b.kind != "scratch")
    for (a0, a1, n0), (b0, b1, n1) in zip(spans, spans[1:]):
        if b0 < a1:
            raise BinaryFormatError(f"metadata.buffers: '{n1}' overlaps '{n0}' in device memory")
    starts = [s[0] for s in spans]
    for b in bufs:
        if b.kind == "scratch":
            j = bisect.bisect_left(starts, b.addr + b.nbytes) - 1     # last span starting before b ends
            if j >= 0 and spans[j][1] > b.addr:
                raise BinaryFormatError(f"metadata.buffers: scratch '{b.name}' overlaps '{spans[j][2]}' in "
                                        f"device memory")
    return bufs


def program_from_bytes(data: bytes | memoryview) -> Program:
    """Parse and structurally validate a .spyre image (no target needed). Raises BinaryFormatError."""
    ncores, fp, sections = read_container(data)
    if any(k == Section.CARD for k, _, _ in sections):
        raise BinaryFormatError("header: a system of several cards, not one card's program (runtime.load "
                                "reads both)")
    by_kind = {(k, i): p for k, i, p in sections}
    meta = _json(by_kind[(Section.METADATA, 0)], "metadata")
    if not isinstance(meta, dict):
        raise BinaryFormatError("metadata: expected a JSON object")
    if _get(meta, "num_cores", int, "metadata") != ncores:
        raise BinaryFormatError(f"metadata.num_cores: {meta['num_cores']} but the header says {ncores}")
    device_bytes = _get(meta, "device_bytes", int, "metadata")
    buffers = _parse_buffers(meta, device_bytes)
    by_name = {b.name: b for b in buffers}
    io = {}
    has_entries = "entries" in meta
    for key, kind in (("inputs", "input"), ("outputs", "output")):
        names = _get(meta, key, list, "metadata")
        for j, n in enumerate(names):
            if not isinstance(n, str) or n not in by_name or by_name[n].kind != kind:
                raise BinaryFormatError(f"metadata.{key}[{j}]: {n!r:.60} is not a buffer of kind '{kind}'")
        top = [b for b in buffers if b.kind == kind and not (has_entries and ENTRY_SEP in b.name)]
        if len(set(names)) != len(names) or len(names) != len(top):
            raise BinaryFormatError(f"metadata.{key}: must list every '{kind}' buffer exactly once")
        io[key] = list(names)
    blob = by_kind[(Section.CONSTANTS, 0)]
    constants = {}
    for j, c in enumerate(_get(meta, "constants", list, "metadata")):
        w = f"metadata.constants[{j}]"
        name = _get(c, "buffer", str, w)
        buf = by_name.get(name)
        if buf is None or buf.kind != "constant" or name in constants:
            raise BinaryFormatError(f"{w}.buffer: {name!r:.60} is not a constant buffer (or listed twice)")
        off, length = _get(c, "offset", int, w), _get(c, "length", int, w)
        if off % CONST_ALIGN:
            raise BinaryFormatError(f"{w}.offset: {off} is not {CONST_ALIGN}-byte aligned")
        if length != buf.nbytes or _get(c, "addr", int, w) != buf.addr or _get(c, "format", str, w) != buf.fmt.key:
            raise BinaryFormatError(f"{w}: length/addr/format do not match buffer '{name}'")
        if off + length > len(blob):
            raise BinaryFormatError(f"{w}: [{off}, {off + length}) outside the constants section "
                                    f"({len(blob)} bytes)")
        constants[name] = blob[off:off + length]
    missing = [b.name for b in buffers if b.kind == "constant" and b.name not in constants]
    if missing:
        raise BinaryFormatError(f"metadata.constants: no data for constant buffer(s) {', '.join(missing)}")
    host_ops = _get(meta, "host_ops", list, "metadata")
    entries_meta = meta.get("entries")
    if entries_meta is None:
        stored = _parse_code(by_kind, ncores, 0)
        debug = _parse_debug(by_kind, stored) if (Section.DEBUG, 0) in by_kind else None
        code, debug, origin = _unroll(stored, debug)
        entries = []
    else:
        entries = _parse_entries(entries_meta, by_kind, ncores, by_name, io, host_ops)
        code, debug, origin = [], None, None
    entry_state = [b.name for b in buffers if b.kind == "state" and ENTRY_SEP in b.name]
    if entry_state:
        raise BinaryFormatError(f"metadata.buffers: state buffer '{entry_state[0]}' belongs to one entry; "
                                f"state is shared by every entry")
    producer = meta.get("producer", "")
    numerics = meta.get("numerics", "faithful")
    if numerics not in ("faithful", "fp32-reference"):
        raise BinaryFormatError(f"metadata.numerics: {numerics!r:.40} is not faithful or fp32-reference")
    host_code = meta.get("host_code", "")
    if not isinstance(host_code, str):
        raise BinaryFormatError("metadata.host_code: expected a string")
    return Program(ncores, fp, device_bytes, buffers, io["inputs"], io["outputs"], constants, host_ops,
                   code, debug, producer if isinstance(producer, str) else "", numerics, host_code, entries,
                   origin)


def _parse_code(by_kind, ncores: int, base: int, where: str = "") -> list[np.ndarray]:
    code = []
    for c in range(ncores):
        payload = by_kind.get((Section.CODE, base + c))
        if payload is None:
            raise BinaryFormatError(f"code{where} core {c}: section missing")
        if len(payload) == 0 or len(payload) % INSTR_BYTES:
            raise BinaryFormatError(f"code{where} core {c}: {len(payload)} bytes is not a positive multiple of "
                                    f"{INSTR_BYTES}")
        code.append(np.frombuffer(payload, dtype=INSTR_DTYPE))
    return code


def _unroll(stored: list[np.ndarray], debug, where: str = ""):
    """Each core's stored records as the instructions run (:func:`.loops.unroll`), with their debug pairs and
    the stored record of each (None when no stream has a loop)."""
    code, origin = [], []
    left = MAX_UNROLLED        # for the whole program: a few damaged trip counts must not take all the memory
    for c, recs in enumerate(stored):
        try:
            run, orig = unroll(recs, left)
            left -= len(run)
        except LoopError as e:
            raise BinaryFormatError(f"code{where} core {c} record {e.record} "
                                    f"({describe(recs[e.record])}): {e}") from None
        code.append(run)
        origin.append(orig)
    if debug is not None:
        debug = [d if run is recs else [d[i] for i in o.tolist()]
                 for d, o, run, recs in zip(debug, origin, code, stored)]
    return code, debug, (origin if any(r is not s for r, s in zip(code, stored)) else None)


def _check_debug(dbg, code, where: str, pairs: list | None = None) -> list:
    """Per core, the (op, location) pair of each record. ``dbg`` holds them (the form before 1.9), or, with
    ``pairs`` (1.9's table of distinct pairs), their indices into it."""
    if not isinstance(dbg, list) or len(dbg) != len(code):
        raise BinaryFormatError(f"debug{where}: expected a list of {len(code)} per-core lists")
    out = []
    for c, core in enumerate(dbg):
        if pairs is not None:
            if (not isinstance(core, list) or len(core) != len(code[c]) or not all(type(i) is int for i in core)
                    or (core and not 0 <= min(core) <= max(core) < len(pairs))):
                raise BinaryFormatError(f"debug{where} core {c}: expected {len(code[c])} indices into "
                                        f"debug.locations ({len(pairs)} pairs)")
            out.append([pairs[i] for i in core])
            continue
        if (not isinstance(core, list) or len(core) != len(code[c])
                or not all(isinstance(d, list) and len(d) == 2 and all(isinstance(s, str) for s in d)
                           for d in core)):
            raise BinaryFormatError(f"debug{where} core {c}: expected {len(code[c])} [op, location] string pairs")
        out.append([(d[0], d[1]) for d in core])
    return out


def _debug_table(dbg) -> tuple[Any, list | None]:
    """The debug section's records, and 1.9's table of distinct (op, location) pairs they index (None: the
    records are the pairs themselves, as before 1.9)."""
    if not isinstance(dbg, dict):
        return dbg, None
    locs = dbg.get("locations")
    if set(dbg) != {"locations", "records"} or not isinstance(locs, list) or not all(
            isinstance(d, list) and len(d) == 2 and all(isinstance(s, str) for s in d) for d in locs):
        raise BinaryFormatError("debug: expected {\"locations\": [[op, location], ...], \"records\": [...]}")
    return dbg["records"], [(d[0], d[1]) for d in locs]


def _debug_limit(by_kind) -> int:
    """Debug info grows with the code (a source location per record): 1 KiB per record beyond the base."""
    records = sum(len(p) // INSTR_BYTES for (k, _), p in by_kind.items() if k == Section.CODE)
    return MAX_JSON_BYTES + 1024 * records


def _parse_debug(by_kind, code) -> list:
    records, pairs = _debug_table(_json(by_kind[(Section.DEBUG, 0)], "debug", _debug_limit(by_kind)))
    return _check_debug(records, code, "", pairs)


def _parse_entries(entries_meta, by_kind, ncores: int, by_name: dict, io: dict, host_ops) -> list[Entry]:
    """Entries (1.3): each names its inputs and outputs (buffers of its own, "<entry>:..."); the top-level
    inputs, outputs, host_ops and code are then empty."""
    if not isinstance(entries_meta, list) or not 1 <= len(entries_meta) <= MAX_ENTRIES:
        raise BinaryFormatError(f"metadata.entries: expected a list of 1..{MAX_ENTRIES} entries")
    if io["inputs"] or io["outputs"] or host_ops:
        raise BinaryFormatError("metadata.entries: a file with entries has no top-level inputs, outputs or "
                                "host_ops")
    dbg, pairs = _debug_table(_json(by_kind[(Section.DEBUG, 0)], "debug", _debug_limit(by_kind))) \
        if (Section.DEBUG, 0) in by_kind else (None, None)
    if dbg is not None and (not isinstance(dbg, list) or len(dbg) != len(entries_meta)):
        raise BinaryFormatError(f"debug: expected one list per entry ({len(entries_meta)})")
    entries, names = [], set()
    for j, e in enumerate(entries_meta):
        w = f"metadata.entries[{j}]"
        if not isinstance(e, dict):
            raise BinaryFormatError(f"{w}: expected an object")
        name = _get(e, "name", str, w)
        if not name or ENTRY_SEP in name or name in names:
            raise BinaryFormatError(f"{w}.name: empty, duplicate or containing '{ENTRY_SEP}': {name!r:.40}")
        names.add(name)
        pre = name + ENTRY_SEP
        lists = {}
        for key, kind in (("inputs", "input"), ("outputs", "output")):
            ns = _get(e, key, list, w)
            for k, n in enumerate(ns):
                if not isinstance(n, str) or not n.startswith(pre) or n not in by_name or by_name[n].kind != kind:
                    raise BinaryFormatError(f"{w}.{key}[{k}]: {n!r:.60} is not a '{kind}' buffer of this entry")
            mine = [b for b in by_name.values() if b.kind == kind and b.name.startswith(pre)]
            if len(set(ns)) != len(ns) or len(ns) != len(mine):
                raise BinaryFormatError(f"{w}.{key}: must list every '{kind}' buffer of the entry exactly once")
            lists[key] = list(ns)
        hc = e.get("host_code", "")
        if not isinstance(hc, str):
            raise BinaryFormatError(f"{w}.host_code: expected a string")
        stored = _parse_code(by_kind, ncores, j * 256, f" entry {j}")
        debug = _check_debug(dbg[j], stored, f" entry {j}", pairs) if dbg is not None else None
        code, debug, origin = _unroll(stored, debug, f" entry {j}")
        entries.append(Entry(name, lists["inputs"], lists["outputs"], _get(e, "host_ops", list, w), code,
                             debug, hc, origin))
    io_other = [b.name for b in by_name.values() if b.kind in ("input", "output") and ENTRY_SEP not in b.name]
    if io_other:
        raise BinaryFormatError(f"metadata.buffers: '{io_other[0]}' is an input/output of no entry")
    return entries
