"""torch dtypes and kf element types, both ways."""

from __future__ import annotations

import torch

TORCH_TO_KF: dict[torch.dtype, str] = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2",
    torch.bool: "i1", torch.int32: "i32", torch.int64: "i64",
}
KF_TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TORCH_TO_KF.items()}


def kf_elem(dtype: torch.dtype) -> str:
    """The kf element type of a torch dtype; raises TypeError for one kf does not support."""
    try:
        return TORCH_TO_KF[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_KF)
        raise TypeError(f"dtype {dtype} is not supported by kf (supported: {supported})") from None


def torch_dtype(elem: str) -> torch.dtype:
    return KF_TO_TORCH[elem]
