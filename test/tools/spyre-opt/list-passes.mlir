// RUN: spyre-opt --list-passes | filecheck %s
// CHECK-LABEL: Spyre passes:
// CHECK: spyre-convert-linalg
// CHECK-LABEL: Upstream passes:
// CHECK-DAG: {{^}}  canonicalize
// CHECK-DAG: {{^}}  cse
