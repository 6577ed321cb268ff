"""Modeled Granite-3.3-8B prefill and decode latency on 1, 2 and 4 Spyre cards, and where the link bounds it.

The decoder layer, its prefill and decode programs and the Granite-3.3-8B dimensions are those of
``bench/granite_estimate.py`` (same modules, same substitutions, checked against the stock layer first). Each
program is imported once and taken to the point where spyre-place-cards runs (spyre-reduce-precision,
spyre-layout, spyre-fuse, spyre-select-kernels); then spyre-place-cards{cards=N} places it for N = 1, 2, 4
and its placement plan gives the modeled time: each card's share of every op costed by the cost model on the
card's cores (the grid spyre-divide-work would choose), plus the link (all-gathers / all-reduces of
tensor-parallel splits, stage transfers). Then (unless --no-emit) each program is compiled for N cards with that
placement (spyre-partition-cards, the rest of the pipeline, spyre-emit) and loaded, and the system binary's
static profile gives the emitted programs' modeled time, each card's busy time and each link's: the model
from the real per-card programs and the schedule between them (nothing is executed: a layer's numerics would
take hours on the emulator). The whole model is num_hidden_layers x one layer (the embedding and LM head are
left out).

    .venv/bin/python bench/cards.py [--seq 1024] [--cores 32] [--cards 1 2 4] [--no-emit]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import granite_estimate as ge  # noqa: E402


def place(module, cards: int, cores: int, tmp: str) -> dict:
    from spyre_mlir.passes.manager import run_pipeline

    out = os.path.join(tmp, f"plan{cards}.json")
    run_pipeline(module, f"builtin.module(spyre-place-cards{{cards={cards} cores={cores} plan-out={out}}})")
    with open(out) as f:
        return json.load(f)


def emitted(imported, cards: int, cores: int) -> dict:
    """The static profile of `imported` compiled for `cards` cards (the placement spyre-place-cards chooses)."""
    from spyre_mlir.compiler import emit, prepare_module
    from spyre_mlir.context import make_context
    from spyre_mlir.passes.manager import run_pipeline
    from spyre_mlir.pipeline import graph_pipeline, kernel_pipeline
    from spyre_mlir.runtime import load_bytes
    from spyre_mlir.runtime.binary import program_to_bytes

    t0 = time.perf_counter()
    with make_context():
        m = prepare_module(imported)
        run_pipeline(m, graph_pipeline())
        run_pipeline(m, kernel_pipeline("dlf16", cores, None, cards))
        em = emit(m)
        data = em.to_bytes() if getattr(em, "system", False) else program_to_bytes(em.b.program())
    seconds = time.perf_counter() - t0
    p = load_bytes(data).static_profile
    clock = p.clock_ghz * 1e3
    if hasattr(p, "num_cards"):
        return dict(us=p.cycles / clock, cards=p.num_cards, link_us=max(p.link_busy) / clock,
                    link_util=max(p.link_utilization), compile_s=seconds)
    return dict(us=p.cycles / clock, cards=1, link_us=0.0, link_util=0.0, compile_s=seconds)


def split_counts(plan: dict) -> str:
    counts: dict[str, int] = {}
    for o in plan["ops"]:
        if o["op"] in ("spyre.matmul", "spyre.batch_matmul"):
            counts[o["split"]] = counts.get(o["split"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--cards", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--no-emit", action="store_true", help="the placement's model only (fast)")
    args = ap.parse_args(argv)

    from spyre_mlir.compiler import prepare_module
    from spyre_mlir.context import make_context
    from spyre_mlir.frontend import import_model
    from spyre_mlir.passes.manager import run_pipeline
    from spyre_mlir.pipeline import graph_pipeline

    ge.check()
    G, S = ge.GRANITE_3_3_8B, args.seq
    layer, rotary = ge.decoder_layer(ge.granite_config())
    kv, d, H = G["num_key_value_heads"], G["head_dim"], G["hidden_size"]
    torch.manual_seed(1)
    jobs = [("prefill", ge.Prefill(layer, rotary), (torch.randn(1, S, H),)),
            ("decode", ge.Decode(layer, rotary, S - 1),
             (torch.randn(1, 1, H), torch.randn(1, kv, S - 1, d), torch.randn(1, kv, S - 1, d)))]
    n = G["num_hidden_layers"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="spyre-cards-") as tmp:
        for name, module, inputs in jobs:
            t0 = time.perf_counter()
            imported = import_model(module, inputs)
            with make_context():
                m = prepare_module(imported)
                run_pipeline(m, graph_pipeline())
                run_pipeline(m, "builtin.module(spyre-reduce-precision{precision=dlf16},spyre-layout,spyre-fuse,"
                                "spyre-select-kernels)")
                for cards in args.cards:
                    results[name, cards] = place(m, cards, args.cores, tmp)
            print(f"  layer {name}: placed on {args.cards} cards in {time.perf_counter() - t0:.0f} s", flush=True)
            for cards in [] if args.no_emit else args.cards:
                results[name, cards]["emitted"] = emitted(imported, cards, args.cores)
                print(f"  layer {name}: {cards} cards emitted: {results[name, cards]['emitted']}", flush=True)

    print(f"\nGranite-3.3-8B ({ge.SOURCE}), {n} layers (embedding and LM head left out), {args.cores} cores per "
          f"card, dlf16, batch 1; prefill {S} tokens, decode 1 token attending to {S} positions; link "
          f"{results['decode', args.cards[0]]['link']['gbps']} GB/s, "
          f"{results['decode', args.cards[0]]['link']['latency_cycles']} cycles per transfer (assumed).")
    print("| program | cards | strategy (stages x tensor-parallel) | matmul splits | placement model ms (40 layers) | "
          "of which link ms | speedup over 1 card | emitted programs ms | busiest link ms (utilization) | "
          "speedup over 1 card (emitted) | parameters per card MB |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("prefill", "decode"):
        base = results[name, args.cards[0]]["modeled_us"]
        ebase = results[name, args.cards[0]].get("emitted", {}).get("us")
        for cards in args.cards:
            p = results[name, cards]
            st = p["strategy"]
            e = p.get("emitted")
            emit_cols = (f"{n * e['us'] / 1e3:.2f} | {n * e['link_us'] / 1e3:.2f} ({e['link_util']:.1%}) | "
                         f"{ebase / e['us']:.2f}") if e else "- | - | -"
            print(f"| layer {name} | {cards} | {st['stages']} x {st['tensor_parallel']} | {split_counts(p)} | "
                  f"{n * p['modeled_us'] / 1e3:.2f} | {n * p['link_us'] / 1e3:.2f} | {base / p['modeled_us']:.2f} | "
                  f"{emit_cols} | {n * max(p['bytes_per_card']) / 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
