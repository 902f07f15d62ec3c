// The float-controls execution modes kf-to-spirv declares (spirv/ieee.py): SignedZeroInfNanPreserve
// for every float width the kernel has values of -- also a kernel of compares and selects
// only, which a driver that assumes no NaN and no -0.0 may rewrite (x > 0 ? x : 0 into a
// max that drops NaN, x == 0 ? 0 : x into x) -- and DenormPreserve / RoundingModeRTE only
// where the device's float controls (the float-controls option) have them for every width.
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=false})' | FileCheck %s --check-prefix=LVP
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=false float-controls=preserve16+preserve32+denorm16+denorm32+rte16+rte32})' | FileCheck %s --check-prefix=NV
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=false float-controls=preserve16+preserve32+denorm32+rte32})' | FileCheck %s --check-prefix=NO16
// The binaries pass spirv-val with every mode declared:
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{float-controls=preserve16+preserve32+denorm16+denorm32+rte16+rte32})' | FileCheck %s --check-prefix=BIN
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{float-controls=denorm8})' 2>&1 | FileCheck %s --check-prefix=BAD
// With contract=true the driver may fuse a * b + c (no NoContraction):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-to-spirv{serialize=false contract=true})' | FileCheck %s --check-prefix=FMA
// REQUIRES: spirv-val
// BAD: float-controls names preserveN, denormN or rteN (N = 16, 32, 64) joined by '+', got denorm8

// LVP-LABEL: spirv.module @__spv__kf_kernels
// LVP: spirv.func @relu_select()
// LVP-NOT: spirv.F{{Add|Sub|Mul|Div}}
// LVP: spirv.Select
// LVP: spirv.ExecutionMode @relu_select "SignedZeroInfNanPreserve", 32
// LVP-NOT: ExecutionMode {{.*}}"DenormPreserve"
// LVP-NOT: ExecutionMode {{.*}}"RoundingModeRTE"
// NV-LABEL: spirv.module @__spv__kf_kernels
// NV-SAME: DenormPreserve
// NV-SAME: RoundingModeRTE
// NV-DAG: spirv.ExecutionMode @relu_select "SignedZeroInfNanPreserve", 32
// NV-DAG: spirv.ExecutionMode @relu_select "DenormPreserve", 32
// NV-DAG: spirv.ExecutionMode @relu_select "RoundingModeRTE", 32
// BIN-LABEL: gpu.binary @kf_kernels
// BIN-SAME: "DenormPreserve"
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @relu_select(%a: memref<7xf32>, %o: memref<7xf32>) kernel
        attributes {known_block_size = array<i32: 8, 1, 1>} {
      %i = gpu.thread_id x
      %c7 = arith.constant 7 : index
      %in = arith.cmpi ult, %i, %c7 : index
      scf.if %in {
        %x = memref.load %a[%i] : memref<7xf32>
        %zero = arith.constant 0.0 : f32
        %pos = arith.cmpf ogt, %x, %zero : f32
        %r = arith.select %pos, %x, %zero : f32
        memref.store %r, %o[%i] : memref<7xf32>
      }
      gpu.return
    }
  }
}

// -----

// An f32 -> f16 conversion at the store: RoundingModeRTE for 16 (and 32) rounds it to
// nearest even, as torch does; without rte16 (NO16) no width gets DenormPreserve or
// RoundingModeRTE (the modes are declared for every width the kernel has, or none).
// Every float multiply, add and subtract is NoContraction: a driver may not fuse x * x + x
// into an fma (NVIDIA's compiler does where it may), so each rounds as in torch.
// LVP-LABEL: spirv.module @__spv__kf_kernels
// LVP: spirv.FMul {{.*}} {no_contraction} : f32
// LVP: spirv.FAdd {{.*}} {no_contraction} : f32
// LVP: spirv.FConvert
// LVP-DAG: spirv.ExecutionMode @to_half "SignedZeroInfNanPreserve", 16
// LVP-DAG: spirv.ExecutionMode @to_half "SignedZeroInfNanPreserve", 32
// LVP-NOT: ExecutionMode {{.*}}"RoundingModeRTE"
// NV-LABEL: spirv.module @__spv__kf_kernels
// NV-DAG: spirv.ExecutionMode @to_half "RoundingModeRTE", 16
// NV-DAG: spirv.ExecutionMode @to_half "RoundingModeRTE", 32
// NV-DAG: spirv.ExecutionMode @to_half "DenormPreserve", 16
// NV-DAG: spirv.ExecutionMode @to_half "DenormPreserve", 32
// FMA: spirv.func @to_half()
// FMA: spirv.FMul
// FMA-NOT: no_contraction
// FMA: spirv.Return
// NO16-LABEL: spirv.module @__spv__kf_kernels
// NO16: spirv.func @to_half()
// NO16-NOT: ExecutionMode {{.*}}"DenormPreserve"
// NO16-NOT: ExecutionMode {{.*}}"RoundingModeRTE"
// BIN-LABEL: gpu.binary @kf_kernels
// BIN-SAME: "RoundingModeRTE"
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @to_half(%a: memref<8xf32>, %o: memref<8xf16>) kernel
        attributes {known_block_size = array<i32: 8, 1, 1>} {
      %i = gpu.thread_id x
      %x = memref.load %a[%i] : memref<8xf32>
      %m = arith.mulf %x, %x : f32
      %y = arith.addf %m, %x : f32
      %h = arith.truncf %y : f32 to f16
      memref.store %h, %o[%i] : memref<8xf16>
      gpu.return
    }
  }
}
