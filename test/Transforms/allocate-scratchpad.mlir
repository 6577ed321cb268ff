// The cases before the "ERRORS" line allocate; the ones after it fail with a located diagnostic.
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-allocate-scratchpad)' | filecheck %s
// RUN: sed -n -e '/^\/\/ ERRORS/,$p' %s | spyre-opt --split-input-file --verify-diagnostics -p 'builtin.module(spyre-select-kernels,spyre-allocate-scratchpad)'

// Matmul, per core: A [512,64] and B [64,256] dlf16 tiles twice, the fp32 [512,256] accumulator, the dlf16
// output tile; all live through the whole kernel, so nothing shares. The module peak is the largest op's.
// CHECK-LABEL: module attributes {spyre.scratchpad_peak = 983040 : i64}
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.scratchpad = {a0 = 0 : i64, a1 = 65536 : i64, acc = 196608 : i64, b0 = 131072 : i64, b1 = 163840 : i64, out = 720896 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 983040 : i64
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.scratchpad = {a0 = 0 : i64, acc = 16384 : i64, b0 = 8192 : i64, bias = 40960 : i64, out = 32768 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 41216 : i64
func.func @matmuls(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>, %c: tensor<64x64x!spyre.dlf16>, %d: tensor<64x64x!spyre.dlf16>, %bias: tensor<64xf32>) -> (tensor<1024x1024x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 4, 1>, spyre.tile = array<i64: 512, 256, 64>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  // A single tile per core: single buffers only (nothing to prefetch), plus the fp32 bias row.
  %s = "spyre.matmul"(%c, %d, %bias) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 1>, spyre.grid = array<i64: 1, 1, 1>, spyre.tile = array<i64: 64, 64, 64>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>, tensor<64xf32>) -> tensor<64x64x!spyre.dlf16>
  return %r, %s : tensor<1024x1024x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>
}

// -----

// Split-K: the fp32 partial sums meet in `red` on the group's root.
// CHECK-LABEL: func.func @split_k
// CHECK: spyre.scratchpad = {a0 = 0 : i64, a1 = {{[0-9]+}} : i64, acc = {{[0-9]+}} : i64, b0 = {{[0-9]+}} : i64, b1 = {{[0-9]+}} : i64, out = {{[0-9]+}} : i64, red = {{[0-9]+}} : i64}
func.func @split_k(%a: tensor<64x65536x!spyre.dlf16>, %b: tensor<65536x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 1, 16>, spyre.tile = array<i64: 64, 64, 256>} : (tensor<64x65536x!spyre.dlf16>, tensor<65536x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %r : tensor<64x64x!spyre.dlf16>
}

// -----

// Softmax: streamed input and output twice; fp32 temporaries live only in their steps, so the row max
// (steps 2-3) and the row sum (steps 5-7) share bytes.
// CHECK-LABEL: func.func @softmax
// CHECK: "spyre.softmax"
// CHECK-SAME: spyre.scratchpad = {in0 = 0 : i64, in1 = 16384 : i64, max = [[RED:[0-9]+]] : i64, out0 = 32768 : i64, out1 = 49152 : i64, sum = [[RED]] : i64, xf = 65536 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 99328 : i64
func.func @softmax(%x: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 32>, spyre.tile = array<i64: 8>} : (tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %s : tensor<1024x1024x!spyre.dlf16>
}

// -----

// LayerNorm: weight and bias load once; the row mean (steps 2-3) and the squares (steps 4-5) share bytes.
// CHECK-LABEL: func.func @layernorm
// CHECK: spyre.scratchpad = {bias = {{[0-9]+}} : i64, in0 = 0 : i64, in1 = {{[0-9]+}} : i64, mean = [[MEAN:[0-9]+]] : i64, out0 = {{[0-9]+}} : i64, out1 = {{[0-9]+}} : i64, sq = [[MEAN]] : i64, var = {{[0-9]+}} : i64, weight = {{[0-9]+}} : i64, xf = {{[0-9]+}} : i64}
func.func @layernorm(%x: tensor<1024x1024x!spyre.dlf16>, %w: tensor<1024x!spyre.dlf16>, %b: tensor<1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %y = "spyre.layernorm"(%x, %w, %b) {operandSegmentSizes = array<i32: 1, 1, 1>, axis = 1 : i64, epsilon = 1.0e-05 : f32, acc_type = f32, spyre.grid = array<i64: 32>, spyre.tile = array<i64: 8>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x!spyre.dlf16>, tensor<1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %y : tensor<1024x1024x!spyre.dlf16>
}

// -----

// A map with a streamed input, a row-broadcast bias loaded once, and an fp32 tile for its chained body; a
// matmul feeding it with a different grid. 128-byte aligned offsets throughout.
// CHECK-LABEL: module attributes {spyre.scratchpad_peak = 344064 : i64}
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.scratchpad_bytes = 344064 : i64
// CHECK: "spyre.map"
// CHECK: spyre.scratchpad = {in0 = 0 : i64, in1 = 4096 : i64, inb = 8192 : i64, out0 = 8320 : i64, out1 = 12416 : i64, ta = 16512 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 24704 : i64
func.func @matmul_map(%x: tensor<1024x1024x!spyre.dlf16>, %w: tensor<1024x64x!spyre.dlf16>, %bias: tensor<64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 1, 1>, spyre.tile = array<i64: 512, 64, 64>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  %g = "spyre.map"(%r, %bias) ({
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %b : f32
    %t = math.tanh %s : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.grid = array<i64: 16>, spyre.tile = array<i64: 32>} : (tensor<1024x64x!spyre.dlf16>, tensor<64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  return %g : tensor<1024x64x!spyre.dlf16>
}

// -----

// Pool2d: its KW column selections [W, OW] stacked in one `sel` [KW x W, OW] = [16, 4] (2 KiB: one DMA
// loads them), after the gathered input rows `in0`; the fp32 `ct` and `res` and the result `out0`.
// CHECK-LABEL: func.func @pool
// CHECK: "spyre.pool2d"
// CHECK-SAME: spyre.scratchpad = {ct = 3072 : i64, in0 = 0 : i64, out0 = 2560 : i64, res = 3584 : i64, sel = 512 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 4096 : i64
func.func @pool(%x: tensor<1x4x8x8x!spyre.dlf16>) -> tensor<1x4x4x4x!spyre.dlf16> {
  %m = "spyre.pool2d"(%x) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>, spyre.grid = array<i64: 4>, spyre.tile = array<i64: 4>} : (tensor<1x4x8x8x!spyre.dlf16>) -> tensor<1x4x4x4x!spyre.dlf16>
  return %m : tensor<1x4x4x4x!spyre.dlf16>
}

// -----

// A CNN's flatten: 8-row terms of one operand (rows 8r + h) gathered together into `in0` [8 x 32 rows, 8]
// (32 KiB: one DMA a row tile), not a tile per term; the 8 selections [8, 64] stacked in `sel`.
// CHECK-LABEL: func.func @flatten
// CHECK: "spyre.reshape"
// CHECK-SAME: spyre.kernel = "select-cols", spyre.scratchpad = {acc = 45056 : i64, in0 = 0 : i64, out0 = 40960 : i64, sel = 32768 : i64}
// CHECK-NOT: inb0
func.func @flatten(%x: tensor<1x64x8x8x!spyre.dlf16>) -> tensor<1x4096x!spyre.dlf16> {
  %r = "spyre.reshape"(%x) {spyre.grid = array<i64: 2>, spyre.tile = array<i64: 32>} : (tensor<1x64x8x8x!spyre.dlf16>) -> tensor<1x4096x!spyre.dlf16>
  return %r : tensor<1x4096x!spyre.dlf16>
}

// -----
// ERRORS

func.func @no_tile(%x: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  // expected-error @+1 {{spyre-allocate-scratchpad: 'spyre.softmax' has no spyre.tile: run spyre-tile first}}
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 1>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %s : tensor<64x64x!spyre.dlf16>
}

// -----

// A hand-written tile that cannot fit: the whole 1024x1024x1024 problem on one core at once.
func.func @too_big(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  // expected-error @+1 {{spyre-allocate-scratchpad: the buffers of tile [1024, 1024, 1024] need 10485760 bytes of scratchpad, 1589376 available}}
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 1, 1>, spyre.tile = array<i64: 1024, 1024, 1024>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}
