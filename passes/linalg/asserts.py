"""Run-time checks in torch-mlir's functions that kf drops.

torch-mlir writes some checks of element values as ``cf.assert`` inside a linalg body.
A CPU program aborts the process on one that fails (a crash, where torch gives a value),
and a GPU kernel has no way to report it (convert-gpu-to-spirv cannot lower it). The
checks dropped here are those that only fail where torch computes a value anyway:

- ``unimplemented: tensor with zero element``: renorm divides by ``norm + 1e-7`` and
  checks that it is not 0; a norm is >= 0, so only a NaN norm fails the check, and torch
  then leaves the slice as it is (``NaN > maxnorm`` is false), as the lowering does
  without the check."""

from __future__ import annotations

from mlir import ir

#: messages of torch-mlir's cf.assert that are dropped (see the module's docstring)
DROPPED = ("unimplemented: tensor with zero element",)


def drop_value_asserts(op: ir.Operation) -> None:
    """Erase the ``cf.assert`` ops under op whose message is one of ``DROPPED``."""
    found: list[ir.Operation] = []
    op.walk(lambda o: (found.append(o.operation) if o.name == "cf.assert" else None) or ir.WalkResult.ADVANCE)
    for a in found:
        if ir.StringAttr(a.attributes["msg"]).value in DROPPED:
            a.erase()
