// RUN: spyre-opt %s --split-input-file -p 'builtin.module(spyre-convert-linalg,canonicalize,cse)' | filecheck %s

// nn.Embedding(256, 64) from the transformer example: torch-mlir reads table[ids[i, j], k] with tensor.extract,
// after asserting the index is in bounds. spyre.gather does the row lookup (and bounds handling) on the device.
// CHECK-LABEL: func.func @embedding
// CHECK: %[[G:.*]] = "spyre.gather"(%arg1, %arg0) : (tensor<256x64xf32>, tensor<1x16xi64>) -> tensor<1x16x64xf32>
// CHECK-NEXT: return %[[G]]
#map = affine_map<(d0, d1, d2) -> (d0, d1)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
func.func @embedding(%arg0: tensor<1x16xi64>, %arg1: tensor<256x64xf32>) -> tensor<1x16x64xf32> {
  %c0_i64 = arith.constant 0 : i64
  %c256 = arith.constant 256 : index
  %0 = tensor.empty() : tensor<1x16x64xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg0 : tensor<1x16xi64>) outs(%0 : tensor<1x16x64xf32>) {
  ^bb0(%in: i64, %out: f32):
    %146 = arith.index_cast %in : i64 to index
    %147 = linalg.index 2 : index
    %148 = arith.cmpi slt, %146, %c256 : index
    cf.assert %148, "index must be smaller than dim size"
    %149 = arith.cmpi sge, %in, %c0_i64 : i64
    cf.assert %149, "index must be larger or equal to 0"
    %extracted = tensor.extract %arg1[%146, %147] : tensor<256x64xf32>
    linalg.yield %extracted : f32
  } -> tensor<1x16x64xf32>
  return %1 : tensor<1x16x64xf32>
}

// -----

// Reading a column (table[k, ids[i]]) is not a row gather: it stays, with the reason.
// CHECK-LABEL: func.func @column_read
// CHECK: linalg.generic
// CHECK-SAME: spyre.unconverted = "data-dependent tensor.extract in a linalg.generic body (not an embedding row gather)"
#map = affine_map<(d0, d1) -> (d0)>
#map1 = affine_map<(d0, d1) -> (d0, d1)>
func.func @column_read(%ids: tensor<16xi64>, %t: tensor<64x256xf32>) -> tensor<16x64xf32> {
  %0 = tensor.empty() : tensor<16x64xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel"]} ins(%ids : tensor<16xi64>) outs(%0 : tensor<16x64xf32>) {
  ^bb0(%in: i64, %out: f32):
    %i = arith.index_cast %in : i64 to index
    %k = linalg.index 1 : index
    %v = tensor.extract %t[%k, %i] : tensor<64x256xf32>
    linalg.yield %v : f32
  } -> tensor<16x64xf32>
  return %1 : tensor<16x64xf32>
}
