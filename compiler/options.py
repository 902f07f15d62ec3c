"""Compile options: a frozen dataclass whose stable hash goes into the cache key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

TARGETS = ("auto", "cuda", "metal", "vulkan", "cpu")
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Options:
    """How to compile a function.

    target: where it runs; ``auto`` follows the tensors' device (cuda, mps -> metal, cpu).
    interpret: run the captured kf IR op by op with torch instead of compiling (debugging).
    precision: the precision policy (see README: mixed precision).
    dump_ir: a directory to write the IR after every stage into, or "".
    arch: the GPU architecture (``sm_90``); "" means the device's own.
    """

    target: str = "auto"
    interpret: bool = False
    precision: str = "auto"
    dump_ir: str = ""
    arch: str = ""

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    def with_(self, **changes) -> "Options":
        return replace(self, **changes)

    def stable_hash(self) -> str:
        """A hash that is the same in every process (Python's hash() is salted)."""
        fields = {k: v for k, v in asdict(self).items() if k != "dump_ir"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
