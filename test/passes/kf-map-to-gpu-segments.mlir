// kf-map-to-gpu on an embedding's gradient (passes/strategies/segments.py): an index of
// 2048 rows sorted by a prelude into a [2, 2048 + 32000] table (keys and positions, then
// each output row's segment), which the generic kernel takes after its inputs; an index
// of 8 rows walked as before.
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-fuse, kf-map-to-gpu{target=cuda})' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-fuse, kf-map-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=SPIRV

// CHECK-LABEL: func.func @grad
// CHECK: %[[T:.*]] = call @grad_k0_generic_segments(%arg0, %arg1) : (tensor<2048xi64>, tensor<2048x64xbf16>) -> tensor<2x34048xi64>
// CHECK-NEXT: call @grad_k0_generic(%arg0, %arg1, %[[T]])
// CHECK-LABEL: gpu.func @grad_k0_generic_segments
// CHECK-SAME: kf.grid = array<i64: 8, 1, 1>
// CHECK: scf.for
// CHECK-LABEL: gpu.func @grad_k0_generic(
// CHECK-SAME: memref<2x34048xi64>
// CHECK-SAME: kf.grid = array<i64: 8000, 1, 1>
// SPIRV-LABEL: func.func @grad
// SPIRV: call @grad_k0_generic_segments
func.func @grad(%idx: tensor<2048xi64>, %g: tensor<2048x64xbf16>) -> tensor<32000x64xbf16> {
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<32000x64xbf16>
  %r = "kf.index_add"(%z, %idx, %g) {dim = 0 : i64} : (tensor<32000x64xbf16>, tensor<2048xi64>, tensor<2048x64xbf16>) -> tensor<32000x64xbf16>
  return %r : tensor<32000x64xbf16>
}

// -----

// CHECK-LABEL: func.func @short
// CHECK-NOT: segments
// CHECK: call @short_k0_generic(%arg0, %arg1) : (tensor<8xi64>, tensor<8x64xbf16>) -> tensor<100x64xbf16>
func.func @short(%idx: tensor<8xi64>, %g: tensor<8x64xbf16>) -> tensor<100x64xbf16> {
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<100x64xbf16>
  %r = "kf.index_add"(%z, %idx, %g) {dim = 0 : i64} : (tensor<100x64xbf16>, tensor<8xi64>, tensor<8x64xbf16>) -> tensor<100x64xbf16>
  return %r : tensor<100x64xbf16>
}
