"""The base of every kf pass: a name, typed options and ``run(module)``.

A kf pass is a Python class; ``as_callable()`` adapts it to the
``PassManager.add(callable, ...)`` protocol of the upstream bindings. Exceptions never
cross the bindings: a ``PassError`` (or any bug) becomes an error diagnostic at the
best location known and ``signal_pass_failure()``, as upstream's Python passes do.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import ClassVar

from mlir import ir


class PassFailure(Exception):
    """The pass failed and has already emitted its diagnostics."""


class PassError(Exception):
    """A pass could not transform the IR; carries the location to report at."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


def user_functions(module: ir.Operation) -> list[ir.Operation]:
    """The module's func.func ops that are the user's functions: with a body, and not a
    kernel function kf-fuse made (the kf-level passes before kf-fuse rewrite these)."""
    out = []
    for f in module.regions[0].blocks[0].operations:
        f = f.operation
        if f.name == "func.func" and "kf.kernel" not in f.attributes and f.regions[0].blocks:
            out.append(f)
    return out


#: how a boolean option may be written (``kf-to-cpu{fuse}`` alone means true)
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "": True, "0": False, "false": False, "no": False,
          "off": False}


@dataclasses.dataclass(frozen=True)
class KfPass:
    """Subclasses set NAME and DESCRIPTION, declare options as dataclass fields
    (``kf-tile{block-size=128}`` sets ``block_size``) and implement ``run``."""

    NAME: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""

    def run(self, module: ir.Operation) -> None:
        raise NotImplementedError

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "KfPass":
        """Make the pass from textual options, converting each to its field's type."""
        fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, text in options.items():
            if key not in fields:
                known = ", ".join(sorted(fields)) or "none"
                raise ValueError(f"pass '{cls.NAME}' has no option '{key}' (options: {known})")
            f = fields[key]
            kind = f.type if isinstance(f.type, type) else {"int": int, "bool": bool, "str": str, "float": float}.get(
                str(f.type), str)
            if kind is bool:
                if text.lower() not in _BOOLS:
                    raise ValueError(f"pass '{cls.NAME}' option '{key}' is true or false, got '{text}'")
                kwargs[f.name] = _BOOLS[text.lower()]
            else:
                try:
                    kwargs[f.name] = kind(text)
                except ValueError:
                    raise ValueError(f"pass '{cls.NAME}' option '{key}' takes {'an' if kind is int else 'a'} "
                                     f"{kind.__name__}, got '{text}'") from None
        return cls(**kwargs)

    def textual(self) -> str:
        """The pass as it would be written in a pipeline, with non-default options."""
        opts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                opts.append(f"{f.name.replace('_', '-')}={str(value).lower() if isinstance(value, bool) else value}")
        return self.NAME + (f"{{{' '.join(opts)}}}" if opts else "")

    def as_callable(self):
        """The ``(op, pass_)`` callable that ``PassManager.add`` takes."""

        def run(op: ir.Operation, pass_) -> None:
            try:
                # Passes build IR: give them the op's context and location by default.
                with op.context, op.location:
                    self.run(op)
            except PassFailure:
                pass_.signal_pass_failure()
            except PassError as e:
                (e.location or op.location).emit_error(f"{self.NAME}: {e}")
                pass_.signal_pass_failure()
            except Exception as e:  # a bug in the pass: report it, never crash the host
                op.location.emit_error(f"{self.NAME} crashed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                pass_.signal_pass_failure()

        run.__name__ = self.NAME.replace("-", "_")
        return run
