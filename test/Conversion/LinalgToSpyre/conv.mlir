// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// The CNN example's stem (torch-mlir output): a zero tensor.pad folds into padding, strides carry over,
// the zero-filled init means no bias.
// CHECK-LABEL: func.func @stem
// CHECK: %[[C:.*]] = "spyre.conv2d"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 1 : i64,
// CHECK-SAME: padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 2, 2>}
// CHECK-SAME: (tensor<1x3x32x32xf32>, tensor<16x3x3x3xf32>) -> tensor<1x16x16x16xf32>
// CHECK-NEXT: return %[[C]]
// CHECK-NOT: tensor.pad
func.func @stem(%arg0: tensor<1x3x32x32xf32>, %arg1: tensor<16x3x3x3xf32>) -> tensor<1x16x16x16xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%arg14: index, %arg15: index, %arg16: index, %arg17: index):
    tensor.yield %cst : f32
  } : tensor<1x3x32x32xf32> to tensor<1x3x34x34xf32>
  %0 = tensor.empty() : tensor<1x16x16x16xf32>
  %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  %2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%padded, %arg1 : tensor<1x3x34x34xf32>, tensor<16x3x3x3xf32>) outs(%1 : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  return %2 : tensor<1x16x16x16xf32>
}

// -----

// Depthwise (groups == channels): the [C,KH,KW] filter is the collapsed [C,1,KH,KW] weight, read directly;
// the broadcast init is the bias.
// CHECK-LABEL: func.func @depthwise
// CHECK: %[[C:.*]] = "spyre.conv2d"(%arg0, %arg1, %arg2) {dilations = array<i64: 1, 1>, groups = 16 : i64,
// CHECK-SAME: padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>}
// CHECK-SAME: (tensor<1x16x16x16xf32>, tensor<16x1x3x3xf32>, tensor<16xf32>) -> tensor<1x16x16x16xf32>
// CHECK-NEXT: return %[[C]]
func.func @depthwise(%arg0: tensor<1x16x16x16xf32>, %arg1: tensor<16x1x3x3xf32>, %arg2: tensor<16xf32>) -> tensor<1x16x16x16xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %0 = tensor.empty() : tensor<1x16x16x16xf32>
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %cst : f32
  } : tensor<1x16x16x16xf32> to tensor<1x16x18x18xf32>
  %broadcasted = linalg.broadcast ins(%arg2 : tensor<16xf32>) outs(%0 : tensor<1x16x16x16xf32>) dimensions = [0, 2, 3]
  %collapsed = tensor.collapse_shape %arg1 [[0, 1], [2], [3]] : tensor<16x1x3x3xf32> into tensor<16x3x3xf32>
  %1 = linalg.depthwise_conv_2d_nchw_chw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%padded, %collapsed : tensor<1x16x18x18xf32>, tensor<16x3x3xf32>) outs(%broadcasted : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  return %1 : tensor<1x16x16x16xf32>
}

// -----

// groups = 2 (nn.Conv2d(4, 8, 3, padding=1, groups=2)): torch-mlir splits channels into [G, C/G]; the conv
// reads the 4-D tensors behind the expand_shapes and the result goes back to the 5-D form.
// CHECK-LABEL: func.func @grouped
// CHECK: %[[C:.*]] = "spyre.conv2d"(%arg0, %arg1) {dilations = array<i64: 1, 1>, groups = 2 : i64,
// CHECK-SAME: padding = array<i64: 1, 1, 1, 1>
// CHECK-SAME: (tensor<1x4x8x8xf32>, tensor<8x2x3x3xf32>) -> tensor<1x8x8x8xf32>
// CHECK-NEXT: return %[[C]]
func.func @grouped(%arg0: tensor<1x4x8x8xf32>, %arg1: tensor<8x2x3x3xf32>) -> tensor<1x8x8x8xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %cst : f32
  } : tensor<1x4x8x8xf32> to tensor<1x4x10x10xf32>
  %0 = tensor.empty() : tensor<1x8x8x8xf32>
  %expanded = tensor.expand_shape %padded [[0], [1, 2], [3], [4]] output_shape [1, 2, 2, 10, 10] : tensor<1x4x10x10xf32> into tensor<1x2x2x10x10xf32>
  %expanded_7 = tensor.expand_shape %arg1 [[0, 1], [2], [3], [4]] output_shape [2, 4, 2, 3, 3] : tensor<8x2x3x3xf32> into tensor<2x4x2x3x3xf32>
  %expanded_8 = tensor.expand_shape %0 [[0], [1, 2], [3], [4]] output_shape [1, 2, 4, 8, 8] : tensor<1x8x8x8xf32> into tensor<1x2x4x8x8xf32>
  %1 = linalg.fill ins(%cst : f32) outs(%expanded_8 : tensor<1x2x4x8x8xf32>) -> tensor<1x2x4x8x8xf32>
  %2 = linalg.conv_2d_ngchw_gfchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%expanded, %expanded_7 : tensor<1x2x2x10x10xf32>, tensor<2x4x2x3x3xf32>) outs(%1 : tensor<1x2x4x8x8xf32>) -> tensor<1x2x4x8x8xf32>
  %collapsed = tensor.collapse_shape %2 [[0], [1, 2], [3], [4]] : tensor<1x2x4x8x8xf32> into tensor<1x8x8x8xf32>
  return %collapsed : tensor<1x8x8x8xf32>
}

// -----

// A pad with a non-zero value cannot fold into the conv: it stays a spyre.pad in front of it.
// CHECK-LABEL: func.func @nonzero_pad
// CHECK: %[[P:.*]] = "spyre.pad"(%arg0) {high = array<i64: 0, 0, 1, 1>, low = array<i64: 0, 0, 1, 1>, value = 1.000000e+00 : f32}
// CHECK: "spyre.conv2d"(%[[P]], %arg1)
// CHECK-SAME: padding = array<i64: 0, 0, 0, 0>
func.func @nonzero_pad(%arg0: tensor<1x3x8x8xf32>, %arg1: tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %one = arith.constant 1.000000e+00 : f32
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %one : f32
  } : tensor<1x3x8x8xf32> to tensor<1x3x10x10xf32>
  %0 = tensor.empty() : tensor<1x4x8x8xf32>
  %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%padded, %arg1 : tensor<1x3x10x10xf32>, tensor<4x3x3x3xf32>) outs(%1 : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  return %2 : tensor<1x4x8x8xf32>
}

// -----

// nn.Conv2d(4, 8, 3, padding=1, groups=2) with a bias: the broadcast init is split into groups like the
// result; it is still the conv's bias.
// CHECK-LABEL: func.func @grouped_bias
// CHECK: %[[C:.*]] = "spyre.conv2d"(%arg0, %arg1, %arg2) {dilations = array<i64: 1, 1>, groups = 2 : i64,
// CHECK-SAME: (tensor<1x4x6x6xf32>, tensor<8x2x3x3xf32>, tensor<8xf32>) -> tensor<1x8x6x6xf32>
// CHECK-NEXT: return %[[C]]
func.func @grouped_bias(%arg0: tensor<1x4x6x6xf32>, %arg1: tensor<8x2x3x3xf32>, %arg2: tensor<8xf32>) -> tensor<1x8x6x6xf32> {
  %cst = arith.constant 0.000000e+00 : f32
  %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%a: index, %b: index, %c: index, %d: index):
    tensor.yield %cst : f32
  } : tensor<1x4x6x6xf32> to tensor<1x4x8x8xf32>
  %0 = tensor.empty() : tensor<1x8x6x6xf32>
  %broadcasted = linalg.broadcast ins(%arg2 : tensor<8xf32>) outs(%0 : tensor<1x8x6x6xf32>) dimensions = [0, 2, 3]
  %expanded = tensor.expand_shape %padded [[0], [1, 2], [3], [4]] output_shape [1, 2, 2, 8, 8] : tensor<1x4x8x8xf32> into tensor<1x2x2x8x8xf32>
  %expanded_0 = tensor.expand_shape %arg1 [[0, 1], [2], [3], [4]] output_shape [2, 4, 2, 3, 3] : tensor<8x2x3x3xf32> into tensor<2x4x2x3x3xf32>
  %expanded_1 = tensor.expand_shape %broadcasted [[0], [1, 2], [3], [4]] output_shape [1, 2, 4, 6, 6] : tensor<1x8x6x6xf32> into tensor<1x2x4x6x6xf32>
  %1 = linalg.conv_2d_ngchw_gfchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%expanded, %expanded_0 : tensor<1x2x2x8x8xf32>, tensor<2x4x2x3x3xf32>) outs(%expanded_1 : tensor<1x2x4x6x6xf32>) -> tensor<1x2x4x6x6xf32>
  %collapsed = tensor.collapse_shape %1 [[0], [1, 2], [3], [4]] : tensor<1x2x4x6x6xf32> into tensor<1x8x6x6xf32>
  return %collapsed : tensor<1x8x6x6xf32>
}
