"""``kf.inspect``: every stage's text for one specialization of a function."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .capture import Captured, capture


@dataclass
class Inspection:
    """What kf made of one call signature. ``stages`` maps stage name to text, in order."""

    name: str
    signature: str
    stages: dict[str, str] = field(default_factory=dict)
    captured: Captured | None = None

    @property
    def kf_ir(self) -> str:
        return self.stages["kf"]

    def __getattr__(self, stage: str) -> str:
        stages = self.__dict__.get("stages", {})
        if stage in stages:
            return stages[stage]
        raise AttributeError(f"no stage '{stage}' (stages: {', '.join(stages)})")


def inspect(fn: Callable, *args, **kwargs) -> Inspection:
    """Capture fn for these arguments and return the text of every stage kf produces."""
    target = getattr(fn, "__kf_function__", None)
    if target is not None:
        return target.inspect(*args, **kwargs)
    cap = capture(fn, *args, **kwargs)
    return Inspection(cap.name, cap.signature.describe(), {"kf": cap.kf_ir}, cap)
