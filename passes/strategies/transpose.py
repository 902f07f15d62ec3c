"""The transpose strategy: a swap of a tensor's last two dims, and the elementwise ops kf-fuse
joins after it (fp8's V quantized K-major: cast, scale, clamp, cast to e4m3), as one pass
through workgroup memory.

Why: the generic strategy writes one output element a thread and reads the input at
the transposed index, so a warp's 32 reads land in 32 rows: bf16 V^T of a 4x32x2048x128
tensor reached a small fraction of the copy bandwidth (bench/fp8_attention.py; the
numbers in bench/RESULTS.md, "The quantization before the kernel"), before the
quantization read it again.

Shape of the kernel (TILE = 64 on CUDA; 32 on SPIR-V, where a 64x65 f32 tile would be
more workgroup memory than Vulkan's guaranteed 16 KiB):

    workgroup (batch b, tile of input rows r0.., input cols c0..), TILE x TILE, 256 threads,
    S = 256 / TILE rows a pass
    for k < TILE / S:  tile[ty + S k][tx] = x[b, r0 + ty + S k, c0 + tx]   (rows: coalesced)
    barrier
    for k < TILE / S:  v = tile[tx][ty + S k]                              (column read)
                       out[b, c0 + ty + S k, r0 + tx] = chain(v)           (rows: coalesced)

with tx = thread % TILE, ty = thread / TILE; on CUDA, where the input is 16-bit and both
dims even, a thread moves pairs (``PAIRS``: TILE / 2 threads a tile row). The tile holds
values widened to f32 with a row stride of TILE + 1 words, so the column reads fall in
different banks. Edges of a shape that is not a multiple of TILE are guarded (loads and
stores). The chain is the generic strategy's evaluator at the output index, its
transposed input answered from the tile; other inputs (rank 0 scales, tensors of the
output's shape or broadcast to it) are read at the output index, so they are coalesced
too, and rank-0 ones once.

The transposed value may be an elementwise chain of one kernel input (``cast(v8)``: the
caller's fp8 V widened), each op's other operands rank 0: the tile then holds the input
and the chain runs at the output index.

Not applicable (generic takes it): no transpose or more than one, a transpose of other
dims, its input not such a chain of a kernel input or read elsewhere too, or not a float
of at most 32 bits, ops other than elementwise ones, results of other shapes.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf, vector

from kf.dialects.attrs import op_attrs
from kf.dialects.types import swaps_last_two

from . import emit as E
from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .generic import Evaluator

#: Rows and columns of the tile a workgroup moves (CUDA).
TILE = 64
#: The tile on SPIR-V (Vulkan, Metal): 32 x 33 f32 is 4.2 KiB of the 16 KiB Vulkan
#: guarantees.
SPIRV_TILE = 32
#: Threads a workgroup: TILE columns by THREADS / TILE rows at a time.
THREADS = 256
#: Elements a thread moves at once where the input is 16-bit and both dims are even
#: (a 4-byte load; the stores of the pair are 4 or 2 bytes): a warp's access is then
#: 128 contiguous bytes of a row. 1 gives the one-element kernel back.
PAIRS = 2

_ALSO = frozenset({"kf.fill", "kf.broadcast_to"})


def _check(kernel: ir.Operation) -> tuple[int, tuple[int, ...]]:
    """(the transposed input's argument number, its shape), or NotApplicable."""
    transposes = []
    for op in E.kernel_ops(kernel):
        if op.name == "kf.transpose":
            transposes.append(op)
        elif not (op.name in E.ELEMENTWISE or op.name in _ALSO or (
                op.name == "kf.constant" and ir.DenseElementsAttr(op.attributes["value"]).is_splat)):
            raise NotApplicable(f"{op.name} is neither elementwise nor the transpose")
    if len(transposes) != 1:
        raise NotApplicable("not one transpose")
    [t] = transposes
    if not swaps_last_two(op_attrs(t)["perm"]):
        raise NotApplicable("the transpose does not swap the last two dims")
    x, user = t.operands[0], t
    while not isinstance(x.owner, ir.Block):  # an elementwise chain before the transpose
        d = x.owner.operation
        full = [a for a in d.operands if E.shape_of(a) == E.shape_of(x)]
        if d.name not in E.ELEMENTWISE or len(full) != 1 or any(
                E.shape_of(a) for a in d.operands if a not in full) or any(u.owner != user for u in x.uses):
            raise NotApplicable(f"{d.name} before the transpose is not a chain of one tensor")
        x, user = full[0], d
    if any(u.owner != user for u in x.uses):
        raise NotApplicable("the transposed tensor is read elsewhere too")
    if E.elem_of(x) not in ("f32", "f16", "bf16", "f8E4M3FN", "f8E5M2"):
        raise NotApplicable(f"the tile holds f32 values, not {E.elem_of(x)}")
    out_shape = E.shape_of(t.results[0])
    _, outs = E.kernel_signature(kernel)
    if any(s.shape != out_shape for s in outs):
        raise NotApplicable("results of other shapes than the transpose's")
    return ir.BlockArgument(x).arg_number, E.shape_of(x)


class _FromTile(Evaluator):
    """The generic evaluator, with the transposed input's element at the current output
    index answered by ``current`` (read from the tile)."""

    def __init__(self, kb, inputs, arg: int):
        super().__init__(kb, inputs)
        self.arg, self.current = arg, None

    def load_input(self, arg: int, idx: tuple, elem: str | None = None) -> ir.Value:
        if arg == self.arg:
            return self.current
        return super().load_input(arg, idx, elem)


class TransposeStrategy(Strategy):
    KIND = "transpose"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        arg, shape = _check(kernel)
        tile = TILE if target.name == "cuda" else SPIRV_TILE
        rows, cols = shape[-2], shape[-1]
        batch = E.numel(shape[:-2])
        tiles = batch * -(-rows // tile) * -(-cols // tile)
        if tiles > E.max_grid_x(target.name):
            raise NotApplicable(f"{tiles} tiles are more workgroups than the grid allows")
        ins, outs = E.kernel_signature(kernel)
        narrow = E.ELEM_BYTES[ins[arg].elem] == 2 and all(E.ELEM_BYTES[o.elem] <= 2 for o in outs)
        # kf-to-spirv loads bf16 as scalars: pairs are CUDA's
        vec = PAIRS if narrow and rows % 2 == 0 and cols % 2 == 0 and target.name == "cuda" else 1
        return {"strategy": "transpose", "block": THREADS, "tile": tile, "grid": tiles, "vector_width": vec,
                "shared_bytes": tile * (tile + 1) * 4}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        arg, shape = _check(kernel)
        ins, outs = E.kernel_signature(kernel)
        name = E.kernel_name(kernel)
        tile, block, grid = int(plan["tile"]), int(plan["block"]), int(plan["grid"])
        vec = int(plan.get("vector_width", 1))
        lanes = tile // vec  # threads along a tile row
        step = block // lanes  # rows a pass of the workgroup covers
        per = tile // step  # passes each way
        batch_shape, rows, cols = list(shape[:-2]), shape[-2], shape[-1]
        tiles_r, tiles_c = -(-rows // tile), -(-cols // tile)
        wg = ir.Attribute.parse("#gpu.address_space<workgroup>")
        f32 = ir.F32Type.get()
        tile_t = ir.MemRefType.get([tile, tile + 1], f32, None, wg)
        arg_types = [E.memref_type(s, target.name) for s in [*ins, *outs]]
        body = gpu_module.regions[0].blocks[0]
        with kernel.location:
            with ir.InsertionPoint(body):
                fn = gpu.GPUFuncOp(ir.TypeAttr.get(ir.FunctionType.get(arg_types, [])), sym_name=name, kernel=True,
                                   known_block_size=[block, 1, 1])
            fn.operation.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 1)
            entry = fn.regions[0].blocks.append(*arg_types, tile_t)
            args = list(entry.arguments)
            inputs, outputs, smem = args[:len(ins)], args[len(ins):len(arg_types)], args[-1]
            with ir.InsertionPoint(entry):
                kb = E.IndexBuilder(entry)
                bid = gpu.block_id(gpu.Dimension.x)
                tid = gpu.thread_id(gpu.Dimension.x)
                b, tr, tc = kb.delinearize(bid, [E.numel(batch_shape), tiles_r, tiles_c])
                bidx = kb.delinearize(b, batch_shape) if batch_shape else []
                r0, c0 = kb.mul(tr, tile), kb.mul(tc, tile)
                tx, ty = kb.rem(tid, lanes), kb.div(tid, lanes)
                txv = kb.mul(tx, vec)  # the first of a thread's vec columns in the tile
                ragged_r, ragged_c = rows % tile != 0, cols % tile != 0

                def guarded(conds, fn_):
                    conds = [c for c in conds if not isinstance(c, bool)]
                    if not conds:
                        fn_()
                        return
                    cond = conds[0]
                    for c in conds[1:]:
                        cond = arith.andi(cond, c)
                    g = scf.IfOp(cond)
                    with ir.InsertionPoint(g.then_block):
                        fn_()
                        scf.YieldOp([])

                x_mem = inputs[arg]
                x_elem = ir.MemRefType(x_mem.type).element_type
                for k in range(per):  # input rows into the tile
                    lr = kb.add(ty, k * step)
                    r, c = kb.add(r0, lr), kb.add(c0, txv)

                    def load(r=r, c=c, lr=lr):
                        if vec == 1:
                            values = [E.load(x_mem, [*bidx, r, c], kb)]
                        else:
                            vt = ir.VectorType.get([vec], x_elem)
                            pair = vector.load(vt, x_mem, [kb.value(i) for i in [*bidx, r, c]],
                                               alignment=vec * E.ELEM_BYTES[str(x_elem)])
                            values = [E.widen(vector.extract(pair, [], [e])) for e in range(vec)]
                        for e, v in enumerate(values):
                            memref.store(v, smem, [kb.value(lr), kb.value(kb.add(txv, e))])

                    guarded([kb.lt(r, rows) if ragged_r else True, kb.lt(c, cols) if ragged_c else True], load)
                gpu.barrier()
                ev = _FromTile(kb, inputs, arg)
                for a, spec in enumerate(ins):  # rank-0 inputs (scales) loaded once
                    if not spec.shape:
                        ev.value(E.kernel_body(kernel).arguments[a], ())
                for k in range(per):  # tile columns out as output rows
                    li = kb.add(ty, k * step)  # output row within the tile: an input column
                    i, j = kb.add(c0, li), kb.add(r0, txv)

                    def store(i=i, j=j, li=li):
                        results = [[] for _ in outputs]
                        for e in range(vec):
                            ev.current = memref.load(smem, [kb.value(kb.add(txv, e)), kb.value(li)])
                            with ev.scope():
                                idx = [*bidx, i, kb.add(j, e)]
                                for o, value in enumerate(E.kernel_results(kernel)):
                                    results[o].append(ev.value(value, idx))
                        for mem, values in zip(outputs, results):
                            et = ir.MemRefType(mem.type).element_type
                            at = [kb.value(x) for x in [*bidx, i, j]]
                            if vec == 1:
                                memref.store(E.to_storage(values[0], et), mem, at)
                                continue
                            v = vector.from_elements(ir.VectorType.get([vec], et), [E.to_storage(x, et) for x in values])
                            vector.store(v, mem, at, alignment=vec * E.ELEM_BYTES[str(et)])

                    guarded([kb.lt(i, cols) if ragged_c else True, kb.lt(j, rows) if ragged_r else True], store)
            E.finish(entry)
        return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0,
                             {"strategy": "transpose", "tile": tile, "vector_width": vec})


register(TransposeStrategy())
