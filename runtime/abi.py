"""The one description of a compiled kernel that the compiler writes and the runtime
reads: entry point, tensor arguments, launch geometry, shared memory, artifact kind.

This is the only thing compiler and runtime share (as IREE's compiler and runtime share
only the artifact format). It is plain data, serialized as JSON; it imports neither
mlir nor torch, so a cache hit in a new process needs neither the compiler nor MLIR.

Calling convention (destination passing), the same on every target: the kernel takes
its inputs, then its outputs, each a dense row-major buffer of the given shape and
element type; the launcher allocates outputs and makes inputs contiguous.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

#: kf element type name -> (torch dtype name, bytes per element)
ELEM_INFO: dict[str, tuple[str, int]] = {
    "f64": ("float64", 8), "f32": ("float32", 4), "f16": ("float16", 2), "bf16": ("bfloat16", 2),
    "f8E4M3FN": ("float8_e4m3fn", 1), "f8E5M2": ("float8_e5m2", 1),
    "i1": ("bool", 1), "i32": ("int32", 4), "i64": ("int64", 8),
}


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument: its name in the user's function (or result index), shape, element type."""

    name: str
    shape: tuple[int, ...]
    elem: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ELEM_INFO[self.elem][1]


@dataclass(frozen=True)
class KernelABI:
    """How to launch one kernel. ``args`` index into the program's buffers (see ProgramABI)."""

    entry: str
    args: tuple[int, ...]  # buffer ids, inputs first, then outputs
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0  # dynamic shared (workgroup) memory
    artifact: str = ""  # file name of the binary (ptx / spv / msl / so) beside the metadata
    fused_lines: tuple[str, ...] = ()  # the user's file:line of every op fused here
    extra: dict = field(default_factory=dict)  # per-target details (registers, spills, ...)


@dataclass(frozen=True)
class ProgramABI:
    """A compiled function: its buffers and the kernels launched in order over them.

    Buffers 0..len(inputs)-1 are the user's tensor inputs, the next len(outputs) are the
    results, and the rest are temporaries the launcher allocates for the call.
    """

    target: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    temporaries: tuple[TensorArg, ...] = ()
    kernels: tuple[KernelABI, ...] = ()
    output_aliases: tuple[int, ...] = ()  # for each output: -1, or the input it is a view of

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "ProgramABI":
        d = json.loads(text)

        def targ(x):
            return TensorArg(x["name"], tuple(x["shape"]), x["elem"])

        kernels = tuple(
            KernelABI(k["entry"], tuple(k["args"]), tuple(k["grid"]), tuple(k["block"]), k["shared_bytes"],
                      k["artifact"], tuple(k["fused_lines"]), k["extra"])
            for k in d["kernels"])
        return ProgramABI(d["target"], tuple(map(targ, d["inputs"])), tuple(map(targ, d["outputs"])),
                          tuple(map(targ, d["temporaries"])), kernels, tuple(d.get("output_aliases", ())))
