// kf-tile and kf-map-to-gpu for an input with two run-time sizes (strategies/
// run_time_sizes.py: check_several): SDPA with a [2, 1, queries, keys] boolean mask whose
// both dims grow with the sequence, as a padded batch's causal mask does.
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv}, kf-map-to-gpu{target=spirv})' | FileCheck %s
// spirv-val runs inside kf-to-spirv; ptxas assembles the CUDA kernels:
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv}, kf-map-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=BIN
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=cuda}, kf-map-to-gpu{target=cuda}, kf-to-cuda)' | FileCheck %s --check-prefix=BIN
// BIN: gpu.binary @kf_kernels

// The attention kernel: the mask's two dims are slots of their own ((2, 2) and (2, 3)),
// beside K's, q's, V's and O's sequence; the mask is a flat buffer of 2 * 4096 * 4096
// elements, addressed with strides of its own two sizes.
// CHECK-LABEL: func.func private @sd_k0_attention
// CHECK-SAME: sizes = [array<i64: 0, 2>, array<i64: 1, 2>, array<i64: 2, 2>, array<i64: 2, 3>, array<i64: 3, 2>, array<i64: 4, 2>]
// The rows the mask keeps some key of: the generic strategy reads the mask at both sizes.
// CHECK-LABEL: func.func private @sd_k1_rowwise
// CHECK-SAME: sizes = [array<i64: 0, 2>, array<i64: 0, 3>, array<i64: 1, 2>]
// CHECK-SAME: strategy = "generic"
// CHECK: gpu.func @sd_k0_attention(%{{.*}}: memref<1048576xf32>, %{{.*}}: memref<1048576xf32>, %{{.*}}: memref<33554432xi1>, %{{.*}}: memref<1048576xf32>, %{{.*}}: memref<1048576xf32>, %[[SIZES:.*]]: memref<6xi32>)
// CHECK-DAG: memref.load %[[SIZES]][%c2
// CHECK-DAG: memref.load %[[SIZES]][%c3
// CHECK: gpu.func @sd_k1_rowwise(%{{.*}}: memref<33554432xi1>, %{{.*}}: memref<8192xi1>, %{{.*}}: memref<3xi32>)
func.func private @sd_k0_attention(%arg0: tensor<2x4x?x32xf32>, %arg1: tensor<2x4x?x32xf32>, %arg2: tensor<2x1x?x?xi1>, %arg3: tensor<2x4x?x32xf32>) -> tensor<2x4x?x32xf32> attributes {kf.kernel = "attention"} {
  %0 = "kf.fill"() {value = 0.17677669529663687 : f64} : () -> tensor<f32>
  %1 = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<i1>
  %2 = "kf.transpose"(%arg0) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x?x32xf32>) -> tensor<2x4x32x?xf32>
  %3 = "kf.matmul"(%arg1, %2) : (tensor<2x4x?x32xf32>, tensor<2x4x32x?xf32>) -> tensor<2x4x?x?xf32>
  %4 = "kf.mul"(%3, %0) : (tensor<2x4x?x?xf32>, tensor<f32>) -> tensor<2x4x?x?xf32>
  %5 = "kf.cmp"(%arg2, %1) {predicate = "eq"} : (tensor<2x1x?x?xi1>, tensor<i1>) -> tensor<2x1x?x?xi1>
  %6 = "kf.masked_fill"(%4, %5) {value = 0xFFF0000000000000 : f64} : (tensor<2x4x?x?xf32>, tensor<2x1x?x?xi1>) -> tensor<2x4x?x?xf32>
  %7 = "kf.softmax"(%6) {dim = -1 : i64} : (tensor<2x4x?x?xf32>) -> tensor<2x4x?x?xf32>
  %8 = "kf.matmul"(%7, %arg3) : (tensor<2x4x?x?xf32>, tensor<2x4x?x32xf32>) -> tensor<2x4x?x32xf32>
  return %8 : tensor<2x4x?x32xf32>
}
func.func private @sd_k1_rowwise(%arg0: tensor<2x1x?x?xi1>) -> tensor<2x1x?x1xi1> attributes {kf.kernel = "rowwise"} {
  %0 = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<i32>
  %1 = "kf.cast"(%arg0) : (tensor<2x1x?x?xi1>) -> tensor<2x1x?x?xi32>
  %2 = "kf.reduce_max"(%1) {dims = array<i64: 3>, keepdim = true} : (tensor<2x1x?x?xi32>) -> tensor<2x1x?x1xi32>
  %3 = "kf.cmp"(%2, %0) {predicate = "gt"} : (tensor<2x1x?x1xi32>, tensor<i32>) -> tensor<2x1x?x1xi1>
  return %3 : tensor<2x1x?x1xi1>
}
func.func @sd(%q: tensor<2x4x?x32xf32>, %k: tensor<2x4x?x32xf32>, %v: tensor<2x4x?x32xf32>, %m: tensor<2x1x?x?xi1>) -> (tensor<2x4x?x32xf32>, tensor<2x1x?x1xi1>) {
  %0 = call @sd_k0_attention(%k, %q, %m, %v) : (tensor<2x4x?x32xf32>, tensor<2x4x?x32xf32>, tensor<2x1x?x?xi1>, tensor<2x4x?x32xf32>) -> tensor<2x4x?x32xf32>
  %1 = call @sd_k1_rowwise(%m) : (tensor<2x1x?x?xi1>) -> tensor<2x1x?x1xi1>
  return %0, %1 : tensor<2x4x?x32xf32>, tensor<2x1x?x1xi1>
}
