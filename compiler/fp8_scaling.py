"""Per-tensor fp8 scaling for training: kf's amax and quantize kernels, and delayed scaling.

fp8 has little range (e4m3fn: largest 448, e5m2: 57344), so a tensor is multiplied by a
scale before it is cast and the product of two fp8 operands is multiplied by the inverse
scales (``torch._scaled_mm(a8, b8, 1 / s_a, 1 / s_b)``, which kf compiles to fp8
``mma.sync`` on sm_89+). Two ways to choose the scale:

- *current* scaling (``precision="fp8"``, ``fp8_quantize(x)``): from this tensor's own amax,
  which costs a reduction over the tensor before it can be cast;
- *delayed* scaling (``DelayedScaling``, the recipe of NVIDIA's Transformer Engine): from
  the largest amax of the last ``history`` steps, so the cast needs no pass before it and
  no host synchronization; each quantization records the tensor's amax for the steps
  after it. Activations and weights take e4m3, gradients e5m2 (more range, less precision).

Everything stays on the tensors' device as tensors: nothing here calls ``.item()``, so it
works inside CUDA graphs and costs no synchronization. The amax and quantize kernels are kf
functions (``target="auto"`` follows the tensors' device); targets without fp8 storage
(Vulkan) raise kf's TargetError for them.
"""

from __future__ import annotations

import functools

import torch

#: The largest finite value of each fp8 format.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _amax(x):
    return x.abs().amax().float()


def _quantize_e4m3(x, scale):
    return (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _quantize_e5m2(x, scale):
    return (x.float() * scale).clamp(-57344.0, 57344.0).to(torch.float8_e5m2)


_QUANTIZE = {torch.float8_e4m3fn: _quantize_e4m3, torch.float8_e5m2: _quantize_e5m2}


@functools.lru_cache(maxsize=None)
def _kernel(fn, target: str):
    from .api import jit

    return jit(fn, target=target)


def fp8_amax(x: torch.Tensor, target: str = "auto") -> torch.Tensor:
    """max(|x|) as a float32 scalar tensor on x's device, computed by a kf kernel."""
    return _kernel(_amax, target)(x)


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor | None = None, dtype: torch.dtype = torch.float8_e4m3fn,
                 target: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(x * scale cast to dtype, 1 / scale), saturating at the format's largest value.

    Without ``scale``, the current scale from x's own amax (``FP8_MAX / amax``). The
    inverse scale is what ``torch._scaled_mm`` takes for the operand."""
    if dtype not in FP8_MAX:
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if scale is None:
        scale = _scale_from(fp8_amax(x, target), FP8_MAX[dtype], 0)
    scale = scale.to(device=x.device, dtype=torch.float32)
    return _kernel(_QUANTIZE[dtype], target)(x, scale), 1.0 / scale


def _scale_from(amax: torch.Tensor, fmax: float, margin: int) -> torch.Tensor:
    """fmax / (amax * 2^margin), and 1 where amax is 0 (nothing seen yet)."""
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    return torch.where(amax > 0, fmax / (safe * 2.0 ** margin), torch.ones_like(amax))


class DelayedScaling:
    """The scale of one tensor stream (one layer's input, its weight, or its gradient) from
    the amax history of earlier steps.

    ``quantize(x)`` casts x with the scale the history gives *now*, then records x's amax
    into the history (a ring of ``history`` entries); ``scale()`` is
    ``FP8_MAX / (max(history) * 2**margin)``, 1 before anything was recorded. A value that
    outgrows the history's amax saturates at the format's largest value for a step, the
    usual price of delayed scaling; ``margin`` trades precision for headroom.
    """

    def __init__(self, dtype: torch.dtype = torch.float8_e4m3fn, history: int = 16, margin: int = 0,
                 target: str = "auto"):
        if dtype not in FP8_MAX:
            raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        self.dtype, self.length, self.margin, self.target = dtype, history, margin, target
        self.history: torch.Tensor | None = None  # float32 [history] on the tensors' device
        self.steps = 0

    def _ring(self, device: torch.device) -> torch.Tensor:
        if self.history is None or self.history.device != device:
            self.history = torch.zeros(self.length, dtype=torch.float32, device=device)
        return self.history

    def scale(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The scale the next ``quantize`` will use (a float32 scalar tensor)."""
        ring = self._ring(torch.device(device) if self.history is None else self.history.device)
        return _scale_from(ring.amax(), FP8_MAX[self.dtype], self.margin)

    def record(self, x: torch.Tensor) -> None:
        """Put x's amax into the history (overwriting the oldest entry)."""
        ring = self._ring(x.device)
        ring[self.steps % self.length] = fp8_amax(x, self.target)
        self.steps += 1

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x cast to fp8 with the delayed scale, the inverse scale); records x's amax."""
        x8, inv = fp8_quantize(x, self.scale(x.device), self.dtype, self.target)
        self.record(x)
        return x8, inv

    def state_dict(self) -> dict:
        return {"history": None if self.history is None else self.history.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.history = None if state["history"] is None else state["history"].clone()
        self.steps = int(state["steps"])
