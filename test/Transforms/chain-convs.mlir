// RUN: spyre-opt --split-input-file -p 'builtin.module(spyre-reduce-precision,spyre-layout,spyre-fuse,spyre-select-kernels,spyre-fold-constants,spyre-divide-work{cores=32},spyre-tile,spyre-allocate-scratchpad,spyre-schedule,spyre-prefetch,spyre-chain-convs)' %s | filecheck %s
// RUN: sed -e '/^\/\/ -----/,$d' %s | spyre-opt -p 'builtin.module(spyre-reduce-precision,spyre-layout,spyre-fuse,spyre-select-kernels,spyre-fold-constants,spyre-divide-work{cores=1},spyre-tile,spyre-allocate-scratchpad,spyre-schedule,spyre-prefetch,spyre-chain-convs)' | filecheck %s --check-prefix=ONE

// conv -> max pool -> conv: the first conv's kernel applies the pool and the second has one tile per core, so the
// pooled rows go over the ring into its input patches. Its a0 moves to the module's peak (above every kernel's
// buffers, the constants spyre-prefetch hoisted into the first conv included), and both peaks grow by the patch.
// CHECK: module attributes {{{.*}}spyre.scratchpad_peak = 50176 : i64}
// CHECK-LABEL: func.func @conv_pool_conv
// CHECK: "spyre.conv2d"
// CHECK-NOT: spyre.ring_input
// CHECK-SAME: spyre.scratchpad_bytes = 33792 : i64
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.prefetch = ["b0", "bias"], spyre.prefetch_distance = 1 : i64, spyre.ring_input = true
// CHECK-SAME: spyre.scratchpad = {a0 = 41984 : i64, acc = 14336 : i64, b0 = 33792 : i64, bias = 39936 : i64, out = 18432 : i64}
// CHECK-SAME: spyre.scratchpad_bytes = 50176 : i64

// On one core the second conv walks four output-row tiles: a0 holds their four patches (4 x 12 KB), which the first
// conv's kernel copies there on the SFU; no barrier is needed between two kernels on one core.
// ONE: module attributes {{{.*}}spyre.scratchpad_peak = 140544 : i64}
// ONE-LABEL: func.func @conv_pool_conv
// ONE: "spyre.conv2d"
// ONE-NOT: spyre.barrier
// ONE-SAME: spyre.scratchpad_bytes = 91392 : i64
// ONE: "spyre.conv2d"
// ONE-SAME: spyre.ring_input = true, spyre.scratchpad = {a0 = 91392 : i64
// ONE-SAME: spyre.scratchpad_bytes = 140544 : i64, spyre.tile = array<i64: 1, 16, 4>
func.func @conv_pool_conv(%x: tensor<1x3x32x32xf32> {spyre.name = "x"}, %w1: tensor<16x3x3x3xf32> {spyre.param = "c1.weight", spyre.value = dense<0.5> : tensor<16x3x3x3xf32>}, %b1: tensor<16xf32> {spyre.param = "c1.bias", spyre.value = dense<0.25> : tensor<16xf32>}, %w2: tensor<16x16x3x3xf32> {spyre.param = "c2.weight", spyre.value = dense<-0.5> : tensor<16x16x3x3xf32>}, %b2: tensor<16xf32> {spyre.param = "c2.bias", spyre.value = dense<0.125> : tensor<16xf32>}) -> (tensor<1x16x16x16xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w1, %b1) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x3x32x32xf32>, tensor<16x3x3x3xf32>, tensor<16xf32>) -> tensor<1x16x32x32xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32xf32>) -> tensor<1x16x16x16xf32>
  %2 = "spyre.conv2d"(%1, %w2, %b2) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x16x16x16xf32>, tensor<16x16x3x3xf32>, tensor<16xf32>) -> tensor<1x16x16x16xf32>
  return %2 : tensor<1x16x16x16xf32>
}

// -----

// The pooled rows are also a result of the function: they must reach device memory, so the second conv loads them.
// CHECK-LABEL: func.func @two_readers
// CHECK-NOT: spyre.ring_input
// CHECK: return
func.func @two_readers(%x: tensor<1x3x32x32xf32> {spyre.name = "x"}, %w1: tensor<16x3x3x3xf32> {spyre.param = "c1.weight", spyre.value = dense<0.5> : tensor<16x3x3x3xf32>}, %b1: tensor<16xf32> {spyre.param = "c1.bias", spyre.value = dense<0.25> : tensor<16xf32>}, %w2: tensor<16x16x3x3xf32> {spyre.param = "c2.weight", spyre.value = dense<-0.5> : tensor<16x16x3x3xf32>}, %b2: tensor<16xf32> {spyre.param = "c2.bias", spyre.value = dense<0.125> : tensor<16xf32>}) -> (tensor<1x16x16x16xf32> {spyre.name = "p"}, tensor<1x16x16x16xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w1, %b1) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x3x32x32xf32>, tensor<16x3x3x3xf32>, tensor<16xf32>) -> tensor<1x16x32x32xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x16x32x32xf32>) -> tensor<1x16x16x16xf32>
  %2 = "spyre.conv2d"(%1, %w2, %b2) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 1>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x16x16x16xf32>, tensor<16x16x3x3xf32>, tensor<16xf32>) -> tensor<1x16x16x16xf32>
  return %1, %2 : tensor<1x16x16x16xf32>, tensor<1x16x16x16xf32>
}

// -----

// Three convs in a row: the second and third patches are both alive while the second conv runs (it receives one
// and sends the other), so they take different bytes; the first chain's patch sits at the peak.
// CHECK-LABEL: func.func @three
// CHECK: "spyre.conv2d"
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.ring_input = true
// CHECK-SAME: spyre.scratchpad = {a0 = [[A:[0-9]+]] : i64
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.ring_input = true
// CHECK-NOT: a0 = [[A]] : i64
// CHECK-SAME: spyre.scratchpad_bytes
func.func @three(%x: tensor<1x8x16x16xf32> {spyre.name = "x"}, %w: tensor<8x8x3x3xf32> {spyre.param = "w", spyre.value = dense<0.125> : tensor<8x8x3x3xf32>}) -> (tensor<1x8x16x16xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x16x16xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32>
  %1 = "spyre.conv2d"(%0, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x16x16xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32>
  %2 = "spyre.conv2d"(%1, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x16x16xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x16x16xf32>
  return %2 : tensor<1x8x16x16xf32>
}

// -----

// A CNN's flatten: the pooled rows, 16 of one channel's 64 values each, merge into sticks on the PT array (select-cols).
// The conv's kernel sends them over the ring into the flatten's in0 (every row tile of its cores), which moves above
// the peak (the conv's buffers) like a patch: 32 rows x 8 terms of a stick, 32 KB.
// CHECK: module attributes {{{.*}}spyre.scratchpad_peak = 126976 : i64}
// CHECK-LABEL: func.func @conv_pool_flatten
// CHECK: "spyre.conv2d"
// CHECK-SAME: spyre.barrier = true
// CHECK-NOT: spyre.ring_input
// CHECK-SAME: spyre.scratchpad_bytes = 94208 : i64
// CHECK: "spyre.reshape"
// CHECK-SAME: spyre.kernel = "select-cols", spyre.ring_input = true, spyre.scratchpad = {{{.*}}in0 = 94208 : i64
// CHECK-SAME: spyre.scratchpad_bytes = 126976 : i64
func.func @conv_pool_flatten(%x: tensor<1x8x16x16xf32> {spyre.name = "x"}, %w: tensor<64x8x3x3xf32> {spyre.param = "w", spyre.value = dense<0.125> : tensor<64x8x3x3xf32>}) -> (tensor<1x4096xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x16x16xf32>, tensor<64x8x3x3xf32>) -> tensor<1x64x16x16xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x64x16x16xf32>) -> tensor<1x64x8x8xf32>
  %2 = "spyre.reshape"(%1) : (tensor<1x64x8x8xf32>) -> tensor<1x4096xf32>
  return %2 : tensor<1x4096xf32>
}

// -----

// The flatten of a plain conv (no pool): 16-wide rows, four to a stick, reach in0 from the conv's own result.
// CHECK-LABEL: func.func @conv_flatten
// CHECK: "spyre.reshape"
// CHECK-SAME: spyre.kernel = "select-cols", spyre.ring_input = true
func.func @conv_flatten(%x: tensor<2x4x16x16xf32> {spyre.name = "x"}, %w: tensor<16x4x3x3xf32> {spyre.param = "w", spyre.value = dense<0.125> : tensor<16x4x3x3xf32>}) -> (tensor<2x4096xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<2x4x16x16xf32>, tensor<16x4x3x3xf32>) -> tensor<2x16x16x16xf32>
  %1 = "spyre.reshape"(%0) : (tensor<2x16x16x16xf32>) -> tensor<2x4096xf32>
  return %1 : tensor<2x4096xf32>
}

// -----

// The flatten's result goes on to the classifier, split along K over 8 cores with one A tile each (512 columns, 1 KB):
// the flatten sends each core its sticks, so the classifier loads no A. Its a0 moves above the peak, past the
// flatten's in0 (both chains are alive while the flatten runs).
// CHECK: module attributes {{{.*}}spyre.scratchpad_peak = 128000 : i64}
// CHECK-LABEL: func.func @conv_flatten_classifier
// CHECK: "spyre.reshape"
// CHECK-SAME: spyre.barrier = true
// CHECK-SAME: spyre.ring_input = true, spyre.scratchpad = {{{.*}}in0 = 94208 : i64
// CHECK: "spyre.matmul"
// CHECK-SAME: spyre.grid = array<i64: 1, 1, 8>, spyre.kernel = "matmul"
// CHECK-SAME: spyre.ring_input = true, spyre.scratchpad = {a0 = 126976 : i64
// CHECK-SAME: spyre.scratchpad_bytes = 128000 : i64, spyre.tile = array<i64: 1, 10, 512>
func.func @conv_flatten_classifier(%x: tensor<1x8x16x16xf32> {spyre.name = "x"}, %w: tensor<64x8x3x3xf32> {spyre.param = "w", spyre.value = dense<0.125> : tensor<64x8x3x3xf32>}, %fw: tensor<10x4096xf32> {spyre.param = "fc.weight", spyre.value = dense<0.01> : tensor<10x4096xf32>}, %fb: tensor<10xf32> {spyre.param = "fc.bias", spyre.value = dense<0.5> : tensor<10xf32>}) -> (tensor<1x10xf32> {spyre.name = "y"}) {
  %0 = "spyre.conv2d"(%x, %w) {dilations = array<i64: 1, 1>, groups = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0>, padding = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>} : (tensor<1x8x16x16xf32>, tensor<64x8x3x3xf32>) -> tensor<1x64x16x16xf32>
  %1 = "spyre.pool2d"(%0) {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0, 0, 0>, strides = array<i64: 2, 2>} : (tensor<1x64x16x16xf32>) -> tensor<1x64x8x8xf32>
  %2 = "spyre.reshape"(%1) : (tensor<1x64x8x8xf32>) -> tensor<1x4096xf32>
  %3 = "spyre.matmul"(%2, %fw, %fb) {operandSegmentSizes = array<i32: 1, 1, 1>, transpose_rhs = true} : (tensor<1x4096xf32>, tensor<10x4096xf32>, tensor<10xf32>) -> tensor<1x10xf32>
  return %3 : tensor<1x10xf32>
}
