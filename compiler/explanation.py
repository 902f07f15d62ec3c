"""``kf.explain(fn, *args)``: the kernel plan of one specialization, before timing anything.

For each kernel kf will launch it prints the fusion group (the user's lines, with their
source), the strategy and its plan (kf-tile's ``kf.plan``: tile sizes, threads, vector
width), the launch geometry, shared memory, the bytes the kernel must move and the
FLOPs it does, and the roofline floor: the least time the kernel can take on the device
(``max(bytes / bandwidth, FLOPs / peak rate)``). Comparing that floor with what
``kf.profile`` measures is how to tell a kernel that is slow from one that is merely big.

It compiles (or reads the disk cache) for the function's target without running or
loading anything, so the plan of a ``cuda_kernel`` can be read on a machine without a
GPU; ``device="H200"`` picks whose peaks the floors use (default: the device the
target runs on here).
"""

from __future__ import annotations

import linecache
import math
import os
from dataclasses import dataclass, field
from typing import Callable

from . import costs, targets


@dataclass
class KernelPlan:
    """One kernel of the plan, with its expected cost."""

    entry: str
    strategy: str
    fused_lines: tuple[str, ...]
    plan: dict
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_bytes: int
    vector_width: int | None
    nbytes: int
    flops: int
    matmul_flops: int
    elem: str
    floor_s: float | None
    bound: str
    ptxas: dict = field(default_factory=dict)
    occupancy: dict | None = None
    static_shared: int = 0  # workgroup memory declared in the kernel (SPIR-V, ptxas)


@dataclass(repr=False)
class Explanation:
    """What ``kf.explain`` found: the target, the device whose peaks it used, the kernels.
    Its repr is the text, so a REPL shows the plan as ``print`` does."""

    function: str
    signature: str
    target: str
    peak: costs.DevicePeak | None
    kernels: list[KernelPlan]
    compile_seconds: dict

    @property
    def floor_s(self) -> float | None:
        """The roofline floor of the whole call (the kernels run one after another)."""
        floors = [k.floor_s for k in self.kernels]
        return None if any(f is None for f in floors) else sum(floors)

    def __str__(self) -> str:
        out = [f"{self.function}{self.signature}: {len(self.kernels)} kernel(s) on {self.target}"]
        if self.peak is not None:
            out.append(f"device peaks: {self.peak.name}, {self.peak.bytes_per_s / 1e9:.1f} GB/s, "
                       f"{self.peak.vector_flops / 1e12:.3f} TFLOP/s vector"
                       + "".join(f", {e} matmul {v / 1e12:.0f}" for e, v in self.peak.matmul.items()
                                 if v != self.peak.vector_flops)
                       + f" [{self.peak.source}]")
        else:
            out.append("device peaks: unknown for this device (name one: kf.explain(..., device='H200'))")
        for i, k in enumerate(self.kernels):
            out.append("")
            out.append(f"kernel {i}: {k.entry}  strategy={k.strategy or '-'}")
            out.append("  fuses:" + ("" if k.fused_lines else " (no user lines known: the function has no source file)"))
            for line in k.fused_lines:
                file, _, no = line.rpartition(":")
                text = linecache.getline(file, int(no)).strip() if no.isdigit() else ""
                out.append(f"    {os.path.basename(file)}:{no}  {text}")
            plan = {key: v for key, v in k.plan.items() if key not in ("strategy", "target")}
            if plan:
                out.append("  plan:  " + ", ".join(f"{key}={v}" for key, v in plan.items()))
            if not targets.get(self.target).is_gpu:
                out.append("  one loop nest on the host (linalg -> LLVM), vectorized by LLVM")
            else:
                out.append(f"  grid={tuple(k.grid)} block={tuple(k.block)} "
                           f"threads={math.prod(k.grid) * math.prod(k.block)}"
                           f"  shared={k.shared_bytes + k.static_shared} B ({k.static_shared} static)"
                           f"  vector width={k.vector_width or 1}")
            out.append(f"  moves {k.nbytes / 1e6:.3f} MB, {k.flops / 1e6:.3f} MFLOP ({k.matmul_flops / 1e6:.3f} in matmuls), "
                       f"{k.flops / k.nbytes if k.nbytes else 0:.2f} FLOP/byte, {k.elem}")
            if k.ptxas:
                out.append(f"  ptxas: {k.ptxas.get('registers', 0)} registers, "
                           f"{k.ptxas.get('shared_bytes', 0)} B static shared, "
                           f"{k.ptxas.get('spill_store_bytes', 0) + k.ptxas.get('spill_load_bytes', 0)} B spilled"
                           + (f"; occupancy {k.occupancy['occupancy'] * 100:.0f}% "
                              f"({k.occupancy['blocks_per_sm']} blocks/SM, limited by {k.occupancy['limited_by']})"
                              if k.occupancy else ""))
            if k.floor_s is not None:
                out.append(f"  roofline floor: {k.floor_s * 1e6:.2f} us ({k.bound}-bound)")
        if self.floor_s is not None:
            out.append("")
            out.append(f"whole call: at least {self.floor_s * 1e6:.2f} us on {self.peak.name}")
        return "\n".join(out)

    __repr__ = __str__


def _vector_width(plan: dict) -> int | None:
    for key in ("vector_width", "vector_lanes", "vec"):
        if key in plan:
            return int(plan[key])
    return None


def plan_of(meta: dict, peak: costs.DevicePeak | None) -> list[KernelPlan]:
    """The kernel plans of a compiled program's metadata (no MLIR needed)."""
    from kf.runtime.abi import ProgramABI

    abi = ProgramABI.from_json(meta["abi"])
    out = []
    for k in abi.kernels:
        nbytes = costs.kernel_bytes(abi, k)
        flops, mm = int(k.extra.get("flops", 0)), int(k.extra.get("matmul_flops", 0))
        elem = costs.kernel_elem(abi, k)
        floor = peak.floor_seconds(nbytes, flops, mm, elem) if peak is not None else None
        bound = "-"
        if peak is not None:
            bound = "memory" if nbytes / peak.bytes_per_s >= floor * 0.999 else "compute"
        ptxas = dict(k.extra.get("ptxas") or {})
        occ = costs.cuda_occupancy(math.prod(k.block), int(ptxas.get("registers", 0)),
                                   k.shared_bytes + int(ptxas.get("shared_bytes", 0))) if ptxas else None
        plan = dict(k.extra.get("plan") or {})
        out.append(KernelPlan(k.entry if targets.get(abi.target).is_gpu else meta["name"], str(k.extra.get("strategy", "")),
                              tuple(k.fused_lines), plan, tuple(k.grid), tuple(k.block), int(k.shared_bytes),
                              _vector_width(plan), nbytes, flops, mm, elem, floor, bound, ptxas, occ,
                              int(ptxas.get("shared_bytes", 0) or k.extra.get("workgroup_bytes", 0) or 0)))
    return out


def explain(fn: Callable, *args, device: str | None = None, file=None, **kwargs) -> Explanation:
    """Compile ``fn`` for these arguments (or read the cache) and return its kernel plan,
    whose repr is the text (a REPL shows it once; ``print(kf.explain(...))`` in a script);
    ``file`` also prints it there. ``device`` names whose peaks the floors use.

    A model or function compiled with ``torch.compile(..., backend="kf")`` is run on
    the arguments instead, and the result is the backend's report (backend/report.py):
    its kf regions, ops and kernels, and what fell back and why."""
    if _compiled_by_dynamo(fn):
        from .backend.report import explain as explain_compiled

        result = explain_compiled(fn, *args, **kwargs)
        if file is not None:
            print(result, file=file)
        return result
    from . import cache, driver
    from .api import KfFunction
    from .errors import CompileError, debug
    from .guards import walk
    from .options import Options
    from .signature import bind

    kfn = getattr(fn, "__kf_function__", None) or KfFunction(fn, Options())
    sig, tensors = bind(kfn.fn, args, kwargs)
    target = kfn.options.target
    if target == "auto":
        target = targets.BY_DEVICE.get(next(iter(sig.devices()), "cpu"), targets.CPU).name
    options = kfn.options.with_(target=target, interpret=False)
    compiled_for = targets.get(target)
    arch = compiled_for.arch(options)
    try:
        reads = walk(kfn.fn)
        key = cache.key(kfn.fn, sig, options, compiled_for.device_key(options), reads)
        entry = cache.load(key)
        if entry is None:
            meta, artifacts = driver.build(kfn.fn, sig, tensors, options, arch, reads=reads)
            entry = cache.store(key, meta, artifacts)
    except CompileError as e:
        if debug():
            raise
        raise e.with_traceback(None) from None
    meta = entry.meta
    peak = costs.peak_for(target, device)
    result = Explanation(meta["name"], meta.get("signature", ""), target, peak, plan_of(meta, peak),
                         dict(meta.get("compile_seconds", {})))
    if file is not None:
        print(result, file=file)
    return result


def _compiled_by_dynamo(fn) -> bool:
    """Whether fn is what torch.compile returned (a module or a function)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    if dynamo is None:
        return False
    return isinstance(fn, dynamo.OptimizedModule) or hasattr(fn, "_torchdynamo_orig_callable")
