// kf-to-cuda: gpu.module kernels to PTX in a gpu.binary, bare-pointer arguments.
// RUN: kf-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-to-cuda{chip=sm_90})' | FileCheck %s --check-prefix=BIN
// The PTX itself, one instruction per line, for sm_80 and sm_90:
// RUN: not %PYTHON -m kf.passes.to_cuda --split-input-file --chip=sm_90 %s 2>&1 | FileCheck %s --check-prefixes=PTX,SM90
// RUN: not %PYTHON -m kf.passes.to_cuda --split-input-file --chip=sm_80 %s 2>&1 | FileCheck %s --check-prefixes=PTX,SM80
// ptxas's report where ptxas exists (lit's %if rather than a file-wide REQUIRES, so the
// checks above still run on machines without the CUDA toolkit):
// RUN: %if ptxas %{ not %PYTHON -m kf.passes.to_cuda --split-input-file --ptxas --chip=sm_90 %s 2>&1 | FileCheck %s --check-prefix=PTXAS %}
// Bad options:
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-cuda{opt-level=high})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-cuda{arch=sm_90})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-INT: error: pass 'kf-to-cuda' option 'opt-level' takes an int, got 'high'
// Options out of range are errors when the pass is made: nvvm-attach-target would write
// PTX for ".target banana" and asserts (ending the process) on an opt level past 3.
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-cuda{chip=banana})' 2>&1 | FileCheck %s --check-prefix=BAD-CHIP
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-cuda{opt-level=9})' 2>&1 | FileCheck %s --check-prefix=BAD-OPT
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-cuda{index-bitwidth=16})' 2>&1 | FileCheck %s --check-prefix=BAD-INDEX
// BAD-OPTION: error: pass 'kf-to-cuda' has no option 'arch' (options: chip, features, ftz, index-bitwidth, opt-level)
// BAD-CHIP: error: pass 'kf-to-cuda': chip must be a CUDA chip such as sm_80, sm_90 or sm_90a, got 'banana'
// BAD-OPT: error: pass 'kf-to-cuda': opt-level must be 0, 1, 2 or 3, got 9
// BAD-INDEX: error: pass 'kf-to-cuda': index-bitwidth must be 32 or 64, got 16

// An elementwise kernel on bf16 with a tail guard: 1000 elements, blocks of 128.
// BIN: gpu.binary @kf_kernels {{.*}}#nvvm.target<O = 3, chip = "sm_90">{{.*}}assembly = "{{.*}}.visible .entry scale(
// BIN-SAME: ld.global.b16
// PTX-LABEL: .visible .entry scale(
// PTX-NEXT: .param .u64 .ptr .align 1 scale_param_0,
// PTX-NEXT: .param .u64 .ptr .align 1 scale_param_1
// PTX: .maxntid 128, 1, 1
// PTX: setp.gt.u64 {{.*}}, 999;
// PTX: ld.global.b16
// SM90: add.rn.bf16
// SM80: fma.rn.bf16
// PTX: st.global.b16
// PTXAS: // ptxas sm_90 scale: {"barriers": 0, "cmem_bytes": 0, "registers": {{[0-9]+}}, "shared_bytes": 0, "spill_load_bytes": 0, "spill_store_bytes": 0, "stack_bytes": 0}
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @scale(%x: memref<1000xbf16>, %y: memref<1000xbf16>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %cb = arith.constant 128 : index
      %n = arith.constant 1000 : index
      %base = arith.muli %bid, %cb : index
      %i = arith.addi %base, %tid : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {
        %v = memref.load %x[%i] : memref<1000xbf16>
        %two = arith.constant 2.0 : bf16
        %r = arith.mulf %v, %two : bf16
        memref.store %r, %y[%i] : memref<1000xbf16>
      }
      gpu.return
    }
  }
}

// -----

// Workgroup memory and a barrier: each block of 64 sums its 64 values through shared
// memory (one step shown). Math lowers through the libdevice linked into the PTX.
// BIN: gpu.binary @kf_kernels {{.*}}assembly = "{{.*}}.shared .align 4 .b8 {{.*}}[256]{{.*}}bar.sync
// PTX-LABEL: .visible .entry pair_sum(
// PTX: .shared .align 4 .b8 [[SH:.*]][256];
// PTX: ld.global.b32
// PTX: st.shared.b32
// PTX: bar.sync 0;
// PTX: ld.shared.b32
// PTX: ex2.approx
// PTX-NOT: .extern .func
// PTX: ret;
// PTXAS: // ptxas sm_90 pair_sum: {"barriers": 1, "cmem_bytes": 0, "registers": {{[0-9]+}}, "shared_bytes": 256, "spill_load_bytes": 0, "spill_store_bytes": 0, "stack_bytes": 0}
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @pair_sum(%x: memref<4x64xf32>, %y: memref<4x32xf32>)
        workgroup(%sh: memref<64xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %row = gpu.block_id x
      %tid = gpu.thread_id x
      %c32 = arith.constant 32 : index
      %v = memref.load %x[%row, %tid] : memref<4x64xf32>
      memref.store %v, %sh[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %lo = arith.cmpi ult, %tid, %c32 : index
      scf.if %lo {
        %o = arith.addi %tid, %c32 : index
        %a = memref.load %sh[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
        %b = memref.load %sh[%o] : memref<64xf32, #gpu.address_space<workgroup>>
        %s = arith.addf %a, %b : f32
        %e = math.exp %s : f32
        memref.store %e, %y[%row, %tid] : memref<4x32xf32>
      }
      gpu.return
    }
  }
}

// -----

// Dynamic workgroup memory becomes the CUDA form, an extern array sized at launch.
// BIN: assembly = "{{.*}}.extern .shared .align 16 .b8 __dynamic_shmem__0[];
// PTX: .extern .shared .align 16 .b8 __dynamic_shmem__0[];
// PTX-EMPTY:
// PTX-NEXT: .visible .entry dyn(
// PTXAS: // ptxas sm_90 dyn: {"barriers": 0, {{.*}}"shared_bytes": 0,
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @dyn(%x: memref<256xf32>) kernel {
      %raw = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
      %c0 = arith.constant 0 : index
      %buf = memref.view %raw[%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<256xf32, #gpu.address_space<workgroup>>
      %tid = gpu.thread_id x
      %v = memref.load %x[%tid] : memref<256xf32>
      memref.store %v, %buf[%tid] : memref<256xf32, #gpu.address_space<workgroup>>
      gpu.return
    }
  }
}

// -----

// vector.load/store with 16-byte alignment become 128-bit global accesses.
// BIN: assembly = "{{.*}}ld.global.v4.b32
// PTX-LABEL: .visible .entry vec(
// PTX: ld.global.v4.b32 {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}
// PTX: st.global.v4.b32
// PTXAS: // ptxas sm_90 vec: {"barriers": 0, {{.*}}"spill_store_bytes": 0, "stack_bytes": 0}
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @vec(%x: memref<1024xf32>, %y: memref<1024xf32>) kernel {
      %tid = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %i = arith.muli %tid, %c4 : index
      %v = vector.load %x[%i] {alignment = 16} : memref<1024xf32>, vector<4xf32>
      %e = math.exp %v : vector<4xf32>
      vector.store %e, %y[%i] {alignment = 16} : memref<1024xf32>, vector<4xf32>
      gpu.return
    }
  }
}

// -----

// Approximate math (scalar_math's short GELU and sigmoid for bf16/f16 results): f32
// exp2 and division with fastmath<afn> are ex2.approx.ftz and rcp.approx.ftz (times the
// numerator, none for 1 / d); without afn, libdevice's exp2 and IEEE division.
// PTX-LABEL: .visible .entry approx(
// PTX: ex2.approx.ftz.f32 [[E:%r[0-9]+]],
// PTX: add.rn.f32 [[D:%r[0-9]+]], [[E]], 0f3F800000;
// PTX: rcp.approx.ftz.f32 [[R:%r[0-9]+]], [[D]];
// PTX: mul.rn.f32 {{.*}}[[R]]
// PTX: rcp.approx.ftz.f32 [[R1:%r[0-9]+]], [[E]];
// PTX-NEXT: add.s64
// PTX-NEXT: st.global.b32 {{.*}}[[R1]]
// PTX: div.rn.f32 {{.*}}[[D]];
// PTX: ret;
// PTXAS: // ptxas sm_90 approx: {"barriers": 0, {{.*}}"spill_store_bytes": 0, "stack_bytes": 0}
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @approx(%x: memref<256xf32>, %y: memref<256xf32>, %z: memref<256xf32>, %w: memref<256xf32>) kernel {
      %tid = gpu.thread_id x
      %v = memref.load %x[%tid] : memref<256xf32>
      %one = arith.constant 1.0 : f32
      %e = math.exp2 %v fastmath<afn> : f32
      %d = arith.addf %e, %one : f32
      %g = arith.divf %v, %d fastmath<afn> : f32
      memref.store %g, %y[%tid] : memref<256xf32>
      %r = arith.divf %one, %e fastmath<afn> : f32
      memref.store %r, %z[%tid] : memref<256xf32>
      %q = arith.divf %v, %d : f32
      memref.store %q, %w[%tid] : memref<256xf32>
      gpu.return
    }
  }
}

// -----

// A 32x32 -> 64-bit product (kf.rand's Philox rounds) stays in 32-bit registers:
// mul.lo and mul.hi.u32, not a 64-bit multiply of widened operands.
// PTX-LABEL: .visible .entry mulhi(
// PTX: mul.hi.u32
// PTX-NOT: mul.wide
// PTX-NOT: mul.lo.s64
// PTX: ret;
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @mulhi(%x: memref<256xi32>, %y: memref<256xi32>) kernel
        attributes {known_block_size = array<i32: 256, 1, 1>} {
      %tid = gpu.thread_id x
      %v = memref.load %x[%tid] : memref<256xi32>
      %m = arith.constant -766435501 : i32
      %lo, %hi = arith.mului_extended %m, %v : i32
      %r = arith.xori %lo, %hi : i32
      memref.store %r, %y[%tid] : memref<256xi32>
      gpu.return
    }
  }
}

// -----

// Bare pointers carry no shape: a dynamically shaped argument is refused at its kernel.
// PTX: kf-to-cuda failed
// PTX: kernel argument 0 has type memref<?xf32>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-to-cuda: kernel argument 0 has type memref<?xf32>: the bare-pointer convention needs a static shape and the identity layout}}
    gpu.func @dynamic(%x: memref<?xf32>) kernel {
      gpu.return
    }
  }
}

// -----

// Torch stores booleans as bytes: a kernel argument of i1 is refused at its kernel (MLIR's
// memref-to-LLVM lowering would assert on the sub-byte load and end the process).
// PTX: kf-to-cuda failed
// PTX: kernel argument 0 has type memref<4xi1>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-to-cuda: kernel argument 0 has type memref<4xi1>: CUDA buffers of booleans hold bytes (i8), as torch stores them}}
    gpu.func @bits(%a: memref<4xi1>, %b: memref<4xf32>) kernel {
      %t = gpu.thread_id x
      %v = memref.load %a[%t] : memref<4xi1>
      %f = arith.uitofp %v : i1 to f32
      memref.store %f, %b[%t] : memref<4xf32>
      gpu.return
    }
  }
}
