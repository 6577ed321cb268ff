// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels)' | filecheck %s
// A target whose scratchpad is too small for the conv's working tiles: the conv goes to the host.
// RUN: sed -e '/scratchpad_usable_bytes/,/^value/ s/^value = .*/value = 4096/' %S/../../spyre_mlir/targets/spyre.toml > %t.toml
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels{target=%t.toml})' | filecheck %s --check-prefix=SMALL
// RUN: not spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels{target=%t.missing.toml})' 2>&1 | filecheck %s --check-prefix=NO-TARGET
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=4},spyre-tile,spyre-allocate-scratchpad,spyre-schedule)' | filecheck %s --check-prefix=PLAN
// NO-TARGET: error: spyre-select-kernels: {{.*}}missing.toml: target file not found

// A linear layer: the weight's cast and restickify are computed while compiling; the matmul and the map run on
// the device, each with its kernel.
// CHECK-LABEL: func.func @linear
// CHECK: "spyre.cast"(%arg0) {{{.*}}spyre.kernel = "rows"}
// CHECK: "spyre.cast"(%arg1) {{{.*}}spyre.const_fold = true}
// CHECK: "spyre.transpose"{{.*}}spyre.const_fold = true
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: "spyre.map"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "rows"}
// CHECK-NOT: spyre.on_host
func.func @linear(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {spyre.param = "fc.weight"}) -> tensor<8x32x!spyre.dlf16> {
  %0 = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
  %1 = "spyre.cast"(%w) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<32x64xf32>) -> tensor<32x64x!spyre.dlf16>
  %2 = "spyre.transpose"(%1) {permutation = array<i64: 1, 0>, restickify = true} : (tensor<32x64x!spyre.dlf16>) -> tensor<64x32x!spyre.dlf16>
  %3 = "spyre.matmul"(%0, %2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x64x!spyre.dlf16>, tensor<64x32x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
  %4 = "spyre.map"(%3) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.0 : f32
    %m = arith.maximumf %a, %z : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x32x!spyre.dlf16>) -> tensor<8x32x!spyre.dlf16>
  return %4 : tensor<8x32x!spyre.dlf16>
}

// -----

// Data movement: each form gets the kernel that moves it, and what none can move stays on the host.
// CHECK-LABEL: func.func @movement
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.transpose"{{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.transpose"{{.*}}spyre.kernel = "restick"
// CHECK: "spyre.slice"{{.*}}spyre.kernel = "select-cols"
// An f32 slice below a stick: selection matmuls would round it, DMA moves whole sticks.
// CHECK: "spyre.slice"{{.*}}spyre.on_host = "no device kernel for spyre.slice on f32"
// CHECK: "spyre.gather"{{.*}}spyre.on_host = "no device kernel for spyre.gather on f32, i64"
func.func @movement(%x: tensor<8x64x!spyre.dlf16>, %y: tensor<8x64xf32>, %t: tensor<128x64xf32>, %ids: tensor<1x8xi64>)
    -> (tensor<2x4x64x!spyre.dlf16>, tensor<4x2x64x!spyre.dlf16>, tensor<2x64x4x!spyre.dlf16>, tensor<8x16x!spyre.dlf16>, tensor<8x16xf32>, tensor<1x8x64xf32>) {
  %0 = "spyre.reshape"(%x) : (tensor<8x64x!spyre.dlf16>) -> tensor<2x4x64x!spyre.dlf16>
  %1 = "spyre.transpose"(%0) {permutation = array<i64: 1, 0, 2>} : (tensor<2x4x64x!spyre.dlf16>) -> tensor<4x2x64x!spyre.dlf16>
  %2 = "spyre.transpose"(%0) {permutation = array<i64: 0, 2, 1>} : (tensor<2x4x64x!spyre.dlf16>) -> tensor<2x64x4x!spyre.dlf16>
  %3 = "spyre.slice"(%x) {offsets = array<i64: 0, 16>, sizes = array<i64: 8, 16>, strides = array<i64: 1, 1>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x16x!spyre.dlf16>
  %4 = "spyre.slice"(%y) {offsets = array<i64: 0, 16>, sizes = array<i64: 8, 16>, strides = array<i64: 1, 1>} : (tensor<8x64xf32>) -> tensor<8x16xf32>
  %5 = "spyre.gather"(%t, %ids) : (tensor<128x64xf32>, tensor<1x8xi64>) -> tensor<1x8x64xf32>
  return %0, %1, %2, %3, %4, %5 : tensor<2x4x64x!spyre.dlf16>, tensor<4x2x64x!spyre.dlf16>, tensor<2x64x4x!spyre.dlf16>, tensor<8x16x!spyre.dlf16>, tensor<8x16xf32>, tensor<1x8x64xf32>
}

// -----

// A reshape that splits whole sticks of the innermost dim into rows (attention's [.., 768] -> [.., 12, 64] head
// split on dlf16) has its operand's bytes: an alias, when device ops read it. Returned, it would need a copy
// into a buffer of its own shape, so there it keeps a device kernel. A split into pieces that are not whole
// sticks is no alias: it is selection matmuls over rows of lcm(piece, stick) elements where those divide the
// rows (heads of 16: [64, 16] matrices, which fit where [256, 16] ones over whole rows would not; pieces of 24:
// [192, 24]), else over whole rows (pieces of 24 in rows of 2400), whose matrices do not fit here.
// CHECK-LABEL: func.func @stick_split
// CHECK: %[[S:.*]] = "spyre.reshape"(%arg0) {spyre.kernel = "alias"} : (tensor<16x256x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
// CHECK: "spyre.map"(%[[S]])
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "select-cols"{{.*}} -> tensor<16x2x128x!spyre.dlf16>
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "select-cols"{{.*}} -> tensor<16x16x16x!spyre.dlf16>
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "select-cols"{{.*}} -> tensor<512x32x24x!spyre.dlf16>
// CHECK: "spyre.reshape"{{.*}}spyre.on_host = "no device kernel for spyre.reshape on !spyre.dlf16"{{.*}} -> tensor<64x100x24x!spyre.dlf16>
func.func @stick_split(%x: tensor<16x256x!spyre.dlf16>, %y: tensor<512x768x!spyre.dlf16>, %z: tensor<64x2400x!spyre.dlf16>) -> (tensor<16x4x64x!spyre.dlf16>, tensor<16x2x128x!spyre.dlf16>, tensor<16x16x16x!spyre.dlf16>, tensor<512x32x24x!spyre.dlf16>, tensor<64x100x24x!spyre.dlf16>) {
  %0 = "spyre.reshape"(%x) : (tensor<16x256x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  %1 = "spyre.map"(%0) ({
  ^bb0(%a: f32):
    %n = arith.negf %a : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<16x4x64x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  %2 = "spyre.reshape"(%x) : (tensor<16x256x!spyre.dlf16>) -> tensor<16x2x128x!spyre.dlf16>
  %3 = "spyre.reshape"(%x) : (tensor<16x256x!spyre.dlf16>) -> tensor<16x16x16x!spyre.dlf16>
  %4 = "spyre.reshape"(%y) : (tensor<512x768x!spyre.dlf16>) -> tensor<512x32x24x!spyre.dlf16>
  %5 = "spyre.reshape"(%z) : (tensor<64x2400x!spyre.dlf16>) -> tensor<64x100x24x!spyre.dlf16>
  return %1, %2, %3, %4, %5 : tensor<16x4x64x!spyre.dlf16>, tensor<16x2x128x!spyre.dlf16>, tensor<16x16x16x!spyre.dlf16>, tensor<512x32x24x!spyre.dlf16>, tensor<64x100x24x!spyre.dlf16>
}

// -----

// A conv2d runs on the PT array only with its weights known while compiling (its kernel is built from them);
// with a weight that is an activation it runs on the host. On a small scratchpad its working tiles do not fit.
// CHECK-LABEL: func.func @conv
// CHECK: "spyre.conv2d"{{.*}}spyre.kernel = "conv2d"
// CHECK: "spyre.conv2d"{{.*}}spyre.on_host = "conv2d weights computed at run time
// SMALL-LABEL: func.func @conv
// SMALL: "spyre.conv2d"{{.*}}spyre.on_host = "no conv2d tile fits the scratchpad"
// SMALL: "spyre.conv2d"{{.*}}spyre.on_host = "conv2d weights computed at run time
func.func @conv(%img: tensor<1x8x32x32x!spyre.dlf16>, %f: tensor<16x8x3x3x!spyre.dlf16> {spyre.param = "conv.weight"}, %g: tensor<16x8x3x3x!spyre.dlf16>)
    -> (tensor<1x16x30x30x!spyre.dlf16>, tensor<1x16x30x30x!spyre.dlf16>) {
  %0 = "spyre.conv2d"(%img, %f) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x32x32x!spyre.dlf16>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x30x30x!spyre.dlf16>
  %1 = "spyre.conv2d"(%img, %g) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x32x32x!spyre.dlf16>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x30x30x!spyre.dlf16>
  return %0, %1 : tensor<1x16x30x30x!spyre.dlf16>, tensor<1x16x30x30x!spyre.dlf16>
}

// -----

// Position ids from literals (a host region reading only constants) are computed while compiling; the
// quantizing cast of an activation has no device kernel.
// CHECK-LABEL: func.func @compile_time
// CHECK: "spyre.host"
// CHECK: {reason = "int64 index math", spyre.const_fold = true}
// CHECK: "spyre.cast"{{.*}}spyre.on_host
func.func @compile_time(%x: tensor<4x64xf32>) -> (tensor<16xi64>, tensor<4x64xi8>) {
  %e = tensor.empty() : tensor<16xi64>
  %h = "spyre.host"() ({
    %c = arith.constant dense<3> : tensor<16xi64>
    "spyre.yield"(%c) : (tensor<16xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<16xi64>
  %q = "spyre.cast"(%x) {scale_mode = "per-tensor", operandSegmentSizes = array<i32: 1, 0>} : (tensor<4x64xf32>) -> tensor<4x64xi8>
  return %h, %q : tensor<16xi64>, tensor<4x64xi8>
}

// -----

// A map that is a matmul's only reader, read by device ops, with at most one fp32 temporary: the matmul's
// kernel applies it before its stores ("epilogue"). Returned, the same map runs on its own ("rows").
// CHECK-LABEL: func.func @epilogue
// CHECK: "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "rows"}
func.func @epilogue(%x: tensor<8x64x!spyre.dlf16>, %w: tensor<64x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> {
  %0 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %1 = "spyre.map"(%0) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %2 = "spyre.map"(%1) ({
  ^bb0(%a: f32):
    %n = arith.negf %a : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %2 : tensor<8x64x!spyre.dlf16>
}

// -----

// Attention scores: a softmax over the last dim of a batch_matmul's result, after the mask add the matmul applies,
// is applied by the matmul kernel too ("epilogue"), on whole rows: its grid does not split N or K, its tile
// holds all 128 columns, and its plan has the row statistics (`smax`, `ssum`, `slive` for a safe softmax). A
// softmax of scores the function also returns runs its own kernel ("rows").
// CHECK-LABEL: func.func @softmax_epilogue
// CHECK: "spyre.batch_matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.softmax"{{.*}}spyre.kernel = "epilogue"
// CHECK: "spyre.softmax"{{.*}}spyre.kernel = "rows"
// PLAN-LABEL: func.func @softmax_epilogue
// PLAN: "spyre.batch_matmul"
// PLAN-SAME: spyre.grid = array<i64: {{[0-9]+}}, {{[0-9]+}}, 1, 1>
// PLAN-SAME: slive = {{[0-9]+}} : i64, smax = {{[0-9]+}} : i64, ssum = {{[0-9]+}} : i64
// PLAN-SAME: spyre.tile = array<i64: 1, {{[0-9]+}}, 128, {{[0-9]+}}>
// PLAN: "spyre.softmax"{{.*}}spyre.kernel = "epilogue", spyre.scratchpad = {}, spyre.scratchpad_bytes = 0
func.func @softmax_epilogue(%q: tensor<4x128x64x!spyre.dlf16>, %k: tensor<4x128x64x!spyre.dlf16>, %mask: tensor<1x128x128xf32>)
    -> (tensor<4x128x64x!spyre.dlf16>, tensor<4x128x128x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>) {
  %s = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x128x64x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16>
  %m = "spyre.map"(%s, %mask) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x128x128x!spyre.dlf16>, tensor<1x128x128xf32>) -> tensor<4x128x128x!spyre.dlf16>
  %p = "spyre.softmax"(%m) {acc_type = f32, dim = 2 : i64, safe = true} : (tensor<4x128x128x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16>
  %o = "spyre.batch_matmul"(%p, %q) {acc_type = f32} : (tensor<4x128x128x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>) -> tensor<4x128x64x!spyre.dlf16>
  %t = "spyre.batch_matmul"(%q, %k) {acc_type = f32, transpose_rhs = true} : (tensor<4x128x64x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16>
  %u = "spyre.softmax"(%t) {acc_type = f32, dim = 2 : i64} : (tensor<4x128x128x!spyre.dlf16>) -> tensor<4x128x128x!spyre.dlf16>
  %v = "spyre.batch_matmul"(%u, %q) {acc_type = f32} : (tensor<4x128x128x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>) -> tensor<4x128x64x!spyre.dlf16>
  return %o, %t, %v : tensor<4x128x64x!spyre.dlf16>, tensor<4x128x128x!spyre.dlf16>, tensor<4x128x64x!spyre.dlf16>
}

// -----

// A non-overlapping pool of a conv's output, read through the conv's ReLU epilogue, is applied by the conv
// kernel too ("epilogue"): the kernel stores the pooled tile, its output rows are whole windows (tile rows
// even) and its plan holds the selections (`psel`, both window columns' stacked) and the pooled tiles. A pool with overlapping
// windows, or of a conv result the function also returns, runs its own kernel ("pool2d").
// CHECK-LABEL: func.func @conv_pool
// CHECK: "spyre.conv2d"{{.*}}spyre.kernel = "conv2d"
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.pool2d"{{.*}}spyre.kernel = "epilogue"
// CHECK: "spyre.pool2d"{{.*}}spyre.kernel = "pool2d"
// CHECK: "spyre.conv2d"{{.*}}spyre.kernel = "conv2d"
// CHECK: "spyre.pool2d"{{.*}}spyre.kernel = "pool2d"
// PLAN-LABEL: func.func @conv_pool
// PLAN: "spyre.conv2d"
// PLAN-SAME: spyre.scratchpad = {{{[^}]*}}pct = {{[^}]*}}pout = {{[^}]*}}pres = {{[^}]*}}psel = {{[^}]*}}}
// PLAN-SAME: spyre.tile = array<i64: 1, 16, {{[0-9]*[02468]}}>
// PLAN: "spyre.pool2d"{{.*}}spyre.kernel = "epilogue", spyre.scratchpad = {}, spyre.scratchpad_bytes = 0
func.func @conv_pool(%img: tensor<1x8x32x32x!spyre.dlf16>, %f: tensor<16x8x3x3x!spyre.dlf16> {spyre.param = "conv.weight"})
    -> (tensor<1x16x16x16x!spyre.dlf16>, tensor<1x16x15x15x!spyre.dlf16>, tensor<1x16x32x32x!spyre.dlf16>, tensor<1x16x16x16x!spyre.dlf16>) {
  %0 = "spyre.conv2d"(%img, %f) {operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>} : (tensor<1x8x32x32x!spyre.dlf16>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x32x32x!spyre.dlf16>
  %1 = "spyre.map"(%0) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.0 : f32
    %m = arith.maximumf %a, %z : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x16x32x32x!spyre.dlf16>) -> tensor<1x16x32x32x!spyre.dlf16>
  %2 = "spyre.pool2d"(%1) {kind = "max", kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32x!spyre.dlf16>) -> tensor<1x16x16x16x!spyre.dlf16>
  %3 = "spyre.conv2d"(%img, %f) {operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>} : (tensor<1x8x32x32x!spyre.dlf16>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x32x32x!spyre.dlf16>
  %4 = "spyre.pool2d"(%3) {kind = "max", kernel = array<i64: 3, 3>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32x!spyre.dlf16>) -> tensor<1x16x15x15x!spyre.dlf16>
  %5 = "spyre.conv2d"(%img, %f) {operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>} : (tensor<1x8x32x32x!spyre.dlf16>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x32x32x!spyre.dlf16>
  %6 = "spyre.pool2d"(%5) {kind = "avg", kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32x!spyre.dlf16>) -> tensor<1x16x16x16x!spyre.dlf16>
  return %2, %4, %5, %6 : tensor<1x16x16x16x!spyre.dlf16>, tensor<1x16x15x15x!spyre.dlf16>, tensor<1x16x32x32x!spyre.dlf16>, tensor<1x16x16x16x!spyre.dlf16>
}

// -----

// A map reading a matmul through a reshape that keeps the rows, and further inputs of its shape defined before
// the matmul (a residual add; an MLP's silu(gate) * up), is the matmul's epilogue too: the kernel loads their
// blocks of each output tile. The gated map reads two matmuls: the later one (up) applies it, reading gate's
// result, which exists by then; gate's kernel stays plain. With spyre-divide-work, spyre-tile and
// spyre-allocate-scratchpad the up matmul holds a block of gate's result (`epa`), and spyre-schedule puts a
// barrier after gate: the up matmul's cores read its result.
// CHECK-LABEL: func.func @epilogue_inputs
// CHECK: %[[G:.*]] = "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: %[[GV:.*]] = "spyre.reshape"(%[[G]]) {spyre.kernel = "alias"}
// CHECK: %[[U:.*]] = "spyre.matmul"{{.*}}spyre.kernel = "matmul"
// CHECK: %[[UV:.*]] = "spyre.reshape"(%[[U]]) {spyre.kernel = "alias"}
// CHECK: "spyre.map"(%[[GV]], %[[UV]])
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.map"(%arg2, %{{.*}})
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// PLAN-LABEL: func.func @epilogue_inputs
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.barrier = true
// PLAN-NOT: epa
// PLAN-SAME: -> tensor<16x128x!spyre.dlf16>
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}epa = {{.*}}}
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}epa = {{.*}}}
func.func @epilogue_inputs(%x: tensor<16x64x!spyre.dlf16>, %w: tensor<64x128x!spyre.dlf16>, %res: tensor<1x16x64xf32>,
                           %wd: tensor<128x64x!spyre.dlf16>) -> tensor<1x16x64x!spyre.dlf16> {
  %g = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
  %gv = "spyre.reshape"(%g) : (tensor<16x128x!spyre.dlf16>) -> tensor<1x16x128x!spyre.dlf16>
  %u = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x64x!spyre.dlf16>, tensor<64x128x!spyre.dlf16>) -> tensor<16x128x!spyre.dlf16>
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
  %ov = "spyre.reshape"(%o) : (tensor<16x64x!spyre.dlf16>) -> tensor<1x16x64x!spyre.dlf16>
  %y = "spyre.map"(%res, %ov) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<1x16x64xf32>, tensor<1x16x64x!spyre.dlf16>) -> tensor<1x16x64x!spyre.dlf16>
  %z = "spyre.map"(%y) ({
  ^bb0(%a: f32):
    %n = arith.negf %a : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x16x64x!spyre.dlf16>) -> tensor<1x16x64x!spyre.dlf16>
  return %z : tensor<1x16x64x!spyre.dlf16>
}

// -----

// A slice of contiguous whole rows (the leading dim of a permuted qkv split into q, k and v) is a view of its
// operand's bytes from its first row on ("alias"); a slice of rows that are not contiguous, or one the function
// returns, moves by DMA ("dma-rows").
// CHECK-LABEL: func.func @slice_views
// CHECK: "spyre.slice"(%arg0) {offsets = array<i64: 1, 0, 0, 0>{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.slice"(%arg0) {offsets = array<i64: 0, 0, 2, 0>{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.slice"(%arg0) {offsets = array<i64: 0, 1, 0, 0>{{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.slice"(%arg0) {offsets = array<i64: 2, 0, 0, 0>{{.*}}spyre.kernel = "dma-rows"
func.func @slice_views(%qkv: tensor<3x4x16x64x!spyre.dlf16>) -> (tensor<1x4x16x64x!spyre.dlf16>, tensor<1x1x8x64x!spyre.dlf16>, tensor<3x2x16x64x!spyre.dlf16>, tensor<1x4x16x64x!spyre.dlf16>) {
  %k = "spyre.slice"(%qkv) {offsets = array<i64: 1, 0, 0, 0>, sizes = array<i64: 1, 4, 16, 64>, strides = array<i64: 1, 1, 1, 1>} : (tensor<3x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16>
  %rows = "spyre.slice"(%qkv) {offsets = array<i64: 0, 0, 2, 0>, sizes = array<i64: 1, 1, 8, 64>, strides = array<i64: 1, 1, 1, 1>} : (tensor<3x4x16x64x!spyre.dlf16>) -> tensor<1x1x8x64x!spyre.dlf16>
  %heads = "spyre.slice"(%qkv) {offsets = array<i64: 0, 1, 0, 0>, sizes = array<i64: 3, 2, 16, 64>, strides = array<i64: 1, 1, 1, 1>} : (tensor<3x4x16x64x!spyre.dlf16>) -> tensor<3x2x16x64x!spyre.dlf16>
  %v = "spyre.slice"(%qkv) {offsets = array<i64: 2, 0, 0, 0>, sizes = array<i64: 1, 4, 16, 64>, strides = array<i64: 1, 1, 1, 1>} : (tensor<3x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16>
  %a = "spyre.map"(%k) ({
  ^bb0(%x: f32):
    %n = arith.negf %x : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x4x16x64x!spyre.dlf16>) -> tensor<1x4x16x64x!spyre.dlf16>
  %b = "spyre.map"(%rows) ({
  ^bb0(%x: f32):
    %n = arith.negf %x : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x1x8x64x!spyre.dlf16>) -> tensor<1x1x8x64x!spyre.dlf16>
  %c = "spyre.map"(%heads) ({
  ^bb0(%x: f32):
    %n = arith.negf %x : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<3x2x16x64x!spyre.dlf16>) -> tensor<3x2x16x64x!spyre.dlf16>
  return %a, %b, %c, %v : tensor<1x4x16x64x!spyre.dlf16>, tensor<1x1x8x64x!spyre.dlf16>, tensor<3x2x16x64x!spyre.dlf16>, tensor<1x4x16x64x!spyre.dlf16>
}

// -----

// A residual add the matmul applies, then widened to f32 for the return: the cast is the matmul's epilogue
// too (its kernel rounds the map's values to dlf16, widens them into `outf` and stores f32). A cast that narrows,
// and a cast of a map that is no epilogue (it reads no matmul), stay kernels of their own.
// CHECK-LABEL: func.func @widening_cast
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.cast"{{.*}}spyre.kernel = "epilogue"
// CHECK: "spyre.cast"{{.*}}spyre.kernel = "rows"
// CHECK: "spyre.cast"{{.*}}spyre.kernel = "rows"
// PLAN-LABEL: func.func @widening_cast
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}out = {{[0-9]+}} : i64, outf = {{.*}}}
// PLAN: "spyre.cast"{{.*}}spyre.kernel = "epilogue", spyre.scratchpad = {}, spyre.scratchpad_bytes = 0
func.func @widening_cast(%x: tensor<64x128x!spyre.dlf16>, %w: tensor<128x64x!spyre.dlf16>, %r: tensor<64x64x!spyre.dlf16>)
    -> (tensor<64x64xf32>, tensor<64x64xf8E4M3FN>, tensor<64x64xf32>) {
  %m = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x128x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %a = "spyre.map"(%r, %m) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %f = "spyre.cast"(%a) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64xf32>
  %m2 = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x128x!spyre.dlf16>, tensor<128x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %a2 = "spyre.map"(%r, %m2) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %n = "spyre.cast"(%a2) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64xf8E4M3FN>
  %a3 = "spyre.map"(%r) ({
  ^bb0(%p: f32):
    %s = arith.addf %p, %p : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %g = "spyre.cast"(%a3) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64xf32>
  return %f, %n, %g : tensor<64x64xf32>, tensor<64x64xf8E4M3FN>, tensor<64x64xf32>
}

// -----

// Rotary embedding's x * cos + rotate_half(x) * sin needs two fp32 temporaries: the matmul computing
// rotate_half(x) applies it with its accumulator and one more fp32 tile of its plan (`ept`). A map needing three
// stays a kernel of its own.
// CHECK-LABEL: func.func @epilogue_two_temps
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>, spyre.kernel = "epilogue"}
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>, spyre.kernel = "rows"}
// PLAN-LABEL: func.func @epilogue_two_temps
// PLAN: "spyre.matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}epa = {{.*}}ept = {{.*}}}
// PLAN: "spyre.matmul"
// PLAN-NOT: ept
// PLAN-SAME: -> tensor<64x64x!spyre.dlf16>
func.func @epilogue_two_temps(%x: tensor<64x64x!spyre.dlf16>, %p: tensor<64x64x!spyre.dlf16>, %cos: tensor<64x64x!spyre.dlf16>,
                              %sin: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%x, %p) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %e = "spyre.map"(%x, %cos, %r, %sin) ({
  ^bb0(%a: f32, %c: f32, %b: f32, %d: f32):
    %m = arith.mulf %a, %c : f32
    %n = arith.mulf %b, %d : f32
    %o = arith.addf %m, %n : f32
    "spyre.yield"(%o) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %r2 = "spyre.matmul"(%x, %p) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %e3 = "spyre.map"(%x, %cos, %r2, %sin) ({
  ^bb0(%a: f32, %c: f32, %b: f32, %d: f32):
    %m = arith.mulf %a, %c : f32
    %n = arith.mulf %b, %d : f32
    %q = arith.mulf %a, %b : f32
    %o = arith.addf %m, %n : f32
    %t = arith.addf %o, %q : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  %z = "spyre.map"(%e, %e3) ({
  ^bb0(%a: f32, %b: f32):
    %o = arith.addf %a, %b : f32
    "spyre.yield"(%o) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %z : tensor<64x64x!spyre.dlf16>
}

// -----

// A transpose that keeps the innermost dim is read in place ("alias": a row view, its rows gathered by strided
// DMA) when every reader gathers rows: q feeds a row-wise op through a slice and a reshape, both views too. A
// restick addresses bytes, so k's reshape before it copies its rows ("dma-rows"); a returned slice (v) is
// copied as well. A transpose read by a restick stays a copy of its own.
// CHECK-LABEL: func.func @transpose_views
// CHECK: %[[T:.*]] = "spyre.transpose"(%arg0){{.*}}spyre.kernel = "alias"
// CHECK: "spyre.slice"(%[[T]]) {offsets = array<i64: 0,{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.slice"(%[[T]]) {offsets = array<i64: 1,{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.slice"(%[[T]]) {offsets = array<i64: 2,{{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "alias"
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.transpose"{{.*}}spyre.kernel = "restick"
// CHECK: "spyre.transpose"(%arg1){{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.transpose"{{.*}}spyre.kernel = "restick"
func.func @transpose_views(%qkv: tensor<1x16x3x4x64x!spyre.dlf16>, %x: tensor<2x4x64x!spyre.dlf16>)
    -> (tensor<4x16x64x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>, tensor<1x1x4x16x64x!spyre.dlf16>, tensor<4x64x2x!spyre.dlf16>) {
  %t = "spyre.transpose"(%qkv) {permutation = array<i64: 2, 0, 3, 1, 4>} : (tensor<1x16x3x4x64x!spyre.dlf16>) -> tensor<3x1x4x16x64x!spyre.dlf16>
  %q = "spyre.slice"(%t) {offsets = array<i64: 0, 0, 0, 0, 0>, sizes = array<i64: 1, 1, 4, 16, 64>, strides = array<i64: 1, 1, 1, 1, 1>} : (tensor<3x1x4x16x64x!spyre.dlf16>) -> tensor<1x1x4x16x64x!spyre.dlf16>
  %k = "spyre.slice"(%t) {offsets = array<i64: 1, 0, 0, 0, 0>, sizes = array<i64: 1, 1, 4, 16, 64>, strides = array<i64: 1, 1, 1, 1, 1>} : (tensor<3x1x4x16x64x!spyre.dlf16>) -> tensor<1x1x4x16x64x!spyre.dlf16>
  %v = "spyre.slice"(%t) {offsets = array<i64: 2, 0, 0, 0, 0>, sizes = array<i64: 1, 1, 4, 16, 64>, strides = array<i64: 1, 1, 1, 1, 1>} : (tensor<3x1x4x16x64x!spyre.dlf16>) -> tensor<1x1x4x16x64x!spyre.dlf16>
  %q3 = "spyre.reshape"(%q) : (tensor<1x1x4x16x64x!spyre.dlf16>) -> tensor<4x16x64x!spyre.dlf16>
  %k3 = "spyre.reshape"(%k) : (tensor<1x1x4x16x64x!spyre.dlf16>) -> tensor<4x16x64x!spyre.dlf16>
  %kt = "spyre.transpose"(%k3) {permutation = array<i64: 0, 2, 1>} : (tensor<4x16x64x!spyre.dlf16>) -> tensor<4x64x16x!spyre.dlf16>
  %a = "spyre.map"(%q3) ({
  ^bb0(%e: f32):
    %n = arith.negf %e : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x16x64x!spyre.dlf16>) -> tensor<4x16x64x!spyre.dlf16>
  %x1 = "spyre.transpose"(%x) {permutation = array<i64: 1, 0, 2>} : (tensor<2x4x64x!spyre.dlf16>) -> tensor<4x2x64x!spyre.dlf16>
  %x2 = "spyre.transpose"(%x1) {permutation = array<i64: 0, 2, 1>} : (tensor<4x2x64x!spyre.dlf16>) -> tensor<4x64x2x!spyre.dlf16>
  return %a, %kt, %v, %x2 : tensor<4x16x64x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>, tensor<1x1x4x16x64x!spyre.dlf16>, tensor<4x64x2x!spyre.dlf16>
}

// -----

// Attention's heads merged back, [h, s, d] -> [s, h, d] -> [s, h*d], for the output projection: the reshape
// puts whole source rows of whole sticks side by side, so both it and the transpose are aliases (a merged row
// view, gathered by the matmul's DMAs). Returned, the merged tensor needs bytes of its own: the transpose copies
// rows first. A split of the source rows ([s, h, d] -> [s, 2h, d/2]) is no view either: the transpose copies them,
// and the split of the copy's whole sticks is an alias.
// CHECK-LABEL: func.func @merged_heads
// CHECK: %[[T:.*]] = "spyre.transpose"(%arg0){{.*}}spyre.kernel = "alias"
// CHECK: %[[M:.*]] = "spyre.reshape"(%[[T]]){{.*}}spyre.kernel = "alias"
// CHECK: "spyre.matmul"(%[[M]], %arg1)
// CHECK: "spyre.transpose"(%arg0){{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.transpose"(%arg2){{.*}}spyre.kernel = "dma-rows"
// CHECK: "spyre.reshape"{{.*}}spyre.kernel = "alias"
func.func @merged_heads(%a: tensor<4x16x64x!spyre.dlf16>, %w: tensor<256x64x!spyre.dlf16>, %b: tensor<4x16x128x!spyre.dlf16>)
    -> (tensor<16x64x!spyre.dlf16>, tensor<16x256x!spyre.dlf16>, tensor<16x8x64x!spyre.dlf16>) {
  %t = "spyre.transpose"(%a) {permutation = array<i64: 1, 0, 2>} : (tensor<4x16x64x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  %m = "spyre.reshape"(%t) : (tensor<16x4x64x!spyre.dlf16>) -> tensor<16x256x!spyre.dlf16>
  %r = "spyre.matmul"(%m, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<16x256x!spyre.dlf16>, tensor<256x64x!spyre.dlf16>) -> tensor<16x64x!spyre.dlf16>
  %t2 = "spyre.transpose"(%a) {permutation = array<i64: 1, 0, 2>} : (tensor<4x16x64x!spyre.dlf16>) -> tensor<16x4x64x!spyre.dlf16>
  %m2 = "spyre.reshape"(%t2) : (tensor<16x4x64x!spyre.dlf16>) -> tensor<16x256x!spyre.dlf16>
  %t3 = "spyre.transpose"(%b) {permutation = array<i64: 1, 0, 2>} : (tensor<4x16x128x!spyre.dlf16>) -> tensor<16x4x128x!spyre.dlf16>
  %s3 = "spyre.reshape"(%t3) : (tensor<16x4x128x!spyre.dlf16>) -> tensor<16x8x64x!spyre.dlf16>
  %n3 = "spyre.map"(%s3) ({
  ^bb0(%e: f32):
    %n = arith.negf %e : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<16x8x64x!spyre.dlf16>) -> tensor<16x8x64x!spyre.dlf16>
  return %r, %m2, %n3 : tensor<16x64x!spyre.dlf16>, tensor<16x256x!spyre.dlf16>, tensor<16x8x64x!spyre.dlf16>
}

// -----

// Grouped-query attention's repeat_kv: an identity map broadcasting k's 2 heads to 4 only repeats rows, so it is
// an alias (a row view) when its readers gather rows, here through a reshape into the scores' batch_matmul. The
// same map whose result is returned copies (kernel rows); a map that computes is no view.
// CHECK-LABEL: func.func @repeated_rows
// CHECK: %[[E:.*]] = "spyre.map"(%arg1)
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "alias"}
// CHECK: "spyre.reshape"(%[[E]]) {spyre.kernel = "alias"}
// CHECK: "spyre.map"(%arg1)
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "rows"}
// CHECK: "spyre.map"(%arg1)
// CHECK: }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.kernel = "rows"}
func.func @repeated_rows(%q: tensor<4x16x64x!spyre.dlf16>, %k: tensor<2x1x16x64x!spyre.dlf16>)
    -> (tensor<4x16x16x!spyre.dlf16>, tensor<2x2x16x64x!spyre.dlf16>, tensor<2x2x16x64x!spyre.dlf16>) {
  %e = "spyre.map"(%k) ({
  ^bb0(%a: f32):
    "spyre.yield"(%a) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x1x16x64x!spyre.dlf16>) -> tensor<2x2x16x64x!spyre.dlf16>
  %r = "spyre.reshape"(%e) : (tensor<2x2x16x64x!spyre.dlf16>) -> tensor<4x16x64x!spyre.dlf16>
  %s = "spyre.batch_matmul"(%q, %r) {acc_type = f32, transpose_rhs = true} : (tensor<4x16x64x!spyre.dlf16>, tensor<4x16x64x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %c = "spyre.map"(%k) ({
  ^bb0(%a: f32):
    "spyre.yield"(%a) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x1x16x64x!spyre.dlf16>) -> tensor<2x2x16x64x!spyre.dlf16>
  %n = "spyre.map"(%k) ({
  ^bb0(%a: f32):
    %m = arith.negf %a : f32
    "spyre.yield"(%m) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<2x1x16x64x!spyre.dlf16>) -> tensor<2x2x16x64x!spyre.dlf16>
  return %s, %c, %n : tensor<4x16x16x!spyre.dlf16>, tensor<2x2x16x64x!spyre.dlf16>, tensor<2x2x16x64x!spyre.dlf16>
}

// -----

// A further input broadcast along leading dims (a causal mask every head adds to its scores) is loaded tile by
// tile like one of the map's shape, its rows gathered again for each head: the map is the batch_matmul's
// epilogue. A mask broadcast along its innermost dim (one value per row) is not: the map runs on its own.
// CHECK-LABEL: func.func @epilogue_broadcast_input
// CHECK: "spyre.map"(%{{.*}}, %arg2)
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "epilogue"}
// CHECK: "spyre.map"(%{{.*}}, %arg3)
// CHECK: }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.kernel = "rows"}
// PLAN-LABEL: func.func @epilogue_broadcast_input
// PLAN: "spyre.batch_matmul"
// PLAN-SAME: spyre.scratchpad = {{{.*}}epa = {{.*}}}
func.func @epilogue_broadcast_input(%q: tensor<4x16x64x!spyre.dlf16>, %kt: tensor<4x64x16x!spyre.dlf16>,
                                    %mask: tensor<16x16x!spyre.dlf16>, %col: tensor<4x16x1x!spyre.dlf16>)
    -> (tensor<4x16x16x!spyre.dlf16>, tensor<4x16x16x!spyre.dlf16>) {
  %s = "spyre.batch_matmul"(%q, %kt) {acc_type = f32} : (tensor<4x16x64x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %m = "spyre.map"(%s, %mask) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x16x16x!spyre.dlf16>, tensor<16x16x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %s2 = "spyre.batch_matmul"(%q, %kt) {acc_type = f32} : (tensor<4x16x64x!spyre.dlf16>, tensor<4x64x16x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %c = "spyre.map"(%s2, %col) ({
  ^bb0(%a: f32, %b: f32):
    %r = arith.addf %a, %b : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x16x16x!spyre.dlf16>, tensor<4x16x1x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %n = "spyre.map"(%m) ({
  ^bb0(%a: f32):
    %r = arith.negf %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x16x16x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  %n2 = "spyre.map"(%c) ({
  ^bb0(%a: f32):
    %r = arith.negf %a : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4x16x16x!spyre.dlf16>) -> tensor<4x16x16x!spyre.dlf16>
  return %n, %n2 : tensor<4x16x16x!spyre.dlf16>, tensor<4x16x16x!spyre.dlf16>
}

// -----

// An embedding lookup in a weight runs on the device (kernel "gather": GATHER instructions pick the rows by the
// indices the device holds); its plan is row tiles of the output (`out0`) and one stick of indices (`idx`). A table
// computed at run time, or one larger than a core's 256 MB span of device memory, stays with the host's gather.
// CHECK-LABEL: func.func @embedding
// CHECK: "spyre.gather"(%{{.*}}, %arg0) {spyre.kernel = "gather"}
// CHECK: "spyre.gather"(%arg1, %arg0) {spyre.on_host = "no device kernel for spyre.gather
// CHECK: "spyre.gather"(%{{.*}}, %arg0) {spyre.on_host = "no device kernel for spyre.gather
// PLAN-LABEL: func.func @embedding
// PLAN: "spyre.gather"
// PLAN-SAME: spyre.kernel = "gather", spyre.scratchpad = {idx = {{[0-9]+}} : i64, out0 = {{[0-9]+}} : i64}
func.func @embedding(%ids: tensor<2x40xi64>, %t: tensor<300x96xf32>)
    -> (tensor<2x40x96xf32>, tensor<2x40x96xf32>, tensor<2x40x4096xf32>) {
  %table = arith.constant dense<1.5> : tensor<300x96xf32>
  %big = arith.constant dense<1.5> : tensor<49159x4096xf32>
  %0 = "spyre.gather"(%table, %ids) : (tensor<300x96xf32>, tensor<2x40xi64>) -> tensor<2x40x96xf32>
  %1 = "spyre.gather"(%t, %ids) : (tensor<300x96xf32>, tensor<2x40xi64>) -> tensor<2x40x96xf32>
  %2 = "spyre.gather"(%big, %ids) : (tensor<49159x4096xf32>, tensor<2x40xi64>) -> tensor<2x40x4096xf32>
  return %0, %1, %2 : tensor<2x40x96xf32>, tensor<2x40x96xf32>, tensor<2x40x4096xf32>
}
