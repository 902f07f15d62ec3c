"""kf-share-kernels: kernel functions that are the same function under another name
become one, called from every site.

A model's layers repeat: a decoder of eight blocks fuses into eight copies of each
block's kernels, the same ops on the same shapes, each named after its place in the
function. Every later stage (planning, writing the gpu.func, lowering to PTX or SPIR-V,
ptxas) would do the same work eight times, and the program would hold eight copies of
each binary. Two kernel functions are the same where their text without their names and
without locations is (ops, attributes, constants, types and kf-fuse's attributes, such
as the user's lines they fuse, all equal); each call of a copy then calls the first of
them, and the copies are erased. Launches are unchanged: each call site is still its own
launch, with its own buffers."""

from __future__ import annotations

import dataclasses

from mlir import ir

from .base import KfPass

#: the name a kernel function is printed under while its text is compared
_PLACEHOLDER = "kf_shared_kernel"


def _text(f: ir.Operation) -> str:
    """The kernel function's text under a fixed name, without locations."""
    name = f.attributes["sym_name"]
    f.attributes["sym_name"] = ir.StringAttr.get(_PLACEHOLDER)
    try:
        return f.get_asm(enable_debug_info=False, use_local_scope=True)
    finally:
        f.attributes["sym_name"] = name


def share_kernels(module: ir.Operation) -> dict[str, str]:
    """Make each kernel function that repeats an earlier one's text its calls' callee no
    more: {erased name: the name its calls call now}."""
    first: dict[str, str] = {}
    shared: dict[str, str] = {}
    copies = []
    for f in module.regions[0].blocks[0].operations:
        f = f.operation
        if f.name != "func.func" or "kf.kernel" not in f.attributes:
            continue
        name = ir.StringAttr(f.attributes["sym_name"]).value
        kept = first.setdefault(_text(f), name)
        if kept != name:
            shared[name] = kept
            copies.append(f)
    if not shared:
        return shared

    def visit(op):
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee in shared:
                op.attributes["callee"] = ir.FlatSymbolRefAttr.get(shared[callee])
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for f in copies:
        f.erase()
    return shared


@dataclasses.dataclass(frozen=True)
class ShareKernelsPass(KfPass):
    NAME = "kf-share-kernels"
    DESCRIPTION = "kernel functions that are the same function under another name become one, called from every site"

    def run(self, module: ir.Operation) -> None:
        share_kernels(module)
