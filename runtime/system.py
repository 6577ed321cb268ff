"""A system of several Spyre cards: one ``.spyre`` file holding every card's program and the schedule between them.

The file (format 1.5, header flag SYSTEM) holds a metadata section and one CARD section per card; a CARD
section is that card's complete ``.spyre`` image (one entry per step, sharing the card's weights), checked by
the one-card loader like any other file. The metadata is the schedule spyre-partition-cards decided::

    {"format": "spyre-system", "cards": 2, "link": {"bytes_per_cycle": 64.0, "latency_cycles": 2000},
     "inputs": [{"name": "x", "shape": [8, 64], "dtype": "float32"}],
     "calls": [{"card": 0, "entry": "step0", "args": [{"input": 0}]},
               {"card": 1, "entry": "step0", "args": [{"input": 0, "dim": 1, "start": 0, "stop": 32}]},
               {"card": 0, "entry": "step1", "args": [{"gather": [{"call": 0, "result": 0},
                                                                 {"call": 1, "result": 0}], "dim": 1}]}],
     "outputs": [{"name": "output_0", "from": {"call": 2, "result": 0}}]}

An argument comes from a model input (whole, or the slice along ``dim`` a card holds), from a result of an
earlier call, or from the pieces of earlier calls' results concatenated along ``dim`` (an all-gather). A
result that another card reads crosses the link once (latency + bytes / bandwidth, the sender's link busy
meanwhile); one that the same card reads stays in its device memory. Every argument names an earlier call, so
the schedule is a topological order and cannot deadlock; the loader checks that, and that each transfer's
source matches its destination buffer in format and shape (a receive for every send).

Modeled time (static, like one card's: computed on first use, :attr:`SystemExecutable.static_profile`): a call
starts when its card is free and its arguments are there, and runs its entry's cycles; the run ends when the
last call does. :class:`SystemProfile` has per-card busy cycles, per-link busy cycles and
bytes (link utilization), and the events for a trace with a track per card and per link.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import numpy as np

from .binary import (FLAG_SYSTEM, BinaryFormatError, Program, Section, _get, _json, container_layout,
                     program_from_bytes, read_container, write_container)
from .hostjit import host_dtype
from .loader import RunLock

__all__ = ["System", "SystemExecutable", "SystemProfile", "system_to_bytes", "system_layout", "system_from_bytes"]

FORMAT = "spyre-system"


@dataclasses.dataclass
class System:
    """A system file in memory: the schedule (metadata) and each card's program image."""

    meta: dict
    cards: list                 # card c's .spyre image: bytes-like, or its pieces (binary.program_layout)
    num_cores: int
    fingerprint: str


def system_to_bytes(sys_: System) -> bytes:
    return write_container(*_system_container(sys_))


def system_layout(sys_: System) -> tuple[int, list]:
    """A system file's image as its pieces (:func:`.binary.container_layout`): written without making it."""
    return container_layout(*_system_container(sys_))


def _system_container(sys_: System) -> tuple:
    sections = [(Section.METADATA, 0, json.dumps(sys_.meta, separators=(",", ":")).encode())]
    sections += [(Section.CARD, c, img) for c, img in enumerate(sys_.cards)]
    return sys_.num_cores, sys_.fingerprint, sections, FLAG_SYSTEM


def system_from_bytes(data) -> tuple[System, list[Program]]:
    """Parse and check a system image structurally: the container, every card's program, and the schedule
    against the cards' entries (no target needed). Returns the system and each card's parsed program."""
    ncores, fp, sections = read_container(data)
    by = {(k, i): p for k, i, p in sections}
    meta = _json(by[(Section.METADATA, 0)], "metadata")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BinaryFormatError(f"metadata.format: expected '{FORMAT}'")
    n = _get(meta, "cards", int, "metadata")
    if n != len(sections) - 1:
        raise BinaryFormatError(f"metadata.cards: {n} but the file has {len(sections) - 1} card sections")
    progs = []
    for c in range(n):
        try:
            p = program_from_bytes(by[(Section.CARD, c)])
        except BinaryFormatError as e:
            raise BinaryFormatError(f"card {c}: {e}") from None
        if p.num_cores != ncores or p.fingerprint != (progs[0].fingerprint if progs else p.fingerprint):
            raise BinaryFormatError(f"card {c}: compiled for another card or core count than card 0")
        if not p.entries:
            raise BinaryFormatError(f"card {c}: a card's program must have entries (its steps)")
        progs.append(p)
    sys_ = System(meta, [bytes(by[(Section.CARD, c)]) for c in range(n)], ncores, fp)
    _check_schedule(meta, progs)
    return sys_, progs


def _entry_io(prog: Program, name: str, where: str):
    if not any(e.name == name for e in prog.entries):
        raise BinaryFormatError(f"{where}.entry: no entry {name!r:.40} on this card")
    view = prog.entry_program(name)
    return [view.buffer(b) for b in view.inputs], [view.buffer(b) for b in view.outputs]


def _check_schedule(meta: dict, progs: list[Program]) -> None:
    link = _get(meta, "link", dict, "metadata")
    for k in ("bytes_per_cycle", "latency_cycles"):
        v = link.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 if k == "bytes_per_cycle" else v >= 0):
            raise BinaryFormatError(f"metadata.link.{k}: expected a {'positive' if k[0] == 'b' else 'non-negative'} "
                                    f"number, got {v!r:.40}")
    inputs = _get(meta, "inputs", list, "metadata")
    for j, spec in enumerate(inputs):
        w = f"metadata.inputs[{j}]"
        _get(spec, "name", str, w)
        shape = _get(spec, "shape", list, w)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise BinaryFormatError(f"{w}.shape: expected non-negative integers")
    outs_of: list[list] = []          # call -> its entry's output buffers

    def source(src, where):
        """(format or None for a model input, shape) of what `src` delivers."""
        if not isinstance(src, dict):
            raise BinaryFormatError(f"{where}: expected an object")
        if "input" in src:
            j = _get(src, "input", int, where)
            if j >= len(inputs):
                raise BinaryFormatError(f"{where}.input: {j} is not an input (the system has {len(inputs)})")
            shape = list(inputs[j]["shape"])
            if "dim" in src:
                d, a, b = (_get(src, k, int, where) for k in ("dim", "start", "stop"))
                if d >= len(shape) or not a < b <= shape[d]:
                    raise BinaryFormatError(f"{where}: slice [{a}, {b}) of dim {d} is outside {shape}")
                shape[d] = b - a
            return None, shape
        if "gather" in src:
            pieces = _get(src, "gather", list, where)
            d = _get(src, "dim", int, where)
            got = [result(p, f"{where}.gather[{k}]") for k, p in enumerate(pieces)]
            if len(got) < 2 or any(f != got[0][0] or len(s) != len(got[0][1]) or d >= len(s) or
                                   any(x != y for k, (x, y) in enumerate(zip(s, got[0][1])) if k != d)
                                   for f, s in got):
                raise BinaryFormatError(f"{where}: pieces do not concatenate along dim {d} (at least two of "
                                        f"one format, equal outside dim {d})")
            shape = list(got[0][1])
            shape[d] = sum(s[d] for _, s in got)
            return got[0][0], shape
        return result(src, where)

    def result(src, where):
        i = _get(src, "call", int, where)
        r = _get(src, "result", int, where)
        if i >= len(outs_of):
            raise BinaryFormatError(f"{where}.call: {i} is not an earlier call (the schedule must only read "
                                    f"results already computed)")
        if r >= len(outs_of[i]):
            raise BinaryFormatError(f"{where}.result: call {i} has {len(outs_of[i])} results")
        b = outs_of[i][r]
        return b.fmt, list(b.shape)

    for i, call in enumerate(_get(meta, "calls", list, "metadata")):
        w = f"metadata.calls[{i}]"
        c = _get(call, "card", int, w)
        if c >= len(progs):
            raise BinaryFormatError(f"{w}.card: {c} is not a card of the system (0..{len(progs) - 1})")
        ins, outs = _entry_io(progs[c], _get(call, "entry", str, w), w)
        args = _get(call, "args", list, w)
        if len(args) != len(ins):
            raise BinaryFormatError(f"{w}.args: {len(args)} given, the entry takes {len(ins)}")
        for k, (src, b) in enumerate(zip(args, ins)):
            fmt, shape = source(src, f"{w}.args[{k}]")
            if (fmt is not None and fmt != b.fmt) or shape != list(b.shape):
                raise BinaryFormatError(f"{w}.args[{k}]: delivers {fmt.key if fmt else 'an input'}{shape}, the "
                                        f"entry's input '{b.name}' is {b.fmt.key}{list(b.shape)}")
        outs_of.append(outs)
    for k, o in enumerate(_get(meta, "outputs", list, "metadata")):
        w = f"metadata.outputs[{k}]"
        _get(o, "name", str, w)
        source(_get(o, "from", dict, w), f"{w}.from")


@dataclasses.dataclass
class SystemProfile:
    """Modeled run of a system: the makespan, and per card and per (sending) link where the time went."""

    target: str
    num_cards: int
    num_cores: int
    clock_ghz: float
    cycles: float
    card_busy: tuple[float, ...]
    link_busy: tuple[float, ...]
    link_bytes: tuple[int, ...]
    calls: tuple[tuple, ...]          # (card, entry, start, end)
    transfers: tuple[tuple, ...]      # (from card, to card, bytes, start, end)
    card_profiles: tuple = dataclasses.field(repr=False, default=())   # each call's one-card Profile
    wall_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return self.cycles / (self.clock_ghz * 1e9)

    @property
    def link_utilization(self) -> tuple[float, ...]:
        return tuple(b / self.cycles if self.cycles else 0.0 for b in self.link_busy)

    def to_dict(self) -> dict:
        return {"cards": self.num_cards, "cores_per_card": self.num_cores, "cycles": self.cycles,
                "seconds": self.seconds, "card_busy_cycles": list(self.card_busy),
                "link_busy_cycles": list(self.link_busy), "link_bytes": list(self.link_bytes),
                "link_utilization": list(self.link_utilization), "calls": len(self.calls),
                "transfers": len(self.transfers), "wall_seconds": self.wall_seconds}


class SystemExecutable:
    """A loaded system: call it like an :class:`~spyre_mlir.runtime.loader.Executable` (inputs by position or
    name, numpy outputs); :attr:`profile` is a :class:`SystemProfile` afterwards."""

    def __init__(self, sys_: System, cards: list, target, numerics: str):
        self.system, self.cards, self.target, self.numerics = sys_, cards, target, numerics
        meta = sys_.meta
        self.calls = meta["calls"]
        self.input_specs = meta["inputs"]
        self.outputs = meta["outputs"]
        self.bytes_per_cycle = float(meta["link"]["bytes_per_cycle"])
        self.latency = float(meta["link"]["latency_cycles"])
        self._wall: float | None = None
        self.lock = RunLock()      # a run's calls in order, another thread's after them (and a card's state)

    def __repr__(self) -> str:
        return (f"SystemExecutable({len(self.cards)} cards, {len(self.calls)} calls, "
                f"inputs {self.input_names}, numerics={self.numerics!r})")

    @property
    def input_names(self) -> list[str]:
        return [s["name"] for s in self.input_specs]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]

    def _bind(self, args, named) -> list:
        from .loader import InputError, _to_numpy, by_name

        vals = by_name(self.input_names, args, named)
        out = []
        for spec in self.input_specs:
            a = _to_numpy(vals[spec["name"]])
            if list(a.shape) != list(spec["shape"]):
                raise InputError(f"input '{spec['name']}': shape {a.shape} does not match {tuple(spec['shape'])}")
            out.append(a)
        return out

    @property
    def profile(self) -> SystemProfile | None:
        """The last run's profile: :attr:`static_profile` with its wall time; None before the first run."""
        return None if self._wall is None else dataclasses.replace(self.static_profile, wall_seconds=self._wall)

    @functools.cached_property
    def static_profile(self) -> SystemProfile:
        """The modeled run, the same for every call (each entry's cycles are static): computed on first use,
        the cards' cycle models included."""
        n = len(self.cards)
        ready: list[tuple] = []             # call -> (card, end cycle, executable)
        card_free, card_busy = [0.0] * n, [0.0] * n
        link_free, link_busy, link_bytes = [0.0] * n, [0.0] * n, [0] * n
        arrived: dict = {}                  # (call, result, card) -> cycle it is on that card
        calls, transfers, profiles = [], [], []

        def there(src, card) -> float:
            if "input" in src:
                return 0.0
            if "gather" in src:
                return max(there(p, card) for p in src["gather"])
            i, r = src["call"], src["result"]
            sender, end, exe = ready[i]
            if card is None or sender == card:      # the host reads outputs; a card its own results
                return end
            if (i, r, card) not in arrived:
                nbytes = exe.output_buffers[r].nbytes
                start = max(end, link_free[sender])
                done = start + self.latency + nbytes / self.bytes_per_cycle
                link_free[sender] = done
                link_busy[sender] += done - start
                link_bytes[sender] += nbytes
                transfers.append((sender, card, nbytes, start, done))
                arrived[i, r, card] = done
            return arrived[i, r, card]

        for call in self.calls:
            c = call["card"]
            exe = self.cards[c][call["entry"]]
            start = max([card_free[c]] + [there(src, c) for src in call["args"]])
            cyc = exe.static_profile.cycles
            card_free[c] = start + cyc
            card_busy[c] += cyc
            ready.append((c, start + cyc, exe))
            calls.append((c, call["entry"], start, start + cyc))
            profiles.append(exe.static_profile)
        end = max(card_free + [there(o["from"], None) for o in self.outputs] + [t for *_, t in transfers],
                  default=0.0)
        t = self.target
        return SystemProfile(t.name, n, t.num_cores, t.clock_ghz, end, tuple(card_busy), tuple(link_busy),
                             tuple(link_bytes), tuple(calls), tuple(transfers), tuple(profiles))

    def __call__(self, *args, **named) -> tuple[np.ndarray, ...]:
        inputs = self._bind(args, named)
        with self.lock:
            return self._run(inputs)

    def _run(self, inputs) -> tuple[np.ndarray, ...]:
        t0 = time.perf_counter()
        results = []

        def value(src):
            if "input" in src:
                a = inputs[src["input"]]
                return np.take(a, np.arange(src["start"], src["stop"]), axis=src["dim"]) if "dim" in src else a
            if "gather" in src:
                return np.concatenate([value(p) for p in src["gather"]], axis=src["dim"])
            return results[src["call"]][src["result"]]

        for call in self.calls:
            results.append(self.cards[call["card"]][call["entry"]](*[value(src) for src in call["args"]]))
        outs = []
        for o in self.outputs:
            a = np.array(value(o["from"]))
            outs.append(a.astype(host_dtype(o["dtype"])) if o.get("dtype") else a)
        self._wall = time.perf_counter() - t0
        return tuple(outs)

    def run(self, *args, **named) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self(*args, **named)))


def load_system(data, target=None, numerics: str | None = None) -> SystemExecutable:
    """Validate a system image (its schedule, then every card's program for ``target``) and prepare it."""
    from .loader import load_bytes

    from spyre_mlir.target import TargetError, load_target

    sys_, progs = system_from_bytes(data)
    n = len(progs)
    try:
        if isinstance(target, (str, os.PathLike)):
            target = load_target(target, cores=sys_.num_cores)
        elif target is None:
            target = load_target(cores=sys_.num_cores)
        system, card = target.with_cards(n), target.with_cards(1)
    except TargetError as e:
        raise BinaryFormatError(f"header: {e}") from None
    if sys_.fingerprint != system.fingerprint():
        raise BinaryFormatError(f"header: system fingerprint {sys_.fingerprint[:12]}... does not match the runtime's "
                                f"{n} x {target.name} ({system.fingerprint()[:12]}...): compile for this target "
                                f"or pass --target")
    cards = []
    for c, img in enumerate(sys_.cards):
        try:
            cards.append(load_bytes(img, target=card, numerics=numerics))
        except BinaryFormatError as e:
            raise BinaryFormatError(f"card {c}: {e}") from None
    return SystemExecutable(sys_, cards, card, numerics or progs[0].numerics)


def write_trace(profile: SystemProfile, path) -> None:
    from .binary import atomic_write

    atomic_write(path, json.dumps(chrome_trace(profile)).encode("utf-8"))


def chrome_trace(profile: SystemProfile) -> dict:
    """A trace with one process per card (its calls) and one per sending link (its transfers)."""
    us = 1.0 / (profile.clock_ghz * 1e3)
    events = []
    for c in range(profile.num_cards):
        for pid, name in ((c, f"card {c}"), (profile.num_cards + c, f"link from card {c}")):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for c, entry, start, end in profile.calls:
        events.append({"ph": "X", "name": entry, "cat": "card", "pid": c, "tid": 0, "ts": start * us,
                       "dur": (end - start) * us, "args": {"cycles": end - start}})
    for src, dst, nbytes, start, end in profile.transfers:
        events.append({"ph": "X", "name": f"to card {dst}", "cat": "link", "pid": profile.num_cards + src, "tid": 0,
                       "ts": start * us, "dur": (end - start) * us, "args": {"bytes": nbytes}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"target": profile.target, "modeled_cycles": profile.cycles,
                          "link_utilization": list(profile.link_utilization)}}
