"""Launch kf's PTX (or cubin) kernels on torch CUDA tensors through the CUDA driver API
(``cuda.bindings.driver``), on torch's current stream.

What the compiler hands over is runtime/abi.py's KernelABI (entry, argument buffers,
grid, block, dynamic shared bytes) plus the PTX text that kf-to-cuda made; this module
never imports mlir or kf.passes, so a cached kernel launches in a process that has no
compiler.

The launch path is short because it runs on every call:

- the module is loaded (``cuModuleLoadData``) and the function looked up once per
  context; kf launches in the primary context of the tensors' device, which is the one
  torch uses, so the per-call lookup is one dict access by device index;
- the launch itself goes through kf's compiled launcher, ``kf.runtime._launcher``
  (runtime/_launcher*.c, built by ``pip install``): one C function that takes the
  CUfunction's address, grid, block, shared bytes, torch's raw stream and the device
  pointers as plain ints, builds the ``void**`` parameter array on its stack and calls
  cuLaunchKernel. cuda.bindings' own cuLaunchKernel wrapper spends microseconds per call
  converting its arguments, the largest part of a small kernel's host time; Triton
  launches through a generated C extension for the same reason. Where the extension was
  not built (no C compiler at install time), or ``KF_CUDA_LAUNCHER=bindings`` asks for it
  (to compare the two), launches go through cuda.bindings as before: the ``void**``
  array is then built once per kernel, a ctypes array of N 64-bit slots and an array of
  N pointers to them, and a call only writes the tensors' device addresses into the
  slots, so cuda.bindings does no per-call marshalling of the arguments (its tuple form
  builds ctypes objects each time). Loading modules, looking functions up and naming
  errors always go through cuda.bindings: they are not on the per-call path;
- with the compiled launcher, a program's whole fast lane runs in C as well
  (``CudaProgram.c_lane``, the extension's ``Lane``: outputs and one allocation of the
  temporaries from ``_empty_strided_cuda``, this module's raw stream, each kernel's
  function address from its ``CudaKernel._handles``, which ``_bind`` fills), called
  straight from kf's C dispatch (compiler/api.py);
  ``KF_DISPATCH=python`` keeps the lane and the dispatch in Python to compare;
- no synchronization: errors that the launch itself reports (bad configuration, too much
  shared memory, a function from another context) raise at once; faults inside the kernel
  surface at torch's next synchronizing call, as they do for torch's own kernels. Set
  ``KF_CUDA_SYNC=1`` to synchronize and check after every launch while debugging.

Every CUresult is checked; a failure raises CudaError naming the kernel, the driver
call, the error's name and text and the launch configuration.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Sequence

from .abi import ELEM_INFO, KernelABI, TensorArg

try:
    from cuda.bindings import driver as _drv
except ImportError:  # cuda-python is an optional dependency (pip install kf[cuda])
    _drv = None

# Looked up once: attribute lookups through the bindings' module cost on every launch.
_launch = _drv.cuLaunchKernel if _drv is not None else None
_SUCCESS = _drv.CUresult.CUDA_SUCCESS if _drv is not None else 0


def _choose_launcher():
    """(the compiled launcher's launch function or None, which launcher in words)."""
    choice = os.environ.get("KF_CUDA_LAUNCHER", "auto").strip().lower() or "auto"
    if choice not in ("auto", "c", "bindings"):
        raise ValueError(f"KF_CUDA_LAUNCHER={choice!r}: expected 'auto' (the default), 'c' or 'bindings'")
    if choice == "bindings":
        return None, "cuda.bindings (KF_CUDA_LAUNCHER=bindings)"
    try:
        from . import _launcher
    except ImportError as e:
        if choice == "c":
            raise ImportError(f"KF_CUDA_LAUNCHER=c, but kf's compiled launcher kf.runtime._launcher does not "
                              f"import ({e}); reinstall kf with a C compiler and Python's headers "
                              f"(pip install -e .)") from e
        return None, f"cuda.bindings (kf.runtime._launcher is not built: {e})"
    return _launcher.launch, f"C (kf.runtime._launcher, {os.path.basename(_launcher.__file__)})"


#: kf.runtime._launcher.launch, or None where launches go through cuda.bindings.
_c_launch, LAUNCHER = _choose_launcher()
_c_driver_loaded = False


def launcher() -> str:
    """Which launcher kf's CUDA launches go through, in words (bench/host_profile.py)."""
    return LAUNCHER


def _load_c_driver(kernel: str) -> None:
    """Open libcuda for the compiled launcher once, at the first bind rather than inside
    a launch, so a driver it cannot find is reported as what it is."""
    global _c_driver_loaded
    if _c_driver_loaded:
        return
    from . import _launcher

    try:
        _launcher.load_driver()
    except OSError as e:
        raise CudaError(kernel, "load libcuda.so.1 for kf.runtime._launcher",
                        detail=f"{e}; KF_CUDA_LAUNCHER=bindings launches through cuda.bindings instead") from None
    _c_driver_loaded = True


def _raw_stream_getter():
    """``device -> raw CUstream`` of torch's current stream there, as an int.
    torch._C._cuda_getCurrentRawStream(device) is the int that
    torch.cuda.current_stream(device).cuda_stream returns, without building a Stream
    object per call (Triton's launcher uses it the same way)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw or (lambda d: torch.cuda.current_stream(d).cuda_stream)


#: Above this many bytes of dynamic shared memory a kernel must opt in with
#: cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
DEFAULT_SHARED_LIMIT = 48 * 1024


class CudaError(RuntimeError):
    """A CUDA driver call failed for a kf kernel."""

    def __init__(self, kernel: str, call: str, code=None, detail: str = ""):
        self.kernel, self.call, self.code = kernel, call, code
        if code is not None:
            name, text = _error_text(code)
            what = f"{call} failed: {name} ({text})"
        else:
            what = f"{call} failed"
        super().__init__(f"kf kernel '{kernel}': {what}" + (f"; {detail}" if detail else ""))


def _error_text(code) -> tuple[str, str]:
    name, text = getattr(code, "name", str(code)), ""
    try:
        err, s = _drv.cuGetErrorString(code)
        if err == _drv.CUresult.CUDA_SUCCESS and s:
            text = s.decode()
    except Exception:  # the driver itself may be what is missing
        pass
    return name, text or "no description"


def _need_driver(kernel: str) -> None:
    if _drv is None:
        raise CudaError(kernel, "import cuda.bindings.driver",
                        detail="cuda-python is not installed: pip install cuda-python")


def _result_code(err: int):
    """The CUresult enum member of an int the compiled launcher returned (its name goes
    into CudaError), or the int itself where the bindings do not know it."""
    try:
        return _drv.CUresult(err)
    except Exception:
        return err


def _check(result, kernel: str, call: str, detail: str = ""):
    """Unpack a cuda.bindings result tuple, raising CudaError unless it is CUDA_SUCCESS."""
    err = result[0]
    if err != _drv.CUresult.CUDA_SUCCESS:
        raise CudaError(kernel, call, err, detail)
    return result[1] if len(result) == 2 else result[1:]


def _current_context(device: int, kernel: str):
    """The primary context of ``device``, made current on this thread (it is torch's)."""
    try:
        ctx = _check(_drv.cuCtxGetCurrent(), kernel, "cuCtxGetCurrent")
    except Exception as e:
        if isinstance(e, CudaError):
            raise
        raise CudaError(kernel, "load the CUDA driver", detail=str(e)) from None
    dev = _check(_drv.cuDeviceGet(device), kernel, "cuDeviceGet", f"device {device}")
    primary = _check(_drv.cuDevicePrimaryCtxRetain(dev), kernel, "cuDevicePrimaryCtxRetain")
    if int(ctx) != int(primary):
        _check(_drv.cuCtxSetCurrent(primary), kernel, "cuCtxSetCurrent")
    return primary


class CudaModule:
    """A PTX (str, or NUL-terminated bytes) or cubin image, loaded lazily into each
    context that launches from it and kept there for the life of the process."""

    def __init__(self, image: str | bytes, name: str = "kf_kernels"):
        if isinstance(image, str):
            image = image.encode()
        if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
            image += b"\0"  # PTX must be NUL-terminated for cuModuleLoadData
        self.image = image
        # Handed to the driver by address: cuda.bindings then takes it as a plain void*.
        self._buffer = ctypes.create_string_buffer(image, len(image))
        self.name = name
        self._loaded: dict[int, object] = {}  # context handle -> CUmodule

    def handle(self, context, kernel: str = ""):
        """The CUmodule in ``context`` (current on this thread), loading it the first time."""
        key = int(context)
        mod = self._loaded.get(key)
        if mod is None:
            kind = "cubin" if self.image.startswith(b"\x7fELF") else "PTX"
            mod = _check(_drv.cuModuleLoadData(ctypes.addressof(self._buffer)), kernel or self.name, "cuModuleLoadData",
                         f"module '{self.name}' ({len(self.image)} bytes of {kind})")
            self._loaded[key] = mod
        return mod

    def kernel(self, entry: str, grid: Sequence[int], block: Sequence[int], shared_bytes: int = 0,
               args: Sequence[TensorArg] | int = 0, validate: bool = True) -> "CudaKernel":
        return CudaKernel(self, entry, grid, block, shared_bytes, args, validate)


@dataclass(frozen=True)
class _Bound:
    function: object  # CUfunction in the device's primary context
    handle: int  # its address: what the compiled launcher takes


class CudaKernel:
    """One kernel entry with a fixed launch configuration; call it with torch tensors
    (inputs then outputs, one device pointer each: the bare-pointer convention).

    ``args`` is either the kernel's TensorArgs (then, with ``validate``, each call checks
    device, dtype, shape and contiguity of every tensor: a wrong tensor is a silent
    out-of-bounds access otherwise) or just the number of pointer arguments.

    Through cuda.bindings (no compiled launcher) it is not safe to call from two threads
    at once: the parameter slots are shared. The compiled launcher keeps its parameter
    array on the C stack of each call.
    """

    def __init__(self, module: CudaModule, entry: str, grid: Sequence[int], block: Sequence[int],
                 shared_bytes: int = 0, args: Sequence[TensorArg] | int = 0, validate: bool = True):
        self.module, self.entry = module, entry
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.shared_bytes = int(shared_bytes)
        if isinstance(args, int):
            self.args: tuple[TensorArg, ...] = ()
            self.nargs = args
        else:
            self.args = tuple(args)
            self.nargs = len(self.args)
        self.validate = validate and bool(self.args)
        self._expect = None  # (torch dtype, shape) per argument, filled on first bind (needs torch)
        # The parameter array: slots hold the device pointers, params[i] points at slot i.
        self._slots = (ctypes.c_uint64 * max(self.nargs, 1))()
        base = ctypes.addressof(self._slots)
        self._params = (ctypes.c_void_p * max(self.nargs, 1))(*[base + 8 * i for i in range(max(self.nargs, 1))])
        self._params_addr = ctypes.addressof(self._params)
        self._bound: dict[int, _Bound] = {}  # torch device index -> function
        self._handles: dict[int, int] = {}  # torch device index -> CUfunction address (compiled launcher)
        self._streams: dict[int, object] = {}  # raw stream handle -> CUstream
        self._sync = os.environ.get("KF_CUDA_SYNC", "") not in ("", "0")
        self._raw_stream = None

    @classmethod
    def from_abi(cls, abi: KernelABI, buffers: Sequence[TensorArg], image: str | bytes | CudaModule,
                 validate: bool = True) -> "CudaKernel":
        """The launcher for a KernelABI; ``buffers`` are the program's buffers (inputs,
        outputs, temporaries) that ``abi.args`` index into. Call it with the tensors in
        kernel-argument order, ``[program_tensors[i] for i in abi.args]``."""
        module = image if isinstance(image, CudaModule) else CudaModule(image)
        return cls(module, abi.entry, abi.grid, abi.block, abi.shared_bytes,
                   [buffers[i] for i in abi.args], validate)

    # ------------------------------------------------------------------ binding (slow path)

    def _bind(self, device: int) -> _Bound:
        _need_driver(self.entry)
        import torch

        if self._raw_stream is None:
            self._raw_stream = _raw_stream_getter()
        if _c_launch is not None:
            _load_c_driver(self.entry)
        torch.cuda.init()
        ctx = _current_context(device, self.entry)
        mod = self.module.handle(ctx, self.entry)
        fn = _check(_drv.cuModuleGetFunction(mod, self.entry.encode()), self.entry, "cuModuleGetFunction",
                    f"no entry '{self.entry}' in module '{self.module.name}'")
        static = _check(_drv.cuFuncGetAttribute(_drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                        self.entry, "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
        if self.shared_bytes + static > DEFAULT_SHARED_LIMIT:
            dev = _check(_drv.cuDeviceGet(device), self.entry, "cuDeviceGet")
            optin = _check(_drv.cuDeviceGetAttribute(
                _drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                self.entry, "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
            if self.shared_bytes + static > optin:
                raise CudaError(self.entry, "check shared memory",
                                detail=f"{self.shared_bytes} dynamic + {static} static bytes of shared memory "
                                       f"exceed the device's {optin} bytes per block")
            _check(_drv.cuFuncSetAttribute(
                fn, _drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared_bytes),
                self.entry, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", f"{self.shared_bytes} bytes")
        if self.args and self._expect is None:
            self._expect = tuple((getattr(torch, ELEM_INFO[a.elem][0]), tuple(a.shape)) for a in self.args)
        bound = _Bound(fn, int(fn))
        self._bound[device] = bound
        self._handles[device] = bound.handle
        return bound

    def _stream(self, raw: int):
        s = self._streams.get(raw)
        if s is None:
            s = self._streams[raw] = _drv.CUstream(raw)
        return s

    # ------------------------------------------------------------------ launch (fast path)

    def __call__(self, *tensors, grid: Sequence[int] | None = None) -> None:
        """Launch on the tensors' device, on torch's current stream there, on ``grid``
        where given (a kernel with run-time sizes), else its own. Returns at once."""
        if len(tensors) != self.nargs:
            raise TypeError(f"kf kernel '{self.entry}' takes {self.nargs} tensors, got {len(tensors)}")
        device = tensors[0].get_device()
        bound = self._bound.get(device)
        if bound is None:
            if device < 0:
                raise TypeError(f"kf kernel '{self.entry}': argument 0 is not a CUDA tensor")
            bound = self._bind(device)
        if self.validate:
            self._check_args(tensors, device)
        g, b = grid or self.grid, self.block
        if _c_launch is not None:
            err = _c_launch(bound.handle, g[0], g[1], g[2], b[0], b[1], b[2], self.shared_bytes,
                            self._raw_stream(device), *[t.data_ptr() for t in tensors])
            if err:
                self._launch_failed(err)
        else:
            slots = self._slots
            for i, t in enumerate(tensors):
                slots[i] = t.data_ptr()
            err = _launch(bound.function, g[0], g[1], g[2], b[0], b[1], b[2], self.shared_bytes,
                          self._stream(self._raw_stream(device)), self._params_addr, 0)[0]
            if err != _SUCCESS:
                self._launch_failed(err)
        if self._sync:
            _check(_drv.cuCtxSynchronize(), self.entry, "cuCtxSynchronize (KF_CUDA_SYNC=1, after the launch)")

    @property
    def launch_pointers(self):
        """``launch(pointers, device)``: the launch of ``__call__`` for device pointers
        (a list of ints) that the caller has matched to the arguments already (a
        program's fast lane); None where each call validates its tensors."""
        return self.pointer_launch()

    def pointer_launch(self, grid: Sequence[int] | None = None):
        """``launch_pointers`` on ``grid`` where given (a kernel with run-time sizes, for
        the sizes of one call signature), else on the kernel's own."""
        if self.validate:
            return None
        g0, g1, g2 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid)) if grid is not None else self.grid
        b0, b1, b2 = self.block
        shared = self.shared_bytes
        sync = self._sync
        raw_stream = _raw_stream_getter()
        if _c_launch is not None:
            c_launch, handles = _c_launch, self._handles

            def launch(pointers, device: int) -> None:
                fn = handles.get(device)
                if fn is None:
                    fn = self._bind(device).handle
                err = c_launch(fn, g0, g1, g2, b0, b1, b2, shared, raw_stream(device), *pointers)
                if err:
                    self._launch_failed(err)
                if sync:
                    _check(_drv.cuCtxSynchronize(), self.entry, "cuCtxSynchronize (KF_CUDA_SYNC=1, after the launch)")

            return launch
        slots, params = self._slots, self._params_addr

        def launch(pointers, device: int) -> None:
            bound = self._bound.get(device)
            if bound is None:
                bound = self._bind(device)
            for i, p in enumerate(pointers):
                slots[i] = p
            err = _launch(bound.function, g0, g1, g2, b0, b1, b2, shared, self._stream(raw_stream(device)), params, 0)[0]
            if err != _SUCCESS:
                self._launch_failed(err)
            if sync:
                _check(_drv.cuCtxSynchronize(), self.entry, "cuCtxSynchronize (KF_CUDA_SYNC=1, after the launch)")

        return launch

    def _launch_failed(self, err) -> None:
        """Raise CudaError for a failed cuLaunchKernel (a CUresult, or the compiled
        launcher's int): the error's name and text are looked up only here."""
        if isinstance(err, int):
            err = _result_code(err)
        raise CudaError(self.entry, "cuLaunchKernel", err,
                        f"grid {self.grid}, block {self.block}, {self.shared_bytes} bytes of dynamic shared memory")

    def _check_args(self, tensors, device: int) -> None:
        for i, (t, (dtype, shape)) in enumerate(zip(tensors, self._expect)):
            if t.dtype != dtype or tuple(t.shape) != shape or t.get_device() != device or not t.is_contiguous():
                raise TypeError(
                    f"kf kernel '{self.entry}' argument {i} ('{self.args[i].name}'): expected a contiguous "
                    f"{dtype} tensor of shape {shape} on cuda:{device}, got {t.dtype} {tuple(t.shape)} on "
                    f"{t.device}{'' if t.is_contiguous() else ', not contiguous'}")
