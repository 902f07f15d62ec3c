"""The Metal target: the Vulkan target's SPIR-V cross-compiled to Metal Shading
Language by SPIRV-Cross, one function per kernel, run on ``mps`` tensors through
``torch.mps.compile_shader`` (macOS). The MSL is written and checked on any machine:
``kf.inspect(f).msl`` reads it on Linux.

Stages: capture, precision, kernels, schedule, ``msl`` (kf-to-spirv, then kf-to-metal),
constants, package. Run-time sizes as on Vulkan: the same SPIR-V's kernels take their
size slots as a last buffer, which the Metal launcher binds (runtime/metal.py).
"""

from __future__ import annotations

from ..options import Options
from .spirv import SpirvTarget


class MetalTarget(SpirvTarget):
    """Apple GPUs through MSL."""

    name = "metal"
    torch_device = "mps"
    timing = ""
    binary_stage = "msl"
    backend_name = "kf-to-spirv + kf-to-metal (SPIRV-Cross)"
    backend_pipeline = "kf-to-spirv, kf-to-metal"
    writes_msl = True

    def arch(self, options: Options) -> str:
        """The device's limits given as ``options.arch``, else "" (DeviceLimits'
        defaults: kf cannot ask a Metal device from here)."""
        if options.arch:
            from kf.runtime.abi import DeviceLimits

            return DeviceLimits.parse(options.arch).spec()
        return ""


METAL = MetalTarget()
