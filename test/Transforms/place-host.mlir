// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse,spyre-place-host)' | filecheck %s
// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse,spyre-place-host{report=true})' -o %t 2>&1 | filecheck %s --check-prefix=REPORT

// The transformer example's positions: arange through linalg.index, an int64 reshape and a sitofp. All of it
// is int64 index math and stays on the host, one spyre.host per op, each reading the previous one's result;
// the float product that follows runs on the device. Constants and tensor.empty stay outside.
// CHECK-LABEL: func.func @positions
// CHECK: %[[E:.*]] = tensor.empty() : tensor<16xi64>
// CHECK: %[[A:.*]] = "spyre.host"() ({
// CHECK-NEXT: linalg.generic {{.*}} outs(%[[E]] : tensor<16xi64>)
// CHECK: }) {reason = "int64 index math"} : () -> tensor<16xi64>
// CHECK: %[[X:.*]] = "spyre.host"() ({
// CHECK-NEXT: tensor.expand_shape %[[A]]
// CHECK: }) {reason = "int64 index math (int64 index data is reshaped, sliced and filled on the host)"} : () -> tensor<16x1xi64>
// CHECK: %[[F:.*]] = "spyre.host"() ({
// CHECK: arith.sitofp
// CHECK: }) {reason = "int64 index math"} : () -> tensor<16x1xf32>
// CHECK: "spyre.map"(%[[F]], %{{.*}})
// CHECK-NOT: spyre.unconverted
// REPORT: spyre-place-host: 2 ops on device, 3 on host
// REPORT-DAG: device 1 spyre.map
// REPORT-DAG: device 1 spyre.reshape
// REPORT-DAG: host 2 linalg.generic int64 index math
// REPORT-DAG: host 1 tensor.expand_shape int64 index math (int64 index data is reshaped, sliced and filled on the host)
// REPORT-DAG: host: linalg.generic at loc({{.*}}): int64 index math
#map2 = affine_map<(d0) -> (d0)>
#map3 = affine_map<(d0, d1) -> (d0, d1)>
#map4 = affine_map<(d0, d1) -> (d0, 0)>
#map5 = affine_map<(d0, d1) -> (0, d1)>
func.func @positions(%arg22: tensor<8xf32>) -> tensor<16x8xf32> {
  %2 = tensor.empty() : tensor<16xi64>
  %3 = linalg.generic {indexing_maps = [#map2], iterator_types = ["parallel"]} outs(%2 : tensor<16xi64>) {
  ^bb0(%out: i64):
    %146 = linalg.index 0 : index
    %147 = arith.index_cast %146 : index to i64
    linalg.yield %147 : i64
  } -> tensor<16xi64>
  %expanded = tensor.expand_shape %3 [[0, 1]] output_shape [16, 1] : tensor<16xi64> into tensor<16x1xi64>
  %4 = tensor.empty() : tensor<16x1xf32>
  %5 = linalg.generic {indexing_maps = [#map3, #map3], iterator_types = ["parallel", "parallel"]} ins(%expanded : tensor<16x1xi64>) outs(%4 : tensor<16x1xf32>) {
  ^bb0(%in: i64, %out: f32):
    %146 = arith.sitofp %in : i64 to f32
    linalg.yield %146 : f32
  } -> tensor<16x1xf32>
  %expanded_10 = tensor.expand_shape %arg22 [[0, 1]] output_shape [1, 8] : tensor<8xf32> into tensor<1x8xf32>
  %6 = tensor.empty() : tensor<16x8xf32>
  %7 = linalg.generic {indexing_maps = [#map4, #map5, #map3], iterator_types = ["parallel", "parallel"]} ins(%5, %expanded_10 : tensor<16x1xf32>, tensor<1x8xf32>) outs(%6 : tensor<16x8xf32>) {
  ^bb0(%in: f32, %in_84: f32, %out: f32):
    %146 = arith.mulf %in, %in_84 : f32
    linalg.yield %146 : f32
  } -> tensor<16x8xf32>
  return %7 : tensor<16x8xf32>
}

// -----

// Ops the converter never saw get a reason from what they are: data-dependent control flow, scalar element
// access, int64 index math on scalars. The map converted inside the scf.if goes to the host with it (the
// report counts the ops directly in the function body).
// CHECK-LABEL: func.func @derived_reasons
// CHECK: "spyre.host"() ({
// CHECK-NEXT: tensor.extract
// CHECK: }) {reason = "scalar tensor element access"} : () -> i1
// CHECK: "spyre.host"() ({
// CHECK-NEXT: arith.addi
// CHECK: }) {reason = "int64 index math"} : () -> index
// CHECK: "spyre.host"() ({
// CHECK-NEXT: scf.if
// CHECK: }) {reason = "data-dependent control flow"} : () -> tensor<4xf32>
// REPORT: spyre-place-host: 0 ops on device, 3 on host
// REPORT-DAG: host 1 scf.if data-dependent control flow
// REPORT-DAG: host 1 tensor.extract scalar tensor element access
// REPORT-DAG: host 1 arith.addi int64 index math
func.func @derived_reasons(%flags: tensor<4xi1>, %x: tensor<4xf32>, %i: index) -> (tensor<4xf32>, index) {
  %c1 = arith.constant 1 : index
  %f = tensor.extract %flags[%i] : tensor<4xi1>
  %j = arith.addi %i, %c1 : index
  %r = scf.if %f -> tensor<4xf32> {
    %e = tensor.empty() : tensor<4xf32>
    %n = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x : tensor<4xf32>) outs(%e : tensor<4xf32>) {
    ^bb0(%in: f32, %out: f32):
      %m = arith.negf %in : f32
      linalg.yield %m : f32
    } -> tensor<4xf32>
    scf.yield %n : tensor<4xf32>
  } else {
    scf.yield %x : tensor<4xf32>
  }
  return %r, %j : tensor<4xf32>, index
}

// -----

// A multi-result op with both results used (max and argmax) gets one host op per result, each recomputing it.
// The int64 init of the argmax is host work too.
// CHECK-LABEL: func.func @argmax
// CHECK: "spyre.host"() ({
// CHECK-NEXT: linalg.fill
// CHECK: }) {reason = "int64 index math (int64 index data is reshaped, sliced and filled on the host)"} : () -> tensor<4xi64>
// CHECK: %[[V:.*]] = "spyre.host"() ({
// CHECK: %[[G:.*]]:2 = linalg.generic
// CHECK: "spyre.yield"(%[[G]]#0) : (tensor<4xf32>) -> ()
// CHECK-NEXT: }) {reason = "no spyre form for a multi-result reduction whose index results are used (argmax/argmin)"} : () -> tensor<4xf32>
// CHECK: %[[I:.*]] = "spyre.host"() ({
// CHECK: %[[H:.*]]:2 = linalg.generic
// CHECK: "spyre.yield"(%[[H]]#1) : (tensor<4xi64>) -> ()
// CHECK-NEXT: }) {reason = "no spyre form for a multi-result reduction whose index results are used (argmax/argmin)"} : () -> tensor<4xi64>
// CHECK: return %[[V]], %[[I]]
// REPORT: spyre-place-host: 1 ops on device, 3 on host
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @argmax(%x: tensor<4x16xf32>) -> (tensor<4xf32>, tensor<4xi64>) {
  %c0_i64 = arith.constant 0 : i64
  %ninf = arith.constant 0xFF800000 : f32
  %e0 = tensor.empty() : tensor<4xi64>
  %f0 = linalg.fill ins(%c0_i64 : i64) outs(%e0 : tensor<4xi64>) -> tensor<4xi64>
  %e1 = tensor.empty() : tensor<4xf32>
  %f1 = linalg.fill ins(%ninf : f32) outs(%e1 : tensor<4xf32>) -> tensor<4xf32>
  %r:2 = linalg.generic {indexing_maps = [#in, #out, #out], iterator_types = ["parallel", "reduction"]} ins(%x : tensor<4x16xf32>) outs(%f1, %f0 : tensor<4xf32>, tensor<4xi64>) {
  ^bb0(%in: f32, %out: f32, %out_1: i64):
    %i = linalg.index 1 : index
    %ii = arith.index_cast %i : index to i64
    %m = arith.maximumf %in, %out : f32
    %c = arith.cmpf ogt, %in, %out : f32
    %s = arith.select %c, %ii, %out_1 : i64
    linalg.yield %m, %s : f32, i64
  } -> (tensor<4xf32>, tensor<4xi64>)
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xi64>
}

// -----

// Element types the device cannot hold never reach it: an f64 computation (not a norm's statistics: asinh) and
// a complex one stay linalg ops and go to the host with the type as the reason; the f64 sum, converted because
// norm statistics use the same arithmetic, is wrapped after conversion because no fusion absorbed it.
// CHECK-LABEL: func.func @host_types
// CHECK: "spyre.host"() ({
// CHECK-NEXT: linalg.generic
// CHECK: math.asinh
// CHECK: }) {reason = "f64 has no device format"} : () -> tensor<4x8xf64>
// CHECK: "spyre.host"() ({
// CHECK-NEXT: "spyre.reduce"
// CHECK: }) {reason = "f64 has no device format"} : () -> tensor<4xf64>
// CHECK: "spyre.host"() ({
// CHECK-NEXT: linalg.generic
// CHECK: complex.mul
// CHECK: }) {reason = "complex<f32> has no device format"} : () -> tensor<4xcomplex<f32>>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#id1 = affine_map<(d0) -> (d0)>
func.func @host_types(%x: tensor<4x8xf64>, %c: tensor<4xcomplex<f32>>) -> (tensor<4xf64>, tensor<4xcomplex<f32>>) {
  %e = tensor.empty() : tensor<4x8xf64>
  %a = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf64>) outs(%e : tensor<4x8xf64>) {
  ^bb0(%in: f64, %out: f64):
    %v = math.asinh %in : f64
    linalg.yield %v : f64
  } -> tensor<4x8xf64>
  %z = arith.constant 0.0 : f64
  %e1 = tensor.empty() : tensor<4xf64>
  %f = linalg.fill ins(%z : f64) outs(%e1 : tensor<4xf64>) -> tensor<4xf64>
  %s = linalg.generic {indexing_maps = [#id2, #row], iterator_types = ["parallel", "reduction"]} ins(%a : tensor<4x8xf64>) outs(%f : tensor<4xf64>) {
  ^bb0(%in: f64, %out: f64):
    %v = arith.addf %in, %out : f64
    linalg.yield %v : f64
  } -> tensor<4xf64>
  %ec = tensor.empty() : tensor<4xcomplex<f32>>
  %m = linalg.generic {indexing_maps = [#id1, #id1], iterator_types = ["parallel"]} ins(%c : tensor<4xcomplex<f32>>) outs(%ec : tensor<4xcomplex<f32>>) {
  ^bb0(%in: complex<f32>, %out: complex<f32>):
    %v = complex.mul %in, %in : complex<f32>
    linalg.yield %v : complex<f32>
  } -> tensor<4xcomplex<f32>>
  return %s, %m : tensor<4xf64>, tensor<4xcomplex<f32>>
}
