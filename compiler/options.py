"""Compile options: a frozen dataclass whose stable hash goes into the cache key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

TARGETS = ("auto", "cuda", "metal", "vulkan", "cpu")
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Options:
    """How to compile a function.

    target: where it runs; ``auto`` follows the tensors' device (cuda, mps -> metal, cpu).
    interpret: run the captured kf IR op by op with torch instead of compiling (debugging).
    dump_ir: a directory to write the IR after every stage into, or "".
    arch: the GPU architecture (``sm_90``); "" means the device's own.
    precision: the compute precision policy (passes/apply_precision.py): ``auto`` computes
      in the input types (f32 accumulation for low-precision inputs) and follows an active
      ``torch.autocast`` region; ``fp32``, ``tf32``, ``bf16``, ``fp16`` and ``fp8`` change
      the internal precision only, never the output dtypes.
    variants: kernel variants for kf-tile, as it takes them: ``<kind>.<field>=<value>``
      separated by spaces (``"matmul.stages=3 attention.reverse_q_blocks=false"``; the
      fields of each strategy's VARIANT, passes/strategies/). Part of the cache key, as
      every option.
    dynamic: which dims take run-time sizes (one program for every size, compiler/dynamic.py):
      ``None`` (the default) makes a dim dynamic once a call brings a second size for it
      (automatic dynamic, as dynamo's); ``True`` every dim of every tensor argument;
      ``False`` none (each size compiles its own program); ``{"q": [2], "x": [0]}`` those
      dims of those arguments (``name.i`` for a list's tensor i; a name alone for all of
      its tensors). Sizes 0 and 1 are always compiled apart. Not part of the cache key:
      the signature says which dims are dynamic.
    """

    target: str = "auto"
    interpret: bool = False
    dump_ir: str = ""
    arch: str = ""
    precision: str = "auto"
    variants: str = ""
    dynamic: object = None  # None, True, False, or a tuple of (name, (dims...)) (a dict given)

    def __post_init__(self):
        if isinstance(self.dynamic, dict):
            try:
                pairs = tuple(sorted((str(k), tuple(sorted(int(d) for d in v))) for k, v in self.dynamic.items()))
            except (TypeError, ValueError):
                raise ValueError(f"dynamic maps argument names to lists of dims, got {self.dynamic!r}") from None
            object.__setattr__(self, "dynamic", pairs)
        elif not (self.dynamic is None or isinstance(self.dynamic, (bool, tuple))):
            raise ValueError(f"dynamic is None, True, False or {{name: [dims]}}, got {self.dynamic!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for item in self.variants.split():
            key, eq, value = item.partition("=")
            kind, dot, name = key.partition(".")
            if not (eq and dot and kind and name and value):
                raise ValueError(f"variants are '<kind>.<field>=<value>' separated by spaces, got {item!r}")

    def with_(self, **changes) -> "Options":
        """These options with some changed; an unknown name is a TypeError that lists the known ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"kf has no option {', '.join(map(repr, unknown))} (options: {', '.join(sorted(known))})")
        return replace(self, **changes)

    def stable_hash(self) -> str:
        """A hash that is the same in every process (Python's hash() is salted)."""
        fields = {k: v for k, v in asdict(self).items() if k not in ("dump_ir", "dynamic")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
