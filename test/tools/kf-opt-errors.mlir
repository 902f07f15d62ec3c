// Failures exit non-zero with a located diagnostic, and nothing on stdout.
// RUN: not kf-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=PASS
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-canonicalize{tile=3})' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not kf-opt %s --pass-pipeline='builtin.module(func.func(kf-verify))' 2>&1 | FileCheck %s --check-prefix=NESTED
// RUN: not kf-opt %S/does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not kf-opt %S/Inputs/ill-typed.mlir 2>&1 | FileCheck %s --check-prefix=VERIFY
// RUN: not kf-opt %S/Inputs/ill-typed.mlir --mlir-print-ir-after-failure --pass-pipeline='builtin.module(kf-verify)' 2>&1 | FileCheck %s --check-prefix=VERIFY
// Bytes that are not UTF-8 (a Latin-1 comment): a located error, no traceback, from a file and from stdin.
// RUN: printf 'func.func @f() {\n  return // caf\xe9\n}\n' > %t.mlir
// RUN: not kf-opt %t.mlir 2>&1 | FileCheck %s --check-prefix=UTF8 --implicit-check-not=Traceback
// RUN: not kf-opt < %t.mlir 2>&1 | FileCheck %s --check-prefix=UTF8-STDIN --implicit-check-not=Traceback

func.func @f(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  return %a : tensor<4x8xf32>
}
// PASS: error: upstream MLIR rejected 'no-such-pass'
// OPTION: error: pass 'kf-canonicalize' has no option 'tile' (options: max-iterations)
// NESTED: error: kf pass 'kf-verify' runs on the whole module: write it at the top level
// MISSING: kf-opt: cannot read {{.*}}does-not-exist.mlir
// VERIFY: ill-typed.mlir:3:8: error: 'kf.matmul' op contracting dimensions differ
// UTF8: .mlir:2:16: error: the input is not UTF-8 text: byte 0xe9 (invalid continuation byte)
// UTF8-STDIN: <stdin>:2:16: error: the input is not UTF-8 text: byte 0xe9
