// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-fold-constants)' | filecheck %s

// An int8 per-channel weight read by a matmul: the codes (transposed with the weight, the axis follows) and the
// scales become constants, the dequantizing cast takes the scale as an operand, and the parameter keeps no value.
// Row 0 [1, -2, 4] has scale 4/127 and codes [32, -64, 127]; row 1 [0.5, 0.25, -1] scale 1/127, codes [64, 32, -127].
// CHECK-LABEL: func.func @int8_weight
// CHECK-SAME: %arg1: tensor<2x3xf32> {spyre.param = "fc.weight"}
// CHECK-DAG: %[[C:.*]] = arith.constant {spyre.name = "fc.weight"} dense_resource<[[CODES:.*]]> : tensor<3x2xi8>
// CHECK-DAG: %[[S:.*]] = arith.constant {spyre.name = "fc.weight.scale"} dense_resource<[[SCALES:.*]]> : tensor<2xf32>
// CHECK: %[[W:.*]] = "spyre.cast"(%[[C]], %[[S]]) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1>, spyre.const_fold = true} : (tensor<3x2xi8>, tensor<2xf32>) -> tensor<3x2x!spyre.dlf16>
// CHECK: "spyre.matmul"(%{{.*}}, %[[W]])
// CHECK-NOT: scale_mode
// CHECK: [[CODES]]: "0x010000002040C0207F81"
func.func @int8_weight(%x: tensor<4x3x!spyre.dlf16>, %w: tensor<2x3xf32> {spyre.param = "fc.weight", spyre.value = dense_resource<w> : tensor<2x3xf32>}) -> tensor<4x2x!spyre.dlf16> {
  %q = "spyre.cast"(%w) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xf32>) -> tensor<2x3xi8>
  %d = "spyre.cast"(%q) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xi8>) -> tensor<2x3x!spyre.dlf16>
  %t = "spyre.transpose"(%d) {permutation = array<i64: 1, 0>, restickify = true, spyre.const_fold = true} : (tensor<2x3x!spyre.dlf16>) -> tensor<3x2x!spyre.dlf16>
  %r = "spyre.matmul"(%x, %t) {operandSegmentSizes = array<i32: 1, 1, 0>, spyre.kernel = "matmul"} : (tensor<4x3x!spyre.dlf16>, tensor<3x2x!spyre.dlf16>) -> tensor<4x2x!spyre.dlf16>
  return %r : tensor<4x2x!spyre.dlf16>
}
{-#
  dialect_resources: {
    builtin: {
      w: "0x040000000000803F000000C0000080400000003F0000803E000080BF"
    }
  }
#-}

// -----

// A cast of a parameter to DLFloat16 folds to a constant holding the format's bits (1.0 is 0x3E00, -2.0
// 0xC000); a per-tensor fp8 weight keeps one scale (max |w| / 448 = 4 / 448) and no axis: its codes are
// 112, -224, 448, 56, 28, -112 (fp8 E4M3 0x6E 0xF6 0x7E 0x66 0x5E 0xEE).
// CHECK-LABEL: func.func @dlf16_and_fp8
// CHECK-DAG: %[[C:.*]] = arith.constant {spyre.name = "w"} dense_resource<[[F8:.*]]> : tensor<3x2xf8E4M3FN>
// CHECK-DAG: %[[S:.*]] = arith.constant {spyre.name = "w.scale"} dense_resource<{{.*}}> : tensor<1xf32>
// CHECK: %[[W:.*]] = "spyre.cast"(%[[C]], %[[S]]) {operandSegmentSizes = array<i32: 1, 1>, spyre.const_fold = true}
// CHECK: %[[B:.*]] = arith.constant {spyre.name = "b"} dense_resource<[[BITS:.*]]> : tensor<2x!spyre.dlf16>
// CHECK: "spyre.matmul"(%{{.*}}, %[[W]], %[[B]])
// CHECK: [[F8]]: "0x010000006EF67E665EEE"
// CHECK: [[BITS]]: "0x01000000003E00C0"
func.func @dlf16_and_fp8(%x: tensor<4x3x!spyre.dlf16>, %w: tensor<3x2xf32> {spyre.param = "w", spyre.value = dense_resource<w2> : tensor<3x2xf32>}, %b: tensor<2xf32> {spyre.param = "b", spyre.value = dense_resource<b> : tensor<2xf32>}) -> tensor<4x2x!spyre.dlf16> {
  %q = "spyre.cast"(%w) {scale_mode = "per-tensor", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<3x2xf32>) -> tensor<3x2xf8E4M3FN>
  %d = "spyre.cast"(%q) {scale_mode = "per-tensor", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<3x2xf8E4M3FN>) -> tensor<3x2x!spyre.dlf16>
  %bd = "spyre.cast"(%b) {operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2xf32>) -> tensor<2x!spyre.dlf16>
  %r = "spyre.matmul"(%x, %d, %bd) {operandSegmentSizes = array<i32: 1, 1, 1>, spyre.kernel = "matmul"} : (tensor<4x3x!spyre.dlf16>, tensor<3x2x!spyre.dlf16>, tensor<2x!spyre.dlf16>) -> tensor<4x2x!spyre.dlf16>
  return %r : tensor<4x2x!spyre.dlf16>
}
{-#
  dialect_resources: {
    builtin: {
      w2: "0x040000000000803F000000C0000080400000003F0000803E000080BF",
      b: "0x040000000000803F000000C0"
    }
  }
#-}

// -----

// A dequantized weight something other than a matmul reads (here a host op) folds to its real values; a cast of
// a parameter without a value stays for the host to run (the parameter is then a binary input).
// CHECK-LABEL: func.func @dequantized_and_runtime
// CHECK: arith.constant {spyre.name = "w"} dense_resource<{{.*}}> : tensor<2x3x!spyre.dlf16>
// CHECK-NOT: spyre.cast"(%{{.*}}, %{{.*}})
// CHECK: "spyre.cast"(%arg1) {{.*}}spyre.const_fold = true
// CHECK: spyre.host
func.func @dequantized_and_runtime(%w: tensor<2x3xf32> {spyre.param = "w", spyre.value = dense_resource<w3> : tensor<2x3xf32>}, %v: tensor<2x3xf32> {spyre.param = "v"}) -> (tensor<2x3x!spyre.dlf16>, tensor<2x3x!spyre.dlf16>) {
  %q = "spyre.cast"(%w) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xf32>) -> tensor<2x3xi8>
  %d = "spyre.cast"(%q) {axis = 0 : i64, scale_mode = "per-channel", operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xi8>) -> tensor<2x3x!spyre.dlf16>
  %vd = "spyre.cast"(%v) {operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xf32>) -> tensor<2x3x!spyre.dlf16>
  %h = "spyre.host"() ({
    "spyre.yield"(%d) : (tensor<2x3x!spyre.dlf16>) -> ()
  }) {reason = "test"} : () -> tensor<2x3x!spyre.dlf16>
  return %h, %vd : tensor<2x3x!spyre.dlf16>, tensor<2x3x!spyre.dlf16>
}
{-#
  dialect_resources: {
    builtin: {
      w3: "0x040000000000803F000000C0000080400000003F0000803E000080BF"
    }
  }
#-}

// -----

// A weight's cast read only by its restickify (also folded) makes no constant of its own: the transposed
// values are rounded once, into the one constant the matmul reads, the first blob named after the weight (a
// constant made for the cast would have taken the name "w", this one "w_1"). [[1, -2, 0.5], [4, 0.25, -1]]
// transposed, in DLFloat16: 1.0 0x3E00, 4.0 0x4200, -2.0 0xC000, 0.25 0x3A00, 0.5 0x3C00, -1.0 0xBE00.
// CHECK-LABEL: func.func @cast_read_by_a_transpose
// CHECK-NOT: spyre.cast
// CHECK: %[[T:.*]] = arith.constant {spyre.name = "w"} dense_resource<w> : tensor<3x2x!spyre.dlf16>
// CHECK-NOT: arith.constant
// CHECK: "spyre.matmul"(%{{.*}}, %[[T]])
// CHECK: w: "0x01000000003E004200C0003A003C00BE"
func.func @cast_read_by_a_transpose(%x: tensor<4x3x!spyre.dlf16>, %w: tensor<2x3xf32> {spyre.param = "w", spyre.value = dense_resource<w3> : tensor<2x3xf32>}) -> tensor<4x2x!spyre.dlf16> {
  %d = "spyre.cast"(%w) {operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x3xf32>) -> tensor<2x3x!spyre.dlf16>
  %t = "spyre.transpose"(%d) {permutation = array<i64: 1, 0>, restickify = true, spyre.const_fold = true} : (tensor<2x3x!spyre.dlf16>) -> tensor<3x2x!spyre.dlf16>
  %r = "spyre.matmul"(%x, %t) {operandSegmentSizes = array<i32: 1, 1, 0>, spyre.kernel = "matmul"} : (tensor<4x3x!spyre.dlf16>, tensor<3x2x!spyre.dlf16>) -> tensor<4x2x!spyre.dlf16>
  return %r : tensor<4x2x!spyre.dlf16>
}
{-#
  dialect_resources: {
    builtin: {
      w3: "0x040000000000803F000000C00000003F000080400000803E000080BF"
    }
  }
#-}

// -----

// A folded activation only elementwise kernels read, all of whose values are fp8 E5M2 values (a causal mask of 0
// and -inf), is stored in that format: half the bytes, and -inf exact (DLFloat16 would saturate it). One with a
// value E5M2 cannot hold (0.1) keeps the activation format.
// CHECK-LABEL: func.func @narrow_mask
// CHECK-DAG: %[[M:.*]] = arith.constant {spyre.name = "const"} dense_resource<[[MASK:[^>]*]]> : tensor<2x2xf8E5M2>
// CHECK-DAG: %[[N:.*]] = arith.constant {spyre.name = "const"} dense_resource<{{[^>]*}}> : tensor<2x2x!spyre.dlf16>
// CHECK: "spyre.map"(%arg0, %[[M]])
// CHECK: "spyre.map"(%arg0, %[[N]])
// CHECK: [[MASK]]: "0x0100000000FC0000"
func.func @narrow_mask(%x: tensor<2x2x!spyre.dlf16>) -> (tensor<2x2x!spyre.dlf16>, tensor<2x2x!spyre.dlf16>) {
  %ninf = arith.constant dense<[[0.0, 0xFF800000], [0.0, 0.0]]> : tensor<2x2xf32>
  %tenth = arith.constant dense<[[0.0, 0.1], [0.0, 0.0]]> : tensor<2x2xf32>
  %m = "spyre.cast"(%ninf) {operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x2xf32>) -> tensor<2x2x!spyre.dlf16>
  %n = "spyre.cast"(%tenth) {operandSegmentSizes = array<i32: 1, 0>, spyre.const_fold = true} : (tensor<2x2xf32>) -> tensor<2x2x!spyre.dlf16>
  %a = "spyre.map"(%x, %m) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "rows"} : (tensor<2x2x!spyre.dlf16>, tensor<2x2x!spyre.dlf16>) -> tensor<2x2x!spyre.dlf16>
  %b = "spyre.map"(%x, %n) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "rows"} : (tensor<2x2x!spyre.dlf16>, tensor<2x2x!spyre.dlf16>) -> tensor<2x2x!spyre.dlf16>
  return %a, %b : tensor<2x2x!spyre.dlf16>, tensor<2x2x!spyre.dlf16>
}
