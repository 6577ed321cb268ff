// One case per spyre verifier message.
// RUN: spyre-opt %s --split-input-file --verify-diagnostics

func.func @case0(%a: tensor<32x64xf32>, %b: tensor<63x16xf32>) {
  // expected-error @+1 {{'spyre.matmul' op contraction sizes differ: lhs 32x64 and rhs 63x16}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<32x64xf32>, tensor<63x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case1(%a: tensor<2x32x64xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{'spyre.matmul' op lhs must be rank 2, got rank 3}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case2(%a: tensor<32x64xf32>, %b: tensor<64x16xf16>) {
  // expected-error @+1 {{lhs and rhs: element types differ (f32 vs f16)}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<32x64xf32>, tensor<64x16xf16>) -> tensor<32x16xf32>
  return
}

// -----

func.func @conv_types(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3x!spyre.dlf16>) {
  // expected-error @+1 {{input and filter: element types differ (f32 vs !spyre.dlf16)}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3x!spyre.dlf16>) -> tensor<1x16x14x14x!spyre.dlf16>
  return
}

// -----

func.func @case3(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{result shape 32x17 does not match expected 32x16}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x17xf32>
  return
}

// -----

func.func @case4(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>, %bias: tensor<32xf32>) {
  // expected-error @+1 {{bias shape 32 does not match expected 16}}
  %r = "spyre.matmul"(%a, %b, %bias) {operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<32x64xf32>, tensor<64x16xf32>, tensor<32xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case5(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{attribute 'transpose_rhs' must be a bool, got 1 : i64}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>, transpose_rhs = 1 : i64} : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case6(%a: tensor<?x64xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{lhs must have a static shape, got tensor<?x64xf32>}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<?x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case7(%a: tensor<*xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{lhs must be a ranked tensor, got tensor<*xf32>}}
  %r = "spyre.matmul"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<*xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case8(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>) {
  // expected-error @+1 {{'spyre.batch_matmul' op lhs must be rank 3 or more, got rank 2}}
  %r = "spyre.batch_matmul"(%a, %b) : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @case9(%a: tensor<2x32x64xf32>, %b: tensor<2x3x64x16xf32>) {
  // expected-error @+1 {{lhs and rhs ranks differ (3 vs 4)}}
  %r = "spyre.batch_matmul"(%a, %b) : (tensor<2x32x64xf32>, tensor<2x3x64x16xf32>) -> tensor<2x32x16xf32>
  return
}

// -----

func.func @case10(%a: tensor<2x32x64xf32>, %b: tensor<3x64x16xf32>) {
  // expected-error @+1 {{batch dimensions differ: 2 vs 3}}
  %r = "spyre.batch_matmul"(%a, %b) : (tensor<2x32x64xf32>, tensor<3x64x16xf32>) -> tensor<2x32x16xf32>
  return
}

// -----

func.func @case11(%a: tensor<2x32x64xf32>, %b: tensor<2x32x16xf32>) {
  // expected-error @+1 {{'spyre.batch_matmul' op contraction sizes differ}}
  %r = "spyre.batch_matmul"(%a, %b) : (tensor<2x32x64xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  return
}

// -----

func.func @case12(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{strides, dilations and groups must be positive and padding non-negative}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, strides = array<i64: 0, 1>} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case13(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{groups 3 must divide input channels 8 and filters 16}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, groups = 3 : i64} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case14(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{filter has 8 channels per group, expected 4 (input 8 / groups 2)}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, groups = 2 : i64} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case15(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x17x17xf32>) {
  // expected-error @+1 {{filter 17x17 does not fit the padded input 16x16}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, groups = 1 : i64} : (tensor<1x8x16x16xf32>, tensor<16x8x17x17xf32>) -> tensor<1x16x1x1xf32>
  return
}

// -----

func.func @case16(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{attribute 'strides' must have 2 entries, got 3}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, strides = array<i64: 1, 1, 1>} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case17(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{attribute 'groups' must be an integer, got 1.000000e+00 : f32}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, groups = 1.0 : f32} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case18(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{attribute 'strides' must be an array of integers}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, strides = ["a", "b"]} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x14x14xf32>
  return
}

// -----

func.func @case19(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) {
  // expected-error @+1 {{result shape 1x16x16x16 does not match expected 1x16x14x14}}
  %r = "spyre.conv2d"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, groups = 1 : i64} : (tensor<1x8x16x16xf32>, tensor<16x8x3x3xf32>) -> tensor<1x16x16x16xf32>
  return
}

// -----

func.func @case20(%x: tensor<1x8x16x16xf32>) {
  // expected-error @+1 {{kernel and strides must be positive and padding non-negative}}
  %r = "spyre.pool2d"(%x) {kind = "max", kernel = array<i64: 0, 2>} : (tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32>
  return
}

// -----

func.func @case21(%x: tensor<1x8x16x16xf32>) {
  // expected-error @+1 {{attribute 'kind' must be one of max, avg, got 'sum'}}
  %r = "spyre.pool2d"(%x) {kind = "sum", kernel = array<i64: 2, 2>} : (tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32>
  return
}

// -----

func.func @case22(%x: tensor<1x8x16x16xf32>) {
  // expected-error @+1 {{'spyre.pool2d' op requires attribute 'kernel'}}
  %r = "spyre.pool2d"(%x) {kind = "max"} : (tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32>
  return
}

// -----

func.func @case23(%x: tensor<1x8x16x16xf32>) {
  // expected-error @+1 {{attribute 'kind' must be a string, got 1 : i64}}
  %r = "spyre.pool2d"(%x) {kind = 1 : i64, kernel = array<i64: 2, 2>} : (tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32>
  return
}

// -----

func.func @case24(%x: tensor<8x64xf32>, %y: tensor<8xf32>) {
  // expected-error @+1 {{input #1 shape 8 does not broadcast to result 8x64}}
  %r = "spyre.map"(%x, %y) ({
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x64xf32>, tensor<8xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case25(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{body arguments (f16) must be the input element types (f32), or f32 for reduced-precision floats}}
  %r = "spyre.map"(%x) ({
  ^bb0(%p: f16):
    %s = arith.constant 1.0 : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case26(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{body may only hold arith and math ops, found 'tensor.empty'}}
  %r = "spyre.map"(%x) ({
  ^bb0(%p: f32):
    %s = tensor.empty() : tensor<2xf32>
    "spyre.yield"(%p) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case27(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{body must yield one i32 value}}
  %r = "spyre.map"(%x) ({
  ^bb0(%p: f32):
    "spyre.yield"(%p) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xi32>
  return
}

// -----

func.func @case28(%x: tensor<8x64xf32>, %y: tensor<8x64xf32>) {
  // expected-error @+1 {{inputs must fill the first operand slots without gaps}}
  %r = "spyre.map"(%x, %y) ({
  ^bb0(%p: f32, %q: f32):
    "spyre.yield"(%p) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 1, 0>} : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case29(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{'spyre.reduce' op result shape 64 does not match expected 8}}
  %r = "spyre.reduce"(%x) {dims = array<i64: 1>, kind = "sum"} : (tensor<8x64xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @case30(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %r = "spyre.reduce"(%x) {dims = array<i64: 2>, kind = "sum"} : (tensor<8x64xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @case31(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'dims' must not be empty}}
  %r = "spyre.reduce"(%x) {dims = array<i64>, kind = "sum"} : (tensor<8x64xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @case32(%x: tensor<8x64xi32>) {
  // expected-error @+1 {{input must have a float element type, got i32}}
  %r = "spyre.softmax"(%x) {dim = 1 : i64} : (tensor<8x64xi32>) -> tensor<8x64xi32>
  return
}

// -----

func.func @case33(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'acc_type' must be a float type, got i32}}
  %r = "spyre.softmax"(%x) {dim = 1 : i64, acc_type = i32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case34(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'acc_type' must be a float type, got true}}
  %r = "spyre.softmax"(%x) {dim = 1 : i64, acc_type = true} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case35(%x: tensor<8x64xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{weight shape 8 does not match expected 64}}
  %r = "spyre.layernorm"(%x, %w) {operandSegmentSizes = array<i32: 1, 1, 0>, axis = 1 : i64, epsilon = 1.0e-5 : f32} : (tensor<8x64xf32>, tensor<8xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case36(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{'spyre.layernorm' op epsilon must be non-negative, got -1.0}}
  %r = "spyre.layernorm"(%x) {operandSegmentSizes = array<i32: 1, 0, 0>, axis = 1 : i64, epsilon = -1.0 : f32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case37(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'epsilon' must be a float, got 1 : i64}}
  %r = "spyre.layernorm"(%x) {operandSegmentSizes = array<i32: 1, 0, 0>, axis = 1 : i64, epsilon = 1 : i64} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case38(%x: tensor<f32>) {
  // expected-error @+1 {{input must have rank 1 or more}}
  %r = "spyre.rmsnorm"(%x) {operandSegmentSizes = array<i32: 1, 0>, epsilon = 1.0e-6 : f32} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

func.func @case39(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{'spyre.rmsnorm' op epsilon must be non-negative, got -1.0}}
  %r = "spyre.rmsnorm"(%x) {operandSegmentSizes = array<i32: 1, 0>, epsilon = -1.0 : f32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case40(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{permutation [0, 0] is not a permutation of 0..1}}
  %r = "spyre.transpose"(%x) {permutation = array<i64: 0, 0>} : (tensor<8x64xf32>) -> tensor<64x8xf32>
  return
}

// -----

func.func @case41(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{element count changes from 512 (8x64) to 504 (8x63)}}
  %r = "spyre.reshape"(%x) : (tensor<8x64xf32>) -> tensor<8x63xf32>
  return
}

// -----

func.func @case42(%t: tensor<f32>, %i: tensor<4xi64>) {
  // expected-error @+1 {{table must have rank 1 or more}}
  %r = "spyre.gather"(%t, %i) : (tensor<f32>, tensor<4xi64>) -> tensor<4xf32>
  return
}

// -----

func.func @case43(%t: tensor<16x4xf32>, %i: tensor<4xf32>) {
  // expected-error @+1 {{indices must have an integer element type, got f32}}
  %r = "spyre.gather"(%t, %i) : (tensor<16x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
  return
}

// -----

func.func @case44(%a: tensor<8x32xf32>, %b: tensor<4x16xf32>) {
  // expected-error @+1 {{input #1 shape 4x16 does not match result 8x48 outside dim 1}}
  %r = "spyre.concat"(%a, %b) {dim = 1 : i64} : (tensor<8x32xf32>, tensor<4x16xf32>) -> tensor<8x48xf32>
  return
}

// -----

func.func @case45(%a: tensor<8x32xf32>, %b: tensor<8x16xf32>) {
  // expected-error @+1 {{inputs sum to 48 along dim 1, result has 40}}
  %r = "spyre.concat"(%a, %b) {dim = 1 : i64} : (tensor<8x32xf32>, tensor<8x16xf32>) -> tensor<8x40xf32>
  return
}

// -----

func.func @case46(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{slice of dim 1 (offset 60, size 8, stride 1) is out of bounds for size 64}}
  %r = "spyre.slice"(%x) {offsets = array<i64: 0, 60>, sizes = array<i64: 8, 8>} : (tensor<8x64xf32>) -> tensor<8x8xf32>
  return
}

// -----

func.func @case47(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{padding must be non-negative}}
  %r = "spyre.pad"(%x) {low = array<i64: 0, -1>, high = array<i64: 0, 1>, value = 0.0 : f32} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @case48(%x: tensor<8x64xf32>, %s: tensor<2xf32>) {
  // expected-error @+1 {{per-tensor scale must have one element, got 2}}
  %r = "spyre.cast"(%x, %s) {operandSegmentSizes = array<i32: 1, 1>} : (tensor<8x64xf32>, tensor<2xf32>) -> tensor<8x64xi8>
  return
}

// -----

func.func @case49(%x: tensor<8x64xf32>, %s: tensor<64xf32>) {
  // expected-error @+1 {{per-channel scale shape 64 does not match expected 8}}
  %r = "spyre.cast"(%x, %s) {operandSegmentSizes = array<i32: 1, 1>, axis = 0 : i64} : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xi8>
  return
}

// -----

func.func @case50(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'axis' needs a scale operand or scale_mode 'per-channel'}}
  %r = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>, axis = 0 : i64} : (tensor<8x64xf32>) -> tensor<8x64xi8>
  return
}

// -----

func.func @case52(%x: tensor<4xf32>) {
  // expected-error @+1 {{body must be one block without arguments}}
  %r = "spyre.host"() ({
  ^bb0(%a: tensor<4xf32>):
    "spyre.yield"(%a) : (tensor<4xf32>) -> ()
  }) : () -> tensor<4xf32>
  return
}

// -----

func.func @case53(%x: tensor<4xf32>) {
  // expected-error @+1 {{yielded type must match the result type}}
  %r = "spyre.host"() ({
    "spyre.yield"(%x) : (tensor<4xf32>) -> ()
  }) : () -> tensor<5xf32>
  return
}

// -----

func.func @case54(%x: tensor<4xf32>) {
  // expected-error @+1 {{attribute 'reason' must be a string, got 3 : i64}}
  %r = "spyre.host"() ({
    "spyre.yield"(%x) : (tensor<4xf32>) -> ()
  }) {reason = 3 : i64} : () -> tensor<4xf32>
  return
}

// -----

func.func @map_no_yield(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{body must end with spyre.yield}}
  %r = "spyre.map"(%x) ({
  ^bb0(%p: f32):
    %s = arith.addf %p, %p : f32
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @map_two_blocks(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{body must have exactly one block, got 2}}
  %r = "spyre.map"(%x) ({
  ^bb0(%p: f32):
    "spyre.yield"(%p) : (f32) -> ()
  ^bb1(%q: f32):
    "spyre.yield"(%q) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x64xf32>) -> tensor<8x64xf32>
  return
}

// -----

func.func @host_no_yield(%x: tensor<4xf32>) {
  // expected-error @+1 {{body must end with spyre.yield}}
  %r = "spyre.host"() ({
    %c = arith.constant dense<1.0> : tensor<4xf32>
  }) : () -> tensor<4xf32>
  return
}

// -----

func.func @stray_yield(%x: f32) {
  // expected-error @+1 {{'spyre.yield' op must be nested in spyre.map or spyre.host}}
  "spyre.yield"(%x) : (f32) -> ()
}

// -----

func.func @cast_mode(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{scale_mode 'per-channel' needs attribute 'axis'}}
  %r = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>, scale_mode = "per-channel"} : (tensor<8x64xf32>) -> tensor<8x64xi8>
  return
}

// -----

func.func @cast_mode_name(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'scale_mode' must be one of per-tensor, per-channel, got 'dynamic'}}
  %r = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 0>, scale_mode = "dynamic"} : (tensor<8x64xf32>) -> tensor<8x64xi8>
  return
}

// -----

func.func @restickify_flag(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'restickify' must be a bool, got 1 : i64}}
  %r = "spyre.transpose"(%x) {permutation = array<i64: 1, 0>, restickify = 1 : i64} : (tensor<8x64xf32>) -> tensor<64x8xf32>
  return
}

// -----

func.func @missing_segments(%x: tensor<8x64xf32>) {
  // expected-error @+1 {{'spyre.cast' op requires attribute 'operandSegmentSizes' with 2 entries}}
  %r = "spyre.cast"(%x) : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
  return
}

// -----

func.func @wrong_segments(%x: tensor<8x64xf32>, %y: tensor<8x64xf32>) {
  // expected-error @+1 {{attribute 'operandSegmentSizes' [1, 1] does not describe the 1 operands in 2 slots}}
  %r = "spyre.cast"(%x) {operandSegmentSizes = array<i32: 1, 1>} : (tensor<8x64xf32>) -> tensor<8x64x!spyre.dlf16>
  return
}

// -----

func.func @all_gather_one_piece(%a: tensor<8x32xf32>) {
  // expected-error @+1 {{needs at least two pieces, got 1}}
  %r = "spyre.all_gather"(%a) {dim = 1 : i64} : (tensor<8x32xf32>) -> tensor<8x32xf32>
  return
}

// -----

func.func @all_gather_pieces(%a: tensor<8x32xf32>, %b: tensor<4x32xf32>) {
  // expected-error @+1 {{piece #1 shape 4x32 does not match result 8x64 outside dim 1}}
  %r = "spyre.all_gather"(%a, %b) {dim = 1 : i64} : (tensor<8x32xf32>, tensor<4x32xf32>) -> tensor<8x64xf32>
  return
}
