// Invalid inputs of kf-to-spirv, run by test/passes/kf-to-spirv.mlir with --verify-diagnostics.

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-to-spirv: kernel @no_size has no workgroup size: give it known_block_size or run kf-to-spirv{workgroup-size=...}}}
    gpu.func @no_size(%a: memref<16xf32>) kernel {
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kernel @dynamic: argument 0 is memref<?xf32>; kf kernels take statically shaped memrefs only}}
    gpu.func @dynamic(%a: memref<?xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kernel @fp8: argument 0 has element type f8E4M3FN, which kf's SPIR-V back end does not store}}
    gpu.func @fp8(%a: memref<16xf8E4M3FN>) kernel attributes {known_block_size = array<i32: 16, 1, 1>} {
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kernel @too_big uses 65536 bytes of workgroup memory; the target allows 32768}}
    gpu.func @too_big(%a: memref<16xf32>) workgroup(%w: memref<16384xf32, #gpu.address_space<workgroup>>) kernel
        attributes {known_block_size = array<i32: 16, 1, 1>} {
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kernel @wide: workgroup size (2048, 1, 1) exceeds 1024 invocations}}
    gpu.func @wide(%a: memref<16xf32>) kernel attributes {known_block_size = array<i32: 2048, 1, 1>} {
      gpu.return
    }
  }
}

// -----

// expected-error @below {{kf-to-spirv: no gpu.module to lower}}
module {
  func.func @host() {
    return
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{argument 0 is memref<4x8xf32, strided<[16, 1]>>; arguments are dense row-major buffers (identity layout)}}
    gpu.func @strided(%a: memref<4x8xf32, strided<[16, 1]>>) kernel attributes {known_block_size = array<i32: 16, 1, 1>} {
      gpu.return
    }
  }
}
