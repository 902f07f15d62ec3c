// A gpu.module with gpu.subgroup_mma ops (the matmul strategy's cooperative-matrix kernel,
// written only for a device that lists the shape): kf-to-spirv targets SPIR-V 1.6 with
// CooperativeMatrixKHR and the Vulkan memory model, marks every workgroup access
// NonPrivatePointer and makes barriers MakeAvailable|MakeVisible (spirv/memory_model.py).
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-to-spirv{serialize=false subgroup-size=32})' | FileCheck %s
// The binary passes spirv-val (vulkan1.3) where a SPIRV-Tools that knows the extension is
// installed (scripts/setup.sh):
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-to-spirv{subgroup-size=32})' | FileCheck %s --check-prefix=BIN
// BIN: gpu.binary @kf_kernels

// CHECK-LABEL: spirv.module @__spv__kf_kernels Logical Vulkan requires #spirv.vce<v1.6
// CHECK-SAME: VulkanMemoryModel
// CHECK-SAME: CooperativeMatrixKHR
// CHECK-SAME: SPV_KHR_cooperative_matrix
// CHECK: spirv.Store "Workgroup" {{.*}}["NonPrivatePointer"]
// CHECK: spirv.ControlBarrier <Workgroup>, <Workgroup>, <AcquireRelease|WorkgroupMemory|MakeAvailable|MakeVisible>
// CHECK: spirv.KHR.CooperativeMatrixLoad {{.*}}, <RowMajor>, <NonPrivatePointer> : !spirv.ptr<f16, Workgroup>
// CHECK: spirv.KHR.CooperativeMatrixMulAdd
// CHECK: spirv.KHR.CooperativeMatrixStore {{.*}}, <RowMajor>, <NonPrivatePointer> : !spirv.ptr<f32, Workgroup>
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @mm(%a: memref<16x16xf16>, %b: memref<16x16xf16>, %c: memref<16x16xf32>) workgroup(%as: memref<16x16xf16, #gpu.address_space<workgroup>>, %cs: memref<16x16xf32, #gpu.address_space<workgroup>>) kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      %c0 = arith.constant 0 : index
      %z = arith.constant 0.0 : f32
      %t = gpu.thread_id x
      %x = memref.load %a[%c0, %t] : memref<16x16xf16>
      memref.store %x, %as[%c0, %t] : memref<16x16xf16, #gpu.address_space<workgroup>>
      gpu.barrier
      %A = gpu.subgroup_mma_load_matrix %as[%c0, %c0] {leadDimension = 16 : index} : memref<16x16xf16, #gpu.address_space<workgroup>> -> !gpu.mma_matrix<16x16xf16, "AOp">
      %B = gpu.subgroup_mma_load_matrix %b[%c0, %c0] {leadDimension = 16 : index} : memref<16x16xf16> -> !gpu.mma_matrix<16x16xf16, "BOp">
      %C = gpu.subgroup_mma_constant_matrix %z : !gpu.mma_matrix<16x16xf32, "COp">
      %D = gpu.subgroup_mma_compute %A, %B, %C : !gpu.mma_matrix<16x16xf16, "AOp">, !gpu.mma_matrix<16x16xf16, "BOp"> -> !gpu.mma_matrix<16x16xf32, "COp">
      gpu.subgroup_mma_store_matrix %D, %cs[%c0, %c0] {leadDimension = 16 : index} : !gpu.mma_matrix<16x16xf32, "COp">, memref<16x16xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %y = memref.load %cs[%c0, %t] : memref<16x16xf32, #gpu.address_space<workgroup>>
      memref.store %y, %c[%c0, %t] : memref<16x16xf32>
      gpu.return
    }
  }
}
