// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-to-metal)' | FileCheck %s
// RUN: %PYTHON -m kf.passes.to_metal %s | FileCheck %s --check-prefix=MSL
// REQUIRES: spirv-cross
// Invalid inputs (Inputs/kf-to-metal-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-to-metal-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-to-metal)'
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-to-metal{msl-version=23})' 2>&1 | FileCheck %s --check-prefix=BAD-VERSION
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-to-metal{msl-version=2.3})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-to-metal{version=2})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-VERSION: error: kf-to-metal: msl-version is major * 10000 + minor * 100 (20300: MSL 2.3), got 23
// BAD-INT: error: pass 'kf-to-metal' option 'msl-version' takes an int, got '2.3'
// BAD-OPTION: error: pass 'kf-to-metal' has no option 'version' (options: msl-version, workgroup-size)

// kf-to-metal runs kf-to-spirv, then SPIRV-Cross per entry point. The gpu.binary keeps
// its SPIR-V and gains the MSL and the launch facts: threadgroup size and buffer indices.
// CHECK-LABEL: gpu.binary @kf_kernels
// CHECK-SAME: kf.metal = {row_sum = {buffers = array<i64: 0, 1>, function = "row_sum", threadgroup_bytes = 512 : i64, threadgroup_size = array<i64: 64, 1, 1>}, scale = {buffers = array<i64: 0, 1, 2>, function = "scale", threadgroup_bytes = 0 : i64, threadgroup_size = array<i64: 128, 1, 1>}}
// CHECK-SAME: kf.msl = {row_sum = "{{.*}}kernel void row_sum(
// CHECK-SAME: threadgroup float
// CHECK-SAME: threadgroup_barrier(mem_flags::mem_threadgroup)
// CHECK-SAME: scale = "{{.*}}kernel void scale(

// The MSL itself: buffer(i) is argument i, workgroup memory a threadgroup array (the
// attribution and the workgroup alloca each), gpu.barrier a threadgroup barrier.
// MSL-LABEL: // kernel row_sum: function row_sum, threadgroup [64, 1, 1], buffers [0, 1], threadgroup bytes 512
// MSL: kernel void row_sum(device {{.*}} {{\[\[}}buffer(0){{\]\]}}, device {{.*}} {{\[\[}}buffer(1){{\]\]}}, uint3 {{.*}} {{\[\[}}thread_position_in_threadgroup{{\]\]}}
// MSL-DAG: threadgroup float {{.*}}[64];
// MSL-DAG: threadgroup float {{.*}}[64];
// MSL: threadgroup_barrier(mem_flags::mem_threadgroup);
// MSL: threadgroup_barrier(mem_flags::mem_threadgroup);
// Each kernel is cut out of the module first: scale does not inherit row_sum's arrays.
// MSL-LABEL: // kernel scale: function scale, threadgroup [128, 1, 1], buffers [0, 1, 2], threadgroup bytes 0
// MSL: half _m0[1000];
// MSL: kernel void scale(device {{.*}} {{\[\[}}buffer(0){{\]\]}}, device {{.*}} {{\[\[}}buffer(1){{\]\]}}, device {{.*}} {{\[\[}}buffer(2){{\]\]}}
// MSL-NOT: threadgroup float
// MSL: if ({{.*}} < 1000u)
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @row_sum(%x: memref<4x64xf32>, %out: memref<4xf32>)
        workgroup(%red: memref<64xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %row = gpu.block_id x
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c32 = arith.constant 32 : index
      %v = memref.load %x[%row, %tid] : memref<4x64xf32>
      %tmp = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %v, %tmp[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %lt = arith.cmpi ult, %tid, %c32 : index
      scf.if %lt {
        %o = arith.addi %tid, %c32 : index
        %u = memref.load %tmp[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
        %w = memref.load %tmp[%o] : memref<64xf32, #gpu.address_space<workgroup>>
        %s = arith.addf %u, %w : f32
        memref.store %s, %red[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
      }
      gpu.barrier
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {
        %r = memref.load %red[%c0] : memref<64xf32, #gpu.address_space<workgroup>>
        memref.store %r, %out[%row] : memref<4xf32>
      }
      gpu.return
    }
    gpu.func @scale(%a: memref<1000xf16>, %s: memref<1xf16>, %c: memref<1000xf16>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %t = arith.muli %bid, %bdim : index
      %i = arith.addi %t, %tid : index
      %c0 = arith.constant 0 : index
      %n = arith.constant 1000 : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {
        %x = memref.load %a[%i] : memref<1000xf16>
        %k = memref.load %s[%c0] : memref<1xf16>
        %z = arith.mulf %x, %k : f16
        memref.store %z, %c[%i] : memref<1000xf16>
      }
      gpu.return
    }
  }
}
