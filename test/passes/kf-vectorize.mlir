// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize)' | FileCheck %s
// A second run finds nothing left to do (vectorized loops and tails drop kf.row_loop):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize, kf-vectorize)' | FileCheck %s
// The PTX of the vectorized kernels has 128-bit global and shared accesses, and ptxas
// assembles it without spills:
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize)' -o %t.mlir
// RUN: %if ptxas %{ %PYTHON -m kf.passes.to_cuda --split-input-file --ptxas --chip=sm_90 %t.mlir | FileCheck %s --check-prefix=PTX %}
// RUN: %if ptxas %{ %PYTHON -m kf.passes.to_cuda --split-input-file --ptxas --chip=sm_80 %t.mlir | FileCheck %s --check-prefix=PTX %}
// Invalid inputs (Inputs/kf-vectorize-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-vectorize-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-vectorize)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize{vector-bits=96})' 2>&1 | FileCheck %s --check-prefix=BAD-BITS
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize{max-lanes=3})' 2>&1 | FileCheck %s --check-prefix=BAD-LANES
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-vectorize{lanes=4})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-BITS: error: kf-vectorize: vector-bits must be a power of two of at least 8, got 96
// BAD-LANES: error: kf-vectorize: max-lanes must be 0 (no cap) or a power of two, got 3
// BAD-OPTION: error: pass 'kf-vectorize' has no option 'lanes' (options: max-lanes, vector-bits)
// REQUIRES: ptxas

// A sum phase over rows of 1024 f32 (a multiple of 4): the loop becomes vector<4xf32>
// loads with a vector accumulator, reduced once after the loop, and no scalar tail.
// The accumulator starts at zero in every lane; the scalar initial value is added by
// vector.reduction.
// CHECK-LABEL: gpu.func @sum_f32
// CHECK-SAME: kf.assumed_alignment = 16 : i64
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[INIT:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : index
// CHECK-DAG: %[[LB:.*]] = arith.muli %[[TID]], %[[C4]] : index
// CHECK-DAG: %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : vector<4xf32>
// CHECK-DAG: %[[UB:.*]] = arith.constant 1024 : index
// CHECK-DAG: %[[STEP:.*]] = arith.constant 512 : index
// CHECK: %[[V:.*]] = scf.for %[[J:.*]] = %[[LB]] to %[[UB]] step %[[STEP]] iter_args(%[[ACC:.*]] = %[[ZERO]]) -> (vector<4xf32>) {
// CHECK-NEXT: %[[X:.*]] = vector.load %arg0[%{{.*}}, %[[J]]] {alignment = 16 : i64} : memref<8x1024xf32>, vector<4xf32>
// CHECK-NEXT: %[[SQ:.*]] = arith.mulf %[[X]], %[[X]] : vector<4xf32>
// CHECK-NEXT: %[[A:.*]] = arith.addf %[[ACC]], %[[SQ]] : vector<4xf32>
// CHECK-NEXT: scf.yield %[[A]] : vector<4xf32>
// CHECK-NEXT: } {kf.vectorized = 4 : i64}
// CHECK-NEXT: %[[S:.*]] = vector.reduction <add>, %[[V]], %[[INIT]] : vector<4xf32> into f32
// CHECK-NEXT: memref.store %[[S]], %arg1[%{{.*}}]
// CHECK-NOT: scf.for
// PTX-LABEL: .visible .entry sum_f32(
// PTX: ld.global.v4.b32
// PTX-LABEL: // ptxas sm_{{[89]}}0 sum_f32:
// PTX-SAME: "spill_load_bytes": 0, "spill_store_bytes": 0
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @sum_f32(%x: memref<8x1024xf32>, %out: memref<8xf32>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 1024 : index
      %t = arith.constant 128 : index
      %init = arith.constant 1.0 : f32
      %s = scf.for %j = %tid to %n step %t iter_args(%acc = %init) -> (f32) {
        %v = memref.load %x[%row, %j] : memref<8x1024xf32>
        %sq = arith.mulf %v, %v : f32
        %a = arith.addf %acc, %sq : f32
        scf.yield %a : f32
      } {kf.row_loop}
      memref.store %s, %out[%row] : memref<8xf32>
      gpu.return
    }
  }
}

// -----

// An output phase on f16 rows of 1000 (a multiple of 8): 8 lanes of f16 are 128 bits.
// The loaded rows are extended to f32, scaled by a per-row scalar (broadcast once per
// use) and truncated back; the loop-invariant weight row is a rank-1 memref.
// CHECK-LABEL: gpu.func @scale_f16
// CHECK: scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT: %[[X:.*]] = vector.load %arg0[%{{.*}}, %[[J]]] {alignment = 16 : i64} : memref<4x1000xf16>, vector<8xf16>
// CHECK-NEXT: %[[XF:.*]] = arith.extf %[[X]] : vector<8xf16> to vector<8xf32>
// CHECK-NEXT: %[[W:.*]] = vector.load %arg1[%[[J]]] {alignment = 16 : i64} : memref<1000xf16>, vector<8xf16>
// CHECK-NEXT: %[[WF:.*]] = arith.extf %[[W]] : vector<8xf16> to vector<8xf32>
// CHECK-NEXT: %[[B:.*]] = vector.broadcast %{{.*}} : f32 to vector<8xf32>
// CHECK-NEXT: %[[M:.*]] = arith.mulf %[[XF]], %[[B]] : vector<8xf32>
// CHECK-NEXT: %[[R:.*]] = arith.mulf %[[M]], %[[WF]] : vector<8xf32>
// CHECK-NEXT: %[[T:.*]] = arith.truncf %[[R]] : vector<8xf32> to vector<8xf16>
// CHECK-NEXT: vector.store %[[T]], %arg2[%{{.*}}, %[[J]]] {alignment = 16 : i64} : memref<4x1000xf16>, vector<8xf16>
// CHECK: } {kf.vectorized = 8 : i64}
// CHECK-NOT: scf.for
// PTX-LABEL: .visible .entry scale_f16(
// PTX: ld.global.v4.b32
// PTX: st.global.v4.b32
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @scale_f16(%x: memref<4x1000xf16>, %w: memref<1000xf16>, %y: memref<4x1000xf16>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 1000 : index
      %t = arith.constant 128 : index
      %s = arith.constant 0.5 : f32
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] : memref<4x1000xf16>
        %vf = arith.extf %v : f16 to f32
        %wv = memref.load %w[%j] : memref<1000xf16>
        %wf = arith.extf %wv : f16 to f32
        %m = arith.mulf %vf, %s : f32
        %r = arith.mulf %m, %wf : f32
        %o = arith.truncf %r : f32 to f16
        memref.store %o, %y[%row, %j] : memref<4x1000xf16>
      } {kf.row_loop}
      gpu.return
    }
  }
}

// -----

// A cached row of 257 in workgroup memory (it starts at offset 0, so it is aligned even
// though 257 is not a multiple of 4): the vector loop covers [0, 256), the original
// scalar loop the tail [256, 257), starting from the vector loop's maximum. The buffer
// gets 16-byte alignment (convert-gpu-to-nvvm would give it 4, and ld.shared.v4 faults
// at addresses that are not multiples of 16).
// CHECK-LABEL: gpu.func @max_tail
// CHECK-SAME: workgroup(%{{.*}} : memref<257xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[NEG:.*]] = arith.constant 0xFF800000 : f32
// CHECK: %[[INIT:.*]] = vector.broadcast %[[NEG]] : f32 to vector<4xf32>
// CHECK: %[[V:.*]] = scf.for %{{.*}} iter_args(%{{.*}} = %[[INIT]]) -> (vector<4xf32>) {
// CHECK: vector.load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : memref<257xf32, #gpu.address_space<workgroup>>, vector<4xf32>
// CHECK: arith.maximumf %{{.*}} : vector<4xf32>
// CHECK: } {kf.vectorized = 4 : i64}
// CHECK: %[[M:.*]] = vector.reduction <maximumf>, %[[V]], %[[NEG]] : vector<4xf32> into f32
// CHECK: %[[C256:.*]] = arith.constant 256 : index
// CHECK: %[[LB:.*]] = arith.addi %[[C256]], %[[TID]] : index
// CHECK: scf.for %{{.*}} = %[[LB]] to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %[[M]]) -> (f32) {
// CHECK: memref.load %{{.*}}[%{{.*}}] : memref<257xf32, #gpu.address_space<workgroup>>
// CHECK: } {kf.vector_tail}
// PTX-LABEL: .visible .entry max_tail(
// PTX: .shared .align 16 .b8 __wg_max_tail_0[1028];
// PTX: ld.shared.v4.{{[bf]}}32
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @max_tail(%x: memref<7x257xf32>, %out: memref<7xf32>)
        workgroup(%buf: memref<257xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 257 : index
      %t = arith.constant 64 : index
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] : memref<7x257xf32>
        memref.store %v, %buf[%j] : memref<257xf32, #gpu.address_space<workgroup>>
      } {kf.row_loop, kf.vector_lanes = 1 : i64}
      gpu.barrier
      %ninf = arith.constant 0xFF800000 : f32
      %m = scf.for %j = %tid to %n step %t iter_args(%acc = %ninf) -> (f32) {
        %v = memref.load %buf[%j] : memref<257xf32, #gpu.address_space<workgroup>>
        %a = arith.maximumf %acc, %v : f32
        scf.yield %a : f32
      } {kf.row_loop}
      memref.store %m, %out[%row] : memref<7xf32>
      gpu.return
    }
  }
}

// -----

// What is left scalar, with the reason on the loop: global rows of 257 (row 1 starts at
// byte 1028, not 16-byte aligned), a plan of one lane, a loop index used as a value,
// a loop whose lower bound is not the thread id.
// CHECK-LABEL: gpu.func @refused
// CHECK: kf.vectorize_skipped = "no vector width gives aligned accesses (last dimension not a multiple of the lanes)"
// CHECK: kf.vectorize_skipped = "1 lane: the plan keeps this loop scalar"
// CHECK: kf.vectorize_skipped = "the loop index is used by arith.index_cast, not as an innermost index"
// CHECK: kf.vectorize_skipped = "lower bound is not gpu.thread_id x"
// CHECK-NOT: vector.load
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @refused(%x: memref<7x257xf32>, %y: memref<7x256xf32>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %c0 = arith.constant 0 : index
      %n = arith.constant 257 : index
      %m = arith.constant 256 : index
      %t = arith.constant 64 : index
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] : memref<7x257xf32>
        memref.store %v, %x[%row, %j] : memref<7x257xf32>
      } {kf.row_loop}
      scf.for %j = %tid to %m step %t {
        %v = memref.load %y[%row, %j] : memref<7x256xf32>
        memref.store %v, %y[%row, %j] : memref<7x256xf32>
      } {kf.row_loop, kf.vector_lanes = 1 : i64}
      scf.for %j = %tid to %m step %t {
        %i = arith.index_cast %j : index to i64
        %f = arith.sitofp %i : i64 to f32
        memref.store %f, %y[%row, %j] : memref<7x256xf32>
      } {kf.row_loop}
      scf.for %j = %c0 to %m step %t {
        %v = memref.load %y[%row, %j] : memref<7x256xf32>
        memref.store %v, %y[%row, %j] : memref<7x256xf32>
      } {kf.row_loop}
      gpu.return
    }
  }
}
