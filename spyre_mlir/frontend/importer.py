"""Import an ExportedProgram to MLIR: torch dialect (backend form), then linalg-on-tensors.

Parameters as arguments
-----------------------
Torch-MLIR's ``import_frozen_program`` inlines every parameter and buffer as a ``dense_resource`` literal
(slow to build, memory-hungry, and its bytes cannot be read back from Python), and it fails on buffers that
are not in the state dict (non-persistent buffers such as rotary ``inv_freq``). So this importer rebuilds
the program's graph with every parameter, buffer (persistent or not) and large lifted constant as a
*trailing argument* of ``@main``, each marked ``{spyre.param = "<fully qualified name>"}``, and hands the
tensors over separately as zero-copy numpy views in :attr:`ImportedModel.params`. The IR stays small and
readable, weights never get copied through MLIR attributes, and later stages (placement, precision,
emission) find each weight by name. Small lifted constants (at most ``INLINE_CONSTANT_MAX_ELEMENTS``
elements) stay in the IR as plain dense literals.

Pipelines are those of ``torch_mlir.fx.export_and_import`` with ``output_type="linalg-on-tensors"``:
``torchdynamo-export-to-torch-backend-pipeline`` (torch stage), then
``torch-backend-to-linalg-on-tensors-backend-pipeline`` (linalg stage).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import torch
from torch.export.graph_signature import (
    ConstantArgument,
    InputKind,
    OutputKind,
    TensorArgument,
)

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_MLIR_TYPE, FxImporter, FxImporterHooks
from torch_mlir.passmanager import PassManager

from .errors import ExportError, FrontendError, StageError, mlir_error_detail

# Lifted tensor constants with at most this many elements stay in the IR as dense literals; larger ones
# become parameters like weights.
INLINE_CONSTANT_MAX_ELEMENTS = 64

PARAM_ATTR = "spyre.param"
DTYPE_ATTR = "spyre.dtype"
UNSIGNED = ("uint8",)

TORCH_PIPELINE = (
    "builtin.module(func.func(torch-match-quantized-custom-ops), "
    "torchdynamo-export-to-torch-backend-pipeline{ extra-library=})"
)
LINALG_PIPELINE = (
    "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline{allow-non-finites=true})"
)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and torch dtype name (``"float32"``, ``"int64"``...) of an input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """An in-place update ``forward`` makes, turned into data flow (as torch.compile does): ``kind`` "buffer" (a
    module buffer, by its path ``target``, which is also an input of that name after the user inputs) or "input"
    (the user input named ``target``); its new value is output number ``output``. Callers write it back."""

    kind: str
    target: str
    output: int


@dataclasses.dataclass
class ImportedModel:
    """A model imported to MLIR, with its weights kept outside the IR.

    ``@main``'s arguments are ``inputs`` in order (user inputs, then buffers the program updates in place), then
    one argument per entry of ``params`` (same order), carrying ``{spyre.param = "<name>"}``. Its results are
    the user outputs, then the updated values listed in ``state``. ``linalg_ir`` is None when import stopped at the torch stage.
    """

    torch_ir: str
    linalg_ir: str | None
    params: dict[str, np.ndarray]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    adapters: list[str] = dataclasses.field(default_factory=list)
    # In-place updates the program makes (buffers and user inputs), returned as extra outputs.
    state: list["StateSpec"] = dataclasses.field(default_factory=list)

    @property
    def param_names(self) -> list[str]:
        return list(self.params)


def import_model(
    model_or_path: Any,
    example_inputs: Sequence[torch.Tensor] | None = None,
    input_shapes: Sequence[str | tuple] | None = None,
    trust_pickle: bool = False,
    *,
    stage: str = "linalg",
) -> ImportedModel:
    """Load (see :func:`load_program`), adapt, and import a model to torch and linalg IR.

    ``stage="torch"`` stops after the torch backend pipeline (``linalg_ir`` is then None).
    """
    from .load import load_program

    ep = load_program(model_or_path, example_inputs, input_shapes, trust_pickle)
    imported = import_program(ep)
    if stage == "linalg":
        imported.linalg_ir = lower_to_linalg(imported.torch_ir)
    elif stage != "torch":
        raise ValueError(f"stage must be 'torch' or 'linalg', not {stage!r}")
    return imported


def import_program(ep: torch.export.ExportedProgram) -> ImportedModel:
    """Adapt and decompose ``ep``, import it with parameters as arguments, run the torch backend pipeline."""
    from .adapters import adapt

    try:
        ep, applied = adapt(ep)
    except Exception as e:
        raise StageError(f"decomposing the exported program failed: {type(e).__name__}: {_first_line(e)}") from e
    _check_static_shapes(ep)
    graph, params, inputs, outputs, state = _parameters_as_arguments(ep)

    context = ir.Context()
    torch_d.register_dialect(context)
    importer = FxImporter(context=context, hooks=_DenseLiteralHooks())
    try:
        func_op = importer.import_stateless_graph(graph, func_name="main")
    except Exception as e:
        raise StageError(f"Torch-MLIR's FX importer failed: {type(e).__name__}: {_first_line(e)}") from e
    _mark_params(func_op, inputs, list(params), outputs, context)
    module = importer.module
    run_pipeline(module, TORCH_PIPELINE, "torch")
    return ImportedModel(
        torch_ir=_asm(module), linalg_ir=None, params=params, inputs=inputs, outputs=outputs, adapters=applied,
        state=state,
    )


def lower_to_linalg(torch_ir: str) -> str:
    """Run the upstream torch -> linalg-on-tensors pipeline on torch backend IR text, in the lowering helper
    process (:mod:`.lowering`): Torch-MLIR's lowering crashes on some programs, and that must be an error."""
    from .lowering import lower

    return lower(torch_ir, LINALG_PIPELINE)


def run_pipeline(module, pipeline: str, stage: str) -> None:
    """Run a textual pass pipeline in place; on failure raise StageError with the diagnostics and input IR."""
    input_ir = _asm(module)
    errors: list[str] = []

    def collect(diagnostic) -> bool:
        # Keep errors for the message instead of letting MLIR print them to stderr.
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            errors.append(f"{diagnostic.location}: {diagnostic.message}")
        return True

    context = module.context
    handler = context.attach_diagnostic_handler(collect)
    try:
        with context:
            PassManager.parse(pipeline).run(module.operation)
    except ir.MLIRError as e:
        # The pass manager puts its diagnostics in the exception; `errors` catches any emitted outside it.
        detail = mlir_error_detail(str(e)) if not errors else "\n".join(errors[:5])
        raise StageError(f"the {stage} stage failed: {detail}", input_ir=input_ir, pipeline=pipeline) from None
    finally:
        handler.detach()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _asm(module) -> str:
    # Locations are the model's source lines (the FX importer's); later stages and the binary keep them.
    return module.operation.get_asm(large_elements_limit=None, enable_debug_info=True)


def _parameters_as_arguments(ep: torch.export.ExportedProgram):
    """Copy ``ep``'s graph with user inputs first and parameters/buffers/large constants as trailing
    placeholders (unused ones dropped). Returns (graph, params as numpy views, input specs, output specs)."""
    sig = ep.graph_signature
    old_placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    mutated_buffers = {spec.target for spec in sig.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    for spec in sig.output_specs:
        if spec.kind == OutputKind.TOKEN:
            raise StageError("the program threads effect tokens (side-effecting ops such as linalg's error checks "
                             "or prints), which Torch-MLIR's FX importer does not take")
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            raise FrontendError(f"unsupported program output {spec.kind.name} {spec.target!r}")

    graph = torch.fx.Graph()
    val_map: dict[torch.fx.Node, Any] = {}
    inputs: list[TensorSpec] = []
    trailing: list[tuple[torch.fx.Node, str, torch.Tensor]] = []
    state_inputs: list[tuple[torch.fx.Node, str]] = []
    for spec in sig.input_specs:
        node = old_placeholders.get(spec.arg.name) if hasattr(spec.arg, "name") else None
        if spec.kind == InputKind.USER_INPUT:
            if isinstance(spec.arg, ConstantArgument):
                if node is not None:
                    val_map[node] = spec.arg.value
                continue
            if not isinstance(spec.arg, TensorArgument):
                raise FrontendError(
                    f"input {spec.arg.name!r} is a symbolic size ({type(spec.arg).__name__}); the Spyre "
                    f"compiler needs static shapes: export without dynamic_shapes."
                )
            val = node.meta["val"]
            if not all(isinstance(d, int) for d in val.shape):
                raise FrontendError(
                    f"input {node.name!r} has dynamic shape {tuple(val.shape)}; the Spyre compiler needs static "
                    f"shapes: export without dynamic_shapes (or give concrete --input-shape values)."
                )
            new = graph.placeholder(node.name)
            new.meta = dict(node.meta)
            val_map[node] = new
            inputs.append(_spec(node.name, val))
        elif spec.kind == InputKind.BUFFER and spec.target in mutated_buffers:
            state_inputs.append((node, spec.target))   # state: an input, since each call changes it
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            if spec.target in ep.state_dict:
                value = ep.state_dict[spec.target]
            else:  # non-persistent buffers live in ep.constants, not in the state dict
                value = ep.constants[spec.target]
            trailing.append((node, spec.target, value))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants[spec.target]
            if value.numel() <= INLINE_CONSTANT_MAX_ELEMENTS:
                val_map[node] = value.detach()
            else:
                trailing.append((node, spec.target, value))
        else:
            raise FrontendError(f"unsupported program input {spec.kind.name} {spec.target!r}")
    # Mutated buffers follow the user inputs, named by their module path.
    for node, target in state_inputs:
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        val_map[node] = new
        inputs.append(_spec(target, node.meta["val"]))

    params: dict[str, np.ndarray] = {}
    for node, name, value in trailing:
        if not node.users:  # e.g. batch norm's num_batches_tracked in eval mode: nothing to ship
            val_map[node] = None  # mapped, so graph_copy skips it
            continue
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        val_map[node] = new
        params[name] = _numpy_view(value)

    # graph_copy skips nodes already in val_map; the remaining placeholders are all mapped above.
    out = graph.graph_copy(ep.graph, val_map, return_output_node=True)
    copied = list(out[0] if isinstance(out, tuple) else out)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    originals = list(out_node.args[0])
    # User outputs first, then the new value of every mutated buffer and user input (state outputs).
    user = [i for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    mutations = [i for i, s in enumerate(sig.output_specs) if s.kind != OutputKind.USER_OUTPUT]
    graph.output(tuple(copied[i] for i in user + mutations))

    outputs, state = [], []
    for k, i in enumerate(user):
        val = originals[i].meta.get("val") if isinstance(originals[i], torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            outputs.append(_spec(f"output_{k}", val))
    for i in mutations:
        spec = sig.output_specs[i]
        kind = "buffer" if spec.kind == OutputKind.BUFFER_MUTATION else "input"
        outputs.append(_spec(f"{spec.target}.updated", originals[i].meta["val"]))
        state.append(StateSpec(kind, spec.target, len(outputs) - 1))
    return graph, params, inputs, outputs, state


def _spec(name: str, val: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(int(d) for d in val.shape), _dtype_name(val.dtype))


def _check_static_shapes(ep: torch.export.ExportedProgram) -> None:
    """Refuse data-dependent shapes (boolean masking, nonzero, unique) anywhere in the program, naming the op
    and its source line: the Spyre compiler plans static shapes (and Torch-MLIR's lowering does not finish on
    some of them)."""
    for node in ep.graph.nodes:
        vals = node.meta.get("val")
        vals = vals if isinstance(vals, (list, tuple)) else [vals]
        for v in vals:
            if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape):
                trace = (node.meta.get("stack_trace") or "").strip().splitlines()
                where = f" at {trace[-2].strip()}" if len(trace) >= 2 else ""
                raise ExportError(f"{node.target} gives a data-dependent shape {tuple(v.shape)}{where}; the Spyre "
                                  f"compiler needs static shapes (under torch.compile the spyre backend runs such "
                                  f"graphs eagerly).")


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array sharing ``t``'s memory (bfloat16 via ml_dtypes, which numpy lacks)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mark_params(func_op, inputs: list[TensorSpec], names: list[str], outputs: list[TensorSpec], context) -> None:
    """Attach ``spyre.param = "<name>"`` to the trailing arguments of ``@main``, and ``spyre.dtype = "uint8"`` to
    the inputs and results whose signedness linalg's signless i8 loses."""
    def io(spec):
        return {DTYPE_ATTR: ir.StringAttr.get(spec.dtype)} if spec.dtype in UNSIGNED else {}

    with context:
        attrs = [ir.DictAttr.get(io(spec)) for spec in inputs]
        attrs += [ir.DictAttr.get({PARAM_ATTR: ir.StringAttr.get(name)}) for name in names]
        func_op.arg_attrs = ir.ArrayAttr.get(attrs)
        if any(spec.dtype in UNSIGNED for spec in outputs):
            func_op.result_attrs = ir.ArrayAttr.get([ir.DictAttr.get(io(spec)) for spec in outputs])


class _DenseLiteralHooks(FxImporterHooks):
    """FX importer hooks: tensor literals become plain ``DenseElementsAttr`` (readable from Python), never
    ``dense_resource``. Only small constants reach this hook: weights are arguments."""

    def resolve_literal(self, gni, literal, info):
        if not isinstance(literal, torch.Tensor):
            return None
        array = np.require(_numpy_view(literal), requirements="C")  # keeps 0-d arrays 0-d
        element_type = TORCH_DTYPE_TO_MLIR_TYPE[literal.dtype]()
        attr = ir.DenseElementsAttr.get(array, type=element_type, shape=list(array.shape))
        vtensor_type = gni._cc.tensor_to_vtensor_type(literal)
        return ir.Operation.create("torch.vtensor.literal", results=[vtensor_type], attributes={"value": attr}).result
