"""Host code: host regions compiled to native code through MLIR's LLVM lowering.

Whatever the device cannot run stays in ``spyre.host`` regions of linalg, tensor, arith, math, scf and
tm_tensor ops, on any element type (f64, f16, bf16, complex, every integer width, i1). Each region becomes one
function of a host module, in destination-passing style::

    func.func @host3(%in0: memref<4x8xf64>, ..., %out0: memref<4xf64>, ...) attributes {llvm.emit_c_interface}

and the module is lowered here, at compile time, to the LLVM dialect with upstream passes (bufferization,
loops, LLVM conversion). The binary carries that text; the runtime only JIT-compiles it once at load
(:mod:`spyre_mlir.runtime.hostjit`). Semantics per element type are therefore MLIR's lowering of
torch-mlir's own output: integer wrap-around and division, NaN propagation, bool results, f16/bf16 rounding per
op, exactly as torch-mlir's reference backend computes them.

Constants and ``tensor.empty`` a region reads from above are cloned into its function; every other value it
reads is an argument. A region whose types the host cannot represent (spyre element types or encodings) is
refused with :class:`Unsupported` (the emitter then tries the numpy host interpreter).
"""

from __future__ import annotations

from torch_mlir import ir
from torch_mlir.dialects import func

from spyre_mlir.params import is_resource
from spyre_mlir.runtime.hostprog import Unsupported

__all__ = ["HostModule", "Unsupported", "OPT_LEVEL_ATTR", "numpy_dtype"]

# Upstream passes only, in order: bufferize (functions become memref in/out arguments), lower structured ops
# to loops (TO_LOOPS; there :func:`_opt_level` reads their trip counts), then everything to the LLVM dialect
# with a C interface per function (TO_LLVM).
TO_LOOPS = ",".join([
    "func.func(convert-elementwise-to-linalg)",          # arith/math on whole tensors -> linalg.generic
    "func.func(refback-generalize-tensor-pad)",          # tensor.pad -> fill + insert_slice
    "func.func(refback-generalize-tensor-concat)",       # tensor.concat -> insert_slices
    "one-shot-bufferize{allow-unknown-ops bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map}",
    "func.func(tm-tensor-bufferize)",                    # sort/topk/scatter/scan (unknown to one-shot)
    "canonicalize",
    "buffer-results-to-out-params{modify-public-functions=true hoist-static-allocs=true}",
    "func.func(buffer-deallocation-pipeline)",          # temporaries are freed: calls do not leak
    "func.func(tm-tensor-to-loops)",
    "func.func(refback-munge-memref-copy)",              # memref.copy needs no runtime library
    "func.func(convert-linalg-to-loops)",
    "func.func(lower-affine)",
])
TO_LLVM = ",".join([
    "convert-scf-to-cf",
    # LLVM's own forms first (integer abs, exp, log, sqrt...): math-to-libm treats every math op it sees as
    # illegal, integer ones included; then libm for erf, tan, atan2... of every width.
    "func.func(convert-math-to-llvm)",
    "convert-math-to-libm",
    "func.func(refback-expand-ops-for-llvm)",
    # bf16 arithmetic as f32 rounded back per op (PyTorch's CPU kernels do the same); its casts as integer ops.
    "func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},arith-expand{include-bf16=true})",
    "func.func(convert-math-to-llvm)",
    "expand-strided-metadata",
    "finalize-memref-to-llvm",
    "lower-affine",
    "convert-bufferization-to-memref",
    "finalize-memref-to-llvm",
    "func.func(convert-arith-to-llvm)",
    "convert-func-to-llvm",
    "convert-cf-to-llvm",
    "convert-complex-to-llvm",
    "reconcile-unrealized-casts",
])

_NUMPY = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16", "i1": "bool", "i8": "int8",
          "ui8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64", "index": "int64",
          "complex<f32>": "complex64", "complex<f64>": "complex128"}
_FREE = ("arith.constant", "tensor.empty")


def numpy_dtype(t: ir.Type) -> str:
    """The numpy dtype name of a tensor type's elements on the host; Unsupported for anything else."""
    if not isinstance(t, ir.RankedTensorType):
        raise Unsupported(f"a host function argument of type {t} (host arguments are ranked tensors)")
    rt = ir.RankedTensorType(t)
    if rt.encoding is not None:
        raise Unsupported(f"tensor type {t} with an encoding")
    e = str(rt.element_type)
    if e not in _NUMPY:
        raise Unsupported(f"element type {e} on the host")
    return _NUMPY[e]


# Dialects the lowering takes to LLVM; spyre ops (a device op placed on the host) go to the numpy interpreter.
_LOWERABLE = ("linalg.", "tensor.", "arith.", "math.", "scf.", "tm_tensor.", "complex.", "cf.", "bufferization.")


def _builtin_types_only(op: ir.Operation) -> None:
    bad = []

    def visit(o):
        if not o.name.startswith(_LOWERABLE):
            bad.append(f"op {o.name}")
            return ir.WalkResult.INTERRUPT
        for v in list(o.operands) + list(o.results):
            s = str(v.type)
            if "!spyre" in s or "#spyre" in s:
                bad.append(s)
        return ir.WalkResult.INTERRUPT if bad else ir.WalkResult.ADVANCE

    op.walk(visit)
    if bad:
        raise Unsupported(f"{bad[0]} in host code")


class HostModule:
    """The host functions of one program, built in the emitted module's context."""

    def __init__(self, context: ir.Context):
        self.context = context
        with context, ir.Location.unknown():
            self.module = ir.Module.create()
        self.count = 0

    def add(self, ops: list, reads: list, outs: list, loc: ir.Location,
            aliases: dict | None = None) -> tuple[str, list, list, list]:
        """Add a function computing ``outs`` from ``reads`` with ``ops`` (in order). ``aliases``: values the ops
        read that are other values they compute (a host op's result, read by a later host op of the same round
        trip, is the value its body yields). Returns (its name, the read values that are its arguments, argument
        dtypes, result dtypes)."""
        args = [v for v in reads if not _free(v)]
        in_dtypes = [numpy_dtype(v.type) for v in args]
        out_dtypes = [numpy_dtype(v.type) for v in outs]
        for op in ops:
            _builtin_types_only(op.operation)
        name = f"host{self.count}"
        with self.context, loc:
            ftype = ir.FunctionType.get([v.type for v in args], [v.type for v in outs])
            with ir.InsertionPoint(self.module.body):
                f = func.FuncOp(name, ftype)
            f.operation.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            entry = f.add_entry_block()
            mapping = dict(zip(args, entry.arguments))
            with ir.InsertionPoint(entry):
                for v in reads:
                    if _free(v):
                        _clone(v.owner.operation, mapping)
                for op in ops:
                    _clone(op.operation, mapping)
                    for alias, v in (aliases or {}).items():
                        if v in mapping and alias not in mapping:
                            mapping[alias] = mapping[v]
                func.ReturnOp([mapping[v] for v in outs])
        self.count += 1
        return name, args, in_dtypes, out_dtypes

    def lower(self) -> str:
        """The host module lowered to the LLVM dialect, as text ('' when there are no host functions)."""
        if not self.count:
            return ""
        from torch_mlir._mlir_libs import _torchMlir  # noqa: F401  (registers torch-mlir's passes)
        from torch_mlir.passmanager import PassManager

        _safe_integer_division(self.module.operation)
        _recoverable_asserts(self.module)
        if "bf16" in str(self.module):
            _provide_bf16_truncation(self.module)
        with self.context:
            try:
                PassManager.parse(f"builtin.module({TO_LOOPS})").run(self.module.operation)
                level = _opt_level(self.module.operation)
                PassManager.parse(f"builtin.module({TO_LLVM})").run(self.module.operation)
            except ir.MLIRError as e:
                raise Unsupported(f"lowering host code to LLVM failed: {_first(e)}") from None
            self.module.operation.attributes[OPT_LEVEL_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                                 level)
        return self.module.operation.get_asm(large_elements_limit=None)


OPT_LEVEL_ATTR = "spyre.opt_level"
# Operations a call may run (each op once per trip of the loops around it) up to which the runtime's JIT
# compiles the host code without LLVM's optimizations: ~0.08 s instead of ~0.3 s for generate's two mask
# functions, and at most ~1 ms more a call (O0 code runs a few times slower).
FAST_COMPILE_WORK = 1 << 18


def _opt_level(module: ir.Operation) -> int:
    """The LLVM optimization level the host code is worth: 0 when every function runs at most
    ``FAST_COMPILE_WORK`` operations a call, counted over its loops (constant trip counts), else 2 (a loop
    with bounds known only at run time counts as unbounded)."""
    def work(block, trips: int) -> int:
        total = 0
        for op in block.operations:
            op = op.operation
            total += trips
            inner = trips
            if op.name == "scf.for":
                n = _trip_count(op)
                inner = trips * n if n is not None else FAST_COMPILE_WORK + 1
            elif op.name in ("scf.while", "scf.parallel", "scf.forall"):
                inner = FAST_COMPILE_WORK + 1
            total += sum(work(b, inner) for region in op.regions for b in region.blocks)
        return total

    most = max((work(b, 1) for f in module.regions[0].blocks[0].operations
                for region in f.operation.regions for b in region.blocks), default=0)
    return 0 if most <= FAST_COMPILE_WORK else 2


def _trip_count(loop: ir.Operation) -> int | None:
    """An ``scf.for``'s trips when its bounds and step are constants, else None."""
    vals = []
    for v in list(loop.operands)[:3]:
        owner = v.owner
        if not isinstance(owner, ir.OpView) or owner.operation.name != "arith.constant":
            return None
        vals.append(ir.IntegerAttr(owner.operation.attributes["value"]).value)
    lb, ub, step = vals
    return max(0, -(-(ub - lb) // step)) if step > 0 else None


_INT_DIV = ("arith.divsi", "arith.divui", "arith.remsi", "arith.remui", "arith.floordivsi", "arith.ceildivsi")


def _safe_integer_division(module: ir.Operation) -> None:
    """Integer division by zero is undefined in LLVM (a SIGFPE on x86, killing the process): divide by 1
    instead. PyTorch raises for it eagerly; index arithmetic over empty dims divides by zero-sized dims."""
    from torch_mlir.dialects import arith

    todo = []
    module.walk(lambda o: (todo.append(o) if o.name in _INT_DIV else None) or ir.WalkResult.ADVANCE)
    for op in todo:
        b = op.operands[1]
        if not (isinstance(b.type, ir.IntegerType) or isinstance(b.type, ir.IndexType)):
            continue
        with ir.InsertionPoint(op), op.location:
            zero = arith.ConstantOp(b.type, 0).result
            one = arith.ConstantOp(b.type, 1).result
            is_zero = arith.CmpIOp(arith.CmpIPredicate.eq, b, zero).result
            op.operands[1] = arith.SelectOp(is_zero, one, b).result


ASSERT_FN = "spyre_host_assert"
ASSERTS_ATTR = "spyre.asserts"


def _recoverable_asserts(module: ir.Module) -> None:
    """``cf.assert`` lowers to ``abort()``, which would end the caller's process. Each becomes a call of the
    runtime's ``spyre_host_assert(id)`` when its condition fails (the runtime raises an error naming the
    message after the call); the messages, with their source locations, are the module's ``spyre.asserts``."""
    from torch_mlir.dialects import arith, scf

    todo = []
    module.operation.walk(lambda o: (todo.append(o) if o.name == "cf.assert" else None) or ir.WalkResult.ADVANCE)
    if not todo:
        return
    messages = []
    with module.context, ir.Location.unknown():
        i64 = ir.IntegerType.get_signless(64)
        with ir.InsertionPoint(module.body):
            decl = func.FuncOp(ASSERT_FN, ir.FunctionType.get([i64], []), visibility="private")
        decl.operation.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        for op in todo:
            msg = ir.StringAttr(op.attributes["msg"]).value if "msg" in op.attributes else "assertion failed"
            loc = str(op.location)
            messages.append(f"{msg} ({loc[4:-1] if loc.startswith('loc(') else loc})")
            with ir.InsertionPoint(op), op.location:
                true = arith.ConstantOp(ir.IntegerType.get_signless(1), 1).result
                failed = arith.XOrIOp(op.operands[0], true).result
                branch = scf.IfOp(failed)
                with ir.InsertionPoint(branch.then_block):
                    func.CallOp([], ir.FlatSymbolRefAttr.get(ASSERT_FN),
                                [arith.ConstantOp(i64, len(messages) - 1).result])
                    scf.YieldOp([])
            op.erase()
        module.operation.attributes[ASSERTS_ATTR] = ir.ArrayAttr.get([ir.StringAttr.get(m) for m in messages])


# x86 code generation stores bf16 through f32 and calls compiler-rt's __truncsfbf2, which this process does not
# have (no compiler-rt; libgcc before GCC 13 lacks it): the module defines it, round to nearest even, NaN quiet.
_TRUNCSFBF2 = """
func.func @__truncsfbf2(%x: f32) -> bf16 {
  %b = arith.bitcast %x : f32 to i32
  %c16 = arith.constant 16 : i32
  %c1 = arith.constant 1 : i32
  %bias = arith.constant 32767 : i32
  %hi = arith.shrui %b, %c16 : i32
  %lsb = arith.andi %hi, %c1 : i32
  %r0 = arith.addi %b, %bias : i32
  %r1 = arith.addi %r0, %lsb : i32
  %r = arith.shrui %r1, %c16 : i32
  %nan = arith.cmpf uno, %x, %x : f32
  %qnan = arith.constant 32704 : i32
  %q = arith.ori %hi, %qnan : i32
  %v = arith.select %nan, %q, %r : i32
  %t = arith.trunci %v : i32 to i16
  %y = arith.bitcast %t : i16 to bf16
  return %y : bf16
}
"""


def _provide_bf16_truncation(module: ir.Module) -> None:
    with module.context:
        src = ir.Module.parse(_TRUNCSFBF2)
        for op in src.body.operations:
            op.operation.clone(ir.InsertionPoint(module.body))


def _free(v: ir.Value) -> bool:
    """A value the host function computes itself (cloned in): an empty tensor or an inline literal. A
    ``dense_resource`` constant (a weight or a value spyre-fold-constants computed) is an argument instead: its
    bytes are the binary's constant, and LLVM's lowering cannot read a resource's elements."""
    owner = v.owner
    if isinstance(owner, ir.Block) or owner.operation.name not in _FREE:
        return False
    op = owner.operation
    return not ("value" in op.attributes and is_resource(op.attributes["value"]))


def _clone(op: ir.Operation, mapping: dict) -> None:
    """Clone ``op`` at the current insertion point, its operands (and values its regions read from above)
    replaced through ``mapping``; its results join the mapping."""
    new = op.clone()

    def remap(o):
        for i, v in enumerate(o.operands):
            w = mapping.get(v)
            if w is not None:
                o.operands[i] = w
        return ir.WalkResult.ADVANCE

    new.walk(remap)
    for old, r in zip(op.results, new.results):
        mapping[old] = r


def _first(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " | ".join(lines[:4])[:400]
