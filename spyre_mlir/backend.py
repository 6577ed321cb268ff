"""A `torch.compile` backend: the graphs TorchDynamo captures are compiled for Spyre and run on the emulator.

    import torch, spyre_mlir.backend
    fast = torch.compile(model, backend="spyre")                      # default options
    fast = torch.compile(model, backend="spyre", options={"precision": "fp32-reference", "cores": 4})
    fast = torch.compile(model, backend=spyre_mlir.backend.make_backend(precision="fp32-reference", cores=4))

Each captured FX graph goes through the same path as any model (torch.export -> Torch-MLIR -> spyre -> binary);
graph breaks give several binaries (Dynamo splits a graph at ``.item()`` and other data-dependent Python); a graph
torch.export or Torch-MLIR cannot take runs eagerly, with a warning. Outputs come back as torch tensors of the graph's dtypes. Shapes are static:
Dynamo recompiles on a new shape, and so does this backend (the compile cache keeps earlier binaries).
"""

import warnings

import torch

from spyre_mlir.compiler import compile as _compile
from spyre_mlir.compiler import to_torch
from spyre_mlir.errors import UnsupportedModelError


def make_backend(**options):
    """A backend callable with `spyre_mlir.compile` options (precision, cores, target, cache_dir)."""
    defaults = options

    def spyre_backend(gm: torch.fx.GraphModule, example_inputs, options=None):
        # torch.compile(..., options={...}) hands its options to the backend; they override make_backend's.
        try:
            exe = _compile(gm, tuple(example_inputs), **{**defaults, **(options or {})})
        except UnsupportedModelError as e:
            # torch.export or Torch-MLIR cannot take this graph: run it eagerly, as torch.compile's own
            # backends do with what they cannot compile, so the user still gets eager's answer.
            warnings.warn(f"spyre: running a captured graph eagerly: {e}", stacklevel=2)
            return gm.forward

        def run(*args):
            outs = exe(*args)
            return tuple(to_torch(o) for o in outs)

        run.executable = exe
        return run

    return spyre_backend


spyre_backend = make_backend()
torch._dynamo.register_backend(name="spyre")(spyre_backend)
