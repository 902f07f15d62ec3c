"""kf-verify: report every kf op whose types break its rule, at the op's location."""

from __future__ import annotations

import dataclasses

from mlir import ir

from kf.dialects import verify

from .base import KfPass, PassFailure


@dataclasses.dataclass(frozen=True)
class VerifyPass(KfPass):
    NAME = "kf-verify"
    DESCRIPTION = "check the shape and element-type rules of every kf op"

    def run(self, module: ir.Operation) -> None:
        errors = verify(module)
        for loc, message in errors:
            loc.emit_error(message)
        if errors:
            raise PassFailure()
