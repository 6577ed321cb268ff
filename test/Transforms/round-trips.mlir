// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-round-trips)' | filecheck %s

// Host regions that can run at the same point share a round trip. %b reads %a's result and a literal defined after
// the device op %dev: it moves up next to %a (the literal before %a), so %dev runs after both. %c reads %dev's
// result, so it stays where it is, alone. %d reads only the argument: it joins the earliest round trip, %a's.
// CHECK-LABEL: func.func @round_trips
// CHECK: arith.constant dense<3>
// CHECK-NEXT: %[[A:.*]] = "spyre.host"() ({
// CHECK: }) {reason = "a", round_trip = 0 : i64}
// CHECK-NEXT: %[[B:.*]] = "spyre.host"() ({
// CHECK: arith.muli %{{.*}}, %[[A]]
// CHECK: }) {reason = "b", round_trip = 0 : i64}
// CHECK-NEXT: %[[D:.*]] = "spyre.host"() ({
// CHECK: }) {reason = "d", round_trip = 0 : i64}
// CHECK-NEXT: arith.addi %[[A]], %[[A]]
// CHECK-NEXT: %[[X:.*]] = arith.addi %[[A]], %[[B]]
// CHECK: %[[C:.*]] = "spyre.host"() ({
// CHECK: }) {reason = "c"} : () -> tensor<4xi64>
// CHECK: return %[[X]], %[[C]], %[[D]]
func.func @round_trips(%x: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi64>, tensor<4xi64>) {
  %a = "spyre.host"() ({
    %y = arith.addi %x, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "a"} : () -> tensor<4xi64>
  %dev = arith.addi %a, %a : tensor<4xi64>
  %three = arith.constant dense<3> : tensor<4xi64>
  %b = "spyre.host"() ({
    %y = arith.muli %three, %a : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "b"} : () -> tensor<4xi64>
  %sum = arith.addi %a, %b : tensor<4xi64>
  %c = "spyre.host"() ({
    %y = arith.muli %dev, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "c"} : () -> tensor<4xi64>
  %d = "spyre.host"() ({
    %y = arith.subi %x, %x : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "d"} : () -> tensor<4xi64>
  return %sum, %c, %d : tensor<4xi64>, tensor<4xi64>, tensor<4xi64>
}

// -----

// A chain: each region reads the one before, two read the same one. All read only the argument and each other:
// one round trip, in program order.
// CHECK-LABEL: func.func @chain
// CHECK-COUNT-4: {reason = "int64 index math", round_trip = 0 : i64}
// CHECK: return
func.func @chain(%x: tensor<4xi64>) -> (tensor<4xi64>, tensor<4xi64>, tensor<4xi64>) {
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

// A region holding a spyre op (an f64 map the device cannot run) runs by another path on the host: it shares no
// round trip. A lone region gets no number.
// CHECK-LABEL: func.func @alone
// CHECK-NOT: round_trip
// CHECK: return
func.func @alone(%x: tensor<4xf64>) -> (tensor<4xf64>, tensor<4xf64>) {
  %a = "spyre.host"() ({
    %y = arith.addf %x, %x : tensor<4xf64>
    "spyre.yield"(%y) : (tensor<4xf64>) -> ()
  }) {reason = "f64"} : () -> tensor<4xf64>
  %b = "spyre.host"() ({
    %m = "spyre.map"(%x) ({
    ^bb0(%v: f64):
      %n = arith.negf %v : f64
      "spyre.yield"(%n) : (f64) -> ()
    }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<4xf64>) -> tensor<4xf64>
    "spyre.yield"(%m) : (tensor<4xf64>) -> ()
  }) {reason = "f64"} : () -> tensor<4xf64>
  return %a, %b : tensor<4xf64>, tensor<4xf64>
}
