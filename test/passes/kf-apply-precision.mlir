// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision)' | FileCheck %s --check-prefix=AUTO
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp32})' | FileCheck %s --check-prefix=FP32
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=tf32})' | FileCheck %s --check-prefix=TF32
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=bf16})' | FileCheck %s --check-prefix=BF16
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp16})' | FileCheck %s --check-prefix=FP16
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8})' | FileCheck %s --check-prefix=FP8
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-storage=false})' | FileCheck %s --check-prefix=FP8F32
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-attention=kernel})' | FileCheck %s --check-prefix=FP8K
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-attention=none})' | FileCheck %s --check-prefix=FP8N
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=int4})' 2>&1 | FileCheck %s --check-prefix=BAD
// Invalid inputs (Inputs/kf-apply-precision-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-apply-precision-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-apply-precision{precision=bf16})'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-attention=always})' 2>&1 | FileCheck %s --check-prefix=BAD-ATTENTION
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-apply-precision{precision=fp8 fp8-storage=sometimes})' 2>&1 | FileCheck %s --check-prefix=BAD-BOOL
// BAD-ATTENTION: error: kf-apply-precision: fp8-attention must be one of any, kernel, none, got 'always'
// BAD-BOOL: error: pass 'kf-apply-precision' option 'fp8-storage' is true or false, got 'sometimes'

// BAD: kf-apply-precision: precision must be one of auto, fp32, tf32, bf16, fp16, fp8, got 'int4'

// Every precision keeps the function's type: only what happens inside changes.

// A bf16 function: a reduction, an elementwise op and a matmul.
// auto leaves it as it is.
// AUTO-LABEL: func.func @low
// AUTO-NOT: kf.cast
// AUTO: return

// fp32: the arguments are widened once, everything computes in f32, the results are
// rounded back to bf16 at the return.
// FP32-LABEL: func.func @low(%arg0: tensor<4x8xbf16>, %arg1: tensor<8x3xbf16>) -> (tensor<4x3xbf16>, tensor<4x1xbf16>)
// FP32-NEXT: %[[X:.*]] = "kf.cast"(%arg0) : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// FP32-NEXT: %[[W:.*]] = "kf.cast"(%arg1) : (tensor<8x3xbf16>) -> tensor<8x3xf32>
// FP32-NEXT: %[[M:.*]] = "kf.mean"(%[[X]]) {{.*}} : (tensor<4x8xf32>) -> tensor<4x1xf32>
// FP32-NEXT: %[[C:.*]] = "kf.sub"(%[[X]], %[[M]]) : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
// FP32-NEXT: %[[Y:.*]] = "kf.matmul"(%[[C]], %[[W]]) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
// FP32-NEXT: %[[YB:.*]] = "kf.cast"(%[[Y]]) : (tensor<4x3xf32>) -> tensor<4x3xbf16>
// FP32-NEXT: %[[MB:.*]] = "kf.cast"(%[[M]]) : (tensor<4x1xf32>) -> tensor<4x1xbf16>
// FP32-NEXT: return %[[YB]], %[[MB]] : tensor<4x3xbf16>, tensor<4x1xbf16>

// tf32: as fp32, and the f32 matmul may use tf32 tensor cores.
// TF32-LABEL: func.func @low
// TF32: "kf.mean"({{.*}}) -> tensor<4x1xf32>
// TF32: "kf.matmul"({{.*}}) {kf.input_precision = "tf32"} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
// TF32: return {{.*}} : tensor<4x3xbf16>, tensor<4x1xbf16>

// bf16 and fp16: 16-bit matmul operands are left as they are.
// BF16-LABEL: func.func @low
// BF16-NOT: kf.cast
// BF16: "kf.matmul"(%{{.*}}, %arg1) : (tensor<4x8xbf16>, tensor<8x3xbf16>) -> tensor<4x3xbf16>
// FP16-LABEL: func.func @low
// FP16-NOT: kf.cast
// FP16: "kf.matmul"(%{{.*}}, %arg1) : (tensor<4x8xbf16>, tensor<8x3xbf16>) -> tensor<4x3xbf16>

// fp8: each operand is scaled by 448 / amax (computed in f32), clamped and cast to
// E4M3FN; the product (f32) is multiplied by 1 / (s_a * s_b) and rounded to bf16. The
// mean and the subtraction stay in bf16.
// FP8-LABEL: func.func @low
// FP8: %[[WF:.*]] = "kf.cast"(%arg1) : (tensor<8x3xbf16>) -> tensor<8x3xf32>
// FP8: %[[WA:.*]] = "kf.abs"(%[[WF]])
// FP8: %[[WMAX:.*]] = "kf.reduce_max"(%[[WA]]) {dims = array<i64: 0, 1>, keepdim = false} : (tensor<8x3xf32>) -> tensor<f32>
// FP8: %[[TINY:.*]] = "kf.fill"() {value = 9.9999999999999998E-13 : f64} : () -> tensor<f32>
// FP8: %[[WAMAX:.*]] = "kf.max"(%[[WMAX]], %[[TINY]])
// FP8: %[[E4M3:.*]] = "kf.fill"() {value = 4.480000e+02 : f64} : () -> tensor<f32>
// FP8: %[[SW:.*]] = "kf.div"(%[[E4M3]], %[[WAMAX]]) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// FP8: %[[WS:.*]] = "kf.mul"(%[[WF]], %[[SW]]) : (tensor<8x3xf32>, tensor<f32>) -> tensor<8x3xf32>
// FP8: %[[LO:.*]] = "kf.fill"() {value = -4.480000e+02 : f64}
// FP8: %[[WL:.*]] = "kf.max"(%[[WS]], %[[LO]])
// FP8: %[[HI:.*]] = "kf.fill"() {value = 4.480000e+02 : f64}
// FP8: %[[WC:.*]] = "kf.min"(%[[WL]], %[[HI]])
// FP8: %[[W8:.*]] = "kf.cast"(%[[WC]]) : (tensor<8x3xf32>) -> tensor<8x3xf8E4M3FN>
// FP8: "kf.mean"(%arg0) {{.*}} : (tensor<4x8xbf16>) -> tensor<4x1xbf16>
// FP8: "kf.sub"({{.*}}) : (tensor<4x8xbf16>, tensor<4x1xbf16>) -> tensor<4x8xbf16>
// FP8: %[[SX:.*]] = "kf.div"
// FP8: %[[X8:.*]] = "kf.cast"({{.*}}) : (tensor<4x8xf32>) -> tensor<4x8xf8E4M3FN>
// FP8: %[[P:.*]] = "kf.matmul"(%[[X8]], %[[W8]]) : (tensor<4x8xf8E4M3FN>, tensor<8x3xf8E4M3FN>) -> tensor<4x3xf32>
// FP8: %[[ONE:.*]] = "kf.fill"() {value = 1.000000e+00 : f64} : () -> tensor<f32>
// FP8: %[[SS:.*]] = "kf.mul"(%[[SX]], %[[SW]])
// FP8: %[[INV:.*]] = "kf.div"(%[[ONE]], %[[SS]])
// FP8: %[[R:.*]] = "kf.mul"(%[[P]], %[[INV]]) : (tensor<4x3xf32>, tensor<f32>) -> tensor<4x3xf32>
// FP8: %[[RB:.*]] = "kf.cast"(%[[R]]) : (tensor<4x3xf32>) -> tensor<4x3xbf16>
// FP8: return %[[RB]], %{{.*}} : tensor<4x3xbf16>, tensor<4x1xbf16>

// fp8 where fp8 tensors cannot be stored: the E4M3FN values are carried in f32.
// FP8F32-LABEL: func.func @low
// FP8F32: %[[W8:.*]] = "kf.cast"({{.*}}) : (tensor<8x3xf32>) -> tensor<8x3xf8E4M3FN>
// FP8F32-NEXT: %[[W:.*]] = "kf.cast"(%[[W8]]) : (tensor<8x3xf8E4M3FN>) -> tensor<8x3xf32>
// FP8F32: %[[X8:.*]] = "kf.cast"({{.*}}) : (tensor<4x8xf32>) -> tensor<4x8xf8E4M3FN>
// FP8F32-NEXT: %[[X:.*]] = "kf.cast"(%[[X8]]) : (tensor<4x8xf8E4M3FN>) -> tensor<4x8xf32>
// FP8F32-NEXT: "kf.matmul"(%[[X]], %[[W]]) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
func.func @low(%x: tensor<4x8xbf16>, %w: tensor<8x3xbf16>) -> (tensor<4x3xbf16>, tensor<4x1xbf16>) {
  %m = "kf.mean"(%x) {dims = array<i64: 1>, keepdim = true} : (tensor<4x8xbf16>) -> tensor<4x1xbf16>
  %c = "kf.sub"(%x, %m) : (tensor<4x8xbf16>, tensor<4x1xbf16>) -> tensor<4x8xbf16>
  %y = "kf.matmul"(%c, %w) : (tensor<4x8xbf16>, tensor<8x3xbf16>) -> tensor<4x3xbf16>
  return %y, %m : tensor<4x3xbf16>, tensor<4x1xbf16>
}

// -----

// f32 attention: its two GEMMs are kf.matmul ops.
// AUTO-LABEL: func.func @attention
// AUTO-NOT: kf.cast
// AUTO-NOT: kf.input_precision

// fp32 changes nothing in an f32 function; tf32 marks both matmuls.
// FP32-LABEL: func.func @attention
// FP32-NOT: kf.cast
// FP32-NOT: kf.input_precision
// TF32-LABEL: func.func @attention
// TF32-NOT: kf.cast
// TF32: "kf.matmul"({{.*}}) {kf.input_precision = "tf32"} : (tensor<2x5x8xf32>, tensor<2x8x5xf32>) -> tensor<2x5x5xf32>
// TF32: "kf.softmax"
// TF32: "kf.matmul"({{.*}}) {kf.input_precision = "tf32"} : (tensor<2x5x5xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>

// bf16: q, k, v are cast once, k before its transpose (which then moves bf16 and may join
// the matmul's kernel); the scores and the softmax stay f32; the probabilities are cast
// for the second GEMM; both products keep their f32 result types.
// BF16-LABEL: func.func @attention
// BF16-NEXT: %[[Q:.*]] = "kf.cast"(%arg0) : (tensor<2x5x8xf32>) -> tensor<2x5x8xbf16>
// BF16-NEXT: %[[K:.*]] = "kf.cast"(%arg1) : (tensor<2x5x8xf32>) -> tensor<2x5x8xbf16>
// BF16-NEXT: %[[V:.*]] = "kf.cast"(%arg2) : (tensor<2x5x8xf32>) -> tensor<2x5x8xbf16>
// BF16-NEXT: %[[KT:.*]] = "kf.transpose"(%[[K]]) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xbf16>) -> tensor<2x8x5xbf16>
// BF16-NEXT: %[[S:.*]] = "kf.matmul"(%[[Q]], %[[KT]]) : (tensor<2x5x8xbf16>, tensor<2x8x5xbf16>) -> tensor<2x5x5xf32>
// BF16-NEXT: %[[P:.*]] = "kf.softmax"(%[[S]]) {dim = -1 : i64} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
// BF16-NEXT: %[[PB:.*]] = "kf.cast"(%[[P]]) : (tensor<2x5x5xf32>) -> tensor<2x5x5xbf16>
// BF16-NEXT: %[[O:.*]] = "kf.matmul"(%[[PB]], %[[V]]) : (tensor<2x5x5xbf16>, tensor<2x5x8xbf16>) -> tensor<2x5x8xf32>
// BF16-NEXT: return %[[O]] : tensor<2x5x8xf32>

// FP16-LABEL: func.func @attention
// FP16: "kf.matmul"({{.*}}) : (tensor<2x5x8xf16>, tensor<2x8x5xf16>) -> tensor<2x5x5xf32>
// FP16: "kf.softmax"({{.*}}) {{.*}} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
// FP16: "kf.matmul"({{.*}}) : (tensor<2x5x5xf16>, tensor<2x5x8xf16>) -> tensor<2x5x8xf32>
// FP16: return {{.*}} : tensor<2x5x8xf32>

// fp8: k is quantized before its transpose (a transpose keeps the amax); the first
// product is rescaled before the softmax; the probabilities take the fixed scale 256 (no
// amax: they lie in [0, 1]); v is quantized from its transpose (stored K-major, as fp8
// wgmma reads it) and read through a transpose; the product is rescaled by 1/(256 s_v).
// FP8-LABEL: func.func @attention
// FP8: "kf.abs"(%arg1)
// FP8: %[[K8:.*]] = "kf.cast"({{.*}}) : (tensor<2x5x8xf32>) -> tensor<2x5x8xf8E4M3FN>
// FP8: %[[KT:.*]] = "kf.transpose"(%[[K8]]) {{.*}} : (tensor<2x5x8xf8E4M3FN>) -> tensor<2x8x5xf8E4M3FN>
// FP8-NEXT: %[[S:.*]] = "kf.matmul"(%{{.*}}, %[[KT]]) : (tensor<2x5x8xf8E4M3FN>, tensor<2x8x5xf8E4M3FN>) -> tensor<2x5x5xf32>
// FP8: %[[SR:.*]] = "kf.mul"(%[[S]], %{{.*}}) : (tensor<2x5x5xf32>, tensor<f32>) -> tensor<2x5x5xf32>
// FP8-NEXT: %[[P:.*]] = "kf.softmax"(%[[SR]])
// FP8-NEXT: %[[C:.*]] = "kf.fill"() {value = 2.560000e+02 : f64} : () -> tensor<f32>
// FP8-NEXT: %[[PS:.*]] = "kf.mul"(%[[P]], %[[C]])
// FP8-NEXT: %[[P8:.*]] = "kf.cast"(%[[PS]]) : (tensor<2x5x5xf32>) -> tensor<2x5x5xf8E4M3FN>
// FP8-NOT: "kf.abs"(%[[P]])
// FP8: %[[VT:.*]] = "kf.transpose"(%arg2) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xf32>) -> tensor<2x8x5xf32>
// FP8-NEXT: "kf.abs"(%[[VT]])
// FP8: %[[VT8:.*]] = "kf.cast"({{.*}}) : (tensor<2x8x5xf32>) -> tensor<2x8x5xf8E4M3FN>
// FP8-NEXT: %[[V8:.*]] = "kf.transpose"(%[[VT8]]) {perm = array<i64: 0, 2, 1>} : (tensor<2x8x5xf8E4M3FN>) -> tensor<2x5x8xf8E4M3FN>
// FP8-NEXT: "kf.matmul"(%[[P8]], %[[V8]]) : (tensor<2x5x5xf8E4M3FN>, tensor<2x5x8xf8E4M3FN>) -> tensor<2x5x8xf32>
// FP8: return {{.*}} : tensor<2x5x8xf32>
func.func @attention(%q: tensor<2x5x8xf32>, %k: tensor<2x5x8xf32>, %v: tensor<2x5x8xf32>) -> tensor<2x5x8xf32> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xf32>) -> tensor<2x8x5xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x5x8xf32>, tensor<2x8x5xf32>) -> tensor<2x5x5xf32>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x5x5xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
  return %o : tensor<2x5x8xf32>
}

// -----

// fp32 at the edges of kf: a call of an imported function takes f16 again and its result
// is widened; an explicit cast to bf16 still rounds (then the value is carried in f32), and
// the widening cast that follows it becomes an identity (kf-canonicalize removes it).
// FP32-LABEL: func.func @boundary
// FP32-NEXT: %[[X:.*]] = "kf.cast"(%arg0) : (tensor<4x8xf16>) -> tensor<4x8xf32>
// FP32-NEXT: %[[E:.*]] = "kf.exp"(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// FP32-NEXT: %[[EH:.*]] = "kf.cast"(%[[E]]) : (tensor<4x8xf32>) -> tensor<4x8xf16>
// FP32-NEXT: %[[I:.*]] = call @imported(%[[EH]]) : (tensor<4x8xf16>) -> tensor<4x8xf16>
// FP32-NEXT: %[[IF:.*]] = "kf.cast"(%[[I]]) : (tensor<4x8xf16>) -> tensor<4x8xf32>
// FP32-NEXT: %[[RB:.*]] = "kf.cast"(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// FP32-NEXT: %[[R:.*]] = "kf.cast"(%[[RB]]) : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// FP32-NEXT: %[[F:.*]] = "kf.cast"(%[[R]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// FP32-NEXT: %[[IH:.*]] = "kf.cast"(%[[IF]]) : (tensor<4x8xf32>) -> tensor<4x8xf16>
// FP32-NEXT: return %[[IH]], %[[F]] : tensor<4x8xf16>, tensor<4x8xf32>

// Functions without matmuls are left alone by auto, bf16, fp16 and fp8.
// AUTO-LABEL: func.func @boundary
// AUTO-NEXT: "kf.exp"(%arg0) : (tensor<4x8xf16>) -> tensor<4x8xf16>
// BF16-LABEL: func.func @boundary
// BF16-NEXT: "kf.exp"(%arg0) : (tensor<4x8xf16>) -> tensor<4x8xf16>
// FP16-LABEL: func.func @boundary
// FP16-NEXT: "kf.exp"(%arg0) : (tensor<4x8xf16>) -> tensor<4x8xf16>
// FP8-LABEL: func.func @boundary
// FP8-NEXT: "kf.exp"(%arg0) : (tensor<4x8xf16>) -> tensor<4x8xf16>
func.func private @imported(tensor<4x8xf16>) -> tensor<4x8xf16>
func.func @boundary(%x: tensor<4x8xf16>) -> (tensor<4x8xf16>, tensor<4x8xf32>) {
  %e = "kf.exp"(%x) : (tensor<4x8xf16>) -> tensor<4x8xf16>
  %i = call @imported(%e) : (tensor<4x8xf16>) -> tensor<4x8xf16>
  %r = "kf.cast"(%x) : (tensor<4x8xf16>) -> tensor<4x8xbf16>
  %f = "kf.cast"(%r) : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  return %i, %f : tensor<4x8xf16>, tensor<4x8xf32>
}

// -----

// fp8 tensors the caller passed, widened (q8.float() @ k8.float().T, then P @ v8.float()):
// they are the products' operands as they are, with scale 1 -- no amax, no second
// rounding; V is only transposed (through f32, so that the two transposes are not folded
// into v8), and P takes the fixed scale 256.
// FP8-LABEL: func.func @caller_fp8
// FP8-NOT: kf.reduce_max
// FP8: %[[KT:.*]] = "kf.transpose"(%arg1)
// FP8: %[[S:.*]] = "kf.matmul"(%arg0, %[[KT]]) : (tensor<2x16x32xf8E4M3FN>, tensor<2x32x16xf8E4M3FN>) -> tensor<2x16x16xf32>
// FP8: %[[VW:.*]] = "kf.cast"(%arg2) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
// FP8: %[[VT:.*]] = "kf.transpose"(%[[VW]]) {{.*}} -> tensor<2x32x16xf32>
// FP8: %[[VT8:.*]] = "kf.cast"(%[[VT]]) : (tensor<2x32x16xf32>) -> tensor<2x32x16xf8E4M3FN>
// FP8: %[[V:.*]] = "kf.transpose"(%[[VT8]]) {{.*}} -> tensor<2x16x32xf8E4M3FN>
// FP8: "kf.matmul"(%{{.*}}, %[[V]]) : (tensor<2x16x16xf8E4M3FN>, tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
// FP8-NOT: kf.reduce_max
// FP8F32-LABEL: func.func @caller_fp8
// FP8F32-NOT: kf.reduce_max
// FP8F32: "kf.matmul"({{.*}}) : (tensor<2x16x32xf32>, tensor<2x32x16xf32>) -> tensor<2x16x16xf32>
func.func @caller_fp8(%q8: tensor<2x16x32xf8E4M3FN>, %k8: tensor<2x16x32xf8E4M3FN>, %v8: tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32> {
  %q = "kf.cast"(%q8) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
  %k = "kf.cast"(%k8) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
  %v = "kf.cast"(%v8) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x16x32xf32>) -> tensor<2x32x16xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x16x32xf32>, tensor<2x32x16xf32>) -> tensor<2x16x16xf32>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x16x16xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
  return %o : tensor<2x16x32xf32>
}

// -----

// The caller's V stored K-major (P @ v8t.float().transpose): the stored tensor is the
// K-major operand as it is -- no copy of V at all.
// FP8-LABEL: func.func @caller_fp8_vt
// FP8-NOT: kf.reduce_max
// FP8: %[[V:.*]] = "kf.transpose"(%arg2) {{.*}} : (tensor<2x32x16xf8E4M3FN>) -> tensor<2x16x32xf8E4M3FN>
// FP8: "kf.matmul"(%{{.*}}, %[[V]]) : (tensor<2x16x16xf8E4M3FN>, tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
func.func @caller_fp8_vt(%q8: tensor<2x16x32xf8E4M3FN>, %k8: tensor<2x16x32xf8E4M3FN>, %v8t: tensor<2x32x16xf8E4M3FN>) -> tensor<2x16x32xf32> {
  %q = "kf.cast"(%q8) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
  %k = "kf.cast"(%k8) : (tensor<2x16x32xf8E4M3FN>) -> tensor<2x16x32xf32>
  %vt = "kf.cast"(%v8t) : (tensor<2x32x16xf8E4M3FN>) -> tensor<2x32x16xf32>
  %v = "kf.transpose"(%vt) {perm = array<i64: 0, 2, 1>} : (tensor<2x32x16xf32>) -> tensor<2x16x32xf32>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x16x32xf32>) -> tensor<2x32x16xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x16x32xf32>, tensor<2x32x16xf32>) -> tensor<2x16x16xf32>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x16x16xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
  return %o : tensor<2x16x32xf32>
}

// -----

// fp8-attention=kernel (the driver's choice on sm_90a): attention is quantized only where
// CUDA's fp8 attention kernel takes it -- head dims 128 or 256, whole blocks of 128 keys,
// scores that are only scaled. @small (head dim 8) and @masked (a mask between the
// products) stay 16-bit: their f32 operands become bf16 and nothing is fp8; @fits (head
// dim 128, 256 keys) is quantized as under fp8-attention=any. fp8-attention=none (CUDA
// chips without the kernel) keeps every attention 16-bit. Other matmuls are quantized
// either way (@fits' projection).
// FP8K-LABEL: func.func @small
// FP8K-NOT: f8E4M3FN
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x5x8xbf16>, tensor<2x8x5xbf16>) -> tensor<2x5x5xf32>
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x5x5xbf16>, tensor<2x5x8xbf16>) -> tensor<2x5x8xf32>
// FP8K-LABEL: func.func @masked
// FP8K-NOT: f8E4M3FN
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x256x256xbf16>, tensor<2x256x128xbf16>) -> tensor<2x256x128xf32>
// FP8K-LABEL: func.func @fits
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x256x128xf8E4M3FN>, tensor<2x128x256xf8E4M3FN>) -> tensor<2x256x256xf32>
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x256x256xf8E4M3FN>, tensor<2x256x128xf8E4M3FN>) -> tensor<2x256x128xf32>
// FP8K: "kf.matmul"({{.*}}) : (tensor<2x256x128xf8E4M3FN>, tensor<128x64xf8E4M3FN>) -> tensor<2x256x64xf32>
// FP8N-LABEL: func.func @fits
// FP8N: "kf.matmul"({{.*}}) : (tensor<2x256x128xbf16>, tensor<2x128x256xbf16>) -> tensor<2x256x256xf32>
// FP8N: "kf.matmul"({{.*}}) : (tensor<2x256x256xbf16>, tensor<2x256x128xbf16>) -> tensor<2x256x128xf32>
// FP8N: "kf.matmul"({{.*}}) : (tensor<2x256x128xf8E4M3FN>, tensor<128x64xf8E4M3FN>) -> tensor<2x256x64xf32>
func.func @small(%q: tensor<2x5x8xf32>, %k: tensor<2x5x8xf32>, %v: tensor<2x5x8xf32>) -> tensor<2x5x8xf32> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x5x8xf32>) -> tensor<2x8x5xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x5x8xf32>, tensor<2x8x5xf32>) -> tensor<2x5x5xf32>
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x5x5xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
  return %o : tensor<2x5x8xf32>
}
func.func @masked(%q: tensor<2x256x128xf32>, %k: tensor<2x256x128xf32>, %v: tensor<2x256x128xf32>, %m: tensor<256x256xi1>) -> tensor<2x256x128xf32> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x256x128xf32>) -> tensor<2x128x256xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x256x128xf32>, tensor<2x128x256xf32>) -> tensor<2x256x256xf32>
  %sm = "kf.masked_fill"(%s, %m) {value = -1.0e9 : f64} : (tensor<2x256x256xf32>, tensor<256x256xi1>) -> tensor<2x256x256xf32>
  %p = "kf.softmax"(%sm) {dim = -1 : i64} : (tensor<2x256x256xf32>) -> tensor<2x256x256xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x256x256xf32>, tensor<2x256x128xf32>) -> tensor<2x256x128xf32>
  return %o : tensor<2x256x128xf32>
}
func.func @fits(%q: tensor<2x256x128xf32>, %k: tensor<2x256x128xf32>, %v: tensor<2x256x128xf32>, %w: tensor<128x64xf32>) -> tensor<2x256x64xf32> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 2, 1>} : (tensor<2x256x128xf32>) -> tensor<2x128x256xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x256x128xf32>, tensor<2x128x256xf32>) -> tensor<2x256x256xf32>
  %c = "kf.fill"() {value = 0.088388 : f64} : () -> tensor<f32>
  %sc = "kf.mul"(%s, %c) : (tensor<2x256x256xf32>, tensor<f32>) -> tensor<2x256x256xf32>
  %p = "kf.softmax"(%sc) {dim = -1 : i64} : (tensor<2x256x256xf32>) -> tensor<2x256x256xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x256x256xf32>, tensor<2x256x128xf32>) -> tensor<2x256x128xf32>
  %y = "kf.matmul"(%o, %w) : (tensor<2x256x128xf32>, tensor<128x64xf32>) -> tensor<2x256x64xf32>
  return %y : tensor<2x256x64xf32>
}
