"""Chrome / Perfetto trace of a modeled run: one process per core, one thread (track) per unit.

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Times are the cycle model's, converted to
microseconds at the target clock; each instruction is a complete ("X") event named after its op, with its
core, index and source location in ``args``.
"""

from __future__ import annotations

import json

from .binary import atomic_write
from .cycles import UNITS, Profile

__all__ = ["chrome_trace", "write_trace"]


def chrome_trace(profile: Profile) -> dict:
    """The trace as a dict in the Chrome trace-event format (``{"traceEvents": [...]}``)."""
    us = 1.0 / (profile.clock_ghz * 1e3)          # cycles -> microseconds
    events = []
    for c in range(profile.num_cores):
        events.append({"ph": "M", "name": "process_name", "pid": c, "tid": 0, "args": {"name": f"core {c}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": c, "tid": 0, "args": {"sort_index": c}})
        for t, unit in enumerate(UNITS):
            events.append({"ph": "M", "name": "thread_name", "pid": c, "tid": t, "args": {"name": unit}})
    for e in profile.events:
        events.append({"ph": "X", "name": e.name, "cat": e.unit, "pid": e.core, "tid": UNITS.index(e.unit),
                       "ts": e.start * us, "dur": (e.end - e.start) * us,
                       "args": {"instruction": e.index, "loc": e.loc, "cycles": e.end - e.start}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"target": profile.target, "modeled_cycles": profile.cycles}}


def write_trace(profile: Profile, path) -> None:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    atomic_write(path, json.dumps(chrome_trace(profile)).encode("utf-8"))
