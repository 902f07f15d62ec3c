"""kf: torch functions in, fused kernels out."""
