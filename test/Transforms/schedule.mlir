// The cases before the "ANNOTATED" line run the whole kernel stage on 32 cores; the ones after it carry
// hand-written grids so the barrier rules are exercised exactly; the ones after "ERRORS" fail.
// RUN: sed -e '/^\/\/ ANNOTATED/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=32},spyre-tile,spyre-allocate-scratchpad,spyre-schedule)' | filecheck %s
// RUN: sed -n -e '/^\/\/ ANNOTATED/,/^\/\/ ERRORS/p' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-schedule)' | filecheck %s --check-prefix=RULES
// RUN: sed -n -e '/^\/\/ ERRORS/,$p' %s | spyre-opt --split-input-file --verify-diagnostics -p 'builtin.module(spyre-select-kernels,spyre-schedule)'

// 1024^3 matmul: many K steps per core, so A/B are double-buffered; only func.return reads its result (the
// host reads outputs after every core ended): no barrier.
// CHECK-LABEL: func.func @matmul_1024
// CHECK: "spyre.matmul"
// CHECK-NOT: spyre.barrier
// CHECK-SAME: spyre.double_buffer = true, spyre.grid = array<i64: 2, 16, 1>
func.func @matmul_1024(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}

// -----

// 64x64 matmul: one tile per core, nothing to prefetch.
// CHECK-LABEL: func.func @matmul_64
// CHECK: "spyre.matmul"
// CHECK-NOT: spyre.barrier
// CHECK-SAME: spyre.double_buffer = false, spyre.grid = array<i64: 8, 1, 1>
func.func @matmul_64(%a: tensor<64x64x!spyre.dlf16>, %b: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %r : tensor<64x64x!spyre.dlf16>
}

// -----

// matmul [2,4,1] -> softmax [32] -> map [32] -> return: the matmul's blocks are not the softmax's rows (barrier);
// the softmax's rows stay on their cores for the map (no barrier); the map's result is returned (no barrier).
// (The matmul's result is returned too, so the softmax runs its own kernel, not the matmul's epilogue.)
// CHECK-LABEL: func.func @softmax_map
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.barrier = true
// CHECK: "spyre.softmax"
// CHECK-NOT: spyre.barrier
// CHECK-SAME: spyre.double_buffer = false, spyre.grid = array<i64: 32>
// CHECK: "spyre.map"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.double_buffer = false, spyre.grid = array<i64: 32>
func.func @softmax_map(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  %s = "spyre.softmax"(%r) {dim = -1 : i64, acc_type = f32} : (tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  %m = "spyre.map"(%s) ({
  ^bb0(%x: f32):
    %e = arith.mulf %x, %x : f32
    "spyre.yield"(%e) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r, %m : tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>
}

// -----

// A matmul feeding a map with a different grid ([32,1,1] vs [16]): barrier between them.
// CHECK-LABEL: func.func @matmul_map
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.barrier = true
// CHECK-SAME: spyre.grid = array<i64: 32, 1, 1>
// CHECK: "spyre.map"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.double_buffer = {{true|false}}, spyre.grid = array<i64: 16>
func.func @matmul_map(%x: tensor<1024x1024x!spyre.dlf16>, %w: tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  %g = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  return %g : tensor<1024x64x!spyre.dlf16>
}

// -----
// ANNOTATED

// An M-only matmul split [8,1,1] holds row block c on core c: a map over the same 8 row blocks reads it in place,
// and so does a following matmul's lhs with the same M split. Its rhs is read whole by every core: barrier. The
// last matmul's result is only returned: no barrier.
// RULES-LABEL: func.func @same_blocks
// RULES: %[[MM:.*]] = "spyre.matmul"
// RULES-NOT: spyre.barrier
// RULES-SAME: spyre.double_buffer = true
// RULES: %[[MAP:.*]] = "spyre.map"(%[[MM]])
// RULES: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.double_buffer = false, spyre.grid = array<i64: 8>,
// RULES: %[[RHS:.*]] = "spyre.map"
// RULES: spyre.barrier = true, spyre.double_buffer = false, spyre.grid = array<i64: 8>
// RULES: "spyre.matmul"(%[[MAP]], %[[RHS]])
// RULES-NOT: spyre.barrier
// RULES-SAME: spyre.double_buffer = false
func.func @same_blocks(%x: tensor<512x256x!spyre.dlf16>, %w: tensor<256x64x!spyre.dlf16>, %v: tensor<64x64x!spyre.dlf16>) -> tensor<512x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 8, 1, 1>, spyre.scratchpad = {a0 = 0 : i64, a1 = 8192 : i64, acc = 32768 : i64, b0 = 16384 : i64, b1 = 24576 : i64, out = 40960 : i64}} : (tensor<512x256x!spyre.dlf16>, tensor<256x64x!spyre.dlf16>) -> tensor<512x64x!spyre.dlf16>
  %g = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 8>, spyre.scratchpad = {in0 = 0 : i64, out0 = 8192 : i64}} : (tensor<512x64x!spyre.dlf16>) -> tensor<512x64x!spyre.dlf16>
  %v2 = "spyre.map"(%v) ({
  ^bb0(%a: f32):
    %t = arith.negf %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 8>, spyre.scratchpad = {in0 = 0 : i64, out0 = 1024 : i64}} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %h = "spyre.matmul"(%g, %v2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 8, 1, 1>, spyre.scratchpad = {a0 = 0 : i64, acc = 16384 : i64, b0 = 8192 : i64, out = 32768 : i64}} : (tensor<512x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<512x64x!spyre.dlf16>
  return %h : tensor<512x64x!spyre.dlf16>
}

// -----

// Ops on one core hand data to each other on core 0; a host region reading a result needs the barrier.
// RULES-LABEL: func.func @one_core_and_host
// RULES: "spyre.map"
// RULES: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.double_buffer = false, spyre.grid = array<i64: 1>,
// RULES: "spyre.cast"
// RULES-SAME: spyre.barrier = true, spyre.double_buffer = false
// RULES: "spyre.host"
// RULES-NEXT: "spyre.cast"
// RULES-NOT: spyre.double_buffer
// RULES: return
func.func @one_core_and_host(%x: tensor<8x64x!spyre.dlf16>) -> tensor<8x64xf32> {
  %g = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %t = arith.negf %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 1>, spyre.scratchpad = {in0 = 0 : i64, out0 = 1024 : i64}} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %c = "spyre.cast"(%g) {operandSegmentSizes = array<i32: 1, 0>, spyre.grid = array<i64: 1>, spyre.scratchpad = {in0 = 0 : i64, out0 = 1024 : i64}} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %h = "spyre.host"() ({
    %f = "spyre.cast"(%c) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64xf32>
    "spyre.yield"(%f) : (tensor<8x64xf32>) -> ()
  }) {reason = "test"} : () -> tensor<8x64xf32>
  return %h : tensor<8x64xf32>
}

// -----
// ERRORS

func.func @no_scratchpad(%x: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  // expected-error @+1 {{spyre-schedule: 'spyre.softmax' has no spyre.scratchpad: run spyre-allocate-scratchpad first}}
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 64>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %s : tensor<64x64x!spyre.dlf16>
}
