"""Load a model from memory or from a file into a ``torch.export.ExportedProgram``.

Everything downstream (adapters, import to MLIR) works on an ExportedProgram, so this module's only job
is to get there safely from what users actually have:

* an ``nn.Module`` plus example inputs (exported here with ``torch.export.export``);
* an ``ExportedProgram`` (used as is);
* a ``torch.export.save`` archive, whatever its extension (``.pt2``, or ``.pt``, which users also use);
* a TorchScript file (``torch.jit.save``), converted with torch's ``TS2EPConverter``; input shapes come from
  ``input_shapes`` (CLI ``--input-shape``), else from the inputs a traced module stored in the file;
* a whole-module pickle (``torch.save(model)``), only with ``trust_pickle=True``: unpickling runs code from
  the file, so it must be an explicit decision.

Formats are detected by content, never by extension. Every failure a user can cause raises
:class:`FrontendError` with a message naming the file and the accepted formats.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import zipfile
from typing import Any, Sequence

import torch

from .errors import ExportError, FrontendError

ACCEPTED_FORMATS = (
    "a torch.export.save archive (.pt2 or .pt), a TorchScript file from torch.jit.save "
    "(with --input-shape when it carries no example inputs), or a whole-module torch.save pickle "
    "(only with --trust-pickle)"
)

# Format names returned by detect_format.
EXPORT, TORCHSCRIPT, PICKLE = "export", "torchscript", "pickle"

_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i1": torch.bool,
    "bool": torch.bool,
}


def parse_input_shape(text: str) -> tuple[tuple[int, ...], torch.dtype]:
    """Parse ``1x3x224x224xf32`` into ``((1, 3, 224, 224), torch.float32)``.

    The element type is the last ``x``-separated field (f32, f16, bf16, f64, i64, i32, i16, i8, u8, i1);
    ``xf32`` may be left out. A scalar is just the element type (``f32``).
    """
    fields = text.strip().lower().split("x")
    dtype = torch.float32
    if fields and fields[-1] in _DTYPES:
        dtype = _DTYPES[fields.pop()]
    if fields == [""]:
        fields = []
    if not all(re.fullmatch(r"\d+", f) for f in fields):
        raise FrontendError(
            f"cannot parse input shape {text!r}: expected sizes and an element type separated by 'x', "
            f"e.g. 1x3x224x224xf32 or 1x16xi64 (element types: {', '.join(_DTYPES)})"
        )
    return tuple(int(f) for f in fields), dtype


def example_inputs_from_shapes(shapes: Sequence[str | tuple]) -> tuple[torch.Tensor, ...]:
    """Deterministic example inputs for the given shapes: integer inputs are zeros (valid indices for
    embeddings), floating-point ones are seeded normal samples. Only shapes and dtypes matter for export."""
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for spec in shapes:
        shape, dtype = parse_input_shape(spec) if isinstance(spec, str) else spec
        if dtype.is_floating_point:
            inputs.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            inputs.append(torch.zeros(shape, dtype=dtype))
    return tuple(inputs)


def detect_format(path: str | os.PathLike) -> str:
    """Return ``"export"``, ``"torchscript"`` or ``"pickle"`` from the file's content.

    ``torch.export.save``, ``torch.jit.save`` and ``torch.save`` all write zip archives (the last one also a
    legacy raw pickle); their members tell them apart: an export archive has ``archive_format`` and
    ``models/``, a TorchScript archive has ``code/``, a pickle has only ``data.pkl`` and tensor data.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FrontendError(f"model file {path!r} does not exist. Expected {ACCEPTED_FORMATS}.")
    if os.path.isdir(path):
        raise FrontendError(f"model path {path!r} is a directory, not a file. Expected {ACCEPTED_FORMATS}.")
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise FrontendError(
                f"model file {path!r} looks like a zip archive but cannot be read ({e}); it is corrupt or "
                f"truncated. Expected {ACCEPTED_FORMATS}."
            ) from None
        # Members are "<archive name>/<member>"; compare the part after the first "/".
        members = {n.split("/", 1)[1] if "/" in n else n for n in names}
        if "archive_format" in members or "models/model.json" in members:
            return EXPORT
        if any(m.startswith("code/") for m in members) or "constants.pkl" in members:
            return TORCHSCRIPT
        if "data.pkl" in members:
            return PICKLE
        raise FrontendError(
            f"model file {path!r} is a zip archive but not one PyTorch writes (no archive_format, code/ or "
            f"data.pkl member). Expected {ACCEPTED_FORMATS}."
        )
    if head[:1] == b"\x80":  # pickle protocol >= 2 opcode: torch.save(..., _use_new_zipfile_serialization=False)
        return PICKLE
    raise FrontendError(
        f"model file {path!r} is not a format the frontend reads (it is neither a zip archive nor a pickle). "
        f"Expected {ACCEPTED_FORMATS}."
    )


def load_program(
    model_or_path: Any,
    example_inputs: Sequence[torch.Tensor] | None = None,
    input_shapes: Sequence[str | tuple] | None = None,
    trust_pickle: bool = False,
) -> torch.export.ExportedProgram:
    """Return an ExportedProgram for an nn.Module, an ExportedProgram, or a model file (see module doc).

    ``example_inputs`` (a tuple of tensors, or a dict of keyword arguments such as ``{"input_ids": ids,
    "attention_mask": mask}``) or ``input_shapes`` (``"1x16xi64"`` strings or ``(shape, dtype)``) are
    needed for an nn.Module, a TorchScript file without stored inputs, and a pickled module.
    """
    if isinstance(model_or_path, torch.export.ExportedProgram):
        return model_or_path
    if isinstance(model_or_path, torch.nn.Module):
        inputs = _resolve_inputs(example_inputs, input_shapes, what="an nn.Module")
        return _export(model_or_path, inputs, what=type(model_or_path).__name__)
    if isinstance(model_or_path, (str, os.PathLike)):
        return _load_file(os.fspath(model_or_path), example_inputs, input_shapes, trust_pickle)
    raise FrontendError(
        f"cannot load a model from a {type(model_or_path).__name__}: pass an nn.Module with example inputs, "
        f"a torch.export.ExportedProgram, or the path of {ACCEPTED_FORMATS}."
    )


def _resolve_inputs(example_inputs, input_shapes, what: str, fallback=None):
    """Positional example inputs as a tuple, or keyword ones as a dict (passed through)."""
    if isinstance(example_inputs, dict):
        return dict(example_inputs)
    if example_inputs is not None:
        return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if input_shapes:
        return example_inputs_from_shapes(input_shapes)
    if fallback is not None:
        return fallback
    raise FrontendError(
        f"{what} carries no input shapes: give example inputs, or one --input-shape per input "
        f"(e.g. --input-shape 1x3x224x224xf32 --input-shape 1x16xi64)."
    )


def _export(module: torch.nn.Module, inputs, what: str) -> torch.export.ExportedProgram:
    # The module's own mode, as torch.compile keeps it: training-mode batch norm updates its statistics (state
    # outputs written back after each call); call model.eval() for inference.
    try:
        args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else (inputs, {})
        with _static_experts(module):
            return torch.export.export(module, args, kwargs={**_export_kwargs(module), **kwargs}, strict=False)
    except Exception as e:  # torch.export raises many types; all mean "this model did not trace"
        raise ExportError(
            f"torch.export could not trace {what} with inputs of shapes "
            f"{_shapes(inputs)}: {type(e).__name__}: {_first_line(e)}"
        ) from e


def _shapes(inputs):
    if isinstance(inputs, dict):
        return {k: tuple(getattr(t, "shape", ())) for k, t in inputs.items()}
    return [tuple(getattr(t, "shape", ())) for t in inputs]


def _export_kwargs(module: torch.nn.Module) -> dict:
    """Keyword arguments for tracing a Hugging Face model as a pure function of its inputs: with
    ``use_cache=False`` it returns its outputs (logits, hidden states) without a ``DynamicCache``, an object
    torch.export cannot flatten. Generation with a KV cache is ``spyre_mlir.generate``'s job."""
    import inspect

    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        return {}
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"use_cache": False} if "use_cache" in params else {}


@contextlib.contextmanager
def _static_experts(module: torch.nn.Module):
    """Trace a Hugging Face mixture-of-experts model with its ``batched_mm`` experts: the default
    ``grouped_mm`` sorts tokens by expert into groups of data-dependent sizes (``histc``, offsets), which a
    static-shape program cannot hold; ``batched_mm`` gathers each token's expert weights and computes the
    same sums with shapes fixed by the token count and top-k."""
    # The model itself, or the first Hugging Face model inside a wrapper (generation's cache step).
    model = next((m for m in module.modules() if hasattr(m, "set_experts_implementation")), None)
    try:
        before = model.get_experts_implementation() if model is not None and \
            model._can_set_experts_implementation() else None
    except Exception:  # noqa: BLE001 - not a model with switchable experts
        before = None
    if not before or all(v == "batched_mm" for v in before.values()):
        yield
        return
    model.set_experts_implementation("batched_mm")
    try:
        yield
    finally:
        model.set_experts_implementation(before)


def _load_file(path, example_inputs, input_shapes, trust_pickle) -> torch.export.ExportedProgram:
    fmt = detect_format(path)
    if fmt == EXPORT:
        try:
            # An open file, not the path: torch.export.load warns about (and retries) paths not ending in .pt2.
            with open(path, "rb") as f:
                ep = torch.export.load(f)
        except Exception as e:
            raise FrontendError(
                f"model file {path!r} is a torch.export archive but could not be loaded "
                f"({type(e).__name__}: {_first_line(e)}); it may be corrupt or written by an incompatible "
                f"torch version. Expected {ACCEPTED_FORMATS}."
            ) from e
        if input_shapes:
            _check_archive_shapes(ep, input_shapes, path)
        return ep
    if fmt == TORCHSCRIPT:
        return _load_torchscript(path, example_inputs, input_shapes)
    return _load_pickle(path, example_inputs, input_shapes, trust_pickle)


def _check_archive_shapes(ep, input_shapes, path) -> None:
    """An export archive fixes its input shapes; silently ignoring different --input-shape values would
    compile something other than what the user asked for."""
    wanted = [parse_input_shape(s) if isinstance(s, str) else s for s in input_shapes]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    actual = []
    for name in ep.graph_signature.user_inputs:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if isinstance(val, torch.Tensor):
            actual.append((tuple(val.shape), val.dtype))
    if [(tuple(s), d) for s, d in wanted] != actual:
        def show(shapes):
            return ", ".join("x".join(map(str, s)) + f"x{str(d).removeprefix('torch.')}" for s, d in shapes)

        raise FrontendError(
            f"model file {path!r} was exported for inputs {show(actual)}, not the --input-shape given "
            f"({show(wanted)}); an export archive fixes its shapes: export again with the shapes you want, "
            f"or drop --input-shape."
        )


def _load_torchscript(path, example_inputs, input_shapes) -> torch.export.ExportedProgram:
    """torch.export refuses ScriptModules; torch's TS2EPConverter rebuilds an ExportedProgram from the
    TorchScript graph (parameters become buffers, which the importer treats alike). Inputs: explicit ones,
    else the shapes a traced module recorded."""
    try:
        script = torch.jit.load(path, map_location="cpu")
    except Exception as e:
        raise FrontendError(
            f"model file {path!r} looks like TorchScript but torch.jit.load failed "
            f"({type(e).__name__}: {_first_line(e)}); it may be corrupt. Expected {ACCEPTED_FORMATS}."
        ) from e
    traced = _traced_input_shapes(path)
    inputs = _resolve_inputs(
        example_inputs,
        input_shapes,
        what=f"TorchScript file {path!r}",
        fallback=example_inputs_from_shapes(traced) if traced else None,
    )
    from torch._export.converter import TS2EPConverter

    try:
        converted = TS2EPConverter(script, inputs).convert()
        # The converter marks every input dimension dynamic; Spyre compiles static shapes, so export its
        # graph again with the concrete example inputs.
        return torch.export.export(converted.module(), inputs, strict=False)
    except Exception as e:
        raise FrontendError(
            f"TorchScript file {path!r} could not be converted to an ExportedProgram "
            f"({type(e).__name__}: {_first_line(e)}). Export the original nn.Module with torch.export.save "
            f"instead."
        ) from e


class _TracedInputsUnpickler(pickle.Unpickler):
    """Reads the input *shapes* from ``traced_inputs.pkl`` of a traced TorchScript archive.

    ``torch.jit.trace`` records the inputs it traced with (as tensor metadata; torch writes their data as
    empty records), which spares users an ``--input-shape``. torch offers no loader for this member and a
    plain unpickler would run any code, so this one resolves only the globals a tensor list needs and
    yields zero tensors of the recorded shapes and dtypes.
    """

    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch.jit._pickle", "restore_type_tag"),
        ("collections", "OrderedDict"),
    }
    _STORAGE_DTYPES = {
        "FloatStorage": torch.float32,
        "DoubleStorage": torch.float64,
        "HalfStorage": torch.float16,
        "BFloat16Storage": torch.bfloat16,
        "LongStorage": torch.int64,
        "IntStorage": torch.int32,
        "ShortStorage": torch.int16,
        "CharStorage": torch.int8,
        "ByteStorage": torch.uint8,
        "BoolStorage": torch.bool,
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and name in self._STORAGE_DTYPES:
            return self._STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in traced inputs")

    def persistent_load(self, pid):
        kind, dtype, _key, _location, numel = pid
        if kind != "storage" or not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return torch.storage.TypedStorage(numel, dtype=dtype, _internal=True)


def _traced_input_shapes(path: str) -> list[tuple[tuple[int, ...], torch.dtype]] | None:
    """The (shape, dtype) of each input ``torch.jit.trace`` stored for ``forward``, or None (scripted
    modules, or an unreadable member: then the user is asked for --input-shape)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("/traced_inputs.pkl")]
            if not names:
                return None
            with zf.open(names[0]) as f:
                stored = _TracedInputsUnpickler(f).load()
    except Exception:
        return None
    inputs = stored.get("forward") if isinstance(stored, dict) else None
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, torch.Tensor) for t in inputs):
        return [(tuple(t.shape), t.dtype) for t in inputs]
    return None


def _load_pickle(path, example_inputs, input_shapes, trust_pickle) -> torch.export.ExportedProgram:
    """Whole-module pickles need the model's classes and run their code on load: opt-in only.

    Without the opt-in the file is still probed with torch's weights-only unpickler (safe by design), so a
    state dict gets a precise message instead of the generic pickle one.
    """
    if not trust_pickle:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            raise FrontendError(
                f"model file {path!r} is a pickled Python object (torch.save of a whole module). Loading it "
                f"runs arbitrary code from the file, so it is refused by default. If you trust the file, pass "
                f"--trust-pickle (trust_pickle=True) with one --input-shape per input; better, save the model "
                f"with torch.export.save(torch.export.export(model, example_inputs), 'model.pt2')."
            ) from None
        raise _not_a_module(path, obj)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except (ModuleNotFoundError, AttributeError) as e:
        raise FrontendError(
            f"model file {path!r} is a pickled module whose class cannot be imported here ({e}). Make the "
            f"module defining the model importable (PYTHONPATH), or save it with torch.export.save instead."
        ) from e
    except Exception as e:
        raise FrontendError(
            f"model file {path!r} could not be unpickled ({type(e).__name__}: {_first_line(e)}); it may be "
            f"corrupt. Expected {ACCEPTED_FORMATS}."
        ) from e
    if not isinstance(obj, torch.nn.Module):
        raise _not_a_module(path, obj)
    inputs = _resolve_inputs(example_inputs, input_shapes, what=f"pickled module {path!r}")
    return _export(obj, inputs, what=f"the module in {path!r}")


def _not_a_module(path, obj) -> FrontendError:
    if isinstance(obj, dict):
        return FrontendError(
            f"model file {path!r} holds a state dict (weights only, no architecture), which cannot be "
            f"compiled on its own. Build the model, load_state_dict, then torch.export.save it."
        )
    return FrontendError(
        f"model file {path!r} holds a pickled {type(obj).__name__}, not an nn.Module. Expected "
        f"{ACCEPTED_FORMATS}."
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
