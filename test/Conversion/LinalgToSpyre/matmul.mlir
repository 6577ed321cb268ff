// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// A zero-filled accumulator is the plain product.
// CHECK-LABEL: func.func @matmul
// CHECK-NOT: linalg.matmul
// CHECK: %[[R:.*]] = "spyre.matmul"(%arg0, %arg1) {operandSegmentSizes = array<i32: 1, 1, 0>}
// CHECK-SAME: (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
// CHECK-NEXT: return %[[R]]
func.func @matmul(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  return %m : tensor<8x32xf32>
}

// -----

// Any other accumulator is added after the product.
// CHECK-LABEL: func.func @matmul_accumulate
// CHECK: %[[P:.*]] = "spyre.matmul"(%arg0, %arg1)
// CHECK: "spyre.map"(%[[P]], %arg2) ({
// CHECK: arith.addf
// CHECK: -> tensor<8x32xf32>
func.func @matmul_accumulate(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>, %c: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %m = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x32xf32>) outs(%c : tensor<8x32xf32>) -> tensor<8x32xf32>
  return %m : tensor<8x32xf32>
}

// -----

// CHECK-LABEL: func.func @batch_matmul
// CHECK: "spyre.batch_matmul"(%arg0, %arg1) : (tensor<4x8x16xf32>, tensor<4x16x32xf32>) -> tensor<4x8x32xf32>
// CHECK-NOT: linalg.batch_matmul
func.func @batch_matmul(%a: tensor<4x8x16xf32>, %b: tensor<4x16x32xf32>) -> tensor<4x8x32xf32> {
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x8x32xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %m = linalg.batch_matmul ins(%a, %b : tensor<4x8x16xf32>, tensor<4x16x32xf32>) outs(%f : tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  return %m : tensor<4x8x32xf32>
}
