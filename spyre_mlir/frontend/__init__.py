"""Frontend: load a PyTorch model safely, adapt it, import it to torch and linalg-on-tensors MLIR.

``import spyre_mlir.frontend`` stays cheap: torch and torch_mlir are imported on first use of the
API below, not at package import (tools such as ``spyre-opt`` must not pay for torch).

Public API::

    import_model(model_or_path, example_inputs=None, input_shapes=None, trust_pickle=False, *, stage="linalg")
        -> ImportedModel                      # load + adapt + import; stage="torch" stops before linalg
    load_program(model_or_path, example_inputs=None, input_shapes=None, trust_pickle=False)
        -> torch.export.ExportedProgram       # the loading step alone
    import_program(ep) -> ImportedModel       # adapt + import an ExportedProgram to torch IR
    lower_to_linalg(torch_ir: str) -> str     # the torch -> linalg-on-tensors pipeline
    adapt(ep) -> (ep, adapter names)          # Torch-MLIR's decompositions plus the model adapters
    ImportedModel, TensorSpec, FrontendError, StageError, ADAPTERS, detect_format, parse_input_shape

See docs/frontend.md.
"""

from .errors import FrontendError, StageError

_LAZY = {
    "import_model": "importer",
    "import_program": "importer",
    "lower_to_linalg": "importer",
    "ImportedModel": "importer",
    "TensorSpec": "importer",
    "load_program": "load",
    "detect_format": "load",
    "parse_input_shape": "load",
    "ADAPTERS": "adapters",
    "adapt": "adapters",
}

__all__ = ["FrontendError", "StageError", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
