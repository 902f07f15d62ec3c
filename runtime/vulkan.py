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
- kernels read and write device-local buffers. On a discrete GPU host memory is far
  away (PCIe): transfers go through host-visible *staging* buffers, copied on the GPU
  (``vkCmdCopyBuffer``) in the call's own command buffer. Where a device-local memory
  type is also host-visible and cached and the device shares the host's memory (CPU
  devices such as lavapipe, integrated GPUs), the device buffers are mapped and written
  and read directly, with no staging (``Device.staged`` is False there; setting it True
  takes the staging path anyway, which is how CI tests it on lavapipe);
- a tensor's bytes stay on the device between calls (``runtime/residency.py``): inputs
  whose storage, version counter and sampled bytes match a resident buffer are not
  uploaded again, and the buffers a call writes its outputs into become resident for
  the outputs, so a chain of calls uploads each tensor once. Residency is bounded (LRU
  by bytes: half the device-local heap, or ``KF_VULKAN_RESIDENT_BYTES``);
- results are downloaded into the CPU tensors a call returns before it returns: they
  are ordinary torch tensors, correct whenever the caller can look at them (a lazily
  filled tensor would need a tensor subclass, which torch code does not treat as a
  plain tensor). A call's downloads are batched into its one command buffer, after
  its kernels, and the host waits once, on that command buffer's fence; what a caller
  cannot see (temporaries, outputs that are views of inputs) is never read back;
- one command buffer a call: uploads, a barrier, the kernels with compute->compute
  barriers between them, a barrier, downloads; one submit, one fence; no
  vkQueueWaitIdle. ``timings=`` collects each kernel's GPU time from timestamp
  queries (the profiler's hook);
- free buffers go to a bounded pool by size class for the next call; shader modules
  and pipelines are cached per (SPIR-V bytes, entry point);
- calls from several threads are safe: recording and submitting hold the device's
  lock, the residency table has its own, and the host waits for a call's fence with
  neither held.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .abi import ELEM_INFO, SUBGROUP_OPS, DeviceLimits, KernelABI, ProgramABI
from .residency import Entry, Residency, storage_key


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
    # kf-to-spirv asks for IEEE inf, NaN and signed zeros in every kernel that computes in floats
    "SignedZeroInfNanPreserve": ("float_controls", "shaderSignedZeroInfNanPreserveFloat32"),
}

#: SPIR-V subgroup capability -> the subgroup operation (abi.SUBGROUP_OPS) it needs.
_CAPABILITY_SUBGROUP = {
    "GroupNonUniform": "basic", "GroupNonUniformVote": "vote", "GroupNonUniformArithmetic": "arithmetic",
    "GroupNonUniformBallot": "ballot", "GroupNonUniformShuffle": "shuffle",
    "GroupNonUniformShuffleRelative": "shuffle_relative", "GroupNonUniformClustered": "clustered",
    "GroupNonUniformQuad": "quad",
}

#: Upper bound of the bytes kept in free buffers for reuse (one buffer is kept whatever
#: its size, so that a call repeated on large tensors does not allocate each time).
POOL_BYTES = 256 << 20

#: Seconds the host waits for one call's command buffer before it reports a hang.
WAIT_SECONDS = 600


def _torch():
    import torch

    return torch


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
class _Buffer:
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
            feat = _CAPABILITY_FEATURE.get(cap)
            if feat and not self.features.get(feat[1], False):
                missing.append(f"{cap} (needs {feat[1]})")
            if cap == "SignedZeroInfNanPreserve" and "Float16" in kernel.extra.get("spirv_capabilities", ()) and \
                    not self.features.get("shaderSignedZeroInfNanPreserveFloat16", False):
                missing.append(f"{cap} (needs shaderSignedZeroInfNanPreserveFloat16)")
            op = _CAPABILITY_SUBGROUP.get(cap)
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
    def buffer(self, nbytes: int, kind: str = "device") -> _Buffer:
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

    def free(self, b: _Buffer) -> None:
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

    def _new_buffer(self, size: int, kind: str) -> _Buffer:
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
        b = _Buffer(buf, mem, size, kind)
        if mapped:
            b.mapped = self.check(vk.vkMapMemory, dev, mem, 0, size, 0)
        return b

    def _release(self, b: _Buffer) -> None:
        vk = self.vk
        if b.mapped is not None:
            vk.vkUnmapMemory(self.handle, b.memory)
        vk.vkDestroyBuffer(self.handle, b.buffer, None)
        vk.vkFreeMemory(self.handle, b.memory, None)

    # ---- calls -----------------------------------------------------------------------
    def call(self) -> "Call":
        """A new call: its reads, writes and kernels, then ``finish()``."""
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
                c = Call(self)
                c.copies.append((src, dst, nbytes))
                times.append(c.finish(timed=True, time_copies=True)[0])
            times.sort()
            return times[len(times) // 2]
        finally:
            self.free(src)
            self.free(dst)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _host_view(mapped, t, nbytes: int):
    """A tensor over the first nbytes of mapped memory, of t's dtype and shape (dense)."""
    torch = _torch()
    return torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes).view(t.dtype).view(t.shape)


class Call:
    """One call's work on the device: tensors it reads (uploaded unless resident),
    tensors it writes (downloaded into, and resident after), temporaries, and kernels,
    recorded into one command buffer by ``finish()``. A Call is used by one thread.

    ``scratch(nbytes, fill=..., read_back=True)`` is a buffer the program owns (a flag
    the kernels set, say): uploaded from bytes before the kernels and its bytes in
    ``results[buffer]`` after ``finish()``."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.launches: list[tuple[KernelABI, bytes, list[_Buffer]]] = []
        self.copies: list[tuple[_Buffer, _Buffer, int]] = []  # staging -> device, before the kernels
        self.reads_back: list[tuple[_Buffer, _Buffer | None, int, object]] = []  # (device, staging, n, sink)
        self.results: dict[_Buffer, bytes] = {}
        self._owned: list[_Buffer] = []  # freed at the end
        self._pinned: list[Entry] = []  # unpinned at the end
        self._new: list[Entry] = []  # entries this call's uploads fill: ready once submitted
        self._outputs: list[tuple[object, tuple, _Buffer, int]] = []  # (tensor, key, buffer, bytes)
        self._reads: dict[tuple, _Buffer] = {}
        self._done = False

    # ---- what the call reads and writes -------------------------------------------------
    def read(self, t) -> _Buffer:
        """The device buffer holding t's values, dense row-major: a resident one, or a
        new one the call uploads t into (resident afterwards)."""
        nbytes = t.numel() * t.element_size()
        self._check_range(nbytes)
        key = storage_key(t)
        if key is None:
            b = self.scratch(nbytes)
            self._upload(b, t, nbytes)
            return b
        b = self._reads.get(key)
        if b is not None:
            return b
        res = self.dev.residency
        e = res.acquire(t, key)
        if e is None:
            b = self.dev.buffer(nbytes)
            e = res.insert(t, key, b, nbytes)
            self._pinned.append(e)
            self._new.append(e)
            res.record(e, t)  # before the copy: a change during it leaves the entry stale
            self._upload(b, t, nbytes)
        else:
            self._pinned.append(e)
        self._reads[key] = e.buffer
        return e.buffer

    def write(self, t) -> _Buffer:
        """A device buffer the kernels write t's values into; downloaded into t by
        ``finish()``, then resident for t."""
        nbytes = t.numel() * t.element_size()
        self._check_range(nbytes)
        key = storage_key(t)
        b = self.dev.buffer(nbytes)
        if key is None:
            self._owned.append(b)
        else:
            self._outputs.append((t, key, b, nbytes))
        if nbytes:
            self._read_back(b, nbytes, t)
        return b

    def update(self, t) -> _Buffer:
        """A buffer holding t's values that the kernels may change: uploaded, and
        downloaded back into t (a launch's written arguments)."""
        b = self.write(t)
        self._upload(b, t, t.numel() * t.element_size())
        return b

    def scratch(self, nbytes: int, *, fill: bytes | None = None, read_back: bool = False) -> _Buffer:
        """A buffer for this call only; with ``fill``, uploaded from those bytes; with
        ``read_back``, its first nbytes in ``results[buffer]`` after ``finish()``."""
        self._check_range(nbytes)
        b = self.dev.buffer(nbytes)
        self._owned.append(b)
        if fill is not None:
            torch = _torch()
            data = torch.frombuffer(bytearray(fill), dtype=torch.uint8) if fill else torch.empty(0, dtype=torch.uint8)
            self._upload(b, data, len(fill), count=False)
        if read_back and nbytes:
            self._read_back(b, nbytes, None)
        return b

    def dispatch(self, kernel: KernelABI, spirv: bytes, buffers: Sequence[_Buffer]) -> None:
        self.dev.require(kernel)
        self.launches.append((kernel, spirv, list(buffers)))

    # ---- transfers ---------------------------------------------------------------------
    def _check_range(self, nbytes: int) -> None:
        limit = self.dev.limits["max_storage_buffer_range"]
        if nbytes > limit:
            raise VulkanError(f"a {nbytes}-byte tensor is larger than {self.dev.name}'s largest storage buffer "
                              f"({limit} bytes)")

    def _upload(self, b: _Buffer, t, nbytes: int, count: bool = True) -> None:
        if not nbytes:
            return
        dev = self.dev
        t = t.detach()
        if b.mapped is not None:
            _host_view(b.mapped, t, nbytes).copy_(t)
        else:
            s = dev.buffer(nbytes, "staging")
            self._owned.append(s)
            _host_view(s.mapped, t, nbytes).copy_(t)
            self.copies.append((s, b, nbytes))
        if count:
            with dev.lock:
                dev.uploads += 1
                dev.upload_bytes += nbytes

    def _read_back(self, b: _Buffer, nbytes: int, sink) -> None:
        s = None
        if b.mapped is None:
            s = self.dev.buffer(nbytes, "staging")
            self._owned.append(s)
        self.reads_back.append((b, s, nbytes, sink))

    # ---- submission --------------------------------------------------------------------
    def finish(self, timed: bool = False, time_copies: bool = False) -> list[float]:
        """Record everything into one command buffer, submit it, wait for its fence, copy
        the results into their tensors (and ``results``) and make the written tensors
        resident. Returns each kernel's GPU time in seconds when timed (and timestamps
        exist; with ``time_copies``, the upload copies' time instead: copy_seconds)."""
        if self._done:
            raise VulkanError("a Call finishes once")
        self._done = True
        dev = self.dev
        res = dev.residency
        vk, handle = dev.vk, dev.handle
        pool = cmd = fence = qpool = None
        outputs_done = []
        device_work = self.launches or self.copies or any(s is not None for _, s, _, _ in self.reads_back)
        submitted, waited = False, not device_work
        try:
            if device_work:
                timed = timed and dev.timestamps
                n_q = 2 if time_copies else 2 * len(self.launches)
                with dev.lock:
                    pool, cmd, qpool = self._record(timed, time_copies, n_q)
                    fence = dev.check(vk.vkCreateFence, handle, vk.VkFenceCreateInfo(
                        sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
                    dev.check(vk.vkQueueSubmit, dev.queue, 1, [vk.VkSubmitInfo(
                        sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, commandBufferCount=1, pCommandBuffers=[cmd])], fence)
                    submitted = True
                    dev.submits += 1
                # another thread's call submitted from now on runs after these uploads
                for e in self._new:
                    e.ready = True
                _wait(dev, fence)
                waited = True
            else:
                for e in self._new:  # written straight into mapped buffers
                    e.ready = True
            torch = _torch()
            for b, s, nbytes, sink in self.reads_back:
                src = torch.frombuffer((s or b).mapped, dtype=torch.uint8, count=nbytes)
                if sink is None:
                    self.results[b] = bytes(src.numpy())
                    continue
                sink = sink.detach()
                if sink.is_contiguous():
                    # as_strided, not view(-1): a contiguous tensor may still have a
                    # stride != 1 on a size-1 dim (x[::2] of 2 elements), and a byte view needs 1
                    sink.as_strided((sink.numel(),), (1,)).view(torch.uint8).copy_(src)
                else:
                    sink.copy_(src.view(sink.dtype).view(sink.shape))
                with dev.lock:
                    dev.downloads += 1
                    dev.download_bytes += nbytes
            for t, key, b, nbytes in self._outputs:
                e = res.insert(t, key, b, nbytes)
                res.record(e, t)
                e.ready = True
                outputs_done.append(b)
                self._pinned.append(e)
            if not timed or qpool is None:
                return []
            n = 1 if time_copies else len(self.launches)
            data = vk.ffi.new("uint64_t[]", 2 * n)
            dev.check(vk.vkGetQueryPoolResults, handle, qpool, 0, 2 * n, 16 * n, data, 8,
                      vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            return [(data[2 * i + 1] - data[2 * i]) * dev.timestamp_period_ns * 1e-9 for i in range(n)]
        finally:
            settled = waited or not submitted
            if not settled:
                # interrupted, or the wait failed, while the GPU may still use the
                # buffers: nothing is freed before the fence says so (what a device that
                # never says so holds stays allocated)
                try:
                    dev.check(vk.vkWaitForFences, handle, 1, [fence], vk.VK_TRUE, WAIT_SECONDS * 10 ** 9)
                    settled = True
                except VulkanError:
                    pass
            if settled:
                self._release(pool, cmd, fence, qpool, waited, outputs_done)

    def abandon(self) -> None:
        """Give back what a call that will not be finished holds (nothing was submitted)."""
        if not self._done:
            self._done = True
            self._release(None, None, None, None, False, [])

    def _release(self, pool, cmd, fence, qpool, waited: bool, outputs_done: list) -> None:
        """Give back what the call used once the device is done with it."""
        dev = self.dev
        vk, handle = dev.vk, dev.handle
        with dev.lock:
            if fence is not None:
                vk.vkDestroyFence(handle, fence, None)
            if qpool is not None:
                vk.vkDestroyQueryPool(handle, qpool, None)
            if cmd is not None:
                vk.vkFreeCommandBuffers(handle, dev.command_pool, 1, [cmd])
            if pool is not None:
                vk.vkDestroyDescriptorPool(handle, pool, None)
        res = dev.residency
        if not waited:
            # what this call was to upload may never have reached its buffers
            for e in self._new:
                res.discard(e)
        for _, _, b, _ in self._outputs:
            if b not in outputs_done:
                self._owned.append(b)
        res.unpin(self._pinned)
        for b in self._owned:
            dev.free(b)

    def _record(self, timed: bool, time_copies: bool, n_queries: int):
        """The command buffer (with its descriptor pool and query pool), recorded."""
        dev = self.dev
        vk, handle = dev.vk, dev.handle
        launches = self.launches
        pipes = [dev.pipeline(spv, k.entry, len(bufs)) for k, spv, bufs in launches]
        pool = sets = cmd = qpool = None
        try:
            if launches:
                sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 descriptorCount=max(1, sum(len(b) for _, _, b in launches)))]
                pool = dev.check(vk.vkCreateDescriptorPool, handle, vk.VkDescriptorPoolCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=len(launches), poolSizeCount=1,
                    pPoolSizes=sizes), None)
                sets = dev.check(vk.vkAllocateDescriptorSets, handle, vk.VkDescriptorSetAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=pool,
                    descriptorSetCount=len(launches), pSetLayouts=[p.set_layout for p in pipes]))
                writes = []
                limit = dev.limits["max_storage_buffer_range"]
                for ds, (_, _, bufs) in zip(sets, launches):
                    for i, b in enumerate(bufs):
                        writes.append(vk.VkWriteDescriptorSet(
                            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=ds, dstBinding=i, descriptorCount=1,
                            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buffer, offset=0,
                                                                   range=min(b.size, limit))]))
                if writes:
                    vk.vkUpdateDescriptorSets(handle, len(writes), writes, 0, None)
            cmd = dev.check(vk.vkAllocateCommandBuffers, handle, vk.VkCommandBufferAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=dev.command_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
            if timed and n_queries:
                qpool = dev.check(vk.vkCreateQueryPool, handle, vk.VkQueryPoolCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                    queryCount=n_queries), None)
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            if qpool is not None:
                vk.vkCmdResetQueryPool(cmd, qpool, 0, n_queries)
            compute, transfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
            reads = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
            writes_ = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT

            def barrier(src_stage, src_access, dst_stage, dst_access):
                vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [vk.VkMemoryBarrier(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=src_access, dstAccessMask=dst_access)],
                    0, None, 0, None)

            # what earlier submits (other calls, other threads) wrote, before this one uses it
            barrier(compute | transfer, writes_, compute | transfer, reads | writes_)
            if self.copies:
                if time_copies and qpool is not None:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qpool, 0)
                for s, b, nbytes in self.copies:
                    vk.vkCmdCopyBuffer(cmd, s.buffer, b.buffer, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0,
                                                                                    size=nbytes)])
                if time_copies and qpool is not None:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, 1)
                barrier(transfer, vk.VK_ACCESS_TRANSFER_WRITE_BIT, compute | transfer, reads | writes_)
            for i, ((k, _, _), p, ds) in enumerate(zip(launches, pipes, sets or [])):
                if i:
                    barrier(compute, vk.VK_ACCESS_SHADER_WRITE_BIT, compute,
                            vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
                vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, [ds], 0, None)
                if qpool is not None and not time_copies:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qpool, 2 * i)
                vk.vkCmdDispatch(cmd, *k.grid)
                if qpool is not None and not time_copies:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, 2 * i + 1)
            if self.reads_back:
                barrier(compute | transfer, writes_, transfer | vk.VK_PIPELINE_STAGE_HOST_BIT,
                        vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_HOST_READ_BIT)
                staged = [(b, s, n) for b, s, n, _ in self.reads_back if s is not None]
                for b, s, nbytes in staged:
                    vk.vkCmdCopyBuffer(cmd, b.buffer, s.buffer, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0,
                                                                                    size=nbytes)])
                if staged:
                    barrier(transfer, vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                            vk.VK_ACCESS_HOST_READ_BIT)
            dev.check(vk.vkEndCommandBuffer, cmd)
            return pool, cmd, qpool
        except BaseException:
            if qpool is not None:
                vk.vkDestroyQueryPool(handle, qpool, None)
            if cmd is not None:
                vk.vkFreeCommandBuffers(handle, dev.command_pool, 1, [cmd])
            if pool is not None:
                vk.vkDestroyDescriptorPool(handle, pool, None)
            raise


def _wait(dev: Device, fence) -> None:
    """Wait for a call's fence (no lock held: other threads record and submit meanwhile)."""
    vk = dev.vk
    try:
        dev.check(vk.vkWaitForFences, dev.handle, 1, [fence], vk.VK_TRUE, WAIT_SECONDS * 10 ** 9)
    except VulkanError as e:
        raise VulkanError(f"{e} (waiting up to {WAIT_SECONDS} s for a call's kernels)") from None


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
        controls = vk.VkPhysicalDeviceFloatControlsProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=controls))
        for f in ("shaderSignedZeroInfNanPreserveFloat16", "shaderSignedZeroInfNanPreserveFloat32"):
            features[f] = bool(getattr(controls, f))
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

    memory = _memory(vk, vk.vkGetPhysicalDeviceMemoryProperties(pd), kind)
    if memory is None:
        raise VulkanUnavailable(f"{name} has no host-visible coherent memory")
    pool = vk.vkCreateCommandPool(handle, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=qf,
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
    lim = props.limits
    limits = {"max_workgroup_size": tuple(lim.maxComputeWorkGroupSize),
              "max_workgroup_count": tuple(lim.maxComputeWorkGroupCount),
              "max_workgroup_invocations": lim.maxComputeWorkGroupInvocations,
              "max_shared_bytes": lim.maxComputeSharedMemorySize,
              "max_storage_buffer_range": lim.maxStorageBufferRange,
              # llvmpipe (lavapipe) ends every loop of an invocation once 65535 iterations
              # have run in all (LP_MAX_TGSI_LOOP_ITERATIONS, gallivm's infinite-loop guard)
              "max_loop_iterations": 65535 if "llvmpipe" in name.lower() else 0}
    subgroup = {}
    if api >= (1, 1, 0):
        sub = vk.VkPhysicalDeviceSubgroupProperties(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=sub))
        subgroup = {"subgroupSize": int(sub.subgroupSize), "supportedStages": int(sub.supportedStages),
                    "supportedOperations": int(sub.supportedOperations),
                    "quadOperationsInAllStages": bool(sub.quadOperationsInAllStages)}
    properties = {
        "deviceName": name, "deviceType": kind, "apiVersion": ".".join(map(str, api)),
        "driverVersion": int(props.driverVersion), "vendorID": int(props.vendorID),
        "limits": {"maxComputeSharedMemorySize": int(lim.maxComputeSharedMemorySize),
                   "maxComputeWorkGroupInvocations": int(lim.maxComputeWorkGroupInvocations),
                   "maxComputeWorkGroupSize": [int(v) for v in lim.maxComputeWorkGroupSize],
                   "maxComputeWorkGroupCount": [int(v) for v in lim.maxComputeWorkGroupCount],
                   "maxStorageBufferRange": int(lim.maxStorageBufferRange),
                   "minStorageBufferOffsetAlignment": int(lim.minStorageBufferOffsetAlignment),
                   "timestampPeriod": float(lim.timestampPeriod)},
        "subgroup": subgroup,
        "memoryHeapBytes": memory.heap_bytes, "unifiedMemory": memory.unified,
    }
    dev = Device(vk, instance, pd, handle, queue, qf, name, kind, api, features, limits,
                 float(lim.timestampPeriod), bool(family.timestampValidBits and lim.timestampComputeAndGraphics),
                 memory, pool, subgroup.get("subgroupSize", 0), properties, staged=not memory.unified)
    dev.residency = Residency(resident_limit(memory.heap_bytes), dev.free)
    return dev


def _memory(vk, mem, device_type: str) -> Memory | None:
    """The memory types kf allocates from (see Memory), or None without host-visible
    coherent memory. Device buffers: device-local types, on a discrete GPU those the host
    cannot see first (the BAR window a host-visible one sits in is small or slow to read).
    Staging: host-visible coherent types, cached ones first (reads of results), on a
    discrete GPU those in host memory first. Unified: a CPU or integrated device with a
    device-local type that is host-visible, coherent and cached -- its memory is the
    host's, and mapping it costs nothing."""
    DL, HV = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    HC, CACHED = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
    flags = [mem.memoryTypes[i].propertyFlags for i in range(mem.memoryTypeCount)]
    discrete = device_type == "DISCRETE_GPU"
    device = sorted((i for i, f in enumerate(flags) if f & DL), key=lambda i: (discrete and bool(flags[i] & HV), i))
    host = [i for i, f in enumerate(flags) if f & (HV | HC) == HV | HC]
    if not host:
        return None
    staging = sorted(host, key=lambda i: (not flags[i] & CACHED, discrete and bool(flags[i] & DL), i))
    unified = device_type in ("CPU", "INTEGRATED_GPU") and any(flags[i] & (DL | HV | HC | CACHED) == DL | HV | HC | CACHED for i in range(len(flags)))
    if unified:
        # mapped device buffers come from the unified types first
        staging = sorted(staging, key=lambda i: flags[i] & (DL | CACHED) != DL | CACHED)
    heap = mem.memoryTypes[(device or staging)[0]].heapIndex
    return Memory(tuple(device or staging), tuple(staging), unified, int(mem.memoryHeaps[heap].size))


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
    args[i]). The tensors at the indices in written (default: all) are uploaded and get
    the buffers' contents back; the others are read (not uploaded when resident). With
    timings, the kernel's GPU time in seconds is appended."""
    dev = device()
    layout = kernel.extra.get("spirv_bindings")
    if layout is not None and len(layout) != len(args):
        raise VulkanError(f"kernel {kernel.entry} takes {len(layout)} buffers, got {len(args)} tensors")
    for i, t in enumerate(args):
        if layout is not None:
            _check_tensor(t, layout[i]["elem"], f"argument {i} of {kernel.entry}")
            # (an empty tensor is declared with its zero dims as 1: SPIR-V has no empty arrays)
            if t.numel() != _prod(layout[i]["shape"]) and t.numel() > 0:
                raise VulkanError(f"argument {i} of {kernel.entry} has {t.numel()} elements; the kernel was "
                                  f"compiled for shape {tuple(layout[i]['shape'])}")
    written = set(range(len(args)) if written is None else written)
    call = dev.call()
    done = False
    try:
        bufs = [call.update(t) if i in written else call.read(t) for i, t in enumerate(args)]
        call.dispatch(kernel, spirv, bufs)
        done = True
    finally:
        if not done:
            call.abandon()
    times = call.finish(timings is not None)
    if timings is not None:
        timings.extend(times)


def run_program(abi: ProgramABI, binaries: Mapping[str, bytes], inputs: Sequence, *,
                timings: list | None = None) -> tuple:
    """Run a compiled program: its inputs read (uploaded unless resident), its outputs
    allocated and written, its temporaries, its kernels in order in one submission;
    returns the outputs as CPU tensors (their device buffers resident). binaries maps
    each KernelABI.artifact to its SPIR-V bytes. With timings, appends (entry, seconds)."""
    torch = _torch()
    dev = device()
    if len(inputs) != len(abi.inputs):
        raise VulkanError(f"the program takes {len(abi.inputs)} inputs, got {len(inputs)}")
    for i, (t, a) in enumerate(zip(inputs, abi.inputs)):
        _check_tensor(t, a.elem, f"input {i} ('{a.name}')")
        if tuple(t.shape) != tuple(a.shape):
            raise VulkanError(f"input {i} ('{a.name}') has shape {tuple(t.shape)}; compiled for {a.shape}")
    # outputs have version counters (residency needs them) even under inference_mode
    with torch.inference_mode(False):
        outputs = [None if abi.unwritten(j) else torch.empty(a.shape, dtype=getattr(torch, ELEM_INFO[a.elem][0]))
                   for j, a in enumerate(abi.outputs)]
    call = dev.call()
    done = False
    try:
        bufs = [call.read(t) for t in inputs]
        bufs += [call.write(out) if out is not None else call.scratch(a.nbytes) for out, a in zip(outputs, abi.outputs)]
        bufs += [call.scratch(t.nbytes) for t in abi.temporaries]
        if abi.index_sites:  # the index error flag, zeroed: kernels only ever set it
            bufs.append(call.scratch(abi.flag_arg.nbytes, fill=bytes(abi.flag_arg.nbytes), read_back=True))
        for k in abi.kernels:
            if k.artifact not in binaries:
                raise VulkanError(f"no SPIR-V for kernel {k.entry} (artifact '{k.artifact}')")
            call.dispatch(k, binaries[k.artifact], [bufs[i] for i in k.args])
        done = True
    finally:
        if not done:
            call.abandon()
    times = call.finish(timings is not None)
    if abi.index_sites:
        flag = torch.frombuffer(bytearray(call.results[bufs[abi.flag_buffer]]), dtype=torch.int32)
        abi.raise_index_error(flag.tolist())
    outputs = abi.take_inputs(inputs, outputs)
    if timings is not None:
        timings.extend(zip((k.entry for k in abi.kernels), times))
    return tuple(outputs)


if __name__ == "__main__":
    # The device's properties as Vulkan names them: what a recorded device of kf's tests
    # holds (test/python/runtime/devices/), and what DeviceLimits.from_vulkan reads.
    print(json.dumps(device().properties, indent=1))
