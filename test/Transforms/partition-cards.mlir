// One function per card and step, and @main the schedule of calls: the placements of spyre-place-cards
// (auto: column splits; forced: a K split summed by its readers, two pipeline stages; heads) and the errors.
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=2},spyre-partition-cards)' | filecheck %s --check-prefix=COLS
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=2 plan-out=%t.json})' > /dev/null
// RUN: sed -e '/"id": 2,/ s/"split": "[a-z]*"/"split": "rows"/' %t.json > %t.rows.json
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.rows.json},spyre-partition-cards)' | filecheck %s --check-prefix=ROWS
// RUN: sed -e 's/"cards": \[0, 1\]/"cards": [0]/; /"id": [23],/ s/"cards": \[0\]/"cards": [1]/; s/"split": "[a-z]*"/"split": "none"/' %t.json > %t.pipe.json
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.pipe.json},spyre-partition-cards)' | filecheck %s --check-prefix=PIPE
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-partition-cards)' 2>&1 | filecheck %s --check-prefix=UNPLACED
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=2},spyre-partition-cards,spyre-partition-cards)' 2>&1 | filecheck %s --check-prefix=TWICE
// UNPLACED: error: spyre-partition-cards: the module is not placed: run spyre-place-cards first
// TWICE: error: spyre-partition-cards: the module is already partitioned

// The weights are inputs of the binary here (no values): each card is sent its columns of fc1 and fc2.
// COLS-LABEL: func.func private @card0_step0
// COLS-SAME: (%arg0: tensor<8x512x!spyre.dlf16>, %arg1: tensor<512x512x!spyre.dlf16>) -> tensor<8x512x!spyre.dlf16>
// COLS-SAME: attributes {spyre.card = 0 : i64, spyre.step = 0 : i64}
// COLS: "spyre.matmul"(%arg0, %arg1) {{.*}}spyre.share_of = array<i64: 1, 1024>
// COLS-LABEL: func.func private @card1_step0
// COLS-LABEL: func.func private @card0_step1
// COLS: "spyre.map"
// COLS: "spyre.matmul"
// COLS-LABEL: func.func @main
// COLS-SAME: attributes {spyre.system}
// COLS: %[[W0:.*]] = tensor.extract_slice %arg1[0, 0] [512, 512] [1, 1]
// COLS: %[[P0:.*]] = call @card0_step0(%arg0, %[[W0]])
// COLS: %[[W1:.*]] = tensor.extract_slice %arg1[0, 512] [512, 512] [1, 1]
// COLS: %[[P1:.*]] = call @card1_step0(%arg0, %[[W1]])
// COLS: %[[H:.*]] = "spyre.all_gather"(%[[P0]], %[[P1]]) {dim = 1 : i64} : (tensor<8x512x!spyre.dlf16>, tensor<8x512x!spyre.dlf16>) -> tensor<8x1024x!spyre.dlf16>
// COLS: call @card0_step1(%[[H]]
// COLS: call @card1_step1(%[[H]]
// COLS: "spyre.all_gather"
// COLS: call @card0_step2
// COLS: return

// fc2 split by K: each card's partial product in f32 (the activation sliced on the card), then every reader
// sums the partials in card order, rounding once.
// ROWS-LABEL: func.func private @card0_step1
// ROWS: "spyre.slice"(%{{.*}}) {offsets = array<i64: 0, 0>, {{.*}}sizes = array<i64: 8, 512>
// ROWS: "spyre.matmul"{{.*}} -> tensor<8x512xf32>
// ROWS-LABEL: func.func private @card0_step2
// ROWS-SAME: (%arg0: tensor<8x512xf32>, %arg1: tensor<8x512xf32>,
// ROWS: "spyre.map"(%arg0, %arg1)
// ROWS: arith.addf
// ROWS: -> tensor<8x512x!spyre.dlf16>
// ROWS: "spyre.map"

// Two stages: card 1 gets g once and runs the rest; the weights stay whole.
// PIPE-LABEL: func.func private @card0_step0
// PIPE: "spyre.matmul"
// PIPE: "spyre.map"
// PIPE-LABEL: func.func private @card1_step1
// PIPE-SAME: (%arg0: tensor<8x1024x!spyre.dlf16>, %arg1: tensor<1024x512x!spyre.dlf16>
// PIPE: "spyre.matmul"
// PIPE: "spyre.map"
// PIPE-LABEL: func.func @main
// PIPE: %[[G:.*]] = call @card0_step0(%arg0, %arg1)
// PIPE: call @card1_step1(%[[G]], %arg2, %arg0)
// PIPE-NOT: all_gather
func.func @main(%x: tensor<8x512x!spyre.dlf16>, %w1: tensor<512x1024x!spyre.dlf16> {spyre.param = "fc1.weight"}, %w2: tensor<1024x512x!spyre.dlf16> {spyre.param = "fc2.weight"}) -> tensor<8x512x!spyre.dlf16> {
  %h = "spyre.matmul"(%x, %w1) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x512x!spyre.dlf16>, tensor<512x1024x!spyre.dlf16>) -> tensor<8x1024x!spyre.dlf16>
  %g = "spyre.map"(%h) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x1024x!spyre.dlf16>) -> tensor<8x1024x!spyre.dlf16>
  %y = "spyre.matmul"(%g, %w2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x1024x!spyre.dlf16>, tensor<1024x512x!spyre.dlf16>) -> tensor<8x512x!spyre.dlf16>
  %r = "spyre.map"(%y, %x) ({
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %b : f32
    "spyre.yield"(%s) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<8x512x!spyre.dlf16>, tensor<8x512x!spyre.dlf16>) -> tensor<8x512x!spyre.dlf16>
  return %r : tensor<8x512x!spyre.dlf16>
}
