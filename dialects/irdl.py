"""The kf dialect's IRDL definition, generated from the op table in ``ops.py``.

IRDL lets the dialect be loaded into any MLIR context at run time, with no C++ build.
It checks structure only: every operand and result is a builtin tensor and every
attribute has the right kind. Shape rules are checked by ``kf.dialects.verifier``.
"""

from __future__ import annotations

from functools import lru_cache

from .ops import ATTR_BASES, OPS, OpSpec


def _op_irdl(op: OpSpec) -> str:
    lines = [f"  irdl.operation @{op.name} {{"]
    # One constraint variable per value: IRDL requires values that share a variable to
    # have equal types, and kf's operands may differ in shape and element type.
    names = []
    for i, _ in enumerate(op.operands + op.results):
        names.append(f"%t{i}")
        lines.append(f'    %t{i} = irdl.base "!builtin.tensor"')
    n_in = len(op.operands)
    if op.operands:
        groups = ", ".join(
            f"{name}: {'variadic ' if op.variadic else ''}{names[i]}" for i, name in enumerate(op.operands)
        )
        lines.append(f"    irdl.operands({groups})")
    if op.results:
        groups = ", ".join(f"{name}: {names[n_in + i]}" for i, name in enumerate(op.results))
        lines.append(f"    irdl.results({groups})")
    if op.attrs:
        for i, kind in enumerate(op.attrs.values()):
            lines.append(f'    %a{i} = irdl.base "{ATTR_BASES[kind]}"')
        attrs = ", ".join(f'"{name}" = %a{i}' for i, name in enumerate(op.attrs))
        lines.append(f"    irdl.attributes {{{attrs}}}")
    lines.append("  }")
    return "\n".join(lines)


@lru_cache(maxsize=None)
def irdl_text() -> str:
    """The whole dialect as an IRDL module (text)."""
    body = "\n".join(_op_irdl(op) for op in OPS)
    return f"irdl.dialect @kf {{\n{body}\n}}\n"
