"""The CPU launcher: runs a kernel linked by ``kf.cpu_codegen`` on torch CPU tensors.

It loads the shared object with ctypes and calls its ``_mlir_ciface_<name>`` entry
with one pointer per argument to an MLIR memref descriptor
``{allocated, aligned, offset, sizes[rank], strides[rank]}`` built from the tensor's
``data_ptr``, shape and strides, so no data is copied: inputs that are already dense
row-major are passed as they are (others are made contiguous, because the compiled
code assumes identity-layout memrefs), outputs are fresh ``torch.empty`` tensors the
kernel writes into (destination passing, see runtime/abi.py).

Nothing here imports mlir: a cache hit runs from the ABI JSON and the .so alone.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from typing import Sequence

import torch

from .abi import ELEM_INFO, ProgramABI, TensorArg, bind_sizes


@lru_cache(maxsize=None)
def descriptor_type(rank: int) -> type[ctypes.Structure]:
    """The ctypes layout of a ranked memref descriptor (MLIR's StridedMemRefType)."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRefDescriptor{rank}", (ctypes.Structure,), {"_fields_": fields})


def descriptor(t: torch.Tensor) -> ctypes.Structure:
    """A memref descriptor viewing t's storage (t must stay alive while it is used)."""
    rank = t.dim()
    d = descriptor_type(rank)()
    d.allocated = d.aligned = t.data_ptr()
    d.offset = 0
    if rank:
        d.sizes[:] = list(t.shape)
        d.strides[:] = list(t.stride())
    return d


def _dtype(elem: str) -> torch.dtype:
    return getattr(torch, ELEM_INFO[elem][0])


class CpuLaunchError(RuntimeError):
    """The tensors given do not match what the kernel was compiled for."""


class CpuProgram:
    """A loaded CPU program; call it with the input tensors, get the outputs back."""

    def __init__(self, abi: ProgramABI, directory: str):
        if abi.target != "cpu" or len(abi.kernels) != 1:
            raise CpuLaunchError(f"a CPU program has one kernel, got target {abi.target} with {len(abi.kernels)}")
        self.abi = abi
        kernel = abi.kernels[0]
        self._lib = ctypes.CDLL(os.path.join(directory, kernel.artifact))
        self._entry = getattr(self._lib, kernel.entry)
        self._entry.restype = None
        self._entry.argtypes = [ctypes.c_void_p] * len(kernel.args)
        self._static = abi.is_static

    def _check(self, t: torch.Tensor, arg: TensorArg, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise CpuLaunchError(f"{arg.name}: expected a CPU tensor, got {type(t).__name__} "
                                 f"on {getattr(t, 'device', '?')}")
        if t.dtype != _dtype(arg.elem) or (shape is None and tuple(t.shape) != arg.shape) or \
                (shape is not None and tuple(t.shape) != shape):
            raise CpuLaunchError(f"{arg.name}: compiled for {list(arg.shape)} {_dtype(arg.elem)}, "
                                 f"got {list(t.shape)} {t.dtype}")
        return t if t.is_contiguous() else t.contiguous()

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        abi = self.abi
        if len(inputs) != len(abi.inputs):
            raise CpuLaunchError(f"expected {len(abi.inputs)} inputs, got {len(inputs)}")
        if self._static:
            ins = [self._check(t, a) for t, a in zip(inputs, abi.inputs)]
            shapes = [a.shape for a in abi.outputs]
        else:  # run-time sizes: the inputs' give the symbols, which give the outputs'
            # (a size 1 reaches a program only where kf found that it serves it: compiler/api.py)
            sizes = bind_sizes(abi.inputs, [tuple(getattr(t, "shape", ())) for t in inputs], 1)
            if isinstance(sizes, str):
                raise CpuLaunchError(sizes)
            ins = [self._check(t, a, tuple(t.shape)) for t, a in zip(inputs, abi.inputs)]
            shapes = [a.sized(sizes) for a in abi.outputs]
        if out is None:
            outs = [torch.empty(s, dtype=_dtype(a.elem)) for s, a in zip(shapes, abi.outputs)]
        else:
            outs = list(out)
            for t, a, s in zip(outs, abi.outputs, shapes):
                if self._check(t, a, s) is not t:
                    raise CpuLaunchError(f"{a.name}: an output buffer must be contiguous")
        bufs = ins + outs
        flag = None
        if abi.index_sites:  # the index error flag: the kernel writes all of it
            flag = torch.empty(abi.flag_arg.shape, dtype=torch.int32)
            bufs.append(flag)
        descriptors = [descriptor(bufs[i]) for i in abi.kernels[0].args]
        self._entry(*[ctypes.addressof(d) for d in descriptors])
        if flag is not None:
            abi.raise_index_error(flag.tolist())
        return tuple(outs)

    def fast_lane(self, shapes: Sequence[tuple[int, ...]] | None = None, device=None):
        """One function for the common call, or None: tensors that kf's dispatch key has
        matched to the program (shapes, dtypes) and found contiguous, of a program with
        no index error flag and no output that is an input's view. Everything that does
        not depend on the call's tensors is worked out once per call signature: the
        outputs' shapes and dtypes, and every memref descriptor but its two pointers, in
        one int64 array that a call copies and fills (a call's own, so that threads may
        call at once). ``shapes``: the signature's input shapes, for a program with
        run-time sizes."""
        abi = self.abi
        if abi.index_sites or any(map(abi.unwritten, range(len(abi.outputs)))):
            return None
        if self._static:
            in_shapes = [tuple(a.shape) for a in abi.inputs]
            out_shapes = [tuple(a.shape) for a in abi.outputs]
        else:
            if shapes is None or len(shapes) != len(abi.inputs):
                return None
            sizes = bind_sizes(abi.inputs, [tuple(s) for s in shapes], 1)
            if isinstance(sizes, str):
                return None
            in_shapes, out_shapes = [tuple(s) for s in shapes], [a.sized(sizes) for a in abi.outputs]
        shapes_of = in_shapes + out_shapes
        template, pointers, offsets = [], [], []
        for i in abi.kernels[0].args:
            shape = shapes_of[i]
            offsets.append(8 * len(template))
            pointers.append((len(template), i))
            # {allocated, aligned, offset, sizes, strides}, row-major
            template += [0, 0, 0, *shape, *torch.empty(shape, device="meta").stride()]
        array_t, template = ctypes.c_int64 * max(len(template), 1), tuple(template)
        outputs = [(shape, _dtype(a.elem)) for shape, a in zip(out_shapes, abi.outputs)]
        entry, empty, addressof = self._entry, torch.empty, ctypes.addressof

        def call(ins: list) -> list:
            outs = [empty(shape, dtype=dt) for shape, dt in outputs]
            bufs = ins + outs
            descriptors = array_t(*template)
            for slot, i in pointers:
                descriptors[slot] = descriptors[slot + 1] = bufs[i].data_ptr()
            base = addressof(descriptors)
            entry(*[base + o for o in offsets])
            return outs

        call.n_in = len(abi.inputs)
        return call


def load(abi: ProgramABI, directory: str) -> CpuProgram:
    """Load the program described by abi, whose artifact lies in directory."""
    return CpuProgram(abi, directory)
