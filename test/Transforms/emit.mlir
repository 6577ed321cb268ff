// spyre-emit on hand-annotated kernel-level IR: the listing (one line per instruction and core) shows the
// kernels, buffers and host ops. The cases after the "ERRORS" line fail with a located diagnostic.
// RUN: sed -e '/^\/\/ ERRORS/,$d' %s | spyre-opt --split-input-file -o /dev/null -p 'builtin.module(spyre-select-kernels,spyre-allocate-scratchpad,spyre-schedule,spyre-emit{listing=- cores=2})' | filecheck %s
// RUN: sed -n -e '/^\/\/ ERRORS/,$p' %s | spyre-opt --split-input-file --verify-diagnostics -o /dev/null -p 'builtin.module(spyre-select-kernels,spyre-allocate-scratchpad,spyre-schedule,spyre-emit{cores=2})'

// A [64,128] x [128,128] matmul split over M on two cores: each core loads half of B and shares it over the
// ring, multiplies its A rows on the PT array into an fp32 accumulator, writes back dlf16 and stores its half:
// in pieces of whole PT row blocks (8, 8, then 16 rows), each stored while the next one is multiplied. A
// barrier closes the op because spyre.barrier says its result crosses cores.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: // buffer in0: input dlf16[64, 128]
// CHECK: // buffer in1: input dlf16[128, 128]
// CHECK: // buffer out0: output dlf16[64, 128]
// CHECK: core 0:
// CHECK: dma_load
// CHECK: ring_send
// CHECK: barrier mask=3
// CHECK-NEXT: matmul flags=2 m=8 n=128 k=128
// CHECK-NEXT: dma_store dev=49152 a0=57344 m=1 n=8
// CHECK-NEXT: matmul flags=2 m=8 n=128 k=128 a0=2048
// CHECK-NEXT: dma_store dev=51200 a0=59392 m=1 n=8
// CHECK-NEXT: matmul flags=2 m=16 n=128 k=128 a0=4096
// CHECK-NEXT: dma_store dev=53248 a0=61440 m=1 n=16
// CHECK-NEXT: barrier mask=3
// CHECK: core 1:
// CHECK: matmul flags=2 m=8 n=128 k=128
// CHECK: barrier mask=3
func.func @main(%a: tensor<64x128x!spyre.dlf16>, %b: tensor<128x128x!spyre.dlf16>) -> tensor<64x128x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.barrier = true, spyre.double_buffer = false, spyre.grid = array<i64: 2, 1, 1>, spyre.tile = array<i64: 32, 128, 128>} : (tensor<64x128x!spyre.dlf16>, tensor<128x128x!spyre.dlf16>) -> tensor<64x128x!spyre.dlf16>
  return %r : tensor<64x128x!spyre.dlf16>
}

// -----

// A reshape that keeps the innermost dim is an alias (no instructions), but a barrier the plan put on it still
// closes the producer: the second map runs on core 0 only and reads rows core 1 wrote.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: core 0:
// CHECK: sfu fn=neg m=4 n=64
// CHECK: barrier mask=3
// CHECK: sfu fn=neg m=8 n=64
// CHECK: core 1:
// CHECK: sfu fn=neg m=4 n=64
// CHECK: barrier mask=3
// CHECK-NOT: sfu
func.func @main(%x: tensor<8x64x!spyre.dlf16>) -> tensor<4x2x64x!spyre.dlf16> {
  %a = "spyre.map"(%x) ({
  ^bb0(%e: f32):
    %n = arith.negf %e : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.barrier = false, spyre.double_buffer = false, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 4>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  %v = "spyre.reshape"(%a) {spyre.barrier = true, spyre.double_buffer = false, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 8>} : (tensor<8x64x!spyre.dlf16>) -> tensor<4x2x64x!spyre.dlf16>
  %b = "spyre.map"(%v) ({
  ^bb0(%e: f32):
    %n = arith.negf %e : f32
    "spyre.yield"(%n) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.barrier = false, spyre.double_buffer = false, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 8>} : (tensor<4x2x64x!spyre.dlf16>) -> tensor<4x2x64x!spyre.dlf16>
  return %b : tensor<4x2x64x!spyre.dlf16>
}

// -----

// Split-K over the two cores: each core accumulates half of K in 64-deep steps; the partial sums meet in a
// ring reduce-sum on core 0, which adds the bias row (an fp32 parameter, a binary input under plain
// spyre-opt) and rounds once.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: // buffer fc.bias: input fp32[128]
// CHECK: core 0:
// CHECK: matmul m=16 n=128 k=64
// CHECK: matmul flags=1 m=16 n=128 k=64
// CHECK: ring_reduce mask=3 m=16 n=128
// CHECK: barrier mask=3
// CHECK: sfu fn=add flags=2
// CHECK: sfu fn=cast
// CHECK: dma_store
// CHECK: core 1:
// CHECK: ring_reduce mask=3 m=16 n=128
// CHECK-NEXT: barrier mask=3
// No barrier after the matmul: only func.return reads it, and the host reads outputs after every core ended.
// CHECK-NEXT: end
func.func @main(%a: tensor<16x256x!spyre.dlf16>, %b: tensor<256x128x!spyre.dlf16>, %bias: tensor<128xf32> {spyre.param = "fc.bias"}) -> tensor<16x128x!spyre.dlf16> {
  %r = "spyre.matmul"(%a, %b, %bias) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 1>, spyre.double_buffer = false, spyre.grid = array<i64: 1, 1, 2>, spyre.tile = array<i64: 16, 128, 64>} : (tensor<16x256x!spyre.dlf16>, tensor<256x128x!spyre.dlf16>, tensor<128xf32>) -> tensor<16x128x!spyre.dlf16>
  return %r : tensor<16x128x!spyre.dlf16>
}

// -----

// A map: the body becomes SFU instructions on fp32 temporaries; the [64] operand is a per-column (COL,
// flags=2) broadcast loaded once per core; erf goes through gelu_erf; the result rounds once: its last op
// writes the dlf16 output tile (f0=1), no cast.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: core 0:
// CHECK: dma_load
// CHECK: sfu fn=add flags=2 m=4 n=64
// CHECK: sfu fn=gelu_erf
// CHECK: sfu fn=select
// CHECK: sfu fn=mul
// CHECK-NEXT: sfu fn=sub flags=3 m=4 n=64 a0=[[OUT:[0-9]+]] f0=1 {{.*}}imm=1
// CHECK-NEXT: dma_store {{.*}}a0=[[OUT]] 
// CHECK: core 1:
// CHECK: sfu fn=add flags=2 m=4 n=64
func.func @main(%x: tensor<8x64x!spyre.dlf16>, %y: tensor<64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> {
  %r = "spyre.map"(%x, %y) ({
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %b : f32
    %e = math.erf %s : f32
    "spyre.yield"(%e) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 4>} : (tensor<8x64x!spyre.dlf16>, tensor<64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %r : tensor<8x64x!spyre.dlf16>
}

// -----

// ReLU as Torch-MLIR writes it, select(x > 0 unordered, x, +0.0), and its mirror select(x <= 0 ordered, +0.0, x):
// one RELU each (fp32 max(x, +0): NaN stays NaN and -0.0 becomes +0.0, as the select gives), no compare. The
// comparison is not emitted when the select is its only reader.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: core 0:
// CHECK: dma_load
// CHECK-NOT: sfu fn=gt
// CHECK: sfu fn=relu m=4 n=64
// CHECK-NEXT: sfu fn=neg m=4 n=64
// CHECK-NEXT: sfu fn=relu m=4 n=64
// CHECK-NEXT: sfu fn=add {{.*}}f0=1
// CHECK-NEXT: dma_store
func.func @main(%x: tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> {
  %r = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.000000e+00 : f32
    %c = arith.cmpf ugt, %a, %z : f32
    %s = arith.select %c, %a, %z : f32
    %n = arith.negf %a : f32
    %d = arith.cmpf ole, %n, %z : f32
    %t = arith.select %d, %z, %n : f32
    %u = arith.addf %s, %t : f32
    "spyre.yield"(%u) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 4>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %r : tensor<8x64x!spyre.dlf16>
}

// -----

// Not ReLU: x >= 0 keeps -0.0 (max(x, +0) would not); a -0.0 "zero" is not +0.0; and a comparison another op
// also reads is emitted for it (the select still becomes RELU).
// CHECK-LABEL: // program: 2 core(s)
// CHECK: core 0:
// CHECK: sfu fn=ge
// CHECK-NEXT: sfu fn=select
// CHECK-NEXT: sfu fn=gt
// CHECK-NEXT: sfu fn=select
// CHECK-NEXT: sfu fn=gt
// CHECK-NEXT: sfu fn=relu
// CHECK-NEXT: sfu fn=add
func.func @main(%x: tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> {
  %r = "spyre.map"(%x) ({
  ^bb0(%a: f32):
    %z = arith.constant 0.000000e+00 : f32
    %m = arith.constant -0.000000e+00 : f32
    %c = arith.cmpf uge, %a, %z : f32
    %s = arith.select %c, %a, %z : f32
    %c2 = arith.cmpf ugt, %a, %m : f32
    %s2 = arith.select %c2, %a, %m : f32
    %c3 = arith.cmpf ugt, %a, %z : f32
    %s3 = arith.select %c3, %a, %z : f32
    %f = arith.uitofp %c3 : i1 to f32
    %u = arith.addf %s, %s2 : f32
    %v = arith.addf %u, %s3 : f32
    %w = arith.addf %v, %f : f32
    "spyre.yield"(%w) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 4>} : (tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %r : tensor<8x64x!spyre.dlf16>
}

// -----

// SiLU and sigmoid as Torch-MLIR writes them: x * (1 / (1 + exp(-x))) is one SILU, and 1 / (exp(-x) + 1) one
// SIGMOID; the SFU computes these functions with exactly those fp32 operations. An exp another op also reads
// stays (and so does what it reads); the sigmoid still reads x itself.
// CHECK-LABEL: // program: 2 core(s)
// CHECK: core 0:
// CHECK: sfu fn=silu m=4 n=64
// CHECK-NEXT: sfu fn=mul m=4 n=64
// CHECK-NEXT: sfu fn=neg
// CHECK-NEXT: sfu fn=exp
// CHECK-NEXT: sfu fn=sigmoid
// CHECK-NEXT: sfu fn=add
// CHECK-NEXT: sfu fn=add {{.*}}f0=1
// CHECK-NEXT: dma_store
func.func @main(%x: tensor<8x64x!spyre.dlf16>, %y: tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16> {
  %r = "spyre.map"(%x, %y) ({
  ^bb0(%a: f32, %b: f32):
    %one = arith.constant 1.000000e+00 : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %d = arith.addf %e, %one : f32
    %s = arith.divf %one, %d : f32
    %silu = arith.mulf %a, %s : f32
    %g = arith.mulf %silu, %b : f32
    %n2 = arith.negf %b : f32
    %e2 = math.exp %n2 : f32
    %d2 = arith.addf %e2, %one : f32
    %s2 = arith.divf %one, %d2 : f32
    %t = arith.addf %s2, %e2 : f32
    %u = arith.addf %g, %t : f32
    "spyre.yield"(%u) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>, spyre.grid = array<i64: 2>, spyre.tile = array<i64: 4>} : (tensor<8x64x!spyre.dlf16>, tensor<8x64x!spyre.dlf16>) -> tensor<8x64x!spyre.dlf16>
  return %r : tensor<8x64x!spyre.dlf16>
}

// -----

// A transpose of the last two dims (the innermost dim moves: a restickify) is one RESTICK on core 0's DMA
// engine, device memory to device memory (batch 2 = the leading dim), straight into the output. Its source is
// an input and its result is only returned, so no barrier fences it.
// CHECK-LABEL: // program: 2 core(s), {{[0-9]+}} B device memory, 0 host op(s)
// CHECK: // buffer out0: output dlf16[2, 64, 16]
// CHECK: core 0:
// CHECK-NEXT: restick {{.*}}a0={{[0-9]+}} m=2 n=16 k=64 f0=1
// CHECK-NEXT: end
// CHECK: core 1:
// CHECK-NEXT: end
func.func @main(%x: tensor<2x16x64x!spyre.dlf16>) -> tensor<2x64x16x!spyre.dlf16> {
  %t = "spyre.transpose"(%x) {permutation = array<i64: 0, 2, 1>, restickify = true, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 128>} : (tensor<2x16x64x!spyre.dlf16>) -> tensor<2x64x16x!spyre.dlf16>
  return %t : tensor<2x64x16x!spyre.dlf16>
}

// -----

// A host region runs on the host as the runtime's `jit` op (a function of the binary's host code, lowered to
// the LLVM dialect at compile time); a reshape of int64 data that changes the innermost dim uses the runtime's
// own `copy`. Barriers fence them.
// CHECK-LABEL: // program: 2 core(s), {{[0-9]+}} B device memory, 2 host op(s)
// CHECK: core 0:
// CHECK: barrier
// CHECK: host
// CHECK: // host_op 0: jit ['in0'] -> ['t0'] fn=host0
// CHECK: // host_op 1: copy ['t0'] -> ['out0']
func.func @main(%x: tensor<4x16xi64>) -> tensor<64xi64> {
  %h = "spyre.host"() ({
    %c = arith.constant dense<1> : tensor<4x16xi64>
    %s = arith.addi %x, %c : tensor<4x16xi64>
    "spyre.yield"(%s) : (tensor<4x16xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4x16xi64>
  %r = "spyre.reshape"(%h) {spyre.grid = array<i64: 1>, spyre.tile = array<i64: 1>} : (tensor<4x16xi64>) -> tensor<64xi64>
  return %r : tensor<64xi64>
}

// -----

// Host work of one spyre.round_trip runs as one host call at its first op: one jit function computing both
// results, the second reading the first's inside the call.
// CHECK-LABEL: // program: 2 core(s), {{[0-9]+}} B device memory, 1 host op(s)
// CHECK: // host_op 0: jit ['in0', 'in1'] -> ['out0', 'out1'] fn=host0
func.func @main(%x: tensor<4x16xi64>, %y: tensor<4x16xi64>) -> (tensor<4x16xi64>, tensor<4x16xi64>) {
  %a = "spyre.host"() ({
    %s = arith.addi %x, %x : tensor<4x16xi64>
    "spyre.yield"(%s) : (tensor<4x16xi64>) -> ()
  }) {reason = "int64 index math", spyre.round_trip = 0 : i64} : () -> tensor<4x16xi64>
  %b = "spyre.host"() ({
    %s = arith.muli %a, %y : tensor<4x16xi64>
    "spyre.yield"(%s) : (tensor<4x16xi64>) -> ()
  }) {reason = "int64 index math", spyre.round_trip = 0 : i64} : () -> tensor<4x16xi64>
  return %a, %b : tensor<4x16xi64>, tensor<4x16xi64>
}

// ERRORS

// A tile the scratchpad cannot hold is refused at the op.
func.func @main(%a: tensor<4096x4096x!spyre.dlf16>, %b: tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16> {
  // expected-error @+1 {{the buffers of tile [2048, 2048, 2048] need 41943040 bytes of scratchpad}}
  %r = "spyre.matmul"(%a, %b) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>, spyre.grid = array<i64: 2, 1, 1>, spyre.tile = array<i64: 2048, 2048, 2048>} : (tensor<4096x4096x!spyre.dlf16>, tensor<4096x4096x!spyre.dlf16>) -> tensor<4096x4096x!spyre.dlf16>
  return %r : tensor<4096x4096x!spyre.dlf16>
}

// -----

// A round trip whose later op reads a value computed after its first op cannot run as one call: an error at the
// first op, never a silent split.
func.func @main(%x: tensor<4x64x!spyre.dlf16>, %i: tensor<4x16xi64>) -> (tensor<4x16xi64>, tensor<4x64xf32>) {
  // expected-error @+1 {{host work of round trip 0 reads a value computed after the round trip's first op}}
  %a = "spyre.host"() ({
    %s = arith.addi %i, %i : tensor<4x16xi64>
    "spyre.yield"(%s) : (tensor<4x16xi64>) -> ()
  }) {reason = "int64 index math", spyre.round_trip = 0 : i64} : () -> tensor<4x16xi64>
  %d = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>, spyre.grid = array<i64: 1>, spyre.tile = array<i64: 4>} : (tensor<4x64x!spyre.dlf16>) -> tensor<4x64xf32>
  %b = "spyre.host"() ({
    %e = arith.constant dense<1.0> : tensor<4x64xf32>
    %s = arith.addf %d, %e : tensor<4x64xf32>
    "spyre.yield"(%s) : (tensor<4x64xf32>) -> ()
  }) {reason = "test", spyre.round_trip = 0 : i64} : () -> tensor<4x64xf32>
  return %a, %b : tensor<4x16xi64>, tensor<4x64xf32>
}
