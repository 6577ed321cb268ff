"""Link programs into one file with entries (format 1.3): several programs over one device memory.

A served model runs a prefill program and a decode program over the same weights and the same KV cache.
:func:`link` takes the single-entry programs the compiler emitted for each and writes one program in which

* constants with the same format, shape and bytes are one buffer (the weights are loaded once),
* state buffers with the same name are one buffer (the KV cache is kept in device memory across calls of any
  entry; formats and shapes must agree),
* each entry keeps its own inputs, outputs and scratch, renamed ``"<entry>:<name>"`` and placed after the
  shared buffers; scratch buffers that shared memory in the entry still do (their regions move as a block).

Device addresses in the code (DMA and GATHER ``dev``, RESTICK source and destination) are relocated; host ops refer to
buffers by name and are renamed. Nothing else in an instruction names device memory.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from .binary import ENTRY_SEP, Buffer, Entry, Program
from .isa import Op

__all__ = ["link", "LinkError"]

ALIGN = 4096


class LinkError(ValueError):
    """Programs that cannot share one file (different targets, numerics, or a state buffer declared twice
    with different shapes)."""


def _align(x: int) -> int:
    return -(-x // ALIGN) * ALIGN


def link(programs: dict[str, Program], producer: str = "spyre_mlir.runtime.link") -> Program:
    """One program with an entry per item of ``programs`` (entry name -> single-entry program)."""
    if not programs:
        raise LinkError("nothing to link")
    first = next(iter(programs.values()))
    for name, p in programs.items():
        if p.entries:
            raise LinkError(f"entry '{name}': already a file with entries")
        if ENTRY_SEP in name or not name:
            raise LinkError(f"entry name {name!r} is empty or contains '{ENTRY_SEP}'")
        if (p.num_cores, p.fingerprint, p.numerics) != (first.num_cores, first.fingerprint, first.numerics):
            raise LinkError(f"entry '{name}': compiled for another target, core count or numerics")

    buffers: list[Buffer] = []
    constants: dict[str, bytes] = {}
    by_content: dict[tuple, Buffer] = {}
    state: dict[str, Buffer] = {}
    top = 0

    def place(b: Buffer, name: str) -> Buffer:
        nonlocal top
        nb = dataclasses.replace(b, name=name, addr=top)
        top = _align(top + b.nbytes)
        buffers.append(nb)
        return nb

    shared_maps = {}
    for ename, p in programs.items():
        m = {}
        for b in p.buffers:
            if b.kind == "constant":
                data = bytes(p.constants[b.name])
                key = (b.fmt, b.shape, data)
                if key not in by_content:
                    name = b.name
                    k = 1
                    while any(x.name == name for x in buffers):
                        name, k = f"{b.name}#{k}", k + 1
                    by_content[key] = place(b, name)
                    constants[by_content[key].name] = data
                m[b.name] = (b, by_content[key])
            elif b.kind == "state":
                if b.name in state:
                    s = state[b.name]
                    if (s.fmt, s.shape) != (b.fmt, b.shape):
                        raise LinkError(f"state '{b.name}': {s.fmt.key}{list(s.shape)} in one entry, "
                                        f"{b.fmt.key}{list(b.shape)} in '{ename}'")
                else:
                    if any(x.name == b.name for x in buffers):
                        raise LinkError(f"state '{b.name}' has the name of a constant")
                    state[b.name] = place(b, b.name)
                m[b.name] = (b, state[b.name])
        shared_maps[ename] = m

    entries = []
    for ename, p in programs.items():
        shared = shared_maps[ename]
        local = [b for b in p.buffers if b.kind in ("input", "output", "scratch")]
        # Regions: unions of overlapping local buffers (scratch slots reused across lifetimes) move as one.
        regions = []
        for b in sorted(local, key=lambda b: b.addr):
            lo, hi = b.addr, b.addr + max(b.nbytes, 1)
            if regions and lo < regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], hi)
            else:
                regions.append([lo, hi])
        spans = []       # (old lo, old hi, new lo)
        for lo, hi in regions:
            spans.append((lo, hi, top))
            top = _align(top + (hi - lo))
        for old, new in shared.values():
            spans.append((old.addr, old.addr + max(old.nbytes, 1), new.addr))
        spans.sort()
        starts = [s[0] for s in spans]
        # One past the end of a buffer (an empty range) relocates with the buffer ending there.
        ends = {hi: new + (hi - lo) for lo, hi, new in spans}

        def reloc(a: int, ename=ename, spans=spans, starts=starts, ends=ends) -> int:
            j = bisect.bisect_right(starts, a) - 1
            if j >= 0 and a < spans[j][1]:
                return spans[j][2] + (a - spans[j][0])
            if a in ends:
                return ends[a]
            raise LinkError(f"entry '{ename}': device address {a} is in no buffer")

        rename = {old.name: new.name for old, new in shared.values()}
        for b in local:
            nb = dataclasses.replace(b, name=f"{ename}{ENTRY_SEP}{b.name}", addr=reloc(b.addr))
            buffers.append(nb)
            rename[b.name] = nb.name
        code = []
        for stream in p.code:
            s = np.array(stream, copy=True)
            for i in np.flatnonzero(np.isin(s["op"], (Op.DMA_LOAD, Op.DMA_STORE, Op.RESTICK, Op.GATHER))):
                s["dev"][i] = reloc(int(s["dev"][i]))
                if s["op"][i] == Op.RESTICK:
                    dst = reloc(int(s["a0"][i]) | int(s["a1"][i]) << 32)
                    s["a0"][i], s["a1"][i] = dst & 0xFFFFFFFF, dst >> 32
            code.append(s)
        host_ops = [{**h, "inputs": [rename[n] for n in h.get("inputs", [])],
                     "outputs": [rename[n] for n in h.get("outputs", [])]} for h in p.host_ops]
        entries.append(Entry(ename, [rename[n] for n in p.inputs], [rename[n] for n in p.outputs], host_ops,
                             code, p.debug, p.host_code))
    return Program(first.num_cores, first.fingerprint, max(_align(top), ALIGN), buffers, [], [], constants, [],
                   [], None, producer, first.numerics, "", entries)
