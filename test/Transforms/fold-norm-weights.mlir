// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-fold-norm-weights)' | filecheck %s

// An rmsnorm read only by two Linears (one rhs [N, K] read transposed, one [K, N]): the norm loses its weight
// and each weight's value is scaled along K by it (w = [2, 0.5], both weights all ones: each becomes w).
// CHECK-LABEL: func.func @projections
// CHECK: %[[N:.*]] = "spyre.rmsnorm"(%arg0) {acc_type = f32, epsilon = {{.*}}, operandSegmentSizes = array<i32: 1, 0>}
// CHECK-NEXT: %[[R:.*]] = "spyre.reshape"(%[[N]])
// CHECK-NEXT: "spyre.matmul"(%[[R]], %arg2) {{.*}}transpose_rhs = true
// CHECK-NEXT: "spyre.matmul"(%[[R]], %arg3)
// CHECK: norm.weight: "0x01000000000000400000003F"
// CHECK-NEXT: q.weight_{{[0-9]+}}: "0x01000000000000400000003F"
// CHECK-NEXT: v.weight_{{[0-9]+}}: "0x01000000000000400000003F"
func.func @projections(%x: tensor<1x4x2xf32>, %w: tensor<2xf32> {spyre.param = "norm.weight", spyre.value = dense_resource<norm.weight> : tensor<2xf32>}, %q: tensor<1x2xf32> {spyre.param = "q.weight", spyre.value = dense_resource<q.weight> : tensor<1x2xf32>}, %v: tensor<2x1xf32> {spyre.param = "v.weight", spyre.value = dense_resource<v.weight> : tensor<2x1xf32>}) -> (tensor<4x1xf32>, tensor<4x1xf32>) {
  %0 = "spyre.rmsnorm"(%x, %w) {acc_type = f32, epsilon = 9.99999997E-7 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x2xf32>, tensor<2xf32>) -> tensor<1x4x2xf32>
  %1 = "spyre.reshape"(%0) : (tensor<1x4x2xf32>) -> tensor<4x2xf32>
  %2 = "spyre.matmul"(%1, %q) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  %3 = "spyre.matmul"(%1, %v) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %2, %3 : tensor<4x1xf32>, tensor<4x1xf32>
}

{-#
  dialect_resources: {
    builtin: {
      norm.weight: "0x01000000000000400000003F",
      q.weight: "0x010000000000803F0000803F",
      v.weight: "0x010000000000803F0000803F"
    }
  }
#-}

// -----

// The norm's result is also read by something other than a matmul lhs (here the function's result): unchanged.
// CHECK-LABEL: func.func @other_reader
// CHECK: "spyre.rmsnorm"(%arg0, %arg1) {{.*}}operandSegmentSizes = array<i32: 1, 1>
// CHECK: q.weight: "0x010000000000803F0000803F"
func.func @other_reader(%x: tensor<4x2xf32>, %w: tensor<2xf32> {spyre.param = "norm.weight", spyre.value = dense_resource<norm.weight> : tensor<2xf32>}, %q: tensor<1x2xf32> {spyre.param = "q.weight", spyre.value = dense_resource<q.weight> : tensor<1x2xf32>}) -> (tensor<4x1xf32>, tensor<4x2xf32>) {
  %0 = "spyre.rmsnorm"(%x, %w) {acc_type = f32, epsilon = 9.99999997E-7 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<4x2xf32>, tensor<2xf32>) -> tensor<4x2xf32>
  %1 = "spyre.matmul"(%0, %q) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  return %1, %0 : tensor<4x1xf32>, tensor<4x2xf32>
}

{-#
  dialect_resources: {
    builtin: {
      norm.weight: "0x01000000000000400000003F",
      q.weight: "0x010000000000803F0000803F"
    }
  }
#-}

// -----

// A weight another matmul also reads (tied weights) keeps its value, so the norm keeps its weight.
// CHECK-LABEL: func.func @tied
// CHECK: "spyre.rmsnorm"(%arg0, %arg2) {{.*}}operandSegmentSizes = array<i32: 1, 1>
// CHECK: q.weight: "0x010000000000803F0000803F"
func.func @tied(%x: tensor<4x2xf32>, %y: tensor<4x2xf32>, %w: tensor<2xf32> {spyre.param = "norm.weight", spyre.value = dense_resource<norm.weight> : tensor<2xf32>}, %q: tensor<1x2xf32> {spyre.param = "q.weight", spyre.value = dense_resource<q.weight> : tensor<1x2xf32>}) -> (tensor<4x1xf32>, tensor<4x1xf32>) {
  %0 = "spyre.rmsnorm"(%x, %w) {acc_type = f32, epsilon = 9.99999997E-7 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<4x2xf32>, tensor<2xf32>) -> tensor<4x2xf32>
  %1 = "spyre.matmul"(%0, %q) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  %2 = "spyre.matmul"(%y, %q) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  return %1, %2 : tensor<4x1xf32>, tensor<4x1xf32>
}

{-#
  dialect_resources: {
    builtin: {
      norm.weight: "0x01000000000000400000003F",
      q.weight: "0x010000000000803F0000803F"
    }
  }
#-}

// -----

// A layernorm with a bias (which would fold into a matmul bias, not done) is left alone; one without folds.
// CHECK-LABEL: func.func @layernorms
// CHECK: "spyre.layernorm"(%arg0, %arg1, %arg2) {{.*}}operandSegmentSizes = array<i32: 1, 1, 1>
// CHECK: "spyre.layernorm"(%arg0) {{.*}}operandSegmentSizes = array<i32: 1, 0, 0>
// CHECK: p.weight: "0x010000000000803F0000803F"
// CHECK: q.weight_{{[0-9]+}}: "0x01000000000000400000003F"
func.func @layernorms(%x: tensor<4x2xf32>, %w: tensor<2xf32> {spyre.param = "norm.weight", spyre.value = dense_resource<norm.weight> : tensor<2xf32>}, %b: tensor<2xf32> {spyre.param = "norm.bias", spyre.value = dense_resource<norm.bias> : tensor<2xf32>}, %p: tensor<1x2xf32> {spyre.param = "p.weight", spyre.value = dense_resource<p.weight> : tensor<1x2xf32>}, %w2: tensor<2xf32> {spyre.param = "norm2.weight", spyre.value = dense_resource<norm2.weight> : tensor<2xf32>}, %q: tensor<1x2xf32> {spyre.param = "q.weight", spyre.value = dense_resource<q.weight> : tensor<1x2xf32>}) -> (tensor<4x1xf32>, tensor<4x1xf32>) {
  %0 = "spyre.layernorm"(%x, %w, %b) {acc_type = f32, axis = -1 : i64, epsilon = 9.99999974E-6 : f32, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<4x2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<4x2xf32>
  %1 = "spyre.matmul"(%0, %p) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  %2 = "spyre.layernorm"(%x, %w2) {acc_type = f32, axis = -1 : i64, epsilon = 9.99999974E-6 : f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<4x2xf32>, tensor<2xf32>) -> tensor<4x2xf32>
  %3 = "spyre.matmul"(%2, %q) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<4x2xf32>, tensor<1x2xf32>) -> tensor<4x1xf32>
  return %1, %3 : tensor<4x1xf32>, tensor<4x1xf32>
}

{-#
  dialect_resources: {
    builtin: {
      norm.weight: "0x01000000000000400000003F",
      norm.bias: "0x010000000000803F0000803F",
      p.weight: "0x010000000000803F0000803F",
      norm2.weight: "0x01000000000000400000003F",
      q.weight: "0x010000000000803F0000803F"
    }
  }
#-}
