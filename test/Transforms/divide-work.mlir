// The cases before the "HOST" line divide; the ones after it run on the host on one core (ONE) or two (TWO).
// RUN: sed -e '/^\/\/ HOST/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=32})' | filecheck %s
// RUN: sed -e '/^\/\/ HOST/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=4})' | filecheck %s --check-prefix=FOUR
// RUN: sed -n -e '/^\/\/ HOST/,$p' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=1})' | filecheck %s --check-prefix=ONE
// RUN: sed -n -e '/^\/\/ HOST/,$p' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=2})' | filecheck %s --check-prefix=TWO
// RUN: not spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=33})' 2>&1 | filecheck %s --check-prefix=TOO-MANY
// RUN: not spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=-1})' 2>&1 | filecheck %s --check-prefix=NEGATIVE
// A target file with an 8-core card: its core count is the default, and more is impossible.
// RUN: sed -e '/card.max_cores/,/^value/ s/^value = 32/value = 8/' %S/../../spyre_mlir/targets/spyre.toml > %t.toml
// RUN: sed -e '/^\/\/ HOST/,$d' %s | spyre-opt --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{target=%t.toml})' | filecheck %s --check-prefix=EIGHT
// RUN: not spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{cores=16 target=%t.toml})' 2>&1 | filecheck %s --check-prefix=NOT-EIGHT
// NOT-EIGHT: error: spyre-divide-work: impossible core count 16: target 'spyre' has 1..8 cores
// RUN: not spyre-opt %s --split-input-file -p 'builtin.module(spyre-select-kernels,spyre-divide-work{target=%t.missing.toml})' 2>&1 | filecheck %s --check-prefix=NO-TARGET
// NO-TARGET: error: spyre-divide-work: {{.*}}missing.toml: target file not found
// TOO-MANY: error: spyre-divide-work: impossible core count 33: target 'spyre' has 1..32 cores
// NEGATIVE: error: spyre-divide-work: impossible core count -1: target 'spyre' has 1..32 cores

// A 1024^3 matmul: the cores of a grid row share their A tiles and those of a grid column their B tiles over
// the ring, so device memory sees A and B once whatever the grid: every core is used (M and N split, K whole).
// CHECK-LABEL: func.func @matmul_1024
// CHECK: "spyre.matmul"{{.*}}spyre.grid = array<i64: 2, 16, 1>
// FOUR-LABEL: func.func @matmul_1024
// FOUR: "spyre.matmul"{{.*}}spyre.grid = array<i64: 1, 4, 1>
func.func @matmul_1024(%a: tensor<1024x1024x!spyre.dlf16>, %b: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %r : tensor<1024x1024x!spyre.dlf16>
}

// -----

// N = 688 (an MLP's hidden size) is 10.75 sticks: no even split in whole sticks, so N splits ragged, every
// core's block ceil(688 / gn) rounded up to whole sticks but the last, which takes the rest: 11 blocks of one
// stick (the last 48 columns) on 32 cores, 4 blocks of 192 (the last 112) on 4. On 32 cores the whole rows of
// 11 cores (4,883 modeled cycles, K in two steps) edge out 2 row blocks of them (4,899): B's bytes bound both.
// CHECK-LABEL: func.func @ragged_n
// CHECK: "spyre.matmul"{{.*}}spyre.grid = array<i64: 1, 11, 1>
// FOUR-LABEL: func.func @ragged_n
// FOUR: "spyre.matmul"{{.*}}spyre.grid = array<i64: 1, 4, 1>
func.func @ragged_n(%a: tensor<128x256x!spyre.dlf16>, %b: tensor<256x688x!spyre.dlf16>) -> tensor<128x688x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<128x256x!spyre.dlf16>, tensor<256x688x!spyre.dlf16>) -> tensor<128x688x!spyre.dlf16>
  return %r : tensor<128x688x!spyre.dlf16>
}

// -----

// An embedding lookup in a table larger than a core's 256 MB span (Granite-3.3-8B's: 49159 x 4096 f32): no device
// kernel gathers, the runtime's host gather reads the table, so the op gets no grid whatever the table's size.
// CHECK-LABEL: func.func @big_embedding
// CHECK: "spyre.gather"(%arg0, %arg1) {spyre.on_host = "no device kernel for spyre.gather
// CHECK-NOT: spyre.grid
func.func @big_embedding(%table: tensor<49159x4096xf32>, %ids: tensor<1x16xi64>) -> tensor<1x16x4096xf32> {
  %0 = "spyre.gather"(%table, %ids) : (tensor<49159x4096xf32>, tensor<1x16xi64>) -> tensor<1x16x4096xf32>
  return %0 : tensor<1x16x4096xf32>
}

// -----

// A 64x64 matmul: with the operands shared, a few cores still win a little (the PT work divides, the bytes
// do not grow, each core's B part is sent while it loads its A rows); more would pay more in ring hops and
// barriers than they save.
// CHECK-LABEL: func.func @matmul_64
// CHECK: "spyre.matmul"{{.*}}spyre.grid = array<i64: 8, 1, 1>
func.func @matmul_64(%a: tensor<64x64x!spyre.dlf16>, %b: tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x64x!spyre.dlf16>, tensor<64x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %r : tensor<64x64x!spyre.dlf16>
}

// -----

// M and N are one stick each: M alone cannot use the cores, so K is split too, in whole sticks (ring reduce-sum).
// CHECK-LABEL: func.func @split_k
// CHECK: "spyre.matmul"{{.*}}spyre.grid = array<i64: 1, 1, 16>
func.func @split_k(%a: tensor<64x65536x!spyre.dlf16>, %b: tensor<65536x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<64x65536x!spyre.dlf16>, tensor<65536x64x!spyre.dlf16>) -> tensor<64x64x!spyre.dlf16>
  return %r : tensor<64x64x!spyre.dlf16>
}

// -----

// Row-wise ops split the rows (the innermost dim stays whole on a core).
// CHECK-LABEL: func.func @softmax
// CHECK: "spyre.softmax"{{.*}}spyre.grid = array<i64: 32>
// FOUR-LABEL: func.func @softmax
// FOUR: "spyre.softmax"{{.*}}spyre.grid = array<i64: 4>
// EIGHT-LABEL: func.func @softmax
// EIGHT: "spyre.softmax"{{.*}}spyre.grid = array<i64: 8>
func.func @softmax(%x: tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16> {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<1024x1024x!spyre.dlf16>) -> tensor<1024x1024x!spyre.dlf16>
  return %s : tensor<1024x1024x!spyre.dlf16>
}

// -----

// 1000 rows do not split 32 ways: the largest even split below, 25 cores.
// CHECK-LABEL: func.func @uneven_rows
// CHECK: "spyre.softmax"{{.*}}spyre.grid = array<i64: 25>
func.func @uneven_rows(%x: tensor<1000x1024x!spyre.dlf16>) -> tensor<1000x1024x!spyre.dlf16> {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<1000x1024x!spyre.dlf16>) -> tensor<1000x1024x!spyre.dlf16>
  return %s : tensor<1000x1024x!spyre.dlf16>
}

// -----

// An elementwise map with a bias broadcast over rows; the rows of a 3-D tensor are its flattened leading dims.
// It is memory-bound: on 32 cores each core has one tile, so every core loads, then (after a barrier) every
// core stores, each phase at the read or write bandwidth instead of the mixed one of streamed tiles.
// A tiny map stays on one core.
// CHECK-LABEL: func.func @maps
// CHECK: "spyre.map"
// CHECK: spyre.grid = array<i64: 32>
// CHECK: "spyre.map"
// CHECK: spyre.grid = array<i64: 1>
func.func @maps(%x: tensor<4x256x1024x!spyre.dlf16>, %bias: tensor<1024x!spyre.dlf16>, %y: tensor<8x64x!spyre.dlf16>) -> (tensor<4x256x1024x!spyre.dlf16>, tensor<8x64x!spyre.dlf16>) {
  %m = "spyre.map"(%x, %bias) ({
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %b : f32
    %t = math.tanh %s : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x256x1024x!spyre.dlf16>, tensor<1024x!spyre.dlf16>) -> tensor<4x256x1024x!spyre.dlf16>
  %n = "spyre.map"(%y) ({
  ^bb0(%a: f32):
    %e = math.exp %a : f32
    "spyre.yield"(%e) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %m, %n : tensor<4x256x1024x!spyre.dlf16>, tensor<8x64x!spyre.dlf16>
}

// -----

// A matmul feeding a map: each op gets its own grid. Host regions are not device ops.
// CHECK-LABEL: func.func @matmul_map
// CHECK: "spyre.matmul"{{.*}}spyre.grid = array<i64: 32, 1, 1>
// CHECK: "spyre.map"
// CHECK: spyre.grid = array<i64: 16>
// CHECK: "spyre.host"
// CHECK-NEXT: "spyre.cast"(%{{.*}}) {operandSegmentSizes = array<i32: 1, 0>} :
// CHECK-NEXT: "spyre.yield"
// CHECK-NEXT: }) {reason = "test"} :
func.func @matmul_map(%x: tensor<1024x1024x!spyre.dlf16>, %w: tensor<1024x64x!spyre.dlf16> {spyre.param = "fc.weight"}) -> (tensor<1024x64x!spyre.dlf16>, tensor<1024x64xf32>) {
  %r = "spyre.matmul"(%x, %w) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1024x1024x!spyre.dlf16>, tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  %g = "spyre.map"(%r) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64x!spyre.dlf16>
  %h = "spyre.host"() ({
    %c = "spyre.cast"(%g) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<1024x64x!spyre.dlf16>) -> tensor<1024x64xf32>
    "spyre.yield"(%c) : (tensor<1024x64xf32>) -> ()
  }) {reason = "test"} : () -> tensor<1024x64xf32>
  return %g, %h : tensor<1024x64x!spyre.dlf16>, tensor<1024x64xf32>
}

// -----
// HOST (no division fits: the op runs on the host, `spyre.on_host` says why, and gets no grid)

// 256 MB of fp32 in and 128 MB of dlf16 out do not fit one core's 256 MB span: two cores at least.
// ONE-LABEL: func.func @span
// ONE: "spyre.cast"{{.*}}spyre.on_host = "no division of spyre.cast with 8192 rows over at most 1 cores keeps each core's device memory within the 268435456-byte span
// ONE-NOT: spyre.grid
// TWO-LABEL: func.func @span
// TWO: "spyre.cast"{{.*}}spyre.grid = array<i64: 2>
func.func @span(%x: tensor<8192x8192xf32>) -> tensor<8192x8192x!spyre.dlf16> {
  %c = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<8192x8192xf32>) -> tensor<8192x8192x!spyre.dlf16>
  return %c : tensor<8192x8192x!spyre.dlf16>
}

// -----

// 32 GB of A: no even division over the cores brings a core's slice under 256 MB. The tanh its kernel would
// have applied to each finished tile (an epilogue) runs on the host with it.
// ONE-LABEL: func.func @huge
// ONE: "spyre.matmul"{{.*}}spyre.on_host = "no division of spyre.matmul M=131072 N=64 K=131072 over at most 1 cores
// ONE: "spyre.map"
// ONE: spyre.on_host = "computed by the kernel of a spyre.matmul that runs on the host"
// TWO-LABEL: func.func @huge
// TWO: "spyre.matmul"{{.*}}spyre.on_host = "no division of spyre.matmul M=131072 N=64 K=131072 over at most 2 cores
func.func @huge(%a: tensor<131072x131072x!spyre.dlf16>, %b: tensor<131072x64x!spyre.dlf16>) -> tensor<131072x64xf32> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<131072x131072x!spyre.dlf16>, tensor<131072x64x!spyre.dlf16>) -> tensor<131072x64x!spyre.dlf16>
  %t = "spyre.map"(%r) ({
  ^bb0(%x: f32):
    %y = math.tanh %x : f32
    "spyre.yield"(%y) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<131072x64x!spyre.dlf16>) -> tensor<131072x64x!spyre.dlf16>
  %o = "spyre.cast"(%t) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<131072x64x!spyre.dlf16>) -> tensor<131072x64xf32>
  return %o : tensor<131072x64xf32>
}

// -----

// A softmax keeps each row whole on a core, and one row of 400,000 fp32 values (1.6 MB) leaves no room in the
// scratchpad for its result: the host runs it, on any number of cores.
// ONE-LABEL: func.func @long_row
// ONE: "spyre.softmax"{{.*}}spyre.on_host = "no division of spyre.softmax with 1 rows over at most 1 cores
// TWO-LABEL: func.func @long_row
// TWO: "spyre.softmax"{{.*}}spyre.on_host = "no division of spyre.softmax with 1 rows over at most 2 cores
func.func @long_row(%x: tensor<1x400000xf32>) -> tensor<1x400000xf32> {
  %s = "spyre.softmax"(%x) {dim = -1 : i64, acc_type = f32} : (tensor<1x400000xf32>) -> tensor<1x400000xf32>
  return %s : tensor<1x400000xf32>
}
