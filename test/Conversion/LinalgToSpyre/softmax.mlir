// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// torch.softmax(x, dim=-1) as torch-mlir emits it: max (with an unused argmax), subtract, exp, sum, divide.
// CHECK-LABEL: func.func @torch_softmax
// CHECK: %[[S:.*]] = "spyre.softmax"(%arg0) {acc_type = f32, dim = 2 : i64} : (tensor<1x8x64xf32>) -> tensor<1x8x64xf32>
// CHECK-NEXT: return %[[S]]
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map3 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
func.func @torch_softmax(%collapsed_10: tensor<1x8x64xf32>) -> tensor<1x8x64xf32> {
  %c0_i64 = arith.constant 0 : i64
  %cst = arith.constant 0.000000e+00 : f32
  %cst_0 = arith.constant 0xFF800000 : f32
  %12 = tensor.empty() : tensor<1x8xi64>
  %13 = linalg.fill ins(%c0_i64 : i64) outs(%12 : tensor<1x8xi64>) -> tensor<1x8xi64>
  %14 = tensor.empty() : tensor<1x8xf32>
  %15 = linalg.fill ins(%cst_0 : f32) outs(%14 : tensor<1x8xf32>) -> tensor<1x8xf32>
  %16:2 = linalg.generic {indexing_maps = [#map1, #map2, #map2], iterator_types = ["parallel", "parallel", "reduction"]} ins(%collapsed_10 : tensor<1x8x64xf32>) outs(%15, %13 : tensor<1x8xf32>, tensor<1x8xi64>) {
  ^bb0(%in: f32, %out: f32, %out_12: i64):
    %41 = linalg.index 2 : index
    %42 = arith.index_cast %41 : index to i64
    %43 = arith.maximumf %in, %out : f32
    %44 = arith.cmpf ogt, %in, %out : f32
    %45 = arith.select %44, %42, %out_12 : i64
    linalg.yield %43, %45 : f32, i64
  } -> (tensor<1x8xf32>, tensor<1x8xi64>)
  %expanded_11 = tensor.expand_shape %16#0 [[0], [1, 2]] output_shape [1, 8, 1] : tensor<1x8xf32> into tensor<1x8x1xf32>
  %17 = tensor.empty() : tensor<1x8x64xf32>
  %18 = linalg.generic {indexing_maps = [#map1, #map3, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%collapsed_10, %expanded_11 : tensor<1x8x64xf32>, tensor<1x8x1xf32>) outs(%17 : tensor<1x8x64xf32>) {
  ^bb0(%in: f32, %in_12: f32, %out: f32):
    %41 = arith.subf %in, %in_12 : f32
    linalg.yield %41 : f32
  } -> tensor<1x8x64xf32>
  %19 = linalg.generic {indexing_maps = [#map1, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%18 : tensor<1x8x64xf32>) outs(%17 : tensor<1x8x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %41 = math.exp %in : f32
    linalg.yield %41 : f32
  } -> tensor<1x8x64xf32>
  %20 = tensor.empty() : tensor<1x8x1xf32>
  %21 = linalg.fill ins(%cst : f32) outs(%20 : tensor<1x8x1xf32>) -> tensor<1x8x1xf32>
  %22 = linalg.generic {indexing_maps = [#map1, #map3], iterator_types = ["parallel", "parallel", "reduction"]} ins(%19 : tensor<1x8x64xf32>) outs(%21 : tensor<1x8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %41 = arith.addf %in, %out : f32
    linalg.yield %41 : f32
  } -> tensor<1x8x1xf32>
  %23 = linalg.generic {indexing_maps = [#map1, #map3, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%19, %22 : tensor<1x8x64xf32>, tensor<1x8x1xf32>) outs(%17 : tensor<1x8x64xf32>) {
  ^bb0(%in: f32, %in_12: f32, %out: f32):
    %41 = arith.divf %in, %in_12 : f32
    linalg.yield %41 : f32
  } -> tensor<1x8x64xf32>
  return %23 : tensor<1x8x64xf32>
}

// -----

// A softmax whose max is taken over another dim than the sum is not a softmax.
// CHECK-LABEL: func.func @mismatched_dims
// CHECK-NOT: spyre.softmax
// CHECK: return
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0, 0)>
#col = affine_map<(d0, d1) -> (0, d1)>
func.func @mismatched_dims(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %zero = arith.constant 0.000000e+00 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e1 = tensor.empty() : tensor<8x1xf32>
  %e2 = tensor.empty() : tensor<1x8xf32>
  %e = tensor.empty() : tensor<8x8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%e2 : tensor<1x8xf32>) -> tensor<1x8xf32>
  %m = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%x : tensor<8x8xf32>) outs(%fm : tensor<1x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = arith.maximumf %in, %out : f32
    linalg.yield %r : f32
  } -> tensor<1x8xf32>
  %d = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %m : tensor<8x8xf32>, tensor<1x8xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.subf %a, %b : f32
    %x2 = math.exp %r : f32
    linalg.yield %x2 : f32
  } -> tensor<8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x1xf32>) -> tensor<8x1xf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%d : tensor<8x8xf32>) outs(%fs : tensor<8x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = arith.addf %in, %out : f32
    linalg.yield %r : f32
  } -> tensor<8x1xf32>
  %y = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%d, %s : tensor<8x8xf32>, tensor<8x1xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.divf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<8x8xf32>
  return %y : tensor<8x8xf32>
}

// -----

// linalg.softmax, when the frontend keeps it, converts directly.
// CHECK-LABEL: func.func @linalg_softmax
// CHECK: "spyre.softmax"(%arg0) {acc_type = f32, dim = 1 : i64} : (tensor<2x16xf32>) -> tensor<2x16xf32>
func.func @linalg_softmax(%x: tensor<2x16xf32>) -> tensor<2x16xf32> {
  %e = tensor.empty() : tensor<2x16xf32>
  %s = linalg.softmax dimension(1) ins(%x : tensor<2x16xf32>) outs(%e : tensor<2x16xf32>) -> tensor<2x16xf32>
  return %s : tensor<2x16xf32>
}

// -----

// torch._safe_softmax (what scaled_dot_product_attention uses): softmax, then rows whose every element is
// -inf (an all(x == -inf) reduction of the compare) selected to 0. One spyre.softmax {safe = true}: the select,
// the compare and the reduction are gone.
// CHECK-LABEL: func.func @safe_softmax
// CHECK-NEXT: %[[S:.*]] = "spyre.softmax"(%arg0) {acc_type = f32, dim = 1 : i64, safe = true}
// CHECK-NEXT: return %[[S]]
#ssmap = affine_map<(d0, d1) -> (d0, d1)>
#ssmap1 = affine_map<(d0, d1) -> (d0)>
#ssmap2 = affine_map<(d0, d1) -> (d0, 0)>
func.func @safe_softmax(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
    %c0_i64 = arith.constant 0 : i64
    %cst = arith.constant 0xFF800000 : f32
    %cst_0 = arith.constant 0.000000e+00 : f32
    %true = arith.constant true
    %cst_1 = arith.constant dense<0.000000e+00> : tensor<2x8xf32>
    %cst_2 = arith.constant 0xFFF0000000000000 : f64
    %0 = tensor.empty() : tensor<2xi64>
    %1 = linalg.fill ins(%c0_i64 : i64) outs(%0 : tensor<2xi64>) -> tensor<2xi64>
    %2 = tensor.empty() : tensor<2xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<2xf32>) -> tensor<2xf32>
    %4:2 = linalg.generic {indexing_maps = [#ssmap, #ssmap1, #ssmap1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<2x8xf32>) outs(%3, %1 : tensor<2xf32>, tensor<2xi64>) {
    ^bb0(%in: f32, %out: f32, %out_3: i64):
      %18 = linalg.index 1 : index
      %19 = arith.index_cast %18 : index to i64
      %20 = arith.maximumf %in, %out : f32
      %21 = arith.cmpf ogt, %in, %out : f32
      %22 = arith.select %21, %19, %out_3 : i64
      linalg.yield %20, %22 : f32, i64
    } -> (tensor<2xf32>, tensor<2xi64>)
    %expanded = tensor.expand_shape %4#0 [[0, 1]] output_shape [2, 1] : tensor<2xf32> into tensor<2x1xf32>
    %5 = tensor.empty() : tensor<2x8xf32>
    %6 = linalg.generic {indexing_maps = [#ssmap, #ssmap2, #ssmap], iterator_types = ["parallel", "parallel"]} ins(%arg0, %expanded : tensor<2x8xf32>, tensor<2x1xf32>) outs(%5 : tensor<2x8xf32>) {
    ^bb0(%in: f32, %in_3: f32, %out: f32):
      %18 = arith.subf %in, %in_3 : f32
      linalg.yield %18 : f32
    } -> tensor<2x8xf32>
    %7 = linalg.generic {indexing_maps = [#ssmap, #ssmap], iterator_types = ["parallel", "parallel"]} ins(%6 : tensor<2x8xf32>) outs(%5 : tensor<2x8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %18 = math.exp %in : f32
      linalg.yield %18 : f32
    } -> tensor<2x8xf32>
    %8 = tensor.empty() : tensor<2x1xf32>
    %9 = linalg.fill ins(%cst_0 : f32) outs(%8 : tensor<2x1xf32>) -> tensor<2x1xf32>
    %10 = linalg.generic {indexing_maps = [#ssmap, #ssmap2], iterator_types = ["parallel", "reduction"]} ins(%7 : tensor<2x8xf32>) outs(%9 : tensor<2x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %18 = arith.addf %in, %out : f32
      linalg.yield %18 : f32
    } -> tensor<2x1xf32>
    %11 = linalg.generic {indexing_maps = [#ssmap, #ssmap2, #ssmap], iterator_types = ["parallel", "parallel"]} ins(%7, %10 : tensor<2x8xf32>, tensor<2x1xf32>) outs(%5 : tensor<2x8xf32>) {
    ^bb0(%in: f32, %in_3: f32, %out: f32):
      %18 = arith.divf %in, %in_3 : f32
      linalg.yield %18 : f32
    } -> tensor<2x8xf32>
    %12 = tensor.empty() : tensor<2x8xi1>
    %13 = linalg.generic {indexing_maps = [#ssmap, #ssmap], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<2x8xf32>) outs(%12 : tensor<2x8xi1>) {
    ^bb0(%in: f32, %out: i1):
      %18 = arith.extf %in : f32 to f64
      %19 = arith.cmpf oeq, %18, %cst_2 : f64
      linalg.yield %19 : i1
    } -> tensor<2x8xi1>
    %14 = tensor.empty() : tensor<2x1xi1>
    %15 = linalg.fill ins(%true : i1) outs(%14 : tensor<2x1xi1>) -> tensor<2x1xi1>
    %16 = linalg.generic {indexing_maps = [#ssmap, #ssmap2], iterator_types = ["parallel", "reduction"]} ins(%13 : tensor<2x8xi1>) outs(%15 : tensor<2x1xi1>) {
    ^bb0(%in: i1, %out: i1):
      %18 = arith.andi %in, %out : i1
      linalg.yield %18 : i1
    } -> tensor<2x1xi1>
    %17 = linalg.generic {indexing_maps = [#ssmap2, #ssmap, #ssmap, #ssmap], iterator_types = ["parallel", "parallel"]} ins(%16, %cst_1, %11 : tensor<2x1xi1>, tensor<2x8xf32>, tensor<2x8xf32>) outs(%5 : tensor<2x8xf32>) {
    ^bb0(%in: i1, %in_3: f32, %in_4: f32, %out: f32):
      %18 = arith.select %in, %in_3, %in_4 : f32
      linalg.yield %18 : f32
    } -> tensor<2x8xf32>
    return %17 : tensor<2x8xf32>
  }
