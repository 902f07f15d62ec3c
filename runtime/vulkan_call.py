"""One call on a Vulkan device (``Call``): its uploads, kernels and downloads recorded
into one command buffer, submitted once, with one fence the host waits on."""

from __future__ import annotations

from typing import Sequence

from .abi import KernelABI
from .residency import Entry, storage_key
from .vulkan_device import Buffer, Device, VulkanError


#: Seconds the host waits for one call's command buffer before it reports a hang.
WAIT_SECONDS = 600


def torch_module():
    import torch

    return torch


def _host_view(mapped, t, nbytes: int):
    """A tensor over the first nbytes of mapped memory, of t's dtype and shape (dense)."""
    torch = torch_module()
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
        self.launches: list[tuple[KernelABI, bytes, list[Buffer]]] = []
        self.copies: list[tuple[Buffer, Buffer, int]] = []  # staging -> device, before the kernels
        self.reads_back: list[tuple[Buffer, Buffer | None, int, object]] = []  # (device, staging, n, sink)
        self.results: dict[Buffer, bytes] = {}
        self._owned: list[Buffer] = []  # freed at the end
        self._pinned: list[Entry] = []  # unpinned at the end
        self._new: list[Entry] = []  # entries this call's uploads fill: ready once submitted
        self._outputs: list[tuple[object, tuple, Buffer, int]] = []  # (tensor, key, buffer, bytes)
        self._reads: dict[tuple, Buffer] = {}
        self._done = False

    # ---- what the call reads and writes -------------------------------------------------
    def read(self, t) -> Buffer:
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

    def write(self, t) -> Buffer:
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

    def update(self, t) -> Buffer:
        """A buffer holding t's values that the kernels may change: uploaded, and
        downloaded back into t (a launch's written arguments)."""
        b = self.write(t)
        self._upload(b, t, t.numel() * t.element_size())
        return b

    def scratch(self, nbytes: int, *, fill: bytes | None = None, read_back: bool = False) -> Buffer:
        """A buffer for this call only; with ``fill``, uploaded from those bytes; with
        ``read_back``, its first nbytes in ``results[buffer]`` after ``finish()``."""
        self._check_range(nbytes)
        b = self.dev.buffer(nbytes)
        self._owned.append(b)
        if fill is not None:
            torch = torch_module()
            data = torch.frombuffer(bytearray(fill), dtype=torch.uint8) if fill else torch.empty(0, dtype=torch.uint8)
            self._upload(b, data, len(fill), count=False)
        if read_back and nbytes:
            self._read_back(b, nbytes, None)
        return b

    def dispatch(self, kernel: KernelABI, spirv: bytes, buffers: Sequence[Buffer]) -> None:
        self.dev.require(kernel)
        most = self.dev.limits.get("max_storage_buffers", 0)
        if most and len(buffers) > most:  # past it the driver's behaviour is undefined (lavapipe crashes)
            raise VulkanError(f"kernel {kernel.entry} binds {len(buffers)} storage buffers; {self.dev.name} binds "
                              f"at most {most} to one kernel")
        self.launches.append((kernel, spirv, list(buffers)))

    # ---- transfers ---------------------------------------------------------------------
    def _check_range(self, nbytes: int) -> None:
        limit = self.dev.limits["max_storage_buffer_range"]
        if nbytes > limit:
            raise VulkanError(f"a {nbytes}-byte tensor is larger than {self.dev.name}'s largest storage buffer "
                              f"({limit} bytes)")

    def _upload(self, b: Buffer, t, nbytes: int, count: bool = True) -> None:
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

    def _read_back(self, b: Buffer, nbytes: int, sink) -> None:
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
                wait_fence(dev, fence)
                waited = True
            else:
                for e in self._new:  # written straight into mapped buffers
                    e.ready = True
            torch = torch_module()
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


def wait_fence(dev: Device, fence) -> None:
    """Wait for a call's fence (no lock held: other threads record and submit meanwhile)."""
    vk = dev.vk
    try:
        dev.check(vk.vkWaitForFences, dev.handle, 1, [fence], vk.VK_TRUE, WAIT_SECONDS * 10 ** 9)
    except VulkanError as e:
        raise VulkanError(f"{e} (waiting up to {WAIT_SECONDS} s for a call's kernels)") from None
