// A dense layer (matmul, bias, scale, exp) in linalg-on-tensors: the input of the demo pipeline.
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d1)>
#map2 = affine_map<(d0, d1) -> (d1, d0)>
func.func @f(%a: tensor<8x16xf32>, %b: tensor<16x32xf32>, %bias: tensor<32xf32>, %t: tensor<32x8xf32>) -> tensor<8x32xf32> {
  %cst = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<8x32xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
  %g = linalg.generic {indexing_maps = [#map, #map1, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%m, %bias, %t : tensor<8x32xf32>, tensor<32xf32>, tensor<32x8xf32>) outs(%e : tensor<8x32xf32>) {
  ^bb0(%x: f32, %y: f32, %z: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    %p = arith.mulf %s, %z : f32
    %q = arith.addf %p, %one : f32
    linalg.yield %q : f32
  } -> tensor<8x32xf32>
  return %g : tensor<8x32xf32>
}
