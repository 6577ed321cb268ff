// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-merge-host)' | filecheck %s

// An attention mask from the int64 padding mask: `mask != 0`, then its broadcast by a data-dependent extract.
// The first region's result is read only inside the second: one region computes both (one host round trip),
// yielding the second's value; its reason names both.
// CHECK-LABEL: func.func @mask_chain
// CHECK: %[[H:.*]] = "spyre.host"() ({
// CHECK: arith.cmpi ne
// CHECK: tensor.extract
// CHECK: "spyre.yield"
// CHECK-NEXT: }) {reason = "data-dependent tensor.extract; int64 index math"} : () -> tensor<2x1x1x8xi1>
// CHECK-NOT: "spyre.host"
// CHECK: return %[[H]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, 0, 0, 0)>
#map2 = affine_map<(d0, d1, d2, d3) -> (0, 0, 0, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @mask_chain(%mask: tensor<2x8xi64>) -> tensor<2x1x1x8xi1> {
  %c0 = arith.constant 0 : i64
  %e = tensor.empty() : tensor<2x8xi1>
  %m = "spyre.host"() ({
    %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%mask : tensor<2x8xi64>) outs(%e : tensor<2x8xi1>) {
    ^bb0(%in: i64, %out: i1):
      %ne = arith.cmpi ne, %in, %c0 : i64
      linalg.yield %ne : i1
    } -> tensor<2x8xi1>
    "spyre.yield"(%g) : (tensor<2x8xi1>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<2x8xi1>
  %b = arith.constant dense<[[[[0]]], [[[1]]]]> : tensor<2x1x1x1xi64>
  %s = arith.constant dense<[[[[0, 1, 2, 3, 4, 5, 6, 7]]]]> : tensor<1x1x1x8xi64>
  %e2 = tensor.empty() : tensor<2x1x1x8xi1>
  %r = "spyre.host"() ({
    %g = linalg.generic {indexing_maps = [#map1, #map2, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%b, %s : tensor<2x1x1x1xi64>, tensor<1x1x1x8xi64>) outs(%e2 : tensor<2x1x1x8xi1>) {
    ^bb0(%i: i64, %j: i64, %out: i1):
      %ii = arith.index_cast %i : i64 to index
      %jj = arith.index_cast %j : i64 to index
      %x = tensor.extract %m[%ii, %jj] : tensor<2x8xi1>
      linalg.yield %x : i1
    } -> tensor<2x1x1x8xi1>
    "spyre.yield"(%g) : (tensor<2x1x1x8xi1>) -> ()
  }) {reason = "data-dependent tensor.extract"} : () -> tensor<2x1x1x8xi1>
  return %r : tensor<2x1x1x8xi1>
}

// -----

// A host result also returned (or read by a device op) stays a region of its own: the device or the caller needs
// it. Two readers of one host result keep it too.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-4: "spyre.host"
// CHECK: return
func.func @kept(%x: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi64>, tensor<4xi64>) {
  %a = "spyre.host"() ({
    %y = arith.addi %x, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4xi64>
  %b = "spyre.host"() ({
    %y = arith.muli %a, %a : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4xi64>
  %c = "spyre.host"() ({
    %y = arith.subi %b, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4xi64>
  %d = "spyre.host"() ({
    %y = arith.addi %b, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4xi64>
  return %a, %c, %d : tensor<4xi64>, tensor<4xi64>, tensor<4xi64>
}

// -----

// A region holding a spyre op (an f64 map the device cannot run) runs by another path on the host: it merges
// with nothing.
// CHECK-LABEL: func.func @spyre_ops_inside
// CHECK-COUNT-2: "spyre.host"
// CHECK: return
func.func @spyre_ops_inside(%x: tensor<4xf64>) -> tensor<4xf64> {
  %a = "spyre.host"() ({
    %y = arith.addf %x, %x : tensor<4xf64>
    "spyre.yield"(%y) : (tensor<4xf64>) -> ()
  }) {reason = "f64"} : () -> tensor<4xf64>
  %b = "spyre.host"() ({
    %m = "spyre.map"(%a) ({
    ^bb0(%v: f64):
      %n = arith.negf %v : f64
      "spyre.yield"(%n) : (f64) -> ()
    }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4xf64>) -> tensor<4xf64>
    "spyre.yield"(%m) : (tensor<4xf64>) -> ()
  }) {reason = "f64"} : () -> tensor<4xf64>
  return %b : tensor<4xf64>
}
