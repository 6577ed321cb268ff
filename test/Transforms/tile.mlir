// The cases before the "ERRORS" line tile; the ones after it fail with a located diagnostic.
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-tile)' | filecheck %s
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-tile{tile-m=128 tile-n=128 tile-k=256 tile-rows=4})' | filecheck %s --check-prefix=FORCED
// RUN: sed -n -e '/^\/\/ ERRORS/,$p' %s | spyre-opt --split-input-file --verify-diagnostics -p 'builtin.module(spyre-select-kernels,spyre-tile)'
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | not spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-tile{tile-m=1024 tile-n=1024 tile-k=1024})' 2>&1 | filecheck %s --check-prefix=TOO-BIG
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | not spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-tile{tile-m=48})' 2>&1 | filecheck %s --check-prefix=UNEVEN

// Per-core block 512x256x1024 (grid 2x4x1): two 512x128 output tiles, K in steps of two sticks, so A and B
// stream double-buffered against the PT array, and the first tile's store overlaps the second tile's
// multiplies (a part of its rows per K step) instead of following the last multiply. The last tile is
// stored in pieces behind its last multiply's pieces, so a longer last step costs less than it did: 93.8K
// modeled cycles against 95.7K for steps of one stick.
// CHECK-LABEL: func.func @matmul_1024
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 512, 128, 128>
// FORCED-LABEL: func.func @matmul_1024
// FORCED: "spyre.matmul"{{.*}}spyre.tile = array<i64: 128, 128, 256>
// Forced sizes are clamped to the 512x256x1024 block, which alone needs 1 MiB (A) + 512 KiB (B) + 512 KiB (fp32
// accumulator) + 256 KiB (out), single-buffered.
// TOO-BIG: error: spyre-tile: tile 512x256x1024 of 'spyre.matmul' needs 2359296 bytes of scratchpad, 1589376 available
func.func @matmul_1024(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 4, 1>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}

// -----

// The same matmul on all 32 cores (grid 4x8x1): a 256x128 block per core. Its cores share A and B tiles over
// the ring, one barrier per K step, so K steps of four sticks: fewer barriers, a first load still short next
// to the rest, and the last step's multiply hidden behind the pieces of the store (45.5K modeled cycles; steps
// of two sticks 45.9K, of eight 45.7K).
// CHECK-LABEL: func.func @matmul_1024_32
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 256, 128, 256>
func.func @matmul_1024_32(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 4, 8, 1>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}

// -----

// A 4096^3 matmul on 32 cores (grid 4x8x1): a 1024x512 block per core, two rows of two 512x256 output tiles.
// The A tiles of a row are the same for both of its tiles, so each core keeps its part of them on the
// scratchpad (`spyre.resident_a`): A leaves device memory once. On the 1024^3 blocks above a core has one
// tile, so nothing is resident.
// CHECK-LABEL: func.func @matmul_4096_32
// CHECK: "spyre.matmul"{{.*}}spyre.resident_a = true, spyre.tile = array<i64: 512, 256, 64>
// CHECK-LABEL: func.func @matmul_4096_32_alone
// CHECK-NOT: resident
// CHECK: return
func.func @matmul_4096_32(%a: tensor<4096x4096x!spyre.dlf16>, %b: tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 4, 8, 1>} : (tensor<4096x4096x!spyre.dlf16>, tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16>
  return %r : tensor<4096x4096x!spyre.dlf16>
}
// A single core has no row to share: no resident A.
func.func @matmul_4096_32_alone(%a: tensor<4096x4096x!spyre.dlf16>, %b: tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 1, 1>} : (tensor<4096x4096x!spyre.dlf16>, tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16>
  return %r : tensor<4096x4096x!spyre.dlf16>
}

// UNEVEN: error: spyre-tile: tile-m=48 does not divide the per-core block of 512

// -----

// A 64x64 matmul on one core: a single tile (forced sizes are clamped to the block).
// CHECK-LABEL: func.func @matmul_64
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 64, 64, 64>
// FORCED-LABEL: func.func @matmul_64
// FORCED: "spyre.matmul"{{.*}}spyre.tile = array<i64: 64, 64, 64>
func.func @matmul_64(%a: tensor<64x64x!spyre.dlf16>, %b: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 1, 1>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %r : tensor<64x64x!spyre.dlf16>
}

// -----

// A 300x1000x700 matmul on one core: no multiple of the PT rows divides M = 300, and no whole number of sticks
// divides N = 1000 or K = 700. The whole block (a 700x1000 B tile alone is 1.4 MB) cannot be double-buffered,
// so the N and K tiles are powers of two of them, and the core walks a last, shorter tile in each. Forced sizes
// may be such sizes too.
// CHECK-LABEL: func.func @matmul_ragged
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 300, 256, 64>
// FORCED-LABEL: func.func @matmul_ragged
// FORCED: "spyre.matmul"{{.*}}spyre.tile = array<i64: 128, 128, 256>
func.func @matmul_ragged(%a: tensor<300x700x!spyre.dlf16>, %b: tensor<700x1000x!spyre.dlf16>) -> tensor<300x1000x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 1, 1>} : (tensor<300x700x!spyre.dlf16>, tensor<700x1000x!spyre.dlf16>) -> tensor<300x1000x!spyre.dlf16>
  return %r : tensor<300x1000x!spyre.dlf16>
}

// -----

// Row-wise ops: rows per tile, dividing the core's rows (32 here). Both take one tile a core: every core
// loads, then (after a barrier) every core computes and stores, each phase at the read or write bandwidth;
// streaming 4 tiles would overlap the softmax's SFU work with DMA, but mix reads and writes at the lower mixed
// bandwidth, which costs more on this memory-bound op.
// CHECK-LABEL: func.func @softmax_map
// CHECK: "spyre.softmax"{{.*}}spyre.tile = array<i64: 32>
// CHECK: "spyre.map"
// CHECK: spyre.tile = array<i64: 32>
// FORCED-LABEL: func.func @softmax_map
// FORCED: "spyre.softmax"{{.*}}spyre.tile = array<i64: 4>
// FORCED: "spyre.map"
// FORCED: spyre.tile = array<i64: 4>
func.func @softmax_map(%x: tensor<1024x1024x!spyre.dlf16>, %bias: tensor<1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 32>} : (tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  %m = "spyre.map"(%s, %bias) ({
  ^bb0(%a: f32, %b: f32):
    %t = arith.addf %a, %b : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.grid = array<i64: 32>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %m : tensor<1024x1024x!spyre.dlf16>
}

// -----

// A matmul whose f32 operands spyre-fuse converts on the scratchpad keeps the K tile of the dlf16 op alone (the
// accumulation order of the unfused program), unless that costs it more than 5% over its own best tile. Here the
// op alone takes 256-deep K steps (44.5K modeled cycles); in them the fused op's fp32 A and B tiles leave room
// for 32-column tiles only (109K), so it takes its own 128-deep steps (87K).
// CHECK-LABEL: func.func @fused_own_k
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 512, 64, 128>
// CHECK-LABEL: func.func @alone_k
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 512, 64, 256>
func.func @fused_own_k(%a: tensor<1024x1024xf32>, %b: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.convert_operands = {lhs = !spyre.dlf16, rhs = !spyre.dlf16}, spyre.convert_result = !spyre.dlf16, spyre.grid = array<i64: 2, 16, 1>} : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  return %r : tensor<1024x1024xf32>
}
func.func @alone_k(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 16, 1>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}

// -----

// A matmul feeding a map with a different grid: each is tiled for its own per-core block.
// CHECK-LABEL: func.func @matmul_map
// CHECK: "spyre.matmul"{{.*}}spyre.tile = array<i64: 512, 64, 64>
// CHECK: "spyre.map"
// CHECK: spyre.tile = array<i64: 64>
func.func @matmul_map(%x: tensor<1024x1024x!spyre.dlf16>, %w: tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 1, 1>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  %g = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 16>} : (tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  return %g : tensor<1024x64x!spyre.dlf16>
}

// -----
// ERRORS

func.func @no_grid(%x: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  // expected-error @+1 {{spyre-tile: 'spyre.softmax' has no spyre.grid: run spyre-divide-work first}}
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %s : tensor<64x64x!spyre.dlf16>
}

// -----

// One row of a million dlf16 values (2 MiB in, 2 MiB out, a 4 MiB fp32 working copy) cannot fit.
func.func @wide_row(%x: tensor<8x1048576x!spyre.dlf16>) -> tensor<8x1048576x!spyre.dlf16> {
  // expected-error @+1 {{spyre-tile: a single row of spyre.softmax with 8 rows needs 8388736 bytes of scratchpad, 1589376 available}}
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 8>} : (tensor<8x1048576x!spyre.dlf16>) -> tensor<8x1048576x!spyre.dlf16>
  return %s : tensor<8x1048576x!spyre.dlf16>
}

// -----

// A hand-written grid that does not split the rows evenly.
func.func @uneven_grid(%x: tensor<1000x64x!spyre.dlf16>) -> tensor<1000x64x!spyre.dlf16> {
  // expected-error @+1 {{spyre-tile: spyre.grid [32] does not split the 1000 iteration space of 'spyre.softmax' evenly}}
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32, spyre.grid = array<i64: 32>} : (tensor<1000x64x!spyre.dlf16>) -> tensor<1000x64x!spyre.dlf16>
  return %s : tensor<1000x64x!spyre.dlf16>
}

// -----

// A ragged N split (grid [1, 3, 1] over N = 100000: blocks of 33344 columns, the last shorter) is walked as one
// tile column, so even the smallest K step holds a [64, 33344] B tile (4 MB).
func.func @uncuttable(%a: tensor<8x64x!spyre.dlf16>, %b: tensor<64x100000x!spyre.dlf16>) -> tensor<8x100000x!spyre.dlf16> {
  // expected-error @+1 {{spyre-tile: tile 8x33344x64 of 'spyre.matmul' needs 5869568 bytes of scratchpad, 1589376 available}}
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 1, 3, 1>} : (tensor<8x64x!spyre.dlf16>, tensor<64x100000x!spyre.dlf16>) -> tensor<8x100000x!spyre.dlf16>
  return %r : tensor<8x100000x!spyre.dlf16>
}
