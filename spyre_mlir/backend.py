"""A `torch.compile` backend: the graphs TorchDynamo captures are compiled for Spyre and run on the emulator.

    import torch, spyre_mlir.backend
    fast = torch.compile(model, backend="spyre")                      # default options
    fast = torch.compile(model, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=4))

Each captured FX graph goes through the same path as any model (torch.export -> Torch-MLIR -> spyre -> binary);
graph breaks give several binaries. Outputs come back as torch tensors of the graph's dtypes. Shapes are static:
Dynamo recompiles on a new shape, and so does this backend (the compile cache keeps earlier binaries).
"""

import torch

from spyre_mlir.compiler import compile as _compile


def make_backend(**options):
    """A backend callable with `spyre_mlir.compile` options (precision, cores, target, cache_dir)."""

    def spyre_backend(gm: torch.fx.GraphModule, example_inputs):
        exe = _compile(gm, tuple(example_inputs), **options)

        def run(*args):
            outs = exe(*args)
            return tuple(torch.from_numpy(o.copy()) for o in outs)

        run.executable = exe
        return run

    return spyre_backend


spyre_backend = make_backend()
torch._dynamo.register_backend(name="spyre")(spyre_backend)
