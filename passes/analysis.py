"""The IR analyses spyre passes share, and the names of the attributes they write and read.

Which ops are device ops, where a value comes from, which values are parameters, the function bodies to walk,
and reading the attributes an earlier pass wrote. A pass imports what it shares from here (and the kernel-level
op model from `op_model`), never from another pass.
"""

from __future__ import annotations

import math

from torch_mlir import ir

from spyre_mlir.passes.base import PassError
from spyre_mlir.target import Target, TargetError, load_target

# ---- Attribute names -------------------------------------------------------------------------------------------

PARAM_ATTR = "spyre.param"                    # a function argument that is a parameter (the frontend)
UNCONVERTED_ATTR = "spyre.unconverted"        # why spyre-convert-linalg left an op (read by spyre-place-host)
CONVERT_OPERANDS = "spyre.convert_operands"   # spyre-fuse: matmul operand formats converted on the scratchpad
CONVERT_RESULT = "spyre.convert_result"       # spyre-fuse: the format a matmul result is rounded to, then widened
CORES = "spyre.cores"                         # module: the core count (spyre-divide-work)
TARGET = "spyre.target"                       # module: the target file (spyre-divide-work with target=PATH)
GRID = "spyre.grid"                           # spyre-divide-work: cores per iteration dimension
TILE = "spyre.tile"                           # spyre-tile: per-core tile sizes
RESIDENT = "spyre.resident_a"                 # spyre-tile: a matmul keeps A parts across a row of tiles
SCRATCHPAD = "spyre.scratchpad"               # spyre-allocate-scratchpad: buffer offsets
SCRATCHPAD_BYTES = "spyre.scratchpad_bytes"   # spyre-allocate-scratchpad: the op's peak
SCRATCHPAD_PEAK = "spyre.scratchpad_peak"     # spyre-allocate-scratchpad: the module's peak
DOUBLE_BUFFER = "spyre.double_buffer"         # spyre-schedule
CONST_FOLD = "spyre.const_fold"               # spyre-select-kernels: computed while compiling
KERNEL = "spyre.kernel"                       # spyre-select-kernels: the device kernel that runs the op
ON_HOST = "spyre.on_host"                     # spyre-select-kernels: why no device kernel runs the op
ROUND_TRIP = "spyre.round_trip"               # spyre-round-trips: host work that runs in one call to the host
BARRIER = "spyre.barrier"                     # spyre-schedule
PREFETCH = "spyre.prefetch"                   # spyre-prefetch: buffers loaded during an earlier kernel
PREFETCH_DISTANCE = "spyre.prefetch_distance"  # spyre-prefetch: which one (1: the kernel just before)
RING_INPUT = "spyre.ring_input"               # spyre-chain-convs: a conv's input patches arrive over the ring
SHARE_OF = "spyre.share_of"                   # spyre-partition-cards: (B, N) of the matmul a card's share is of

# ---- Device ops ------------------------------------------------------------------------------------------------

# Spyre ops that are not device work: a host region, the terminator of a map or host body, and the link
# transfers of a multi-card system's schedule.
NOT_DEVICE = ("spyre.host", "spyre.yield", "spyre.all_gather")
MATMULS = ("spyre.matmul", "spyre.batch_matmul")
NORMS = ("spyre.rmsnorm", "spyre.layernorm")


def is_device_op(op) -> bool:
    """A spyre op other than host/yield that is not nested in a spyre.host."""
    op = op.operation
    return op.name.startswith("spyre.") and op.name not in NOT_DEVICE and host_region_of(op) is None


def host_region_of(op: ir.Operation) -> ir.Operation | None:
    """The outermost `spyre.host` op ``op`` is nested in (or is), else None."""
    outer = None
    while op is not None and op.name != "func.func":
        if op.name == "spyre.host":
            outer = op
        op = op.parent
    return outer


def upstream_host(host: ir.Operation) -> bool:
    """A `spyre.host` region of upstream ops only (linalg, tensor, arith, math...): no spyre op but its yield. One
    holding a spyre op (an f64 map the device cannot run) is host code the emitter runs by another path."""
    def walk(block) -> bool:
        return all(not (o.operation.name.startswith("spyre.") and o.operation.name != "spyre.yield")
                   and all(walk(b) for r in o.operation.regions for b in r.blocks)
                   for o in block.operations)
    return all(walk(b) for b in host.regions[0].blocks)


def device_ops(module: ir.Operation) -> list[ir.Operation]:
    """Device ops in program order: spyre ops other than host/yield, not nested in a spyre.host, not computed
    at compile time (``spyre.const_fold``, see :func:`compile_time`) and not sent to the host for want of a
    kernel (``spyre.on_host``)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation):
        if op.name == "spyre.host":
            return ir.WalkResult.SKIP
        if is_device_op(op):
            if not is_const_fold(op) and ON_HOST not in op.attributes:
                found.append(op)
            return ir.WalkResult.SKIP      # a map body holds scalar ops only
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def is_const_fold(op: ir.Operation) -> bool:
    return CONST_FOLD in op.attributes and ir.BoolAttr(op.attributes[CONST_FOLD]).value


def compile_time(module: ir.Operation) -> tuple[list[ir.Operation], set]:
    """The ops of the functions' bodies computed from values known at compile time alone (a parameter, a
    literal, or the result of such an op), and those values. Spyre ops (casts and quantization of weights, their
    restickifies, a broadcast mask) and host regions (position ids, masks) are listed: spyre-fold-constants
    computes them, so they get no kernel. Literals and ``tensor.empty`` are free and not listed."""
    found: list[ir.Operation] = []
    known: set = set()
    for func in function_ops(module):
        block = func.regions[0].blocks[0]
        known.update(a for a in block.arguments if is_param(a, func))
        for o in block.operations:
            op = o.operation
            if op.name in ("arith.constant", "tensor.empty"):
                known.update(op.results)
            elif (op.name.startswith("spyre.") and op.name != "spyre.yield" and list(op.results)
                  and all(v in known for v in reads(op))):
                known.update(op.results)
                found.append(op)
    return found, known


def reads(op) -> list[ir.Value]:
    """Every value op reads: its operands, then what its regions capture from above (first-use order)."""
    op = op.operation
    inner, seen, captured = set(), set(), []

    def walk(o):
        for r in o.regions:
            for blk in r.blocks:
                inner.update(blk.arguments)
                for x in blk.operations:
                    inner.update(x.operation.results)
                    walk(x.operation)
                for x in blk.operations:
                    for v in x.operation.operands:
                        if v not in inner and v not in seen:
                            seen.add(v)
                            captured.append(v)

    vals = list(op.operands)
    if op.regions:
        walk(op)
        vals += [v for v in captured if v not in inner and v not in vals]
    return vals


# Element types the device holds: floats it computes on (f16/bf16 become DLFloat16), i1 masks, and int64 indices
# (gathers; index math on them is declined by the converters themselves). Anything else (f64, complex, i8,
# i16, i32, unsigned) is declined by spyre-convert-linalg, so no device pass ever sees a type it cannot hold.
DEVICE_ELEMENT_TYPES = ("f32", "f16", "bf16", "i1", "i64")


def non_device_type(op: ir.Operation) -> str:
    """The first element type of op's tensor operands/results the device cannot hold, or ''."""
    for v in list(op.operands) + list(op.results):
        t = v.type
        if isinstance(t, ir.RankedTensorType) or isinstance(t, ir.ShapedType):
            e = str(ir.ShapedType(t).element_type)
            if e not in DEVICE_ELEMENT_TYPES:
                return e
            if 0 in ir.ShapedType(t).shape:
                return "an empty tensor"
    return ""


# ---- Functions and values --------------------------------------------------------------------------------------


def function_ops(module: ir.Operation) -> list[ir.Operation]:
    """The module's func.func ops, in order."""
    funcs: list[ir.Operation] = []

    def visit(op):
        if op.name == "func.func":
            funcs.append(op)
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return funcs


def kernel_ops(module: ir.Operation, kind: str):
    """Each op of the module's functions whose kernel is `kind` when reached (a pass may re-kernel later ones)."""
    for func in function_ops(module):
        for op in func.regions[0].blocks[0].operations:
            op = op.operation
            if KERNEL in op.attributes and ir.StringAttr(op.attributes[KERNEL]).value == kind:
                yield op


def fuse_into_kernel(op: ir.Operation, kind: str) -> None:
    """Mark `op` as computed inside another op's kernel (`kind`): an epilogue's plan, one grid step of its rows."""
    op.attributes[KERNEL] = ir.StringAttr.get(kind)
    op.attributes[GRID] = ir.DenseI64ArrayAttr.get([1])
    op.attributes[TILE] = ir.DenseI64ArrayAttr.get([math.prod(ir.RankedTensorType(op.results[0].type).shape[:-1])])


def producer(v: ir.Value) -> ir.Operation | None:
    """The operation defining `v`, or None for a block argument."""
    return None if isinstance(v.owner, ir.Block) else v.owner.operation


def single_use(v: ir.Value):
    """The one use of `v`, or None when it has none or several."""
    uses = list(v.uses)
    return uses[0] if len(uses) == 1 else None


def user(use) -> ir.Operation:
    """The operation holding a use of a value (the bindings give an OpView or an Operation)."""
    o = use.owner
    return o.operation if isinstance(o, ir.OpView) else o


def clone_mapped(op: ir.Operation, mapping: dict) -> ir.Operation:
    """Clone `op` at the insertion point with the operands `mapping` names replaced; record its results as
    the clone's in `mapping` (for cloning a body op by op)."""
    clone = op.clone()
    for i, operand in enumerate(clone.operands):
        if operand in mapping:
            clone.operands[i] = mapping[operand]
    for old, new in zip(op.results, clone.results):
        mapping[old] = new
    return clone


def is_plain_cast(op: ir.Operation | None) -> bool:
    """A spyre.cast that only converts (no scale operand, no scale_mode)."""
    return op is not None and op.name == "spyre.cast" and len(op.operands) == 1 \
        and "scale_mode" not in op.attributes


def is_param(v: ir.Value, func: ir.Operation) -> bool:
    """`v` is a parameter: a `spyre.param` argument of `func`."""
    if producer(v) is not None:
        return False
    arg = ir.BlockArgument(v)
    if arg.owner != func.regions[0].blocks[0] or "arg_attrs" not in func.attributes:
        return False
    attrs = ir.ArrayAttr(func.attributes["arg_attrs"])
    return arg.arg_number < len(attrs) and PARAM_ATTR in ir.DictAttr(attrs[arg.arg_number])


# Single-operand ops through which a parameter stays a compile-time value.
_CONST_CHAIN = ("spyre.cast", "spyre.reshape", "spyre.transpose")


def is_param_derived(v: ir.Value, func: ir.Operation) -> bool:
    """`v` is a parameter, or computed from one by casts, reshapes and transposes (known at compile time)."""
    op = producer(v)
    while op is not None and op.name in _CONST_CHAIN and len(op.operands) == 1:
        v = op.operands[0]
        op = producer(v)
    return is_param(v, func)


# ---- Attributes of earlier passes ------------------------------------------------------------------------------


def int_array(op: ir.Operation, name: str) -> list[int] | None:
    """The integers of the `array<i64: ...>` attribute `name`, or None when op has none."""
    if name not in op.attributes:
        return None
    return [int(v) for v in ir.DenseI64ArrayAttr(op.attributes[name])]


def require(op: ir.Operation, attr: str, producer: str) -> list[int]:
    """The `array<i64: ...>` attribute `attr` that pass `producer` sets; an error naming that pass without it."""
    v = int_array(op, attr)
    if v is None:
        raise PassError(f"'{op.name}' has no {attr}: run {producer} first", op.location)
    return v


def get_target(path: str, module: ir.Operation) -> Target:
    """The target file at `path` (default: the built-in target); an error at the module when it is invalid."""
    try:
        return load_target(path or None)
    except TargetError as e:
        raise PassError(str(e), module.location) from None
