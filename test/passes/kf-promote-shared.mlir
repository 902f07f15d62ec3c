// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-promote-shared)' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-promote-shared{max-shared-bytes=2048})' | FileCheck %s --check-prefix=SMALL
// Invalid inputs (Inputs/kf-promote-shared-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-promote-shared-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-promote-shared)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-promote-shared{max-shared-bytes=-1})' 2>&1 | FileCheck %s --check-prefix=BAD-LIMIT
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-promote-shared{min-reads=0})' 2>&1 | FileCheck %s --check-prefix=BAD-READS
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-promote-shared{max-shared-bytes=48K})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// BAD-LIMIT: error: kf-promote-shared: max-shared-bytes must be 0 (the kernel's own limit) or positive, got -1
// BAD-READS: error: kf-promote-shared: min-reads must be at least 1, got 0
// BAD-INT: error: pass 'kf-promote-shared' option 'max-shared-bytes' takes an int, got '48K'

// The layer norm shape: x is read by the sum phase and by the output phase (both
// loads marked kf.promote by the rowwise strategy). The row is copied once into a new
// workgroup attribution before the first phase, a barrier follows, and both phases
// read the buffer. The weight is read once: it stays a global load.
// CHECK-LABEL: gpu.func @two_phases
// CHECK-SAME: workgroup(%[[RED:.*]] : memref<256xf32, #gpu.address_space<workgroup>>, %[[BUF:.*]] : memref<1000xf32, #gpu.address_space<workgroup>>)
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[ROW:.*]] = gpu.block_id x
// CHECK: scf.for %[[J:.*]] = %[[TID]] to %{{.*}} step %{{.*}} {
// CHECK-NEXT: %[[V:.*]] = memref.load %arg0[%[[ROW]], %[[J]]] : memref<3x1000xf32>
// CHECK-NEXT: memref.store %[[V]], %[[BUF]][%[[J]]] : memref<1000xf32, #gpu.address_space<workgroup>>
// CHECK: } {kf.promoted, kf.row_loop, kf.vector_lanes = 4 : i64}
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: scf.for %[[J1:.*]] = %[[TID]]
// CHECK-NEXT: memref.load %[[BUF]][%[[J1]]] : memref<1000xf32, #gpu.address_space<workgroup>>
// CHECK: scf.for %[[J2:.*]] = %[[TID]]
// CHECK: memref.load %arg1[%[[J2]]] : memref<1000xf32>
// CHECK: memref.load %[[BUF]][%[[J2]]] : memref<1000xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: memref.load %arg0
// With 2 KiB of shared memory the 4000-byte row does not fit beside the 1 KiB scratch:
// nothing changes.
// SMALL-LABEL: gpu.func @two_phases
// SMALL-SAME: workgroup(%{{.*}} : memref<256xf32, #gpu.address_space<workgroup>>) kernel
// SMALL-NOT: gpu.barrier
// SMALL: memref.load %arg0[%{{.*}}, %{{.*}}] {kf.promote} : memref<3x1000xf32>
// SMALL: memref.load %arg0[%{{.*}}, %{{.*}}] {kf.promote} : memref<3x1000xf32>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @two_phases(%x: memref<3x1000xf32>, %w: memref<1000xf32>, %y: memref<3x1000xf32>)
        workgroup(%red: memref<256xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 256, 1, 1>, kf.max_shared_bytes = 49152 : i64} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %c0 = arith.constant 0 : index
      %n = arith.constant 1000 : index
      %t = arith.constant 256 : index
      %zero = arith.constant 0.0 : f32
      %part = scf.for %j = %tid to %n step %t iter_args(%acc = %zero) -> (f32) {
        %v = memref.load %x[%row, %j] {kf.promote} : memref<3x1000xf32>
        %a = arith.addf %acc, %v : f32
        scf.yield %a : f32
      } {kf.row_loop, kf.vector_lanes = 4 : i64}
      memref.store %part, %red[%tid] : memref<256xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %s = memref.load %red[%c0] : memref<256xf32, #gpu.address_space<workgroup>>
      scf.for %j = %tid to %n step %t {
        %wv = memref.load %w[%j] : memref<1000xf32>
        %v = memref.load %x[%row, %j] {kf.promote} : memref<3x1000xf32>
        %d = arith.subf %v, %s : f32
        %o = arith.mulf %d, %wv : f32
        memref.store %o, %y[%row, %j] : memref<3x1000xf32>
      } {kf.row_loop, kf.vector_lanes = 4 : i64}
      gpu.return
    }
  }
}

// -----

// A row read in one phase only gains nothing from shared memory: unchanged.
// CHECK-LABEL: gpu.func @one_phase
// CHECK-NOT: workgroup(
// CHECK-NOT: gpu.barrier
// CHECK: memref.load %arg0[%{{.*}}, %{{.*}}] {kf.promote} : memref<4x64xf16>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @one_phase(%x: memref<4x64xf16>, %y: memref<4x64xf16>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 64 : index
      %t = arith.constant 64 : index
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] {kf.promote} : memref<4x64xf16>
        memref.store %v, %y[%row, %j] : memref<4x64xf16>
      } {kf.row_loop}
      gpu.return
    }
  }
}

// -----

// The kernel writes x between the phases (an in-place update): a copy taken before the
// first phase would be stale in the second, so x is not promoted.
// CHECK-LABEL: gpu.func @written
// CHECK-NOT: workgroup(
// CHECK: memref.load %arg0[%{{.*}}, %{{.*}}] {kf.promote}
// CHECK: memref.store %{{.*}}, %arg0
// CHECK: memref.load %arg0[%{{.*}}, %{{.*}}] {kf.promote}
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @written(%x: memref<4x64xf32>, %y: memref<4x64xf32>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 64 : index
      %t = arith.constant 64 : index
      %two = arith.constant 2.0 : f32
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] {kf.promote} : memref<4x64xf32>
        %d = arith.mulf %v, %two : f32
        memref.store %d, %x[%row, %j] : memref<4x64xf32>
      } {kf.row_loop}
      gpu.barrier
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] {kf.promote} : memref<4x64xf32>
        memref.store %v, %y[%row, %j] : memref<4x64xf32>
      } {kf.row_loop}
      gpu.return
    }
  }
}

// -----

// Unmarked loads are not touched, however often they are read: the pass follows the
// strategy's markers.
// CHECK-LABEL: gpu.func @unmarked
// CHECK-NOT: workgroup(
// CHECK-COUNT-2: memref.load %arg0[%{{.*}}, %{{.*}}] : memref<4x64xf32>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @unmarked(%x: memref<4x64xf32>, %y: memref<4x64xf32>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 64 : index
      %t = arith.constant 64 : index
      %zero = arith.constant 0.0 : f32
      %s = scf.for %j = %tid to %n step %t iter_args(%acc = %zero) -> (f32) {
        %v = memref.load %x[%row, %j] : memref<4x64xf32>
        %a = arith.addf %acc, %v : f32
        scf.yield %a : f32
      } {kf.row_loop}
      scf.for %j = %tid to %n step %t {
        %v = memref.load %x[%row, %j] : memref<4x64xf32>
        %d = arith.subf %v, %s : f32
        memref.store %d, %y[%row, %j] : memref<4x64xf32>
      } {kf.row_loop}
      gpu.return
    }
  }
}

// -----

// A group loop (column partials: each iteration one row of the workgroup's block of
// rows): its body's row loops read the row twice, so each iteration copies it into the
// buffer, after a barrier (every thread has read the previous row) and before one.
// CHECK-LABEL: gpu.func @group_loop
// CHECK-SAME: workgroup(%{{.*}} : memref<256xf32, #gpu.address_space<workgroup>>, %[[BUF:.*]] : memref<1000xf32, #gpu.address_space<workgroup>>)
// CHECK: scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK: %[[ROW:.*]] = arith.addi
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT: %[[V:.*]] = memref.load %arg0[%[[ROW]], %[[J]]] : memref<6x1000xf32>
// CHECK-NEXT: memref.store %[[V]], %[[BUF]][%[[J]]]
// CHECK: } {kf.promoted, kf.row_loop, kf.vector_lanes = 4 : i64}
// CHECK-NEXT: gpu.barrier
// CHECK-NOT: memref.load %arg0
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @group_loop(%x: memref<6x1000xf32>, %y: memref<6x1000xf32>)
        workgroup(%red: memref<256xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 256, 1, 1>, kf.max_shared_bytes = 49152 : i64} {
      %tid = gpu.thread_id x
      %group = gpu.block_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %n = arith.constant 1000 : index
      %t = arith.constant 256 : index
      %zero = arith.constant 0.0 : f32
      scf.for %r = %c0 to %c2 step %c1 {
        %first = arith.muli %group, %c2 : index
        %row = arith.addi %first, %r : index
        %part = scf.for %j = %tid to %n step %t iter_args(%acc = %zero) -> (f32) {
          %v = memref.load %x[%row, %j] {kf.promote} : memref<6x1000xf32>
          %a = arith.addf %acc, %v : f32
          scf.yield %a : f32
        } {kf.row_loop, kf.vector_lanes = 4 : i64}
        memref.store %part, %red[%tid] : memref<256xf32, #gpu.address_space<workgroup>>
        gpu.barrier
        %s = memref.load %red[%c0] : memref<256xf32, #gpu.address_space<workgroup>>
        scf.for %j = %tid to %n step %t {
          %v = memref.load %x[%row, %j] {kf.promote} : memref<6x1000xf32>
          %d = arith.subf %v, %s : f32
          memref.store %d, %y[%row, %j] : memref<6x1000xf32>
        } {kf.row_loop, kf.vector_lanes = 4 : i64}
        gpu.barrier
      }
      gpu.return
    }
  }
}
