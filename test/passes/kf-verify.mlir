// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-verify)' | FileCheck %s
// RUN: kf-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-verify)'
// Bad options (it has none):
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-verify{strict=true})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'kf-verify' has no option 'strict' (options: none)
// kf-verify leaves well-typed IR unchanged; kf-opt also runs the same checks after
// parsing, so an ill-typed op is reported at its line before any pass runs.

// CHECK-LABEL: func.func @well_typed
// CHECK: "kf.softmax"
func.func @well_typed(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = "kf.softmax"(%a) {dim = 1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
