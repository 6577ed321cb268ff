// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-siblings{cores=32},spyre-divide-work{cores=32},spyre-tile,spyre-norm-prologues)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-siblings{cores=32},spyre-divide-work{cores=32},spyre-tile,spyre-norm-prologues,spyre-allocate-scratchpad,spyre-schedule)' | filecheck %s --check-prefix=PLAN

// A pre-norm projection: the rmsnorm only the matmul reads (through a reshape) is its prologue. The matmul's K tile
// becomes K (whole rows: one K step), its plan gains the prologue's buffers (`nx` the norm's input rows, `nsq`
// the fp32 work tile, the row statistic `nms`, the weight `nweight`; no `nxf`, which only a layernorm needs), and
// the norm has no plan of its own (grid [1], no scratchpad, no barrier). The norm's input is read by the matmul's
// cores: its writer is followed by a barrier.
// CHECK-LABEL: func.func @rmsnorm_projection
// CHECK: "spyre.rmsnorm"{{.*}}spyre.grid = array<i64: 1>, spyre.kernel = "prologue", spyre.tile = array<i64: 128>
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul", spyre.tile = array<i64: {{[0-9]+}}, {{[0-9]+}}, 256>
// PLAN-LABEL: func.func @rmsnorm_projection
// PLAN: }) {{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "rows"
// PLAN: "spyre.rmsnorm"
// PLAN-NOT: spyre.barrier
// PLAN-SAME: spyre.kernel = "prologue", spyre.scratchpad = {}
// PLAN: "spyre.reshape"
// PLAN-NOT: spyre.barrier
// PLAN-SAME: spyre.kernel = "alias"
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}nms = {{.*}}nsq = {{.*}}nweight = {{.*}}nx = {{.*}}}
// PLAN-NOT: nxf
func.func @rmsnorm_projection(%x: tensor<1x128x256x!spyre.dlf16>, %g: tensor<256x!spyre.dlf16>,
                              %w: tensor<256x768x!spyre.dlf16>) -> tensor<128x768x!spyre.dlf16> {
  %xn = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %y = arith.negf %a : f32
    "spyre.yield"(%y) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x128x256x!spyre.dlf16>) -> tensor<1x128x256x!spyre.dlf16>
  %n = "spyre.rmsnorm"(%xn, %g) {acc_type = f32, epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<1x128x256x!spyre.dlf16>, tensor<256x!spyre.dlf16>) -> tensor<1x128x256x!spyre.dlf16>
  %r = "spyre.reshape"(%n) : (tensor<1x128x256x!spyre.dlf16>) -> tensor<128x256x!spyre.dlf16>
  %q = "spyre.matmul"(%r, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x256x!spyre.dlf16>, tensor<256x768x!spyre.dlf16>) -> tensor<128x768x!spyre.dlf16>
  return %q : tensor<128x768x!spyre.dlf16>
}

// -----

// A layernorm over the last dim with weight and bias: its two row statistics and both parameters are the
// prologue's buffers.
// CHECK-LABEL: func.func @layernorm_projection
// CHECK: "spyre.layernorm"{{.*}}spyre.kernel = "prologue"
// PLAN-LABEL: func.func @layernorm_projection
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}nbias = {{.*}}nmean = {{.*}}nsq = {{.*}}nvar = {{.*}}nweight = {{.*}}nx = {{.*}}nxf = {{.*}}}
func.func @layernorm_projection(%x: tensor<64x512x!spyre.dlf16>, %g: tensor<512x!spyre.dlf16>, %b: tensor<512x!spyre.dlf16>,
                                %w: tensor<512x512x!spyre.dlf16>) -> tensor<64x512x!spyre.dlf16> {
  %n = "spyre.layernorm"(%x, %g, %b) {operandSegmentSizes = array<i32: 1, 1, 1>, axis = 1 : i64, epsilon = 1.0e-05 : f32, acc_type = f32} : (tensor<64x512x!spyre.dlf16>, tensor<512x!spyre.dlf16>, tensor<512x!spyre.dlf16>) -> tensor<64x512x!spyre.dlf16>
  %q = "spyre.matmul"(%n, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x512x!spyre.dlf16>, tensor<512x512x!spyre.dlf16>) -> tensor<64x512x!spyre.dlf16>
  return %q : tensor<64x512x!spyre.dlf16>
}

// -----

// An MLP's gate and up read the same norm: the up matmul's kernel computes the gate beside it (spyre-siblings),
// from the same A tiles, so the norm is that kernel's prologue.
// CHECK-LABEL: func.func @mlp
// CHECK: "spyre.rmsnorm"{{.*}}spyre.kernel = "prologue"
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "sibling"
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
func.func @mlp(%x: tensor<128x256x!spyre.dlf16>, %g: tensor<256x!spyre.dlf16>, %wg: tensor<256x512x!spyre.dlf16>,
               %wu: tensor<256x512x!spyre.dlf16>) -> tensor<128x512x!spyre.dlf16> {
  %n = "spyre.rmsnorm"(%x, %g) {acc_type = f32, epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<128x256x!spyre.dlf16>, tensor<256x!spyre.dlf16>) -> tensor<128x256x!spyre.dlf16>
  %a = "spyre.matmul"(%n, %wg) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x256x!spyre.dlf16>, tensor<256x512x!spyre.dlf16>) -> tensor<128x512x!spyre.dlf16>
  %b = "spyre.matmul"(%n, %wu) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x256x!spyre.dlf16>, tensor<256x512x!spyre.dlf16>) -> tensor<128x512x!spyre.dlf16>
  %m = "spyre.map"(%b, %a) ({
  ^bb0(%u: f32, %v: f32):
    %s = arith.mulf %u, %v : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<128x512x!spyre.dlf16>, tensor<128x512x!spyre.dlf16>) -> tensor<128x512x!spyre.dlf16>
  %z = "spyre.map"(%m) ({
  ^bb0(%u: f32):
    %s = arith.negf %u : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<128x512x!spyre.dlf16>) -> tensor<128x512x!spyre.dlf16>
  return %z : tensor<128x512x!spyre.dlf16>
}

// -----

// Not prologues: a norm also returned (its result must be stored), a norm two matmuls read that do not share a
// kernel, a norm read as one matmul's rhs and another's lhs, and a layernorm over a dim that is not the last.
// CHECK-LABEL: func.func @not_prologues
// CHECK-NOT: "prologue"
// CHECK: return
func.func @not_prologues(%x: tensor<64x256x!spyre.dlf16>, %g: tensor<256x!spyre.dlf16>, %w: tensor<256x256x!spyre.dlf16>,
                         %w2: tensor<256x128x!spyre.dlf16>)
    -> (tensor<64x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>,
        tensor<256x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>) {
  %n1 = "spyre.rmsnorm"(%x, %g) {acc_type = f32, epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<64x256x!spyre.dlf16>, tensor<256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %m1 = "spyre.matmul"(%n1, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x256x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %n2 = "spyre.rmsnorm"(%m1, %g) {acc_type = f32, epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<64x256x!spyre.dlf16>, tensor<256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %m2 = "spyre.matmul"(%n2, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x256x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %m3 = "spyre.matmul"(%n2, %w2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x256x!spyre.dlf16>, tensor<256x128x!spyre.dlf16>) -> tensor<64x128x!spyre.dlf16>
  %n3 = "spyre.rmsnorm"(%w, %g) {acc_type = f32, epsilon = 1.0e-06 : f32, operandSegmentSizes = array<i32: 1, 1>} : (tensor<256x256x!spyre.dlf16>, tensor<256x!spyre.dlf16>) -> tensor<256x256x!spyre.dlf16>
  %m4 = "spyre.matmul"(%x, %n3) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x256x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %m6 = "spyre.matmul"(%n3, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<256x256x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>) -> tensor<256x256x!spyre.dlf16>
  %n4 = "spyre.layernorm"(%m4) {operandSegmentSizes = array<i32: 1, 0, 0>, axis = 0 : i64, epsilon = 1.0e-05 : f32, acc_type = f32} : (tensor<64x256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  %m5 = "spyre.matmul"(%n4, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x256x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>) -> tensor<64x256x!spyre.dlf16>
  return %n1, %m2, %m1, %m3, %m6, %m5 : tensor<64x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>, tensor<256x256x!spyre.dlf16>, tensor<64x256x!spyre.dlf16>
}
