// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-lower-to-linalg, kf-to-cpu)' | FileCheck %s
// Invalid inputs (Inputs/kf-to-cpu-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-to-cpu-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-to-cpu)'
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-lower-to-linalg, kf-to-cpu{fuse=maybe})' 2>&1 | FileCheck %s --check-prefix=BAD-BOOL
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-lower-to-linalg, kf-to-cpu{opt-level=3})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-BOOL: error: pass 'kf-to-cpu' option 'fuse' is true or false, got 'maybe'
// BAD-OPTION: error: pass 'kf-to-cpu' has no option 'opt-level' (options: fuse)

// Destination passing: the inputs' memref descriptors (2-D: ptr, ptr, offset, 2 sizes,
// 2 strides) come first, then the output's, and nothing is returned. The two kf ops
// fuse into one loop nest that stores straight into the output buffer (no malloc), and
// llvm.emit_c_interface adds the _mlir_ciface_ entry that runtime/cpu.py calls.
// CHECK-LABEL: llvm.func @scale_rows(
// CHECK-SAME: %arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64, %arg3: i64, %arg4: i64, %arg5: i64, %arg6: i64,
// CHECK-SAME: %arg7: !llvm.ptr, %arg8: !llvm.ptr, %arg9: i64, %arg10: i64, %arg11: i64, %arg12: i64, %arg13: i64,
// CHECK-SAME: %arg14: !llvm.ptr, %arg15: !llvm.ptr, %arg16: i64, %arg17: i64, %arg18: i64, %arg19: i64, %arg20: i64)
// CHECK-SAME: attributes {llvm.emit_c_interface} {
// CHECK-NOT: llvm.call @malloc
// CHECK: llvm.cond_br
// CHECK: %[[X:.*]] = llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: %[[S:.*]] = llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: %[[P:.*]] = llvm.fmul %[[X]], %[[S]] : f32
// CHECK: %[[E:.*]] = llvm.intr.exp(%[[P]]) : (f32) -> f32
// CHECK: %[[DST:.*]] = llvm.getelementptr inbounds|nuw %arg15[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, f32
// CHECK: llvm.store %[[E]], %[[DST]] : f32, !llvm.ptr
// CHECK: llvm.return
// CHECK: llvm.func @_mlir_ciface_scale_rows(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: !llvm.ptr) attributes {llvm.emit_c_interface}
// CHECK: llvm.call @scale_rows(
func.func @scale_rows(%x: tensor<3x5xf32>, %s: tensor<3x1xf32>) -> tensor<3x5xf32> {
  %0 = "kf.mul"(%x, %s) : (tensor<3x5xf32>, tensor<3x1xf32>) -> tensor<3x5xf32>
  %1 = "kf.exp"(%0) : (tensor<3x5xf32>) -> tensor<3x5xf32>
  return %1 : tensor<3x5xf32>
}

// -----

// Booleans are bytes in memory, as in torch: the i1 comparison is widened to i8 before
// it is stored (and a rank-0 operand's descriptor is just ptr, ptr, offset).
// CHECK-LABEL: llvm.func @positive(
// CHECK-SAME: %arg5: !llvm.ptr, %arg6: !llvm.ptr, %arg7: i64, %arg8: !llvm.ptr
// CHECK: %[[C:.*]] = llvm.fcmp "ogt" %{{.*}}, %{{.*}} : f32
// CHECK: %[[B:.*]] = llvm.zext %[[C]] : i1 to i8
// CHECK: %[[DST:.*]] = llvm.getelementptr inbounds|nuw %arg9[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK: llvm.store %[[B]], %[[DST]] : i8, !llvm.ptr
func.func @positive(%x: tensor<7xf32>, %z: tensor<f32>) -> tensor<7xi1> {
  %0 = "kf.cmp"(%x, %z) {predicate = "gt"} : (tensor<7xf32>, tensor<f32>) -> tensor<7xi1>
  return %0 : tensor<7xi1>
}

// -----

// A bool (and an integer) converted to bf16 and added to a bf16 tensor: done in f32 and
// rounded to bf16 in integer arithmetic, with no bf16 arithmetic or int-to-bf16
// conversion left for LLVM, which would call compiler-rt's __truncsfbf2 (the JIT that
// makes the object code cannot resolve it and aborts the process).
// CHECK-LABEL: llvm.func @bool_int_plus_bf16(
// CHECK-NOT: to bf16
// CHECK-NOT: llvm.fadd {{.*}} : bf16
// CHECK: llvm.uitofp %{{.*}} : i1 to f32
// CHECK: llvm.return
func.func @bool_int_plus_bf16(%b: tensor<5xi1>, %i: tensor<5xi32>, %y: tensor<5xbf16>) -> tensor<5xbf16> {
  %0 = "kf.cast"(%b) : (tensor<5xi1>) -> tensor<5xbf16>
  %1 = "kf.cast"(%i) : (tensor<5xi32>) -> tensor<5xbf16>
  %2 = "kf.add"(%0, %y) : (tensor<5xbf16>, tensor<5xbf16>) -> tensor<5xbf16>
  %3 = "kf.add"(%2, %1) : (tensor<5xbf16>, tensor<5xbf16>) -> tensor<5xbf16>
  return %3 : tensor<5xbf16>
}

// -----

// A select of bf16 values selects their 16 bits: LLVM keeps a bf16 value in an f32
// register and would truncate the selected one back with compiler-rt's __truncsfbf2.
// Loads and stores of bf16 are of i16 as well: in a vectorized loop the backend
// promoted those too.
// CHECK-LABEL: llvm.func @where_bf16(
// CHECK-NOT: -> bf16
// CHECK-NOT: : bf16, !llvm.ptr
// CHECK-NOT: i1, bf16
// CHECK: llvm.select %{{.*}}, %{{.*}}, %{{.*}} : i1, i16
// CHECK-NOT: : bf16, !llvm.ptr
// CHECK: llvm.return
func.func @where_bf16(%x: tensor<13x257xbf16>, %y: tensor<1xbf16>) -> tensor<13x257xbf16> {
  %0 = "kf.cmp"(%x, %y) {predicate = "gt"} : (tensor<13x257xbf16>, tensor<1xbf16>) -> tensor<13x257xi1>
  %1 = "kf.select"(%0, %x, %y) : (tensor<13x257xi1>, tensor<13x257xbf16>, tensor<1xbf16>) -> tensor<13x257xbf16>
  return %1 : tensor<13x257xbf16>
}
