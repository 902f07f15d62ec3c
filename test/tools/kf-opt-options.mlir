// mlir-opt's options that kf-opt shares.
// --version names kf's and MLIR's versions:
// RUN: kf-opt --version | FileCheck %s --check-prefix=VERSION
// Passes as flags, in order, as mlir-opt takes them (options after '='):
// RUN: kf-opt %s -kf-canonicalize --cse | FileCheck %s
// RUN: kf-opt %s --kf-fuse --kf-tile="target=spirv" | FileCheck %s --check-prefix=PLAN
// The IR before and after named passes only, kf's and upstream:
// RUN: kf-opt %s -kf-canonicalize -cse --mlir-print-ir-before=kf-canonicalize --mlir-print-ir-after=cse 2>&1 >/dev/null | FileCheck %s --check-prefix=DUMP
// Flags that are neither options nor passes, and flags beside --pass-pipeline, are errors (exit 2):
// RUN: not kf-opt %s -no-such-pass 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not kf-opt %s -cse --pass-pipeline='builtin.module(cse)' 2>&1 | FileCheck %s --check-prefix=MIXED
// RUN: not kf-opt %s --mlir-print-ir-after=no-such-pass 2>&1 | FileCheck %s --check-prefix=NOPASS

// VERSION: kf-opt (kf {{[0-9]+\.[0-9]+\.[0-9]+}})
// VERSION-NEXT: MLIR Python bindings {{[0-9.]+}}

// CHECK-LABEL: func.func @f
// CHECK-NEXT: %[[S:.*]] = "kf.add"(%arg0, %arg0)
// CHECK-NEXT: return %[[S]]
// PLAN: kf.plan
// DUMP: IR Dump Before kf-canonicalize
// DUMP-NEXT: module {
// DUMP: "kf.mul"
// DUMP: IR Dump After cse
// DUMP-NOT: "kf.mul"
// DUMP-NOT: IR Dump
// UNKNOWN: unrecognized arguments: -no-such-pass
// MIXED: cannot be mixed
// NOPASS: --mlir-print-ir-after: no pass named no-such-pass
func.func @f(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = "kf.add"(%a, %a) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %one = "kf.fill"() {value = 1.0} : () -> tensor<f32>
  %2 = "kf.mul"(%0, %one) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
