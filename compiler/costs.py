"""What a kernel costs and what the device can do: the numbers behind ``kf.profile``
and ``kf.explain``.

Three things live here, all plain data so that the profiler can use them on a cache
hit without MLIR:

- **work** (``kernel_flops``): FLOPs of a kernel function counted from its kf ops and
  their static shapes, at build time, when the kernel still has its body (kf-map-to-gpu
  leaves a declaration). Matrix products count separately (``matmul_flops``), because
  only they can run at the tensor-core rate; the driver records both in
  ``KernelABI.extra``. Bytes need no recording: a kernel moves at least its input and
  output buffers once (``kernel_bytes``), which is what the roofline's memory floor is.
- **ceilings** (``DevicePeak``, ``peak_for``): a small table of measured peaks, the H200
  from this project's own readings (a device-to-device copy at about 4.25 TB/s counting
  read and written bytes; an 8192³ bf16 product at 680–790 TFLOP/s on random data, 788
  recorded), and for this machine's CPU and lavapipe peaks measured once per process with
  torch (a large copy and an f32 matmul), since a table cannot know an arbitrary CPU.
- **occupancy** (``cuda_occupancy``): resident warps per SM from block size, registers
  and shared memory, by the CUDA occupancy calculator's rules for sm_90.

Counting conventions (stated, so the numbers can be compared across kernels): one FLOP
per output element of an arithmetic op (a transcendental counts one), the input's
element count for a reduction, 5 per element for softmax (max, subtract, exp, sum,
divide), 2·M·N·K per matrix product; data movement (transpose, reshape, broadcast,
slice, gather, cast, fill) counts none.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from typing import Sequence

#: kf ops that move or reinterpret data and do no arithmetic.
_MOVES = {"kf.transpose", "kf.reshape", "kf.broadcast_to", "kf.slice", "kf.concat", "kf.gather",
          "kf.index_select", "kf.cast", "kf.fill", "kf.constant"}
#: FLOPs per element of the op's input (reductions) rather than its output.
_PER_INPUT = {"kf.sum": 1, "kf.mean": 1, "kf.reduce_max": 1, "kf.reduce_min": 1, "kf.argmax": 1,
              "kf.var": 3, "kf.topk": 1}
_PER_OUTPUT = {"kf.softmax": 5, "kf.log_softmax": 5, "kf.gelu": 8}


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def op_flops(name: str, operand_shapes: list[tuple[int, ...]], result_shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    """(FLOPs, of which matrix-product FLOPs) of one kf op, from static shapes."""
    if name == "kf.matmul":
        a, out = operand_shapes[0], result_shapes[0]
        k = a[-1] if a else 1
        f = 2 * _numel(out) * int(k)
        return f, f
    if name in _MOVES or not result_shapes:
        return 0, 0
    if name in _PER_INPUT:
        return _PER_INPUT[name] * _numel(operand_shapes[0]), 0
    if name in ("kf.scatter_add", "kf.index_add", "kf.scatter_reduce"):
        return _numel(operand_shapes[-1]), 0
    return _PER_OUTPUT.get(name, 1) * _numel(result_shapes[0]), 0


def kernel_flops(func_op) -> tuple[int, int]:
    """(FLOPs, matmul FLOPs) of every kf op in a ``func.func`` (kernel or whole function).

    Imports MLIR lazily: this runs at build time only."""
    from kf.dialects.types import spec_of

    def shapes(values) -> list[tuple[int, ...]]:
        out = []
        for v in values:
            try:
                out.append(tuple(spec_of(v.type).shape))
            except Exception:  # a non-tensor value (an index, a token): no elements
                out.append(())
        return out

    kind = func_op.attributes["kf.kernel"] if "kf.kernel" in func_op.attributes else None
    if kind is not None and str(kind).strip('"') == "moe_route":
        # kf-recognize-moe states the routing as a rank of keys (quadratic as written);
        # its strategy is a counting sort of integers: no floating-point work.
        return 0, 0
    total = mm = 0
    for region in func_op.regions:
        for block in region.blocks:
            for op in block.operations:
                op = op.operation
                if not op.name.startswith("kf."):
                    continue
                f, m = op_flops(op.name, shapes(op.operands), shapes(op.results))
                total, mm = total + f, mm + m
    return total, mm


def kernel_bytes(abi, kernel) -> int:
    """Bytes a kernel must move at least: each distinct buffer it reads or writes, once."""
    buffers = list(abi.inputs) + list(abi.outputs) + list(abi.temporaries)
    return sum(buffers[i].nbytes for i in sorted(set(kernel.args)))


def kernel_elem(abi, kernel) -> str:
    """The widest floating element type among a kernel's buffers (what its math runs in)."""
    buffers = list(abi.inputs) + list(abi.outputs) + list(abi.temporaries)
    elems = {buffers[i].elem for i in kernel.args}
    for e in ("f64", "f32", "bf16", "f16", "f8E4M3FN", "f8E5M2"):
        if e in elems:
            return e
    return "f32"


# ----------------------------------------------------------------------------- ceilings


@dataclass(frozen=True)
class DevicePeak:
    """A device's ceilings: bytes/s to and from its memory and FLOP/s by kind of math.

    ``matmul`` maps an element type to the matrix-product rate (tensor cores on NVIDIA),
    ``vector`` is the rate of everything else; ``source`` says where the numbers come from.
    """

    name: str
    bytes_per_s: float
    vector_flops: float
    matmul: dict
    source: str

    def flops_for(self, elem: str, matmul: bool) -> float:
        return float(self.matmul.get(elem, self.vector_flops)) if matmul else self.vector_flops

    def floor_seconds(self, nbytes: float, flops: float, mm_flops: float, elem: str) -> float:
        """The roofline floor: a kernel takes at least the longer of moving its bytes and
        doing its math (matrix products at the matrix rate, the rest at the vector rate)."""
        math_s = mm_flops / self.flops_for(elem, True) + (flops - mm_flops) / self.vector_flops
        return max(nbytes / self.bytes_per_s, math_s)

    def ridge(self, elem: str = "f32", matmul: bool = False) -> float:
        """FLOP per byte above which a kernel is compute-bound."""
        return self.flops_for(elem, matmul) / self.bytes_per_s


#: Measured ceilings of named devices (matched by substring of the device's name).
PEAKS: dict[str, DevicePeak] = {
    "H200": DevicePeak(
        "NVIDIA H200", bytes_per_s=4.25e12, vector_flops=67e12,
        matmul={"bf16": 788e12, "f16": 788e12, "f8E4M3FN": 1576e12, "f8E5M2": 1576e12, "f32": 67e12},
        source="copy 4.25 TB/s and bf16 8192^3 GEMM 788 TFLOP/s, an H200's measured ceilings (bench/bench.py "
               "measures them in each run: 4.18-4.20 TB/s, 772-788 TFLOP/s in bench/RESULTS.md); fp32 and fp8 "
               "rates from the datasheet (fp8 as twice bf16)"),
}


def register_peak(key: str, peak: DevicePeak) -> None:
    """Add or replace the ceilings of devices whose name contains ``key``."""
    PEAKS[key] = peak


_HOST_PEAK: DevicePeak | None = None


def host_peak() -> DevicePeak:
    """This CPU's ceilings, measured once per process with torch (a 64 MiB copy and a
    1024³ f32 matmul, best of three each). lavapipe runs on the same cores.
    ``KF_HOST_PEAK="GBps,GFLOPs"`` sets them instead (reproducible tables in CI)."""
    global _HOST_PEAK
    if _HOST_PEAK is not None:
        return _HOST_PEAK
    fixed = os.environ.get("KF_HOST_PEAK", "")
    if fixed:
        gbs, gflops = (float(x) for x in fixed.split(","))
        _HOST_PEAK = DevicePeak(_cpu_name(), gbs * 1e9, gflops * 1e9, {}, "KF_HOST_PEAK")
        return _HOST_PEAK
    import torch

    src = torch.empty(16 * 1024 * 1024, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    copy = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    mm = min(_timed(lambda: torch.mm(a, b)) for _ in range(3))
    bw = 2 * src.numel() * 4 / copy
    flops = 2 * 1024 ** 3 / mm
    _HOST_PEAK = DevicePeak(_cpu_name(), bw, flops, {"f32": flops},
                            f"measured here with torch ({torch.get_num_threads()} threads): 64 MiB copy, "
                            f"1024^3 f32 matmul")
    return _HOST_PEAK


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            if m:
                return m.group(1).strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "CPU"


def device_name(target: str) -> str:
    """The name of the device a target runs on here ("" if it cannot be asked)."""
    if target == "cuda":
        try:
            import torch

            return torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        except Exception:
            return ""
    if target == "vulkan":
        try:
            from kf.runtime import vulkan

            return vulkan.device().name if vulkan.is_available() else ""
        except Exception:
            return ""
    return _cpu_name()


def peak_for(target: str, device: str | None = None) -> DevicePeak | None:
    """The ceilings for a named device (a key of PEAKS, or a substring of a device name),
    else for the device the target runs on here. On a CPU or lavapipe they are measured."""
    name = device if device is not None else device_name(target)
    for key, peak in PEAKS.items():
        if name and (key.lower() in name.lower() or name.lower() in peak.name.lower()):
            return peak
    if device is not None and device.lower() not in ("cpu", "host", "lavapipe", "llvmpipe"):
        return None
    if target in ("cpu", "vulkan") or device is not None:
        base = host_peak()
        if target == "vulkan" and device is None:
            return DevicePeak(f"{name or 'Vulkan device'}", base.bytes_per_s, base.vector_flops, base.matmul,
                              base.source + "; lavapipe runs on these cores")
        return base
    return None


# ----------------------------------------------------------------------------- occupancy


@dataclass(frozen=True)
class SmLimits:
    """Per-multiprocessor limits the occupancy calculator uses (sm_90 by default)."""

    max_warps: int = 64
    max_blocks: int = 32
    registers: int = 65536
    register_unit: int = 256  # registers are allocated per warp in units of this many
    max_registers_per_thread: int = 255
    shared_bytes: int = 228 * 1024
    shared_reserved_per_block: int = 1024
    shared_unit: int = 128


def cuda_occupancy(threads: int, registers: int, shared_bytes: int, limits: SmLimits = SmLimits()) -> dict:
    """Resident blocks and warps per SM and the fraction of the SM's warps they fill,
    with the limit that binds (``threads``, ``registers`` or ``shared``)."""
    warps = max(1, -(-threads // 32))
    by = {"blocks": limits.max_blocks, "threads": limits.max_warps // warps}
    if registers:
        per_warp = -(-registers * 32 // limits.register_unit) * limits.register_unit
        by["registers"] = (limits.registers // per_warp) // warps if per_warp else limits.max_blocks
    smem = shared_bytes + limits.shared_reserved_per_block
    smem = -(-smem // limits.shared_unit) * limits.shared_unit
    by["shared"] = limits.shared_bytes // smem
    limiter = min(by, key=lambda k: by[k])
    blocks = max(0, by[limiter])
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "occupancy": blocks * warps / limits.max_warps, "limited_by": limiter}
