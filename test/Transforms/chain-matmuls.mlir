// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=8},spyre-tile,spyre-chain-matmuls)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=8},spyre-tile,spyre-chain-matmuls,spyre-allocate-scratchpad,spyre-schedule)' | filecheck %s --check-prefix=PLAN
// P @ V's own plan in K steps of 32: not chained (its sums are not the one-step product).
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=8},spyre-tile{tile-k=32},spyre-chain-matmuls)' | filecheck %s --check-prefix=KSTEPS

// Attention: q @ k^T applies the mask add and the softmax (epilogues); P @ V reads the softmax's result through a
// reshape and is `chained`: q @ k^T's kernel multiplies each finished P tile by its head's V (`va`, `vb` by batch
// parity, `pacc`, `pout` in its plan) and stores the product. P @ V has no plan of its own (grid [1], no
// scratchpad, no barrier); q @ k^T is followed by the barrier P @ V's readers need, and V's writer by the barrier
// q @ k^T's cores need to read it.
// CHECK-LABEL: func.func @attention
// CHECK: "spyre.batch_matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: "spyre.softmax"{{.*}}spyre.kernel = "epilogue"
// CHECK: "spyre.batch_matmul"{{.*}}spyre.grid = array<i64: 1>, spyre.kernel = "chained", spyre.tile = array<i64: 256>
// KSTEPS-LABEL: func.func @attention
// KSTEPS-NOT: "chained"
// KSTEPS: return
// PLAN-LABEL: func.func @attention
// PLAN: }) {{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "rows"
// PLAN: "spyre.batch_matmul"
// PLAN-SAME: spyre.barrier = true
// PLAN-SAME: spyre.scratchpad = {{{.*}}pacc = {{.*}}pout = {{.*}}va = {{.*}}vb = {{.*}}}
// PLAN: "spyre.batch_matmul"
// PLAN-NOT: spyre.barrier
// PLAN-SAME: spyre.kernel = "chained", spyre.scratchpad = {}
func.func @attention(%q: tensor<4x64x64x!spyre.dlf16>, %k: tensor<4x64x64x!spyre.dlf16>, %v: tensor<4x64x64x!spyre.dlf16>,
                     %mask: tensor<1x64x64x!spyre.dlf16>) -> tensor<1x4x64x64x!spyre.dlf16> {
  %vn = "spyre.map"(%v) ({
  ^bb0(%a: f32):
    %x = arith.negf %a : f32
    "spyre.yield"(%x) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %s = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %m = "spyre.map"(%s, %mask) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x64x64x!spyre.dlf16>, tensor<1x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %p = "spyre.softmax"(%m) {acc_type = f32, dim = 2 : i64, safe = true} : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %pv = "spyre.reshape"(%p) : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %o = "spyre.batch_matmul"(%pv, %vn) {acc_type = f32} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %r = "spyre.reshape"(%o) : (tensor<4x64x64x!spyre.dlf16>) -> tensor<1x4x64x64x!spyre.dlf16>
  %n = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %x = arith.negf %a : f32
    "spyre.yield"(%x) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x4x64x64x!spyre.dlf16>) -> tensor<1x4x64x64x!spyre.dlf16>
  return %n : tensor<1x4x64x64x!spyre.dlf16>
}

// -----

// Not chained: P also returned (P must be stored), V computed after q @ k^T (its kernel could not read it), and
// V read transposed.
// CHECK-LABEL: func.func @not_chained
// CHECK-NOT: "chained"
// CHECK: return
func.func @not_chained(%q: tensor<4x64x64x!spyre.dlf16>, %k: tensor<4x64x64x!spyre.dlf16>, %v: tensor<4x64x64x!spyre.dlf16>)
    -> (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) {
  %s1 = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %p1 = "spyre.softmax"(%s1) {acc_type = f32, dim = 2 : i64} : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %o1 = "spyre.batch_matmul"(%p1, %v) {acc_type = f32} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %s2 = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %p2 = "spyre.softmax"(%s2) {acc_type = f32, dim = 2 : i64} : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %v2 = "spyre.batch_matmul"(%q, %v) {acc_type = f32} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %o2 = "spyre.batch_matmul"(%p2, %v2) {acc_type = f32} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %s3 = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %p3 = "spyre.softmax"(%s3) {acc_type = f32, dim = 2 : i64} : (tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  %o3 = "spyre.batch_matmul"(%p3, %v) {acc_type = f32, transpose_rhs = true} : (tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>) -> tensor<4x64x64x!spyre.dlf16>
  return %o1, %p1, %o2, %o3 : tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>, tensor<4x64x64x!spyre.dlf16>
}
