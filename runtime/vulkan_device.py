"""A Vulkan device as kf's runtime holds it (``Device``): its queue, memory types, the
pool of free buffers by size class, the cached pipelines, the residency of tensors in
device memory; and the errors of the Vulkan runtime. runtime/vulkan.py makes the one
device (``device()``); a ``Call`` (vulkan_call.py) records work on it."""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .abi import DeviceLimits, KernelABI
from .residency import Residency

if TYPE_CHECKING:
    from .vulkan_call import Call


class VulkanError(RuntimeError):
    """A Vulkan call failed, or a launch does not fit the device or the ABI."""


class VulkanUnavailable(VulkanError):
    """There is no usable Vulkan: no loader, no driver, or no device."""


#: SPIR-V capability -> (features struct, field) that must be on for it.
CAPABILITY_FEATURE = {
    "Float16": ("vulkan12", "shaderFloat16"), "Int8": ("vulkan12", "shaderInt8"),
    "Int16": ("core", "shaderInt16"), "Int64": ("core", "shaderInt64"), "Float64": ("core", "shaderFloat64"),
    "StorageBuffer16BitAccess": ("vulkan11", "storageBuffer16BitAccess"),
    "StorageBuffer8BitAccess": ("vulkan12", "storageBuffer8BitAccess"),
    # kf-to-spirv asks for IEEE inf, NaN and signed zeros in every kernel that computes in floats,
    # and keeps subnormals and rounds to nearest even where the device's float controls allow
    "SignedZeroInfNanPreserve": ("float_controls", "shaderSignedZeroInfNanPreserveFloat32"),
    "DenormPreserve": ("float_controls", "shaderDenormPreserveFloat32"),
    "RoundingModeRTE": ("float_controls", "shaderRoundingModeRTEFloat32"),
    # VK_KHR_cooperative_matrix, which the runtime enables with the Vulkan memory model
    "CooperativeMatrixKHR": ("coopmat", "cooperativeMatrix"),
    "VulkanMemoryModel": ("vulkan12", "vulkanMemoryModel"),
}


#: SPIR-V subgroup capability -> the subgroup operation (abi.SUBGROUP_OPS) it needs.
CAPABILITY_SUBGROUP = {
    "GroupNonUniform": "basic", "GroupNonUniformVote": "vote", "GroupNonUniformArithmetic": "arithmetic",
    "GroupNonUniformBallot": "ballot", "GroupNonUniformShuffle": "shuffle",
    "GroupNonUniformShuffleRelative": "shuffle_relative", "GroupNonUniformClustered": "clustered",
    "GroupNonUniformQuad": "quad",
}


#: Upper bound of the bytes kept in free buffers for reuse (one buffer is kept whatever
#: its size, so that a call repeated on large tensors does not allocate each time).
POOL_BYTES = 256 << 20


def _size_class(nbytes: int) -> int:
    """The size a buffer of nbytes is allocated with, so that the buffers of repeated
    calls are reused: powers of two up to 1 MiB (>= 256 B: Vulkan forbids empty
    buffers), then eighths of the next power of two (at most 1/4 more than asked).
    Allocating and mapping dominated the launch time of a 4 MiB kernel on lavapipe."""
    n = max(nbytes, 256)
    if n <= 1 << 20:
        return 1 << (n - 1).bit_length()
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


def resident_limit(heap_bytes: int) -> int:
    """Bytes the residency table may hold: ``KF_VULKAN_RESIDENT_BYTES`` (a number of
    bytes, or with a K/M/G suffix; 0 turns residency off), else half the device-local
    heap."""
    text = os.environ.get("KF_VULKAN_RESIDENT_BYTES", "").strip()
    if not text:
        return heap_bytes // 2
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise VulkanError(f"KF_VULKAN_RESIDENT_BYTES={text!r} is not a number of bytes (e.g. 4G, 512M, 0)") \
            from None


@dataclass
class _Pipeline:
    shader: object
    set_layout: object
    layout: object
    pipeline: object
    n_bindings: int


@dataclass(eq=False)
class Buffer:
    """A Vulkan buffer and its memory; ``mapped`` is its host view (host-visible memory)."""

    buffer: object
    memory: object
    size: int
    kind: str  # "device" (kernels' buffers) or "staging" (host-visible transfer buffers)
    mapped: object = None


@dataclass
class Memory:
    """The memory types buffers come from, by preference: ``device`` for the kernels'
    buffers, ``staging`` (host-visible, coherent; cached where possible, for reading
    back) for transfers; ``unified`` where device buffers can be mapped as they are."""

    device: tuple[int, ...]
    staging: tuple[int, ...]
    unified: bool
    heap_bytes: int  # the device-local heap's size


@dataclass
class Device:
    """One Vulkan device with a compute queue; made by ``device()``."""

    vk: object
    instance: object
    physical: object
    handle: object
    queue: object
    queue_family: int
    name: str
    device_type: str
    api_version: tuple[int, int, int]
    features: dict[str, bool]
    limits: dict
    timestamp_period_ns: float
    timestamps: bool
    memory: Memory
    command_pool: object
    subgroup_size: int = 0  # 0 when the device cannot say (Vulkan < 1.1)
    #: the device's properties under Vulkan's own names (DeviceLimits.from_vulkan reads them)
    properties: dict = field(default_factory=dict)
    #: transfers through staging buffers (always, unless the memory is unified)
    staged: bool = True
    residency: Residency | None = None
    pipelines: dict = field(default_factory=dict)
    pool: dict = field(default_factory=dict)  # (kind, size) -> free buffers
    pool_order: list = field(default_factory=list)  # the free buffers, least recently freed first
    pooled_bytes: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: tensors copied host -> device and device -> host, their bytes, and submits (for
    #: tests and benchmarks: what residency saved)
    uploads: int = 0
    upload_bytes: int = 0
    downloads: int = 0
    download_bytes: int = 0
    submits: int = 0
    _hashes: dict = field(default_factory=dict)  # id(SPIR-V bytes) -> (bytes, sha256)
    _limits: DeviceLimits | None = None

    def check(self, call, *args):
        try:
            return call(*args)
        except Exception as e:  # the binding raises one class per VkResult
            name = getattr(call, "__name__", call)
            raise VulkanError(f"{name} failed on {self.name}: {type(e).__name__} {e}") from None

    def target_limits(self) -> DeviceLimits:
        """What kf's SPIR-V strategies tile for on this device (part of the cache key)."""
        if self._limits is None:
            self._limits = DeviceLimits.from_vulkan(self.properties)
        return self._limits

    def require(self, kernel: KernelABI) -> None:
        """Refuse a kernel whose SPIR-V needs a feature this device lacks, naming it."""
        missing = []
        ops = self.target_limits().subgroup_ops
        for cap in kernel.extra.get("spirv_capabilities", ()):
            feat = CAPABILITY_FEATURE.get(cap)
            if feat and not self.features.get(feat[1], False):
                missing.append(f"{cap} (needs {feat[1]})")
            for width in ("Float16", "Float64"):  # the mode is declared for each float width the kernel has
                if feat and feat[0] == "float_controls" and width in kernel.extra.get("spirv_capabilities", ()):
                    other = feat[1].replace("Float32", width)
                    if not self.features.get(other, False):
                        missing.append(f"{cap} (needs {other})")
            op = CAPABILITY_SUBGROUP.get(cap)
            if op and op not in ops:
                missing.append(f"{cap} (needs subgroup {op} operations in compute shaders)")
        if missing:
            raise VulkanError(f"kernel {kernel.entry} needs {', '.join(missing)}, which {self.name} does not have")
        if kernel.shared_bytes:
            raise VulkanError(f"kernel {kernel.entry} asks for {kernel.shared_bytes} bytes of dynamic workgroup "
                              f"memory; SPIR-V workgroup memory is static (declare it in the kernel)")
        size = tuple(kernel.extra.get("workgroup_size", kernel.block))
        if tuple(kernel.block) not in ((1, 1, 1), size):
            raise VulkanError(f"kernel {kernel.entry}: the ABI's block {tuple(kernel.block)} is not the workgroup "
                              f"size {size} compiled into its SPIR-V")
        if any(s > m for s, m in zip(size, self.limits["max_workgroup_size"])) or \
                prod(size) > self.limits["max_workgroup_invocations"]:
            raise VulkanError(f"kernel {kernel.entry}: workgroup {size} is over {self.name}'s limits "
                              f"{self.limits['max_workgroup_size']} / {self.limits['max_workgroup_invocations']}")
        if any(g > m for g, m in zip(kernel.grid, self.limits["max_workgroup_count"])):
            raise VulkanError(f"kernel {kernel.entry}: grid {kernel.grid} is over {self.name}'s limit "
                              f"{self.limits['max_workgroup_count']}")
        sg = kernel.extra.get("subgroup_size", 0)
        if sg and sg != self.subgroup_size:
            raise VulkanError(f"kernel {kernel.entry} was compiled for subgroup size {sg}; {self.name} has "
                              f"{self.subgroup_size} (compile with kf-to-spirv{{subgroup-size={self.subgroup_size}}})")
        loops, most = kernel.extra.get("loop_iterations", 0), self.limits.get("max_loop_iterations", 0)
        if most and (loops < 0 or loops > most):
            runs = "an unbounded number of" if loops < 0 else f"up to {loops}"
            raise VulkanError(f"kernel {kernel.entry} runs {runs} loop iterations per invocation; {self.name} "
                              f"stops a shader invocation after {most} (Mesa's loop limiter) and would silently "
                              f"drop the rest: run it on a GPU's Vulkan driver or on target='cpu'")
        if kernel.extra.get("workgroup_bytes", 0) > self.limits["max_shared_bytes"]:
            raise VulkanError(f"kernel {kernel.entry} uses {kernel.extra['workgroup_bytes']} bytes of workgroup "
                              f"memory; {self.name} has {self.limits['max_shared_bytes']}")

    # ---- pipelines -------------------------------------------------------------------
    def pipeline(self, spirv: bytes, entry: str, n_bindings: int) -> _Pipeline:
        memo = self._hashes.get(id(spirv))
        if memo is None or memo[0] is not spirv:
            memo = (spirv, hashlib.sha256(spirv).hexdigest())  # holding spirv keeps its id unique
            self._hashes[id(spirv)] = memo
        key = (memo[1], entry, n_bindings)
        p = self.pipelines.get(key)
        if p is not None:
            return p
        vk, dev = self.vk, self.handle
        if len(spirv) % 4 or spirv[:4] != b"\x03\x02\x23\x07":
            raise VulkanError(f"kernel {entry}: the artifact is not a SPIR-V binary ({len(spirv)} bytes)")
        shader = self.check(vk.vkCreateShaderModule, dev, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(spirv), pCode=spirv), None)
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for i in range(n_bindings)]
        set_layout = self.check(vk.vkCreateDescriptorSetLayout, dev, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=n_bindings,
            pBindings=bindings or None), None)
        layout = self.check(vk.vkCreatePipelineLayout, dev, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[set_layout]), None)
        stage = vk.VkPipelineShaderStageCreateInfo(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                   stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=shader, pName=entry)
        pipes = self.check(vk.vkCreateComputePipelines, dev, vk.VK_NULL_HANDLE, 1, [vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=layout)], None)
        p = _Pipeline(shader, set_layout, layout, pipes[0], n_bindings)
        self.pipelines[key] = p
        return p

    # ---- buffers ---------------------------------------------------------------------
    def buffer(self, nbytes: int, kind: str = "device") -> Buffer:
        """A buffer of at least nbytes, from the pool when one is free: ``device`` (what
        kernels bind; mapped only where the memory is unified and not ``staged``) or
        ``staging`` (mapped, for transfers)."""
        size = _size_class(nbytes)
        with self.lock:
            free = self.pool.get((kind, size))
            if free:
                b = free.pop()
                self.pool_order.remove(b)
                self.pooled_bytes -= size
                return b
        try:
            return self._new_buffer(size, kind)
        except VulkanError as e:
            if "OutOf" not in str(e):
                raise
            # out of memory: give back what residency and the pool hold, and try once more
            self.residency.clear()
            self.release_pool()
            return self._new_buffer(size, kind)

    def free(self, b: Buffer) -> None:
        """Return a buffer to the pool, which keeps the most recently freed ones up to
        POOL_BYTES (or the one, when it alone is larger: a call repeated on large
        tensors then allocates nothing), and releases the others."""
        out = []
        with self.lock:
            self.pool.setdefault((b.kind, b.size), []).append(b)
            self.pool_order.append(b)
            self.pooled_bytes += b.size
            while self.pooled_bytes > max(POOL_BYTES, b.size):
                old = self.pool_order.pop(0)
                self.pool[(old.kind, old.size)].remove(old)
                self.pooled_bytes -= old.size
                out.append(old)
        for old in out:
            self._release(old)

    def release_pool(self) -> None:
        """Release every pooled buffer."""
        with self.lock:
            bufs = list(self.pool_order)
            self.pool.clear()
            self.pool_order.clear()
            self.pooled_bytes = 0
        for b in bufs:
            self._release(b)

    def trim(self) -> None:
        """Give back the buffers of tensors that died, evict residency to its limit and
        release the pool (``KF_VULKAN_RESIDENT_BYTES`` read again)."""
        self.residency.limit = resident_limit(self.memory.heap_bytes)
        self.residency.trim()
        self.release_pool()

    def _new_buffer(self, size: int, kind: str) -> Buffer:
        vk, dev = self.vk, self.handle
        transfer = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        usage = transfer | (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT if kind == "device" else 0)
        buf = self.check(vk.vkCreateBuffer, dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=usage,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(dev, buf)
        mapped = kind == "staging" or (self.memory.unified and not self.staged)
        types = self.memory.staging if kind == "staging" or mapped else self.memory.device
        memory_type = next((i for i in types if req.memoryTypeBits >> i & 1), None)
        if memory_type is None:
            vk.vkDestroyBuffer(dev, buf, None)
            raise VulkanError(f"{self.name}: no suitable memory type for {kind} buffers")
        try:
            mem = self.check(vk.vkAllocateMemory, dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                memoryTypeIndex=memory_type), None)
        except VulkanError as e:
            vk.vkDestroyBuffer(dev, buf, None)
            raise VulkanError(f"allocating a {size}-byte {kind} buffer: {e}") from None
        vk.vkBindBufferMemory(dev, buf, mem, 0)
        b = Buffer(buf, mem, size, kind)
        if mapped:
            b.mapped = self.check(vk.vkMapMemory, dev, mem, 0, size, 0)
        return b

    def _release(self, b: Buffer) -> None:
        vk = self.vk
        if b.mapped is not None:
            vk.vkUnmapMemory(self.handle, b.memory)
        vk.vkDestroyBuffer(self.handle, b.buffer, None)
        vk.vkFreeMemory(self.handle, b.memory, None)

    # ---- calls -----------------------------------------------------------------------
    def call(self) -> "Call":
        """A new call: its reads, writes and kernels, then ``finish()``."""
        from .vulkan_call import Call  # vulkan_call imports this module

        return Call(self)

    def copy_seconds(self, nbytes: int, repeats: int = 10) -> float:
        """The median GPU time of a device-to-device copy of nbytes (vkCmdCopyBuffer,
        timed with timestamp queries): the device's copy rate, the ceiling kf's
        benchmarks quote. Needs timestamps."""
        if not self.timestamps:
            raise VulkanError(f"{self.name} has no timestamp queries on its compute queue")
        src, dst = self.buffer(nbytes), self.buffer(nbytes)
        try:
            times = []
            for _ in range(repeats):
                c = self.call()
                c.copies.append((src, dst, nbytes))
                times.append(c.finish(timed=True, time_copies=True)[0])
            times.sort()
            return times[len(times) // 2]
        finally:
            self.free(src)
            self.free(dst)


def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n
