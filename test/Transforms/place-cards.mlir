// Placement over the cards of a multi-card system: tensor-parallel splits chosen by the cost model, the plan
// written as JSON, read back and forced, and the located errors of a plan that cannot be followed.
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=1})' | filecheck %s --check-prefix=ONE
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=4 plan-out=%t.json})' | filecheck %s --check-prefix=FOUR
// RUN: filecheck %s --check-prefix=PLAN < %t.json
// The plan round-trips: forced, it writes itself back.
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.json plan-out=%t.again.json})' > /dev/null
// RUN: diff %t.json %t.again.json
// A pipeline of two stages, forced: ops 0 and 1 on card 0, op 2 on card 1 (the map's result crosses the link).
// RUN: sed -e '/"id": 2,/ { s/"cards": \[[^]]*\]/"cards": [1]/; s/"cols"/"none"/; }' -e '/"id": [01],/ { s/"cards": \[[^]]*\]/"cards": [0]/; s/"cols"/"none"/; }' %t.json > %t.pipe.json
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.pipe.json})' | filecheck %s --check-prefix=PIPE
// Errors: a split a map cannot take, an op the module does not have, a card outside the system, memory.
// RUN: sed -e '/"id": 1,/ s/"none"/"cols"/' %t.json > %t.bad-split.json
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.bad-split.json})' 2>&1 | filecheck %s --check-prefix=BAD-SPLIT
// BAD-SPLIT: place-cards.mlir:{{[0-9]+}}:8: error: spyre-place-cards: {{.*}}bad-split.json: ops[1]: impossible split 'cols' over 4 cards: only a matmul can be split over cards, not spyre.map with 8 rows
// RUN: sed -e 's/"id": 2,/"id": 3,/' %t.json > %t.bad-op.json
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.bad-op.json})' 2>&1 | filecheck %s --check-prefix=BAD-OP
// BAD-OP: error: spyre-place-cards: {{.*}}bad-op.json: ops[2]: unknown op 3 (the module has device ops 0..2)
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=2 plan=%t.json})' 2>&1 | filecheck %s --check-prefix=BAD-CARD
// BAD-CARD: error: spyre-place-cards: {{.*}}.json: ops[0]: cards [0, 1, 2, 3] must be distinct cards of 0..1
// A card of 100 MB: the 128 MiB of weights do not fit one card, so two cards share them; a one-card plan is
// over memory; one card alone is an error naming the bytes.
// RUN: sed -e 's/^value = 120259084288/value = 100000000/' %S/../../spyre_mlir/targets/spyre.toml > %t.toml
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=2 target=%t.toml})' | filecheck %s --check-prefix=SMALL
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=1 target=%t.toml})' 2>&1 | filecheck %s --check-prefix=NOWHERE
// NOWHERE: error: spyre-place-cards: the model's 134217728 bytes of parameters and its activations fit no placement over 1 cards of 100000000 bytes
// Activations count too: on a card of 134,400,000 bytes the parameters alone would fit, but with x, h and g
// live at once (327,680 bytes at the fullest point) one card is over memory.
// RUN: sed -e 's/^value = 120259084288/value = 134400000/' %S/../../spyre_mlir/targets/spyre.toml > %t.tight.toml
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=1 target=%t.tight.toml})' 2>&1 | filecheck %s --check-prefix=TIGHT
// TIGHT: error: spyre-place-cards: {{.*}} still puts 134545408 bytes on one card
// RUN: spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=1 plan-out=%t.one.json})' > /dev/null
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{plan=%t.one.json target=%t.tight.toml})' 2>&1 | filecheck %s --check-prefix=TIGHT-PLAN
// TIGHT-PLAN: place-cards.mlir:{{[0-9]+}}:8: error: spyre-place-cards: {{.*}}one.json puts 134217728 bytes of parameters and 327680 bytes of activations on card 0, over its 134400000 bytes of device memory
// RUN: not spyre-opt %s -p 'builtin.module(spyre-select-kernels,spyre-place-cards{cards=9})' 2>&1 | filecheck %s --check-prefix=NINE
// NINE: error: spyre-place-cards: impossible card count 9: target 'spyre' has 1..8 cards

// Two 64 MiB weights: decode-sized activations make the matmuls memory-bound, so splitting the weights'
// columns over the cards divides the bytes each card reads; the tanh between them is replicated.
// ONE: module attributes {spyre.num_cards = 1 : i64}
// ONE-LABEL: func.func @mlp
// ONE: "spyre.matmul"{{.*}}spyre.card_split = "none", spyre.cards = array<i64: 0>
// FOUR-LABEL: func.func @mlp
// FOUR: "spyre.matmul"{{.*}}spyre.card_split = "cols", spyre.cards = array<i64: 0, 1, 2, 3>
// FOUR: "spyre.map"
// FOUR: spyre.card_split = "none", spyre.cards = array<i64: 0, 1, 2, 3>
// FOUR: "spyre.matmul"{{.*}}spyre.card_split = "cols", spyre.cards = array<i64: 0, 1, 2, 3>
// PLAN: "format": "spyre-placement-plan",
// PLAN: "cards": 4,
// PLAN: "strategy": {
// PLAN-NEXT: "stages": 1,
// PLAN-NEXT: "tensor_parallel": 4
// PLAN: "bytes_per_card": [
// PLAN-NEXT: 33554432,
// Each card holds x, then h and g whole (a cols split's all-gather makes its result whole on every card).
// PLAN: "activation_bytes_per_card": [
// PLAN-NEXT: 327680,
// PLAN: {{^}} "ops": [
// PLAN-NEXT: {"id": 0, "op": "spyre.matmul", "loc": "{{.*}}", "cards": [0, 1, 2, 3], "split": "cols", "bytes_per_card": 16777216, "compute_us": {{.*}}, "link_us": {{.*}}}
// PIPE: "spyre.matmul"{{.*}}spyre.card_split = "none", spyre.cards = array<i64: 0>
// PIPE: spyre.card_split = "none", spyre.cards = array<i64: 0>
// PIPE: "spyre.matmul"{{.*}}spyre.card_split = "none", spyre.cards = array<i64: 1>
// SMALL: "spyre.matmul"{{.*}}spyre.cards = array<i64: 0, 1>
func.func @mlp(%x: tensor<8x4096x!spyre.dlf16>, %w1: tensor<4096x8192x!spyre.dlf16> {spyre.param = "fc1.weight"}, %w2: tensor<8192x4096x!spyre.dlf16> {spyre.param = "fc2.weight"}) -> tensor<8x4096x!spyre.dlf16> {
  %h = "spyre.matmul"(%x, %w1) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x4096x!spyre.dlf16>, tensor<4096x8192x!spyre.dlf16>) -> tensor<8x8192x!spyre.dlf16>
  %g = "spyre.map"(%h) ({
  ^bb0(%a: f32):
    %t = math.tanh %a : f32
    "spyre.yield"(%t) : (f32) -> ()
  }) {operandSegmentSizes = array<i32: 1, 0, 0, 0>} : (tensor<8x8192x!spyre.dlf16>) -> tensor<8x8192x!spyre.dlf16>
  %y = "spyre.matmul"(%g, %w2) {acc_type = f32, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<8x8192x!spyre.dlf16>, tensor<8192x4096x!spyre.dlf16>) -> tensor<8x4096x!spyre.dlf16>
  return %y : tensor<8x4096x!spyre.dlf16>
}
