"""torch dtypes and kf element types, both ways (from kf's element table, kf.dialects.elements)."""

from __future__ import annotations

import torch

from kf.dialects.elements import ELEMENTS

TORCH_TO_KF: dict[torch.dtype, str] = {getattr(torch, e.torch_name): n for n, e in ELEMENTS.items()}
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
