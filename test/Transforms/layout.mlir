// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-layout)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-reduce-precision,spyre-layout,canonicalize,cse)' | filecheck %s --check-prefix=PIPE

// Every device result is sticked on its innermost dim (casts included); the cast back to the model's type that
// feeds func.return keeps the plain type, so the signature still matches. Rank 0 has no stick dimension.
// CHECK-LABEL: func.func @encodings
// CHECK-SAME: (%arg0: tensor<8x64xf32>, %arg1: tensor<64xf32> {spyre.param = "b"}, %arg2: tensor<1x3x8x8xf32>, %arg3: tensor<f32>) -> (tensor<8x64xf32>, tensor<1x3x4x4xf32>)
// CHECK-NEXT: %[[X:.*]] = "spyre.cast"(%arg0) {{.*}} -> tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[B:.*]] = "spyre.cast"(%arg1) {{.*}} -> tensor<64x!spyre.dlf16, #spyre.stick<0 : i64>>
// CHECK-NEXT: %[[S:.*]] = "spyre.cast"(%arg3) {{.*}} -> tensor<!spyre.dlf16>
// CHECK-NEXT: "spyre.map"(%[[X]], %[[B]], %[[S]])
// CHECK: (tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x!spyre.dlf16, #spyre.stick<0 : i64>>, tensor<!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK: "spyre.pool2d"
// CHECK-SAME: -> tensor<1x3x4x4x!spyre.dlf16, #spyre.stick<3 : i64>>
// CHECK: %[[R0:.*]] = "spyre.cast"({{.*}}) {{.*}} : (tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<8x64xf32>
// CHECK-NEXT: %[[R1:.*]] = "spyre.cast"({{.*}}) {{.*}} : (tensor<1x3x4x4x!spyre.dlf16, #spyre.stick<3 : i64>>) -> tensor<1x3x4x4xf32>
// CHECK-NEXT: return %[[R0]], %[[R1]] : tensor<8x64xf32>, tensor<1x3x4x4xf32>
func.func @encodings(%x: tensor<8x64xf32>, %b: tensor<64xf32> {spyre.param = "b"}, %img: tensor<1x3x8x8xf32>, %s: tensor<f32>)
    -> (tensor<8x64xf32>, tensor<1x3x4x4xf32>) {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
  %1 = "spyre.cast"(%b) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64xf32>) -> tensor<64x!spyre.dlf16>
  %2 = "spyre.cast"(%s) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<f32>) -> tensor<!spyre.dlf16>
  %3 = "spyre.map"(%0, %1, %2) ({
  ^bb0(%a: f32, %c: f32, %d: f32):
    %t = arith.addf %a, %c : f32
    %u = arith.mulf %t, %d : f32
    "spyre.yield"(%u) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<8x64x!spyre.dlf16>, tensor<64x!spyre.dlf16>, tensor<!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %4 = "spyre.cast"(%img) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x3x8x8xf32>) -> tensor<1x3x8x8x!spyre.dlf16>
  %5 = "spyre.pool2d"(%4) {kind = "max", kernel = array<i64: 2, 2>} : (tensor<1x3x8x8x!spyre.dlf16>) -> tensor<1x3x4x4x!spyre.dlf16>
  %6 = "spyre.cast"(%3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64xf32>
  %7 = "spyre.cast"(%5) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x3x4x4x!spyre.dlf16>) -> tensor<1x3x4x4xf32>
  return %6, %7 : tensor<8x64xf32>, tensor<1x3x4x4xf32>
}

// -----

// A weight's transpose_rhs becomes an explicit restickify of the rhs, once per rhs value (spyre-select-kernels
// later marks it, here through the weight's dlf16 cast, to fold at compile time), unless the weight takes fewer
// sticks as it is: [10, 256] is 10 rows of 4 sticks, transposed 256 rows of one mostly empty stick, so that
// matmul keeps transpose_rhs and its kernel reads B transposed (MATMUL TRANS_B). So does a run-time rhs (here
// a batch_matmul's): reading it transposed saves a restickify kernel.
// CHECK-LABEL: func.func @restickify
// CHECK-NEXT: %[[X:.*]] = "spyre.cast"(%arg0)
// CHECK-NEXT: %[[W:.*]] = "spyre.cast"(%arg1) {{.*}} -> tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[V:.*]] = "spyre.cast"(%arg2) {{.*}} -> tensor<10x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[WT:.*]] = "spyre.transpose"(%[[W]]) {permutation = array<i64: 1, 0>, restickify = true}
// CHECK-SAME: (tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x128x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[M0:.*]] = "spyre.matmul"(%[[X]], %[[WT]]) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} :
// CHECK-SAME: (tensor<8x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x128x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<8x128x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[M1:.*]] = "spyre.matmul"(%[[X]], %[[WT]]) {operandSegmentSizes = array<i32: 1, 1, 0>} :
// CHECK-NEXT: "spyre.matmul"(%[[X]], %[[V]]) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} :
// CHECK-SAME: tensor<10x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<8x10x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[A:.*]] = "spyre.reshape"(%[[M0]])
// CHECK-NEXT: "spyre.batch_matmul"(%[[A]], %[[A]]) {acc_type = f32, transpose_rhs = true} :
// CHECK-NOT: restickify
// CHECK: return
func.func @restickify(%x: tensor<8x64xf32>, %w: tensor<128x64xf32> {spyre.param = "fc.weight"},
                      %v: tensor<10x64xf32> {spyre.param = "head.weight"})
    -> (tensor<8x128xf32>, tensor<8x128xf32>, tensor<8x10xf32>, tensor<2x4x4xf32>) {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
  %1 = "spyre.cast"(%w) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<128x64xf32>) -> tensor<128x64x!spyre.dlf16>
  %v1 = "spyre.cast"(%v) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<10x64xf32>) -> tensor<10x64x!spyre.dlf16>
  %2 = "spyre.matmul"(%0, %1) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<8x128x!spyre.dlf16>
  %3 = "spyre.matmul"(%0, %1) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<8x128x!spyre.dlf16>
  %h = "spyre.matmul"(%0, %v1) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64x!spyre.dlf16>, tensor<10x64x!spyre.dlf16>) -> tensor<8x10x!spyre.dlf16>
  %4 = "spyre.reshape"(%2) : (tensor<8x128x!spyre.dlf16>) -> tensor<2x4x128x!spyre.dlf16>
  %5 = "spyre.batch_matmul"(%4, %4) {acc_type = f32, transpose_rhs = true} : (tensor<2x4x128x!spyre.dlf16>, tensor<2x4x128x!spyre.dlf16>) -> tensor<2x4x4x!spyre.dlf16>
  %6 = "spyre.cast"(%2) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x128x!spyre.dlf16>) -> tensor<8x128xf32>
  %7 = "spyre.cast"(%3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x128x!spyre.dlf16>) -> tensor<8x128xf32>
  %hc = "spyre.cast"(%h) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x10x!spyre.dlf16>) -> tensor<8x10xf32>
  %8 = "spyre.cast"(%5) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<2x4x4x!spyre.dlf16>) -> tensor<2x4x4xf32>
  return %6, %7, %hc, %8 : tensor<8x128xf32>, tensor<8x128xf32>, tensor<8x10xf32>, tensor<2x4x4xf32>
}

// -----

// q @ k^T with k^T a swap of k's last two dims behind a reshape of the batch dims: the batch_matmul reads k
// itself transposed (transpose_rhs, MATMUL TRANS_B) and the swap goes, so no restickify runs.
// CHECK-LABEL: func.func @attention_scores
// CHECK-NEXT: %[[K:.*]] = "spyre.reshape"(%arg1) : (tensor<1x4x128x64x!spyre.dlf16>) -> tensor<4x128x64x!spyre.dlf16, #spyre.stick<2 : i64>>
// CHECK-NEXT: "spyre.batch_matmul"(%arg0, %[[K]]) {acc_type = f32, transpose_rhs = true}
// CHECK-NOT: spyre.transpose
// CHECK: return
func.func @attention_scores(%q: tensor<4x128x64x!spyre.dlf16>, %k: tensor<1x4x128x64x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16> {
  %t = "spyre.transpose"(%k) {permutation = array<i64: 0, 1, 3, 2>} : (tensor<1x4x128x64x!spyre.dlf16>) -> tensor<1x4x64x128x!spyre.dlf16>
  %r = "spyre.reshape"(%t) : (tensor<1x4x64x128x!spyre.dlf16>) -> tensor<4x64x128x!spyre.dlf16>
  %s = "spyre.batch_matmul"(%q, %r) {acc_type = f32} : (tensor<4x128x64x!spyre.dlf16>, tensor<4x64x128x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16>
  return %s : tensor<4x128x128x!spyre.dlf16>
}

// -----

// Attention's K^T after the head split, permutation [0, 2, 3, 1], moves the innermost dim into the middle: it
// becomes a transpose that keeps the innermost dim followed by a restickify swap of the last two dims.
// CHECK-LABEL: func.func @key_transpose
// CHECK-NEXT: %[[R:.*]] = "spyre.transpose"(%arg0) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16x!spyre.dlf16>) -> tensor<2x4x8x16x!spyre.dlf16, #spyre.stick<3 : i64>>
// CHECK-NEXT: %[[T:.*]] = "spyre.transpose"(%[[R]]) {permutation = array<i64: 0, 1, 3, 2>, restickify = true} : (tensor<2x4x8x16x!spyre.dlf16, #spyre.stick<3 : i64>>) -> tensor<2x4x16x8x!spyre.dlf16>
// CHECK-NEXT: "spyre.transpose"(%arg0) {permutation = array<i64: 0, 2, 1, 3>}
// CHECK-NEXT: "spyre.transpose"(%arg0) {permutation = array<i64: 3, 2, 0, 1>}
func.func @key_transpose(%k: tensor<2x8x4x16x!spyre.dlf16>) -> (tensor<2x4x16x8x!spyre.dlf16>, tensor<2x4x8x16x!spyre.dlf16>, tensor<16x4x2x8x!spyre.dlf16>) {
  %0 = "spyre.transpose"(%k) {permutation = array<i64: 0, 2, 3, 1>} : (tensor<2x8x4x16x!spyre.dlf16>) -> tensor<2x4x16x8x!spyre.dlf16>
  %1 = "spyre.transpose"(%k) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16x!spyre.dlf16>) -> tensor<2x4x8x16x!spyre.dlf16>
  %2 = "spyre.transpose"(%k) {permutation = array<i64: 3, 2, 0, 1>} : (tensor<2x8x4x16x!spyre.dlf16>) -> tensor<16x4x2x8x!spyre.dlf16>
  return %0, %1, %2 : tensor<2x4x16x8x!spyre.dlf16>, tensor<2x4x8x16x!spyre.dlf16>, tensor<16x4x2x8x!spyre.dlf16>
}

// -----

// fp32-reference IR has no boundary casts: a device result read by func.return or by a host region keeps its
// plain type (the model's); the others are sticked. A parameter argument used directly is read as it is (a
// [16, 64] f32 weight is 32 sticks so, 64 transposed). Host regions and their results are not device tensors.
// CHECK-LABEL: func.func @boundary
// CHECK-NEXT: %[[M:.*]] = "spyre.matmul"(%arg0, %arg1) {{.*}}transpose_rhs = true{{.*}} -> tensor<8x16xf32>
// CHECK-NEXT: %[[S:.*]] = "spyre.softmax"(%[[M]]) {{.*}} -> tensor<8x16xf32, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[N:.*]] = "spyre.map"(%[[S]])
// CHECK: -> tensor<8x16xf32>
// CHECK-NEXT: %[[H:.*]] = "spyre.host"() ({
// CHECK: linalg.copy ins(%[[N]] : tensor<8x16xf32>)
// CHECK: }) {reason = "test"} : () -> tensor<8x16xf32>
// CHECK-NEXT: return %[[M]], %[[H]] : tensor<8x16xf32>, tensor<8x16xf32>
func.func @boundary(%x: tensor<8x64xf32>, %w: tensor<16x64xf32> {spyre.param = "fc.weight"}) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64xf32>, tensor<16x64xf32>) -> tensor<8x16xf32>
  %1 = "spyre.softmax"(%0) {acc_type = f32, dim = 1 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %2 = "spyre.map"(%1) ({
  ^bb0(%a: f32):
    %n = arith.negf %a : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %3 = "spyre.host"() ({
    %e = tensor.empty() : tensor<8x16xf32>
    %c = linalg.copy ins(%2 : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
    "spyre.yield"(%c) : (tensor<8x16xf32>) -> ()
  }) {reason = "test"} : () -> tensor<8x16xf32>
  return %0, %3 : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// The graph stage's pipeline order: reduce-precision's boundary casts produce and consume the model's types,
// layout sticks everything in between; the [10, 64] weight (fewer sticks as it is than transposed) stays
// [N, K] for the matmul to read transposed.
// PIPE-LABEL: func.func @pipeline
// PIPE-SAME: -> tensor<4x10xf32>
// PIPE-NEXT: %[[X:.*]] = "spyre.cast"(%arg0) {{.*}} : (tensor<4x64xf32>) -> tensor<4x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// PIPE-NEXT: %[[W:.*]] = "spyre.cast"(%arg1) {{.*}} : (tensor<10x64xf32>) -> tensor<10x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// PIPE-NEXT: %[[B:.*]] = "spyre.cast"(%arg2) {{.*}} : (tensor<10xf32>) -> tensor<10x!spyre.dlf16, #spyre.stick<0 : i64>>
// PIPE-NEXT: %[[M:.*]] = "spyre.matmul"(%[[X]], %[[W]], %[[B]]) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true}
// PIPE-SAME: -> tensor<4x10x!spyre.dlf16, #spyre.stick<1 : i64>>
// PIPE-NEXT: %[[S:.*]] = "spyre.softmax"(%[[M]]) {acc_type = f32, dim = 1 : i64}
// PIPE-NEXT: %[[R:.*]] = "spyre.cast"(%[[S]]) {{.*}} : (tensor<4x10x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<4x10xf32>
// PIPE-NEXT: return %[[R]] : tensor<4x10xf32>
func.func @pipeline(%x: tensor<4x64xf32>, %w: tensor<10x64xf32> {spyre.param = "fc.weight"}, %b: tensor<10xf32> {spyre.param = "fc.bias"}) -> tensor<4x10xf32> {
  %0 = "spyre.matmul"(%x, %w, %b) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true} : (tensor<4x64xf32>, tensor<10x64xf32>, tensor<10xf32>) -> tensor<4x10xf32>
  %1 = "spyre.softmax"(%0) {dim = 1 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  return %1 : tensor<4x10xf32>
}
