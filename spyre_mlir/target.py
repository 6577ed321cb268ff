"""The Spyre target description: hardware numbers the compiler and emulator plan against.

The numbers live in a TOML file (default: ``spyre_mlir/targets/spyre.toml``) where every entry carries its
value, a mark (``public`` / ``measured`` / ``assumed``) and a source, so users can see which numbers are facts
about the real card and which are our model. This module turns that file into a frozen :class:`Target` of
plain typed fields, checked on load: a wrong or missing entry fails loudly, naming the file and the key,
instead of surfacing later as a strange tiling or cost decision.

Kept light on purpose (stdlib only, no torch): every tool and the runtime import it at start-up.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from spyre_mlir.errors import SpyreError

__all__ = ["Target", "TargetError", "load_target", "default_target_path", "MARKS"]

MARKS = frozenset({"public", "measured", "assumed"})
SCHEMA_VERSION = 1


class TargetError(SpyreError, ValueError):
    """A target file is missing, malformed, or asks for something the target cannot do."""


def default_target_path() -> Path:
    """The target file shipped with the package (package data, see pyproject.toml)."""
    return Path(__file__).resolve().parent / "targets" / "spyre.toml"


# TOML key ("section.name") -> (Target field, type). The single place that ties the file to the dataclass.
_ENTRIES: dict[str, tuple[str, type]] = {
    "card.max_cores": ("max_cores", int),
    "card.cards_per_host": ("cards_per_host", int),
    "card.cards_per_host_z17": ("cards_per_host_z17", int),
    "system.cards": ("default_cards", int),
    "core.corelets": ("corelets_per_core", int),
    "core.pt_rows": ("pt_rows", int),
    "core.pt_cols": ("pt_cols", int),
    "core.clock_ghz": ("clock_ghz", float),
    "core.scratchpad_bytes": ("scratchpad_bytes", int),
    "core.scratchpad_reserved_bytes": ("scratchpad_reserved_bytes", int),
    "core.scratchpad_usable_bytes": ("scratchpad_usable_bytes", int),
    "core.scratchpad_alignment_bytes": ("scratchpad_alignment_bytes", int),
    "layout.stick_bytes": ("stick_bytes", int),
    "compute.peak_macs_per_cycle_dlf16": ("peak_macs_per_cycle_dlf16", int),
    "compute.peak_macs_per_cycle_fp8": ("peak_macs_per_cycle_fp8", int),
    "compute.peak_macs_per_cycle_int8": ("peak_macs_per_cycle_int8", int),
    "compute.peak_macs_per_cycle_int4": ("peak_macs_per_cycle_int4", int),
    "compute.sustained_macs_per_cycle_dlf16": ("sustained_macs_per_cycle_dlf16", int),
    "compute.overlap_factor": ("overlap_factor", float),
    "compute.pt_latency_cycles": ("pt_latency_cycles", int),
    "sfu.lanes_per_corelet": ("sfu_lanes", int),
    "sfu.cycles_simple": ("sfu_cycles_simple", int),
    "sfu.cycles_reciprocal": ("sfu_cycles_reciprocal", int),
    "sfu.cycles_transcendental": ("sfu_cycles_transcendental", int),
    "sfu.latency_cycles": ("sfu_latency_cycles", int),
    "memory.dram_bytes": ("dram_bytes", int),
    "memory.dram_read_gbps": ("dram_read_gbps", float),
    "memory.dram_write_gbps": ("dram_write_gbps", float),
    "memory.dram_mixed_gbps": ("dram_mixed_gbps", float),
    "memory.core_span_bytes": ("core_span_bytes", int),
    "memory.restickify_gbps": ("restickify_gbps", float),
    "memory.dma_latency_cycles": ("dma_latency_cycles", int),
    "interconnect.ring_bytes_per_cycle": ("ring_bytes_per_cycle", int),
    "interconnect.ring_directions": ("ring_directions", int),
    "interconnect.reduce_ring": ("reduce_ring", bool),
    "interconnect.hop_latency_cycles": ("hop_latency_cycles", int),
    "interconnect.barrier_latency_cycles": ("barrier_latency_cycles", int),
    "host.link_pcie_gen": ("host_pcie_gen", int),
    "host.link_pcie_lanes": ("host_pcie_lanes", int),
    "host.link_gbps": ("host_link_gbps", float),
    "host.latency_cycles": ("host_latency_cycles", int),
    "link.card_gbps": ("card_link_gbps", float),
    "link.card_latency_cycles": ("card_link_latency_cycles", int),
}

# The fields that describe the system of cards rather than one card. A single-card program does not depend on
# them, so they enter the fingerprint only when a program spans several cards: fixing a link number must not
# invalidate (or change the bytes of) every single-card binary.
_SYSTEM_FIELDS = ("num_cards", "default_cards", "card_link_gbps", "card_link_latency_cycles")

# Format name -> PT-array rate class. torch float16/bfloat16 compute as DLFloat16 on the device.
_MAC_CLASS = {
    "dlf16": "dlf16", "fp16": "dlf16", "bf16": "dlf16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
    "int8": "int8", "int4": "int4",
}

_SFU_CLASSES = ("simple", "reciprocal", "transcendental")


@dataclasses.dataclass(frozen=True)
class Target:
    """One Spyre card as the compiler sees it. Build with :func:`load_target`, narrow with :meth:`with_cores`.

    ``num_cores`` is the number of cores a program uses (1..``max_cores``) on each card, ``num_cards`` the
    number of cards (1..``cards_per_host``, narrow with :meth:`with_cards`), joined by a card-to-card link of
    ``card_link_gbps`` and ``card_link_latency_cycles`` per transfer; every other number is per card, per core
    or per corelet as its name says. ``marks`` and ``sources`` map each field loaded from the file
    to its mark and source string.
    """

    name: str
    num_cores: int
    num_cards: int
    max_cores: int
    cards_per_host: int
    cards_per_host_z17: int
    default_cards: int
    corelets_per_core: int
    pt_rows: int
    pt_cols: int
    clock_ghz: float
    scratchpad_bytes: int
    scratchpad_reserved_bytes: int
    scratchpad_usable_bytes: int
    scratchpad_alignment_bytes: int
    stick_bytes: int
    peak_macs_per_cycle_dlf16: int
    peak_macs_per_cycle_fp8: int
    peak_macs_per_cycle_int8: int
    peak_macs_per_cycle_int4: int
    sustained_macs_per_cycle_dlf16: int
    overlap_factor: float
    pt_latency_cycles: int
    sfu_lanes: int
    sfu_cycles_simple: int
    sfu_cycles_reciprocal: int
    sfu_cycles_transcendental: int
    sfu_latency_cycles: int
    dram_bytes: int
    dram_read_gbps: float
    dram_write_gbps: float
    dram_mixed_gbps: float
    core_span_bytes: int
    restickify_gbps: float
    dma_latency_cycles: int
    ring_bytes_per_cycle: int
    ring_directions: int
    reduce_ring: bool
    hop_latency_cycles: int
    barrier_latency_cycles: int
    host_pcie_gen: int
    host_pcie_lanes: int
    host_link_gbps: float
    host_latency_cycles: int
    card_link_gbps: float
    card_link_latency_cycles: int
    marks: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    path: str = dataclasses.field(default="", repr=False, compare=False)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    # ---- derived numbers -------------------------------------------------------------------------------

    def macs_per_cycle(self, fmt: str) -> int:
        """Peak MACs per cycle per core on the PT arrays for a number format (e.g. "dlf16", "fp8_e4m3", "int4").

        fp32 raises: fp32 matmuls do not run on the PT array on Spyre (only some SFU ops take fp32).
        """
        cls = _MAC_CLASS.get(str(fmt).lower())
        if cls is None:
            raise ValueError(f"format {fmt!r} has no PT-array rate (known: {', '.join(sorted(_MAC_CLASS))})")
        return getattr(self, f"peak_macs_per_cycle_{cls}")

    def sustained_macs_per_cycle(self, fmt: str) -> float:
        """Sustained MACs/cycle/core: the measured DLFloat16 efficiency applied to the format's peak (assumed)."""
        return self.macs_per_cycle(fmt) * self.sustained_macs_per_cycle_dlf16 / self.peak_macs_per_cycle_dlf16

    def sfu_cycles(self, op_class: str) -> int:
        """Cycles per element per SFU lane for an op class: "simple", "reciprocal" or "transcendental"."""
        if op_class not in _SFU_CLASSES:
            raise ValueError(f"unknown SFU op class {op_class!r} (known: {', '.join(_SFU_CLASSES)})")
        return getattr(self, f"sfu_cycles_{op_class}")

    @property
    def pes_per_corelet(self) -> int:
        return self.pt_rows * self.pt_cols

    @property
    def sfu_lanes_per_core(self) -> int:
        return self.sfu_lanes * self.corelets_per_core

    @property
    def peak_tflops_dlf16(self) -> float:
        """Card peak at the active core count (2 flops per MAC); 98.3 for 32 cores at 1.0 GHz."""
        return 2 * self.peak_macs_per_cycle_dlf16 * self.num_cores * self.clock_ghz / 1000.0

    # ---- identity and narrowing ------------------------------------------------------------------------

    def canonical(self) -> dict:
        """The values that define the target (no marks, sources or path), as a JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare
               and (self.num_cards > 1 or f.name not in _SYSTEM_FIELDS)}
        out["schema"] = SCHEMA_VERSION
        return out

    def fingerprint(self) -> str:
        """sha256 hex of the canonical values. A binary records it so it is not run on a different target.

        Includes ``num_cores`` (work is split per core at compile time) and, for more than one card, the card
        count and the link; excludes marks and sources, so fixing a citation does not invalidate compiled
        binaries.
        """
        fp = self.__dict__.get("_fingerprint")
        if fp is None:          # frozen: computed once (it is also the hash, which caches key on)
            blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
            fp = hashlib.sha256(blob.encode("utf-8")).hexdigest()
            object.__setattr__(self, "_fingerprint", fp)
        return fp

    def with_cores(self, n: int) -> "Target":
        """The same card restricted to ``n`` cores (1..max_cores)."""
        return dataclasses.replace(self, num_cores=self._count("cores", n, self.max_cores))

    def with_cards(self, n: int) -> "Target":
        """The system of ``n`` of these cards (1..cards_per_host)."""
        return dataclasses.replace(self, num_cards=self._count("cards", n, self.cards_per_host))

    def _count(self, what: str, n, most: int) -> int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TargetError(f"{self.path or self.name}: {what} must be an int, got {n!r}")
        if not 1 <= n <= most:
            raise TargetError(f"{self.path or self.name}: {what}={n} out of range 1..{most}")
        return n

    @property
    def card_link_bytes_per_cycle(self) -> float:
        return self.card_link_gbps / self.clock_ghz


def _check_value(where: str, key: str, value, typ: type):
    if typ is bool:
        if not isinstance(value, bool):
            raise TargetError(f"{where}: key '{key}': value must be a boolean, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TargetError(f"{where}: key '{key}': value must be a number, got {value!r}")
    if typ is int and not isinstance(value, int):
        raise TargetError(f"{where}: key '{key}': value must be an integer, got {value!r}")
    if not value > 0:
        raise TargetError(f"{where}: key '{key}': value must be positive, got {value!r}")
    return typ(value)


def _parse(data: dict, where: str) -> dict:
    """Validate the TOML document and return Target keyword arguments."""
    meta = data.get("target")
    if not isinstance(meta, dict):
        raise TargetError(f"{where}: key 'target': missing [target] table with name and schema")
    if meta.get("schema") != SCHEMA_VERSION:
        raise TargetError(f"{where}: key 'target.schema': expected {SCHEMA_VERSION}, got {meta.get('schema')!r}")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise TargetError(f"{where}: key 'target.name': must be a non-empty string")

    # Every table other than [target] holds entries; unknown ones are errors, which catches typos.
    seen: dict[str, dict] = {}
    for section, table in data.items():
        if section == "target":
            continue
        if not isinstance(table, dict):
            raise TargetError(f"{where}: key '{section}': expected a table of entries")
        for entry, body in table.items():
            key = f"{section}.{entry}"
            if key not in _ENTRIES:
                raise TargetError(f"{where}: key '{key}': unknown entry")
            seen[key] = body

    kwargs: dict = {"name": name}
    marks: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, (field, typ) in _ENTRIES.items():
        body = seen.get(key)
        if body is None:
            raise TargetError(f"{where}: key '{key}': missing")
        if not isinstance(body, dict):
            raise TargetError(f"{where}: key '{key}': expected a table with value, mark and source")
        extra = set(body) - {"value", "mark", "source"}
        if extra:
            raise TargetError(f"{where}: key '{key}': unexpected field(s) {', '.join(sorted(extra))}")
        if "value" not in body:
            raise TargetError(f"{where}: key '{key}': missing 'value'")
        mark = body.get("mark")
        if mark not in MARKS:
            raise TargetError(f"{where}: key '{key}': mark must be one of {sorted(MARKS)}, got {mark!r}")
        source = body.get("source")
        if not isinstance(source, str) or not source.strip():
            raise TargetError(f"{where}: key '{key}': missing or empty 'source'")
        kwargs[field] = _check_value(where, key, body["value"], typ)
        marks[field] = mark
        sources[field] = source

    # Cross-checks that would otherwise show up as wrong tiling decisions.
    if kwargs["scratchpad_usable_bytes"] > kwargs["scratchpad_bytes"] - kwargs["scratchpad_reserved_bytes"]:
        raise TargetError(f"{where}: key 'core.scratchpad_usable_bytes': exceeds physical minus reserved bytes")
    if kwargs["scratchpad_usable_bytes"] % kwargs["scratchpad_alignment_bytes"]:
        raise TargetError(f"{where}: key 'core.scratchpad_usable_bytes': not a multiple of the alignment")
    stick = kwargs["stick_bytes"]
    if stick & (stick - 1):
        raise TargetError(f"{where}: key 'layout.stick_bytes': must be a power of two, got {stick}")
    if kwargs["default_cards"] > kwargs["cards_per_host"]:
        raise TargetError(f"{where}: key 'system.cards': more than card.cards_per_host")
    if kwargs["overlap_factor"] > 1:
        raise TargetError(f"{where}: key 'compute.overlap_factor': must be in (0, 1]")

    kwargs["marks"] = MappingProxyType(marks)
    kwargs["sources"] = MappingProxyType(sources)
    return kwargs


@functools.lru_cache(maxsize=64)
def _from_text(text: str, where: str) -> Target:
    """The target a file's text describes (remembered by the text: every compile and every load reads the
    file again, and most read the same one)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{where}: malformed TOML: {e}") from None
    kwargs = _parse(data, where)
    return Target(num_cores=kwargs["max_cores"], num_cards=kwargs["default_cards"], path=where, **kwargs)


def load_target(path: str | Path | None = None, cores: int | None = None, cards: int | None = None) -> Target:
    """Load and validate a target file (default: the packaged Spyre card), optionally narrowed to ``cores``
    per card and ``cards`` (default: the file's ``system.cards``).

    Raises :class:`TargetError` naming the file and the offending key if the file is missing or malformed.
    """
    p = Path(path) if path is not None else default_target_path()
    where = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TargetError(f"{where}: target file not found") from None
    except OSError as e:
        raise TargetError(f"{where}: cannot read target file: {e}") from None
    target = _from_text(text, where)
    target = target if cores is None else target.with_cores(cores)
    return target if cards is None else target.with_cards(cards)
