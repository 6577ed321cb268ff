// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

#id = affine_map<(d0, d1) -> (d0, d1)>
#keep = affine_map<(d0, d1) -> (d0, 0)>
#drop = affine_map<(d0, d1) -> (d0)>

// Sum with a zero init: keepdim when the result map writes the reduced dim as 0, dropped when it omits it.
// CHECK-LABEL: func.func @sums
// CHECK-DAG: "spyre.reduce"(%arg0) {dims = array<i64: 1>, keepdim = true, kind = "sum"} : (tensor<4x64xf32>) -> tensor<4x1xf32>
// CHECK-DAG: "spyre.reduce"(%arg0) {dims = array<i64: 1>, keepdim = false, kind = "sum"} : (tensor<4x64xf32>) -> tensor<4xf32>
// CHECK-NOT: linalg
func.func @sums(%arg0: tensor<4x64xf32>) -> (tensor<4x1xf32>, tensor<4xf32>) {
  %cst = arith.constant 0.000000e+00 : f32
  %e = tensor.empty() : tensor<4x1xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<4x1xf32>) -> tensor<4x1xf32>
  %r = linalg.generic {indexing_maps = [#id, #keep], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x64xf32>) outs(%f : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %s = arith.addf %in, %out : f32
    linalg.yield %s : f32
  } -> tensor<4x1xf32>
  %e2 = tensor.empty() : tensor<4xf32>
  %f2 = linalg.fill ins(%cst : f32) outs(%e2 : tensor<4xf32>) -> tensor<4xf32>
  %r2 = linalg.generic {indexing_maps = [#id, #drop], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x64xf32>) outs(%f2 : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %s = arith.addf %out, %in : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  return %r, %r2 : tensor<4x1xf32>, tensor<4xf32>
}

// -----

#map8 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map11 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>

// torch-mlir's max over a dim also computes the argmax; with only the values used it is a max reduce.
// CHECK-LABEL: func.func @max_with_unused_argmax
// CHECK: %[[R:.*]] = "spyre.reduce"(%arg0) {dims = array<i64: 3>, keepdim = false, kind = "max"} : (tensor<1x4x16x16xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: return %[[R]]
func.func @max_with_unused_argmax(%47: tensor<1x4x16x16xf32>) -> tensor<1x4x16xf32> {
  %c0_i64 = arith.constant 0 : i64
  %cst_0 = arith.constant 0xFF800000 : f32
  %48 = tensor.empty() : tensor<1x4x16xi64>
  %49 = linalg.fill ins(%c0_i64 : i64) outs(%48 : tensor<1x4x16xi64>) -> tensor<1x4x16xi64>
  %50 = tensor.empty() : tensor<1x4x16xf32>
  %51 = linalg.fill ins(%cst_0 : f32) outs(%50 : tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
  %52:2 = linalg.generic {indexing_maps = [#map8, #map11, #map11], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%47 : tensor<1x4x16x16xf32>) outs(%51, %49 : tensor<1x4x16xf32>, tensor<1x4x16xi64>) {
  ^bb0(%in: f32, %out: f32, %out_84: i64):
    %146 = linalg.index 3 : index
    %147 = arith.index_cast %146 : index to i64
    %148 = arith.maximumf %in, %out : f32
    %149 = arith.cmpf ogt, %in, %out : f32
    %150 = arith.select %149, %147, %out_84 : i64
    linalg.yield %148, %150 : f32, i64
  } -> (tensor<1x4x16xf32>, tensor<1x4x16xi64>)
  return %52#0 : tensor<1x4x16xf32>
}

// -----

#map8 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map11 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>

// When the argmax is used too, there is no spyre form.
// CHECK-LABEL: func.func @argmax_used
// CHECK: linalg.generic
// CHECK-SAME: spyre.unconverted = "no spyre form for a multi-result reduction whose index results are used (argmax/argmin)"
func.func @argmax_used(%47: tensor<1x4x16x16xf32>) -> (tensor<1x4x16xf32>, tensor<1x4x16xi64>) {
  %c0_i64 = arith.constant 0 : i64
  %cst_0 = arith.constant 0xFF800000 : f32
  %48 = tensor.empty() : tensor<1x4x16xi64>
  %49 = linalg.fill ins(%c0_i64 : i64) outs(%48 : tensor<1x4x16xi64>) -> tensor<1x4x16xi64>
  %50 = tensor.empty() : tensor<1x4x16xf32>
  %51 = linalg.fill ins(%cst_0 : f32) outs(%50 : tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
  %52:2 = linalg.generic {indexing_maps = [#map8, #map11, #map11], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%47 : tensor<1x4x16x16xf32>) outs(%51, %49 : tensor<1x4x16xf32>, tensor<1x4x16xi64>) {
  ^bb0(%in: f32, %out: f32, %out_84: i64):
    %146 = linalg.index 3 : index
    %147 = arith.index_cast %146 : index to i64
    %148 = arith.maximumf %in, %out : f32
    %149 = arith.cmpf ogt, %in, %out : f32
    %150 = arith.select %149, %147, %out_84 : i64
    linalg.yield %148, %150 : f32, i64
  } -> (tensor<1x4x16xf32>, tensor<1x4x16xi64>)
  return %52#0, %52#1 : tensor<1x4x16xf32>, tensor<1x4x16xi64>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#drop = affine_map<(d0, d1) -> (d0)>

// min and prod; an init that is not the identity (here 0 for a min) is combined after the reduce.
// CHECK-LABEL: func.func @min_prod
// CHECK-DAG: %[[MIN:.*]] = "spyre.reduce"(%arg0) {dims = array<i64: 1>, keepdim = false, kind = "min"}
// CHECK-DAG: "spyre.reduce"(%arg0) {dims = array<i64: 1>, keepdim = false, kind = "prod"}
// CHECK-DAG: "spyre.map"(%[[MIN]], %{{.*}}) ({
// CHECK-DAG: arith.minimumf
func.func @min_prod(%arg0: tensor<4x64xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %zero = arith.constant 0.000000e+00 : f32
  %one = arith.constant 1.000000e+00 : f32
  %e = tensor.empty() : tensor<4xf32>
  %f0 = linalg.fill ins(%zero : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %f1 = linalg.fill ins(%one : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %mn = linalg.generic {indexing_maps = [#id, #drop], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x64xf32>) outs(%f0 : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %s = arith.minimumf %in, %out : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  %pr = linalg.generic {indexing_maps = [#id, #drop], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x64xf32>) outs(%f1 : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %s = arith.mulf %in, %out : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  return %mn, %pr : tensor<4xf32>, tensor<4xf32>
}

// -----

#map8 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map12 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>

// The all(-inf) test of SDPA's safe softmax reduces i1 with andi: all(b) is min(float(b)), converted back.
// CHECK-LABEL: func.func @and_reduction
// CHECK: %[[F:.*]] = "spyre.map"(%arg0) ({
// CHECK: arith.uitofp %{{.*}} : i1 to f32
// CHECK: %[[R:.*]] = "spyre.reduce"(%[[F]]) {dims = array<i64: 3>, keepdim = true, kind = "min"} : (tensor<1x4x16x16xf32>) -> tensor<1x4x16x1xf32>
// CHECK: %[[B:.*]] = "spyre.map"(%[[R]]) ({
// CHECK: arith.fptoui %{{.*}} : f32 to i1
// CHECK: return %[[B]]
func.func @and_reduction(%60: tensor<1x4x16x16xi1>) -> tensor<1x4x16x1xi1> {
  %true = arith.constant true
  %61 = tensor.empty() : tensor<1x4x16x1xi1>
  %62 = linalg.fill ins(%true : i1) outs(%61 : tensor<1x4x16x1xi1>) -> tensor<1x4x16x1xi1>
  %63 = linalg.generic {indexing_maps = [#map8, #map12], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%60 : tensor<1x4x16x16xi1>) outs(%62 : tensor<1x4x16x1xi1>) {
  ^bb0(%in: i1, %out: i1):
    %146 = arith.andi %in, %out : i1
    linalg.yield %146 : i1
  } -> tensor<1x4x16x1xi1>
  return %63 : tensor<1x4x16x1xi1>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#drop = affine_map<(d0, d1) -> (d0)>

// A bitwise and over i8 has no spyre form: it stays, with the reason.
// CHECK-LABEL: func.func @bitwise_and
// CHECK: linalg.generic
// CHECK-SAME: spyre.unconverted = "i8 has no device format"
func.func @bitwise_and(%x: tensor<4x8xi8>) -> tensor<4xi8> {
  %ones = arith.constant -1 : i8
  %e = tensor.empty() : tensor<4xi8>
  %f = linalg.fill ins(%ones : i8) outs(%e : tensor<4xi8>) -> tensor<4xi8>
  %r = linalg.generic {indexing_maps = [#id, #drop], iterator_types = ["parallel", "reduction"]} ins(%x : tensor<4x8xi8>) outs(%f : tensor<4xi8>) {
  ^bb0(%in: i8, %out: i8):
    %a = arith.andi %in, %out : i8
    linalg.yield %a : i8
  } -> tensor<4xi8>
  return %r : tensor<4xi8>
}
