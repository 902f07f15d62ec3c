"""The random state of a kf call, and kf's random numbers on the torch side.

A kf function that draws random numbers (dropout, ``rand_like``, ...) compiles to a
program with one more input after the user's tensors: the state ``[seed, offset]``, a
``tensor<2xi64>`` that every ``kf.rand`` of the program reads (dialects/philox.py says
how). It is an input, not a constant, so one compiled program serves every call; each
call draws a fresh state from torch's default generator of the tensors' device, with
``torch.randint`` on that device, as Inductor draws the seeds of its random kernels
(``inductor_prims.seeds``). So ``torch.manual_seed`` reproduces a run, two calls in a row
draw different numbers, and the generator advances as torch's own ops advance it: on
CUDA the draw is a kernel that reads the generator's Philox state from device memory,
so it stays correct inside a CUDA graph (an offset set from the host would be frozen
into the captured graph); the CPU generator (a Mersenne twister) has no offset to set.

The state a forward call used is what its backward needs: the backward recomputes the
forward's random numbers from it (compiler/autograd.py), so the same elements are kept.

This module also registers ``kf::philox_rand(state, offset, size, distribution)``, the
explicit-state op the generated backward functions call, and ``samples``, the torch
implementation of ``kf.rand`` that the interpreter and that op run.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from kf.dialects import philox

#: the name of the state input in the program's ABI (the user's parameters are identifiers)
STATE_NAME = "kf.random_state"
STATE_SHAPE = (2,)

_TARGET_DEVICE = {"cpu": "cpu", "vulkan": "cpu", "cuda": "cuda", "metal": "mps"}


def draw(device: torch.device | str) -> torch.Tensor:
    """A fresh state ``[seed, offset]`` from torch's default generator of device."""
    return torch.randint(2 ** 63 - 1, STATE_SHAPE, dtype=torch.int64, device=device)


def device_for(tensors: Sequence[torch.Tensor], target: str) -> torch.device:
    """The device whose generator a call of a target draws from: its tensors' (a call with
    none: the target's default device)."""
    for t in tensors:
        return t.device
    return torch.device(_TARGET_DEVICE.get(target, "cpu"))


def with_state(tensors: list, target: str, drawn: list | None = None) -> list:
    """The program's inputs for a call: the user's tensors and a fresh state (appended to
    ``drawn`` when given, which is how a forward reports the state its backward needs)."""
    state = draw(device_for(tensors, target))
    if drawn is not None:
        drawn.append(state)
    return [*tensors, state]


# ----------------------------------------------------------------------------- samples

_M32 = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product of the constant a and the 32-bit
    words b (int64 tensors), without overflowing int64: b is split in 16-bit halves."""
    lo_part = a * (b & 0xFFFF)
    hi_part = a * (b >> 16)
    low = (((hi_part & 0xFFFF) << 16) + lo_part) & _M32
    high = (hi_part + (lo_part >> 16)) >> 16
    return high, low


def samples(state: torch.Tensor, offset: int, shape: Sequence[int], distribution: str = "uniform") -> torch.Tensor:
    """``kf.rand``'s f32 samples, computed with torch on state's device (no synchronization)."""
    if distribution not in philox.DISTRIBUTIONS:
        raise ValueError(f"kf.rand has no distribution {distribution!r}")
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    device = state.device
    state = state.to(torch.int64)
    seed, base = state[0], state[1]
    index = torch.arange(philox.blocks(numel, distribution), dtype=torch.int64, device=device)
    c = base + offset + index  # wraps modulo 2^64, as the kernels' 64-bit add does
    c0, c1 = c & _M32, (c >> 32) & _M32
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = (k0 + philox.W0) & _M32, (k1 + philox.W1) & _M32
        hi0, lo0 = _mulhilo(philox.M0, c0)
        hi1, lo1 = _mulhilo(philox.M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0

    def unit(word, plus_one=False):
        return ((word >> philox.SAMPLE_SHIFT) + int(plus_one)).to(torch.float32) * philox.SAMPLE_SCALE

    if distribution == "uniform":
        values = [unit(w) for w in (c0, c1, c2, c3)]
    else:
        values = [torch.sqrt(-2.0 * torch.log(unit(a, True))) * torch.cos((2.0 * math.pi) * unit(b))
                  for a, b in ((c0, c1), (c2, c3))]
    # element i is word i % n of block i // n
    return torch.stack(values, dim=-1).flatten()[:numel].reshape(shape)


# ----------------------------------------------------------------------------- the op


def _define_philox_rand():
    @torch.library.custom_op("kf::philox_rand", mutates_args=(),
                             schema="(Tensor state, int offset, SymInt[] size, str distribution) -> Tensor")
    def philox_rand(state: torch.Tensor, offset: int, size: Sequence[int], distribution: str) -> torch.Tensor:
        return samples(state, offset, size, distribution)

    @philox_rand.register_fake
    def _(state, offset, size, distribution):
        return state.new_empty(tuple(size), dtype=torch.float32)

    return philox_rand


#: ``torch.ops.kf.philox_rand``: kf.rand with the state as an argument (kf converts it to
#: kf.rand reading that argument); a pure function of its arguments
philox_rand = _define_philox_rand()
