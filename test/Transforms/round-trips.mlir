// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-round-trips)' | filecheck %s

// Host regions that can run at the same point share a round trip. %b reads %a's result and a literal defined after
// the device op %dev: it moves up next to %a (the literal before %a), so %dev runs after both. %c reads %dev's
// result, so it stays where it is, alone. %d reads only the argument: it joins the earliest round trip, %a's.
// CHECK-LABEL: func.func @round_trips
// CHECK: arith.constant dense<3>
// CHECK-NEXT: %[[A:.*]] = "spyre.host"() ({
// CHECK: }) {reason = "a", spyre.round_trip = 0 : i64}
// CHECK-NEXT: %[[B:.*]] = "spyre.host"() ({
// CHECK: arith.muli %{{.*}}, %[[A]]
// CHECK: }) {reason = "b", spyre.round_trip = 0 : i64}
// CHECK-NEXT: %[[D:.*]] = "spyre.host"() ({
// CHECK: }) {reason = "d", spyre.round_trip = 0 : i64}
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
// CHECK-COUNT-4: {reason = "int64 index math", spyre.round_trip = 0 : i64}
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
// CHECK-NOT: spyre.round_trip
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

// -----

// Maps without a device kernel (RoPE's cos and sin) of one value share a round trip, interpreted on the host; a
// host region of upstream ops (compiled host code) never joins them, nor they it.
// CHECK-LABEL: func.func @maps
// CHECK: "spyre.host"
// CHECK-NOT: spyre.round_trip
// CHECK: }) {reason = "int64 index math"}
// CHECK: math.cos
// CHECK: spyre.on_host = "no SFU function", spyre.round_trip = 0 : i64
// CHECK-NEXT: "spyre.map"
// CHECK: math.sin
// CHECK: spyre.on_host = "no SFU function", spyre.round_trip = 0 : i64
// CHECK-NEXT: arith.addf
// CHECK: return
func.func @maps(%x: tensor<4xf32>, %i: tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi64>) {
  %h = "spyre.host"() ({
    %y = arith.addi %i, %i : tensor<4xi64>
    "spyre.yield"(%y) : (tensor<4xi64>) -> ()
  }) {reason = "int64 index math"} : () -> tensor<4xi64>
  %c = "spyre.map"(%x) ({
  ^bb0(%v: f32):
    %r = math.cos %v : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.on_host = "no SFU function"} : (tensor<4xf32>) -> tensor<4xf32>
  %d = arith.addf %x, %x : tensor<4xf32>
  %s = "spyre.map"(%x) ({
  ^bb0(%v: f32):
    %r = math.sin %v : f32
    "spyre.yield"(%r) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>, spyre.on_host = "no SFU function"} : (tensor<4xf32>) -> tensor<4xf32>
  return %c, %d, %s, %h : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi64>
}
