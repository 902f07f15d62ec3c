"""NVIDIA's instructions as the strategies use them: ``mma_sync`` (warp tensor cores),
``wgmma`` (Hopper's warpgroup tensor cores, their swizzled shared-memory operands and
descriptors) and ``barriers`` (mbarriers and named barriers between warpgroups)."""
