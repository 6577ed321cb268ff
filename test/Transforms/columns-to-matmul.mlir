// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-columns-to-matmul)' | filecheck %s

// rotate_half(x) = cat(-x[..., 32:], x[..., :32]): the slices, the negation and the concat become x (as its
// rows) times a constant [64, 64] signed selection, and the product takes x's shape again.
// CHECK-LABEL: func.func @rotate_half
// CHECK-SAME: (%[[X:.*]]: tensor<1x4x16x64x!spyre.dlf16>)
// CHECK-NOT: spyre.slice
// CHECK: %[[P:.*]] = arith.constant {spyre.name = "columns"} dense_resource<{{.*}}> : tensor<64x64x!spyre.dlf16>
// CHECK: %[[R:.*]] = "spyre.reshape"(%[[X]]) : (tensor<1x4x16x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
// CHECK: %[[M:.*]] = "spyre.matmul"(%[[R]], %[[P]]) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>}
// CHECK-SAME: -> tensor<64x64x!spyre.dlf16>
// CHECK: %[[B:.*]] = "spyre.reshape"(%[[M]]) : (tensor<64x64x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16>
// CHECK-NOT: spyre.concat
// CHECK: return %[[B]]
func.func @rotate_half(%x: tensor<1x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16> {
  %a = "spyre.slice"(%x) {offsets = array<i64: 0, 0, 0, 0>, sizes = array<i64: 1, 4, 16, 32>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x32x!spyre.dlf16>
  %b = "spyre.slice"(%x) {offsets = array<i64: 0, 0, 0, 32>, sizes = array<i64: 1, 4, 16, 32>, strides = array<i64: 1, 1, 1, 1>} : (tensor<1x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x32x!spyre.dlf16>
  %n = "spyre.map"(%b) ({
  ^bb0(%e: f32):
    %m = arith.negf %e : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x4x16x32x!spyre.dlf16>) -> tensor<1x4x16x32x!spyre.dlf16>
  %r = "spyre.concat"(%n, %a) {dim = 3 : i64} : (tensor<1x4x16x32x!spyre.dlf16>, tensor<1x4x16x32x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16>
  return %r : tensor<1x4x16x64x!spyre.dlf16>
}

// -----

// A chain of concats along the innermost dim is one selection, strided slices and repeated columns included:
// [even columns (in two concatenated halves), odd columns, the first 4 columns again] of an [8, 16] tensor is a
// [16, 20] selection.
// CHECK-LABEL: func.func @chain
// CHECK: arith.constant {{.*}} : tensor<16x20xf32>
// CHECK: "spyre.matmul"{{.*}} : (tensor<8x16xf32>, tensor<16x20xf32>) -> tensor<8x20xf32>
// CHECK-NOT: spyre.concat
func.func @chain(%x: tensor<8x16xf32>) -> tensor<8x20xf32> {
  %f = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 4>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x4xf32>
  %e2 = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 4>, strides = array<i64: 1, 2>} : (tensor<8x16xf32>) -> tensor<8x4xf32>
  %o2 = "spyre.slice"(%x) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 4>, strides = array<i64: 1, 2>} : (tensor<8x16xf32>) -> tensor<8x4xf32>
  %c2 = "spyre.concat"(%e2, %o2) {dim = 1 : i64} : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x8xf32>
  %o = "spyre.slice"(%x) {offsets = array<i64: 0, 1>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 2>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %c = "spyre.concat"(%c2, %o) {dim = 1 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %r = "spyre.concat"(%c, %f) {dim = -1 : i64} : (tensor<8x16xf32>, tensor<8x4xf32>) -> tensor<8x20xf32>
  return %r : tensor<8x20xf32>
}

// -----

// Left alone: a slice another op also reads (it is computed anyway), slices of two tensors, a concat along an
// outer dim, a slice of part of an outer dim, a map that does more than negate, and ops on the host.
// CHECK-LABEL: func.func @kept
// CHECK-NOT: spyre.matmul
// CHECK-COUNT-6: "spyre.concat"
// CHECK-NOT: spyre.matmul
func.func @kept(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) {
  %a = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %b = "spyre.slice"(%x) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %shared = "spyre.concat"(%b, %a) {dim = 1 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %c = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %d = "spyre.slice"(%y) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %two = "spyre.concat"(%c, %d) {dim = 1 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %g = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %h = "spyre.slice"(%x) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %outer = "spyre.concat"(%g, %h) {dim = 0 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  %i = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 4, 16>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %j = "spyre.slice"(%x) {offsets = array<i64: 4, 0>, sizes = array<i64: 4, 16>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %rows = "spyre.concat"(%i, %j) {dim = 1 : i64} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x32xf32>
  %rr = "spyre.reshape"(%rows) : (tensor<4x32xf32>) -> tensor<8x16xf32>
  %k = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %l = "spyre.slice"(%x) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %twice = "spyre.map"(%l) ({
  ^bb0(%e: f32):
    %m = arith.addf %e, %e : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %scaled = "spyre.concat"(%twice, %k) {dim = 1 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  %p = "spyre.slice"(%x) {offsets = array<i64: 0, 0>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %q = "spyre.slice"(%x) {offsets = array<i64: 0, 8>, sizes = array<i64: 8, 8>, strides = array<i64: 1, 1>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %host = "spyre.concat"(%q, %p) {dim = 1 : i64, spyre.on_host = "forced"} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
  return %shared, %a, %two, %outer, %rr, %scaled, %host : tensor<8x16xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
}
