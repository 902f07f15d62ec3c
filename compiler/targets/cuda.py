"""The CUDA target: kernels as PTX for the current device's architecture (sm_90a on
Hopper), assembled by ptxas at build time and loaded by the CUDA driver at run time.

Stages: capture, precision, kernels, schedule, ``ptx`` (kf-to-cuda, then ptxas
checks and reports each kernel's registers), constants, package.
"""

from __future__ import annotations

from kf.runtime.abi import DEFAULT_MULTIPROCESSORS

from ..options import Options
from .base import Build
from .gpu import GpuTarget


class CudaTarget(GpuTarget):
    """NVIDIA GPUs through PTX, on CUDA tensors."""

    name = "cuda"
    torch_device = "cuda"
    fp8_storage = True
    timing = "events"
    nvtx = True
    strategy_target = "cuda"
    binary_stage = "ptx"
    backend_name = "kf-to-cuda (ptxas)"
    backend_pipeline = "kf-to-cuda{{chip={arch}}}"

    def arch(self, options: Options) -> str:
        """sm_XX of the current CUDA device, and sm_90a on Hopper (as Triton does: its
        arch-specific instructions, wgmma among them, run only on sm_90 itself; kf's
        cubins are built per device anyway). Without a GPU, sm_90a, the H200 kf is
        measured on. ``options.arch`` when given."""
        if options.arch:
            return options.arch
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
        return "sm_90a"

    def multiprocessors(self) -> int:
        """The streaming multiprocessors of the current CUDA device, which persistent
        kernels start one workgroup on each (part of the cache key, as the arch is);
        without a GPU, the H200's, as ``arch`` takes its sm_90a."""
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return DEFAULT_MULTIPROCESSORS

    def fp8_options(self, options: Options) -> str:
        """Attention is quantized only where the fp8 attention kernel takes it (sm_90a:
        head dims 128 or 256, whole 128-key blocks, no mask; ``fp8-attention=kernel``; on
        other chips there is none, ``fp8-attention=none``): elsewhere it stays 16-bit, as
        its fp8 products would run on CUDA cores, several times slower than the bf16
        tensor-core kernel (passes/apply_precision.py, ``_sixteen_bit_attention``)."""
        return " fp8-attention=" + ("kernel" if self.arch(options) == "sm_90a" else "none")

    def pass_options(self, arch: str) -> str:
        chip = f" chip={arch}" if arch else ""
        return chip + f" multiprocessors={self.multiprocessors()}"

    def lower(self, b: Build):
        from .. import gpu_codegen

        return gpu_codegen.lower_cuda(b.cap.module, b.abi, b.arch, b.log)


CUDA = CudaTarget()
