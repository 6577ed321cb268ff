// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-fuse-maps)' | filecheck %s

// F.silu(g) * u as torch-mlir emits it (sigmoid, times g, times u) becomes one map over g and u: g is read
// once, the producers' bodies come first, then the consumer's.
// CHECK-LABEL: func.func @silu_mul
// CHECK-NEXT: %[[R:.*]] = "spyre.map"(%arg0, %arg1) ({
// CHECK-NEXT: ^bb0(%[[G:.*]]: f32, %[[U:.*]]: f32):
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.0
// CHECK-NEXT: %[[N:.*]] = arith.negf %[[G]]
// CHECK-NEXT: %[[E:.*]] = math.exp %[[N]]
// CHECK-NEXT: %[[D:.*]] = arith.addf %[[E]], %[[ONE]]
// CHECK-NEXT: %[[S:.*]] = arith.divf %[[ONE]], %[[D]]
// CHECK-NEXT: %[[M:.*]] = arith.mulf %[[G]], %[[S]]
// CHECK-NEXT: %[[P:.*]] = arith.mulf %[[M]], %[[U]]
// CHECK-NEXT: "spyre.yield"(%[[P]])
// CHECK-NEXT: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
// CHECK-NEXT: return %[[R]]
func.func @silu_mul(%g: tensor<8x64xf32>, %u: tensor<8x64xf32>) -> tensor<8x64xf32> {
  %s = "spyre.map"(%g) ({
  ^bb0(%a: f32):
    %one = arith.constant 1.0 : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %d = arith.addf %e, %one : f32
    %r = arith.divf %one, %d : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  %m = "spyre.map"(%g, %s) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  %p = "spyre.map"(%m, %u) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  return %p : tensor<8x64xf32>
}

// -----

// A map whose result another op also reads is not recomputed: both maps stay.
// CHECK-LABEL: func.func @two_readers
// CHECK: %[[E:.*]] = "spyre.map"(%arg0)
// CHECK: math.exp
// CHECK: %[[A:.*]] = "spyre.map"(%[[E]], %arg1)
// CHECK: return %[[A]], %[[E]]
func.func @two_readers(%x: tensor<8x64xf32>, %y: tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<8x64xf32>) {
  %e = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %r = math.exp %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  %s = "spyre.map"(%e, %y) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  return %s, %e : tensor<8x64xf32>, tensor<8x64xf32>
}

// -----

// A broadcast producer is merged when it is cheap to recompute per element of the larger result (the
// all-masked-row test of scaled_dot_product_attention: a compare of a row minimum), not when it is not (exp).
// The product of the same shape merges too, reading the [1, 64] exponentials and the [8, 1] minimum itself.
// CHECK-LABEL: func.func @broadcast
// CHECK-NEXT: %[[E:.*]] = "spyre.map"(%arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: math.exp
// CHECK: %[[R:.*]] = "spyre.map"(%arg0, %arg2, %[[E]]) ({
// CHECK-NEXT: ^bb0(%[[MIN:.*]]: f32, %[[V:.*]]: f32, %[[X:.*]]: f32):
// CHECK-NEXT: %[[P:.*]] = arith.mulf %[[X]], %[[V]]
// CHECK-NEXT: %[[B:.*]] = arith.fptoui %[[MIN]] : f32 to i1
// CHECK-NEXT: %[[S:.*]] = arith.select %[[B]], %[[V]], %[[P]]
// CHECK-NEXT: "spyre.yield"(%[[S]])
// CHECK-NEXT: }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<8x1xf32>, tensor<8x64xf32>, tensor<1x64xf32>) -> tensor<8x64xf32>
// CHECK-NEXT: return %[[R]]
func.func @broadcast(%min: tensor<8x1xf32>, %c: tensor<1x64xf32>, %v: tensor<8x64xf32>) -> tensor<8x64xf32> {
  %m = "spyre.map"(%min) ({
  ^bb0(%a: f32):
    %r = arith.fptoui %a : f32 to i1
    "spyre.yield"(%r) : (i1) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x1xf32>) -> tensor<8x1xi1>
  %e = "spyre.map"(%c) ({
  ^bb0(%a: f32):
    %r = math.exp %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x64xf32>) -> tensor<1x64xf32>
  %x = "spyre.map"(%e, %v) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  %s = "spyre.map"(%m, %v, %x) ({
  ^bb0(%a: i1, %b: f32, %d: f32):
    %r = arith.select %a, %b, %d : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<8x1xi1>, tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  return %s : tensor<8x64xf32>
}

// -----

// A map of a parameter is known at compile time (spyre-fold-constants computes it): merged into a map of a
// model input it would run on every call. Nor are maps in host regions touched.
// CHECK-LABEL: func.func @compile_time
// CHECK: %[[W:.*]] = "spyre.map"(%arg1)
// CHECK: %[[R:.*]] = "spyre.map"(%arg0, %[[W]])
// CHECK: return %[[R]]
func.func @compile_time(%x: tensor<8x64xf32>, %w: tensor<64xf32> {spyre.param = "w"}) -> tensor<8x64xf32> {
  %e = "spyre.map"(%w) ({
  ^bb0(%a: f32):
    %r = math.exp %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<64xf32>) -> tensor<64xf32>
  %s = "spyre.map"(%x, %e) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  return %s : tensor<8x64xf32>
}

// -----

// Merged, these would read five inputs; a map streams at most four.
// CHECK-LABEL: func.func @too_many_inputs
// CHECK: %[[A:.*]] = "spyre.map"(%arg0, %arg1, %arg2)
// CHECK: %[[B:.*]] = "spyre.map"(%[[A]], %arg3, %arg4)
// CHECK: return %[[B]]
func.func @too_many_inputs(%a: tensor<64xf32>, %b: tensor<64xf32>, %c: tensor<64xf32>, %d: tensor<64xf32>,
                           %e: tensor<64xf32>) -> tensor<64xf32> {
  %0 = "spyre.map"(%a, %b, %c) ({
  ^bb0(%x: f32, %y: f32, %z: f32):
    %s = arith.addf %x, %y : f32
    %r = arith.mulf %s, %z : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  %1 = "spyre.map"(%0, %d, %e) ({
  ^bb0(%x: f32, %y: f32, %z: f32):
    %s = arith.addf %x, %y : f32
    %r = arith.subf %s, %z : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %1 : tensor<64xf32>
}

// -----

// A chain of compares and selects on masks (i1 intermediates) merges into one map over the input: masks are
// 0.0 / 1.0 on the SFU inside one body as between maps.
// CHECK-LABEL: func.func @masks
// CHECK-NEXT: %[[R:.*]] = "spyre.map"(%arg0) ({
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32):
// CHECK: arith.cmpf ogt, %[[X]]
// CHECK: arith.select
// CHECK-NEXT: "spyre.yield"
// CHECK-NEXT: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x64xf32>) -> tensor<4x64xf32>
// CHECK-NEXT: return %[[R]]
func.func @masks(%x: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %0 = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.0 : f32
    %r = arith.cmpf ogt, %a, %z : f32
    "spyre.yield"(%r) : (i1) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x64xf32>) -> tensor<4x64xi1>
  %1 = "spyre.map"(%0, %x) ({
  ^bb0(%m: i1, %a: f32):
    %z = arith.constant 0.0 : f32
    %r = arith.select %m, %a, %z : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x64xi1>, tensor<4x64xf32>) -> tensor<4x64xf32>
  return %1 : tensor<4x64xf32>
}

// -----

// scaled_dot_product_attention's scales of q and k (through reshapes) move to the product, after its reshape,
// and merge there with the mask add: (c q) @ (c k) = c c (q @ k).
// CHECK-LABEL: func.func @sdpa_scales
// CHECK-NEXT: %[[Q:.*]] = "spyre.reshape"(%arg0)
// CHECK-NEXT: %[[K:.*]] = "spyre.reshape"(%arg1)
// CHECK-NEXT: %[[S:.*]] = "spyre.batch_matmul"(%[[Q]], %[[K]])
// CHECK-NEXT: %[[V:.*]] = "spyre.reshape"(%[[S]])
// CHECK-NEXT: %[[R:.*]] = "spyre.map"(%[[V]], %arg2) ({
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %[[M:.*]]: f32):
// CHECK-NEXT: %[[C1:.*]] = arith.constant 1.250000e-01
// CHECK-NEXT: %[[A:.*]] = arith.mulf %[[C1]], %[[X]]
// CHECK-NEXT: %[[C2:.*]] = arith.constant 5.000000e-01
// CHECK-NEXT: %[[B:.*]] = arith.mulf %[[A]], %[[C2]]
// CHECK-NEXT: %[[D:.*]] = arith.addf %[[B]], %[[M]]
// CHECK-NEXT: "spyre.yield"(%[[D]])
// CHECK: return %[[R]]
func.func @sdpa_scales(%q: tensor<1x4x16x64xf32>, %kt: tensor<1x4x64x16xf32>, %mask: tensor<16x16xf32>) -> tensor<1x4x16x16xf32> {
  %qs = "spyre.map"(%q) ({
  ^bb0(%a: f32):
    %c = arith.constant 0.5 : f32
    %r = arith.mulf %a, %c : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x4x16x64xf32>) -> tensor<1x4x16x64xf32>
  %ks = "spyre.map"(%kt) ({
  ^bb0(%a: f32):
    %c = arith.constant 0.125 : f32
    %r = arith.mulf %c, %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x4x64x16xf32>) -> tensor<1x4x64x16xf32>
  %q3 = "spyre.reshape"(%qs) : (tensor<1x4x16x64xf32>) -> tensor<4x16x64xf32>
  %k3 = "spyre.reshape"(%ks) : (tensor<1x4x64x16xf32>) -> tensor<4x64x16xf32>
  %s = "spyre.batch_matmul"(%q3, %k3) : (tensor<4x16x64xf32>, tensor<4x64x16xf32>) -> tensor<4x16x16xf32>
  %s4 = "spyre.reshape"(%s) : (tensor<4x16x16xf32>) -> tensor<1x4x16x16xf32>
  %r = "spyre.map"(%s4, %mask) ({
  ^bb0(%a: f32, %b: f32):
    %t = arith.addf %a, %b : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x4x16x16xf32>, tensor<16x16xf32>) -> tensor<1x4x16x16xf32>
  return %r : tensor<1x4x16x16xf32>
}

// -----

// A matmul with a bias does not commute with the scale ((c x) @ w + b is not c (x @ w + b)): it stays.
// CHECK-LABEL: func.func @scale_before_bias
// CHECK-NEXT: %[[S:.*]] = "spyre.map"(%arg0)
// CHECK: %[[M:.*]] = "spyre.matmul"(%[[S]], %arg1, %arg2)
// CHECK-NEXT: return %[[M]]
func.func @scale_before_bias(%x: tensor<8x64xf32>, %w: tensor<64x64xf32>, %b: tensor<64xf32>) -> tensor<8x64xf32> {
  %xs = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %c = arith.constant 0.5 : f32
    %r = arith.mulf %a, %c : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  %m = "spyre.matmul"(%xs, %w, %b) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<8x64xf32>, tensor<64x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  return %m : tensor<8x64xf32>
}

// -----

// A scale computed in f16 rounds to f16 before the product: on the f32 product it would not (and its body reads
// f16), so it stays.
// CHECK-LABEL: func.func @f16_scale
// CHECK-NEXT: %[[S:.*]] = "spyre.map"(%arg0)
// CHECK-NEXT: ^bb0(%{{.*}}: f16):
// CHECK: %[[M:.*]] = "spyre.matmul"(%[[S]], %arg1)
// CHECK-NEXT: return %[[M]]
func.func @f16_scale(%x: tensor<8x64xf16>, %w: tensor<64x64xf16>) -> tensor<8x64xf32> {
  %xs = "spyre.map"(%x) ({
  ^bb0(%a: f16):
    %c = arith.constant 0.5 : f16
    %r = arith.mulf %a, %c : f16
    "spyre.yield"(%r) : (f16) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf16>) -> tensor<8x64xf16>
  %m = "spyre.matmul"(%xs, %w) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x64xf16>, tensor<64x64xf16>) -> tensor<8x64xf32>
  return %m : tensor<8x64xf32>
}
