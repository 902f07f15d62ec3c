// kf and upstream passes mix in one pipeline, nested upstream groups included.
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-verify, func.func(cse), kf-canonicalize, canonicalize)' | FileCheck %s
// Reading stdin and writing with -o:
// RUN: cat %s | kf-opt --pass-pipeline='builtin.module(kf-canonicalize)' -o %t && FileCheck %s < %t
// Every pass's output is printed after it with --mlir-print-ir-after-all:
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-verify, kf-canonicalize)' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER
// Pass timing:
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-canonicalize, cse)' --mlir-timing 2>&1 >/dev/null | FileCheck %s --check-prefix=TIMING
// Locations survive with --mlir-print-debuginfo:
// RUN: kf-opt %s --mlir-print-debuginfo | FileCheck %s --check-prefix=LOC

// CHECK-LABEL: func.func @f
// CHECK-NEXT: %[[S:.*]] = "kf.add"(%arg0, %arg0)
// CHECK-NEXT: return %[[S]]
func.func @f(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = "kf.add"(%a, %a) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> loc("user.py":3:5)
  %1 = "kf.add"(%a, %a) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %one = "kf.fill"() {value = 1.0} : () -> tensor<f32>
  %2 = "kf.mul"(%0, %one) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}

// AFTER: IR Dump After kf-verify
// AFTER: IR Dump After kf-canonicalize
// AFTER-NOT: kf.mul
// TIMING: Execution time report
// TIMING: kf-canonicalize
// TIMING: CSE
// LOC: loc("user.py":3:5)
