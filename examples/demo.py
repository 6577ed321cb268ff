"""The main job (`make demo`): compile the example MLP for Spyre and run it on the emulator.

Builds ``examples/mlp.py``, compiles it with ``spyre_mlir.compile`` (DLFloat16, every core of the card),
runs the binary on the emulator, compares with eager PyTorch and prints the modeled profile. Exits 1 when
the outputs differ by more than the DLFloat16 tolerance: 8 roundings of 2^-10 relative to the largest
output magnitude (see test/unit/test_compile_e2e.py for why that bound holds).
"""

import os
import sys
import time
import warnings

import numpy as np

# torch.export warns about its own internals (deprecations users cannot act on); spyre-compile hides them too.
warnings.filterwarnings("ignore", category=FutureWarning)

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 8 * 2.0**-10


def main() -> int:
    import torch

    sys.path.insert(0, HERE)
    import mlp

    import spyre_mlir
    from spyre_mlir.tools.run import print_profile

    model, example_inputs = mlp.build(seed=0)
    print(f"model: {model.__class__.__name__} ({sum(p.numel() for p in model.parameters()):,} parameters), "
          f"input {tuple(example_inputs[0].shape)}", flush=True)
    t0 = time.perf_counter()
    exe = spyre_mlir.compile(model, example_inputs, precision="dlf16")
    info = exe.compile_info
    print(f"compiled: precision {info.precision}, {info.cores} cores, {time.perf_counter() - t0:.2f} s"
          f"{' (cache hit)' if info.cache_hit else ''} -> {info.path}")
    print(f"host ops: {', '.join(info.host_ops) if info.host_ops else 'none (everything runs on the device)'}")
    (y,) = exe(*example_inputs)
    with torch.no_grad():
        ref = model(*example_inputs).numpy()
    err = float(np.max(np.abs(y - ref)))
    scale = float(np.max(np.abs(ref)))
    ok = err <= TOLERANCE * scale
    print(f"vs PyTorch: max abs error {err:.3e}, {err / scale:.2e} of max|ref| "
          f"(tolerance {TOLERANCE:.2e} = 8 DLFloat16 roundings of 2^-10) -> {'OK' if ok else 'MISMATCH'}")
    print_profile(exe.profile)
    if not ok:
        print("demo: FAILED (outputs differ from PyTorch beyond the DLFloat16 tolerance)", file=sys.stderr)
        return 1
    print("demo: the MLP compiled for Spyre matches PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
