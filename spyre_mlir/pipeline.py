"""The compiler's pass pipelines, one function per stage, with a line of why for each step.

Each function returns a textual pipeline that `spyre-opt -p` accepts, so every stage can be reproduced by hand.
"""


def graph_pipeline(place_host: bool = True, report: bool = False) -> str:
    """linalg-on-tensors -> spyre graph ops, with whatever cannot run on the device placed on the host."""
    steps = [
        # Fold torch-mlir's leftovers (casts of constants, trivial reshapes) so the patterns see clean IR.
        "canonicalize",
        # The heart of the stage: linalg/tensor ops become spyre ops; fused norms/softmax are recognised.
        "spyre-convert-linalg",
        # Conversion leaves dead fills, empties and duplicated views behind.
        "canonicalize",
        "cse",
    ]
    if place_host:
        # Nothing is dropped: every op without a device form is kept whole in a spyre.host region.
        steps.append("spyre-place-host{report=true}" if report else "spyre-place-host")
        # A chain of host regions, each read only by the next, is one region: one host round trip, not one each.
        steps.append("spyre-merge-host")
        # Elementwise chains become one map: intermediates stay in the SFU instead of round-tripping DRAM.
        steps.append("spyre-fuse-maps")
    return f"builtin.module({','.join(steps)})"


PRECISIONS = ("dlf16", "fp8", "int8-weights", "fp32-reference")


def kernel_pipeline(precision: str = "dlf16", cores: int | None = None, target: str | None = None,
                    cards: int | None = None, plan: str | None = None, plan_out: str | None = None) -> str:
    """spyre graph (the output of :func:`graph_pipeline`) -> kernel level: formats, layouts, work division,
    tiles, scratchpad offsets, schedule; what ``spyre-emit`` reads (docs/compiler.md).

    ``cores`` None means every core of the target; ``target`` is a target TOML path (None: the packaged card).
    ``cards`` > 1, a placement ``plan`` to force or a ``plan_out`` path adds spyre-place-cards; without them
    the pipeline (and so a single-card binary) is exactly the single-card one.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    def opts(**kw) -> str:
        kw = {k: v for k, v in kw.items() if v}
        return "{" + " ".join(f"{k}={v}" for k, v in kw.items()) + "}" if kw else ""

    steps = [
        # A norm read only by linear layers scales their weights instead: no weight load or multiply per tile.
        "spyre-fold-norm-weights",
        # Pick the number format of every device tensor (explicit casts; weights quantized with scales).
        f"spyre-reduce-precision{{precision={precision}}}",
        # rotate_half's slices, negation and concat are one exact matmul by a constant: no data movement kernels.
        "spyre-columns-to-matmul",
        # Stick layouts; restickify transposes where matmul operands need another sticked dim.
        "spyre-layout",
        # Matmuls convert their model-typed operands/result on the scratchpad: no cast round trips through DRAM.
        "spyre-fuse",
        # Decide once where each op runs: computed while compiling, a device kernel (which), or the host.
        "spyre-select-kernels" + opts(target=target),
        # Compute those compile-time ops now: constants in the IR, weights quantized into codes and scales.
        "spyre-fold-constants",
    ]
    if (cards or 1) > 1 or plan or plan_out:
        # Spread the graph over the cards: pipeline stages and tensor-parallel splits, from the cost model.
        steps.append("spyre-place-cards" + opts(cards=cards, cores=cores, target=target, plan=plan,
                                                **{"plan-out": plan_out}))
        # One function per card and step, @main their schedule: each card's share is a one-card program.
        steps.append("spyre-partition-cards" + opts(target=target))
    steps += [
        # Host regions that can run at the same point are one call to the host: one round trip's latency, not many.
        "spyre-round-trips",
        # A matmul only another's epilogue reads, of the same lhs (an MLP's gate), computed by that one's kernel.
        "spyre-siblings" + opts(cores=cores, target=target),
        # Spread each op over the cores (grid), with the cost model choosing splits.
        "spyre-divide-work" + opts(cores=cores, target=target),
        # Per-core tiles that fit the scratchpad with double buffering.
        "spyre-tile" + opts(target=target),
        # Attention's P @ V in the kernel computing P, where the tiles allow: P never leaves the cores.
        "spyre-chain-matmuls" + opts(target=target),
        # A norm only a matmul reads, computed on each A tile that kernel loads: its result never leaves the cores.
        "spyre-norm-prologues" + opts(target=target),
        # Byte offsets of each op's scratchpad buffers, reused where lifetimes allow.
        "spyre-allocate-scratchpad" + opts(target=target),
        # Double buffering and the barriers where data crosses cores.
        "spyre-schedule",
        # Constants a kernel loads once, loaded while the kernel before it computes (the DMA unit is idle then).
        "spyre-prefetch" + opts(target=target),
        # A conv's output rows go over the ring into the next conv's patches (or a flatten's input, and the
        # flatten's into its classifier's A tiles): activations skip DRAM.
        "spyre-chain-convs" + opts(target=target),
    ]
    return f"builtin.module({','.join(steps)})"
