"""Metal launcher: runs kf-to-metal's MSL on torch MPS tensors through
``torch.mps.compile_shader`` (macOS only; elsewhere every entry raises MetalUnavailable).

Like every launcher it takes only the artifact (MSL text) and the ABI of runtime/abi.py,
never mlir. kf-to-metal binds kernel argument i at ``[[buffer(i)]]``, which is how
``torch.mps.compile_shader`` binds positional tensor arguments, so tensors are passed in
kernel-argument order. torch dispatches with ``dispatchThreads``: ``threads`` is the grid
in threads (grid * block, always a whole number of threadgroups here) and ``group_size``
the threadgroup size, which must equal the SPIR-V workgroup size the MSL was made for.
bf16 tensors go in unchanged (the MSL reads them as ushort and converts).

This cannot run on the Linux machines kf is developed on: codegen is tested there, and
the execution test skips with the reason.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import Mapping, Sequence

from .abi import ELEM_INFO, KernelABI, ProgramABI


class MetalError(RuntimeError):
    """A Metal launch does not fit its ABI, or the shader does not compile."""


class MetalUnavailable(MetalError):
    """Not macOS, or torch has no MPS device."""


_LIBS: dict[str, object] = {}
_LOCK = threading.Lock()


def _torch_mps():
    if sys.platform != "darwin":
        raise MetalUnavailable(f"Metal kernels run only on macOS (this is {sys.platform}); kf-to-metal's MSL can "
                               f"still be generated here, and the same SPIR-V runs on Vulkan (kf.runtime.vulkan)")
    import torch

    if not (hasattr(torch, "mps") and torch.backends.mps.is_available()):
        raise MetalUnavailable("torch.backends.mps is not available (a macOS 12.3+ machine with a Metal GPU and an "
                               "MPS build of torch are needed)")
    if not hasattr(torch.mps, "compile_shader"):
        raise MetalUnavailable(f"torch {torch.__version__} has no torch.mps.compile_shader (torch >= 2.6 needed)")
    return torch


def is_available() -> bool:
    try:
        _torch_mps()
        return True
    except MetalUnavailable:
        return False


def library(msl: str):
    """The compiled shader library for an MSL source, cached by its hash."""
    torch = _torch_mps()
    key = hashlib.sha256(msl.encode()).hexdigest()
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            try:
                lib = torch.mps.compile_shader(msl)
            except Exception as e:  # the Metal compiler's message names the MSL line
                raise MetalError(f"the Metal compiler rejected the MSL: {e}") from None
            _LIBS[key] = lib
    return lib


def launch(msl: str, kernel: KernelABI, args: Sequence, grid: Sequence[int] | None = None) -> None:
    """Run one kernel on MPS tensors given in kernel-argument order, on ``grid`` where
    given (a kernel with run-time sizes), else its own; results land in place."""
    torch = _torch_mps()
    layout = kernel.extra.get("spirv_bindings")
    if layout is not None and len(layout) != len(args):
        raise MetalError(f"kernel {kernel.entry} takes {len(layout)} buffers, got {len(args)} tensors")
    for i, t in enumerate(args):
        if not isinstance(t, torch.Tensor) or t.device.type != "mps":
            raise MetalError(f"argument {i} of {kernel.entry} must be an MPS tensor")
        if not t.is_contiguous():
            raise MetalError(f"argument {i} of {kernel.entry} is not contiguous")
        if layout is not None and t.dtype != getattr(torch, ELEM_INFO[layout[i]["elem"]][0]):
            raise MetalError(f"argument {i} of {kernel.entry} is {t.dtype}; compiled for {layout[i]['elem']}")
    if kernel.extra.get("subgroup_size", 0) not in (0, 32):  # Apple GPUs' SIMD groups are 32 wide
        raise MetalError(f"kernel {kernel.entry} was compiled for subgroup size {kernel.extra['subgroup_size']}; "
                         f"Apple GPUs have 32")
    block = tuple(kernel.extra.get("threadgroup_size", kernel.block))
    fn = getattr(library(msl), kernel.extra.get("msl_function", kernel.entry))
    threads = [g * b for g, b in zip(grid or kernel.grid, block)]
    fn(*args, threads=threads, group_size=list(block))


def run_program(abi: ProgramABI, sources: Mapping[str, str], inputs: Sequence) -> tuple:
    """Run a program's kernels in order on MPS tensors; sources maps KernelABI.artifact to
    MSL. A program with run-time sizes (the Vulkan target's SPIR-V, cross-compiled) takes
    its outputs' shapes and each sized kernel's grid from the inputs' shapes
    (ProgramABI.sized_call), and the kernel's size slots as a buffer of int32, its last
    argument, as the Vulkan launcher passes them."""
    torch = _torch_mps()
    sized = None
    if not abi.is_static:
        sized = abi.sized_call(tuple(tuple(t.shape) for t in inputs))
        if isinstance(sized, str):
            raise MetalError(sized)
    out_shapes = sized.outputs if sized else [a.shape for a in abi.outputs]
    temp_shapes = sized.temporaries if sized else [a.shape for a in abi.temporaries]
    outs = [torch.empty(shape, dtype=getattr(torch, ELEM_INFO[a.elem][0]), device="mps")
            for shape, a in zip(out_shapes, abi.outputs)]
    temps = [torch.empty(shape, dtype=getattr(torch, ELEM_INFO[a.elem][0]), device="mps")
             for shape, a in zip(temp_shapes, abi.temporaries)]
    bufs = [t.contiguous() for t in inputs] + outs + temps
    flag = None
    if abi.index_sites:  # the index error flag, zeroed: kernels only ever set it
        flag = torch.zeros(abi.flag_arg.shape, dtype=torch.int32, device="mps")
        bufs.append(flag)
    for n, k in enumerate(abi.kernels):
        if k.artifact not in sources:
            raise MetalError(f"no MSL for kernel {k.entry} (artifact '{k.artifact}')")
        args, grid = [bufs[i] for i in k.args], None
        if k.sizes:  # the kernel's run-time sizes: a buffer of int32, its last argument
            grid, slots = sized.launches[n]
            args.append(torch.tensor(slots, dtype=torch.int32, device="mps"))
        launch(sources[k.artifact], k, args, grid)
    if flag is not None:  # .tolist() waits for the kernels
        abi.raise_index_error(flag.tolist())
    return tuple(abi.take_inputs(inputs, outs))
