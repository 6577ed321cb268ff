// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-fuse)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-fuse,spyre-select-kernels,spyre-divide-work{cores=32},spyre-tile,spyre-allocate-scratchpad)' | filecheck %s --check-prefix=KERNEL

// A model input cast to dlf16 for a matmul lhs and the cast of its result back to f32 fold into the matmul:
// it reads the f32 input (converted on the scratchpad) and writes f32 rounded to dlf16 first. The weight's
// cast and restickify stay (compile-time values: the emitter converts them).
// CHECK-LABEL: func.func @linear
// CHECK-NEXT: %[[W:.*]] = "spyre.cast"(%arg1)
// CHECK-NEXT: %[[T:.*]] = "spyre.transpose"(%[[W]])
// CHECK-NEXT: %[[MM:.*]] = "spyre.matmul"(%arg0, %[[T]])
// CHECK-SAME: spyre.convert_operands = {lhs = !spyre.dlf16}, spyre.convert_result = !spyre.dlf16
// CHECK-SAME: (tensor<256x512xf32>, tensor<512x128x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<256x128xf32>
// CHECK-NEXT: return %[[MM]] : tensor<256x128xf32>
// The fused op keeps the unfused op's grid and K tile (the fp32 accumulation order), with fp32 A tiles, their
// DLFloat16 copy `pa`, and the rounded `out` tile widened into `outf`.
// KERNEL-LABEL: func.func @linear
// KERNEL: "spyre.matmul"
// KERNEL-SAME: spyre.grid = array<i64: [[GM:[0-9]+]], [[GN:[0-9]+]], 1>
// KERNEL-SAME: spyre.scratchpad = {a0 = {{.*}}outf = {{.*}}pa = {{.*}}}
func.func @linear(%x: tensor<256x512xf32>, %w: tensor<128x512xf32> {spyre.param = "w"}) -> tensor<256x128xf32> {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<256x512xf32>) -> tensor<256x512x!spyre.dlf16, #spyre.stick<1 : i64>>
  %1 = "spyre.cast"(%w) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<128x512xf32>) -> tensor<128x512x!spyre.dlf16, #spyre.stick<1 : i64>>
  %2 = "spyre.transpose"(%1) {permutation = array<i64: 1, 0>, restickify = true, spyre.const_fold = true} : (tensor<128x512x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<512x128x!spyre.dlf16, #spyre.stick<1 : i64>>
  %3 = "spyre.matmul"(%0, %2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<256x512x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<512x128x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<256x128x!spyre.dlf16, #spyre.stick<1 : i64>>
  %4 = "spyre.cast"(%3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<256x128x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<256x128xf32>
  return %4 : tensor<256x128xf32>
}

// -----

// Both operands of a batch_matmul are model inputs: both casts fold.
// CHECK-LABEL: func.func @bmm
// CHECK-NEXT: %[[R:.*]] = "spyre.batch_matmul"(%arg0, %arg1)
// CHECK-SAME: spyre.convert_operands = {lhs = !spyre.dlf16, rhs = !spyre.dlf16}, spyre.convert_result = !spyre.dlf16
// CHECK-SAME: (tensor<4x64x128xf32>, tensor<4x128x64xf32>) -> tensor<4x64x64xf32>
// CHECK-NEXT: return %[[R]]
func.func @bmm(%a: tensor<4x64x128xf32>, %b: tensor<4x128x64xf32>) -> tensor<4x64x64xf32> {
  %0 = "spyre.cast"(%a) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x64x128xf32>) -> tensor<4x64x128x!spyre.dlf16, #spyre.stick<2 : i64>>
  %1 = "spyre.cast"(%b) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x128x64xf32>) -> tensor<4x128x64x!spyre.dlf16, #spyre.stick<2 : i64>>
  %2 = "spyre.batch_matmul"(%0, %1) {acc_type = f32} : (tensor<4x64x128x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<4x128x64x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<4x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>
  %3 = "spyre.cast"(%2) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<4x64x64xf32>
  return %3 : tensor<4x64x64xf32>
}

// -----

// A model input cast to dlf16 for a conv2d folds into it: the kernel loads f32 patches and converts them on the
// scratchpad (`pa`); the filters stay dlf16 (no `pb`).
// CHECK-LABEL: func.func @conv_input
// CHECK-NEXT: %[[W:.*]] = "spyre.cast"(%arg1)
// CHECK-NEXT: %[[C:.*]] = "spyre.conv2d"(%arg0, %[[W]])
// CHECK-SAME: spyre.convert_operands = {input = !spyre.dlf16}
// CHECK-SAME: (tensor<1x3x16x16xf32>, tensor<8x3x3x3x!spyre.dlf16, #spyre.stick<3 : i64>>)
// KERNEL-LABEL: func.func @conv_input
// KERNEL: "spyre.conv2d"
// KERNEL-SAME: pa = {{[0-9]+}} : i64}
func.func @conv_input(%x: tensor<1x3x16x16xf32>, %w: tensor<8x3x3x3xf32> {spyre.param = "w"}) -> tensor<1x8x16x16x!spyre.dlf16, #spyre.stick<3 : i64>> {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x3x16x16xf32>) -> tensor<1x3x16x16x!spyre.dlf16, #spyre.stick<3 : i64>>
  %1 = "spyre.cast"(%w) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x3x3x3xf32>) -> tensor<8x3x3x3x!spyre.dlf16, #spyre.stick<3 : i64>>
  %2 = "spyre.conv2d"(%0, %1) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>} : (tensor<1x3x16x16x!spyre.dlf16, #spyre.stick<3 : i64>>, tensor<8x3x3x3x!spyre.dlf16, #spyre.stick<3 : i64>>) -> tensor<1x8x16x16x!spyre.dlf16, #spyre.stick<3 : i64>>
  return %2 : tensor<1x8x16x16x!spyre.dlf16, #spyre.stick<3 : i64>>
}

// -----

// Nothing folds when a cast has another user (the input's dlf16 copy is read twice, the result is read by a
// map too), or when the result cast is not a widening.
// CHECK-LABEL: func.func @shared
// CHECK-NEXT: %[[X:.*]] = "spyre.cast"(%arg0)
// CHECK-NEXT: %[[MM:.*]] = "spyre.matmul"(%[[X]], %[[X]])
// CHECK-NOT: spyre.convert
// CHECK-SAME: -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: "spyre.map"
// CHECK: %[[B:.*]] = "spyre.cast"(%[[MM]])
// CHECK: %[[MM2:.*]] = "spyre.matmul"
// CHECK-NOT: spyre.convert_result
// CHECK-SAME: -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
// CHECK-NEXT: "spyre.cast"(%[[MM2]]) {{.*}} -> tensor<64x64xf8E4M3FN>
func.func @shared(%x: tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64xf8E4M3FN>) {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64xf32>) -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %1 = "spyre.matmul"(%0, %0) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %2 = "spyre.map"(%1) ({
  ^bb0(%a: f32):
    %t = arith.addf %a, %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %3 = "spyre.cast"(%1) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x64xf32>
  %4 = "spyre.matmul"(%2, %2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %5 = "spyre.cast"(%4) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<64x64xf8E4M3FN>
  return %3, %2, %5 : tensor<64x64xf32>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64xf8E4M3FN>
}

// -----

// The result cast may read the matmul through reshapes, each its value's only reader (a Linear's [B*S, N]
// result viewed as [B, S, N]): the cast folds, the reshapes carry the widened values, the one before the
// return in the returned type, the ones before it in their own layout. A reshape the map also reads stops it.
// CHECK-LABEL: func.func @through_reshapes
// CHECK: %[[MM:.*]] = "spyre.matmul"
// CHECK-SAME: spyre.convert_result = !spyre.dlf16
// CHECK-SAME: -> tensor<128x64xf32, #spyre.stick<1 : i64>>
// CHECK-NEXT: %[[R1:.*]] = "spyre.reshape"(%[[MM]]) : (tensor<128x64xf32, #spyre.stick<1 : i64>>) -> tensor<2x64x64xf32, #spyre.stick<2 : i64>>
// CHECK-NEXT: %[[R2:.*]] = "spyre.reshape"(%[[R1]]) : (tensor<2x64x64xf32, #spyre.stick<2 : i64>>) -> tensor<1x2x64x64xf32>
// CHECK: %[[MM2:.*]] = "spyre.matmul"
// CHECK-NOT: spyre.convert_result
// CHECK: "spyre.cast"
// CHECK: return %[[R2]]
func.func @through_reshapes(%x: tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>, %w: tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>)
    -> (tensor<1x2x64x64xf32>, tensor<2x64x64xf32>, tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>) {
  %0 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %1 = "spyre.reshape"(%0) : (tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>
  %2 = "spyre.reshape"(%1) : (tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<1x2x64x64x!spyre.dlf16, #spyre.stick<3 : i64>>
  %3 = "spyre.cast"(%2) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x64x64x!spyre.dlf16, #spyre.stick<3 : i64>>) -> tensor<1x2x64x64xf32>
  %4 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>, tensor<64x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>
  %5 = "spyre.reshape"(%4) : (tensor<128x64x!spyre.dlf16, #spyre.stick<1 : i64>>) -> tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>
  %6 = "spyre.cast"(%5) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<2x64x64xf32>
  %7 = "spyre.map"(%5) ({
  ^bb0(%a: f32):
    %t = arith.addf %a, %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>
  return %3, %6, %7 : tensor<1x2x64x64xf32>, tensor<2x64x64xf32>, tensor<2x64x64x!spyre.dlf16, #spyre.stick<2 : i64>>
}

// -----

// A model input that only SFU work reads - a norm and a residual add, as at a decoder block's start - is read
// by them in f32: its cast goes (no conversion kernel, no dlf16 copy in device memory).
// CHECK-LABEL: func.func @sfu_readers
// CHECK-NOT: "spyre.cast"
// CHECK: "spyre.rmsnorm"(%arg0, %arg1)
// CHECK: "spyre.map"(%arg0, %{{.*}})
// With a third reader the f32 reads would move more bytes than the cast's round trip: the cast stays.
// CHECK-LABEL: func.func @three_readers
// CHECK: %[[C:.*]] = "spyre.cast"(%arg0)
// CHECK: "spyre.rmsnorm"(%[[C]], %arg1)
func.func @sfu_readers(%x: tensor<1x128x256xf32>, %w: tensor<256x!spyre.dlf16, #spyre.stick<0 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>> {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x128x256xf32>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  %1 = "spyre.rmsnorm"(%0, %w) {acc_type = f32, epsilon = 9.99999997E-7 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<256x!spyre.dlf16, #spyre.stick<0 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  %2 = "spyre.map"(%0, %1) ({
  ^bb0(%a: f32, %b: f32):
    %t = arith.addf %a, %b : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  return %2 : tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
}
func.func @three_readers(%x: tensor<1x128x256xf32>, %w: tensor<256x!spyre.dlf16, #spyre.stick<0 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>> {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1x128x256xf32>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  %1 = "spyre.rmsnorm"(%0, %w) {acc_type = f32, epsilon = 9.99999997E-7 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<256x!spyre.dlf16, #spyre.stick<0 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  %2 = "spyre.map"(%0, %1, %0) ({
  ^bb0(%a: f32, %b: f32, %c: f32):
    %t = arith.addf %a, %b : f32
    %u = arith.addf %t, %c : f32
    "spyre.yield"(%u) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>, tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>) -> tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
  return %2 : tensor<1x128x256x!spyre.dlf16, #spyre.stick<2 : i64>>
}
