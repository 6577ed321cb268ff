# The Python API of the spyre dialect: loading, building ops, verifier messages, OpView casts.
# RUN: %PYTHON %s | filecheck %s

from torch_mlir import ir
from torch_mlir.dialects import arith, func

from spyre_mlir.context import make_context
from spyre_mlir.dialects import spyre


def run(f):
    print(f"\nTEST: {f.__name__}")
    with make_context() as ctx, ir.Location.unknown():
        f(ctx)
    return f


# CHECK-LABEL: TEST: load_is_idempotent
# CHECK: loaded: True
@run
def load_is_idempotent(ctx):
    spyre.load(ctx)
    spyre.load(ctx)
    print("loaded:", ctx.is_dialect_loaded("spyre"))


# CHECK-LABEL: TEST: build_matmul_and_map
# CHECK: "spyre.matmul"(%arg0, %arg1, %arg2)
# CHECK: "spyre.map"
# CHECK: math.tanh
# CHECK: verifies: True
@run
def build_matmul_and_map(ctx):
    f32 = ir.F32Type.get()
    a, b = ir.RankedTensorType.get([4, 8], f32), ir.RankedTensorType.get([8, 16], f32)
    bias, out = ir.RankedTensorType.get([16], f32), ir.RankedTensorType.get([4, 16], f32)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        @func.FuncOp.from_py_func(a, b, bias)
        def fused(x, w, c):
            mm = spyre.MatmulOp(x, w, out, bias=c)
            m = spyre.MapOp(out, in0=mm.result)
            block = m.body.blocks.append(f32)
            with ir.InsertionPoint(block):
                from torch_mlir.dialects import math
                spyre.YieldOp(math.tanh(block.arguments[0]))
            return m.result
    print(module)
    print("verifies:", module.operation.verify())


# CHECK-LABEL: TEST: casts_and_types
# CHECK: MatmulOp
# CHECK: !spyre.dlf16 True
# CHECK: #spyre.stick<1 : i64>
@run
def casts_and_types(ctx):
    m = ir.Module.parse("""
      func.func @f(%a: tensor<4x8x!spyre.dlf16>, %b: tensor<8x4x!spyre.dlf16>) -> tensor<4x4xf32> {
        %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>}
            : (tensor<4x8x!spyre.dlf16>, tensor<8x4x!spyre.dlf16>) -> tensor<4x4xf32>
        return %r : tensor<4x4xf32>
      }""")
    op = m.body.operations[0].regions[0].blocks[0].operations[0]
    print(type(op).__name__)
    t = spyre.dlf16()
    print(t, spyre.is_dlf16(t))
    print(spyre.stick(1))


# CHECK-LABEL: TEST: verifier_message
# CHECK: 'spyre.concat' op inputs sum to 48 along dim 1, result has 40
@run
def verifier_message(ctx):
    try:
        ir.Module.parse("""
          func.func @f(%a: tensor<8x32xf32>, %b: tensor<8x16xf32>) {
            %r = "spyre.concat"(%a, %b) {dim = 1 : i64} : (tensor<8x32xf32>, tensor<8x16xf32>) -> tensor<8x40xf32>
            return
          }""")
    except ir.MLIRError as e:
        print(e.error_diagnostics[0].message)
