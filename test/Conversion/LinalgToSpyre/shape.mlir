// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// Attention's head split in the transformer example: expand_shape, then a [0, 2, 1, 3] transpose; the
// collapse back is a reshape too.
// CHECK-LABEL: func.func @heads
// CHECK: %[[E:.*]] = "spyre.reshape"(%arg0) : (tensor<16x64xf32>) -> tensor<1x16x4x16xf32>
// CHECK: %[[T:.*]] = "spyre.transpose"(%[[E]]) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<1x16x4x16xf32>) -> tensor<1x4x16x16xf32>
// CHECK: "spyre.reshape"(%[[T]]) : (tensor<1x4x16x16xf32>) -> tensor<4x16x16xf32>
// CHECK-NOT: tensor.
func.func @heads(%23: tensor<16x64xf32>) -> tensor<4x16x16xf32> {
  %expanded_11 = tensor.expand_shape %23 [[0, 1], [2, 3]] output_shape [1, 16, 4, 16] : tensor<16x64xf32> into tensor<1x16x4x16xf32>
  %24 = tensor.empty() : tensor<1x4x16x16xf32>
  %transposed_12 = linalg.transpose ins(%expanded_11 : tensor<1x16x4x16xf32>) outs(%24 : tensor<1x4x16x16xf32>) permutation = [0, 2, 1, 3]
  %collapsed_26 = tensor.collapse_shape %transposed_12 [[0, 1], [2], [3]] : tensor<1x4x16x16xf32> into tensor<4x16x16xf32>
  return %collapsed_26 : tensor<4x16x16xf32>
}

// -----

// rotate_half: static slices of the last dim and a tensor.concat; three inputs chain two binary concats.
// CHECK-LABEL: func.func @rotate_half
// CHECK-DAG: %[[HI:.*]] = "spyre.slice"(%arg0) {offsets = array<i64: 0, 0, 0, 8>, sizes = array<i64: 1, 4, 16, 8>, strides = array<i64: 1, 1, 1, 1>}
// CHECK-DAG: %[[LO:.*]] = "spyre.slice"(%arg0) {offsets = array<i64: 0, 0, 0, 0>, sizes = array<i64: 1, 4, 16, 8>, strides = array<i64: 1, 1, 1, 1>}
// CHECK: %[[C1:.*]] = "spyre.concat"(%[[HI]], %[[LO]]) {dim = 3 : i64} : (tensor<1x4x16x8xf32>, tensor<1x4x16x8xf32>) -> tensor<1x4x16x16xf32>
// CHECK: "spyre.concat"(%[[C1]], %[[HI]]) {dim = 3 : i64} : (tensor<1x4x16x16xf32>, tensor<1x4x16x8xf32>) -> tensor<1x4x16x24xf32>
func.func @rotate_half(%x: tensor<1x4x16x16xf32>) -> tensor<1x4x16x24xf32> {
  %hi = tensor.extract_slice %x[0, 0, 0, 8] [1, 4, 16, 8] [1, 1, 1, 1] : tensor<1x4x16x16xf32> to tensor<1x4x16x8xf32>
  %lo = tensor.extract_slice %x[0, 0, 0, 0] [1, 4, 16, 8] [1, 1, 1, 1] : tensor<1x4x16x16xf32> to tensor<1x4x16x8xf32>
  %c = tensor.concat dim(3) %hi, %lo, %hi : (tensor<1x4x16x8xf32>, tensor<1x4x16x8xf32>, tensor<1x4x16x8xf32>) -> tensor<1x4x16x24xf32>
  return %c : tensor<1x4x16x24xf32>
}

// -----

// A rank-reducing slice is a slice then a reshape; a dynamic one stays, with its reason.
// CHECK-LABEL: func.func @slices
// CHECK: %[[S:.*]] = "spyre.slice"(%arg0) {offsets = array<i64: 2, 0>, sizes = array<i64: 1, 32>, strides = array<i64: 1, 2>} : (tensor<8x64xf32>) -> tensor<1x32xf32>
// CHECK: "spyre.reshape"(%[[S]]) : (tensor<1x32xf32>) -> tensor<32xf32>
// CHECK: tensor.extract_slice %arg0[%arg1, 0] [1, 64] [1, 1]
// CHECK-SAME: spyre.unconverted = "dynamic tensor.extract_slice"
func.func @slices(%x: tensor<8x64xf32>, %i: index) -> (tensor<32xf32>, tensor<64xf32>) {
  %a = tensor.extract_slice %x[2, 0] [1, 32] [1, 2] : tensor<8x64xf32> to tensor<32xf32>
  %b = tensor.extract_slice %x[%i, 0] [1, 64] [1, 1] : tensor<8x64xf32> to tensor<64xf32>
  return %a, %b : tensor<32xf32>, tensor<64xf32>
}

// -----

// A pad that no conv folds is a spyre.pad; tensor.reshape with a static result is a reshape.
// CHECK-LABEL: func.func @pad_and_reshape
// CHECK: "spyre.pad"(%arg0) {high = array<i64: 0, 2>, low = array<i64: 1, 0>, value = -1.000000e+00 : f32} : (tensor<8x62xf32>) -> tensor<9x64xf32>
// CHECK: "spyre.reshape"(%arg1) : (tensor<4x4xf32>) -> tensor<16xf32>
func.func @pad_and_reshape(%x: tensor<8x62xf32>, %y: tensor<4x4xf32>) -> (tensor<9x64xf32>, tensor<16xf32>) {
  %v = arith.constant -1.0 : f32
  %p = tensor.pad %x low[1, 0] high[0, 2] {
  ^bb0(%a: index, %b: index):
    tensor.yield %v : f32
  } : tensor<8x62xf32> to tensor<9x64xf32>
  %shape = arith.constant dense<16> : tensor<1xi64>
  %r = tensor.reshape %y(%shape) : (tensor<4x4xf32>, tensor<1xi64>) -> tensor<16xf32>
  return %p, %r : tensor<9x64xf32>, tensor<16xf32>
}

// -----

// linalg.broadcast: adding only unit dims is a reshape; a real broadcast adds an identity map.
// A fill that no contraction folds is a spyre.map without inputs.
// CHECK-LABEL: func.func @broadcast_fill
// CHECK-DAG: "spyre.reshape"(%arg0) : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
// CHECK-DAG: %[[R:.*]] = "spyre.reshape"(%arg1) : (tensor<32xf32>) -> tensor<1x32x1x1xf32>
// CHECK-DAG: "spyre.map"(%[[R]]) ({
// CHECK-DAG: "spyre.map"() ({
// CHECK-DAG: arith.constant 2.500000e-01 : f32
// CHECK-NOT: linalg
func.func @broadcast_fill(%a: tensor<16xf32>, %b: tensor<32xf32>) -> (tensor<1x16x1x1xf32>, tensor<1x32x8x8xf32>, tensor<4x4xf32>) {
  %e1 = tensor.empty() : tensor<1x16x1x1xf32>
  %e2 = tensor.empty() : tensor<1x32x8x8xf32>
  %ba = linalg.broadcast ins(%a : tensor<16xf32>) outs(%e1 : tensor<1x16x1x1xf32>) dimensions = [0, 2, 3]
  %bb = linalg.broadcast ins(%b : tensor<32xf32>) outs(%e2 : tensor<1x32x8x8xf32>) dimensions = [0, 2, 3]
  %q = arith.constant 0.25 : f32
  %e3 = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%q : f32) outs(%e3 : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %ba, %bb, %f : tensor<1x16x1x1xf32>, tensor<1x32x8x8xf32>, tensor<4x4xf32>
}

// -----

// `z = zeros(4, 8); z[:, 1:7] = a` (slice_scatter into a constant, as torch-mlir emits it) is a zero pad.
// CHECK-LABEL: func.func @slice_scatter_into_zeros
// CHECK: "spyre.pad"(%arg0) {high = array<i64: 0, 1>, low = array<i64: 0, 1>, value = 0.000000e+00 : f32} : (tensor<4x6xf32>) -> tensor<4x8xf32>
func.func @slice_scatter_into_zeros(%arg0: tensor<4x6xf32>) -> tensor<4x8xf32> {
  %cst = arith.constant dense<0.000000e+00> : tensor<4x8xf32>
  %inserted_slice = tensor.insert_slice %arg0 into %cst[0, 1] [4, 6] [1, 1] : tensor<4x6xf32> into tensor<4x8xf32>
  return %inserted_slice : tensor<4x8xf32>
}

// -----

// insert_slices that fill a tensor.empty end to end along one dim are a concat (in offset order);
// an insert into a computed tensor has no spyre form.
// CHECK-LABEL: func.func @insert_slice_concat
// CHECK: %[[C:.*]] = "spyre.concat"(%arg1, %arg0) {dim = 0 : i64} : (tensor<2x8xf32>, tensor<3x8xf32>) -> tensor<5x8xf32>
// CHECK: tensor.insert_slice %arg1 into %arg2[1, 0] [2, 8] [1, 1]
// CHECK-SAME: spyre.unconverted = "tensor.insert_slice into a computed tensor (no spyre form)"
// CHECK: return %[[C]]
func.func @insert_slice_concat(%a: tensor<3x8xf32>, %b: tensor<2x8xf32>, %c: tensor<5x8xf32>) -> (tensor<5x8xf32>, tensor<5x8xf32>) {
  %e = tensor.empty() : tensor<5x8xf32>
  %0 = tensor.insert_slice %a into %e[2, 0] [3, 8] [1, 1] : tensor<3x8xf32> into tensor<5x8xf32>
  %1 = tensor.insert_slice %b into %0[0, 0] [2, 8] [1, 1] : tensor<2x8xf32> into tensor<5x8xf32>
  %2 = tensor.insert_slice %b into %c[1, 0] [2, 8] [1, 1] : tensor<2x8xf32> into tensor<5x8xf32>
  return %1, %2 : tensor<5x8xf32>, tensor<5x8xf32>
}
