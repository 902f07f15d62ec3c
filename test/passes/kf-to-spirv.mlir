// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=false})' | FileCheck %s --check-prefix=SPV
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv)' | FileCheck %s --check-prefix=BIN
// RUN: kf-opt %S/Inputs/kf-to-spirv-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-to-spirv)'
// REQUIRES: spirv-val
// Bad options:
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=perhaps})' 2>&1 | FileCheck %s --check-prefix=BAD-BOOL
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{subgroup-size=wide})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// BAD-BOOL: error: pass 'kf-to-spirv' option 'serialize' is true or false, got 'perhaps'
// BAD-INT: error: pass 'kf-to-spirv' option 'subgroup-size' takes an int, got 'wide'
// Values out of range are errors when the pass is made (they were taken, or failed deep
// inside: int() of the workgroup size, MLIR's parse of the target environment).
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{subgroup-size=12})' 2>&1 | FileCheck %s --check-prefix=BAD-SUBGROUP
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{shared-memory-bytes=-1})' 2>&1 | FileCheck %s --check-prefix=BAD-SHARED
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{workgroup-size=wide})' 2>&1 | FileCheck %s --check-prefix=BAD-SIZE
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{capabilities=Shader,Banana})' 2>&1 | FileCheck %s --check-prefix=BAD-CAPS
// BAD-SUBGROUP: error: pass 'kf-to-spirv': subgroup-size must be a power of two from 1 to 128 (a Vulkan subgroup size), got 12
// BAD-SHARED: error: pass 'kf-to-spirv': shared-memory-bytes must be 0 or more, got -1
// BAD-SIZE: error: pass 'kf-to-spirv': workgroup-size must be 1 to 3 positive integers, got 'wide'
// BAD-CAPS-NOT: unknown capability
// BAD-CAPS: error: kf-to-spirv: capabilities: Banana is not a SPIR-V capability (such as Shader, Float16, GroupNonUniformShuffle)

// An elementwise kernel with the tail guard i < n (1000 is not a multiple of 256): the
// workgroup size comes from known_block_size, gpu.block_dim folds to it, and binding i
// of descriptor set 0 is argument i.
// SPV-LABEL: spirv.module @__spv__kf_kernels Logical GLSL450
// SPV-DAG: spirv.GlobalVariable @add_arg_0 bind(0, 0) : !spirv.ptr<!spirv.struct<(!spirv.array<1000 x f32, stride=4> [0])>, StorageBuffer>
// SPV-DAG: spirv.GlobalVariable @add_arg_1 bind(0, 1)
// SPV-DAG: spirv.GlobalVariable @add_arg_2 bind(0, 2)
// SPV: spirv.func @add() "None"
// SPV: spirv.IMul %{{.*}}, %cst256_i32 : i32
// SPV: spirv.ULessThan %{{.*}}, %cst1000_i32 : i32
// SPV: spirv.mlir.selection
// SPV: spirv.GL.Exp
// SPV: spirv.EntryPoint "GLCompute" @add
// SPV: spirv.ExecutionMode @add "LocalSize", 256, 1, 1
// SPV: gpu.module @kf_kernels

// Serialized: a gpu.binary (checked by spirv-val inside the pass) with the launch facts.
// BIN-LABEL: gpu.binary @kf_kernels
// BIN-SAME: kf.kernels = {add = {bindings = [{binding = 0 : i64, elem = "f32", set = 0 : i64, shape = array<i64: 1000>, storage = "f32"}, {binding = 1 : i64
// BIN-SAME: workgroup_bytes = 0 : i64, workgroup_size = array<i64: 256, 1, 1>}}
// BIN-SAME: [#gpu.object<#spirv.target_env<#spirv.vce<v1.4
// BIN-NOT: gpu.module
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @add(%a: memref<1000xf32>, %b: memref<1000xf32>, %c: memref<1000xf32>) kernel
        attributes {known_block_size = array<i32: 256, 1, 1>} {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %t = arith.muli %bid, %bdim : index
      %i = arith.addi %t, %tid : index
      %n = arith.constant 1000 : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {
        %x = memref.load %a[%i] : memref<1000xf32>
        %y = memref.load %b[%i] : memref<1000xf32>
        %e = math.exp %x : f32
        %z = arith.addf %e, %y : f32
        memref.store %z, %c[%i] : memref<1000xf32>
      }
      gpu.return
    }
  }
}

// -----

// A row sum with one workgroup per row: a workgroup attribution and a workgroup alloca
// both become plain Workgroup arrays (no struct around them), gpu.barrier a
// ControlBarrier, and the strided loop's result variable is initialized before the loop
// (a thread whose slice is empty, 100 columns < 128 threads, must add 0).
// SPV-LABEL: spirv.module @__spv__kf_kernels
// SPV-DAG: spirv.GlobalVariable @__workgroup_mem__{{[0-9]+}} : !spirv.ptr<!spirv.array<128 x f32>, Workgroup>
// SPV-DAG: spirv.GlobalVariable @__workgroup_mem__{{[0-9]+}} : !spirv.ptr<!spirv.array<128 x f32>, Workgroup>
// SPV: spirv.func @row_sum()
// SPV: %[[VAR:.*]] = spirv.Variable : !spirv.ptr<f32, Function>
// SPV-NEXT: spirv.Store "Function" %[[VAR]], %cst_f32 : f32
// SPV-NEXT: spirv.mlir.loop
// SPV: spirv.Store "Function" %[[VAR]]
// SPV: spirv.AccessChain %__workgroup_mem__{{[0-9]+}}_addr[%{{[0-9]+}}] : !spirv.ptr<!spirv.array<128 x f32>, Workgroup>, i32 -> !spirv.ptr<f32, Workgroup>
// SPV: spirv.ControlBarrier <Workgroup>, <Workgroup>, <AcquireRelease|WorkgroupMemory>
// SPV: spirv.ExecutionMode @row_sum "LocalSize", 128, 1, 1

// BIN-LABEL: gpu.binary @kf_kernels
// BIN-SAME: row_sum = {bindings = [{binding = 0 : i64, elem = "f32", set = 0 : i64, shape = array<i64: 3, 100>, storage = "f32"}, {binding = 1 : i64, elem = "f32", set = 0 : i64, shape = array<i64: 3>, storage = "f32"}]
// BIN-SAME: workgroup_bytes = 1024 : i64, workgroup_size = array<i64: 128, 1, 1>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @row_sum(%x: memref<3x100xf32>, %out: memref<3xf32>)
        workgroup(%red: memref<128xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %row = gpu.block_id x
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c64 = arith.constant 64 : index
      %c128 = arith.constant 128 : index
      %c100 = arith.constant 100 : index
      %zero = arith.constant 0.0 : f32
      %part = scf.for %j = %tid to %c100 step %c128 iter_args(%acc = %zero) -> (f32) {
        %v = memref.load %x[%row, %j] : memref<3x100xf32>
        %a = arith.addf %acc, %v : f32
        scf.yield %a : f32
      }
      %tmp = memref.alloca() : memref<128xf32, #gpu.address_space<workgroup>>
      memref.store %part, %tmp[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %p = memref.load %tmp[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
      memref.store %p, %red[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %lt = arith.cmpi ult, %tid, %c64 : index
      scf.if %lt {
        %o = arith.addi %tid, %c64 : index
        %u = memref.load %red[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
        %w = memref.load %red[%o] : memref<128xf32, #gpu.address_space<workgroup>>
        %s = arith.addf %u, %w : f32
        memref.store %s, %red[%tid] : memref<128xf32, #gpu.address_space<workgroup>>
      }
      gpu.barrier
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {
        %r = memref.load %red[%c0] : memref<128xf32, #gpu.address_space<workgroup>>
        memref.store %r, %out[%row] : memref<3xf32>
      }
      gpu.return
    }
  }
}

// -----

// Element types: f16 and i64 natively (the module asks only for what it uses), i1 as one
// byte, bf16 as 16-bit integer storage converted in the kernel (no bf16 type is left).
// SPV-LABEL: spirv.module @__spv__kf_kernels Logical GLSL450 requires #spirv.vce<v1.4, [
// SPV-SAME: Float16
// SPV-SAME: Int64
// SPV-SAME: StorageBuffer8BitAccess
// SPV-DAG: spirv.GlobalVariable @types_arg_0 bind(0, 0) : !spirv.ptr<!spirv.struct<(!spirv.array<64 x f16, stride=2> [0])>, StorageBuffer>
// SPV-DAG: spirv.GlobalVariable @types_arg_1 bind(0, 1) : !spirv.ptr<!spirv.struct<(!spirv.array<64 x i16, stride=2> [0])>, StorageBuffer>
// SPV-DAG: spirv.GlobalVariable @types_arg_2 bind(0, 2) : !spirv.ptr<!spirv.struct<(!spirv.array<64 x i8, stride=1> [0])>, StorageBuffer>
// SPV-DAG: spirv.GlobalVariable @types_arg_3 bind(0, 3) : !spirv.ptr<!spirv.struct<(!spirv.array<64 x i64, stride=8> [0])>, StorageBuffer>
// SPV-NOT: bf16
// SPV: spirv.ShiftLeftLogical
// SPV: spirv.ExecutionMode @types "LocalSize", 64, 1, 1

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @types(%h: memref<64xf16>, %b: memref<64xbf16>, %m: memref<64xi1>, %q: memref<64xi64>,
                    %ho: memref<64xf16>, %bo: memref<64xbf16>, %qo: memref<64xi64>) kernel
        attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %x = memref.load %h[%tid] : memref<64xf16>
      %y = memref.load %b[%tid] : memref<64xbf16>
      %yf = arith.extf %y : bf16 to f32
      %yh = arith.truncf %yf : f32 to f16
      %k = memref.load %m[%tid] : memref<64xi1>
      %z = arith.select %k, %x, %yh : f16
      memref.store %z, %ho[%tid] : memref<64xf16>
      %y2 = arith.mulf %y, %y : bf16
      memref.store %y2, %bo[%tid] : memref<64xbf16>
      %i = memref.load %q[%tid] : memref<64xi64>
      %i2 = arith.muli %i, %i : i64
      memref.store %i2, %qo[%tid] : memref<64xi64>
      gpu.return
    }
  }
}

// -----

// vector.load/store on a scalar memref become scalar accesses (upstream's pointer
// bitcast is not a logical pointer under Vulkan); the arithmetic stays vector<4xf32>.
// SPV-LABEL: spirv.func @vec()
// SPV-NOT: spirv.Bitcast {{.*}} !spirv.ptr
// SPV-COUNT-4: spirv.Load "StorageBuffer" %{{[0-9]+}} : f32
// SPV: spirv.CompositeConstruct {{.*}} : (f32, f32, f32, f32) -> vector<4xf32>
// SPV: spirv.FAdd {{.*}} : vector<4xf32>
// SPV-COUNT-4: spirv.Store "StorageBuffer" %{{[0-9]+}}, %{{[0-9]+}} : f32
// SPV: spirv.ExecutionMode @vec "LocalSize", 32, 1, 1
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @vec(%a: memref<128xf32>, %c: memref<128xf32>) kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      %tid = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %i = arith.muli %tid, %c4 : index
      %x = vector.load %a[%i] : memref<128xf32>, vector<4xf32>
      %z = arith.addf %x, %x : vector<4xf32>
      vector.store %z, %c[%i] : memref<128xf32>, vector<4xf32>
      gpu.return
    }
  }
}

// -----

// Math that MathToSPIRV lacks is expanded (erf for GELU: Taylor series and A-S 7.1.26
// around exp), and powf gets torch's values where GLSL's pow is undefined.
// SPV-LABEL: spirv.func @gelu_erf()
// SPV-NOT: math.
// SPV: spirv.GL.Exp
// SPV: spirv.GL.Pow
// SPV: spirv.Select
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @gelu_erf(%a: memref<64xf32>, %c: memref<64xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %x = memref.load %a[%tid] : memref<64xf32>
      %e = math.erf %x : f32
      %p = math.powf %e, %x : f32
      memref.store %p, %c[%tid] : memref<64xf32>
      gpu.return
    }
  }
}

// -----

// IEEE inf, NaN and signed zeros: the entry point gets SignedZeroInfNanPreserve for f32
// (SPV_KHR_float_controls), and arithmetic on a literal +0.0, which lavapipe's code
// generator folds (x * 0 to 0), becomes compares and selects: x * 0 is NaN where |x| is
// not finite, else 0 with x's sign; x + 0 is 0 where x == 0; x / 0 is x * inf; 0 / x is
// NaN where x is 0 or NaN, else 0 with x's sign. x - 0 is left alone (it is x exactly).
// SPV-LABEL: spirv.module @__spv__kf_kernels
// SPV-SAME: SignedZeroInfNanPreserve
// SPV-SAME: SPV_KHR_float_controls
// SPV: spirv.func @zero_operands()
// SPV-NOT: spirv.FMul %{{.*}}, %cst_f32
// SPV: spirv.FOrdNotEqual
// SPV: spirv.Select
// SPV: spirv.FOrdEqual
// SPV: spirv.Select
// SPV: spirv.FMul %{{.*}}, %cst_f32_{{[0-9]+}}
// SPV: spirv.FUnordEqual
// SPV: spirv.ExecutionMode @zero_operands "SignedZeroInfNanPreserve", 32
// BIN-LABEL: gpu.binary @kf_kernels
// BIN-SAME: capabilities = [{{.*}}"SignedZeroInfNanPreserve"
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @zero_operands(%a: memref<4xf32>, %o: memref<5x4xf32>) kernel
        attributes {known_block_size = array<i32: 4, 1, 1>} {
      %i = gpu.thread_id x
      %x = memref.load %a[%i] : memref<4xf32>
      %zero = arith.constant 0.0 : f32
      %r0 = arith.mulf %x, %zero : f32
      %r1 = arith.addf %zero, %x : f32
      %r2 = arith.divf %x, %zero : f32
      %r3 = arith.divf %zero, %x : f32
      %r4 = arith.subf %x, %zero : f32
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c3 = arith.constant 3 : index
      %c4 = arith.constant 4 : index
      memref.store %r0, %o[%c0, %i] : memref<5x4xf32>
      memref.store %r1, %o[%c1, %i] : memref<5x4xf32>
      memref.store %r2, %o[%c2, %i] : memref<5x4xf32>
      memref.store %r3, %o[%c3, %i] : memref<5x4xf32>
      memref.store %r4, %o[%c4, %i] : memref<5x4xf32>
      gpu.return
    }
  }
}

// -----

// sin and cos are expanded, not GLSL's Sin/Cos (whose range reduction is inexact for large
// arguments): a Payne-Hanek reduction in 32-bit integers (UMulExtended by words of 2/pi)
// and polynomials, for scalars and vectors alike; spirv-val accepts the binary.
// SPV-LABEL: spirv.func @sin_cos()
// SPV-NOT: spirv.GL.Sin
// SPV-NOT: spirv.GL.Cos
// SPV: spirv.UMulExtended
// SPV: spirv.UMulExtended
// SPV-NOT: spirv.GL.Sin
// SPV-NOT: spirv.GL.Cos
// SPV: spirv.Return
// BIN: gpu.binary @kf_kernels {kf.kernels = {sin_cos = 
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @sin_cos(%a: memref<64xf32>, %c: memref<64xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %x = memref.load %a[%tid] : memref<64xf32>
      %s = math.sin %x : f32
      %v = vector.broadcast %s : f32 to vector<4xf32>
      %w = math.cos %v : vector<4xf32>
      %e = vector.extract %w[1] : f32 from vector<4xf32>
      memref.store %e, %c[%tid] : memref<64xf32>
      gpu.return
    }
  }
}

// -----

// A float max reduction of a vector is a chain of NaN-checked maxima, two IsNan per
// FMax (upstream lowers vector.reduction <maximumf> to bare GLSL FMax, whose result for
// a NaN is undefined).
// SPV-LABEL: spirv.func @row_max()
// SPV: spirv.GL.FMax
// SPV-NEXT: spirv.IsNan
// SPV-NEXT: spirv.IsNan
// SPV: spirv.GL.FMax
// SPV-NEXT: spirv.IsNan
// SPV-NEXT: spirv.IsNan
// SPV: spirv.GL.FMax
// SPV-NEXT: spirv.IsNan
// SPV-NEXT: spirv.IsNan
// SPV: spirv.ExecutionMode @row_max
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @row_max(%x: memref<4xf32>, %out: memref<1xf32>) kernel
        attributes {known_block_size = array<i32: 1, 1, 1>} {
      %c0 = arith.constant 0 : index
      %v = vector.load %x[%c0] : memref<4xf32>, vector<4xf32>
      %m = vector.reduction <maximumf>, %v : vector<4xf32> into f32
      memref.store %m, %out[%c0] : memref<1xf32>
      gpu.return
    }
  }
}
