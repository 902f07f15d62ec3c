// RUN: kf-opt --list-passes | FileCheck %s
// kf passes are listed beside the upstream passes that kf's pipelines use.
// CHECK: kf passes:
// CHECK-DAG: kf-canonicalize
// CHECK-DAG: kf-verify
// CHECK-DAG: kf-split-scans
// CHECK: upstream MLIR passes
// CHECK-DAG: canonicalize
// CHECK-DAG: convert-gpu-to-nvvm
// CHECK-DAG: gpu-module-to-binary
