// --verify-diagnostics passes when every expected diagnostic appears, and fails on a missing or stray one.
// RUN: spyre-opt %s --split-input-file --verify-diagnostics
// RUN: sed -e 's/expected-error @+1 {{contraction/expected-error @+1 {{nothing like this/' %s > %t.mlir
// RUN: not spyre-opt %t.mlir --split-input-file --verify-diagnostics 2>&1 | filecheck %s
// CHECK-DAG: error: expected error "nothing like this sizes differ" was not produced
// CHECK-DAG: error: unexpected error: 'spyre.matmul' op contraction sizes differ

func.func @same_line(%a: tensor<32x64xf32>, %b: tensor<63x16xf32>) {
  // expected-error @+1 {{contraction sizes differ}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<32x64xf32>, tensor<63x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @below(%x: tensor<8x64xf32>) {
  // expected-error @below {{element count changes}}
  %r = "spyre.reshape"(%x) : (tensor<8x64xf32>) -> tensor<8x63xf32>
  return
}
