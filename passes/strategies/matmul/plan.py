"""Which GEMM kernel a matmul kernel function gets, and its tiles: wgmma on sm_90a
(``wgmma.plan``), mma.sync on other CUDA chips with f16/bf16/fp8 operands
(``mma_plan``), cooperative matrices on a SPIR-V device that lists the operands' shape
(``coopmat_plan``), the SIMT kernel elsewhere (``plan``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kf.dialects import spec_of

from ..base import NotApplicable, TargetInfo
from ..kernel_ir import staging_vector_bytes
from ..nvidia.mma_sync import FP8_PTX, MMA_ELEMS
from .gemm import Gemm
from .wgmma import plan as wgmma_plan

@dataclass(frozen=True)
class MatmulVariant:
    """The GEMM kernels' variants (``kf-tile{matmul.<field>=<value>}``): tuning numbers of
    the tensor-core kernels, each a default the planner narrows where the problem or the
    target needs it."""

    #: depth of the tensor-core kernels' cp.async pipeline (stages of A and B tiles); 1
    #: for mma.sync: one staged tile, the next K step's prefetched into registers. Fewer
    #: where shared memory is short.
    stages: int = 4
    #: wgmma groups left in flight at the end of a K step (0 or 1): with 1 the tensor cores
    #: run while the next step waits for its tiles; one more stage is then kept out of the
    #: copies' reach
    inflight: int = 1
    #: the widest BLOCK_N (columns of one wgmma), narrowed while the grid would be less
    #: than a wave of workgroups
    max_block_n: int = 256
    #: mma.sync tiles (16 x 8 each) of a warp in the largest plan: (4, 8) is a 64 x 64 warp
    #: tile and a 128 x 256 workgroup tile, used where it still gives a wave of
    #: workgroups; else (4, 4): 64 x 32 and 128 x 128
    warp_tiles: tuple[int, int] = (4, 8)
    #: bytes of K a row of a staged mma.sync tile; 0 picks by B's layout: 64 when its rows
    #: run along n, 128 when along k (whole 128-byte lines)
    k_bytes: int = 0
    #: workgroups take tiles in groups of this many tile rows, so that the workgroups
    #: running at once share A and B tiles in L2 (0: row by row, the grid's own order)
    group_m: int = 8
    #: SPIR-V: multiply f16 operands with cooperative matrices where the device lists
    #: their shape (VK_KHR_cooperative_matrix); false keeps the SIMT kernel
    cooperative_matrix: bool = True
    #: cooperative-matrix tiles (of the device's M x N) of one subgroup: (2, 2) is 32 x 32
    #: with 16 x 16 tiles; 2 x 2 subgroups make the workgroup's tile
    coopmat_tiles: tuple[int, int] = (2, 2)


def plan(gm: Gemm, target: TargetInfo, variant: MatmulVariant) -> dict:
    """Tiles from the problem size and the target: 128x128 tiles with 8x8 per thread
    on CUDA when both M and N fill them, else 64x64 with 4x4 (256 threads either way,
    within Vulkan's guaranteed limit only for the smaller thread count: the plan
    shrinks the tile until threads and shared memory fit the target). BLOCK_K is
    the largest of 32/16/8 whose two staged tiles fit the shared-memory budget."""
    mma = mma_plan(gm, target, variant)
    if mma is not None:
        return mma
    coop = coopmat_plan(gm, target, variant)
    if coop is not None:
        return coop
    # 128x128 tiles only when they still give about one wave of workgroups (132 SMs
    # on an H200): a small problem keeps more, smaller workgroups busy.
    big = target.name == "cuda" and -(-gm.m // 128) * -(-gm.n // 128) * math.prod(gm.batch) >= 128
    bm, bn, tm, tn = (128, 128, 8, 8) if big else (64, 64, 4, 4)
    while (bm // tm) * (bn // tn) > target.max_threads:
        bm, bn = bm // 2, bn // 2
    threads = (bm // tm) * (bn // tn)
    bk = 8
    for cand in (32, 16, 8):
        if simt_shared_bytes(bm, bn, cand) <= target.max_shared_bytes and cand <= max(8, _pow2_ceil(gm.k)):
            bk = cand
            break
    if simt_shared_bytes(bm, bn, bk) > target.max_shared_bytes:
        raise NotApplicable(f"tiles {bm}x{bn}x{bk} do not fit {target.max_shared_bytes} bytes of shared memory")
    batch = math.prod(gm.batch)
    grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
    if grid[2] > 65535 or grid[1] > 65535:
        raise NotApplicable(f"grid {grid} exceeds the y/z limit")
    return {"block_m": bm, "block_n": bn, "block_k": bk, "thread_m": tm, "thread_n": tn, "threads": threads,
            "grid": grid, "shared_bytes": simt_shared_bytes(bm, bn, bk), "m": gm.m, "n": gm.n, "k": gm.k,
            "batch": list(gm.batch), "mma": False, "vector_bytes": staging_vector_bytes(target)}


def mma_plan(gm: Gemm, target: TargetInfo, variant: MatmulVariant) -> dict | None:
    """Tensor cores (CUDA, f16/bf16/fp8 operands): wgmma where it applies, else
    mma.sync with tiles of 8 warps (2 x 4, each 16 warp_tiles[0] x 8 warp_tiles[1]) when
    they give about a wave of workgroups, else 64x64 of 4 warps (2 x 2, each 32 x 32). K
    per staged tile: ``k_bytes`` of each row. A and B tiles in the input type, rows padded
    by 16 bytes (the fragment loads of a warp hit 32 distinct banks), fragments by
    ldmatrix. With ``stages`` >= 2 and both operands arguments whose staged rows are
    whole 16-byte pieces, the tiles are a cp.async pipeline of that many stages, in
    dynamic shared memory past 48 KiB; else one staged tile, the next prefetched into
    registers."""
    elem = spec_of(gm.mm.operands[0].type).elem
    if target.name != "cuda" or elem not in MMA_ELEMS:
        return None
    if elem in FP8_PTX and _sm(target) < 89:
        raise NotApplicable(f"fp8 tensor cores need sm_89 or later; the target is {target.chip}")
    hopper = wgmma_plan(gm, target, variant)
    if hopper is not None:
        return hopper
    batch = math.prod(gm.batch)
    # the largest workgroup tile that still gives about a wave of workgroups
    warps_m, warps_n, tiles_m, tiles_n = 2, 2, 2, 4
    for wtm, wtn in dict.fromkeys([tuple(variant.warp_tiles), (4, 4)]):
        if -(-gm.m // (32 * wtm)) * -(-gm.n // (32 * wtn)) * batch >= 128:
            warps_m, warps_n, tiles_m, tiles_n = 2, 4, wtm, wtn
            break
    esize = 1 if elem in FP8_PTX else 2
    # B is staged as it lies in memory: k-major ([k, n], read with ldmatrix.trans) when
    # its rows run along n, else n-major ([n, k]); fp8 has no transposing ldmatrix.
    b_k_major = gm.b_n_contiguous and elem not in FP8_PTX
    # 64 bytes of K when B is k-major; 128 when B's rows run along k, so that they are
    # read in whole 128-byte lines
    k_bytes = variant.k_bytes or (64 if b_k_major else 128)
    bm, bn, bk = warps_m * 16 * tiles_m, warps_n * 8 * tiles_n, k_bytes // esize
    threads = 32 * warps_m * warps_n
    pad = 16 // esize
    stage_bytes = esize * (bm * (bk + pad) + (bk * (bn + 8) if b_k_major else bn * (bk + pad)))
    vb = staging_vector_bytes(target)
    a_async = gm.a_direct and gm.a_k_contiguous and (gm.k * esize) % 16 == 0
    b_async = gm.b_direct and (gm.b_n_contiguous == b_k_major) and \
        ((gm.n if b_k_major else gm.k) * esize) % 16 == 0
    stages = variant.stages if variant.stages >= 2 and vb == 16 and a_async and b_async else 1
    while stages > 2 and stages * stage_bytes > target.max_dynamic_shared_bytes:
        stages -= 1
    shared = stages * stage_bytes
    if threads > target.max_threads or shared > (target.max_dynamic_shared_bytes if stages > 1
                                                   else target.max_shared_bytes):
        return None
    grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
    if grid[2] > 65535 or grid[1] > 65535:
        return None
    return {"block_m": bm, "block_n": bn, "block_k": bk, "warps_m": warps_m, "warps_n": warps_n,
            "mma_tiles_m": tiles_m, "mma_tiles_n": tiles_n, "threads": threads, "grid": grid,
            "shared_bytes": shared, "m": gm.m, "n": gm.n, "k": gm.k, "batch": list(gm.batch), "mma": True,
            "vector_bytes": vb, "prefetch": stages == 1, "stages": stages,
            "dynamic_shared": shared > target.max_shared_bytes, "group_m": variant.group_m,
            "ldmatrix": True, "b_k_major": b_k_major}


#: Operand types of the cooperative-matrix kernel (f32 accumulators: kf's precision policy,
#: low-precision operands, f32 sums, one rounding when stored). Not bf16: kf's SPIR-V keeps
#: bf16 as 16-bit integers and computes in f32 (no SPV_KHR_bfloat16), so a bf16 matrix
#: has no SPIR-V type to load into; bf16 matmuls keep the SIMT kernel.
COOPMAT_ELEMS = ("f16",)


def coopmat_shape(target: TargetInfo, elem: str) -> tuple[int, int, int] | None:
    """The (m, n, k) of the first cooperative-matrix shape the device lists for ``elem``
    operands with f32 accumulators and results, or None."""
    for m, n, k, a, b, c, result in target.cooperative_matrix:
        if a == b == elem and c == result == "f32":
            return m, n, k
    return None


def coopmat_plan(gm: Gemm, target: TargetInfo, variant: MatmulVariant) -> dict | None:
    """Cooperative matrices (SPIR-V, VK_KHR_cooperative_matrix) for COOPMAT_ELEMS operands
    where the device lists an (m, n, k, elem, elem, f32, f32) shape at subgroup scope;
    None otherwise (the SIMT kernel). 2 x 2 subgroups, each ``coopmat_tiles`` tiles of
    m x n; K per staged tile: two of the shape's k. Workgroup memory: the A and B tiles in
    the operand type and the f32 C tile the epilogue reads, rows padded to 16 bytes."""
    elem = spec_of(gm.mm.operands[0].type).elem
    if target.name != "spirv" or not variant.cooperative_matrix or elem not in COOPMAT_ELEMS:
        return None
    shape = coopmat_shape(target, elem)
    if shape is None or target.subgroup_size <= 0:
        return None
    cm, cn, ck = shape
    tiles_m, tiles_n = variant.coopmat_tiles
    warps_m = warps_n = 2
    bm, bn, bk = warps_m * tiles_m * cm, warps_n * tiles_n * cn, 2 * ck
    threads = warps_m * warps_n * target.subgroup_size
    a_ld, b_ld, c_ld = bk + 8, bn + 8, bn + 4  # padded rows: 16-byte multiples
    shared = 2 * (bm * a_ld + bk * b_ld) + 4 * bm * c_ld
    if threads > target.max_threads or shared > target.max_shared_bytes:
        return None
    batch = math.prod(gm.batch)
    grid = [-(-gm.n // bn), -(-gm.m // bm), batch]
    if grid[2] > 65535 or grid[1] > 65535:
        return None
    return {"block_m": bm, "block_n": bn, "block_k": bk, "warps_m": warps_m, "warps_n": warps_n,
            "coopmat_tiles_m": tiles_m, "coopmat_tiles_n": tiles_n, "coopmat_shape": [cm, cn, ck],
            "subgroup_size": target.subgroup_size, "lead": [a_ld, b_ld, c_ld], "threads": threads,
            "grid": grid, "shared_bytes": shared, "m": gm.m, "n": gm.n, "k": gm.k, "batch": list(gm.batch),
            "mma": False, "coopmat": True, "vector_bytes": 0}


def simt_shared_bytes(bm: int, bn: int, bk: int) -> int:
    """Workgroup memory of the SIMT kernel's A (padded by a word a row) and B tiles."""
    return (bk * (bm + 1) + bk * bn) * 4


def _sm(target: TargetInfo) -> int:
    """The compute capability of a CUDA target as a number (sm_90 -> 90)."""
    digits = "".join(ch for ch in target.chip if ch.isdigit())
    return int(digits) if digits else 0


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())
