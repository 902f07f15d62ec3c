"""kf's compilation targets as objects: ``cpu``, ``cuda``, ``vulkan`` (SPIR-V) and
``metal``.

Each gives the ordered table of named stages the driver walks (``Target.stages()``),
its device queries (``arch``, ``multiprocessors``, ``device_key``) and the attributes
that set it apart (``is_gpu``, ``uses_spirv``, ``torch_device``, ...); GPU targets also
give their kernel passes (``passes``). ``get(name)`` is the target of
``Options.target``. Importing this package loads no MLIR.
"""

from __future__ import annotations

from ..errors import TargetError
from .base import Build, Target
from .cpu import CPU
from .cuda import CUDA
from .metal import METAL
from .spirv import VULKAN

#: every target by its name (``Options.target``, ``ProgramABI.target``)
TARGETS: dict[str, Target] = {t.name: t for t in (CUDA, METAL, VULKAN, CPU)}

#: the target ``target="auto"`` compiles for, by the tensors' device type
BY_DEVICE: dict[str, Target] = {"cuda": CUDA, "mps": METAL, "cpu": CPU}


def get(name: str) -> Target:
    """The target named ``name``; a TargetError for a name kf has no target for."""
    target = TARGETS.get(name)
    if target is None:
        raise TargetError(f"unknown target {name}")
    return target


__all__ = ["BY_DEVICE", "Build", "CPU", "CUDA", "METAL", "TARGETS", "Target", "VULKAN", "get"]
