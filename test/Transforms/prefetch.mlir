// The cases before the "MATMUL" line run on 32 cores, the one after it on 8.
// RUN: sed -e '/^\/\/ MATMUL/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-reduce-precision,spyre-layout,spyre-fuse,spyre-select-kernels,spyre-fold-constants,spyre-divide-work{cores=32},spyre-tile,spyre-allocate-scratchpad,spyre-schedule,spyre-prefetch)' | filecheck %s
// RUN: sed -n -e '/^\/\/ MATMUL/,$p' %s | spyre-opt -p 'builtin.module(spyre-reduce-precision,spyre-layout,spyre-fuse,spyre-select-kernels,spyre-fold-constants,spyre-divide-work{cores=8},spyre-tile,spyre-allocate-scratchpad,spyre-schedule,spyre-prefetch)' | filecheck %s --check-prefix=MATMUL

// conv -> max pool -> conv: the second conv shares its filters and bias over the ring, loaded once before its
// work, so it loads them during the first conv (its pool is applied by that conv's kernel). Their offsets move
// above every byte the first conv uses (its spyre.scratchpad_bytes), and the module's peak grows to match. The
// first conv has no kernel before it: nothing to prefetch.
// CHECK: module attributes {{{.*}}spyre.scratchpad_peak = 41984 : i64}
// CHECK-LABEL: func.func @conv_pool_conv
// CHECK: "spyre.conv2d"
// CHECK-NOT: spyre.prefetch
// CHECK-SAME: spyre.scratchpad_bytes = 33792 : i64
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.prefetch = ["b0", "bias"], spyre.prefetch_distance = 1 : i64
// CHECK-SAME: spyre.scratchpad = {a0 = 0 : i64, acc = 14336 : i64, b0 = 33792 : i64, bias = 39936 : i64, out = 18432 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 41984 : i64
func.func @conv_pool_conv(%x: tensor<1x3x32x32xf32> {spyre.name = "x"}, %w1: tensor<16x3x3x3xf32> {spyre.param = "c1.weight", spyre.value = dense<0.5> : tensor<16x3x3x3xf32>}, %b1: tensor<16xf32> {spyre.param = "c1.bias", spyre.value = dense<0.25> : tensor<16xf32>}, %w2: tensor<16x16x3x3xf32> {spyre.param = "c2.weight", spyre.value = dense<-0.5> : tensor<16x16x3x3xf32>}, %b2: tensor<16xf32> {spyre.param = "c2.bias", spyre.value = dense<0.125> : tensor<16xf32>}) -> (tensor<1x16x16x16xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w1, %b1) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x3x32x32xf32>, tensor<16x3x3x3xf32>, tensor<16xf32>) -> tensor<1x16x32x32xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32xf32>) -> tensor<1x16x16x16xf32>
  %2 = "spyre.conv2d"(%1, %w2, %b2) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x16x16x16xf32>, tensor<16x16x3x3xf32>, tensor<16xf32>) -> tensor<1x16x16x16xf32>
  return %2 : tensor<1x16x16x16xf32>
}

// -----

// Host work between the two kernels fences: the second conv loads its constants itself, at its start.
// CHECK-LABEL: func.func @host_between
// CHECK: "spyre.conv2d"
// CHECK: "spyre.host"
// CHECK: "spyre.conv2d"
// CHECK-NOT: spyre.prefetch
// CHECK-SAME: spyre.scratchpad_bytes
func.func @host_between(%x: tensor<1x3x32x32xf32> {spyre.name = "x"}, %w1: tensor<16x3x3x3xf32> {spyre.param = "c1.weight", spyre.value = dense<0.5> : tensor<16x3x3x3xf32>}, %b1: tensor<16xf32> {spyre.param = "c1.bias", spyre.value = dense<0.25> : tensor<16xf32>}, %w2: tensor<16x16x3x3xf32> {spyre.param = "c2.weight", spyre.value = dense<-0.5> : tensor<16x16x3x3xf32>}, %b2: tensor<16xf32> {spyre.param = "c2.bias", spyre.value = dense<0.125> : tensor<16xf32>}) -> (tensor<1x16x32x32xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w1, %b1) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x3x32x32xf32>, tensor<16x3x3x3xf32>, tensor<16xf32>) -> tensor<1x16x32x32xf32>
  %1 = "spyre.host"() ({
    %y = arith.addf %0, %0 : tensor<1x16x32x32xf32>
    "spyre.yield"(%y) : (tensor<1x16x32x32xf32>) -> ()
  }) {reason = "test"} : () -> tensor<1x16x32x32xf32>
  %2 = "spyre.conv2d"(%1, %w2, %b2) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x16x32x32xf32>, tensor<16x16x3x3xf32>, tensor<16xf32>) -> tensor<1x16x32x32xf32>
  return %2 : tensor<1x16x32x32xf32>
}

// -----

// A flatten (select-cols) loads its selection matrices once per core before its work: they load while the conv
// before computes, above every byte of both kernels (the conv's 40960).
// CHECK: module attributes {{{.*}}spyre.scratchpad_peak = 49152 : i64}
// CHECK-LABEL: func.func @conv_flatten_selections
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.scratchpad_bytes = 40960 : i64
// CHECK: "spyre.reshape"
// CHECK-SAME: spyre.kernel = "select-cols", spyre.prefetch = ["sel"], spyre.prefetch_distance = 1 : i64
// CHECK-SAME: sel = 40960 : i64
// CHECK-SAME: spyre.scratchpad_bytes = 49152 : i64
func.func @conv_flatten_selections(%x: tensor<2x16x8x8xf32> {spyre.name = "x"}, %w: tensor<16x16x3x3xf32> {spyre.param = "c.weight", spyre.value = dense<0.01> : tensor<16x16x3x3xf32>}, %b: tensor<16xf32> {spyre.param = "c.bias", spyre.value = dense<0.5> : tensor<16xf32>}) -> (tensor<2x256xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w, %b) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x16x8x8xf32>, tensor<16x16x3x3xf32>, tensor<16xf32>) -> tensor<2x16x8x8xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<2x16x8x8xf32>) -> tensor<2x16x4x4xf32>
  %2 = "spyre.reshape"(%1) : (tensor<2x16x4x4xf32>) -> tensor<2x256xf32>
  return %2 : tensor<2x256xf32>
}

// -----

// conv -> max pool -> flatten -> Linear: the flatten (select-cols) is DMA-bound, so the classifier's one B tile
// per core (split along K) loads two kernels back, while the conv computes. Its bytes clear both kernels.
// CHECK-LABEL: func.func @conv_flatten_linear
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.scratchpad_bytes = 151552 : i64
// CHECK: "spyre.reshape"
// CHECK-NOT: spyre.prefetch
// CHECK-SAME: spyre.scratchpad_bytes = 53248 : i64
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.prefetch = ["b0"], spyre.prefetch_distance = 2 : i64
// CHECK-SAME: b0 = 151552 : i64
func.func @conv_flatten_linear(%arg0: tensor<1x32x16x16xf32> {spyre.name = "x"}, %arg1: tensor<64x32x3x3xf32> {spyre.param = "c.weight", spyre.value = dense<0.01> : tensor<64x32x3x3xf32>}, %arg2: tensor<64xf32> {spyre.param = "c.bias", spyre.value = dense<0.01> : tensor<64xf32>}, %arg3: tensor<10x4096xf32> {spyre.param = "fc.weight", spyre.value = dense<0.01> : tensor<10x4096xf32>}, %arg4: tensor<10xf32> {spyre.param = "fc.bias", spyre.value = dense<0.01> : tensor<10xf32>}) -> (tensor<1x10xf32> {spyre.name = "output_0"}) {
  %0 = "spyre.conv2d"(%arg0, %arg1, %arg2) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x32x16x16xf32>, tensor<64x32x3x3xf32>, tensor<64xf32>) -> tensor<1x64x16x16xf32>
  %1 = "spyre.map"(%0) ({
  ^bb0(%arg5: f32):
    %cst = arith.constant 0.000000e+00 : f32
    %5 = arith.cmpf ugt, %arg5, %cst : f32
    %6 = arith.select %5, %arg5, %cst : f32
    "spyre.yield"(%6) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1x64x16x16xf32>) -> tensor<1x64x16x16xf32>
  %2 = "spyre.pool2d"(%1) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x64x16x16xf32>) -> tensor<1x64x8x8xf32>
  %3 = "spyre.reshape"(%2) : (tensor<1x64x8x8xf32>) -> tensor<1x4096xf32>
  %4 = "spyre.matmul"(%3, %arg3, %arg4) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true} : (tensor<1x4096xf32>, tensor<10x4096xf32>, tensor<10xf32>) -> tensor<1x10xf32>
  return %4 : tensor<1x10xf32>
}

// MATMUL

// Linear(64 -> 4096) + erf GELU, then Linear(4096 -> 8) split along K on 4 cores, one [8, 1024] tile each: the
// second could load its one B tile per core early, but the first shares its operands over the ring and loads
// until its last tile (its last segment loads), so its DMA unit never idles long: nothing moves.
// MATMUL: module attributes {{{.*}}spyre.scratchpad_peak = 110592 : i64}
// MATMUL: "spyre.matmul"
// MATMUL-SAME: spyre.grid = array<i64: 1, 8, 1>
// MATMUL: "spyre.matmul"
// MATMUL-NOT: spyre.prefetch
// MATMUL-SAME: spyre.grid = array<i64: 1, 1, 4>
func.func @matmul_after_matmul(%x: tensor<8x64xf32> {spyre.name = "x"}, %w1: tensor<4096x64xf32> {spyre.param = "a.weight", spyre.value = dense<0.01> : tensor<4096x64xf32>}, %b1: tensor<4096xf32> {spyre.param = "a.bias", spyre.value = dense<0.5> : tensor<4096xf32>}, %w2: tensor<8x4096xf32> {spyre.param = "b.weight", spyre.value = dense<-0.01> : tensor<8x4096xf32>}, %b2: tensor<8xf32> {spyre.param = "b.bias", spyre.value = dense<0.25> : tensor<8xf32>}) -> (tensor<8x8xf32> {spyre.name = "y"}) {
  %0 = "spyre.matmul"(%x, %w1, %b1) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true} : (tensor<8x64xf32>, tensor<4096x64xf32>, tensor<4096xf32>) -> tensor<8x4096xf32>
  %1 = "spyre.map"(%0) ({
  ^bb0(%a: f32):
    %s = arith.constant 1.41421354 : f32
    %one = arith.constant 1.000000e+00 : f32
    %half = arith.constant 5.000000e-01 : f32
    %d = arith.divf %a, %s : f32
    %e = math.erf %d : f32
    %p = arith.addf %e, %one : f32
    %h = arith.mulf %p, %half : f32
    %g = arith.mulf %a, %h : f32
    "spyre.yield"(%g) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x4096xf32>) -> tensor<8x4096xf32>
  %2 = "spyre.matmul"(%1, %w2, %b2) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true} : (tensor<8x4096xf32>, tensor<8x4096xf32>, tensor<8xf32>) -> tensor<8x8xf32>
  return %2 : tensor<8x8xf32>
}
