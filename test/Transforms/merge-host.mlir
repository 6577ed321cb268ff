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

// -----

// A boolean-mask index_put: host regions compute the count of true elements (an index) and a check on it (an
// i1), read outside any region by the dynamic-size tensor.empty of the selected values and by cf.assert. Both
// move into the region that reads them (an unread dynamic empty is erased), so the whole chain is one region:
// no scalar crosses from one host call to another.
// CHECK-LABEL: func.func @dynamic_sizes
// CHECK: %[[H:.*]] = "spyre.host"() ({
// CHECK: arith.index_cast
// CHECK: arith.cmpi sge
// CHECK-DAG: tensor.empty(%{{.*}}) : tensor<?xf32>
// CHECK-DAG: cf.assert
// CHECK: linalg.fill
// CHECK: "spyre.yield"
// CHECK-NEXT: }) {reason = "dynamic shapes; int64 index math"} : () -> tensor<4xf32>
// CHECK-NOT: "spyre.host"
// CHECK-NOT: tensor.empty(
// CHECK: return %[[H]]
func.func @dynamic_sizes(%count: tensor<i64>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = arith.constant 0 : i64
  %n = "spyre.host"() ({
    %e = tensor.extract %count[] : tensor<i64>
    %i = arith.index_cast %e : i64 to index
    "spyre.yield"(%i) : (index) -> ()
  }) {reason = "int64 index math"} : () -> index
  %ok = "spyre.host"() ({
    %e = arith.index_cast %n : index to i64
    %b = arith.cmpi sge, %e, %c0 : i64
    "spyre.yield"(%b) : (i1) -> ()
  }) {reason = "int64 index math"} : () -> i1
  %unread = tensor.empty(%n) : tensor<?x1xi64>
  cf.assert %ok, "negative values not allowed in new dimensions"
  %buf = tensor.empty(%n) : tensor<?xf32>
  %r = "spyre.host"() ({
    %z = arith.constant 0.0 : f32
    %s = linalg.fill ins(%z : f32) outs(%buf : tensor<?xf32>) -> tensor<?xf32>
    %c = tensor.insert_slice %s into %x[0] [%n] [1] : tensor<?xf32> into tensor<4xf32>
    "spyre.yield"(%c) : (tensor<4xf32>) -> ()
  }) {reason = "dynamic shapes"} : () -> tensor<4xf32>
  return %r : tensor<4xf32>
}
