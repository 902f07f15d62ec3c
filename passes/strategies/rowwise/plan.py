"""The rowwise kernels' plans: which kernel a row gets -- registers mode or the loop
kernel -- its threads, vector lanes and rows a workgroup, and the variants
(``RowwiseVariant``) a plan can be told."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..base import TargetInfo
from .analysis import ELEM_BYTES, Analysis, natural, phase_loads


@dataclass(frozen=True)
class RowwiseVariant:
    """The rowwise kernels' variants (``kf-tile{rowwise.<field>=<value>}``): which of the
    two kernels a row gets -- registers mode (a thread keeps its share of the row in
    registers, straight-line code) or the loop kernel (row loops that kf-vectorize and
    kf-promote-shared rewrite) -- and their tuning numbers. bench/RESULTS.md has the
    measurements behind each default."""

    #: registers mode with column partials: the values a thread aims at (more threads a
    #: row, up to the cap, where the row needs them; at the cap, up to ``row_registers``).
    #: Beside each value the thread holds a sum per partial: at 32 values a layer norm's
    #: backward (two partials) took 254 registers a thread in ptxas -v for sm_90a (one
    #: workgroup of 256 threads an SM), at 16 values it takes fewer (0: row_registers).
    #: Chosen by register counts, not yet by timings.
    partial_registers: int = 16
    #: a cap on the vector lanes of row accesses (0: none, the target's widest access,
    #: which moves the most bytes an instruction)
    max_lanes: int = 0
    #: a cap on the threads that share a row (0: one thread per vector of the row, up to
    #: the workgroup limit). Fewer threads a row loop over more vectors each, and more
    #: workgroups (rows) stay resident on a multiprocessor: more loads in flight; 256
    #: keeps a long row's loop short while leaving room for that.
    max_row_threads: int = 256
    #: registers mode where a thread's share of the row fits this many values (0: never,
    #: the loop kernel everywhere). The loop kernel's phases each unpack the row again
    #: from workgroup memory behind a barrier, and a softmax computes exp twice an
    #: element; registers mode loads and computes each element once. 32 values a thread
    #: fit beside a reduction's working set without spilling.
    row_registers: int = 32
    #: registers mode for rows whose narrowest float moved along the row has at most this
    #: many bytes. 2: f16/bf16 rows, where the loop kernel's own instructions (unpacking
    #: and converting halves), not memory, bound it; wider rows take registers mode only
    #: as ``row_registers_wide_capped`` allows.
    row_registers_widest: int = 2
    #: registers mode for wider (f32) rows too where one row fills a workgroup and
    #: ``row_max_registers`` holds the thread to its cap (CUDA). With several rows a
    #: workgroup the loop kernel is as fast and registers mode spills on sm_80: those
    #: rows stay on the loop kernel.
    row_registers_wide_capped: bool = True
    #: threads a workgroup aims at in registers mode: rows short enough for fewer threads
    #: share a workgroup, one group of threads each (reductions of a warp or less are
    #: shuffles only, with no barrier)
    row_block: int = 256
    #: division by a per-row value (layer norm's sqrt(var + eps), softmax's sum):
    #: "narrow" multiplies by its reciprocal, computed once a row, where every output is
    #: f16/bf16 (the f32 results differ by an ulp at most, far below their rounding);
    #: "always"; "never"
    row_reciprocal: str = "narrow"
    #: registers mode: which loads go before the first phase. "rows": the inputs that
    #: change from row to row (from DRAM); a weight is loaded, every chunk at once, by the
    #: first phase that reads it. "pipelined": as "rows", but the output phase loads a
    #: weight's chunk c + 1 before computing chunk c, so that two chunks' weights, not
    #: all, are live beside the row (fewer registers, more workgroups resident). "all":
    #: weights too, their latency off the row's critical path and their registers held
    #: through the reductions.
    row_preload: str = "pipelined"
    #: registers mode on CUDA: the registers ptxas holds a thread to (.maxnreg) where one
    #: row a workgroup holds at most 32 values a thread; 0: ptxas's own choice. Left to
    #: itself ptxas gives the bf16 layer norm more registers than four workgroups of 256
    #: threads a multiprocessor allow; 64 fits them without spilling. With several rows a
    #: workgroup 64 spills, so the cap is not applied there.
    row_max_registers: int = 64

    def __post_init__(self):
        choices = {"row_reciprocal": ("narrow", "always", "never"), "row_preload": ("rows", "pipelined", "all")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"variant '{name}' takes {', '.join(allowed[:-1])} or {allowed[-1]}, "
                                 f"not '{getattr(self, name)}'")
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), int) and getattr(self, f.name) < 0:
                raise ValueError(f"variant '{f.name}' takes an int >= 0, not '{getattr(self, f.name)}'")


def plan(a: Analysis, target: TargetInfo, v: RowwiseVariant) -> dict:
    """The plan of the kernel function analyzed as ``a``: registers mode or the loop
    kernel, threads per row, vector lanes, which inputs' rows the loop kernel caches in
    workgroup memory and how reductions combine across threads."""
    R = a.row_length
    phases = phase_loads(a)
    row_inputs = set().union(*phases)
    # The element types moved along the row: inputs loaded per column, full-row outputs.
    row_elems = [a.inputs[i].elem for i in sorted(row_inputs)] + [
        n.elem for n in a.outputs if any(c and c[0] == "c" for c in natural(a, n))]
    narrow = min((ELEM_BYTES.get(e, 4) for e in row_elems), default=4)
    lanes = max(1, target.vector_bytes // narrow)
    if target.name == "spirv":
        # SPIR-V vectors have at most 4 components (without Vector16), and kf-to-spirv
        # keeps bf16 as i16 storage with scalar conversions: no bf16 vectors there.
        lanes = 1 if "bf16" in row_elems else min(lanes, 4)
    if a.nred != 1:
        lanes = 1
    if v.max_lanes:
        lanes = min(lanes, v.max_lanes)
    threads = min(target.max_threads, max(target.subgroup_size, next_pow2(-(-R // lanes))))
    if v.max_row_threads:
        threads = max(target.subgroup_size, min(threads, v.max_row_threads))

    def reduction_for(block: int) -> str:
        # subgroup butterflies, then one across the subgroups' partials: that second
        # one needs at most a subgroup of them (CUDA: 32 x 32 covers any workgroup)
        return "shuffle" if target.has_shuffle and block <= target.subgroup_size ** 2 else "tree"

    reduction = reduction_for(threads)
    scratch = 2 * (target.subgroup_size if reduction == "shuffle" else threads) * 4
    cached, budget = [], target.max_shared_bytes - scratch
    reads: dict[int, int] = {}
    for loads in phases:
        for arg in loads:
            reads[arg] = reads.get(arg, 0) + 1
    for arg in sorted(reads):
        inp = a.inputs[arg]
        nbytes = R * ELEM_BYTES.get(inp.elem, 4)
        if reads[arg] > 1 and a.nred == 1 and inp.shape[-1:] == (R,) and nbytes <= budget:
            cached.append(arg)
            budget -= nbytes
    outs = [n.elem for n in a.outputs if n.op != "partial"]
    reciprocal = {"always": True, "never": False}.get(
        v.row_reciprocal, bool(outs) and all(e in ("f16", "bf16") for e in outs))
    common = {"rows": a.rows, "row_length": R, "reduction": reduction, "phases": len(a.stats) + 1,
              "reciprocal": reciprocal}
    if a.partials:
        # column partials: a group of threads walks B rows, summing its columns (G groups)
        common.update(groups=a.groups, group_rows=a.rows // a.groups)
    # booleans (a mask beside f32 rows) do not make a row narrow: its floats do
    narrow_float = min((ELEM_BYTES.get(e, 4) for e in row_elems if e.startswith(("f", "bf"))), default=4)
    registers = _registers_plan(a, target, lanes, v)
    # wide rows: where the cap holds one row a workgroup, or one row (group of rows) a
    # workgroup sums column partials on CUDA (the loop kernel would keep the sums in
    # memory and, in the group loop, read its rows from global memory in every phase)
    if registers is not None and narrow_float > v.row_registers_widest and not (
            v.row_registers_wide_capped and (registers["max_registers"] or (
                a.partials and registers["rows_per_block"] == 1 and target.name == "cuda"))):
        registers = None
    if registers is not None:
        T = registers["threads"]
        reduction = reduction_for(T)
        return {**common, "reduction": reduction, **registers, "cache_row": False, "cached_inputs": [],
                "scratch_bytes": 2 * (target.subgroup_size if reduction == "shuffle" else T) * 4}
    return {**common, "mode": "loop", "threads": threads, "vector_lanes": lanes, "cache_row": bool(cached),
            "cached_inputs": cached, "scratch_bytes": scratch}


def _registers_plan(a: Analysis, target: TargetInfo, lanes: int, v: RowwiseVariant) -> dict | None:
    """Registers mode where a thread's share of the row fits ``v.row_registers``
    values: L lanes dividing the row (so every row starts aligned), T threads a row (a
    power of two, at most ``v.max_row_threads``) for at most row_registers // L vectors
    each, and as many rows a workgroup as fill ``v.row_block`` threads."""
    if not v.row_registers or a.nred != 1:
        return None
    R = a.row_length
    L = lanes
    while L > 1 and R % L:
        L //= 2
    nvec = R // L
    cap = min(target.max_threads, v.max_row_threads or target.max_threads)
    cap = 1 << (cap.bit_length() - 1)
    # with column partials a thread also holds a sum per partial and value: aim at fewer
    # values a thread (more threads a row) where the row's threads allow it
    aim = min(v.row_registers, v.partial_registers or v.row_registers) if a.partials else v.row_registers
    T = min(cap, next_pow2(-(-nvec // max(1, aim // L))))
    chunks = -(-nvec // T)
    if chunks * L > v.row_registers:
        return None
    block = max(T, min(v.row_block, target.max_threads))
    P = max(1, min(block // T, next_pow2(a.groups or a.rows)))  # rows (groups of rows) a workgroup
    return {"mode": "registers", "threads": P * T, "row_threads": T, "rows_per_block": P,
            "vector_lanes": L, "chunks": chunks, "preload": v.row_preload,
            "max_registers": _max_registers(target, P, chunks * L, v, bool(a.partials))}


def _max_registers(target: TargetInfo, rows_per_block: int, values: int, v: RowwiseVariant,
                   partials: bool = False) -> int:
    """The registers a thread ptxas is held to (.maxnreg), or 0 for its own choice:
    ``v.row_max_registers`` on CUDA for one row a workgroup of at most 32 values a
    thread (with several rows a workgroup the cap spills; with column partials the
    thread holds their sums beside the row)."""
    if target.name != "cuda" or not v.row_max_registers or rows_per_block > 1 or values > 32 or partials:
        return 0
    return v.row_max_registers


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
