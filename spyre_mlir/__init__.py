"""spyre-mlir: an MLIR compiler and reference emulator for IBM's Spyre accelerator.

``spyre_mlir.compile(model, example_inputs, precision=..., cores=...)`` compiles a PyTorch model and returns a
callable running it on the emulator (see :mod:`spyre_mlir.compiler`); ``spyre_mlir.generate(model, input_ids,
max_new_tokens=...)`` generates text with a Hugging Face causal LM, its KV cache kept on the device
(:mod:`spyre_mlir.generation`). Importing this package stays light
(no torch, no MLIR): the API is loaded on first use.
"""

__all__ = ["compile", "compile_to_file", "CompileError", "generate"]


def __getattr__(name):
    if name == "generate":
        from spyre_mlir.generation import generate

        return generate
    if name in __all__:
        from spyre_mlir import compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'spyre_mlir' has no attribute {name!r}")
