"""The kf dialect: value-semantics tensor ops, defined with IRDL.

``load(ctx)`` makes the dialect available in a context; ``kf.dialects.builders`` makes
ops; ``kf.dialects.verifier`` checks their shape rules. Nothing here imports torch.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import irdl as _irdl

from . import builders
from .irdl import irdl_text
from .ops import BY_NAME, OPS, OpSpec
from .types import ELEMENT_TYPES, KfTypeError, TensorSpec, defining, mlir_type, spec_of
from .verifier import verify, verify_op

_LOADED_ATTR = "_kf_dialect_loaded"


def load(ctx: ir.Context | None = None) -> None:
    """Load the kf dialect into ctx (the current context by default); idempotent."""
    ctx = ctx or ir.Context.current
    if ctx.is_registered_operation("kf.add"):
        return
    with ctx, ir.Location.unknown(ctx):
        _irdl.load_dialects(ir.Module.parse(irdl_text()))


def make_context() -> ir.Context:
    """A fresh MLIR context with the kf dialect loaded and every upstream dialect available."""
    ctx = ir.Context()
    ctx.load_all_available_dialects()
    load(ctx)
    return ctx


__all__ = [
    "BY_NAME", "ELEMENT_TYPES", "KfTypeError", "OPS", "OpSpec", "TensorSpec", "builders", "irdl_text",
    "load", "make_context", "mlir_type", "spec_of", "verify", "verify_op",
]
