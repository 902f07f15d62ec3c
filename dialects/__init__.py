"""The kf dialect: value-semantics tensor ops, defined with IRDL.

``load(ctx)`` makes the dialect available in a context; ``kf.dialects.builders`` makes
ops; ``kf.dialects.verifier`` checks their shape rules; ``kf.dialects.elements`` is the
one table of element types. Nothing here imports torch, and importing the package does
not load MLIR (the runtime reads the element table on a cache hit): the names that need
it load on first use.
"""

from __future__ import annotations

import importlib

from .elements import ELEMENT_TYPES

#: names loaded on first use, by module: importing the package (for the element table,
#: elements.py, which the runtime reads) does not load MLIR
_LAZY = {
    "builders": "builders", "irdl_text": "irdl", "BY_NAME": "ops", "OPS": "ops", "OpSpec": "ops",
    "KfTypeError": "types", "TensorSpec": "types", "defining": "types", "mlir_type": "types", "spec_of": "types",
    "verify": "verifier", "verify_op": "verifier",
}

_LOADED_ATTR = "_kf_dialect_loaded"


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kf.dialects' has no attribute '{name}'")
    mod = importlib.import_module(f"{__name__}.{module}")
    value = mod if module == name else getattr(mod, name)
    globals()[name] = value
    return value


def load(ctx=None) -> None:
    """Load the kf dialect into ctx (the current context by default); idempotent."""
    from mlir import ir
    from mlir.dialects import irdl as _irdl

    from .irdl import irdl_text

    ctx = ctx or ir.Context.current
    if ctx.is_registered_operation("kf.add"):
        return
    with ctx, ir.Location.unknown(ctx):
        _irdl.load_dialects(ir.Module.parse(irdl_text()))


def make_context():
    """A fresh MLIR context (``mlir.ir.Context``) with the kf dialect loaded and every
    upstream dialect available."""
    from mlir import ir

    ctx = ir.Context()
    ctx.load_all_available_dialects()
    load(ctx)
    return ctx


__all__ = [
    "BY_NAME", "ELEMENT_TYPES", "KfTypeError", "OPS", "OpSpec", "TensorSpec", "builders", "irdl_text",
    "load", "make_context", "mlir_type", "spec_of", "verify", "verify_op",
]
