// The compiler's stages by hand, as spyre-compile runs them (spyre_mlir/pipeline.py): linalg -> graph -> kernel
// -> program. Each stage's pipeline is plain spyre-opt input.
// RUN: spyre-opt %s -p 'builtin.module(canonicalize,spyre-convert-linalg,canonicalize,cse,spyre-place-host)' > %t.graph.mlir
// RUN: filecheck %s --check-prefix=GRAPH < %t.graph.mlir
// RUN: spyre-opt %t.graph.mlir -p 'builtin.module(spyre-reduce-precision{precision=dlf16},spyre-columns-to-matmul,spyre-layout,spyre-fuse,spyre-select-kernels,spyre-siblings,spyre-divide-work{cores=4},spyre-tile,spyre-chain-matmuls,spyre-allocate-scratchpad,spyre-schedule)' > %t.kernel.mlir
// RUN: filecheck %s --check-prefix=KERNEL < %t.kernel.mlir
// RUN: spyre-opt %t.kernel.mlir -p 'builtin.module(spyre-emit{listing=-})' | filecheck %s --check-prefix=PROGRAM

// GRAPH-LABEL: func.func @main
// GRAPH: "spyre.matmul"
// GRAPH: "spyre.map"
// GRAPH: arith.maximumf
// GRAPH-NOT: linalg.

// The module records the machine it was divided for: spyre-emit needs no options.
// KERNEL: module attributes {spyre.cores = 4 : i64, spyre.precision = "dlf16", spyre.scratchpad_peak = {{[0-9]+}} : i64}
// The f32 inputs' casts fuse into the matmul's loads (spyre-fuse).
// KERNEL-NOT: "spyre.cast"(%arg0)
// KERNEL: "spyre.matmul"(%arg0, %arg1)
// KERNEL-SAME: acc_type = f32
// KERNEL-SAME: spyre.convert_operands = {lhs = !spyre.dlf16, rhs = !spyre.dlf16}
// KERNEL-SAME: spyre.grid = array<i64:
// KERNEL-SAME: spyre.scratchpad = {
// KERNEL-SAME: spyre.tile = array<i64:
// The ReLU is the matmul's only reader: its kernel applies it before the stores (no plan of its own).
// KERNEL: "spyre.map"
// KERNEL: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>
// KERNEL-SAME: spyre.kernel = "epilogue", spyre.scratchpad = {}

// PROGRAM: // program: 4 core(s)
// PROGRAM: core 0:
// PROGRAM: dma_load
// PROGRAM: matmul
// PROGRAM: sfu
// PROGRAM: dma_store
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<64x128xf32>, %w: tensor<128x256xf32>) -> tensor<64x256xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x256xf32>) -> tensor<64x256xf32>
  %m = linalg.matmul ins(%x, %w : tensor<64x128xf32>, tensor<128x256xf32>) outs(%f : tensor<64x256xf32>) -> tensor<64x256xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%m : tensor<64x256xf32>) outs(%e : tensor<64x256xf32>) {
  ^bb0(%a: f32, %o: f32):
    %y = arith.maximumf %a, %zero : f32
    linalg.yield %y : f32
  } -> tensor<64x256xf32>
  return %r : tensor<64x256xf32>
}
