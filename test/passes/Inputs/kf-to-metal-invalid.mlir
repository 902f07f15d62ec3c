// Invalid inputs of kf-to-metal, run by test/passes/kf-to-metal.mlir with --verify-diagnostics.

// Nothing to cross-compile: no gpu.module, so kf-to-spirv makes no binary.
// expected-error @below {{kf-to-metal: no gpu.module to lower}}
module {
  func.func @host(%a: memref<4xf32>) {
    return
  }
}

// -----

// SPIR-V left as a spirv.module (kf-to-spirv{serialize=false}): SPIRV-Cross takes the binary.
// expected-error @below {{kf-to-metal: kf-to-metal needs the serialized SPIR-V: run kf-to-spirv without serialize=false}}
module attributes {gpu.container_module} {
  spirv.module @__spv__kf_kernels Logical GLSL450 requires #spirv.vce<v1.0, [Shader], [SPV_KHR_storage_buffer_storage_class]> {
  }
}

// -----

// A gpu.binary whose bytes are not SPIR-V: not whole words, then no SPIR-V magic number.
module attributes {gpu.container_module} {
  // expected-error @below {{kf-to-metal: not a little-endian SPIR-V binary (10 bytes: not whole 32-bit words)}}
  gpu.binary @kf_kernels {kf.kernels = {k = {bindings = [], capabilities = ["Shader"], extensions = [], loop_iterations = 0 : i64, subgroup_size = 0 : i64, workgroup_bytes = 0 : i64, workgroup_size = array<i64: 1, 1, 1>}}} [#gpu.object<#spirv.target_env<#spirv.vce<v1.0, [Shader], []>, #spirv.resource_limits<>>, "not spir-v">]
}

// -----

module attributes {gpu.container_module} {
  // expected-error @below {{kf-to-metal: not a little-endian SPIR-V binary}}
  gpu.binary @kf_kernels {kf.kernels = {k = {bindings = [], capabilities = ["Shader"], extensions = [], loop_iterations = 0 : i64, subgroup_size = 0 : i64, workgroup_bytes = 0 : i64, workgroup_size = array<i64: 1, 1, 1>}}} [#gpu.object<#spirv.target_env<#spirv.vce<v1.0, [Shader], []>, #spirv.resource_limits<>>, "not SPIR-V, but 24 bytes">]
}

// -----

// A kernel kf's SPIR-V back end refuses (kf-to-metal runs kf-to-spirv first).
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-to-metal: kernel @no_size has no workgroup size: give it known_block_size or run kf-to-spirv{workgroup-size=...}}}
    gpu.func @no_size(%a: memref<16xf32>) kernel {
      gpu.return
    }
  }
}
