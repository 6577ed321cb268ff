// Chunks are processed independently, keep their line numbers, and print separated by '// -----'.
// RUN: not spyre-opt %s --split-input-file 2>/dev/null | filecheck %s
// RUN: not spyre-opt %s --split-input-file --mlir-print-debuginfo 2>&1 | filecheck %s --check-prefix=ERR
// RUN: not spyre-opt %s --split-input-file --mlir-print-debuginfo 2>/dev/null | filecheck %s --check-prefix=LOC
// (The last chunk is invalid: the debuginfo runs check the error line and that valid chunks still print.)

// CHECK-LABEL: func.func @first
// CHECK: // -----
// CHECK-LABEL: func.func @second
// LOC: loc("{{.*}}split-input-file.mlir":11:1)
func.func @first() {
  return
}

// -----

func.func @second() {
  return
}

// -----

// ERR: split-input-file.mlir:24:{{[0-9]+}}: error: custom op 'spyre.broken' is unknown
spyre.broken
