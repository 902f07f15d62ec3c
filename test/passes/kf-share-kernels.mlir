// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-share-kernels)' | FileCheck %s

// Two layers fused into the same kernel twice (@f_k0_rowwise, @f_k2_rowwise) and one
// kernel that differs only in a constant (@f_k1_rowwise): the copy is erased and its call
// calls the first; the other stays. Each call is still its own launch, on its own buffers.
// CHECK-LABEL: func.func private @f_k0_rowwise
// CHECK-LABEL: func.func private @f_k1_rowwise
// CHECK: value = 2.0
// CHECK-NOT: func.func private @f_k2_rowwise
// CHECK-LABEL: func.func @f
// CHECK: %[[A:.*]] = call @f_k0_rowwise(%arg0)
// CHECK: %[[B:.*]] = call @f_k1_rowwise(%[[A]])
// CHECK: %[[C:.*]] = call @f_k0_rowwise(%[[B]])
// CHECK: return %[[C]]
func.func private @f_k0_rowwise(%x: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.fused_lines = ["model.py:7"], kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%x) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %c = "kf.fill"() {value = 3.0 : f64} : () -> tensor<f32>
  %1 = "kf.mul"(%0, %c) : (tensor<4x64xf32>, tensor<f32>) -> tensor<4x64xf32>
  return %1 : tensor<4x64xf32>
}
func.func private @f_k1_rowwise(%x: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.fused_lines = ["model.py:7"], kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%x) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %c = "kf.fill"() {value = 2.0 : f64} : () -> tensor<f32>
  %1 = "kf.mul"(%0, %c) : (tensor<4x64xf32>, tensor<f32>) -> tensor<4x64xf32>
  return %1 : tensor<4x64xf32>
}
func.func private @f_k2_rowwise(%y: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.fused_lines = ["model.py:7"], kf.kernel = "rowwise"} {
  %s = "kf.softmax"(%y) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %three = "kf.fill"() {value = 3.0 : f64} : () -> tensor<f32>
  %r = "kf.mul"(%s, %three) : (tensor<4x64xf32>, tensor<f32>) -> tensor<4x64xf32>
  return %r : tensor<4x64xf32>
}
func.func @f(%arg0: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %0 = call @f_k0_rowwise(%arg0) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %1 = call @f_k1_rowwise(%0) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %2 = call @f_k2_rowwise(%1) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %2 : tensor<4x64xf32>
}
