// Every spyre op and type round-trips: print -> parse -> print.
// RUN: spyre-opt %s | spyre-opt | filecheck %s
// RUN: spyre-opt %s --mlir-print-op-generic | spyre-opt | filecheck %s

// CHECK-LABEL: func.func @types
// CHECK-SAME: tensor<4x64x!spyre.dlf16>
// CHECK-SAME: tensor<4x100xf32, #spyre.stick<1 : i64>>
func.func @types(%a: tensor<4x64x!spyre.dlf16>, %b: tensor<4x100xf32, #spyre.stick<1 : i64>>) {
  return
}

// CHECK-LABEL: func.func @linear_algebra
func.func @linear_algebra(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>, %bt: tensor<16x64xf32>, %bias: tensor<16xf32>,
                          %ba: tensor<4x32x64x!spyre.dlf16>, %bb: tensor<4x64x16x!spyre.dlf16>) -> tensor<32x16xf32> {
  // CHECK: "spyre.matmul"(%{{.*}}, %{{.*}}, %{{.*}}) {operandSegmentSizes = array<i32: 1, 1, 1>}
  // CHECK-SAME: -> tensor<32x16xf32>
  %0 = "spyre.matmul"(%a, %b, %bias) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<32x64xf32>, tensor<64x16xf32>, tensor<16xf32>) -> tensor<32x16xf32>
  // CHECK: "spyre.matmul"(%{{.*}}, %{{.*}}) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true}
  %1 = "spyre.matmul"(%a, %bt) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<32x64xf32>, tensor<16x64xf32>) -> tensor<32x16xf32>
  // CHECK: "spyre.batch_matmul"
  // CHECK-SAME: -> tensor<4x32x16xf32>
  %2 = "spyre.batch_matmul"(%ba, %bb) : (tensor<4x32x64x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>) -> tensor<4x32x16xf32>
  return %0 : tensor<32x16xf32>
}

// CHECK-LABEL: func.func @convolution
func.func @convolution(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>, %dw: tensor<8x1x3x3xf32>, %bias: tensor<16xf32>, %qw: tensor<16x8x3x3x!spyre.dlf16>) {
  // CHECK: "spyre.conv2d"
  // CHECK-SAME: groups = 1 : i64
  // CHECK-SAME: -> tensor<1x16x8x8xf32>
  %0 = "spyre.conv2d"(%x, %w, %bias) {operandSegmentSizes = array<i32: 1, 1, 1>, strides = array<i64: 2, 2>, padding = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, groups = 1 : i64} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>, tensor<16xf32>) -> tensor<1x16x8x8xf32>
  // An f32 input converted to the filters' dlf16 on the scratchpad (spyre-fuse).
  // CHECK: "spyre.conv2d"
  // CHECK-SAME: spyre.convert_operands = {input = !spyre.dlf16}
  %c = "spyre.conv2d"(%x, %qw) {operandSegmentSizes = array<i32: 1, 1, 0>, spyre.convert_operands = {input = !spyre.dlf16}} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x14x14x!spyre.dlf16>
  // CHECK: "spyre.conv2d"
  // CHECK-SAME: groups = 8 : i64
  %1 = "spyre.conv2d"(%x, %dw) {operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, groups = 8 : i64} : (tensor<1x8x16x16xf32>, tensor<8x1x3x3xf32>) -> tensor<1x8x16x16xf32>
  // CHECK: "spyre.pool2d"
  // CHECK-SAME: kind = "max"
  %2 = "spyre.pool2d"(%x) {kind = "max", kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>} : (tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32>
  // CHECK: "spyre.pool2d"
  // CHECK-SAME: kind = "avg"
  %3 = "spyre.pool2d"(%x) {kind = "avg", kernel = array<i64: 16, 16>} : (tensor<1x8x16x16xf32>) -> tensor<1x8x1x1xf32>
  return
}

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%x: tensor<8x64xf32>, %b: tensor<64xf32>, %d: tensor<8x64x!spyre.dlf16>) -> tensor<8x64xf32> {
  // CHECK: "spyre.map"(%{{.*}}, %{{.*}}) ({
  // CHECK-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: f32):
  // CHECK-NEXT: arith.addf
  // CHECK-NEXT: math.tanh
  // CHECK-NEXT: "spyre.yield"
  // CHECK-NEXT: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>}
  %0 = "spyre.map"(%x, %b) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    %t = math.tanh %s : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  // A map without inputs is a fill.
  // CHECK: "spyre.map"() ({
  // CHECK: arith.constant 0.000000e+00 : f32
  %1 = "spyre.map"() ({
    %z = arith.constant 0.0 : f32
    "spyre.yield"(%z) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 0, 0, 0, 0>} : () -> tensor<8x64xf32>
  // The SFU computes reduced-precision tensors in f32.
  // CHECK: "spyre.map"
  // CHECK-NEXT: ^bb0(%{{.*}}: f32):
  // CHECK: -> tensor<8x64x!spyre.dlf16>
  %2 = "spyre.map"(%d) ({
  ^bb0(%p: f32):
    %e = math.exp %p : f32
    "spyre.yield"(%e) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %0 : tensor<8x64xf32>
}

// CHECK-LABEL: func.func @reductions_and_norms
func.func @reductions_and_norms(%x: tensor<8x64xf32>, %w: tensor<64xf32>, %b: tensor<64xf32>) {
  // CHECK: "spyre.reduce"
  // CHECK-SAME: kind = "sum"
  // CHECK-SAME: -> tensor<8xf32>
  %0 = "spyre.reduce"(%x) {dims = array<i64: 1>, kind = "sum"} : (tensor<8x64xf32>) -> tensor<8xf32>
  // CHECK: "spyre.reduce"
  // CHECK-SAME: keepdim = true
  // CHECK-SAME: -> tensor<8x1xf32>
  %1 = "spyre.reduce"(%x) {dims = array<i64: -1>, kind = "max", keepdim = true} : (tensor<8x64xf32>) -> tensor<8x1xf32>
  // CHECK: "spyre.softmax"
  // CHECK-SAME: acc_type = f32
  %2 = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  // CHECK: "spyre.layernorm"
  // CHECK-SAME: epsilon = 9.99999974E-6 : f32
  %3 = "spyre.layernorm"(%x, %w, %b) {operandSegmentSizes = array<i32: 1, 1, 1>, axis = 1 : i64, epsilon = 1.0e-05 : f32} : (tensor<8x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  // CHECK: "spyre.rmsnorm"
  %4 = "spyre.rmsnorm"(%x, %w) {operandSegmentSizes = array<i32: 1, 1>, epsilon = 1.0e-06 : f32} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  return
}

// CHECK-LABEL: func.func @data_movement
func.func @data_movement(%x: tensor<8x64xf32>, %y: tensor<8x32xf32>, %table: tensor<256x64xf32>, %ids: tensor<1x16xi64>) {
  // CHECK: "spyre.transpose"
  // CHECK-SAME: -> tensor<64x8xf32>
  %0 = "spyre.transpose"(%x) {permutation = array<i64: 1, 0>} : (tensor<8x64xf32>) -> tensor<64x8xf32>
  // CHECK: "spyre.reshape"
  // CHECK-SAME: -> tensor<2x4x64xf32>
  %1 = "spyre.reshape"(%x) : (tensor<8x64xf32>) -> tensor<2x4x64xf32>
  // CHECK: "spyre.gather"
  // CHECK-SAME: -> tensor<1x16x64xf32>
  %2 = "spyre.gather"(%table, %ids) : (tensor<256x64xf32>, tensor<1x16xi64>) -> tensor<1x16x64xf32>
  // CHECK: "spyre.concat"
  // CHECK-SAME: -> tensor<8x96xf32>
  %3 = "spyre.concat"(%x, %y) {dim = 1 : i64} : (tensor<8x64xf32>, tensor<8x32xf32>) -> tensor<8x96xf32>
  // CHECK: "spyre.slice"
  // CHECK-SAME: -> tensor<8x16xf32>
  %4 = "spyre.slice"(%x) {offsets = array<i64: 0, 1>, sizes = array<i64: 8, 16>, strides = array<i64: 1, 2>} : (tensor<8x64xf32>) -> tensor<8x16xf32>
  // CHECK: "spyre.pad"
  // CHECK-SAME: -> tensor<8x128xf32>
  %5 = "spyre.pad"(%x) {low = array<i64: 0, 0>, high = array<i64: 0, 64>, value = 0.0 : f32} : (tensor<8x64xf32>) -> tensor<8x128xf32>
  // CHECK: "spyre.all_gather"
  // CHECK-SAME: -> tensor<8x192xf32>
  %6 = "spyre.all_gather"(%x, %x, %x) {dim = 1 : i64} : (tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x192xf32>
  return
}

// CHECK-LABEL: func.func @formats
func.func @formats(%x: tensor<16x64xf32>, %s: tensor<16xf32>, %s1: tensor<f32>) {
  // CHECK: "spyre.cast"
  // CHECK-SAME: -> tensor<16x64x!spyre.dlf16>
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<16x64xf32>) -> tensor<16x64x!spyre.dlf16>
  // CHECK: "spyre.cast"
  // CHECK-SAME: axis = 0 : i64
  // CHECK-SAME: -> tensor<16x64xi8>
  %1 = "spyre.cast"(%x, %s) {operandSegmentSizes = array<i32: 1, 1>, axis = 0 : i64} : (tensor<16x64xf32>, tensor<16xf32>) -> tensor<16x64xi8>
  // CHECK: "spyre.cast"
  // CHECK-SAME: -> tensor<16x64xf8E4M3FN>
  %2 = "spyre.cast"(%x, %s1) {operandSegmentSizes = array<i32: 1, 1>} : (tensor<16x64xf32>, tensor<f32>) -> tensor<16x64xf8E4M3FN>
  // CHECK: "spyre.cast"
  // CHECK-SAME: scale_mode = "per-channel"
  %q = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>, scale_mode = "per-channel", axis = 0 : i64} : (tensor<16x64xf32>) -> tensor<16x64xi8>
  return
}

// CHECK-LABEL: func.func @host
func.func @host(%ids: tensor<1x16xi64>) -> tensor<1x16xi64> {
  // CHECK: "spyre.host"() ({
  // CHECK: arith.addi
  // CHECK: "spyre.yield"
  // CHECK: }) {reason = "int64 index math"} : () -> tensor<1x16xi64>
  %0 = "spyre.host"() ({
    %c = arith.constant dense<1> : tensor<1x16xi64>
    %s = arith.addi %ids, %c : tensor<1x16xi64>
    "spyre.yield"(%s) : (tensor<1x16xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<1x16xi64>
  return %0 : tensor<1x16xi64>
}
