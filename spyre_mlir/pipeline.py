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
    return f"builtin.module({','.join(steps)})"
