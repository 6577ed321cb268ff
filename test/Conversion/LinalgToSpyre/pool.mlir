// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// nn.MaxPool2d(2) from the CNN example: the window tensor gives the kernel, the -inf fill is the identity.
// CHECK-LABEL: func.func @max_pool
// CHECK: %[[P:.*]] = "spyre.pool2d"(%arg0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>}
// CHECK-SAME: (tensor<1x32x16x16xf32>) -> tensor<1x32x8x8xf32>
// CHECK-NEXT: return %[[P]]
func.func @max_pool(%arg0: tensor<1x32x16x16xf32>) -> tensor<1x32x8x8xf32> {
  %cst_1 = arith.constant 0xFF800000 : f32
  %16 = tensor.empty() : tensor<1x32x8x8xf32>
  %17 = linalg.fill ins(%cst_1 : f32) outs(%16 : tensor<1x32x8x8xf32>) -> tensor<1x32x8x8xf32>
  %18 = tensor.empty() : tensor<2x2xf32>
  %19 = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%arg0, %18 : tensor<1x32x16x16xf32>, tensor<2x2xf32>) outs(%17 : tensor<1x32x8x8xf32>) -> tensor<1x32x8x8xf32>
  return %19 : tensor<1x32x8x8xf32>
}

// -----

// nn.AvgPool2d(3, stride=1, padding=1): a sum pool over the zero-padded input divided by the window size.
// CHECK-LABEL: func.func @avg_pool_padded
// CHECK: %[[P:.*]] = "spyre.pool2d"(%arg0) {kernel = array<i64: 3, 3>, kind = "avg", padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
// CHECK-NEXT: return %[[P]]
// CHECK-NOT: linalg
#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @avg_pool_padded(%arg0: tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %cst_4 = arith.constant 9.000000e+00 : f32
  %0 = tensor.empty() : tensor<1x8x8x8xf32>
  %padded_9 = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %cst : f32
  } : tensor<1x8x8x8xf32> to tensor<1x8x10x10xf32>
  %8 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32>
  %9 = tensor.empty() : tensor<3x3xf32>
  %10 = linalg.pooling_nchw_sum {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%padded_9, %9 : tensor<1x8x10x10xf32>, tensor<3x3xf32>) outs(%8 : tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32>
  %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%10 : tensor<1x8x8x8xf32>) outs(%0 : tensor<1x8x8x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %41 = arith.divf %in, %cst_4 : f32
    linalg.yield %41 : f32
  } -> tensor<1x8x8x8xf32>
  return %11 : tensor<1x8x8x8xf32>
}

// -----

// A sum pool without the division has no spyre form: it stays, with the reason for spyre-place-host.
// CHECK-LABEL: func.func @sum_pool
// CHECK: linalg.pooling_nchw_sum
// CHECK-SAME: spyre.unconverted = "sum pooling not followed by a division by the window size (no spyre.pool2d form)"
func.func @sum_pool(%arg0: tensor<1x8x8x8xf32>) -> tensor<1x8x4x4xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %3 = tensor.empty() : tensor<1x8x4x4xf32>
  %4 = linalg.fill ins(%cst : f32) outs(%3 : tensor<1x8x4x4xf32>) -> tensor<1x8x4x4xf32>
  %5 = tensor.empty() : tensor<2x2xf32>
  %6 = linalg.pooling_nchw_sum {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%arg0, %5 : tensor<1x8x8x8xf32>, tensor<2x2xf32>) outs(%4 : tensor<1x8x4x4xf32>) -> tensor<1x8x4x4xf32>
  return %6 : tensor<1x8x4x4xf32>
}

// -----

// adaptive_avg_pool2d(x, 1) arrives as a keepdim sum over H, W divided by H*W: a mean reduce.
// CHECK-LABEL: func.func @global_avg_pool
// CHECK: %[[R:.*]] = "spyre.reduce"(%arg0) {dims = array<i64: 2, 3>, keepdim = true, kind = "mean"} : (tensor<1x32x8x8xf32>) -> tensor<1x32x1x1xf32>
// CHECK: "spyre.reshape"(%[[R]]) : (tensor<1x32x1x1xf32>) -> tensor<1x32xf32>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, 0, 0)>
func.func @global_avg_pool(%arg0: tensor<1x32x8x8xf32>) -> tensor<1x32xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %cst_3 = arith.constant 6.400000e+01 : f32
  %22 = tensor.empty() : tensor<1x32x1x1xf32>
  %23 = linalg.fill ins(%cst : f32) outs(%22 : tensor<1x32x1x1xf32>) -> tensor<1x32x1x1xf32>
  %24 = linalg.generic {indexing_maps = [#map1, #map3], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%arg0 : tensor<1x32x8x8xf32>) outs(%23 : tensor<1x32x1x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %31 = arith.addf %in, %out : f32
    linalg.yield %31 : f32
  } -> tensor<1x32x1x1xf32>
  %25 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%24 : tensor<1x32x1x1xf32>) outs(%22 : tensor<1x32x1x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %31 = arith.divf %in, %cst_3 : f32
    linalg.yield %31 : f32
  } -> tensor<1x32x1x1xf32>
  %collapsed_11 = tensor.collapse_shape %25 [[0], [1, 2, 3]] : tensor<1x32x1x1xf32> into tensor<1x32xf32>
  return %collapsed_11 : tensor<1x32xf32>
}

// -----

// nn.MaxPool2d(3, stride=2, padding=1): torch-mlir pads with -inf, which folds into the pool's padding;
// a dilated pool has no spyre form.
// CHECK-LABEL: func.func @max_pool_padded
// CHECK: "spyre.pool2d"(%arg0) {kernel = array<i64: 3, 3>, kind = "max", padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>}
// CHECK-SAME: (tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32>
// CHECK: linalg.pooling_nchw_max
// CHECK-SAME: spyre.unconverted = "dilated pooling has no spyre.pool2d form"
func.func @max_pool_padded(%arg0: tensor<1x4x8x8xf32>) -> (tensor<1x4x4x4xf32>, tensor<1x4x3x3xf32>) {
  %ninf = arith.constant 0xFF800000 : f32
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %ninf : f32
  } : tensor<1x4x8x8xf32> to tensor<1x4x10x10xf32>
  %e = tensor.empty() : tensor<1x4x4x4xf32>
  %f = linalg.fill ins(%ninf : f32) outs(%e : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  %w = tensor.empty() : tensor<3x3xf32>
  %p = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%padded, %w : tensor<1x4x10x10xf32>, tensor<3x3xf32>) outs(%f : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  %w2 = tensor.empty() : tensor<2x2xf32>
  %e3 = tensor.empty() : tensor<1x4x3x3xf32>
  %f3 = linalg.fill ins(%ninf : f32) outs(%e3 : tensor<1x4x3x3xf32>) -> tensor<1x4x3x3xf32>
  %q = linalg.pooling_nchw_max {dilations = dense<2> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%arg0, %w2 : tensor<1x4x8x8xf32>, tensor<2x2xf32>) outs(%f3 : tensor<1x4x3x3xf32>) -> tensor<1x4x3x3xf32>
  return %p, %q : tensor<1x4x4x4xf32>, tensor<1x4x3x3xf32>
}
