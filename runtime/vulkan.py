"""Vulkan launcher: runs kf's SPIR-V compute kernels on torch CPU tensors.

It works on whatever Vulkan device exists — a GPU, or Mesa's lavapipe on a CPU-only
machine, where kf's Vulkan tests run. It takes only bytes and the ABI of
``runtime/abi.py`` (it never imports mlir or kf.passes), so a cached artifact runs in a
process that has no compiler.

Calling convention, as kf-to-spirv produces it: kernel argument i is the storage buffer
at descriptor set 0, binding i; each buffer holds the tensor's bytes unchanged (bf16 is
16-bit integer storage converted in the kernel, bool is one byte), so uploads and
downloads are plain byte copies.

Design choices, and why:
- the instance and device are created once, lazily, on first use (``device()``), so that
  importing this module costs nothing and machines without Vulkan can import it;
- every device feature that kf's SPIR-V may ask for (Float16, Int8, Int16, Int64,
  16/8-bit storage) is enabled when the device has it, and a kernel whose recorded
  capabilities (``KernelABI.extra['spirv_capabilities']``) the device lacks is refused
  with the missing feature named, instead of a driver crash;
- buffers live in host-visible, host-coherent memory: correct on every device, no
  staging copies; on a discrete GPU a device-local copy would be faster (later work);
  freed buffers go to a bounded pool (power-of-two sizes) for the next call;
- shader modules and pipelines are cached per (SPIR-V bytes, entry point);
- a program's kernels go into one command buffer with compute->compute barriers
  between them and one submit, and ``timings=`` collects each kernel's GPU time from
  timestamp queries (the profiler's hook).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .abi import ELEM_INFO, KernelABI, ProgramABI


class VulkanError(RuntimeError):
    """A Vulkan call failed, or a launch does not fit the device or the ABI."""


class VulkanUnavailable(VulkanError):
    """There is no usable Vulkan: no loader, no driver, or no device."""


def _vk():
    try:
        import vulkan as vk  # the realitix cffi binding; it dlopens libvulkan at import
    except ImportError as e:
        raise VulkanUnavailable(f"the Python package 'vulkan' is not installed ({e}); pip install vulkan") from None
    except OSError as e:
        raise VulkanUnavailable(f"no Vulkan loader (libvulkan.so.1): {e}; install libvulkan1 and a driver "
                                f"(mesa-vulkan-drivers gives the CPU driver lavapipe)") from None
    return vk


#: SPIR-V capability -> (features struct, field) that must be on for it.
_CAPABILITY_FEATURE = {
    "Float16": ("vulkan12", "shaderFloat16"), "Int8": ("vulkan12", "shaderInt8"),
    "Int16": ("core", "shaderInt16"), "Int64": ("core", "shaderInt64"), "Float64": ("core", "shaderFloat64"),
    "StorageBuffer16BitAccess": ("vulkan11", "storageBuffer16BitAccess"),
    "StorageBuffer8BitAccess": ("vulkan12", "storageBuffer8BitAccess"),
}


def _torch():
    import torch

    return torch


@dataclass
class _Pipeline:
    shader: object
    set_layout: object
    layout: object
    pipeline: object
    n_bindings: int


@dataclass
class _Buffer:
    buffer: object
    memory: object
    size: int
    mapped: object = None


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
    memory_type: int
    command_pool: object
    subgroup_size: int = 0  # 0 when the device cannot say (Vulkan < 1.1)
    pipelines: dict = field(default_factory=dict)
    pool: dict = field(default_factory=dict)  # size -> free buffers of that size
    pooled_bytes: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def check(self, call, *args):
        try:
            return call(*args)
        except Exception as e:  # the binding raises one class per VkResult
            name = getattr(call, "__name__", call)
            raise VulkanError(f"{name} failed on {self.name}: {type(e).__name__} {e}") from None

    def require(self, kernel: KernelABI) -> None:
        """Refuse a kernel whose SPIR-V needs a feature this device lacks, naming it."""
        missing = []
        for cap in kernel.extra.get("spirv_capabilities", ()):
            feat = _CAPABILITY_FEATURE.get(cap)
            if feat and not self.features.get(feat[1], False):
                missing.append(f"{cap} (needs {feat[1]})")
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
                _prod(size) > self.limits["max_workgroup_invocations"]:
            raise VulkanError(f"kernel {kernel.entry}: workgroup {size} is over {self.name}'s limits "
                              f"{self.limits['max_workgroup_size']} / {self.limits['max_workgroup_invocations']}")
        if any(g > m for g, m in zip(kernel.grid, self.limits["max_workgroup_count"])):
            raise VulkanError(f"kernel {kernel.entry}: grid {kernel.grid} is over {self.name}'s limit "
                              f"{self.limits['max_workgroup_count']}")
        sg = kernel.extra.get("subgroup_size", 0)
        if sg and sg != self.subgroup_size:
            raise VulkanError(f"kernel {kernel.entry} was compiled for subgroup size {sg}; {self.name} has "
                              f"{self.subgroup_size} (compile with kf-to-spirv{{subgroup-size={self.subgroup_size}}})")
        if kernel.extra.get("workgroup_bytes", 0) > self.limits["max_shared_bytes"]:
            raise VulkanError(f"kernel {kernel.entry} uses {kernel.extra['workgroup_bytes']} bytes of workgroup "
                              f"memory; {self.name} has {self.limits['max_shared_bytes']}")

    # ---- pipelines -------------------------------------------------------------------
    def pipeline(self, spirv: bytes, entry: str, n_bindings: int) -> _Pipeline:
        key = (hashlib.sha256(spirv).hexdigest(), entry, n_bindings)
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
    def buffer(self, nbytes: int) -> _Buffer:
        """A mapped storage buffer of at least nbytes, from the pool when one is free."""
        if nbytes > self.limits["max_storage_buffer_range"]:
            raise VulkanError(f"a {nbytes}-byte tensor is larger than {self.name}'s largest storage buffer "
                              f"({self.limits['max_storage_buffer_range']} bytes)")
        # Sizes round up to a power of two (>= 256 B; Vulkan forbids empty buffers) so
        # that buffers of a repeated call are reused: allocating and mapping dominated
        # the launch time of a 4 MiB elementwise kernel on lavapipe.
        size = max(256, 1 << (max(nbytes, 1) - 1).bit_length())
        with self.lock:
            free = self.pool.get(size)
            if free:
                self.pooled_bytes -= size
                return free.pop()
        return self._new_buffer(size)

    def free(self, b: _Buffer) -> None:
        """Return a buffer to the pool (bounded by POOL_BYTES), or release it."""
        with self.lock:
            if self.pooled_bytes + b.size <= POOL_BYTES:
                self.pool.setdefault(b.size, []).append(b)
                self.pooled_bytes += b.size
                return
        self._release(b)

    def _new_buffer(self, size: int) -> _Buffer:
        vk, dev = self.vk, self.handle
        buf = self.check(vk.vkCreateBuffer, dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(dev, buf)
        if not req.memoryTypeBits & (1 << self.memory_type):
            vk.vkDestroyBuffer(dev, buf, None)
            raise VulkanError(f"{self.name}: no host-visible memory type for storage buffers")
        try:
            mem = self.check(vk.vkAllocateMemory, dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                memoryTypeIndex=self.memory_type), None)
        except VulkanError:
            vk.vkDestroyBuffer(dev, buf, None)
            raise
        vk.vkBindBufferMemory(dev, buf, mem, 0)
        b = _Buffer(buf, mem, size)
        b.mapped = self.check(vk.vkMapMemory, dev, mem, 0, size, 0)
        return b

    def _release(self, b: _Buffer) -> None:
        vk = self.vk
        vk.vkUnmapMemory(self.handle, b.memory)
        vk.vkDestroyBuffer(self.handle, b.buffer, None)
        vk.vkFreeMemory(self.handle, b.memory, None)

    def upload(self, b: _Buffer, t) -> None:
        torch = _torch()
        src = t.detach().contiguous().reshape(-1).view(torch.uint8)
        dst = torch.frombuffer(b.mapped, dtype=torch.uint8, count=src.numel()) if src.numel() else None
        if dst is not None:
            dst.copy_(src)

    def download(self, b: _Buffer, t) -> None:
        torch = _torch()
        n = t.numel() * t.element_size()
        if not n:
            return
        src = torch.frombuffer(b.mapped, dtype=torch.uint8, count=n)
        if t.is_contiguous():
            t.view(-1).view(torch.uint8).copy_(src)
        else:
            t.copy_(src.clone().view(t.dtype).view(t.shape))

    # ---- submission ------------------------------------------------------------------
    def run(self, launches: Sequence[tuple[KernelABI, bytes, Sequence[_Buffer]]], timed: bool) -> list[float]:
        """Record every launch into one command buffer (barriers between), submit, wait.
        Returns each launch's GPU time in seconds when timed (empty otherwise)."""
        vk, dev = self.vk, self.handle
        timed = timed and self.timestamps
        with self.lock:
            pipes = [self.pipeline(spv, k.entry, len(bufs)) for k, spv, bufs in launches]
            pool = sets = cmd = fence = qpool = None
            try:
                sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 descriptorCount=max(1, sum(len(b) for _, _, b in launches)))]
                pool = self.check(vk.vkCreateDescriptorPool, dev, vk.VkDescriptorPoolCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=len(launches), poolSizeCount=1,
                    pPoolSizes=sizes), None)
                sets = self.check(vk.vkAllocateDescriptorSets, dev, vk.VkDescriptorSetAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=pool,
                    descriptorSetCount=len(launches), pSetLayouts=[p.set_layout for p in pipes]))
                writes = []
                for ds, (_, _, bufs) in zip(sets, launches):
                    for i, b in enumerate(bufs):
                        writes.append(vk.VkWriteDescriptorSet(
                            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=ds, dstBinding=i, descriptorCount=1,
                            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                            pBufferInfo=[vk.VkDescriptorBufferInfo(
                                buffer=b.buffer, offset=0, range=min(b.size, self.limits["max_storage_buffer_range"]))]))
                if writes:
                    vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
                cmd = self.check(vk.vkAllocateCommandBuffers, dev, vk.VkCommandBufferAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.command_pool,
                    level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
                if timed:
                    qpool = self.check(vk.vkCreateQueryPool, dev, vk.VkQueryPoolCreateInfo(
                        sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                        queryCount=2 * len(launches)), None)
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                if timed:
                    vk.vkCmdResetQueryPool(cmd, qpool, 0, 2 * len(launches))
                barrier = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                             srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                             dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
                for i, ((k, _, _), p, ds) in enumerate(zip(launches, pipes, sets)):
                    if i:
                        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                                vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None, 0,
                                                None)
                    vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
                    vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, [ds], 0, None)
                    if timed:
                        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qpool, 2 * i)
                    vk.vkCmdDispatch(cmd, *k.grid)
                    if timed:
                        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, 2 * i + 1)
                self.check(vk.vkEndCommandBuffer, cmd)
                fence = self.check(vk.vkCreateFence, dev, vk.VkFenceCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
                self.check(vk.vkQueueSubmit, self.queue, 1, [vk.VkSubmitInfo(
                    sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, commandBufferCount=1, pCommandBuffers=[cmd])], fence)
                self.check(vk.vkWaitForFences, dev, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)
                if not timed:
                    return []
                data = vk.ffi.new("uint64_t[]", 2 * len(launches))
                self.check(vk.vkGetQueryPoolResults, dev, qpool, 0, 2 * len(launches), 16 * len(launches), data, 8,
                           vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
                return [(data[2 * i + 1] - data[2 * i]) * self.timestamp_period_ns * 1e-9 for i in range(len(launches))]
            finally:
                if fence is not None:
                    vk.vkDestroyFence(dev, fence, None)
                if qpool is not None:
                    vk.vkDestroyQueryPool(dev, qpool, None)
                if cmd is not None:
                    vk.vkFreeCommandBuffers(dev, self.command_pool, 1, [cmd])
                if pool is not None:
                    vk.vkDestroyDescriptorPool(dev, pool, None)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


#: Upper bound of the bytes kept in free buffers for reuse.
POOL_BYTES = 256 << 20

_DEVICE: Device | None = None
_DEVICE_ERROR: VulkanError | None = None
_LOCK = threading.Lock()
_TYPE_RANK = {"DISCRETE_GPU": 0, "INTEGRATED_GPU": 1, "VIRTUAL_GPU": 2, "CPU": 3, "OTHER": 4}


def device() -> Device:
    """The process's Vulkan device, made on first call (a GPU preferred over lavapipe).
    Raises VulkanUnavailable, saying why, when there is none; the failure is cached."""
    global _DEVICE, _DEVICE_ERROR
    with _LOCK:
        if _DEVICE is not None:
            return _DEVICE
        if _DEVICE_ERROR is not None:
            raise _DEVICE_ERROR
        try:
            _DEVICE = _make_device()
        except VulkanError as e:
            _DEVICE_ERROR = e
            raise
        return _DEVICE


def is_available() -> bool:
    try:
        device()
        return True
    except VulkanError:
        return False


def _make_device() -> Device:
    vk = _vk()
    app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="kf",
                               applicationVersion=1, pEngineName="kf", engineVersion=1,
                               apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    try:
        instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app, enabledLayerCount=0,
            enabledExtensionCount=0), None)
    except Exception as e:
        raise VulkanUnavailable(f"vkCreateInstance failed ({type(e).__name__}): no Vulkan driver is installed or "
                                f"VK_ICD_FILENAMES points nowhere; mesa-vulkan-drivers gives lavapipe") from None
    physicals = vk.vkEnumeratePhysicalDevices(instance)
    if not physicals:
        raise VulkanUnavailable("Vulkan has no physical device (is a driver installed? mesa-vulkan-drivers gives "
                                "lavapipe on CPU-only machines)")
    types = {getattr(vk, f"VK_PHYSICAL_DEVICE_TYPE_{n}"): n for n in _TYPE_RANK}
    candidates = []
    for pd in physicals:
        props = vk.vkGetPhysicalDeviceProperties(pd)
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
        qf = next((i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
        if qf is not None:
            kind = types.get(props.deviceType, "OTHER")
            candidates.append((_TYPE_RANK[kind], pd, props, qf, families[qf], kind))
    if not candidates:
        raise VulkanUnavailable("no Vulkan device has a compute queue")
    candidates.sort(key=lambda c: c[0])
    _, pd, props, qf, family, kind = candidates[0]
    api = (vk.VK_VERSION_MAJOR(props.apiVersion), vk.VK_VERSION_MINOR(props.apiVersion),
           vk.VK_VERSION_PATCH(props.apiVersion))
    name = props.deviceName if isinstance(props.deviceName, str) else vk.ffi.string(props.deviceName).decode()

    # Ask for every feature kf's SPIR-V may use that the device has.
    features: dict[str, bool] = {}
    core = vk.vkGetPhysicalDeviceFeatures(pd)
    for f in ("shaderInt16", "shaderInt64", "shaderFloat64"):
        features[f] = bool(getattr(core, f))
    enable_core = vk.VkPhysicalDeviceFeatures(**{f: vk.VK_TRUE for f, on in features.items() if on})
    chain = None
    if api >= (1, 2, 0):
        f11 = vk.VkPhysicalDeviceVulkan11Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES)
        f12 = vk.VkPhysicalDeviceVulkan12Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                                  pNext=f11)
        q = vk.VkPhysicalDeviceFeatures2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=f12)
        vk.vkGetPhysicalDeviceFeatures2(pd, q)
        features["storageBuffer16BitAccess"] = bool(f11.storageBuffer16BitAccess)
        for f in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess"):
            features[f] = bool(getattr(f12, f))
        e11 = vk.VkPhysicalDeviceVulkan11Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                                  storageBuffer16BitAccess=features["storageBuffer16BitAccess"])
        chain = vk.VkPhysicalDeviceVulkan12Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, pNext=e11,
            **{f: vk.VK_TRUE for f in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess") if features[f]})
    # before 1.2 only the core features are asked for: f16/i8/16-bit storage kernels are refused
    queue_info = vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, queueFamilyIndex=qf,
                                            queueCount=1, pQueuePriorities=[1.0])
    try:
        handle = vk.vkCreateDevice(pd, vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain, queueCreateInfoCount=1,
            pQueueCreateInfos=[queue_info], enabledExtensionCount=0, enabledLayerCount=0,
            pEnabledFeatures=enable_core), None)
    except Exception as e:
        raise VulkanUnavailable(f"vkCreateDevice failed on {name}: {type(e).__name__} {e}") from None
    queue = vk.vkGetDeviceQueue(handle, qf, 0)

    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    choices = [i for i in range(mem.memoryTypeCount) if (mem.memoryTypes[i].propertyFlags & want) == want]
    if not choices:
        raise VulkanUnavailable(f"{name} has no host-visible coherent memory")
    device_local = [i for i in choices
                    if mem.memoryTypes[i].propertyFlags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT]
    memory_type = (device_local or choices)[0]
    pool = vk.vkCreateCommandPool(handle, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=qf,
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
    lim = props.limits
    limits = {"max_workgroup_size": tuple(lim.maxComputeWorkGroupSize),
              "max_workgroup_count": tuple(lim.maxComputeWorkGroupCount),
              "max_workgroup_invocations": lim.maxComputeWorkGroupInvocations,
              "max_shared_bytes": lim.maxComputeSharedMemorySize,
              "max_storage_buffer_range": lim.maxStorageBufferRange}
    subgroup_size = 0
    if api >= (1, 1, 0):
        sub = vk.VkPhysicalDeviceSubgroupProperties(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=sub))
        subgroup_size = int(sub.subgroupSize)
    return Device(vk, instance, pd, handle, queue, qf, name, kind, api, features, limits,
                  float(lim.timestampPeriod), bool(family.timestampValidBits and lim.timestampComputeAndGraphics),
                  memory_type, pool, subgroup_size)


def _check_tensor(t, elem: str, what: str):
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise VulkanError(f"{what} is a {type(t).__name__}, not a torch.Tensor")
    if t.device.type != "cpu":
        raise VulkanError(f"{what} is on {t.device}; the Vulkan launcher takes CPU tensors")
    want = getattr(torch, ELEM_INFO[elem][0])
    if t.dtype != want:
        raise VulkanError(f"{what} is {t.dtype}; the kernel was compiled for {want}")


def launch(spirv: bytes, kernel: KernelABI, args: Sequence, *, written: Sequence[int] | None = None,
           timings: list | None = None) -> None:
    """Run one kernel on torch CPU tensors given in kernel-argument order (binding i =
    args[i]). The tensors at the indices in written (default: all) get the buffers'
    contents back. With timings, the kernel's GPU time in seconds is appended."""
    dev = device()
    dev.require(kernel)
    layout = kernel.extra.get("spirv_bindings")
    if layout is not None and len(layout) != len(args):
        raise VulkanError(f"kernel {kernel.entry} takes {len(layout)} buffers, got {len(args)} tensors")
    for i, t in enumerate(args):
        if layout is not None:
            _check_tensor(t, layout[i]["elem"], f"argument {i} of {kernel.entry}")
            if t.numel() != _prod(layout[i]["shape"]):
                raise VulkanError(f"argument {i} of {kernel.entry} has {t.numel()} elements; the kernel was "
                                  f"compiled for shape {tuple(layout[i]['shape'])}")
    bufs = []
    try:
        for t in args:
            b = dev.buffer(t.numel() * t.element_size())
            bufs.append(b)
            dev.upload(b, t)
        times = dev.run([(kernel, spirv, bufs)], timings is not None)
        for i in (range(len(args)) if written is None else written):
            dev.download(bufs[i], args[i])
        if timings is not None:
            timings.extend(times)
    finally:
        for b in bufs:
            dev.free(b)


def run_program(abi: ProgramABI, binaries: Mapping[str, bytes], inputs: Sequence, *,
                timings: list | None = None) -> tuple:
    """Run a compiled program: allocate its outputs and temporaries, launch its kernels in
    order in one submission, return the outputs as CPU tensors. binaries maps each
    KernelABI.artifact to its SPIR-V bytes. With timings, appends (entry, seconds)."""
    torch = _torch()
    dev = device()
    if len(inputs) != len(abi.inputs):
        raise VulkanError(f"the program takes {len(abi.inputs)} inputs, got {len(inputs)}")
    for i, (t, a) in enumerate(zip(inputs, abi.inputs)):
        _check_tensor(t, a.elem, f"input {i} ('{a.name}')")
        if tuple(t.shape) != tuple(a.shape):
            raise VulkanError(f"input {i} ('{a.name}') has shape {tuple(t.shape)}; compiled for {a.shape}")
    outputs = [torch.empty(a.shape, dtype=getattr(torch, ELEM_INFO[a.elem][0])) for a in abi.outputs]
    infos = list(abi.inputs) + list(abi.outputs) + list(abi.temporaries)
    bufs = []
    try:
        for info in infos:
            bufs.append(dev.buffer(info.nbytes))
        for b, t in zip(bufs, inputs):
            dev.upload(b, t)
        launches = []
        for k in abi.kernels:
            dev.require(k)
            if k.artifact not in binaries:
                raise VulkanError(f"no SPIR-V for kernel {k.entry} (artifact '{k.artifact}')")
            launches.append((k, binaries[k.artifact], [bufs[i] for i in k.args]))
        times = dev.run(launches, timings is not None) if launches else []
        n_in = len(abi.inputs)
        for j, out in enumerate(outputs):
            alias = abi.output_aliases[j] if j < len(abi.output_aliases) else -1
            if alias >= 0:
                outputs[j] = inputs[alias].reshape(abi.outputs[j].shape)
            else:
                dev.download(bufs[n_in + j], out)
        if timings is not None:
            timings.extend(zip((k.entry for k in abi.kernels), times))
    finally:
        for b in bufs:
            dev.free(b)
    return tuple(outputs)
