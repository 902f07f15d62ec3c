// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-verify)' | FileCheck %s
// RUN: kf-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-verify)'
// kf-verify leaves well-typed IR unchanged; kf-opt also runs the same checks after
// parsing, so an ill-typed op is reported at its line before any pass runs.

// CHECK-LABEL: func.func @well_typed
// CHECK: "kf.softmax"
func.func @well_typed(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = "kf.softmax"(%a) {dim = 1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
