"""The Vulkan memory model for a SPIR-V module that needs it (cooperative matrices: spirv-val
requires VulkanMemoryModel of a shader that declares CooperativeMatrixKHR).

Under that model a plain access is *private* to its invocation: a barrier orders it but
makes nothing available to other invocations. kf's kernels share workgroup memory through
barriers (tiles staged by all invocations, read by each subgroup), so, as GLSL compilers
treat ``shared`` variables under the model, every access to Workgroup memory is marked
``NonPrivatePointer`` and every ``OpControlBarrier`` makes workgroup writes available and
visible (``MakeAvailable|MakeVisible``) besides its acquire-release."""

from __future__ import annotations

from mlir import ir

from .walk import walk_ops

#: op -> the attribute that holds its memory operands
_ACCESS_ATTR = {"spirv.Load": "memory_access", "spirv.Store": "memory_access",
                "spirv.KHR.CooperativeMatrixLoad": "memory_operand",
                "spirv.KHR.CooperativeMatrixStore": "memory_operand"}


def use_vulkan_memory_model(spv: ir.Operation) -> None:
    """Set the module's memory model to Vulkan and make its workgroup memory shared under
    it (see the module docstring)."""
    spv.attributes["memory_model"] = ir.Attribute.parse("#spirv.memory_model<Vulkan>")
    non_private = ir.Attribute.parse("#spirv.memory_access<NonPrivatePointer>")
    for op in walk_ops(spv.regions[0].blocks[0]):
        if op.name == "spirv.ControlBarrier":
            text = str(op.attributes["memory_semantics"])
            if "WorkgroupMemory" in text and "MakeAvailable" not in text:
                op.attributes["memory_semantics"] = ir.Attribute.parse(
                    text.replace(">", "|MakeAvailable|MakeVisible>"))
            continue
        attr = _ACCESS_ATTR.get(op.name)
        if attr is None or ", Workgroup>" not in str(op.operands[0].type):
            continue
        if attr in op.attributes and str(op.attributes[attr]) != str(non_private):
            raise ValueError(f"{op.name} already has memory operands {op.attributes[attr]}")
        op.attributes[attr] = non_private
