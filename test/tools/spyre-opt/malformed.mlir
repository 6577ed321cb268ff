// A malformed file prints MLIR's diagnostic with file:line:col and exits 1, without a Python traceback.
// RUN: not spyre-opt %s 2>&1 | filecheck %s
// CHECK: malformed.mlir:6:{{[0-9]+}}: error: custom op 'spyre.nonsense' is unknown
// CHECK-NOT: Traceback
func.func @f() {
  spyre.nonsense
  return
}
