// Upstream and spyre passes mix in one pipeline, in the written order; bad pipelines are clear errors.
// RUN: spyre-opt %s -p 'builtin.module(canonicalize,spyre-convert-linalg,cse)' | filecheck %s
// RUN: spyre-opt %s --pass-pipeline='builtin.module(func.func(canonicalize),spyre-convert-linalg)' | filecheck %s
// RUN: spyre-opt %s -p 'builtin.module(spyre-convert-linalg,cse)' --mlir-print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=DUMP
// RUN: spyre-opt %s -p 'builtin.module(spyre-convert-linalg)' --timing 2>&1 >/dev/null | filecheck %s --check-prefix=TIME
// RUN: not spyre-opt %s -p 'builtin.module(no-such-pass)' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not spyre-opt %s -p 'builtin.module(spyre-convert-linalg{bogus=1})' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not spyre-opt %s -p 'builtin.module(func.func(spyre-convert-linalg))' 2>&1 | filecheck %s --check-prefix=NESTED
// RUN: spyre-opt < %s -p 'builtin.module(spyre-convert-linalg)' | filecheck %s
// RUN: spyre-opt %s -p 'builtin.module(spyre-convert-linalg)' -o %t && filecheck %s < %t

// CHECK-LABEL: func.func @f
// CHECK: "spyre.matmul"
// CHECK-NOT: linalg.matmul
// DUMP: IR Dump After spyre-convert-linalg
// DUMP: "spyre.matmul"
// DUMP: IR Dump After CSEPass
// TIME: Execution Time
// TIME: spyre-convert-linalg
// UNKNOWN: spyre-opt: error: unknown or malformed pass 'no-such-pass'
// OPTION: spyre-opt: error: pass 'spyre-convert-linalg' has no option 'bogus'
// NESTED: spyre-opt: error: spyre pass 'spyre-convert-linalg' runs on builtin.module; move it out of 'func.func(...)'
func.func @f(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>) -> tensor<8x32xf32> {
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  return %m : tensor<8x32xf32>
}
