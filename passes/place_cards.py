"""spyre-place-cards{cards=N cores=C target=PATH plan=PATH plan-out=PATH}: spread the graph over N cards.

The system is N of the target's cards (each with its own cores and device memory) joined by a card-to-card link
(`link.card_gbps`, `link.card_latency_cycles` in the target file). Every device op gets

* `spyre.cards = array<i64: ...>`: the cards that hold its weights and run it;
* `spyre.card_split = "none" | "cols" | "rows" | "heads"`: how its work is divided among those cards.
  `none`: every listed card runs the whole op (one card: a pipeline stage; several: replicated, as a norm is
  between tensor-parallel matmuls). `cols`: a matmul's N (weight columns) is split, each card computes its
  columns and an all-gather over the link makes the result whole on each card; the fp32 accumulation of every
  output element is unchanged, so results are bit-identical. `rows`: K is split, each card computes a partial
  product of its weight rows and an all-reduce (fp32 partials) sums them; the sum's order changes, so results
  agree within the format's tolerance only. `heads`: a batch_matmul's batch (attention heads) is split, with an
  all-gather; bit-identical like `cols`.

and the module gets `spyre.num_cards = N`. A value a card needs but does not hold (a stage boundary) crosses the
link once: latency + bytes / bandwidth. Collectives are rings over the group: all-gather (c - 1) steps of
1/c of the result, all-reduce twice that. Each card's share of the op is costed by the cost model on its
`cores` cores with the grid spyre-divide-work would choose (`op_model.best_cycles`).

The choice: every strategy of `s` pipeline stages (contiguous op ranges holding equal shares of the
parameter bytes) of `t` tensor-parallel cards each, `s * t <= N`; within a group each op takes the cheapest
legal split. The cheapest strategy whose parameters fit every card's device memory wins (ties: fewer cards),
so a model too big for one card is spread over several; one that fits no placement is an error naming the
bytes. Modeled time is the latency of one run: pipeline stages add link transfers and buy memory, not speed
(a pipeline's throughput gain over several requests is not modeled).

`exact=true` chooses among the splits that keep every output element's reduction order only (`none`, `cols`,
`heads`: no `rows`), so the system's results are the one-card results bit for bit.

`plan-out=PATH` writes the decision as JSON (docs/compiler.md): per op its cards, split, the bytes each card
holds and its modeled time; per stage the op range; totals. `plan=PATH` forces a plan instead: each device op's
entry (`id` = its index among device ops in program order, `op` = its name) gives its cards and split; an
entry for no such op, a split the op cannot take or a placement over a card's memory is an error located at
the op. A card's memory holds the parameters it is given (in their device formats) and, at the run's fullest
point, its activations: every tensor one of its ops produces or reads (a model input, a state buffer such as a
KV cache, an op's whole result: a split op's result is whole on each card after its collective), from its
producer to its last reader on the card (inputs and state for the whole run). Both must fit.
"""

from __future__ import annotations

import dataclasses
import json
import math

from torch_mlir import ir

from spyre_mlir import cost
from spyre_mlir.passes.analysis import MATMULS, compile_time, device_ops, get_target, reads
from spyre_mlir.passes.base import PassError, SpyrePass
from spyre_mlir.passes.op_model import best_cycles, fmt_of, op_model
from spyre_mlir.runtime.isa import tile_bytes

CARDS = "spyre.cards"              # op: the cards holding and running it
CARD_SPLIT = "spyre.card_split"    # op: how its work divides among them
NUM_CARDS = "spyre.num_cards"      # module: the system's card count
SPLITS = ("none", "cols", "rows", "heads")
PLAN_FORMAT = "spyre-placement-plan"
PLAN_VERSION = 1


def value_bytes(v: ir.Value, where: ir.Operation) -> int:
    """Device-memory bytes of a tensor value in its device format (innermost dim in whole sticks)."""
    shape = list(ir.RankedTensorType(v.type).shape) or [1]
    return tile_bytes(math.prod(shape[:-1]), shape[-1], fmt_of(v.type, where))


def _result_of(owner) -> ir.Value | None:
    """The first result of a use's owner (an op), or None (func.return, ops without results)."""
    op = owner.operation if isinstance(owner, ir.OpView) else owner
    return op.results[0] if len(op.results) else None


@dataclasses.dataclass
class Op:
    """One device op as placement sees it."""

    index: int
    op: ir.Operation
    model: object                      # op_model.OpModel
    weights: dict                      # parameter value -> bytes (values known at compile time it reads)
    result_bytes: int
    fp32_result_bytes: int             # the result as fp32 partial sums (a row split's all-reduce)

    @property
    def loc(self) -> str:
        text = str(self.op.location)
        return text[4:-1] if text.startswith("loc(") else text


class Placer:
    def __init__(self, module, target, cards: int, cores: int, splits=SPLITS):
        self.target, self.cards, self.cores, self.splits = target, cards, cores, splits
        _, known = compile_time(module)
        self.ops: list[Op] = []
        for i, op in enumerate(device_ops(module)):
            model = op_model(op)
            weights = {v: value_bytes(v, op) for v in reads(op) if v in known and isinstance(v.type,
                                                                                             ir.RankedTensorType)}
            r = op.results[0]
            shape = list(ir.RankedTensorType(r.type).shape) or [1]
            self.ops.append(Op(i, op, model, weights, value_bytes(r, op),
                               tile_bytes(math.prod(shape[:-1]), shape[-1], "fp32")))
        self.by_value = {o.op.results[0]: o for o in self.ops}
        # Activations: a result lives from its op to its last device reader (to the end when anything else, the
        # host or func.return, reads it); a model input or state argument for the whole run.
        end = len(self.ops)
        self.last_use = {}
        for o in self.ops:
            r = o.op.results[0]
            self.last_use[r] = max([self.by_value[u].index if u in self.by_value else end
                                    for u in (_result_of(use.owner) for use in r.uses)], default=o.index)
        self.inputs = {}           # non-parameter argument -> bytes
        for o in self.ops:
            for v in o.op.operands:
                if isinstance(v.owner, ir.Block) and v not in known and isinstance(v.type, ir.RankedTensorType):
                    self.inputs[v] = value_bytes(v, o.op)
        self._cycles: dict = {}

    # ---- one op ------------------------------------------------------------------------------------------

    def split_error(self, o: Op, split: str, c: int) -> str:
        """Why `o` cannot be split `split` over `c` cards ('' when it can)."""
        if split not in SPLITS:
            return f"unknown split '{split}' (choose from {', '.join(SPLITS)})"
        if split == "none" or c == 1:
            return "" if split == "none" else f"split '{split}' needs more than one card"
        m = o.model
        if m.kind != "matmul":
            return f"only a matmul can be split over cards, not {m.describe()}"
        if split == "heads":
            if not m.batched or m.B % c:
                return f"{m.describe()}: the batch (heads) does not divide into {c} cards"
            return ""
        if m.batched:
            return f"{m.describe()}: a batch_matmul is split by heads only"
        if split == "rows" and m.round_fmt is not None:
            # Partial products summed by the readers: no card holds the sum to round before widening it.
            return f"{m.describe()}: its result is rounded on the scratchpad (spyre.convert_result), not split by K"
        dim, quantum = (m.N, max(cost.stick_elems(m.b_fmt or m.fmt, self.target),
                                 cost.stick_elems(m.out_fmt, self.target))) if split == "cols" \
            else (m.K, cost.stick_elems(m.fmt, self.target))
        if dim % (c * quantum):
            return (f"{m.describe()}: {'N' if split == 'cols' else 'K'}={dim} does not divide into {c} cards "
                    f"of whole {quantum}-element sticks")
        return ""

    def compute_cycles(self, o: Op, split: str, c: int) -> float | None:
        """One card's cycles for its share of `o` (None: the share has no division over the card's cores)."""
        key = (o.index, split, c)
        if key not in self._cycles:
            m = o.model
            if split != "none" and c > 1:
                part = {"cols": dict(N=m.N // c), "rows": dict(K=m.K // c), "heads": dict(B=m.B // c)}[split]
                m = dataclasses.replace(m, **part)
            cyc = best_cycles(m, self.cores, self.target)
            self._cycles[key] = None if cyc is None else cyc.total
        return self._cycles[key]

    def transfer_cycles(self, nbytes: int) -> float:
        return self.target.card_link_latency_cycles + nbytes / self.target.card_link_bytes_per_cycle

    def collective_cycles(self, o: Op, split: str, c: int) -> float:
        """The ring all-gather (cols, heads) or all-reduce (rows) that makes the result whole on each card."""
        if split == "none" or c == 1:
            return 0.0
        if split == "rows":
            return 2 * (c - 1) * self.transfer_cycles(o.fp32_result_bytes / c)
        return (c - 1) * self.transfer_cycles(o.result_bytes / c)

    def best_split(self, o: Op, c: int) -> str:
        best = None
        for split in self.splits:
            if self.split_error(o, split, c):
                continue
            t = self.compute_cycles(o, split, c)
            if t is None:
                continue
            key = (t + self.collective_cycles(o, split, c), SPLITS.index(split))
            if best is None or key < best[0]:
                best = (key, split)
        return "none" if best is None else best[1]

    # ---- a whole placement -------------------------------------------------------------------------------

    def evaluate(self, placement: list[tuple[tuple[int, ...], str]]) -> dict:
        """Modeled cycles and bytes per card of `placement` (per op: cards, split)."""
        held = [dict() for _ in range(self.cards)]          # card -> {parameter value: bytes}
        rows, total, link = [], 0.0, 0.0
        for o, (cards, split) in zip(self.ops, placement):
            c = len(cards)
            share = c if split != "none" else 1
            for v, b in o.weights.items():        # a parameter two ops read is held once, in the larger share
                for card in cards:
                    held[card][v] = max(held[card].get(v, 0), math.ceil(b / share))
            comp = self.compute_cycles(o, split, c)
            if comp is None:
                raise PassError(f"no division of {o.model.describe()} over {self.cores} cores "
                                f"of a card", o.op.location)
            # Operands produced on other cards cross the link once to the cards that lack them.
            moved = 0.0
            for v in o.op.operands:
                src = self.by_value.get(v)
                if src is not None and not set(cards) <= set(placement[src.index][0]):
                    moved += self.transfer_cycles(src.result_bytes)
            coll = self.collective_cycles(o, split, c)
            rows.append(dict(compute=comp, link=moved + coll,
                             bytes=sum(math.ceil(b / share) for b in o.weights.values())))
            total += comp + moved + coll
            link += moved + coll
        per_card = [sum(h.values()) for h in held]
        return dict(rows=rows, total=total, link=link, per_card=per_card,
                    activations=self.activation_peaks(placement))

    def activation_peaks(self, placement) -> list[int]:
        """Per card, the most bytes of activations (inputs and state included) live at once under `placement`."""
        cards_of = {}                       # value -> cards holding it (its producer's and its readers')
        for o, (cards, _) in zip(self.ops, placement):
            for v in [o.op.results[0], *o.op.operands]:
                if v in self.by_value or v in self.inputs:
                    cards_of.setdefault(v, set()).update(cards)
        fixed = [0] * self.cards
        for v, b in self.inputs.items():
            for card in cards_of.get(v, ()):
                fixed[card] += b
        live = [0] * self.cards
        peak = list(fixed)
        ends: dict[int, list] = {}
        for o in self.ops:
            r = o.op.results[0]
            for card in cards_of[r]:
                live[card] += o.result_bytes
                peak[card] = max(peak[card], fixed[card] + live[card])
            ends.setdefault(self.last_use[r], []).append(o)
            for done in ends.pop(o.index, []):
                for card in cards_of[done.op.results[0]]:
                    live[card] -= done.result_bytes
        return peak

    def strategy(self, stages: int, tp: int) -> list[tuple[tuple[int, ...], str]]:
        """`stages` contiguous op ranges with about equal parameter bytes, each on `tp` cards."""
        sizes = [sum(o.weights.values()) for o in self.ops]
        whole = sum(sizes) or 1
        placement, acc = [], 0
        for o, size in zip(self.ops, sizes):
            stage = min(stages - 1, int(acc * stages / whole))
            acc += size
            cards = tuple(range(stage * tp, stage * tp + tp))
            placement.append((cards, self.best_split(o, tp)))
        return placement

    def choose(self) -> tuple[list, dict, tuple[int, int]]:
        best, smallest = None, None
        for tp in range(1, self.cards + 1):
            for stages in range(1, self.cards // tp + 1):
                placement = self.strategy(stages, tp)
                ev = self.evaluate(placement)
                peak = max(p + a for p, a in zip(ev["per_card"], ev["activations"]))
                if smallest is None or peak < smallest[0]:
                    smallest = (peak, stages, tp)
                if peak > self.target.dram_bytes:
                    continue
                key = (ev["total"], stages * tp)
                if best is None or key < best[0]:
                    best = (key, placement, ev, (stages, tp))
        if best is None:
            whole = sum(b for o in self.ops for b in o.weights.values())
            peak, stages, tp = smallest
            raise PassError(f"the model's {whole} bytes of parameters and its activations fit no placement over "
                            f"{self.cards} cards of {self.target.dram_bytes} bytes: the best ({stages} stages x "
                            f"{tp} cards) still puts {peak} bytes on one card", None)
        return best[1], best[2], best[3]


def _us(cycles: float, target) -> float:
    return round(cycles / (target.clock_ghz * 1e3), 3)


def plan_json(placer: Placer, placement, ev, strategy, target) -> dict:
    ops, stages = [], []
    for o, (cards, split), row in zip(placer.ops, placement, ev["rows"]):
        ops.append(dict(id=o.index, op=o.op.name, loc=o.loc, cards=list(cards), split=split,
                        bytes_per_card=row["bytes"], compute_us=_us(row["compute"], target),
                        link_us=_us(row["link"], target)))
        if stages and stages[-1]["cards"] == list(cards):
            stages[-1]["ops"][1] = o.index
            stages[-1]["modeled_us"] = round(stages[-1]["modeled_us"] + _us(row["compute"] + row["link"], target), 3)
        else:
            stages.append(dict(ops=[o.index, o.index], cards=list(cards),
                               modeled_us=_us(row["compute"] + row["link"], target)))
    one = sum(placer.compute_cycles(o, "none", 1) or 0.0 for o in placer.ops)
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "cards": placer.cards, "cores": placer.cores,
            "link": {"gbps": target.card_link_gbps, "latency_cycles": target.card_link_latency_cycles},
            "card_bytes": target.dram_bytes,
            "strategy": strategy,
            "modeled_us": _us(ev["total"], target), "link_us": _us(ev["link"], target),
            "one_card_us": _us(one, target), "bytes_per_card": ev["per_card"],
            "activation_bytes_per_card": ev["activations"], "ranges": stages, "ops": ops}


def plan_text(plan: dict) -> str:
    """The plan as JSON with one line per range and per op: readable, and diffable / editable by line."""
    head = {k: v for k, v in plan.items() if k not in ("ranges", "ops")}
    out = json.dumps(head, indent=1)[:-2]
    for key in ("ranges", "ops"):
        out += f',\n "{key}": [\n' + ",\n".join("  " + json.dumps(e) for e in plan[key]) + "\n ]"
    return out + "\n}\n"


def load_plan(path: str, module) -> dict:
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise PassError(f"cannot read placement plan {path}: {e}", module.location) from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
        raise PassError(f"{path} is not a {PLAN_FORMAT} version {PLAN_VERSION}",
                        module.location)
    return plan


def read_plan(path: str, plan: dict, placer: Placer, module) -> tuple[list[tuple[tuple[int, ...], str]], object]:
    """The placement a plan forces, checked against the module's ops and the system, and the plan's strategy
    (carried through, so a forced plan writes back the plan it was given)."""
    entries = plan.get("ops")
    if not isinstance(entries, list):
        raise PassError(f"{path}: 'ops' must be a list", module.location)
    forced: dict[int, tuple[tuple[int, ...], str]] = {}
    for n, e in enumerate(entries):
        where = f"{path}: ops[{n}]"
        if not isinstance(e, dict) or not isinstance(e.get("id"), int) or e["id"] not in range(len(placer.ops)):
            raise PassError(f"{where}: unknown op {e.get('id') if isinstance(e, dict) else e!r}"
                            f" (the module has device ops 0..{len(placer.ops) - 1})", module.location)
        o = placer.ops[e["id"]]
        if e.get("op") != o.op.name:
            raise PassError(f"{where}: unknown op: id {o.index} is {o.op.name} here, the plan "
                            f"says {e.get('op')!r}", o.op.location)
        cards, split = e.get("cards"), e.get("split", "none")
        if not isinstance(cards, list) or not cards or len(set(cards)) != len(cards) or \
                any(not isinstance(c, int) or not 0 <= c < placer.cards for c in cards):
            raise PassError(f"{where}: cards {cards!r} must be distinct cards of "
                            f"0..{placer.cards - 1}", o.op.location)
        why = placer.split_error(o, split, len(cards))
        if why:
            raise PassError(f"{where}: impossible split '{split}' over {len(cards)} cards: "
                            f"{why}", o.op.location)
        if o.index in forced:
            raise PassError(f"{where}: op {o.index} is placed twice", o.op.location)
        forced[o.index] = (tuple(cards), split)
    for o in placer.ops:
        if o.index not in forced:
            raise PassError(f"{path} does not place op {o.index} ({o.op.name})", o.op.location)
    return [forced[o.index] for o in placer.ops], plan.get("strategy", "forced")


@dataclasses.dataclass
class PlaceCardsPass(SpyrePass):
    NAME = "spyre-place-cards"
    SUMMARY = "Place device ops on the cards of a multi-card system (pipeline stages, tensor-parallel splits)"

    cards: int = 0
    cores: int = 0
    target: str = ""
    plan: str = ""
    plan_out: str = ""
    exact: bool = False

    def run(self, module: ir.Operation) -> None:
        target = get_target(self.target, module)
        plan = load_plan(self.plan, module) if self.plan else None
        cards = self.cards or (plan.get("cards") if plan else 0) or target.num_cards
        if isinstance(cards, bool) or not isinstance(cards, int):
            raise PassError(f"{self.plan}: 'cards' must be an integer, got {cards!r}", module.location)
        if not 1 <= cards <= target.cards_per_host:
            raise PassError(f"impossible card count {cards}: target '{target.name}' has 1..{target.cards_per_host} "
                            f"cards", module.location)
        cores = self.cores or target.num_cores
        if not 1 <= cores <= target.max_cores:
            raise PassError(f"impossible core count {cores}: target '{target.name}' has 1..{target.max_cores} "
                            f"cores", module.location)
        placer = Placer(module, target, cards, cores, tuple(s for s in SPLITS if s != "rows") if self.exact
                        else SPLITS)
        if self.plan:
            placement, strategy = read_plan(self.plan, plan, placer, module)
            ev = placer.evaluate(placement)
            for card, (b, a) in enumerate(zip(ev["per_card"], ev["activations"])):
                if b + a > target.dram_bytes:
                    first = next(o for o, (cs, _) in zip(placer.ops, placement)
                                 if card in cs and (o.weights or not b))
                    raise PassError(f"{self.plan} puts {b} bytes of parameters and {a} bytes of activations on card "
                                    f"{card}, over its {target.dram_bytes} bytes of device memory", first.op.location)
        else:
            try:
                placement, ev, (stages, tp) = placer.choose()
                strategy = {"stages": stages, "tensor_parallel": tp}
            except PassError as e:
                raise PassError(str(e), e.location or module.location) from None
        i64 = ir.IntegerType.get_signless(64)
        for o, (cs, split) in zip(placer.ops, placement):
            o.op.attributes[CARDS] = ir.DenseI64ArrayAttr.get(list(cs))
            o.op.attributes[CARD_SPLIT] = ir.StringAttr.get(split)
        module.attributes[NUM_CARDS] = ir.IntegerAttr.get(i64, cards)
        if self.plan_out:
            with open(self.plan_out, "w") as f:
                f.write(plan_text(plan_json(placer, placement, ev, strategy, target)))
