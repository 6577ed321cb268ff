// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// nn.Linear from the MLP example: x @ W^T arrives as a matmul with a transposed weight, then a bias add.
// Both fold: the weight is read with transpose_rhs and the bias becomes the matmul's bias operand.
// CHECK-LABEL: func.func @linear
// CHECK: %[[M:.*]] = "spyre.matmul"(%arg0, %arg1, %arg2) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true}
// CHECK-SAME: (tensor<4x64xf32>, tensor<128x64xf32>, tensor<128xf32>) -> tensor<4x128xf32>
// CHECK-NEXT: return %[[M]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#map2 = affine_map<(d0, d1) -> (d1)>
func.func @linear(%21: tensor<4x64xf32>, %arg3: tensor<128x64xf32>, %arg4: tensor<128xf32>) -> tensor<4x128xf32> {
  %cst_0 = arith.constant 0.000000e+00 : f32
  %22 = tensor.empty() : tensor<64x128xf32>
  %transposed = linalg.transpose ins(%arg3 : tensor<128x64xf32>) outs(%22 : tensor<64x128xf32>) permutation = [1, 0]
  %23 = tensor.empty() : tensor<4x128xf32>
  %24 = linalg.fill ins(%cst_0 : f32) outs(%23 : tensor<4x128xf32>) -> tensor<4x128xf32>
  %25 = linalg.matmul ins(%21, %transposed : tensor<4x64xf32>, tensor<64x128xf32>) outs(%24 : tensor<4x128xf32>) -> tensor<4x128xf32>
  %26 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%25, %arg4 : tensor<4x128xf32>, tensor<128xf32>) outs(%23 : tensor<4x128xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.addf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x128xf32>
  return %26 : tensor<4x128xf32>
}

// -----

// When the product is also used without the bias, the bias add stays a map.
// CHECK-LABEL: func.func @shared_product
// CHECK: %[[M:.*]] = "spyre.matmul"(%arg0, %arg1) {operandSegmentSizes = array<i32: 1, 1, 0>}
// CHECK: %[[A:.*]] = "spyre.map"(%[[M]], %arg2)
// CHECK: return %[[A]], %[[M]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#map2 = affine_map<(d0, d1) -> (d1)>
func.func @shared_product(%a: tensor<4x64xf32>, %w: tensor<64x128xf32>, %b: tensor<128xf32>) -> (tensor<4x128xf32>, tensor<4x128xf32>) {
  %cst_0 = arith.constant 0.000000e+00 : f32
  %23 = tensor.empty() : tensor<4x128xf32>
  %24 = linalg.fill ins(%cst_0 : f32) outs(%23 : tensor<4x128xf32>) -> tensor<4x128xf32>
  %25 = linalg.matmul ins(%a, %w : tensor<4x64xf32>, tensor<64x128xf32>) outs(%24 : tensor<4x128xf32>) -> tensor<4x128xf32>
  %26 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%25, %b : tensor<4x128xf32>, tensor<128xf32>) outs(%23 : tensor<4x128xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.addf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x128xf32>
  return %26, %25 : tensor<4x128xf32>, tensor<4x128xf32>
}

// -----

// q @ k^T with heads: k [1, 4, 16, 8] transposed to [1, 4, 8, 16] and collapsed to [4, 8, 16]; the batch
// matmul reads the same collapse of k with transpose_rhs instead. A transpose of other dims stays.
// CHECK-LABEL: func.func @attention_scores
// CHECK: %[[K:.*]] = "spyre.reshape"(%arg1) : (tensor<1x4x16x8xf32>) -> tensor<4x16x8xf32>
// CHECK: "spyre.batch_matmul"(%arg0, %[[K]]) {transpose_rhs = true} : (tensor<4x16x8xf32>, tensor<4x16x8xf32>) -> tensor<4x16x16xf32>
// CHECK: %[[T:.*]] = "spyre.transpose"(%arg1) {permutation = array<i64: 1, 0, 2, 3>}
// CHECK: %[[R:.*]] = "spyre.reshape"(%[[T]])
// CHECK: "spyre.batch_matmul"(%{{.*}}, %[[R]]) : (tensor<4x16x16xf32>, tensor<4x16x8xf32>) -> tensor<4x16x8xf32>
func.func @attention_scores(%q: tensor<4x16x8xf32>, %k: tensor<1x4x16x8xf32>) -> (tensor<4x16x16xf32>, tensor<4x16x8xf32>) {
  %cst = arith.constant 0.000000e+00 : f32
  %e = tensor.empty() : tensor<1x4x8x16xf32>
  %kt = linalg.transpose ins(%k : tensor<1x4x16x8xf32>) outs(%e : tensor<1x4x8x16xf32>) permutation = [0, 1, 3, 2]
  %c = tensor.collapse_shape %kt [[0, 1], [2], [3]] : tensor<1x4x8x16xf32> into tensor<4x8x16xf32>
  %o = tensor.empty() : tensor<4x16x16xf32>
  %f = linalg.fill ins(%cst : f32) outs(%o : tensor<4x16x16xf32>) -> tensor<4x16x16xf32>
  %s = linalg.batch_matmul ins(%q, %c : tensor<4x16x8xf32>, tensor<4x8x16xf32>) outs(%f : tensor<4x16x16xf32>) -> tensor<4x16x16xf32>
  %e2 = tensor.empty() : tensor<4x1x16x8xf32>
  %kh = linalg.transpose ins(%k : tensor<1x4x16x8xf32>) outs(%e2 : tensor<4x1x16x8xf32>) permutation = [1, 0, 2, 3]
  %c2 = tensor.collapse_shape %kh [[0, 1], [2], [3]] : tensor<4x1x16x8xf32> into tensor<4x16x8xf32>
  %o2 = tensor.empty() : tensor<4x16x8xf32>
  %f2 = linalg.fill ins(%cst : f32) outs(%o2 : tensor<4x16x8xf32>) -> tensor<4x16x8xf32>
  %v = linalg.batch_matmul ins(%s, %c2 : tensor<4x16x16xf32>, tensor<4x16x8xf32>) outs(%f2 : tensor<4x16x8xf32>) -> tensor<4x16x8xf32>
  return %s, %v : tensor<4x16x16xf32>, tensor<4x16x8xf32>
}
