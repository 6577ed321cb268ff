// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
#col = affine_map<(d0, d1) -> (d0)>
#tr = affine_map<(d0, d1) -> (d1, d0)>

// A trailing-dim broadcast needs no reshape; a leading-dim one becomes 8x1; a transposed read a transpose.
// Captured scalar constants move into the isolated body.
// CHECK-LABEL: func.func @broadcasts
// CHECK-DAG: %[[C:.*]] = "spyre.reshape"(%arg2) : (tensor<8xf32>) -> tensor<8x1xf32>
// CHECK-DAG: %[[T:.*]] = "spyre.transpose"(%arg3) {permutation = array<i64: 1, 0>} : (tensor<32x8xf32>) -> tensor<8x32xf32>
// CHECK: "spyre.map"(%arg0, %arg1, %[[C]], %[[T]]) ({
// CHECK-NEXT: ^bb0(%[[A:.*]]: f32, %[[B:.*]]: f32, %[[D:.*]]: f32, %[[E:.*]]: f32):
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[S:.*]] = arith.addf %[[A]], %[[B]] : f32
// CHECK-NEXT: %[[M:.*]] = arith.mulf %[[S]], %[[D]] : f32
// CHECK-NEXT: %[[N:.*]] = arith.subf %[[M]], %[[E]] : f32
// CHECK-NEXT: %[[X:.*]] = math.exp %[[N]] : f32
// CHECK-NEXT: %[[Y:.*]] = arith.addf %[[X]], %[[ONE]] : f32
// CHECK-NEXT: "spyre.yield"(%[[Y]]) : (f32) -> ()
// CHECK-NEXT: }) {operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<8x32xf32>, tensor<32xf32>, tensor<8x1xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
// CHECK-NOT: linalg.generic
func.func @broadcasts(%x: tensor<8x32xf32>, %bias: tensor<32xf32>, %scale: tensor<8xf32>, %t: tensor<32x8xf32>) -> tensor<8x32xf32> {
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %g = linalg.generic {indexing_maps = [#id, #row, #col, #tr, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %bias, %scale, %t : tensor<8x32xf32>, tensor<32xf32>, tensor<8xf32>, tensor<32x8xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %d: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %m = arith.mulf %s, %c : f32
    %n = arith.subf %m, %d : f32
    %x2 = math.exp %n : f32
    %y = arith.addf %x2, %one : f32
    linalg.yield %y : f32
  } -> tensor<8x32xf32>
  return %g : tensor<8x32xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#red = affine_map<(d0, d1) -> (d0)>

// A body that reads its output is an accumulation, not a map: it becomes a spyre.reduce (see reduce.mlir),
// with the accumulator, which is not a zero fill, added after it.
// CHECK-LABEL: func.func @reduction_stays
// CHECK: %[[R:.*]] = "spyre.reduce"(%arg0) {dims = array<i64: 1>, keepdim = false, kind = "sum"}
// CHECK: "spyre.map"(%[[R]], %arg1)
// CHECK-NOT: linalg.generic
func.func @reduction_stays(%x: tensor<8x32xf32>, %init: tensor<8xf32>) -> tensor<8xf32> {
  %g = linalg.generic {indexing_maps = [#id, #red], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<8x32xf32>) outs(%init : tensor<8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  } -> tensor<8xf32>
  return %g : tensor<8xf32>
}

// -----

#id = affine_map<(d0) -> (d0)>

// More inputs than the SFU streams stay unconverted.
// CHECK-LABEL: func.func @too_many_inputs
// CHECK: linalg.generic
func.func @too_many_inputs(%a: tensor<8xf32>, %b: tensor<8xf32>, %c: tensor<8xf32>, %d: tensor<8xf32>, %e: tensor<8xf32>) -> tensor<8xf32> {
  %o = tensor.empty() : tensor<8xf32>
  %g = linalg.generic {indexing_maps = [#id, #id, #id, #id, #id, #id], iterator_types = ["parallel"]}
      ins(%a, %b, %c, %d, %e : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) outs(%o : tensor<8xf32>) {
  ^bb0(%p: f32, %q: f32, %r: f32, %s: f32, %t: f32, %u: f32):
    %0 = arith.addf %p, %q : f32
    %1 = arith.addf %0, %r : f32
    %2 = arith.addf %1, %s : f32
    %3 = arith.addf %2, %t : f32
    linalg.yield %3 : f32
  } -> tensor<8xf32>
  return %g : tensor<8xf32>
}
