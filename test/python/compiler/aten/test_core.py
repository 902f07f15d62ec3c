"""compiler/aten/core.py: what the converter decides before any op's handler."""

from __future__ import annotations

import torch
from mlir import ir

from kf import dialects as kd
from kf.aten.core import _empty_results
from kf.dialects.types import spec_of


def test_empty_index_results_are_int64_whatever_the_fake_dtype():
    """unique's inverse indices and counts of an empty input are int64 tensors, also where
    torch's fake implementation gives them the input's dtype (torch 2.11: float32, which
    made kf's results float32 on the GPU machine: OpInfo unique#527)."""
    with kd.make_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fake = (torch.empty(5, 0, 5), torch.empty(0), torch.empty(0))
            indices = _empty_results(fake, indices_after_first=True)
            plain = _empty_results(fake)
            assert [spec_of(v.type).elem for v in indices] == ["f32", "i64", "i64"]
            assert [spec_of(v.type).elem for v in plain] == ["f32", "f32", "f32"]
            assert _empty_results((torch.empty(0), torch.empty(3))) is None
