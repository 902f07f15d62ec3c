"""The Vulkan target: kernels as SPIR-V (checked by spirv-val where it is installed),
run on CPU tensors by the Vulkan device (Mesa's lavapipe without a GPU).

Stages: capture, precision, kernels, schedule, ``spirv`` (kf-to-spirv), constants,
package. The strategies tile for the device's limits (``kf.runtime.abi.DeviceLimits``):
the Metal target (metal.py) is this target with MSL after the SPIR-V.
"""

from __future__ import annotations

from ..options import Options
from .base import Build
from .gpu import GpuTarget


class SpirvTarget(GpuTarget):
    """Vulkan compute shaders."""

    name = "vulkan"
    torch_device = "cpu"
    uses_spirv = True
    timing = "timings"
    strategy_target = "spirv"
    binary_stage = "spirv"
    backend_name = "kf-to-spirv (spirv-val)"
    backend_pipeline = "kf-to-spirv"
    #: the back end writes Metal Shading Language from the SPIR-V (metal.py)
    writes_msl = False

    def arch(self, options: Options) -> str:
        """The device's limits that the strategies tile for (``DeviceLimits.spec()``):
        ``options.arch`` when given, else the Vulkan device's own; "" (the limits'
        defaults) where there is no Vulkan device."""
        if options.arch:
            from kf.runtime.abi import DeviceLimits

            return DeviceLimits.parse(options.arch).spec()
        from kf.runtime import vulkan

        return vulkan.device().target_limits().spec() if vulkan.is_available() else ""

    def pass_options(self, arch: str) -> str:
        return f" limits={arch}" if arch else ""  # the device's limits (arch)

    def lower(self, b: Build):
        from .. import gpu_codegen

        return gpu_codegen.lower_spirv(b.cap.module, b.abi, b.log, metal=self.writes_msl, limits=b.arch)


VULKAN = SpirvTarget()
