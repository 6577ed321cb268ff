// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// nn.LayerNorm(64) from the MLP example, as torch-mlir emits it: the mean in f32, the variance in f64
// (extf, mean, centre, square, mean, truncf), then + eps, rsqrt, scale, weight and bias.
// CHECK-LABEL: func.func @layer_norm
// CHECK: %[[N:.*]] = "spyre.layernorm"(%arg0, %arg1, %arg2) {acc_type = f32, axis = 1 : i64, epsilon = 9.99999974E-6 : f32
// CHECK-SAME: (tensor<4x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<4x64xf32>
// CHECK-NEXT: return %[[N]]
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0, 0)>
#map2 = affine_map<(d0, d1) -> (d1)>
func.func @layer_norm(%arg0: tensor<4x64xf32>, %arg1: tensor<64xf32>, %arg2: tensor<64xf32>) -> tensor<4x64xf32> {
  %cst = arith.constant 0.000000e+00 : f64
  %cst_0 = arith.constant 0.000000e+00 : f32
  %cst_3 = arith.constant 1.000000e-05 : f64
  %cst_4 = arith.constant 6.400000e+01 : f64
  %cst_5 = arith.constant 6.400000e+01 : f32
  %0 = tensor.empty() : tensor<4x64xf64>
  %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<4x64xf32>) outs(%0 : tensor<4x64xf64>) {
  ^bb0(%in: f32, %out: f64):
    %37 = arith.extf %in : f32 to f64
    linalg.yield %37 : f64
  } -> tensor<4x64xf64>
  %2 = tensor.empty() : tensor<4x1xf64>
  %3 = linalg.fill ins(%cst : f64) outs(%2 : tensor<4x1xf64>) -> tensor<4x1xf64>
  %4 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<4x64xf64>) outs(%3 : tensor<4x1xf64>) {
  ^bb0(%in: f64, %out: f64):
    %37 = arith.addf %in, %out : f64
    linalg.yield %37 : f64
  } -> tensor<4x1xf64>
  %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<4x1xf64>) outs(%2 : tensor<4x1xf64>) {
  ^bb0(%in: f64, %out: f64):
    %37 = arith.divf %in, %cst_4 : f64
    linalg.yield %37 : f64
  } -> tensor<4x1xf64>
  %6 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%1, %5 : tensor<4x64xf64>, tensor<4x1xf64>) outs(%0 : tensor<4x64xf64>) {
  ^bb0(%in: f64, %in_9: f64, %out: f64):
    %37 = arith.subf %in, %in_9 : f64
    linalg.yield %37 : f64
  } -> tensor<4x64xf64>
  %7 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%6, %6 : tensor<4x64xf64>, tensor<4x64xf64>) outs(%0 : tensor<4x64xf64>) {
  ^bb0(%in: f64, %in_9: f64, %out: f64):
    %37 = arith.mulf %in, %in_9 : f64
    linalg.yield %37 : f64
  } -> tensor<4x64xf64>
  %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%7 : tensor<4x64xf64>) outs(%3 : tensor<4x1xf64>) {
  ^bb0(%in: f64, %out: f64):
    %37 = arith.addf %in, %out : f64
    linalg.yield %37 : f64
  } -> tensor<4x1xf64>
  %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%8 : tensor<4x1xf64>) outs(%2 : tensor<4x1xf64>) {
  ^bb0(%in: f64, %out: f64):
    %37 = arith.divf %in, %cst_4 : f64
    linalg.yield %37 : f64
  } -> tensor<4x1xf64>
  %10 = tensor.empty() : tensor<4x1xf32>
  %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<4x1xf64>) outs(%10 : tensor<4x1xf32>) {
  ^bb0(%in: f64, %out: f32):
    %37 = arith.truncf %in : f64 to f32
    linalg.yield %37 : f32
  } -> tensor<4x1xf32>
  %12 = linalg.fill ins(%cst_0 : f32) outs(%10 : tensor<4x1xf32>) -> tensor<4x1xf32>
  %13 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x64xf32>) outs(%12 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %37 = arith.addf %in, %out : f32
    linalg.yield %37 : f32
  } -> tensor<4x1xf32>
  %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%13 : tensor<4x1xf32>) outs(%10 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %37 = arith.divf %in, %cst_5 : f32
    linalg.yield %37 : f32
  } -> tensor<4x1xf32>
  %15 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%11 : tensor<4x1xf32>) outs(%10 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %37 = arith.truncf %cst_3 : f64 to f32
    %38 = arith.addf %in, %37 : f32
    linalg.yield %38 : f32
  } -> tensor<4x1xf32>
  %16 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%15 : tensor<4x1xf32>) outs(%10 : tensor<4x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %37 = math.rsqrt %in : f32
    linalg.yield %37 : f32
  } -> tensor<4x1xf32>
  %17 = tensor.empty() : tensor<4x64xf32>
  %18 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %14 : tensor<4x64xf32>, tensor<4x1xf32>) outs(%17 : tensor<4x64xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.subf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x64xf32>
  %19 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%18, %16 : tensor<4x64xf32>, tensor<4x1xf32>) outs(%17 : tensor<4x64xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.mulf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x64xf32>
  %20 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%19, %arg1 : tensor<4x64xf32>, tensor<64xf32>) outs(%17 : tensor<4x64xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.mulf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x64xf32>
  %21 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%20, %arg2 : tensor<4x64xf32>, tensor<64xf32>) outs(%17 : tensor<4x64xf32>) {
  ^bb0(%in: f32, %in_9: f32, %out: f32):
    %37 = arith.addf %in, %in_9 : f32
    linalg.yield %37 : f32
  } -> tensor<4x64xf32>
  return %21 : tensor<4x64xf32>
}

// -----

// The transformer example's RMSNorm: x * rsqrt(mean(x^2) + eps), then weight * x (weight first).
// CHECK-LABEL: func.func @rms_norm
// CHECK: %[[N:.*]] = "spyre.rmsnorm"(%arg0, %arg1) {acc_type = f32, epsilon = 9.99999997E-7 : f32
// CHECK-SAME: (tensor<1x16x64xf32>, tensor<64xf32>) -> tensor<1x16x64xf32>
// CHECK-NEXT: return %[[N]]
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map6 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
#map7 = affine_map<(d0, d1, d2) -> (d2)>
func.func @rms_norm(%1: tensor<1x16x64xf32>, %arg2: tensor<64xf32>) -> tensor<1x16x64xf32> {
  %c2_i64 = arith.constant 2 : i64
  %cst = arith.constant 0.000000e+00 : f32
  %cst_7 = arith.constant 9.9999999999999995E-7 : f64
  %cst_8 = arith.constant 6.400000e+01 : f32
  %0 = tensor.empty() : tensor<1x16x64xf32>
  %11 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%1 : tensor<1x16x64xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = math.fpowi %in, %c2_i64 : f32, i64
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  %12 = tensor.empty() : tensor<1x16x1xf32>
  %13 = linalg.fill ins(%cst : f32) outs(%12 : tensor<1x16x1xf32>) -> tensor<1x16x1xf32>
  %14 = linalg.generic {indexing_maps = [#map1, #map6], iterator_types = ["parallel", "parallel", "reduction"]} ins(%11 : tensor<1x16x64xf32>) outs(%13 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.addf %in, %out : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %15 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%14 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.divf %in, %cst_8 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %16 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%15 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.truncf %cst_7 : f64 to f32
    %147 = arith.addf %in, %146 : f32
    linalg.yield %147 : f32
  } -> tensor<1x16x1xf32>
  %17 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%16 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = math.rsqrt %in : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %18 = linalg.generic {indexing_maps = [#map1, #map6, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%1, %17 : tensor<1x16x64xf32>, tensor<1x16x1xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %in_84: f32, %out: f32):
    %146 = arith.mulf %in, %in_84 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  %19 = linalg.generic {indexing_maps = [#map7, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg2, %18 : tensor<64xf32>, tensor<1x16x64xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %in_84: f32, %out: f32):
    %146 = arith.mulf %in, %in_84 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  return %19 : tensor<1x16x64xf32>
}

// -----

// A negative epsilon (PyTorch allows one; mean(x^2) + eps may be negative, giving NaN) is not a spyre.rmsnorm,
// whose epsilon is non-negative: the maps and the reduce compute it.
// CHECK-LABEL: func.func @rms_norm_negative_epsilon
// CHECK-NOT: spyre.rmsnorm
// CHECK: math.rsqrt
// CHECK-NOT: spyre.rmsnorm
// CHECK: return
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map6 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
#map7 = affine_map<(d0, d1, d2) -> (d2)>
func.func @rms_norm_negative_epsilon(%1: tensor<1x16x64xf32>, %arg2: tensor<64xf32>) -> tensor<1x16x64xf32> {
  %c2_i64 = arith.constant 2 : i64
  %cst = arith.constant 0.000000e+00 : f32
  %cst_7 = arith.constant -5.000000e-01 : f64
  %cst_8 = arith.constant 6.400000e+01 : f32
  %0 = tensor.empty() : tensor<1x16x64xf32>
  %11 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%1 : tensor<1x16x64xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = math.fpowi %in, %c2_i64 : f32, i64
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  %12 = tensor.empty() : tensor<1x16x1xf32>
  %13 = linalg.fill ins(%cst : f32) outs(%12 : tensor<1x16x1xf32>) -> tensor<1x16x1xf32>
  %14 = linalg.generic {indexing_maps = [#map1, #map6], iterator_types = ["parallel", "parallel", "reduction"]} ins(%11 : tensor<1x16x64xf32>) outs(%13 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.addf %in, %out : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %15 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%14 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.divf %in, %cst_8 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %16 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%15 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = arith.truncf %cst_7 : f64 to f32
    %147 = arith.addf %in, %146 : f32
    linalg.yield %147 : f32
  } -> tensor<1x16x1xf32>
  %17 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%16 : tensor<1x16x1xf32>) outs(%12 : tensor<1x16x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %146 = math.rsqrt %in : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x1xf32>
  %18 = linalg.generic {indexing_maps = [#map1, #map6, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%1, %17 : tensor<1x16x64xf32>, tensor<1x16x1xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %in_84: f32, %out: f32):
    %146 = arith.mulf %in, %in_84 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  %19 = linalg.generic {indexing_maps = [#map7, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg2, %18 : tensor<64xf32>, tensor<1x16x64xf32>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: f32, %in_84: f32, %out: f32):
    %146 = arith.mulf %in, %in_84 : f32
    linalg.yield %146 : f32
  } -> tensor<1x16x64xf32>
  return %19 : tensor<1x16x64xf32>
}

// -----

// Without the weight it is still an rmsnorm (x * x squares too); a mean over the wrong dim is not one.
// CHECK-LABEL: func.func @rms_norm_variants
// CHECK: "spyre.rmsnorm"(%arg0) {acc_type = f32, epsilon = 9.99999997E-7 : f32
// CHECK-NOT: spyre.rmsnorm
// CHECK: return
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0, 0)>
#col = affine_map<(d0, d1) -> (0, d1)>
func.func @rms_norm_variants(%x: tensor<8x64xf32>) -> (tensor<8x64xf32>, tensor<8x64xf32>) {
  %zero = arith.constant 0.000000e+00 : f32
  %n = arith.constant 6.400000e+01 : f32
  %n8 = arith.constant 8.000000e+00 : f32
  %eps = arith.constant 9.9999999999999995E-7 : f64
  %e = tensor.empty() : tensor<8x64xf32>
  %e1 = tensor.empty() : tensor<8x1xf32>
  %e2 = tensor.empty() : tensor<1x64xf32>
  %sq = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %x : tensor<8x64xf32>, tensor<8x64xf32>) outs(%e : tensor<8x64xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x64xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x1xf32>) -> tensor<8x1xf32>
  %s1 = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%sq : tensor<8x64xf32>) outs(%f1 : tensor<8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = arith.addf %in, %out : f32
    linalg.yield %r : f32
  } -> tensor<8x1xf32>
  %r1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%s1 : tensor<8x1xf32>) outs(%e1 : tensor<8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.divf %in, %n : f32
    linalg.yield %m : f32
  } -> tensor<8x1xf32>
  %q1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%r1 : tensor<8x1xf32>) outs(%e1 : tensor<8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = arith.truncf %eps : f64 to f32
    %a = arith.addf %in, %t : f32
    linalg.yield %a : f32
  } -> tensor<8x1xf32>
  %z1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%q1 : tensor<8x1xf32>) outs(%e1 : tensor<8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %a = math.rsqrt %in : f32
    linalg.yield %a : f32
  } -> tensor<8x1xf32>
  %y1 = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %z1 : tensor<8x64xf32>, tensor<8x1xf32>) outs(%e : tensor<8x64xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x64xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x64xf32>) -> tensor<1x64xf32>
  %s2 = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%sq : tensor<8x64xf32>) outs(%f2 : tensor<1x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = arith.addf %in, %out : f32
    linalg.yield %r : f32
  } -> tensor<1x64xf32>
  %r2 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%s2 : tensor<1x64xf32>) outs(%e2 : tensor<1x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.divf %in, %n8 : f32
    %t = arith.truncf %eps : f64 to f32
    %a = arith.addf %m, %t : f32
    %q = math.rsqrt %a : f32
    linalg.yield %q : f32
  } -> tensor<1x64xf32>
  %y2 = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %r2 : tensor<8x64xf32>, tensor<1x64xf32>) outs(%e : tensor<8x64xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x64xf32>
  return %y1, %y2 : tensor<8x64xf32>, tensor<8x64xf32>
}
