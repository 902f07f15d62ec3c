"""Calls that launch CUDA code of their own, refused while kf captures a function.

``torch.cuda.jiterator`` functions compile the user's CUDA C++ and launch it through a
C function of torch (``torch._C._cuda_jiterator_compile_and_launch_kernel``) that
torch's dispatcher never sees: a trace cannot record it, and under a trace it would
launch the kernel for real on the traced tensors, whose memory is address 0 (a fake
or data-less tensor), an illegal address that poisons the process's CUDA context. While
a capture runs (``refusing()``), that function raises ``NativeKernelCall`` instead, which
capture reports as an UnsupportedOpError at the user's line.
"""

from __future__ import annotations

import contextlib
import threading

import torch

#: torch._C's functions that launch CUDA code the dispatcher does not see
NAMES = ("_cuda_jiterator_compile_and_launch_kernel",)

MESSAGE = ("torch.cuda.jiterator runs CUDA C++ of its own, which kf cannot capture: write the computation "
           "with torch operations, or call the jiterator function outside the kf function")

_LOCK = threading.Lock()
_DEPTH = [0]
_SAVED: dict = {}
_ABSENT = object()


class NativeKernelCall(RuntimeError):
    """A refused call (see the module docstring)."""


def _refuse(*args, **kwargs):
    raise NativeKernelCall(MESSAGE)


@contextlib.contextmanager
def refusing():
    """The functions of NAMES raise NativeKernelCall inside (nested and concurrent
    captures share one replacement, put back when the last one ends)."""
    with _LOCK:
        if _DEPTH[0] == 0:
            for name in NAMES:
                _SAVED[name] = getattr(torch._C, name, _ABSENT)
                setattr(torch._C, name, _refuse)
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                for name in NAMES:
                    saved = _SAVED.pop(name)
                    if saved is _ABSENT:
                        delattr(torch._C, name)
                    else:
                        setattr(torch._C, name, saved)


def refused(e: BaseException | None) -> NativeKernelCall | None:
    """The refused call that e is, or was raised from or during, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, NativeKernelCall):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
