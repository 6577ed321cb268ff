"""Loop records (format 1.10): a stream stores a repeated run of instructions once, as a tile loop with strides
and a trip count, the way DMA and systolic engines take their descriptors.

A ``LOOP`` record (``m`` trips, ``n`` body records) is followed by its ``n`` body records, then ``n`` ``STEP``
records: the ``j``-th STEP holds how much each address field (``dev``, ``a0``..``a5``) of the ``j``-th body
record advances per trip, modulo the field's width (two's complement: a step may be negative). Trip ``t``
runs the body with those fields advanced ``t`` times; every other field repeats as stored. Body records may be
loops themselves (their STEP in the outer block is all zero, as is the STEP of a STEP record); the outer step
of a nested loop's body records moves them in every one of its trips.

:func:`roll` finds such runs in an instruction stream (the compiler writes every stream rolled);
:func:`unroll` checks the loop structure and gives back the instructions in the order they run, with the
stored record each one came from. The loader checks every unrolled instruction as before, so bounds hold for
every trip of every loop.
"""

from __future__ import annotations

import numpy as np

from .isa import INSTR_DTYPE, Op

__all__ = ["STEPPED", "MAX_TRIPS", "MAX_UNROLLED", "LoopError", "roll", "roll_streams", "unroll"]

STEPPED = ("dev", "a0", "a1", "a2", "a3", "a4", "a5")      # the fields a STEP record advances
MAX_TRIPS = 1 << 20
MAX_UNROLLED = 1 << 23          # instructions a program's streams may unroll to (512 MiB of records)
MAX_PERIOD = 256                # the longest body :func:`roll` looks for
_CANDIDATES = 4                 # body lengths tried per stream: the most common distances between equal records
_MULTIPLES = 2                  # and their multiples (double-buffered steps alternate their buffers)

_OFFSETS = {f: INSTR_DTYPE.fields[f][1] for f in INSTR_DTYPE.names}


class LoopError(ValueError):
    """A loop record that does not describe a well-formed loop; ``record`` is its index in the stored stream."""

    def __init__(self, record: int, msg: str):
        super().__init__(msg)
        self.record = record


def _fixed_mask() -> np.ndarray:
    """[64] bytes: 0xFF on the bytes a loop repeats as stored, 0 on the stepped fields."""
    mask = np.full(INSTR_DTYPE.itemsize, 0xFF, dtype=np.uint8)
    for f in STEPPED:
        dt, off = INSTR_DTYPE.fields[f][:2]
        mask[off:off + dt.itemsize] = 0
    return mask


_FIXED = _fixed_mask()
_LOOP, _STEP = int(Op.LOOP), int(Op.STEP)
_LOOP_OTHER = np.full(16, 0xFFFFFFFF, dtype=np.uint32)      # the 32-bit words of a LOOP but op, m, n
_LOOP_OTHER[[0, 4, 5]] = 0xFFFFFF00, 0, 0
_STEP_ONLY = np.zeros(16, dtype=np.uint32)                 # the 32-bit words of a STEP but its stepped fields
_STEP_ONLY[0] = _STEP
_WIDTH = np.array([0xFFFFFFFF] * 6 + [0xFFFFFFFFFFFFFFFF], dtype=np.uint64)     # of a0..a5, dev
assert STEPPED == ("dev", "a0", "a1", "a2", "a3", "a4", "a5") and _OFFSETS["a0"] == 28 and _OFFSETS["dev"] == 52
assert _OFFSETS["m"] == 16 and _OFFSETS["n"] == 20


def _words(recs: np.ndarray) -> np.ndarray:
    """Records as [n, 16] 32-bit words (whole columns are faster than structured fields, and arrays of plain
    words concatenate without a dtype promotion each)."""
    return np.ascontiguousarray(recs).view(np.uint32).reshape(len(recs), 16)


def _addr(w: np.ndarray) -> np.ndarray:
    """[n, 7] uint64: the stepped fields a0..a5, dev of records given as :func:`_words` (dev is not 8-aligned:
    two words)."""
    out = w[:, 7:14].astype(np.uint64)
    out[:, 6] |= w[:, 14].astype(np.uint64) << np.uint64(32)
    return out


def _set_words(w: np.ndarray, vals: np.ndarray) -> None:
    """Write ``vals`` ([n, 7], as :func:`_addr` gives) into the stepped fields of records given as words."""
    w[:, 7:14] = vals & np.uint64(0xFFFFFFFF)
    w[:, 14] = vals[:, 6] >> np.uint64(32)


def _runs(ok: np.ndarray) -> np.ndarray:
    """For each position, how many consecutive True values start there."""
    n = ok.size
    nxt = np.where(ok, n, np.arange(n))
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]        # the first False at or after each position
    return nxt - np.arange(n)


def _periods(keys: np.ndarray, heads: np.ndarray) -> list[int]:
    """The body lengths worth trying: the most common distances from a record to the last equal one before it
    (equal but for addresses), among all records and among LOOP records (loops of loops), and small multiples
    of them."""
    def common(idx):
        order = idx[np.argsort(keys[idx], kind="stable")]
        same = keys[order[1:]] == keys[order[:-1]]
        dist = (order[1:] - order[:-1])[same]
        dist = dist[dist <= MAX_PERIOD]
        counts = np.bincount(dist) if dist.size else np.zeros(1, dtype=np.int64)
        return [int(p) for p in np.argsort(counts)[::-1][:_CANDIDATES] if counts[p] > 0]
    found = common(np.arange(keys.size)) + common(heads)
    return sorted({k * p for p in found for k in range(1, _MULTIPLES + 1) if k * p <= MAX_PERIOD})


def roll(code: np.ndarray, keys: np.ndarray | None = None, levels: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``code`` (INSTR_DTYPE records in the order they run, or holding a kernel's loops already) stored with
    loops: (stored records, for each stored record the record of ``code`` it stores, -1 for new LOOP and STEP
    records). ``keys``: per record a value that must repeat too (its source location), None: none. Greedy from
    the start: at each record the loop saving the most records, if any saves one; then again over the result,
    ``levels`` times in all (loops of loops)."""
    stored, origin = code, np.arange(len(code))
    for _ in range(levels):
        k = None if keys is None else np.where(origin >= 0, keys[np.maximum(origin, 0)], -1)
        rolled, o = _roll(stored, k)
        # What a loader reads back must be what ran (loops are found by hashes; a collision would store another
        # program): else the stream is stored as it came.
        if not _stores(stored, k, rolled, o):
            return code, np.arange(len(code))
        stored, origin = rolled, np.where(o >= 0, origin[np.maximum(o, 0)], -1)
        if not (stored["op"] == _LOOP).any():
            break
    return stored, origin


def roll_streams(codes: list[np.ndarray], keys: list | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`roll` of several streams (one per core) at once, as one stream whose loops never cross from one
    core's instructions to the next (numpy's per-call cost paid once, not per core)."""
    if not codes:
        return []
    sizes = [len(c) for c in codes]
    sid = np.repeat(np.arange(len(codes), dtype=np.int64), sizes)
    k = sid if keys is None else np.concatenate([np.asarray(x, dtype=np.int64) for x in keys]) * len(codes) + sid
    stored, origin = roll(np.concatenate(codes), k)
    # Each stored record's stream: a body record's own; a LOOP record's, the next record's; a STEP record's,
    # the one before (loops hold one stream's records).
    ids = np.where(origin >= 0, sid[np.maximum(origin, 0)], -1)
    for h in np.flatnonzero(stored["op"] == _LOOP)[::-1]:
        ids[h] = ids[h + 1]
    ids = np.maximum.accumulate(ids)
    cuts = np.searchsorted(ids, np.arange(1, len(codes)))
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [(st, np.where(o >= 0, o - base[c], -1)) for c, (st, o) in
            enumerate(zip(np.split(stored, cuts), np.split(origin, cuts)))]


def _roll(code: np.ndarray, keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One level of :func:`roll` over records that may hold loops already (a body holds whole loops, whose LOOP
    and STEP records repeat as they are)."""
    n = len(code)
    raw = np.ascontiguousarray(code).view(np.uint8).reshape(n, INSTR_DTYPE.itemsize)
    ops, nbody = code["op"], code["n"]
    looped = (ops == _LOOP) | (ops == _STEP)
    words = np.where(looped[:, None], raw, raw & _FIXED).view("<u8")        # [n, 8]: what must repeat
    if keys is not None:
        words = np.concatenate([words, np.asarray(keys).astype(np.uint64)[:, None]], axis=1)
    key = words[:, 0].copy()
    for j in range(1, words.shape[1]):                   # a hash of each record's fixed part, to find periods
        key = key * np.uint64(0x9E3779B97F4A7C15) + words[:, j]
    inner = _inside(ops, nbody)                           # no body starts or ends there
    vals = _addr(_words(code))
    # Equal hashes of the fixed parts, and of the address differences (a linear hash: the difference of two
    # records' hashes is the hash of their differences), find the loops; :func:`roll` checks the result.
    mult = np.uint64(0xD6E8FEB86659FD93) ** np.arange(1, 8, dtype=np.uint64)
    addr = (vals * mult).sum(axis=1, dtype=np.uint64)
    best_save = np.zeros(n, dtype=np.int64)
    best_p = np.zeros(n, dtype=np.int64)
    best_trips = np.zeros(n, dtype=np.int64)
    for p in _periods(key, np.flatnonzero(ops == _LOOP)):
        if 2 * p > n:
            continue
        eq = key[p:] == key[:-p]                                           # [n - p]
        d = addr[p:] - addr[:-p]
        cons = np.zeros(n - p, dtype=bool)                                 # record j + p continues the loop
        cons[p:] = eq[p:] & (d[p:] == d[:-p])
        e_run, c_run = _runs(eq), np.append(_runs(cons), 0)
        starts = np.arange(n - 2 * p + 1)
        good = (e_run[starts] >= p) & ~inner[starts] & ~inner[starts + p]
        span = p + np.where(starts + p < n - p, c_run[np.minimum(starts + p, n - p)], 0)
        trips = span // p + 1
        save = np.where(good, trips * p - (2 * p + 1), 0)
        better = save > best_save[starts]
        best_save[starts] = np.where(better, save, best_save[starts])
        best_p[starts] = np.where(better, p, best_p[starts])
        best_trips[starts] = np.where(better, trips, best_trips[starts])
    # The stored stream as rows of the input (0..n-1) and of the new LOOP and STEP records (n..), all as 32-bit
    # words: concatenating structured arrays costs a dtype promotion each.
    rows, extra = [], []
    i, m = 0, n
    loops = np.flatnonzero(best_save > 0)
    while True:
        j = int(loops[np.searchsorted(loops, i)]) if loops.size and i <= loops[-1] else n
        if j > i:                                        # records stored as they are
            rows.append(np.arange(i, j))
        if j >= n:
            break
        p, t = int(best_p[j]), int(min(best_trips[j], MAX_TRIPS))
        new = np.zeros((p + 1, 16), dtype=np.uint32)         # the LOOP record, then the STEP records
        new[0, [0, 4, 5]] = _LOOP, t, p                      # op (byte 0), m, n
        new[1:, 0] = _STEP
        _set_words(new[1:], (vals[j + p:j + 2 * p] - vals[j:j + p]) & _WIDTH)
        extra.append(new)
        rows += [np.arange(m, m + 1), np.arange(j, j + p), np.arange(m + 1, m + 1 + p)]
        m += p + 1
        i = j + t * p
    rows = np.concatenate(rows)
    table = np.concatenate([_words(code)] + extra)
    return table[rows].view(INSTR_DTYPE).ravel(), np.where(rows < n, rows, -1)


def _inside(ops: np.ndarray, nbody: np.ndarray) -> np.ndarray:
    """[n + 1]: the records inside a stored loop, after its LOOP record (no body of a new loop starts there)."""
    inner = np.zeros(len(ops) + 1, dtype=bool)
    for h in np.flatnonzero(ops == _LOOP)[::-1]:
        if not inner[h]:
            inner[h + 1:h + 1 + 2 * int(nbody[h])] = True
    return inner


def _stores(code: np.ndarray, keys: np.ndarray | None, rolled: np.ndarray, origin: np.ndarray) -> bool:
    """Whether ``rolled`` (``origin``: the record of ``code`` each holds, -1 for its new LOOP and STEP records)
    stores what ``code`` does, record by record: each holds its record of ``code``; in order, ``code`` is its
    records as they are, and for each new loop of ``t`` trips of ``p`` body records at ``code[j:j + p]``, the
    records ``code[j:j + t * p]``. Those repeat the body's (and their ``keys``), but for the address fields,
    which move by the STEP records' amounts from trip to trip, and no trip starts inside a loop ``code`` holds.
    So both unroll to the same instructions, without unrolling either."""
    n, ops = len(code), rolled["op"]
    kept = origin >= 0
    if (origin >= n).any() or not (_words(rolled)[kept] == _words(code)[origin[kept]]).all():
        return False
    heads = np.flatnonzero((ops == _LOOP) & (origin < 0))
    covers = np.where(origin >= 0, 1, 0)               # records of code each stored record stands for
    firsts = origin.copy()
    inside = _inside(code["op"], code["n"])
    words = _words(code)
    vals = _addr(words)
    fixed = np.where(np.isin(code["op"], (_LOOP, _STEP))[:, None], words,
                     words & _FIXED.view(np.uint32)[None])
    for h in heads.tolist():
        t, p = int(rolled["m"][h]), int(rolled["n"][h])
        if p < 1 or h + 1 + 2 * p > len(rolled):
            return False
        j = int(origin[h + 1])
        body = origin[h + 1:h + 1 + p]
        if not 2 <= t <= MAX_TRIPS or j < 0 or not np.array_equal(body, np.arange(j, j + p)) \
                or (origin[h + 1 + p:h + 1 + 2 * p] >= 0).any() or j + t * p > n or inside[j:j + t * p + 1:p].any():
            return False
        steps = _words(rolled[h + 1 + p:h + 1 + 2 * p])
        if (_words(rolled[h:h + 1]) & _LOOP_OTHER).any() or not (steps & _FIXED.view(np.uint32) == _STEP_ONLY).all():
            return False
        trips = np.arange(j, j + t * p).reshape(t, p)
        step = _addr(steps)
        moved = (vals[j:j + p][None] + np.arange(t, dtype=np.uint64)[:, None, None] * step[None]) & _WIDTH
        if not ((fixed[trips] == fixed[j:j + p][None]).all() and (vals[trips] == moved).all()
                and (keys is None or (keys[trips] == keys[j:j + p][None]).all())):
            return False
        covers[h + 1:h + 1 + 2 * p] = 0
        covers[h], firsts[h] = t * p, j
    # In order, each stored record (or new loop) takes up where the one before ended, from the first to the last.
    firsts, covers = firsts[covers > 0], covers[covers > 0]
    return bool(firsts.size and firsts[0] == 0 and (firsts[1:] == firsts[:-1] + covers[:-1]).all()
                and firsts[-1] + covers[-1] == n) or n == 0


def unroll(stored: np.ndarray, limit: int = MAX_UNROLLED) -> tuple[np.ndarray, np.ndarray]:
    """The instructions of a stored stream in the order they run, and the stored record of each. Raises
    :class:`LoopError` for a malformed loop (trips, body extent, STEP placement and fields) and for loops that
    unroll to more than ``limit`` instructions."""
    ops = np.ascontiguousarray(stored["op"])
    if not np.isin(ops, (_LOOP, _STEP)).any():
        return stored, np.arange(len(stored))           # already in memory as it runs: nothing to bound
    words, origin = _unroll(_words(stored), ops, 0, len(stored), [0, limit])
    return words.view(INSTR_DTYPE).ravel(), origin


def _unroll(w, ops, lo: int, hi: int, total: list) -> tuple[np.ndarray, np.ndarray]:
    """Unroll stored records [lo, hi) given as :func:`_words` (``ops``: their opcodes; ``total``: instructions
    unrolled so far in the stream, and the limit)."""
    pieces, origin = [], []
    i = lo
    while i < hi:
        loops = np.flatnonzero((ops[i:hi] == _LOOP) | (ops[i:hi] == _STEP))
        j = i + int(loops[0]) if loops.size else hi
        if j > i:
            pieces.append(w[i:j])
            origin.append(np.arange(i, j))
            _count(total, j - i, i)
        if j >= hi:
            break
        if ops[j] == _STEP:
            raise LoopError(j, "a STEP record outside the step block of a loop")
        trips, body = int(w[j, 4]), int(w[j, 5])
        if (w[j] & _LOOP_OTHER).any():
            rec = w[j:j + 1].view(INSTR_DTYPE)[0]
            f = next(f for f in INSTR_DTYPE.names if f not in ("op", "m", "n") and rec[f] != 0)
            raise LoopError(j, f"field {f!r} of a LOOP must be zero")
        if not 2 <= trips <= MAX_TRIPS:
            raise LoopError(j, f"trip count {trips} out of range 2..{MAX_TRIPS}")
        if body < 1 or j + 1 + 2 * body > hi:
            raise LoopError(j, f"body of {body} records and their {body} STEP records run past the end of "
                               f"the {'enclosing loop' if hi < len(w) else 'stream'}")
        steps = w[j + 1 + body:j + 1 + 2 * body]
        bad = np.flatnonzero(ops[j + 1 + body:j + 1 + 2 * body] != _STEP)
        if bad.size:
            raise LoopError(j + 1 + body + int(bad[0]), f"expected the STEP record of body record "
                                                         f"{j + 1 + int(bad[0])} of the loop at record {j}")
        raw = steps.view(np.uint8)
        fixed = raw & _FIXED
        fixed[:, 0] = 0
        bad = np.flatnonzero(fixed.any(axis=1))
        if bad.size:
            raise LoopError(j + 1 + body + int(bad[0]), f"a STEP record advances only {', '.join(STEPPED)}")
        kinds = ops[j + 1:j + 1 + body]
        moved = np.flatnonzero(((kinds == _LOOP) | (kinds == _STEP)) & raw[:, 1:].any(axis=1))
        if moved.size:
            raise LoopError(j + 1 + body + int(moved[0]), "the STEP of a LOOP or STEP record must be zero")
        start = total[0]
        recs, orig = _unroll(w, ops, j + 1, j + 1 + body, total)
        _count(total, (trips - 1) * (total[0] - start), j)
        step = _addr(steps)[orig - (j + 1)]     # each unrolled body instruction's step, by its stored record
        t = np.arange(trips, dtype=np.uint64)[:, None, None]
        out = np.tile(recs, (trips, 1))
        _set_words(out, ((_addr(recs)[None] + t * step[None]) & _WIDTH).reshape(-1, 7))     # wraps at the width
        pieces.append(out)
        origin.append(np.tile(orig, trips))
        i = j + 1 + 2 * body
    if not pieces:
        return w[lo:lo], np.zeros(0, dtype=np.int64)
    return np.concatenate(pieces), np.concatenate(origin)


def _count(total: list, k: int, record: int) -> None:
    total[0] += k
    if total[0] > total[1]:
        raise LoopError(record, f"unrolls to more than {total[1]} instructions")
