// kf-fuse after kf-apply-precision: attention stays one kernel under fp8 and bf16. The
// chain takes what the precision policy writes around the two products -- the
// dequantization scale and cast of the scores, the probabilities' fixed-scale fp8 cast
// (FP8) or bf16 cast (BF16), V read through a transpose (fp8 stores it K-major), and the
// scale and cast after P @ V; the quantization of q, k and v are kernels of their own.
// The scales' rank-0 arithmetic is no kernel: each kernel that reads a scale computes it
// from the amaxes (kf-fuse's free scalars).
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8}, kf-fuse)' | FileCheck %s --check-prefix=FP8
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-apply-precision{precision=bf16}, kf-fuse)' | FileCheck %s --check-prefix=BF16
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-storage=false}, kf-fuse)' | FileCheck %s --check-prefix=FP8F32

// FP8-LABEL: func.func private @attention_k{{[0-9]+}}_attention
// FP8-SAME: %[[K8:[a-z0-9]+]]: tensor<2x5x8xf8E4M3FN>, %[[Q8:[a-z0-9]+]]: tensor<2x5x8xf8E4M3FN>, %[[AQ:[a-z0-9]+]]: tensor<f32>, %[[AK:[a-z0-9]+]]: tensor<f32>, %[[VT8:[a-z0-9]+]]: tensor<2x8x5xf8E4M3FN>, %[[AV:[a-z0-9]+]]: tensor<f32>
// FP8-SAME: kf.kernel = "attention"
// FP8: "kf.max"(%[[AQ]], %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8: "kf.max"(%[[AK]], %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8: %[[QK:.*]] = "kf.mul"(%{{.*}}, %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8-NEXT: %[[SQK:.*]] = "kf.div"(%{{.*}}, %[[QK]])
// FP8: "kf.max"(%[[AV]], %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8: %[[V256:.*]] = "kf.mul"(%{{.*}}, %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8-NEXT: %[[SV:.*]] = "kf.div"(%{{.*}}, %[[V256]])
// FP8: %[[S:.*]] = "kf.matmul"(%[[Q8]], %{{.*}}) : (tensor<2x5x8xf8E4M3FN>, tensor<2x8x5xf8E4M3FN>) -> tensor<2x5x5xf32>
// FP8-NEXT: %[[SS:.*]] = "kf.mul"(%[[S]], %[[SQK]])
// FP8-NEXT: %[[SB:.*]] = "kf.cast"(%[[SS]]) : (tensor<2x5x5xf32>) -> tensor<2x5x5xbf16>
// FP8-NEXT: %[[P:.*]] = "kf.softmax"(%[[SB]])
// FP8: %[[P8:.*]] = "kf.cast"(%{{.*}}) : (tensor<2x5x5xf32>) -> tensor<2x5x5xf8E4M3FN>
// FP8-NEXT: %[[V8:.*]] = "kf.transpose"(%[[VT8]])
// FP8-NEXT: %[[O:.*]] = "kf.matmul"(%[[P8]], %[[V8]])
// FP8-NEXT: %[[OS:.*]] = "kf.mul"(%[[O]], %[[SV]])
// FP8-NEXT: %[[OB:.*]] = "kf.cast"(%[[OS]]) : (tensor<2x5x8xf32>) -> tensor<2x5x8xbf16>
// FP8-NEXT: return %[[OB]]
// FP8-LABEL: func.func @attention
// FP8-COUNT-1: call @attention_k{{[0-9]+}}_attention
// FP8-NEXT: return

// Without fp8 storage (Vulkan, Metal, the CPU) the E4M3FN values are carried in f32: P
// is rounded and widened again, V is read as it lies (no transpose).
// FP8F32-LABEL: func.func private @attention_k{{[0-9]+}}_attention
// FP8F32-SAME: %[[V:[a-z0-9]+]]: tensor<2x5x8xf32>, %[[AV:[a-z0-9]+]]: tensor<f32>) -> tensor<2x5x8xbf16>
// FP8F32-SAME: kf.kernel = "attention"
// FP8F32: "kf.max"(%[[AV]], %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8F32: %[[V256:.*]] = "kf.mul"(%{{.*}}, %{{.*}}) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8F32-NEXT: %[[SV:.*]] = "kf.div"(%{{.*}}, %[[V256]])
// FP8F32: "kf.softmax"
// FP8F32: %[[P8:.*]] = "kf.cast"(%{{.*}}) : (tensor<2x5x5xf32>) -> tensor<2x5x5xf8E4M3FN>
// FP8F32-NEXT: %[[P:.*]] = "kf.cast"(%[[P8]]) : (tensor<2x5x5xf8E4M3FN>) -> tensor<2x5x5xf32>
// FP8F32-NEXT: %[[O:.*]] = "kf.matmul"(%[[P]], %[[V]])
// FP8F32-NEXT: "kf.mul"(%[[O]], %[[SV]])
// FP8F32-LABEL: func.func @attention
// FP8F32-COUNT-1: call @attention_k{{[0-9]+}}_attention

// BF16-LABEL: func.func private @attention32_k{{[0-9]+}}_attention
// BF16-SAME: kf.kernel = "attention"
// BF16: "kf.softmax"
// BF16-NEXT: %[[PB:.*]] = "kf.cast"({{.*}}) : (tensor<2x5x5xf32>) -> tensor<2x5x5xbf16>
// BF16-NEXT: %[[O:.*]] = "kf.matmul"(%[[PB]], %{{.*}}) : (tensor<2x5x5xbf16>, tensor<2x5x8xbf16>) -> tensor<2x5x8xf32>
// BF16-NEXT: return %[[O]]
// BF16-LABEL: func.func @attention32
// BF16-NOT: _rowwise
// BF16-NOT: _matmul
// BF16: call @attention32_k{{[0-9]+}}_attention
func.func @attention(%q: tensor<2x5x8xbf16>, %k: tensor<2x5x8xbf16>, %v: tensor<2x5x8xbf16>) -> tensor<2x5x8xbf16> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xbf16>) -> tensor<2x8x5xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x5x8xbf16>, tensor<2x8x5xbf16>) -> tensor<2x5x5xbf16>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x5x5xbf16>) -> tensor<2x5x5xbf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x5x5xbf16>, tensor<2x5x8xbf16>) -> tensor<2x5x8xbf16>
  return %o : tensor<2x5x8xbf16>
}

func.func @attention32(%q: tensor<2x5x8xf32>, %k: tensor<2x5x8xf32>, %v: tensor<2x5x8xf32>) -> tensor<2x5x8xf32> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xf32>) -> tensor<2x8x5xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x5x8xf32>, tensor<2x8x5xf32>) -> tensor<2x5x5xf32>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x5x5xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
  return %o : tensor<2x5x8xf32>
}
