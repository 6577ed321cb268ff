// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-siblings)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-siblings,spyre-divide-work{cores=4},spyre-tile,spyre-allocate-scratchpad,spyre-schedule)' | filecheck %s --check-prefix=PLAN

// An MLP's silu(gate) * up: the map is up's epilogue, and gate, of the same lhs and read only by that map, is up's
// `sibling`. Up's plan holds gate's B tiles, accumulator and finished tile (`g0`, `gacc`, `gout`) and no loaded
// block of gate's result (`epa`); gate has no scratchpad and no barrier after it. The down projection still loads
// its residual's blocks (`epa`).
// CHECK-LABEL: func.func @gated_mlp
// CHECK: %[[G:.*]] = "spyre.matmul"{{.*}}spyre.kernel = "sibling"
// CHECK: %[[GV:.*]] = "spyre.reshape"(%[[G]]) {spyre.kernel = "alias"}
// CHECK: %[[U:.*]] = "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: "spyre.map"(%[[GV]], %{{.*}})
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// PLAN-LABEL: func.func @gated_mlp
// PLAN: "spyre.matmul"
// PLAN-NOT: spyre.barrier
// PLAN-SAME: spyre.kernel = "sibling", spyre.scratchpad = {}
// PLAN: "spyre.matmul"
// PLAN-NOT: epa
// PLAN-SAME: spyre.scratchpad = {{{.*}}g0 = {{.*}}gacc = {{.*}}gout = {{.*}}}
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}epa = {{.*}}}
func.func @gated_mlp(%x: tensor<16x64x!spyre.dlf16>, %wg: tensor<64x128x!spyre.dlf16>, %wu: tensor<64x128x!spyre.dlf16>,
                     %res: tensor<16x64x!spyre.dlf16>, %wd: tensor<128x64x!spyre.dlf16>) -> tensor<16x64x!spyre.dlf16> {
  %g = "spyre.matmul"(%x, %wg) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %gv = "spyre.reshape"(%g) : (tensor<16x128x!spyre.dlf16>) -> tensor<1x16x128x!spyre.dlf16>
  %u = "spyre.matmul"(%x, %wu) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %uv = "spyre.reshape"(%u) : (tensor<16x128x!spyre.dlf16>) -> tensor<1x16x128x!spyre.dlf16>
  %h = "spyre.map"(%gv, %uv) ({
  ^bb0(%a: f32, %b: f32):
    %one = arith.constant 1.0 : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %d = arith.addf %e, %one : f32
    %s = arith.divf %one, %d : f32
    %m = arith.mulf %a, %s : f32
    %r = arith.mulf %m, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x16x128x!spyre.dlf16>, tensor<1x16x128x!spyre.dlf16>) -> tensor<1x16x128x!spyre.dlf16>
  %hv = "spyre.reshape"(%h) : (tensor<1x16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %o = "spyre.matmul"(%hv, %wd) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x128x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<16x64x!spyre.dlf16>
  %y = "spyre.map"(%res, %o) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<16x64x!spyre.dlf16>) -> tensor<16x64x!spyre.dlf16>
  %z = "spyre.map"(%y) ({
  ^bb0(%a: f32):
    %n = arith.negf %a : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<16x64x!spyre.dlf16>) -> tensor<16x64x!spyre.dlf16>
  return %z : tensor<16x64x!spyre.dlf16>
}

// -----

// No sibling: a gate of another lhs, a gate with a bias, a gate read by something else too (the return), and a
// gate whose weight is stored transposed. Each stays a kernel of its own, with a barrier after it, and the up
// matmul applying the map loads a block of its result (`epa`).
// CHECK-LABEL: func.func @not_siblings
// CHECK-NOT: "sibling"
// CHECK-COUNT-4: spyre.kernel = "epilogue"
// CHECK-NOT: "sibling"
// CHECK: return
// PLAN-LABEL: func.func @not_siblings
// PLAN-NOT: gacc
// PLAN: "spyre.matmul"{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "matmul"
// PLAN-NEXT: "spyre.matmul"{{.*}}epa =
// PLAN: "spyre.matmul"{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "matmul"
// PLAN-NEXT: "spyre.matmul"{{.*}}epa =
// PLAN: "spyre.matmul"{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "matmul"
// PLAN-NEXT: "spyre.matmul"{{.*}}epa =
// PLAN: "spyre.matmul"{{.*}}spyre.barrier = true{{.*}}spyre.kernel = "matmul"
// PLAN-NEXT: "spyre.matmul"{{.*}}epa =
// PLAN-NOT: gacc
// PLAN: return
func.func @not_siblings(%x: tensor<16x64x!spyre.dlf16>, %x2: tensor<16x64x!spyre.dlf16>, %w: tensor<64x128x!spyre.dlf16>,
                        %bias: tensor<128x!spyre.dlf16>, %wt: tensor<128x64x!spyre.dlf16>)
    -> (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) {
  %g1 = "spyre.matmul"(%x2, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %u1 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %h1 = "spyre.map"(%g1, %u1) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %g2 = "spyre.matmul"(%x, %w, %bias) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>, tensor<128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %u2 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %h2 = "spyre.map"(%g2, %u2) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %g3 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %u3 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %h3 = "spyre.map"(%g3, %u3) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %g4 = "spyre.matmul"(%x, %wt) {acc_type = f32, transpose_rhs = true, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %u4 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %h4 = "spyre.map"(%g4, %u4) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %z = "spyre.map"(%h1, %h2, %h3, %h4) ({
  ^bb0(%a: f32, %b: f32, %c: f32, %d: f32):
    %r = arith.addf %a, %b : f32
    %t = arith.addf %c, %d : f32
    %o = arith.addf %r, %t : f32
    "spyre.yield"(%o) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  return %z, %g3 : tensor<16x128x!spyre.dlf16>, tensor<16x128x!spyre.dlf16>
}

// -----

// A sibling is chosen only when the cost model finds the kernel computing both cheaper than the two apart. Granite's
// decode MLP (one row, 4096 -> 12800 on 32 cores, a K split): gate's B tiles beside up's leave room for a fifth of
// the columns per output tile, and every tile after the first loads at the mixed DRAM bandwidth while the one
// before is stored: 1.89M modeled cycles against 1.41M for two kernels. Gate stays a matmul of its own.
// CHECK-LABEL: func.func @decode_row
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: "spyre.map"
// CHECK: spyre.kernel = "epilogue"
// CHECK-NOT: "sibling"
func.func @decode_row(%x: tensor<1x4096x!spyre.dlf16>, %wg: tensor<4096x12800x!spyre.dlf16>,
                      %wu: tensor<4096x12800x!spyre.dlf16>, %wd: tensor<12800x4096x!spyre.dlf16>)
    -> tensor<1x4096x!spyre.dlf16> {
  %g = "spyre.matmul"(%x, %wg) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x4096x!spyre.dlf16>, tensor<4096x12800x!spyre.dlf16>) -> tensor<1x12800x!spyre.dlf16>
  %u = "spyre.matmul"(%x, %wu) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x4096x!spyre.dlf16>, tensor<4096x12800x!spyre.dlf16>) -> tensor<1x12800x!spyre.dlf16>
  %h = "spyre.map"(%g, %u) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.mulf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x12800x!spyre.dlf16>, tensor<1x12800x!spyre.dlf16>) -> tensor<1x12800x!spyre.dlf16>
  %o = "spyre.matmul"(%h, %wd) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x12800x!spyre.dlf16>, tensor<12800x4096x!spyre.dlf16>) -> tensor<1x4096x!spyre.dlf16>
  return %o : tensor<1x4096x!spyre.dlf16>
}
