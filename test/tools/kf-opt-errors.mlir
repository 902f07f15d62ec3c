// Failures exit non-zero with a located diagnostic, and nothing on stdout.
// RUN: not kf-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=PASS
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-canonicalize{tile=3})' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not kf-opt %s --pass-pipeline='builtin.module(func.func(kf-verify))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not kf-opt %S/does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not kf-opt %S/Inputs/ill-typed.mlir 2>&1 | FileCheck %s --check-prefix=VERIFY
// RUN: not kf-opt %S/Inputs/ill-typed.mlir --mlir-print-ir-after-failure --pass-pipeline='builtin.module(kf-verify)' 2>&1 | FileCheck %s --check-prefix=VERIFY

func.func @f(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  return %a : tensor<4x8xf32>
}
// PASS: error: upstream MLIR rejected 'no-such-pass'
// OPTION: error: pass 'kf-canonicalize' has no option 'tile' (options: max-iterations)
// NESTED: error: kf pass 'kf-verify' runs on the whole module: write it at the top level
// MISSING: kf-opt: cannot read {{.*}}does-not-exist.mlir
// VERIFY: ill-typed.mlir:3:8: error: 'kf.matmul' op contracting dimensions differ
