"""Loading a compiled program from its cache folder and running it: one launcher per
target, over the ProgramABI's buffers (inputs, constants, outputs, temporaries).

Nothing here imports mlir or the compiler: a cache hit runs from program.json and the
artifacts alone.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Sequence

import torch

from .abi import ELEM_INFO, ProgramABI, TensorArg


def _dtype(elem: str) -> torch.dtype:
    return getattr(torch, ELEM_INFO[elem][0])


#: The alignment in bytes that kf's kernels assume of every buffer (torch's allocator
#: gives at least 256; only views at an offset fall short).
ALIGNMENT = 16


def _output_allocator():
    """(alloc, current_device) for the fast lane's outputs: ``alloc(shape, stride, dtype)``
    makes an uninitialized tensor on the current CUDA device, which ``current_device()``
    names. torch._C._dynamo.guards._empty_strided_cuda (what torch.compile's generated
    code allocates with) where this torch has it; elsewhere current_device() answers None,
    which no tensor's device index equals, so every call takes torch.empty."""
    alloc = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_empty_strided_cuda", None)
    current = getattr(torch._C, "_cuda_getDevice", None)
    if alloc is None or current is None:
        return None, lambda: None
    return alloc, current


#: The most buffers a C lane takes (kf.runtime._launcher.STACK_PARAMS).
STACK_PARAMS = 64

#: Where each temporary starts in a lane's one allocation of them: a multiple of the
#: caching allocator's own alignment, so a kernel sees what torch.empty would give it.
TEMP_ALIGNMENT = 256


def _c_lane_type():
    """kf.runtime._launcher.Lane, or None: not built, or KF_DISPATCH=python (which keeps a
    call's whole dispatch in Python, compiler/api.py)."""
    if os.environ.get("KF_DISPATCH", "auto").strip().lower() == "python":
        return None
    try:
        from . import _launcher
    except ImportError:
        return None
    return getattr(_launcher, "Lane", None)


class LaunchError(TypeError):
    """The tensors of a call do not fit the compiled program."""


def _constants(meta: dict, directory: str) -> list[torch.Tensor]:
    out = []
    path = os.path.join(directory, "constants.bin")
    data = open(path, "rb").read() if meta.get("constants") else b""
    for c in meta.get("constants", []):
        raw = bytearray(data[c["offset"]:c["offset"] + c["nbytes"]])
        t = torch.frombuffer(raw, dtype=torch.uint8).view(_dtype(c["elem"])).reshape(c["shape"]) \
            if c["nbytes"] else torch.empty(c["shape"], dtype=_dtype(c["elem"]))
        out.append(t.clone())
    return out


class _Program:
    def __init__(self, abi: ProgramABI, directory: str, meta: dict, device: str):
        self.abi = abi
        self.directory = directory
        self.n_user = len(abi.inputs) - len(meta.get("constants", []))
        self.constants = [c.to(device) for c in _constants(meta, directory)]
        self.repeats = meta.get("repeats", [-1] * len(abi.outputs))

    def _check(self, inputs: Sequence[torch.Tensor], device_type: str, dense: bool = True) -> list[torch.Tensor]:
        """The call's tensors checked against the program, and its constants after them;
        with ``dense``, views made contiguous and 16-byte aligned (the kernels read the
        tensors' own memory), else as they are (the launcher copies them)."""
        if len(inputs) != self.n_user:
            raise LaunchError(f"the program takes {self.n_user} tensors, got {len(inputs)}")
        out = []
        for t, a in zip(inputs, self.abi.inputs):
            if t.device.type != device_type:
                raise LaunchError(f"'{a.name}' is on {t.device}; this program runs on {device_type} tensors")
            if (a.is_static and tuple(t.shape) != a.shape) or len(t.shape) != len(a.shape) or \
                    t.dtype != _dtype(a.elem):
                raise LaunchError(f"'{a.name}': compiled for {a.elem}{list(a.shape)}, got {t.dtype} {list(t.shape)}")
            if dense and not t.is_contiguous():
                t = t.contiguous()
            elif dense and t.data_ptr() % ALIGNMENT:
                # kf's kernels load 16 bytes at a time (kf-vectorize assumes 16-byte aligned
                # buffers); a view at an odd storage offset would fault: give it its own copy.
                t = t.clone()
            out.append(t)
        return out + self.constants

    def _finish(self, outs: list) -> tuple:
        for j, first in enumerate(self.repeats):
            if first >= 0:
                outs[j] = outs[first]
        return tuple(outs)


class CudaProgram(_Program):
    """Kernels launched in order on torch's current stream; outputs and temporaries are
    allocated with torch's caching allocator, so a call does no synchronization."""

    def __init__(self, abi: ProgramABI, directory: str, meta: dict):
        super().__init__(abi, directory, meta, "cuda")
        from . import cuda

        modules = {}
        buffers = list(abi.inputs) + list(abi.outputs) + list(abi.temporaries)
        if abi.index_sites:
            buffers.append(abi.flag_arg)
        self.kernels = []
        for k in abi.kernels:
            if k.artifact not in modules:
                with open(os.path.join(directory, k.artifact), "rb") as f:
                    modules[k.artifact] = cuda.CudaModule(f.read().decode())
            if k.sizes:  # run-time sizes: one more argument, the slots' buffer
                launcher = cuda.CudaKernel(modules[k.artifact], k.entry, k.grid, k.block, k.shared_bytes,
                                           len(k.args) + 1, validate=False)
            else:
                launcher = cuda.CudaKernel.from_abi(k, buffers, modules[k.artifact], validate=False)
            self.kernels.append((launcher, k.args))
        self._alloc = None  # (shape, dtype) of outputs and temporaries, made on first use
        self._replay_flag = None  # the index error flag that captured CUDA graphs write
        self._slot_buffers: dict = {}  # (size slots, device) -> (pinned host copy, device buffer)
        self._flags = threading.local()  # each thread's index error flag (.word)

    def __call__(self, *inputs: torch.Tensor, events: list | None = None) -> tuple:
        """Launch the kernels; with ``events`` (the profiler's hook), each kernel is
        bracketed by CUDA events on the current stream and ``(entry, start, end)`` is
        appended: read ``start.elapsed_time(end)`` after synchronizing."""
        return self._run(self._check(inputs, "cuda"), events)

    def unchecked(self, *inputs: torch.Tensor) -> tuple:
        """As a call, for tensors whose shapes, dtypes and device the caller has already
        matched to the program (kf's dispatch key holds them): only the layout (views
        made contiguous and aligned, as a call does) is seen to."""
        ins = list(inputs)
        for i, t in enumerate(ins):
            if not t.is_contiguous():
                ins[i] = t.contiguous()
            elif t.data_ptr() % ALIGNMENT:
                ins[i] = t.clone()
        return self._run(ins + self.constants, None)

    def _lane_plan(self, shapes: tuple | None = None, device: torch.device | None = None):
        """(kernels as (kernel, buffer order, grid), outputs as (shape, stride, dtype),
        temporaries as (bytes, offsets), constant buffers as tensors) of a program that a
        fast lane can run, or None (see fast_lane; a program of no kernels, empty
        results, has nothing to hurry). A program with run-time sizes has a plan for the
        input ``shapes`` of one call signature on ``device``: its outputs' shapes, each
        kernel's grid and the device buffer of its size slots (its last argument, a
        constant buffer of the lane) are those of ``ProgramABI.sized_call``."""
        abi = self.abi
        if not abi.inputs or not self.kernels or self.constants or abi.index_sites or \
                any(map(abi.unwritten, range(len(abi.outputs)))) or \
                any(r >= 0 for r in self.repeats) or any(k.validate for k, _ in self.kernels):
            return None  # (a validating kernel has no launch_pointers)
        n_buffers = len(abi.inputs) + len(abi.outputs) + len(abi.temporaries)
        if abi.is_static:
            out_shapes = [tuple(a.shape) for a in abi.outputs]
            temp_bytes = [t.nbytes for t in abi.temporaries]
            kernels, constants = [(k, tuple(args), None) for k, args in self.kernels], ()
        else:
            call = abi.sized_call(tuple(shapes)) if shapes is not None and device is not None else "no shapes"
            if isinstance(call, str):
                return None
            out_shapes = list(call.outputs)
            temp_bytes = [math.prod(shape) * _dtype(t.elem).itemsize
                          for shape, t in zip(call.temporaries, abi.temporaries)]
            kernels, constants = [], []
            for (k, args), sized in zip(self.kernels, call.launches):
                if sized is None:
                    kernels.append((k, tuple(args), None))
                    continue
                grid, slots = sized
                kernels.append((k, tuple(args) + (n_buffers + len(constants),), tuple(grid)))
                constants.append(self._slot_buffer(slots, device))
            constants = tuple(constants)
        outputs = tuple((shape, torch.empty(shape, device="meta").stride(), _dtype(a.elem))
                        for shape, a in zip(out_shapes, abi.outputs))
        offsets, size = [], 0
        for nbytes in temp_bytes:
            offsets.append(size)
            size += -(-nbytes // TEMP_ALIGNMENT) * TEMP_ALIGNMENT
        return kernels, outputs, (size, tuple(offsets)), constants

    def fast_lane(self, shapes: tuple | None = None, device: torch.device | None = None):
        """One function for the common call, or None: a program with no constants,
        aliased or repeated outputs, called with tensors that kf's dispatch key has
        matched and found contiguous. It allocates the outputs, and the temporaries in
        one allocation, checks the 16-byte alignment the kernels assume (a view at an
        offset goes the general way) and launches the kernels in order, with none of the
        general path's layers (bench/host_profile.py: each was a microsecond or two of a
        ~17 us call; a program of a dozen kernels spent ~3 us a kernel there).

        Everything that does not depend on the call's tensors is worked out here, once
        per call signature: the outputs' shapes, strides and dtypes, the temporaries'
        offsets, whether a single kernel takes the buffers in their own order (inputs,
        then outputs: kf-to-cuda's convention, so the pointer list goes to the launch as
        it is built). Outputs on the current CUDA device come from
        ``_empty_strided_cuda``, the allocation torch.compile's generated code makes:
        the same caching allocator as ``torch.empty`` without its argument parsing and
        dispatch, a microsecond per output (torch.empty also fills with NaN under
        torch's deterministic mode; the kernels write every element of an output, so
        nothing can read what it held). A program with run-time sizes has a lane for
        each call signature's input ``shapes`` and ``device``: its grids and size slots
        are worked out once (_lane_plan). ``c_lane`` is the same lane in C."""
        plan = self._lane_plan(shapes, device)
        if plan is None:
            return None
        kernels, outputs, (temp_bytes, offsets), constants = plan
        launches = [(k.pointer_launch(grid), order) for k, order, grid in kernels]
        fixed = [t.data_ptr() for t in constants]
        n_in = len(self.abi.inputs)
        empty, unchecked, uint8 = torch.empty, self.unchecked, torch.uint8
        alloc, current_device = _output_allocator()

        if len(launches) == 1 and launches[0][1] == tuple(range(n_in + 1)) and len(outputs) == 1 and not fixed:
            ((shape, stride, dtype),) = outputs
            launch = launches[0][0]

            def call(ins: list) -> list:
                ptrs = [t.data_ptr() for t in ins]
                for p in ptrs:
                    if p % ALIGNMENT:
                        return list(unchecked(*ins))
                dev = ins[0].get_device()
                if dev == current_device():
                    out = alloc(shape, stride, dtype)
                else:
                    out = empty(shape, dtype=dtype, device=ins[0].device)
                ptrs.append(out.data_ptr())
                launch(ptrs, dev)
                return [out]
        else:
            def call(ins: list) -> list:
                ptrs = [t.data_ptr() for t in ins]
                for p in ptrs:
                    if p % ALIGNMENT:
                        return list(unchecked(*ins))
                dev = ins[0].get_device()
                if dev == current_device():
                    outs = [alloc(shape, stride, dt) for shape, stride, dt in outputs]
                    temp = alloc((temp_bytes,), (1,), uint8) if offsets else None
                else:
                    where = ins[0].device
                    outs = [empty(shape, dtype=dt, device=where) for shape, _, dt in outputs]
                    temp = empty(temp_bytes, dtype=uint8, device=where) if offsets else None
                ptrs += [t.data_ptr() for t in outs]
                if temp is not None:
                    base = temp.data_ptr()
                    ptrs += [base + o for o in offsets]
                ptrs += fixed
                for launch, order in launches:
                    launch([ptrs[i] for i in order], dev)
                return outs

        call.n_in = n_in
        call.constants = constants  # the size slots' buffers live as long as the lane
        return call

    def c_lane(self, slow, first: int = -1, tree=None, unflatten=None, profile_globals=None, profile_name=None,
               profiler_enabled=None, program=None, shapes: tuple | None = None,
               device: torch.device | None = None):
        """The fast lane and its caller's wrapper in one C object (kf.runtime._launcher.Lane),
        or None where there is none: no fast lane for this program, launches not through
        the compiled launcher (cuda.bindings, KF_CUDA_SYNC=1), KF_DISPATCH=python, or no
        ``_empty_strided_cuda`` in this torch. Called with the list of a matched call's
        tensors it returns the call's result: output ``first`` or ``unflatten(tree,
        outputs)``. What it does not do itself goes to ``slow(tensors)``, the Python
        lane it replaces: a profiler recording (``profile_globals[profile_name]`` not
        None, or ``profiler_enabled()``), a pointer not 16-byte aligned, tensors on
        another than the current device, a device a kernel is not bound on yet (the
        program's first call binds them). ``shapes`` and ``device``: those of the call
        signature, for a program with run-time sizes (fast_lane)."""
        from . import cuda

        lane_type = _c_lane_type()
        if lane_type is None or cuda._c_launch is None:
            return None
        plan = self._lane_plan(shapes, device)
        if plan is None:
            return None
        kernels, outputs, (temp_bytes, offsets), constants = plan
        alloc, current_device = _output_allocator()
        n_buffers = len(self.abi.inputs) + len(outputs) + len(offsets) + len(constants)
        if alloc is None or any(k._sync for k, _, _ in kernels) or n_buffers > STACK_PARAMS or \
                len(kernels) > STACK_PARAMS or any(len(order) > STACK_PARAMS for _, order, _ in kernels):
            return None
        specs = tuple((k._handles, grid or k.grid, k.block, k.shared_bytes, order, k._launch_failed)
                      for k, order, grid in kernels)
        temporaries = (((temp_bytes,), (1,), torch.uint8), offsets) if offsets else None
        return lane_type(specs, len(self.abi.inputs), outputs, alloc, current_device, cuda._raw_stream_getter(),
                         slow, first, tree, unflatten, profile_globals, profile_name, profiler_enabled, program,
                         ALIGNMENT, temporaries, constants)

    def _run(self, ins: list, events: list | None) -> tuple:
        dev = ins[0].device if ins else torch.device("cuda")
        if not self.abi.is_static:
            return self._run_sized(ins, dev)
        if self._alloc is None:
            self._alloc = ([(tuple(a.shape), _dtype(a.elem)) for a in self.abi.outputs],
                           [(tuple(a.shape), _dtype(a.elem)) for a in self.abi.temporaries])
        outs = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in self._alloc[0]]
        temps = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in self._alloc[1]]
        bufs = ins + outs + temps
        flag, capturing = None, False
        if self.abi.index_sites:
            capturing = torch.cuda.is_current_stream_capturing()
            flag = self._flag(capturing)
            bufs.append(flag)
        if events is None:
            for kernel, args in self.kernels:
                kernel(*[bufs[i] for i in args])
        else:
            for kernel, args in self.kernels:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                kernel(*[bufs[i] for i in args])
                end.record()
                events.append((kernel.entry, start, end))
        if flag is not None and not capturing:
            self._check_flag(flag, dev)
        return self._finish(self.abi.take_inputs(ins, outs))

    def _run_sized(self, ins: list, dev) -> tuple:
        """A call of a program with run-time sizes: the inputs' shapes give the symbols,
        which give the outputs' shapes and each kernel's grid and size slots (a buffer of
        int32 on the device, its last argument), all kept per input shapes
        (ProgramABI.sized_call)."""
        abi = self.abi
        call = abi.sized_call(tuple(tuple(t.shape) for t in ins))
        if isinstance(call, str):
            raise LaunchError(call)
        outs = [torch.empty(shape, dtype=_dtype(a.elem), device=dev) for shape, a in zip(call.outputs, abi.outputs)]
        temps = [torch.empty(shape, dtype=_dtype(a.elem), device=dev)
                 for shape, a in zip(call.temporaries, abi.temporaries)]
        bufs = ins + outs + temps
        flag, capturing = None, False
        if abi.index_sites:
            capturing = torch.cuda.is_current_stream_capturing()
            flag = self._flag(capturing)
            bufs.append(flag)
        for (kernel, args), sized in zip(self.kernels, call.launches):
            tensors = [bufs[i] for i in args]
            if sized is not None:
                grid, slots = sized
                tensors.append(self._slot_buffer(slots, dev))
                kernel(*tensors, grid=grid)
            else:
                kernel(*tensors)
        if flag is not None and not capturing:
            self._check_flag(flag, dev)
        return self._finish(abi.take_inputs(ins, outs))

    def _slot_buffer(self, slots: Sequence[int], dev) -> torch.Tensor:
        """The device buffer of a kernel's size slots, made once for each set of sizes
        and kept: a loop that meets a length again copies nothing to the device. It is
        copied from pinned memory, which a CUDA graph capture allows (a pageable copy it
        does not); the newest 256 are kept."""
        key = (tuple(slots), dev)
        pair = self._slot_buffers.get(key)
        if pair is None:
            host = torch.tensor(slots, dtype=torch.int32).pin_memory()
            pair = (host, host.to(dev, non_blocking=True))
            if len(self._slot_buffers) >= 256:
                self._slot_buffers.pop(next(iter(self._slot_buffers)))
            self._slot_buffers[key] = pair
        return pair[1]

    def _flag(self, capturing: bool) -> torch.Tensor:
        """The index error flag for one call: pinned host memory, which kernels write
        directly (a pinned allocation's address is valid on the device under unified
        addressing), so neither a memset launch nor a copy back is needed. Each thread
        has its own, made once: kernels only set it, and the call that reads it set
        clears it. Under a CUDA graph capture it is the program's own, kept for the
        graph's replays."""
        if self._replay_flag is None:  # made outside a capture, where the first call runs
            self._replay_flag = torch.zeros(self.abi.flag_arg.shape, dtype=torch.int32, pin_memory=True)
        if capturing:
            return self._replay_flag
        flag = getattr(self._flags, "word", None)
        if flag is None:
            flag = self._flags.word = torch.zeros(self.abi.flag_arg.shape, dtype=torch.int32, pin_memory=True)
        return flag

    def _check_flag(self, flag: torch.Tensor, dev) -> None:
        """Wait for the call's kernels and raise IndexOutOfRange when one saw a bad
        index. This is the price of the check on CUDA: a call of a program that indexes
        waits for its stream (torch's own index kernels assert on the device instead,
        which kills the CUDA context). A replay of a captured graph cannot wait: its
        flag is read here, at the program's next call outside a capture."""
        torch.cuda.current_stream(dev).synchronize()
        if flag[0].item():
            words = flag.tolist()
            flag.zero_()
            self.abi.raise_index_error(words)
        replay = self._replay_flag
        if replay[0].item():
            words = replay.tolist()
            replay.zero_()
            try:
                self.abi.raise_index_error(words)
            except IndexError as e:
                raise type(e)(f"{e}, in a replay of a CUDA graph that captured this function") from None


class VulkanProgram(_Program):
    """Runs on the Vulkan device (lavapipe in CI) over CPU tensors, one submission per call.
    Views are handed to the launcher as they are: it copies them into device buffers
    anyway, and keyed by their own storage they stay resident between calls."""

    def __init__(self, abi: ProgramABI, directory: str, meta: dict):
        super().__init__(abi, directory, meta, "cpu")
        self.binaries = {}
        for k in abi.kernels:
            if k.artifact not in self.binaries:
                with open(os.path.join(directory, k.artifact), "rb") as f:
                    self.binaries[k.artifact] = f.read()

    def __call__(self, *inputs: torch.Tensor, timings: list | None = None) -> tuple:
        from . import vulkan

        return self._finish(list(vulkan.run_program(self.abi, self.binaries, self._check(inputs, "cpu", False),
                                                    timings=timings)))


class MetalProgram(_Program):
    """Runs the MSL kernels on Apple GPUs through torch.mps."""

    def __init__(self, abi: ProgramABI, directory: str, meta: dict):
        super().__init__(abi, directory, meta, "mps")
        self.sources = {}
        for k in abi.kernels:
            with open(os.path.join(directory, k.artifact)) as f:
                self.sources[k.artifact] = f.read()

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        from . import metal

        return self._finish(list(metal.run_program(self.abi, self.sources, self._check(inputs, "mps"))))


def load(abi: ProgramABI, directory: str, meta: dict):
    """The launcher of a program of any target."""
    if abi.target == "cpu":
        from . import cpu

        return cpu.load(abi, directory)
    if abi.target == "cuda":
        return CudaProgram(abi, directory, meta)
    if abi.target == "vulkan":
        return VulkanProgram(abi, directory, meta)
    if abi.target == "metal":
        from . import metal

        if not metal.is_available():
            raise metal.MetalUnavailable("Metal runs on macOS with an Apple GPU (torch.backends.mps); the MSL "
                                         "is in the cache folder and in kf.inspect(...).msl")
        return MetalProgram(abi, directory, meta)
    raise LaunchError(f"no launcher for target '{abi.target}'")


__all__ = ["CudaProgram", "LaunchError", "MetalProgram", "VulkanProgram", "load", "TensorArg"]
