"""The attention kernel's two products on cooperative matrices (SPIR-V,
VK_KHR_cooperative_matrix): the SIMT kernel (``__init__.py``) with ``q @ k^T`` and
``P @ V`` of each key block computed by the workgroup's subgroups, for f16 q, k, v on a
device that lists an f16 x f16 -> f32 shape.

The online softmax stays the SIMT kernel's (a query row's lanes, its running max, row
sum and f32 accumulators in registers); what changes is where a key block's products
come from:

- Q is staged once in workgroup memory in f16, each K and V tile in f16 too (rows padded
  to 16 bytes); each subgroup multiplies its share of the block's score tiles (m x n of
  the shape, over the head dim) into an f32 S tile in workgroup memory, from which the
  lanes read their scores;
- the lanes write p (after the P chain) rounded to f16 into a P tile, the A operand of
  P @ V; each subgroup multiplies its share of the block's output tiles over the block's
  keys, from zero, into the same f32 tile, and the lanes add it to their rescaled
  accumulators.

The accumulators' layout in a subgroup is the driver's own, so neither product stays in
cooperative matrices across key blocks: the rescaling by exp(m_old - m_new) is the
lanes'. Subgroups take tiles ``sub, sub + subgroups, ...`` of each product (the plan makes
both counts multiples of the subgroups). Written with MLIR's ``gpu.subgroup_mma`` ops
(kf-to-spirv: SPIR-V 1.6, the Vulkan memory model); static sizes only (kf-tile plans a
kernel with run-time sizes without cooperative matrices).
"""

from __future__ import annotations

import math

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith

from ..base import TargetInfo
from ..kernel_ir import GpuFunc, workgroup_memref
from ..matmul.plan import coopmat_shape
from ..subgroup_mma import SubgroupMma

#: f32 registers of scores plus accumulators a lane may hold (the SIMT kernel's bound)
MAX_REGISTER_TILE = 64
#: (threads, BLOCK_M, BLOCK_N) tried in order, largest tiles first
_CANDIDATES = [(t, bm, bn) for t in (128, 256, 64) for bm in (64, 32, 16) for bn in (64, 32, 16)]


def plan(ch, target: TargetInfo, variant) -> dict | None:
    """The plan of the cooperative-matrix attention kernel, or None (the SIMT kernel):
    f16 q, k, v, head dims that are whole tiles of the device's f16 shape, and a tile
    whose Q, K/V, S/O, P and row buffers fit the device's workgroup memory."""
    elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
    if target.name != "spirv" or not getattr(variant, "cooperative_matrix", True) or elems != {"f16"}:
        return None
    shape = coopmat_shape(target, "f16")
    sg = target.subgroup_size
    if shape is None or sg <= 0:
        return None
    cm, cn, ck = shape
    d, dv = ch.head_dim, ch.head_dim_v
    if d % ck or dv % cn:
        return None
    for threads, bm, bn in _CANDIDATES:
        if threads > target.max_threads or threads % sg or threads % bm or bm % cm or bn % cn or bn % ck:
            continue
        subgroups, tpr = threads // sg, threads // bm
        if tpr > 32 or bn % tpr or bn // tpr + -(-dv // tpr) > MAX_REGISTER_TILE:
            continue
        if (bm // cm) * (bn // cn) % subgroups or (bm // cm) * (dv // cn) % subgroups:
            continue
        leads = {"q": d + 8, "kv": max(d, dv) + 8, "so": max(bn, dv) + 4, "p": bn + 8}
        shared = 2 * bm * leads["q"] + 2 * bn * leads["kv"] + 4 * bm * leads["so"] + 2 * bm * leads["p"] + \
            4 * bm * tpr
        if shared > target.max_shared_bytes:
            continue
        batch = math.prod(ch.batch)
        if batch > 65535:
            return None
        return {"block_m": bm, "block_n": bn, "threads": threads, "lanes_per_row": tpr,
                "grid": [-(-ch.seq_q // bm), batch, 1], "shared_bytes": shared, "seq_q": ch.seq_q,
                "seq_k": ch.seq_k, "head_dim": d, "head_dim_v": dv, "batch": list(ch.batch), "unroll": 1,
                "mma": False, "coopmat": True, "coopmat_shape": [cm, cn, ck], "subgroup_size": sg,
                "lead": [leads["q"], leads["kv"], leads["so"], leads["p"]], "vector_bytes": 0}
    return None


def shared_types(plan: dict) -> list[ir.Type]:
    """Q, K/V (f16), S/O (f32), P (f16) and the row exchange (f32)."""
    bm, bn, tpr = plan["block_m"], plan["block_n"], plan["lanes_per_row"]
    q_ld, kv_ld, so_ld, p_ld = plan["lead"]
    f16 = ir.F16Type.get()
    return [workgroup_memref([bm, q_ld], f16), workgroup_memref([bn, kv_ld], f16), workgroup_memref([bm, so_ld]),
            workgroup_memref([bm, p_ld], f16), workgroup_memref([bm, tpr])]


def _my_tiles(g: GpuFunc, plan: dict, sub: ir.Value, cols: int) -> list[tuple[ir.Value, ir.Value]]:
    """(first row, first column) of this subgroup's tiles of a (BLOCK_M x cols) product."""
    cm, cn, _ = plan["coopmat_shape"]
    per_row = cols // cn
    n_tiles = plan["block_m"] // cm * per_row
    subgroups = plan["threads"] // plan["subgroup_size"]
    out = []
    for i in range(n_tiles // subgroups):
        t = g.add(sub, i * subgroups)
        out.append((g.mul(g.div(t, per_row), cm), g.mul(g.rem(t, per_row), cn)))
    return out


def subgroup_mma(g: GpuFunc, plan: dict) -> SubgroupMma:
    return SubgroupMma(g, plan["coopmat_shape"], ir.F16Type.get(), plan["subgroup_size"], plan.get("emulated", False))


def scores(g: GpuFunc, plan: dict, mma: SubgroupMma, sub: ir.Value, Qs: ir.Value, Ks: ir.Value,
           S: ir.Value) -> None:
    """S[:, :BLOCK_N] = Q K^T of the staged tiles (K staged as [key, d]: read as the
    transposed B operand), this subgroup's tiles."""
    ck = mma.k
    for r0, c0 in _my_tiles(g, plan, sub, plan["block_n"]):
        acc = mma.zero()
        for d0 in range(0, plan["head_dim"], ck):
            acc = mma.mma(acc, Qs, [r0, g.c(d0)], Ks, [c0, g.c(d0)], b_transposed=True)
        mma.store(acc, S, [r0, c0])


def products(g: GpuFunc, plan: dict, mma: SubgroupMma, sub: ir.Value, Ps: ir.Value, Vs: ir.Value,
             O: ir.Value) -> None:
    """O[:, :Dv] = P V of the staged tiles (from zero), this subgroup's tiles."""
    ck = mma.k
    for r0, c0 in _my_tiles(g, plan, sub, plan["head_dim_v"]):
        acc = mma.zero()
        for k0 in range(0, plan["block_n"], ck):
            acc = mma.mma(acc, Ps, [r0, g.c(k0)], Vs, [g.c(k0), c0])
        mma.store(acc, O, [r0, c0])


def to_f16(p: ir.Value) -> ir.Value:
    """p rounded to f16, P @ V's A operand."""
    return arith.truncf(ir.F16Type.get(), p)
