// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-reduce-precision)' | filecheck %s --check-prefix=DLF16
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-reduce-precision{precision=fp8})' | filecheck %s --check-prefix=FP8
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-reduce-precision{precision=int8-weights})' | filecheck %s --check-prefix=INT8
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-reduce-precision{precision=fp32-reference})' | filecheck %s --check-prefix=F32
// RUN: not spyre-opt %s -p 'builtin.module(spyre-reduce-precision{precision=bf16})' 2>&1 | filecheck %s --check-prefix=BAD

// BAD: option 'precision' must be one of dlf16, fp8, int8-weights, fp32-reference, got 'bf16'

// A matmul with a bias, a bias map, softmax, rmsnorm, a host region reading a device value, and two results.
// Inputs and parameters are cast at their first device use (the bias once for both readers); device values
// are cast back before the host region and before func.return (once per value).

// DLF16-LABEL: func.func @graph
// DLF16-NEXT: %[[X:.*]] = "spyre.cast"(%arg0) {{.*}} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
// DLF16-NEXT: %[[W:.*]] = "spyre.cast"(%arg1) {{.*}} : (tensor<64x32xf32>) -> tensor<64x32x!spyre.dlf16>
// DLF16-NEXT: %[[B:.*]] = "spyre.cast"(%arg2) {{.*}} : (tensor<32xf32>) -> tensor<32x!spyre.dlf16>
// DLF16-NEXT: %[[MM:.*]] = "spyre.matmul"(%[[X]], %[[W]], %[[B]]) {acc_type = f32,
// DLF16-SAME: -> tensor<8x32x!spyre.dlf16>
// DLF16-NEXT: %[[MAP:.*]] = "spyre.map"(%[[MM]], %[[B]]) ({
// DLF16-NEXT: ^bb0(%{{.*}}: f32, %{{.*}}: f32):
// DLF16: (tensor<8x32x!spyre.dlf16>, tensor<32x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
// DLF16-NEXT: %[[SM:.*]] = "spyre.softmax"(%[[MAP]]) {acc_type = f32, dim = -1 : i64}
// DLF16-NEXT: %[[G:.*]] = "spyre.cast"(%arg3)
// DLF16-NEXT: %[[N:.*]] = "spyre.rmsnorm"(%[[SM]], %[[G]]) {acc_type = f32,
// DLF16-SAME: -> tensor<8x32x!spyre.dlf16>
// DLF16-NEXT: %[[BACK:.*]] = "spyre.cast"(%[[N]]) {{.*}} : (tensor<8x32x!spyre.dlf16>) -> tensor<8x32xf32>
// DLF16-NEXT: %[[H:.*]] = "spyre.host"() ({
// DLF16: linalg.copy ins(%[[BACK]] : tensor<8x32xf32>)
// DLF16: }) {reason = "test"} : () -> tensor<8x32xf32>
// DLF16-NEXT: %[[HIN:.*]] = "spyre.cast"(%[[H]]) {{.*}} : (tensor<8x32xf32>) -> tensor<8x32x!spyre.dlf16>
// DLF16-NEXT: %[[M2:.*]] = "spyre.map"(%[[HIN]], %[[N]])
// DLF16: %[[OUT:.*]] = "spyre.cast"(%[[M2]]) {{.*}} : (tensor<8x32x!spyre.dlf16>) -> tensor<8x32xf32>
// DLF16-NEXT: return %[[OUT]], %[[BACK]] : tensor<8x32xf32>, tensor<8x32xf32>

// fp8 / int8-weights: only the matmul weight changes: quantized per output channel (N, axis 1 of [K, N]), then
// read as dlf16 by the matmul; the bias and norm weight stay dlf16.
// FP8-LABEL: func.func @graph
// FP8-NEXT: %[[X:.*]] = "spyre.cast"(%arg0) {{.*}} -> tensor<8x64x!spyre.dlf16>
// FP8-NEXT: %[[Q:.*]] = "spyre.cast"(%arg1) {axis = 1 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<64x32xf32>) -> tensor<64x32xf8E4M3FN>
// FP8-NEXT: %[[W:.*]] = "spyre.cast"(%[[Q]]) {axis = 1 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<64x32xf8E4M3FN>) -> tensor<64x32x!spyre.dlf16>
// FP8-NEXT: %[[B:.*]] = "spyre.cast"(%arg2) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<32xf32>) -> tensor<32x!spyre.dlf16>
// FP8-NEXT: "spyre.matmul"(%[[X]], %[[W]], %[[B]]) {acc_type = f32,
// FP8: "spyre.softmax"({{.*}}) {acc_type = f32
// FP8: "spyre.cast"(%arg3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<32xf32>) -> tensor<32x!spyre.dlf16>
// FP8: "spyre.rmsnorm"
// FP8-SAME: acc_type = f32

// INT8-LABEL: func.func @graph
// INT8: %[[Q:.*]] = "spyre.cast"(%arg1) {axis = 1 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<64x32xf32>) -> tensor<64x32xi8>
// INT8-NEXT: %[[W:.*]] = "spyre.cast"(%[[Q]]) {axis = 1 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<64x32xi8>) -> tensor<64x32x!spyre.dlf16>
// INT8: "spyre.matmul"(%{{.*}}, %[[W]], %{{.*}}) {acc_type = f32,
// INT8: "spyre.cast"(%arg3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<32xf32>) -> tensor<32x!spyre.dlf16>

// fp32-reference: no casts at all; the SFU/PT ops still state their fp32 accumulation.
// F32-LABEL: func.func @graph
// F32-NOT: spyre.cast
// F32: "spyre.matmul"(%arg0, %arg1, %arg2) {acc_type = f32,
// F32-SAME: -> tensor<8x32xf32>
// F32: "spyre.softmax"
// F32-SAME: acc_type = f32
// F32: %[[N:.*]] = "spyre.rmsnorm"(%{{.*}}, %arg3) {acc_type = f32,
// F32: linalg.copy ins(%[[N]] : tensor<8x32xf32>)
// F32-NOT: spyre.cast
// F32: return
func.func @graph(%x: tensor<8x64xf32>, %w: tensor<64x32xf32> {spyre.param = "fc.weight"},
                 %b: tensor<32xf32> {spyre.param = "fc.bias"}, %g: tensor<32xf32> {spyre.param = "norm.weight"})
    -> (tensor<8x32xf32>, tensor<8x32xf32>) {
  %0 = "spyre.matmul"(%x, %w, %b) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<8x64xf32>, tensor<64x32xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %1 = "spyre.map"(%0, %b) ({
  ^bb0(%a: f32, %c: f32):
    %s = arith.addf %a, %c : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x32xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %2 = "spyre.softmax"(%1) {dim = -1 : i64} : (tensor<8x32xf32>) -> tensor<8x32xf32>
  %3 = "spyre.rmsnorm"(%2, %g) {epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<8x32xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %4 = "spyre.host"() ({
    %e = tensor.empty() : tensor<8x32xf32>
    %5 = linalg.copy ins(%3 : tensor<8x32xf32>) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
    "spyre.yield"(%5) : (tensor<8x32xf32>) -> ()
  }) {reason = "test"} : () -> tensor<8x32xf32>
  %6 = "spyre.map"(%4, %3) ({
  ^bb0(%a: f32, %c: f32):
    %s = arith.mulf %a, %c : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  return %6, %3 : tensor<8x32xf32>, tensor<8x32xf32>
}

// -----

// Weights as the ops read them: a transposed matmul rhs [N, K] is quantized along axis 0, a conv filter
// [F, C, KH, KW] along F (axis 0), a batch_matmul rhs [B, K, N] along its last dim.
// DLF16-LABEL: func.func @weights
// DLF16-NOT: scale_mode
// DLF16: return

// FP8-LABEL: func.func @weights
// FP8: "spyre.cast"(%arg1) {axis = 0 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<32x64xf32>) -> tensor<32x64xf8E4M3FN>
// FP8: "spyre.matmul"
// FP8-SAME: transpose_rhs = true
// FP8: "spyre.cast"(%arg3) {axis = 0 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<16x3x3x3xf32>) -> tensor<16x3x3x3xf8E4M3FN>
// FP8: "spyre.conv2d"
// FP8-SAME: acc_type = f32
// FP8: "spyre.cast"(%arg4) {axis = 2 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<4x16x8xf32>) -> tensor<4x16x8xf8E4M3FN>
// FP8: "spyre.batch_matmul"
// FP8-SAME: acc_type = f32

// INT8-LABEL: func.func @weights
// INT8: "spyre.cast"(%arg1) {axis = 0 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<32x64xf32>) -> tensor<32x64xi8>
// INT8: "spyre.cast"(%arg3) {axis = 0 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<16x3x3x3xf32>) -> tensor<16x3x3x3xi8>
// INT8: "spyre.cast"(%arg4) {axis = 2 : i64, {{.*}}scale_mode = "per-channel"} : (tensor<4x16x8xf32>) -> tensor<4x16x8xi8>
func.func @weights(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {spyre.param = "fc.weight"},
                   %img: tensor<1x3x8x8xf32>, %f: tensor<16x3x3x3xf32> {spyre.param = "conv.weight"},
                   %bw: tensor<4x16x8xf32> {spyre.param = "bmm.weight"}, %ba: tensor<4x8x16xf32>)
    -> (tensor<8x32xf32>, tensor<1x16x6x6xf32>, tensor<4x8x8xf32>) {
  %0 = "spyre.matmul"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
  %1 = "spyre.conv2d"(%img, %f) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x3x8x8xf32>, tensor<16x3x3x3xf32>) -> tensor<1x16x6x6xf32>
  %2 = "spyre.batch_matmul"(%ba, %bw) : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
  return %0, %1, %2 : tensor<8x32xf32>, tensor<1x16x6x6xf32>, tensor<4x8x8xf32>
}

// -----

// Integer tensors are never converted. A parameter read as an embedding table and as a matmul weight gets one
// cast per format: dlf16 for the gather, fp8 for the matmul. An activation matmul rhs is not quantized.
// DLF16-LABEL: func.func @indices
// DLF16: %[[T:.*]] = "spyre.cast"(%arg1) {{.*}} : (tensor<128x64xf32>) -> tensor<128x64x!spyre.dlf16>
// DLF16-NEXT: "spyre.gather"(%[[T]], %arg0) : (tensor<128x64x!spyre.dlf16>, tensor<1x8xi64>) -> tensor<1x8x64x!spyre.dlf16>
// DLF16: "spyre.matmul"(%{{.*}}, %[[T]])
// DLF16: "spyre.map"
// DLF16: (tensor<1x8xi64>) -> tensor<1x8xi1>
// DLF16-NOT: "spyre.cast"(%arg1)

// FP8-LABEL: func.func @indices
// FP8: %[[T:.*]] = "spyre.cast"(%arg1) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<128x64xf32>) -> tensor<128x64x!spyre.dlf16>
// FP8: "spyre.gather"(%[[T]], %arg0)
// FP8: %[[Q:.*]] = "spyre.cast"(%arg1) {axis = 0 : i64, {{.*}}} : (tensor<128x64xf32>) -> tensor<128x64xf8E4M3FN>
// FP8-NEXT: %[[W:.*]] = "spyre.cast"(%[[Q]])
// FP8-NEXT: "spyre.matmul"(%{{.*}}, %[[W]])
// FP8-NOT: f8E4M3FN
// FP8: "spyre.batch_matmul"
// FP8-SAME: (tensor<1x8x8x!spyre.dlf16>, tensor<1x8x8x!spyre.dlf16>)
func.func @indices(%ids: tensor<1x8xi64>, %table: tensor<128x64xf32> {spyre.param = "embed.weight"})
    -> (tensor<8x128xf32>, tensor<1x8xi1>, tensor<1x8x8xf32>) {
  %0 = "spyre.gather"(%table, %ids) : (tensor<128x64xf32>, tensor<1x8xi64>) -> tensor<1x8x64xf32>
  %1 = "spyre.reshape"(%0) : (tensor<1x8x64xf32>) -> tensor<8x64xf32>
  %2 = "spyre.matmul"(%1, %table) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = true} : (tensor<8x64xf32>, tensor<128x64xf32>) -> tensor<8x128xf32>
  %3 = "spyre.map"(%ids) ({
  ^bb0(%i: i64):
    %c0 = arith.constant 0 : i64
    %p = arith.cmpi sgt, %i, %c0 : i64
    "spyre.yield"(%p) : (i1) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x8xi64>) -> tensor<1x8xi1>
  %4 = "spyre.slice"(%0) {offsets = array<i64: 0, 0, 0>, sizes = array<i64: 1, 8, 8>, strides = array<i64: 1, 1, 1>} : (tensor<1x8x64xf32>) -> tensor<1x8x8xf32>
  %5 = "spyre.batch_matmul"(%4, %4) {transpose_rhs = true} : (tensor<1x8x8xf32>, tensor<1x8x8xf32>) -> tensor<1x8x8xf32>
  return %2, %3, %5 : tensor<8x128xf32>, tensor<1x8xi1>, tensor<1x8x8xf32>
}

// -----

// The model's own casts: f32 -> f16 -> f32 on the device becomes dlf16 -> dlf16 twice (identity casts, dropped),
// and the boundary cast back of the input's cast folds away: the result is the input itself. A map body written
// for f16 computes in f32 on a dlf16 tensor (arith.truncf of the f32 argument to keep the body's own math).
// DLF16-LABEL: func.func @model_casts
// DLF16: %[[X:.*]] = "spyre.cast"(%arg0) {{.*}} : (tensor<4x64xf32>) -> tensor<4x64x!spyre.dlf16>
// DLF16-NEXT: %[[M:.*]] = "spyre.map"(%[[X]]) ({
// DLF16-NEXT: ^bb0(%[[A:.*]]: f32):
// DLF16-NEXT: %[[T:.*]] = arith.truncf %[[A]] : f32 to f16
// DLF16-NEXT: %[[N:.*]] = arith.negf %[[T]] : f16
// DLF16-NEXT: %[[E:.*]] = arith.extf %[[N]] : f16 to f32
// DLF16-NEXT: "spyre.yield"(%[[E]]) : (f32) -> ()
// DLF16-NEXT: }) {{.*}} : (tensor<4x64x!spyre.dlf16>) -> tensor<4x64x!spyre.dlf16>
// DLF16-NEXT: %[[R:.*]] = "spyre.cast"(%[[M]]) {{.*}} : (tensor<4x64x!spyre.dlf16>) -> tensor<4x64xf16>
// DLF16-NEXT: return %arg0, %[[R]] : tensor<4x64xf32>, tensor<4x64xf16>
func.func @model_casts(%x: tensor<4x64xf32>) -> (tensor<4x64xf32>, tensor<4x64xf16>) {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x64xf32>) -> tensor<4x64xf16>
  %1 = "spyre.cast"(%0) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x64xf16>) -> tensor<4x64xf32>
  %2 = "spyre.map"(%0) ({
  ^bb0(%a: f16):
    %n = arith.negf %a : f16
    "spyre.yield"(%n) : (f16) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x64xf16>) -> tensor<4x64xf16>
  return %1, %2 : tensor<4x64xf32>, tensor<4x64xf16>
}

// -----

// Persistent state a device op computes and only device ops read (a KV cache) is held in the activation format:
// the argument and result of the state get its type, no cast in or out. A state the host computes (a counter)
// keeps its model type.
// DLF16-LABEL: func.func @state
// DLF16-SAME: %arg0: tensor<4x64xf32>, %arg1: tensor<4x64x!spyre.dlf16> {spyre.state = "cache"}
// DLF16-SAME: %arg2: tensor<1xf32> {spyre.state = "count"}
// DLF16-SAME: -> (tensor<4x64xf32>, tensor<4x64x!spyre.dlf16> {spyre.state = "cache"}, tensor<1xf32> {spyre.state = "count"})
// DLF16: %[[NEW:.*]] = "spyre.map"(%{{.*}}, %arg1)
// DLF16-NOT: "spyre.cast"(%arg1)
// DLF16: return %{{.*}}, %[[NEW]], %{{.*}} : tensor<4x64xf32>, tensor<4x64x!spyre.dlf16>, tensor<1xf32>
// F32-LABEL: func.func @state
// F32-SAME: %arg1: tensor<4x64xf32> {spyre.state = "cache"}
func.func @state(%x: tensor<4x64xf32>, %cache: tensor<4x64xf32> {spyre.state = "cache"},
                 %count: tensor<1xf32> {spyre.state = "count"})
    -> (tensor<4x64xf32>, tensor<4x64xf32> {spyre.state = "cache"}, tensor<1xf32> {spyre.state = "count"}) {
  %new = "spyre.map"(%x, %cache) ({
  ^bb0(%a: f32, %c: f32):
    %s = arith.addf %a, %c : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xf32>
  %y = "spyre.map"(%new) ({
  ^bb0(%a: f32):
    %s = arith.mulf %a, %a : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %next = "spyre.host"() ({
    %one = arith.constant dense<1.0> : tensor<1xf32>
    %c = arith.addf %count, %one : tensor<1xf32>
    "spyre.yield"(%c) : (tensor<1xf32>) -> ()
  }) {reason = "test"} : () -> tensor<1xf32>
  return %y, %new, %next : tensor<4x64xf32>, tensor<4x64xf32>, tensor<1xf32>
}
