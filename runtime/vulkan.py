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
  16/8-bit storage; cooperative matrices with the Vulkan memory model, through
  VK_KHR_cooperative_matrix) is enabled when the device has it, and a kernel whose recorded
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

This module makes the device and launches on it; the device (its memory, pool and
pipelines) is ``vulkan_device.py``'s ``Device``, one call's command buffer
``vulkan_call.py``'s ``Call``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import threading
from typing import Mapping, Sequence

from .abi import ELEM_INFO, KernelABI, ProgramABI, loop_limit
from .residency import Residency
from .vulkan_call import torch_module
from .vulkan_device import Device, Memory, VulkanError, VulkanUnavailable, prod, resident_limit


def _vk():
    try:
        import vulkan as vk  # the realitix cffi binding; it dlopens libvulkan at import
    except ImportError as e:
        raise VulkanUnavailable(f"the Python package 'vulkan' is not installed ({e}); pip install vulkan") from None
    except OSError as e:
        raise VulkanUnavailable(f"no Vulkan loader (libvulkan.so.1): {e}; install libvulkan1 and a driver "
                                f"(mesa-vulkan-drivers gives the CPU driver lavapipe)") from None
    return vk


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
    # Vulkan 1.3: a SPIR-V 1.6 module (kf's cooperative-matrix kernels) is valid only
    # there; a 1.2 device still runs kf's SPIR-V 1.4 (its version is the lesser of the two)
    app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="kf",
                               applicationVersion=1, pEngineName="kf", engineVersion=1,
                               apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
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
    extensions: list[str] = []
    coopmat: list[dict] = []
    if api >= (1, 2, 0):
        has_coopmat = COOPMAT_EXTENSION in _device_extensions(vk, pd)
        f11 = vk.VkPhysicalDeviceVulkan11Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES)
        cmf = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, pNext=f11) \
            if has_coopmat else None
        f12 = vk.VkPhysicalDeviceVulkan12Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                                  pNext=cmf if has_coopmat else f11)
        q = vk.VkPhysicalDeviceFeatures2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=f12)
        vk.vkGetPhysicalDeviceFeatures2(pd, q)
        features["storageBuffer16BitAccess"] = bool(f11.storageBuffer16BitAccess)
        for f in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess", "vulkanMemoryModel"):
            features[f] = bool(getattr(f12, f))
        # cooperative matrices need the Vulkan memory model (spirv-val: Shader with
        # CooperativeMatrixKHR requires VulkanMemoryModel); both on, or neither
        features["cooperativeMatrix"] = bool(has_coopmat and cmf.cooperativeMatrix and features["vulkanMemoryModel"])
        e11 = vk.VkPhysicalDeviceVulkan11Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                                  storageBuffer16BitAccess=features["storageBuffer16BitAccess"])
        tail = e11
        if features["cooperativeMatrix"]:
            extensions.append(COOPMAT_EXTENSION)
            tail = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, pNext=e11,
                cooperativeMatrix=vk.VK_TRUE)
            coopmat = _cooperative_matrix_properties(vk, instance, pd)
        chain = vk.VkPhysicalDeviceVulkan12Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, pNext=tail,
            **{f: vk.VK_TRUE for f in ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess")
               if features[f]},
            **({"vulkanMemoryModel": vk.VK_TRUE} if features["cooperativeMatrix"] else {}))
        controls = vk.VkPhysicalDeviceFloatControlsProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=controls))
        float_controls = {f"{prop}{w}": bool(getattr(controls, f"{prop}{w}"))
                          for prop in ("shaderSignedZeroInfNanPreserveFloat", "shaderDenormPreserveFloat",
                                       "shaderRoundingModeRTEFloat") for w in (16, 32, 64)}
        float_controls["denormBehaviorIndependence"] = int(controls.denormBehaviorIndependence)
        float_controls["roundingModeIndependence"] = int(controls.roundingModeIndependence)
        features.update({f: on for f, on in float_controls.items() if isinstance(on, bool)})
    else:
        float_controls = {}  # before 1.2 (no float controls): kernels that declare them are refused
    # before 1.2 only the core features are asked for: f16/i8/16-bit storage kernels are refused
    queue_info = vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, queueFamilyIndex=qf,
                                            queueCount=1, pQueuePriorities=[1.0])
    try:
        handle = vk.vkCreateDevice(pd, vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain, queueCreateInfoCount=1,
            pQueueCreateInfos=[queue_info], enabledExtensionCount=len(extensions), enabledLayerCount=0,
            **({"ppEnabledExtensionNames": extensions} if extensions else {}),
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
              "max_storage_buffers": lim.maxPerStageDescriptorStorageBuffers,
              "max_loop_iterations": loop_limit(name)}
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
                   "maxPerStageDescriptorStorageBuffers": int(lim.maxPerStageDescriptorStorageBuffers),
                   "minStorageBufferOffsetAlignment": int(lim.minStorageBufferOffsetAlignment),
                   "timestampPeriod": float(lim.timestampPeriod)},
        "subgroup": subgroup,
        "floatControls": float_controls,
        # VkCooperativeMatrixPropertiesKHR of each shape the device multiplies (enums as
        # numbers: VkComponentTypeKHR, VkScopeKHR); empty without VK_KHR_cooperative_matrix
        "cooperativeMatrix": coopmat,
        "memoryHeapBytes": memory.heap_bytes, "unifiedMemory": memory.unified,
    }
    dev = Device(vk, instance, pd, handle, queue, qf, name, kind, api, features, limits,
                 float(lim.timestampPeriod), bool(family.timestampValidBits and lim.timestampComputeAndGraphics),
                 memory, pool, subgroup.get("subgroupSize", 0), properties, staged=not memory.unified)
    dev.residency = Residency(resident_limit(memory.heap_bytes), dev.free)
    return dev


#: the device extension of cooperative matrices (enabled, with the Vulkan memory model,
#: where the device has it)
COOPMAT_EXTENSION = "VK_KHR_cooperative_matrix"


def _device_extensions(vk, pd) -> set[str]:
    names = set()
    for e in vk.vkEnumerateDeviceExtensionProperties(pd, None):
        name = e.extensionName
        names.add(name if isinstance(name, str) else vk.ffi.string(name).decode())
    return names


def _cooperative_matrix_properties(vk, instance, pd) -> list[dict]:
    """vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR under Vulkan's field names, each
    entry's sType set as the extension asks (the binding's own wrapper leaves it 0)."""
    name = "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
    raw = vk.lib.vkGetInstanceProcAddr(instance, name.encode())
    if raw == vk.ffi.NULL:
        return []
    fn = vk.ffi.cast(f"PFN_{name}", raw)
    count = vk.ffi.new("uint32_t*")
    if fn(pd, count, vk.ffi.NULL) != vk.VK_SUCCESS or not count[0]:
        return []
    props = vk.ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(pd, count, props) != vk.VK_SUCCESS:
        return []
    fields = ("MSize", "NSize", "KSize", "AType", "BType", "CType", "ResultType")
    return [{**{f: int(getattr(p, f)) for f in fields}, "saturatingAccumulation": bool(p.saturatingAccumulation),
             "scope": int(p.scope)} for p in (props[i] for i in range(count[0]))]


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
    torch = torch_module()
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
            if t.numel() != prod(layout[i]["shape"]) and t.numel() > 0:
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


def _nbytes(a, shape: Sequence[int]) -> int:
    return prod(shape) * ELEM_INFO[a.elem][1]


def run_program(abi: ProgramABI, binaries: Mapping[str, bytes], inputs: Sequence, *,
                timings: list | None = None) -> tuple:
    """Run a compiled program: its inputs read (uploaded unless resident), its outputs
    allocated and written, its temporaries, its kernels in order in one submission;
    returns the outputs as CPU tensors (their device buffers resident). binaries maps
    each KernelABI.artifact to its SPIR-V bytes. With timings, appends (entry, seconds)."""
    torch = torch_module()
    dev = device()
    if len(inputs) != len(abi.inputs):
        raise VulkanError(f"the program takes {len(abi.inputs)} inputs, got {len(inputs)}")
    for i, (t, a) in enumerate(zip(inputs, abi.inputs)):
        _check_tensor(t, a.elem, f"input {i} ('{a.name}')")
        if a.is_static and tuple(t.shape) != tuple(a.shape):
            raise VulkanError(f"input {i} ('{a.name}') has shape {tuple(t.shape)}; compiled for {a.shape}")
    sized = None
    if not abi.is_static:  # run-time sizes: the inputs' give the symbols, which give the rest
        sized = abi.sized_call(tuple(tuple(t.shape) for t in inputs))
        if isinstance(sized, str):
            raise VulkanError(sized)
    out_shapes = sized.outputs if sized else [a.shape for a in abi.outputs]
    temp_shapes = sized.temporaries if sized else [a.shape for a in abi.temporaries]
    # outputs have version counters (residency needs them) even under inference_mode
    with torch.inference_mode(False):
        outputs = [None if abi.unwritten(j) else torch.empty(shape, dtype=getattr(torch, ELEM_INFO[a.elem][0]))
                   for j, (a, shape) in enumerate(zip(abi.outputs, out_shapes))]
    call = dev.call()
    done = False
    try:
        bufs = [call.read(t) for t in inputs]
        bufs += [call.write(out) if out is not None else call.scratch(_nbytes(a, shape))
                 for out, a, shape in zip(outputs, abi.outputs, out_shapes)]
        bufs += [call.scratch(_nbytes(t, shape)) for t, shape in zip(abi.temporaries, temp_shapes)]
        if abi.index_sites:  # the index error flag, zeroed: kernels only ever set it
            bufs.append(call.scratch(abi.flag_arg.nbytes, fill=bytes(abi.flag_arg.nbytes), read_back=True))
        for n, k in enumerate(abi.kernels):
            if k.artifact not in binaries:
                raise VulkanError(f"no SPIR-V for kernel {k.entry} (artifact '{k.artifact}')")
            args = [bufs[i] for i in k.args]
            if k.sizes:  # the kernel's run-time sizes: a buffer of int32, its last argument
                grid, slots = sized.launches[n]
                k = dataclasses.replace(k, grid=grid)
                args.append(call.scratch(4 * len(slots), fill=struct.pack(f"<{len(slots)}i", *slots)))
            call.dispatch(k, binaries[k.artifact], args)
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
