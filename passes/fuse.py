"""kf-fuse: partition each function into kernels.

Each kernel becomes a private function of kf ops marked ``kf.kernel = "<kind>"`` and
``kf.fused_lines`` (the user's lines it fuses); the function itself becomes the launch
schedule: one ``func.call`` per kernel, in an order that respects dependencies.

Kinds, in the order they are recognized:
- ``attention``: ``matmul(q, k^T)`` -> scale -> optional mask -> ``softmax(-1)`` ->
  ``matmul(., v)``; one kernel, so the score matrix never reaches global memory. With
  what a precision policy writes around the products (casts, rank-0 scales such as
  fp8's dequantization factors, V through a transpose; ``_attention_chains``), and the
  ``kf.logsumexp`` of the softmax's scores that kf's autograd saves: the kernel's second
  output (``attention_lse``).
- ``attention_backward``: the gradients of an attention as kf's autograd writes them
  (P recomputed as ``exp(x - lse)``, D as rowsum(dO * O)): dq, dk and dv of one kernel
  function (passes/fuse_attention_backward.py).
- ``rowwise``: elementwise ops and reductions (sum, mean, max, min, var, softmax,
  log_softmax) over the same trailing dimensions of one row space: layer norm, softmax,
  RMSNorm. Elementwise ops join when their shape is the row shape or a reduced one.
- ``matmul``: a matmul with the elementwise ops that consume its result (bias, GELU)
  and the transposes of its operands' last two dims (``a @ b.t()``). An epilogue op
  that one row or elementwise kernel alone reads moves into that kernel where the GEMM
  then writes fewer bytes (``_trim_epilogues``: logits widened to f32 for their softmax
  are written once, in their own type).
- ``transpose``: any other swap of the last two dims, with the elementwise ops of its
  result's shape after it (fp8's V quantized K-major; ``x.transpose(-1, -2) * s``) and
  an elementwise group that feeds only it (the caller's fp8 V widened): the transpose
  strategy moves it through workgroup memory.
- ``elementwise``: a chain of elementwise ops over one shape, with the ``kf.rand`` ops
  they read (a group that has one merges with elementwise groups only: no other
  strategy computes random numbers), and the slices, concats and transposes that keep
  the last dim (``remaps``): the kernel reads their operand at the moved index, and an
  elementwise chain of another shape that only they read joins it (``_read_moved``:
  rotary embedding's ``cat((-x2, x1)) * sin`` is one kernel). Such a group stays
  elementwise too.
- ``generic``: any other op, one per kernel -- except column reductions (sums over the
  leading dims: a norm's weight and bias gradients), which share one generic kernel per
  input shape, with the elementwise chains they reduce (recomputed from the kernel's
  inputs where the row kernel uses them too: ``_recompute_column_operands``) and the
  casts of their results (``_absorb``).
- column partials (``column_partial``: the sums of blocks of rows that
  kf-split-reductions makes of a column reduction beside a row kernel) join the rowwise
  kernel over the same rows, with their reshape and the elementwise chain only they read
  (``_join_column_partials``): that kernel writes the blocks' sums beside dx, and the
  column kernel after it reduces G blocks' sums instead of all the rows.

A broadcast_to joins elementwise groups like an elementwise op of its result's shape, and
an elementwise group that only one rowwise or column-reduction kernel reads (a cast of a
saved statistic or of a weight) is computed inside that kernel (``_absorb``): a backward
of layer norm or RMSNorm is two kernels, dx's row kernel and the column kernel.

``kf.fill`` ops are cloned into every kernel that uses them (a fill is cheaper to
recompute than to read), and so are rank-0 elementwise ops over rank-0 operands that only
kernels read (``_free_scalars``: fp8's scale arithmetic, ``sq * sk / sqrt(d)``), which
would otherwise each be a one-thread kernel of their own: a launch and a few
microseconds on the GPU between the kernels before and after; and elementwise ops over
iotas, fills and thin broadcast operands (a one-hot of row targets), which would
otherwise be tensors of their result's size in memory. ``kf.constant`` ops stay
in the schedule, so constants reach kernels as inputs. Calls to torch-mlir-imported
functions stay in the schedule too, and so do reshapes between kernels
(``_view_reshapes``): views of their operand's buffer, not copy kernels.
Groups merge only when the merged kernel graph stays acyclic.
"""

from __future__ import annotations

import dataclasses
import heapq
import re

from mlir import ir
from mlir.dialects import func

from kf.dialects import BY_NAME, spec_of
from kf.dialects.attrs import op_attrs, set_sizes_from, sizes_from
from kf.dialects.elements import ELEM_BYTES
from kf.dialects.types import DYN, defining, transposes_last_two

from .base import KfPass, PassError
from .fuse_attention_backward import attention_backward_groups

_REDUCTIONS = {"kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var"}
_ROW_NORMS = {"kf.softmax", "kf.log_softmax"}
_FREE = {"kf.fill", "kf.iota"}
_HOST = {"kf.constant", "func.call"}
#: the most buffers a merge may give one kernel. A Vulkan device may bind as few as 32
#: storage buffers to a kernel (lavapipe's maxPerStageDescriptorStorageBuffers; Metal's
#: argument table has 31); the strategies add a few (run-time sizes, the index error
#: flag, partial sums). Merges are what make a kernel this wide: a model's norm weight
#: gradients, all column sums of one shape, would otherwise be one kernel.
MAX_BUFFERS = 24


def _category(op: ir.Operation) -> str:
    spec = BY_NAME.get(op.name)
    return spec.category if spec else "host"


def _row_shape(op: ir.Operation) -> tuple[tuple[int, ...], int] | None:
    """(row space shape, number of trailing reduced dims) of a row reduction, else None."""
    x = spec_of(op.operands[0].type)
    if op.name in _ROW_NORMS:
        dim = op_attrs(op)["dim"] % max(x.rank, 1)
        return (x.shape, 1) if dim == x.rank - 1 else None
    if op.name in _REDUCTIONS:
        dims = sorted(d % max(x.rank, 1) for d in (op_attrs(op).get("dims") or range(x.rank)))
        n = len(dims)
        if dims != list(range(x.rank - n, x.rank)) or n == x.rank:
            return None
        return (x.shape, n)
    return None


def _reduced(shape: tuple[int, ...], n: int) -> set[tuple[int, ...]]:
    return {shape[:-n] + (1,) * n, shape[:-n]}


@dataclasses.dataclass
class _Group:
    kind: str  # attention, rowwise, matmul, transpose, elementwise, generic
    ops: list  # indices into the op list, sorted
    row: tuple[tuple[int, ...], int] | None = None  # rowwise: (row shape, reduced dims)
    shape: tuple[int, ...] | None = None  # elementwise / matmul output shape
    random: bool = False  # holds a kf.rand (an elementwise group that stays elementwise)
    #: holds a slice, concat or transpose (``remaps``): an elementwise group that stays
    #: elementwise (the other strategies evaluate no moved index)
    remap: bool = False

    @property
    def plain(self) -> bool:
        """An elementwise group that another kind of kernel may take in."""
        return self.kind == "elementwise" and not self.random and not self.remap


class _Partition:
    def __init__(self, ops: list[ir.Operation]):
        self.ops = ops
        self.index = {op: i for i, op in enumerate(ops)}
        self.group_of: dict[int, int] = {}
        self.groups: dict[int, _Group] = {}
        self._next = 0
        self._read_paths: dict[int, list[tuple[int, bool]]] = {}  # _reads of each op (the IR is
        # not changed while it is partitioned)

    def new(self, kind: str, members: list[int], **kw) -> int:
        gid = self._next
        self._next += 1
        self.groups[gid] = _Group(kind, sorted(members), **kw)
        for m in members:
            self.group_of[m] = gid
        return gid

    def producers(self, i: int) -> list[int]:
        """The kernel ops op i reads, also through ops outside the partition (the view
        reshapes the host function keeps between kernels: a path through one is a path)."""
        return [p for p, through_host in self._reads(i) if not through_host]

    def _reads(self, i: int) -> list[tuple[int, bool]]:
        """(kernel op, whether the path to it passes a host op: a call of torch-mlir's
        function) of each path from op i back to a kernel op."""
        known = self._read_paths.get(i)
        if known is None:
            known = self._read_paths[i] = self._walk_reads(i)
        return known

    def _walk_reads(self, i: int) -> list[tuple[int, bool]]:
        out, stack, seen = [], [(v, False) for v in self.ops[i].operands], set()
        while stack:
            v, through_host = stack.pop()
            d = defining(v)
            if d is None or (d, through_host) in seen:
                continue
            seen.add((d, through_host))
            if d in self.index:
                out.append((self.index[d], through_host))
            else:
                host = through_host or not d.name.startswith("kf.")
                stack.extend((o, host) for o in d.operands)
        return out

    def can_merge(self, a: int, b: int) -> bool:
        """Whether groups a and b may be one kernel: it binds at most MAX_BUFFERS buffers
        and the kernel graph stays acyclic."""
        return self.buffers_if_merged(a, b) <= MAX_BUFFERS and self.acyclic_if_merged(a, b)

    def buffers_if_merged(self, a: int, b: int) -> int:
        """The buffers the kernel of groups a and b would bind: the values it reads that
        are computed outside it (a fill or iota it computes itself), and its results read
        outside it."""
        members = {self.ops[m] for m in (*self.groups[a].ops, *self.groups[b].ops)}
        reads, writes = set(), set()
        for op in members:
            for v in op.operands:
                d = defining(v)
                if d not in members and (d is None or d.name not in _FREE):
                    reads.add(v)
            for r in op.results:
                if any(getattr(u.owner, "operation", u.owner) not in members for u in r.uses):
                    writes.add(r)
        return len(reads) + len(writes)

    def acyclic_if_merged(self, a: int, b: int) -> bool:
        """Whether merging groups a and b keeps the kernel graph acyclic: no path from
        one to the other passes through a third group or a host op (a call between two
        kernels runs after the first and before the second)."""
        members = set(self.groups[a].ops) | set(self.groups[b].ops)
        # Walk backwards from the merged group's inputs; reaching the merged group again
        # through an outside op means a cycle.
        seen, stack = set(), []
        for m in members:
            for p, through_host in self._reads(m):
                if p not in members:
                    stack.append(p)
                elif through_host:
                    return False
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            for q, _ in self._reads(p):
                if q in members:
                    return False
                stack.append(q)
        return True

    def merge(self, a: int, b: int) -> int:
        ga, gb = self.groups[a], self.groups.pop(b)
        ga.ops = sorted(set(ga.ops) | set(gb.ops))
        ga.random = ga.random or gb.random
        ga.remap = ga.remap or gb.remap
        for m in gb.ops:
            self.group_of[m] = a
        return a


def _scaled_by(op: ir.Operation, x: ir.Value) -> bool:
    """Whether op is x times or over a rank-0 value (a scale: a fill, or a scalar another
    kernel computed, which becomes an argument): ``x * c``, ``c * x``, ``x / c``."""
    y = scaled_operand(op)
    return y is not None and y == x


def scaled_operand(op: ir.Operation) -> ir.Value | None:
    """For ``x * c``, ``c * x`` or ``x / c`` with c rank-0 and x not: x; else None."""
    if op.name not in ("kf.mul", "kf.div"):
        return None
    a, b = op.operands
    rank0 = [not spec_of(v.type).shape for v in (a, b)]
    if rank0[1] and not rank0[0]:
        return a
    if op.name == "kf.mul" and rank0[0] and not rank0[1]:
        return b
    return None


def _float_cast(op: ir.Operation) -> bool:
    return op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(op.result.type).is_float


def score_chain(sm: ir.Operation) -> tuple[list[ir.Operation], ir.Operation | None]:
    """(the ops from a softmax's operand back to the scores' matmul -- casts, scales,
    masks and the comparison a masked_fill reads, softmax side first -- and that
    ``q @ k^T`` matmul, or None where the walk ends elsewhere). An op ``c * s`` is walked
    as ``s * c`` (the seed's scale, fp8's dequantization)."""
    between, cur = [], defining(sm.operands[0])
    while cur is not None and cur.name in ("kf.masked_fill", "kf.select", "kf.add", "kf.div", "kf.mul", "kf.cast"):
        between.append(cur)
        if cur.name == "kf.masked_fill":
            m = defining(cur.operands[1])
            if m is not None and m.name == "kf.cmp":
                between.append(m)
        if cur.name == "kf.add":
            # an additive mask widened to the scores' type (a 16-bit SDPA's, added to f32
            # scores): the kernel reads the mask as it lies and widens it there
            m = defining(cur.operands[1])
            if m is not None and _float_cast(m) and len(list(m.result.uses)) == 1:
                between.append(m)
        x = scaled_operand(cur)
        cur = defining(cur.operands[2] if cur.name == "kf.select" else x if x is not None else cur.operands[0])
    return between, (cur if cur is not None and cur.name == "kf.matmul" else None)


def _attention_chains(ops: list[ir.Operation]) -> list[list[ir.Operation]]:
    """Ops of each matmul -> scale -> mask -> softmax -> matmul chain, with what the
    precision policy writes around it (passes/apply_precision.py): casts and rank-0
    scales between q k^T and the softmax, a "P chain" of casts and rank-0 scales from
    the softmax to the second matmul, V read through a transpose (fp8's K-major V), an
    epilogue of rank-0 scales and casts after the second matmul, and the row logsumexp
    of the softmax's scores where the function computes it (``attention_lse``)."""
    chains = []
    for op in ops:
        if op.name != "kf.matmul":
            continue
        # the P chain: casts and rank-0 scales from the softmax to mm2's A operand
        p_chain, cur = [], defining(op.operands[0])
        while cur is not None and (_float_cast(cur) or scaled_operand(cur) is not None):
            p_chain.append(cur)
            cur = defining(cur.operands[0] if _float_cast(cur) else scaled_operand(cur))
        sm = cur
        if sm is None or sm.name != "kf.softmax" or _row_shape(sm) is None:
            continue
        between, cur = score_chain(sm)
        if cur is None:
            continue
        chain = [op, sm, *p_chain, *between, cur]
        kt = defining(cur.operands[1])
        if kt is not None and kt.name == "kf.transpose":
            chain.append(kt)
        # V read through a transpose joins when it is fp8 (stored K-major, as fp8 tensor
        # cores read it); a 16-bit one is a transpose kernel of its own, so that the
        # attention kernel reads V as it lies (what its tensor-core plans take)
        vt = defining(op.operands[1])
        if transposes_last_two(vt) and all(u.owner == op for u in vt.result.uses) and \
                spec_of(vt.result.type).elem.startswith("f8"):
            chain.append(vt)
        # the epilogue: rank-0 scales and casts, each the only use of the one before
        last = op
        while True:
            uses = list(last.results[0].uses)
            if len(uses) != 1:
                break
            nxt = uses[0].owner
            nxt = getattr(nxt, "operation", nxt)
            if not (_float_cast(nxt) or _scaled_by(nxt, last.results[0])):
                break
            chain.append(nxt)
            last = nxt
        # The row logsumexp of the scores (what kf's autograd saves): the kernel's second
        # output, from the running max and sum it keeps anyway.
        lse = [u for u in _users(sm.operands[0]) if u.name == "kf.logsumexp" and attention_lse(u, sm, op)]
        chain += lse[:1]
        # Every intermediate must be used only inside the chain.
        members = set(chain)
        if all(all(u.owner in members for r in c.results for u in r.uses) for c in chain
               if c is not last and c not in lse[:1]):
            chains.append(chain)
    return chains


def _users(v: ir.Value) -> list[ir.Operation]:
    return [getattr(u.owner, "operation", u.owner) for u in v.uses]


def attention_lse(op: ir.Operation, sm: ir.Operation, mm2: ir.Operation) -> bool:
    """Whether the attention kernel of softmax ``sm`` and second product ``mm2`` writes
    ``kf.logsumexp`` op as its second output: the natural-log logsumexp of the scores
    the softmax reads over their last dim, f32 or f64, of shape ``[..., Sq]`` (or
    ``[..., Sq, 1]``) with the output's leading dims."""
    x = spec_of(op.operands[0].type)
    out = spec_of(op.result.type)
    dims = [d % max(x.rank, 1) for d in (op_attrs(op).get("dims") or range(x.rank))]
    if op.operands[0] != sm.operands[0] or dims != [x.rank - 1] or out.elem not in ("f32", "f64"):
        return False
    rows = spec_of(mm2.results[0].type).shape[:-1]
    return out.shape in (rows, rows + (1,))


def _operand_transposes(mm: ir.Operation) -> list[ir.Operation]:
    """The kf.transpose ops that swap the last two dims of a matmul operand and feed only
    it (``a @ b.t()``, ``torch._scaled_mm``'s column-major operand): they join the matmul's
    kernel, which reads the untransposed tensor along its contiguous dim, instead of a
    kernel of their own that would write the transpose out."""
    out = []
    for v in mm.operands:
        t = defining(v)
        if transposes_last_two(t) and all(u.owner == mm for u in t.results[0].uses):
            out.append(t)
    return out


def partition(ops: list[ir.Operation]) -> _Partition:
    """Group the kernel ops of one function (no fills, constants or calls)."""
    part = _Partition(ops)
    for chain in _attention_chains(ops):
        idx = [part.index[c] for c in chain if c in part.index]
        if any(i in part.group_of for i in idx):
            continue
        part.new("attention", idx)
    for group in attention_backward_groups(ops):
        idx = [part.index[c] for c in group]
        if not any(i in part.group_of for i in idx):
            part.new("attention_backward", idx)

    for i, op in enumerate(ops):
        if op.name == "kf.matmul" and i not in part.group_of:
            operands = [part.index[t] for t in _operand_transposes(op) if part.index.get(t) is not None
                        and part.index[t] not in part.group_of]
            if operands:
                part.new("matmul", [i, *operands], shape=spec_of(op.results[0].type).shape)

    for i, op in enumerate(ops):
        if i in part.group_of:
            continue
        cat = _category(op)
        row = _row_shape(op)
        shape = spec_of(op.results[0].type).shape if op.results else None
        if row is not None:
            gid = part.new("rowwise", [i], row=row)
        elif op.name == "kf.matmul":
            part.new("matmul", [i], shape=shape)
            continue
        elif transposes_last_two(op):  # the elementwise ops after it join (_merge_kind)
            gid = part.new("transpose", [i], shape=shape)
            for p in part.producers(i):  # and an elementwise chain that only feeds it
                pg = part.group_of[p]
                if pg != gid and part.groups[pg].plain and _feeds_only(part, pg, op) \
                        and part.can_merge(pg, gid):
                    gid = part.merge(pg, gid)
                    part.groups[gid].kind, part.groups[gid].shape = "transpose", shape
            continue
        elif remaps(op):
            gid = part.new("elementwise", [i], shape=shape, remap=True)
        elif cat in ("elementwise", "random") or op.name == "kf.broadcast_to":
            # (a broadcast is elementwise over its result: both strategies read it so)
            gid = part.new("elementwise", [i], shape=shape, random=cat == "random")
        else:
            part.new("generic", [i])
            continue
        # Join producer groups this op is compatible with.
        for p in part.producers(i):
            pg = part.group_of[p]
            g = part.groups[gid]
            other = part.groups[pg]
            if pg == gid:
                continue
            merged = _merge_kind(other, g, op)
            if merged is None and _read_moved(part, pg, gid, op):
                merged = "elementwise", None, g.shape
            if merged is not None and part.can_merge(pg, gid):
                kind, row_, shape_ = merged
                gid = part.merge(pg, gid)
                part.groups[gid].kind, part.groups[gid].row, part.groups[gid].shape = kind, row_, shape_
    return part


def _column_reduction(op: ir.Operation) -> tuple | None:
    """(input shape, reduced dims) of a sum/mean/max/min over leading dims only of a
    tensor of rank >= 2 (a weight's or a bias's gradient: ``sum(dy * xhat, 0)``), else None."""
    if op.name not in _REDUCTIONS or op.name == "kf.var":
        return None
    x = spec_of(op.operands[0].type)
    dims = sorted(d % max(x.rank, 1) for d in (op_attrs(op).get("dims") or range(x.rank)))
    if x.rank < 2 or not dims or dims != list(range(len(dims))) or len(dims) == x.rank:
        return None
    return x.shape, tuple(dims)


def column_partial(op: ir.Operation) -> ir.Value | None:
    """e for the partial sums of a column reduction's blocks (kf-split-reductions'
    ``column_block``): ``kf.sum`` over dim 1, keepdim false, of ``kf.reshape(e)`` from
    ``[lead..., cols...]`` to ``[G, B, cols...]`` (G x B the leading dims' product); else None."""
    if op.name != "kf.sum":
        return None
    attrs = op_attrs(op)
    r = defining(op.operands[0])
    if r is None or r.name != "kf.reshape" or attrs.get("keepdim") or list(attrs.get("dims") or []) != [1]:
        return None
    e = r.operands[0]
    src, blocks = spec_of(e.type).shape, spec_of(r.result.type).shape
    cols = blocks[2:]
    if len(blocks) < 3 or len(src) <= len(cols) or tuple(src[len(src) - len(cols):]) != tuple(cols):
        return None
    lead = 1
    for d in src[:len(src) - len(cols)]:
        lead *= d
    return e if lead == blocks[0] * blocks[1] else None


def _partial_reshapes(body: list[ir.Operation]) -> set:
    """The reshapes that only column partials (``column_partial``) read: part of the
    partial's kernel (a rowwise kernel reads the rows it sums where it computes them),
    not views."""
    out = set()  # (ids of body's own objects: an operation's Python object is not unique)
    for op in body:
        if op.name == "kf.reshape" and all(column_partial(getattr(u.owner, "operation", u.owner)) is not None
                                           for u in op.result.uses):
            out.add(id(op))
    return out


def _join_column_partials(part: _Partition) -> None:
    """A column partial (``column_partial``) and its reshape join the rowwise kernel over
    the rows it sums -- the one that computes them, or else one that reads them as an
    input --, which then writes each group of rows' column sums beside its own outputs
    (the rowwise strategy's partial outputs): the rows are read once, by the row kernel,
    and the last stage reads G rows of partial sums. Without such a kernel the partial
    stays a generic kernel of its own."""
    for i, op in enumerate(part.ops):
        e = column_partial(op)
        if e is None or i not in part.group_of:
            continue
        gid = part.group_of[i]
        r = defining(op.operands[0])
        if r in part.index and part.group_of[part.index[r]] != gid:
            gid = part.merge(gid, part.group_of[part.index[r]])
        # the elementwise chains that only the partial reads (RMSNorm's dy * x * rstd) join it
        changed = True
        while changed:
            changed = False
            for p in {part.group_of[p] for m in part.groups[gid].ops for p in part.producers(m)} - {gid}:
                pg = part.groups[p]
                if pg.plain and _group_users(part, p) == {gid} \
                        and part.can_merge(gid, p):
                    gid = part.merge(gid, p)
                    changed = True
                    break
        space = tuple(spec_of(e.type).shape)
        members = {part.ops[m] for m in part.groups[gid].ops}
        reads = {v for o in members for v in o.operands if defining(v) not in members}
        candidates = [part.group_of[p] for m in part.groups[gid].ops for p in part.producers(m)]
        candidates += [g for g, grp in part.groups.items() if grp.kind == "rowwise" and any(
            v in reads for m in grp.ops for v in part.ops[m].operands)]
        for target in dict.fromkeys(candidates):
            tg = part.groups.get(target)
            if target == gid or tg is None or tg.kind != "rowwise" or tg.row[0] != space:
                continue
            if part.can_merge(target, gid):
                part.merge(target, gid)
                break


def _group_users(part: _Partition, gid: int) -> set:
    """The groups that read what group gid computes (None for a use outside the kernels)."""
    members = {part.ops[m] for m in part.groups[gid].ops}
    out: set = set()
    for m in part.groups[gid].ops:
        for r in part.ops[m].results:
            for u in r.uses:
                owner = getattr(u.owner, "operation", u.owner)
                if owner in members:
                    continue
                out.add(part.group_of.get(part.index.get(owner)) if owner in part.index else None)
    return out


def _reads_a_view(part: _Partition, gid: int) -> bool:
    """Whether group gid reads a kf op the schedule keeps between kernels (a view
    reshape): merged with the group behind the view, the view would both read the kernel
    and feed it -- a cycle ``acyclic_if_merged`` does not see (it walks through views)."""
    for m in part.groups[gid].ops:
        for v in part.ops[m].operands:
            d = defining(v)
            if d is not None and d not in part.index and d.name.startswith("kf.") and d.name not in _FREE \
                    and spec_of(v.type).rank > 0:
                return True
    return False


def _absorb(part: _Partition) -> None:
    """Second-round merges that the op-by-op walk of ``partition`` cannot see:

    - column reductions of one input shape over the same leading dims that read a
      tensor in common, themselves or through their elementwise producers (a norm's
      weight and bias gradients, both of dy), become one generic kernel -- a thread per
      column, both sums in it -- with the elementwise ops after them of their result's
      shape (the casts to the parameters' type); the norms of other layers read other
      tensors and stay kernels of their own;
    - an elementwise group that feeds only one rowwise or column-reduction group, over
      shapes that group reads (the row space, a reduced shape, the columns: a cast of a
      saved statistic or of a weight), is computed inside it rather than written out."""
    columns: dict = {}
    for gid, g in list(part.groups.items()):
        if g.kind == "generic" and len(g.ops) == 1:
            key = _column_reduction(part.ops[g.ops[0]])
            if key is not None:
                columns.setdefault(key, []).append(gid)
    column_groups: dict = {}
    for key, gids in columns.items():
        joined: list = []  # (group, the tensors it and its elementwise producers read)
        for gid in gids:
            reads = _column_sources(part, gid)
            for j, (other, seen) in enumerate(joined):
                if reads & seen and part.can_merge(other, gid):
                    joined[j] = (part.merge(other, gid), seen | reads)
                    break
            else:
                joined.append((gid, reads))
        for gid, _ in joined:
            column_groups[gid] = key
    changed = True
    while changed:
        changed = False
        for gid, g in list(part.groups.items()):
            if gid not in part.groups or not g.plain or _reads_a_view(part, gid):
                continue
            users = _group_users(part, gid)
            if len(users) == 1 and None not in users:
                (target,) = users
                tg = part.groups.get(target)
                if tg is not None and tg.kind == "rowwise":
                    space, n = tg.row
                    fits = g.shape in {space, space[-n:]} | _reduced(space, n)
                elif target in column_groups:
                    # the generic strategy reads any operand that broadcasts to the input
                    fits = _broadcasts_to(g.shape, column_groups[target][0])
                else:
                    continue
                if fits and part.can_merge(target, gid):
                    part.merge(target, gid)
                    changed = True
                continue
            # the casts after the column reductions: elementwise ops of their result's shape
            producers = {part.group_of[p] for m in g.ops for p in part.producers(m)} - {gid}
            if len(producers) == 1:
                (source,) = producers
                if source in column_groups and g.shape == _reduced_shape(*column_groups[source]) \
                        and part.can_merge(source, gid):
                    part.merge(source, gid)
                    changed = True


def _column_sources(part: _Partition, gid: int) -> set:
    """What a column reduction group reads: the tensors (rank >= 1, not fills) it and
    the elementwise groups it reads from read, and the groups that compute them (a row
    kernel that writes the partial sums of two columns)."""
    out: set = set()

    def add(op: ir.Operation) -> None:
        for v in op.operands:
            d = defining(v)
            if isinstance(v.type, ir.RankedTensorType) and v.type.rank >= 1 and (d is None or d.name not in _FREE):
                out.add(v)

    for m in part.groups[gid].ops:
        add(part.ops[m])
        for p in part.producers(m):
            out.add(("group", part.group_of[p]))
            pg = part.groups[part.group_of[p]]
            if pg.plain:
                for k in pg.ops:
                    add(part.ops[k])
    return out


def _trim_epilogues(part: _Partition) -> None:
    """A matmul kernel's epilogue op that only one rowwise or elementwise kernel reads
    moves into that kernel where the matmul kernel then writes fewer bytes: its operands
    from the matmul kernel are written out anyway, or are narrower than its result.
    Greedy merging put every elementwise consumer of the product in the epilogue; where
    the product is written out for a row kernel anyway (logits beside their softmax), a
    widening cast or a product with a one-hot there only adds tensors of the product's
    size to write and read back."""
    for gid, g in list(part.groups.items()):
        if g.kind != "matmul":
            continue
        changed = True
        while changed:
            changed = False
            members = {part.ops[m] for m in g.ops}
            for m in reversed(g.ops):
                op = part.ops[m]
                if op.name == "kf.matmul" or transposes_last_two(op) or len(op.results) != 1:
                    continue
                target = _sole_row_user(part, gid, op)
                if target is None:
                    continue
                leaving = [v for v in op.operands if defining(v) in members and not _leaves(v, members, op)]
                if sum(_bytes(v) for v in leaving) >= _bytes(op.results[0]):
                    continue
                g.ops.remove(m)
                part.groups[target].ops = sorted(part.groups[target].ops + [m])
                part.group_of[m] = target
                changed = True
                break


def _sole_row_user(part: _Partition, gid: int, op: ir.Operation) -> int | None:
    """The one rowwise or elementwise group that reads op's result, where nothing else
    does (the matmul group itself, another kernel, the return or a host op) and that
    group computes over op's shape."""
    users = set()
    for u in op.results[0].uses:
        owner = getattr(u.owner, "operation", u.owner)
        users.add(part.group_of.get(part.index.get(owner)) if owner in part.index else None)
    if len(users) != 1 or None in users or gid in users:
        return None
    (target,) = users
    tg = part.groups[target]
    shape = spec_of(op.results[0].type).shape
    if tg.kind == "rowwise":
        space, n = tg.row
        return target if shape in {space, space[-n:]} | _reduced(space, n) else None
    return target if tg.plain and tg.shape == shape else None


def _leaves(v: ir.Value, members: set, but: ir.Operation) -> bool:
    """Whether something outside members other than ``but`` reads v."""
    return any(getattr(u.owner, "operation", u.owner) not in members | {but} for u in v.uses)


def _bytes(v: ir.Value) -> int:
    spec = spec_of(v.type)
    return _numel(spec.shape) * ELEM_BYTES[spec.elem]


def _broadcasts_to(shape: tuple | None, target: tuple) -> bool:
    if shape is None or len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def _reduced_shape(shape: tuple, dims: tuple) -> tuple:
    return shape[len(dims):]


def _recompute_column_operands(op: ir.Operation) -> None:
    """A column reduction (``_column_reduction``) of an elementwise chain that something
    else reads too reads a copy of the chain instead (back to the values no elementwise
    op makes): its kernel recomputes ``dy * xhat`` from dy, x and the row statistics
    rather than the row kernel writing the product out in f32 for it to read. Not where
    the reduced value is a result of the function (the kernels write it anyway)."""
    if _column_reduction(op) is None:
        return
    if any(getattr(u.owner, "operation", u.owner).name == "func.return" for u in op.operands[0].uses):
        return  # written out anyway (a bias's gradient is the sum of dx): read it
    chain, stack, seen = [], [op.operands[0]], set()
    while stack:
        d = defining(stack.pop())
        if d is None or d in seen or _category(d) != "elementwise" or d.name == "kf.fill":
            continue
        seen.add(d)
        chain.append(d)
        stack.extend(d.operands)
    if not chain:
        return
    if all(all(getattr(u.owner, "operation", u.owner) in seen or getattr(u.owner, "operation", u.owner) == op
               for u in d.result.uses) for d in chain):
        return  # nothing else reads it: the chain joins the reduction's kernel as it is
    mapping: dict = {}
    with ir.InsertionPoint(op):
        for d in _in_block_order(chain):
            clone = d.clone()
            for i, v in enumerate(d.operands):
                if v in mapping:
                    clone.operands[i] = mapping[v]
            mapping[d.result] = clone.result
    op.operands[0] = mapping[op.operands[0]]
    for d in reversed(_in_block_order(chain)):  # what only the reduction read is dead now
        if not list(d.result.uses):
            d.erase()


def _in_block_order(ops: list[ir.Operation]) -> list[ir.Operation]:
    """ops sorted by their position in their (shared) block."""
    block = ops[0].parent.regions[0].blocks[0]
    wanted = set(ops)
    return [o.operation for o in block.operations if o.operation in wanted]


def _feeds_only(part: _Partition, gid: int, op: ir.Operation) -> bool:
    """Whether everything group gid computes is used inside it or by op alone."""
    members = {part.ops[m] for m in part.groups[gid].ops} | {op}
    for m in part.groups[gid].ops:
        for r in part.ops[m].results:
            for u in r.uses:
                if getattr(u.owner, "operation", u.owner) not in members:
                    return False
    return True


def remaps(op: ir.Operation) -> bool:
    """Whether op only moves elements, and an elementwise kernel reads its operand at the
    moved index instead of a kernel of its own writing it out: a slice (``x[..., 8:]``), a
    concat (rotary embedding's ``cat((-x2, x1), -1)``) or a transpose that keeps the last
    dim (``[B, S, H, D] -> [B, H, S, D]``: reads stay along rows)."""
    if op.name in ("kf.slice", "kf.concat"):
        return True
    if op.name == "kf.transpose":
        perm = list(op_attrs(op)["perm"])
        return bool(perm) and perm[-1] == len(perm) - 1 and perm != sorted(perm)
    return False


def _read_moved(part: _Partition, pg: int, gid: int, op: ir.Operation) -> bool:
    """Whether elementwise group pg, of another shape than op's group gid, joins gid
    because op moves its elements (``remaps``) and nothing else reads what pg computes:
    the merged kernel evaluates pg's chain at op's moved index and writes only gid's
    outputs (of one shape, as the elementwise strategy needs)."""
    producer, consumer = part.groups[pg], part.groups[gid]
    if not remaps(op) or producer.kind != "elementwise" or consumer.kind != "elementwise":
        return False
    if producer.random or consumer.random:
        return False
    members = {part.ops[m] for m in producer.ops + consumer.ops} | {op}
    return all(getattr(u.owner, "operation", u.owner) in members
               for m in producer.ops for r in part.ops[m].results for u in r.uses)


def _merge_kind(producer: _Group, consumer: _Group, op: ir.Operation):
    """The kind of the merged group, or None when the two do not fuse."""
    out_shape = spec_of(op.results[0].type).shape
    if (producer.random or consumer.random or producer.remap or consumer.remap) and \
            not (producer.kind == consumer.kind == "elementwise"):
        return None
    if producer.kind == "matmul" and consumer.kind == "elementwise" and consumer.ops and out_shape == producer.shape:
        return "matmul", None, producer.shape
    if producer.kind == "transpose" and consumer.kind == "elementwise" and out_shape == producer.shape:
        return "transpose", None, producer.shape
    rows = [g.row for g in (producer, consumer) if g.kind == "rowwise"]
    if producer.kind not in ("rowwise", "elementwise") or consumer.kind not in ("rowwise", "elementwise"):
        return None
    if not rows:
        if producer.shape == consumer.shape:
            return "elementwise", None, producer.shape
        return None
    row = rows[0]
    if any(r[0] != row[0] for r in rows):
        return None
    allowed = {row[0]} | _reduced(row[0], max(r[1] for r in rows))
    for g in (producer, consumer):
        if g.kind == "elementwise" and g.shape not in allowed:
            return None
    return "rowwise", (row[0], max(r[1] for r in rows)), None


def _loc_line(loc: ir.Location) -> str | None:
    m = re.search(r'loc\("([^"]+)":(\d+):\d+', str(loc))
    return f"{m.group(1)}:{m.group(2)}" if m else None


@dataclasses.dataclass(frozen=True)
class FusePass(KfPass):
    NAME = "kf-fuse"
    DESCRIPTION = "partition functions into kernels (attention, rowwise, matmul, transpose, elementwise, generic)"

    def run(self, module: ir.Operation) -> None:
        for f in list(module.regions[0].blocks[0].operations):
            f = f.operation
            if f.name != "func.func" or "kf.kernel" in f.attributes or "sym_visibility" in f.attributes:
                continue
            if not f.regions[0].blocks:
                continue
            _check_function(f)
            _fuse_function(module, f)


def _check_function(f: ir.Operation) -> None:
    """A PassError for a function kf-fuse cannot partition: one of several blocks
    (branches; kf's capture writes straight-line functions), or one with an op on tensors
    that is neither a kf op nor a call (its operands and results would not be ordered
    with the kernels that make and read them)."""
    name = ir.StringAttr(f.attributes["sym_name"]).value
    blocks = list(f.regions[0].blocks)
    if len(blocks) > 1:
        raise PassError(f"function @{name} has {len(blocks)} blocks: kf-fuse partitions straight-line functions "
                        "(one block, as kf's capture writes them)", f.location)
    for op in blocks[0].operations:
        op = op.operation
        if op.name.startswith("kf.") or op.name in ("func.call", "func.return"):
            continue
        values = list(op.operands) + list(op.results)
        if any(isinstance(v.type, ir.RankedTensorType) or isinstance(v.type, ir.UnrankedTensorType)
               for v in values):
            raise PassError(f"{op.name} on tensors in @{name}: kf-fuse partitions kf ops and calls; write it "
                            "as a kf op (or lower the function with kf-lower-to-linalg instead)", op.location)


def _view_reshapes(body: list[ir.Operation]) -> list[ir.Operation]:
    """The kf.reshape ops that stay in the schedule as views instead of becoming copy
    kernels: kf tensors are row-major and contiguous, so a reshape is the same bytes under
    another shape, and kernels take bare pointers (the schedule gives the reshape's result
    its operand's buffer). A reshape of a returned value is a view of that output's
    buffer; a returned reshape is its operand's buffer too where a kernel computes the
    operand for it alone (``returned_view``: the kernel writes the output's bytes, as
    AOTAutograd's forward returns the views of activations it saves). Left to a kernel:
    reshapes of fills (no buffer), returned reshapes of inputs and of returned values
    (two outputs are two tensors), and all but the first returned reshape of a value."""
    ret = next(op for op in body if op.name == "func.return")
    returned = set(ret.operands)
    out = []
    for op in body:
        if op.name != "kf.reshape":
            continue
        if op.result in returned and not returned_view(op, returned):
            continue
        d = defining(op.operands[0])
        if d is not None and d.name in _FREE:
            continue
        out.append(op)
    return out


def returned_view(op: ir.Operation, returned: set) -> bool:
    """Whether reshape op, whose result the function returns, can be a view: its operand is
    a kernel's result (a kf op that writes a buffer: not a fill, constant, view or host
    call), not returned itself, and no earlier returned reshape reads it (two outputs are
    two tensors: a later one is a copy); the launch schedule then gives the operand the
    output's buffer (compiler/gpu_codegen.py)."""
    x = op.operands[0]
    d = defining(x)
    if d is None or x in returned or d.name in _FREE or d.name in ("kf.reshape", "kf.constant") \
            or not d.name.startswith("kf."):
        return False
    views = [u for u in _users(x) if u.name == "kf.reshape" and u.result in returned]
    block = op.operation.block
    first = next(o.operation for o in block.operations if any(o.operation == v for v in views))
    return first == op


#: An operand is thin beside an elementwise op's result when the result has at least
#: this many times its elements (a row's target index beside the row's logits).
THIN_RATIO = 16


def _thin(v: ir.Value, result: ir.Value) -> bool:
    """Whether reading v for every element of result costs little: v broadcasts to it
    along dims of at least THIN_RATIO elements together (sizes known at compile time)."""
    shape, out = spec_of(v.type).shape, spec_of(result.type).shape
    if not _broadcasts_to(shape, out):
        return False
    lead = len(out) - len(shape)
    factor = 1
    for i, d in enumerate(out):
        if d != DYN and (i < lead or shape[i - lead] == 1):
            factor *= d
    return factor >= THIN_RATIO


def _numel(shape: tuple) -> int:
    """Elements of a shape, a run-time size counted as 4096 (bytes compared between
    values of one shape)."""
    n = 1
    for d in shape:
        n *= 4096 if d == DYN else d
    return n


def _free_scalars(kernel_ops: list[ir.Operation]) -> list[ir.Operation]:
    """The elementwise ops whose results only kernel ops read (not the return, a host
    call or a view) and that are rank-0 over rank-0 operands, or of any shape over fills
    and kf.iota alone (a mask ``torch.ones(L, S).tril()``, an ``arange``), or over such
    values and thin tensors (``_thin``: a one-hot ``targets[:, None] == arange(V)``)
    where no attention kernel reads them: each kernel that reads one computes it itself,
    with the ops it depends on, from their inputs (arguments or other kernels' results).
    Elementwise ops are pure, so a recomputed value is the same value; a few scalar ops
    a thread cost less than a launch of their own, and a mask or one-hot computed where
    it is read is never a tensor in memory."""
    kernel_set = set(kernel_ops)
    attention = {op for chain in _attention_chains(kernel_ops) for op in chain}
    attention |= {op for group in attention_backward_groups(kernel_ops) for op in group}
    free = []
    made_of_indices: set = set()  # results of free ops that read fills and kf.iota only
    broadcasts: set = set()  # results of free ops over those and thin tensors
    for op in kernel_ops:
        if _category(op) != "elementwise" or not op.results:
            continue
        from_indices = all(v in made_of_indices or (defining(v) is not None and defining(v).name in _FREE)
                           for v in op.operands)
        thin = not from_indices and spec_of(op.results[0].type).shape and \
            all(v in made_of_indices or v in broadcasts or (defining(v) is not None and defining(v).name in _FREE)
                or _thin(v, op.results[0]) for v in op.operands) and \
            not any(getattr(u.owner, "operation", u.owner) in attention for r in op.results for u in r.uses)
        if not from_indices and not thin and any(spec_of(v.type).shape for v in [*op.operands, *op.results]):
            continue
        if all(getattr(u.owner, "operation", u.owner) in kernel_set for r in op.results for u in r.uses):
            free.append(op)
            if from_indices:
                made_of_indices.update(op.results)
            elif thin:
                broadcasts.update(op.results)
    return free


def _lse_beside_attention(op: ir.Operation) -> None:
    """A ``kf.logsumexp`` of the scores an attention's softmax reads that the attention
    kernel does not write (``attention_lse``: over another dim, of another shape) reads
    a copy of the score chain instead -- the ``q @ k^T`` matmul and the ops from it to the
    scores --, so that the attention chain stays whole and one kernel, and the copy
    becomes kernels of its own (a matmul, then the row-wise logsumexp). The logsumexp
    that kf's autograd saves for attention's backward (compiler/partition.py) is the
    attention kernel's second output instead (``_attention_chains``)."""
    x = op.operands[0]
    sm = next((getattr(u.owner, "operation", u.owner) for u in x.uses
               if getattr(u.owner, "operation", u.owner).name == "kf.softmax"), None)
    if sm is None:
        return
    between, mm = score_chain(sm)
    if mm is None or defining(x) != (between[0] if between else mm):
        return
    chain = [mm, *reversed(between)]
    kt = defining(mm.operands[1])
    if transposes_last_two(kt):
        chain.insert(0, kt)
    mapping: dict = {}
    with ir.InsertionPoint(op):
        for c in chain:
            clone = c.clone()
            for i, v in enumerate(c.operands):
                if v in mapping:
                    clone.operands[i] = mapping[v]
            for r, cr in zip(c.results, clone.results):
                mapping[r] = cr
    op.operands[0] = mapping.get(x, x)


def _expand_logsumexp(op: ir.Operation) -> None:
    """``kf.logsumexp`` as the row ops the row-wise strategy fuses: ``m + log(sum(exp(x -
    m)))`` with m the max (0 where the max is infinite, as torch.logsumexp), in f32."""
    from kf.dialects import builders as kb

    attrs = op_attrs(op)
    dims, keep = list(attrs.get("dims") or []), bool(attrs.get("keepdim"))
    out = spec_of(op.result.type)
    with ir.InsertionPoint(op), op.location:
        x = op.operands[0]
        if spec_of(x.type).elem != out.elem:
            x = kb.cast(x, elem=out.elem)

        def finite_max(keepdim: bool) -> ir.Value:
            m = kb.reduce_max(x, dims=dims, keepdim=keepdim)
            inf = kb.cmp(kb.abs(m), kb.fill((), out.elem, float("inf")), predicate="eq")
            return kb.select(inf, kb.fill((), out.elem, 0.0), m)

        # (the max without keepdim is the row-wise kernel's same statistic, not a reshape:
        # a reshape of a result the function returns would be a kernel of its own)
        m = finite_max(True)
        total = kb.sum(kb.exp(kb.sub(x, m)), dims=dims, keepdim=keep)
        lse = kb.add(kb.log(total), m if keep else finite_max(False))
    op.result.replace_all_uses_with(lse)
    op.erase()


def _fuse_function(module: ir.Operation, f: ir.Operation) -> None:
    block = f.regions[0].blocks[0]
    in_attention = {c for chain in _attention_chains([o.operation for o in block.operations]) for c in chain
                    if c.name == "kf.logsumexp"}
    for op in [o.operation for o in block.operations if o.operation.name == "kf.logsumexp"]:
        if op not in in_attention:
            _lse_beside_attention(op)
            _expand_logsumexp(op)
    for op in [o.operation for o in block.operations if _column_reduction(o.operation) is not None]:
        _recompute_column_operands(op)
    copied: set = set()  # results of reshapes a kernel computes rather than views
    while True:
        body = [op.operation for op in block.operations]
        partial_reshapes = _partial_reshapes(body)
        views = [op for op in _view_reshapes(body) if op.result not in copied and id(op) not in partial_reshapes]
        view_ids = {id(op) for op in views}
        kernel_ops = [op for op in body
                      if op.name.startswith("kf.") and op.name not in _FREE | _HOST and id(op) not in view_ids]
        scalars = _free_scalars(kernel_ops)
        # What every kernel that reads it computes itself (these and the fills), by result:
        # an Operation's Python object, and so its hash, may be replaced while kernels are
        # built; a Value hashes by the IR value.
        cloned = {op.result for op in scalars}
        kernel_ops = [op for op in kernel_ops if op.result not in cloned] if cloned else kernel_ops
        part = partition(kernel_ops)
        _trim_epilogues(part)
        _join_column_partials(part)
        _absorb(part)
        # Kernel names become PTX/SPIR-V/MSL identifiers: keep letters, digits and "_"
        # (a lambda is called "<lambda>").
        fname = re.sub(r"\W", "_", ir.StringAttr(f.attributes["sym_name"]).value).strip("_") or "kernel"

        # Fills that something other than a kernel uses (a return, a fallback call) need a
        # kernel of their own.
        in_kernel = set(kernel_ops) | set(scalars)
        for op in body:
            if op.name in _FREE:
                if any(u.owner not in in_kernel for u in op.result.uses):
                    kernel_ops.append(op)
                    part.ops.append(op)
                    part.index[op] = len(part.ops) - 1
                    part.new("generic", [len(part.ops) - 1])
                else:
                    cloned.add(op.result)

        def leaves(op: ir.Operation, clones: list, inputs: list) -> None:
            """What op reads, through the ops kernels clone: those go to clones (operands
            first), the values computed elsewhere to inputs (each once)."""
            for v in op.operands:
                if v in cloned:
                    d = defining(v)
                    if all(c.result != v for c in clones):
                        leaves(d, clones, inputs)
                        clones.append(d)
                elif v not in inputs:
                    inputs.append(v)
        # Units in schedule order: groups and host ops, topologically sorted by first op.
        order = {op: i for i, op in enumerate(body)}
        units: list[tuple[str, object]] = [("group", gid) for gid in part.groups]
        units += [("host", op) for op in body if op.name in _HOST or id(op) in view_ids]

        def unit_ops(u):
            return [part.ops[i] for i in part.groups[u[1]].ops] if u[0] == "group" else [u[1]]

        unit_of = {}
        for u in units:
            for op in unit_ops(u):
                unit_of[op] = u
        deps = {u: set() for u in units}
        for u in units:
            for op in unit_ops(u):
                reads: list = []
                leaves(op, [], reads)
                for v in reads:
                    d = defining(v)
                    if d is not None and d in unit_of and unit_of[d] != u:
                        deps[u].add(unit_of[d])
        users = {u: set() for u in units}
        for u, ds in deps.items():
            for d in ds:
                users[d].add(u)
        first = {u: min(order[op] for op in unit_ops(u)) for u in units}
        indeg = {u: len(deps[u]) for u in units}
        heap = [(first[u], i, u) for i, u in enumerate(units) if indeg[u] == 0]
        heapq.heapify(heap)
        uid = {u: i for i, u in enumerate(units)}
        schedule = []
        while heap:
            _, _, u = heapq.heappop(heap)
            schedule.append(u)
            for w in users[u]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(heap, (first[w], uid[w], w))
        if len(schedule) == len(units):
            break
        # A view reshape between two ops of one kernel (a row statistic reshaped, then
        # read by the same kernel's epilogue) closes a cycle: that reshape is computed
        # inside the kernel instead, and the function is partitioned again.
        done = set(schedule)
        stuck = [u[1] for u in units if u not in done and u[0] == "host" and id(u[1]) in view_ids]
        assert stuck, "kf-fuse produced a cyclic schedule"
        copied |= {op.result for op in stuck}

    ret = next(op for op in body if op.name == "func.return")
    mapping: dict = {}
    kernel_count = 0

    def mapped(v):
        return mapping.get(v, v)

    for u in schedule:
        if u[0] == "host":
            op = u[1]
            op.move_before(ret)
            continue
        g = part.groups[u[1]]
        ops = [part.ops[i] for i in g.ops]
        members = set(ops)
        kname = f"{fname}_k{kernel_count}_{g.kind}"
        kernel_count += 1
        reads, clones = [], []
        for op in ops:
            leaves(op, clones, reads)
        inputs = [v for v in reads if defining(v) not in members]
        # an op sized by the function's arguments (kf.iota, kf.fill of a run-time length)
        # takes them as inputs of the kernel too, which names its sizes by them
        for op in clones + ops:
            for a, _ in sizes_from(op) or ():
                if a >= 0 and block.arguments[a] not in inputs:
                    inputs.append(block.arguments[a])
        outputs = []
        for op in ops:
            for r in op.results:
                if any(use.owner not in members for use in r.uses):
                    outputs.append(r)
        # an attention kernel's O first, its row logsumexp after it
        outputs.sort(key=lambda r: defining(r).name == "kf.logsumexp")
        with ir.InsertionPoint(module.regions[0].blocks[0]), f.location:
            kfunc = func.FuncOp(kname, ir.FunctionType.get([v.type for v in inputs], [r.type for r in outputs]))
            kfunc.attributes["sym_visibility"] = ir.StringAttr.get("private")
            kfunc.attributes["kf.kernel"] = ir.StringAttr.get(g.kind)
            lines = []
            for op in [c for c in clones if c.name not in _FREE] + ops:
                line = _loc_line(op.location)
                if line and line not in lines:
                    lines.append(line)
            kfunc.attributes["kf.fused_lines"] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in lines])
            kblock = kfunc.add_entry_block()
        kmap = dict(zip(inputs, kblock.arguments))
        with ir.InsertionPoint(kblock):
            # clones first, then the members, except that an op waits for its operands: a
            # cloned op may read a member (the comparison of a kf.rand that dropout's
            # select reads)
            pending = clones + ops
            while pending:
                op = next((o for o in pending if all(v in kmap for v in o.operands)), None)
                assert op is not None, "kf-fuse: a kernel's ops read values that neither it nor its inputs make"
                pending.remove(op)
                c = op.clone()
                for i, v in enumerate(op.operands):
                    c.operands[i] = kmap[v]
                pairs = sizes_from(c)
                if pairs is not None:
                    set_sizes_from(c, [(inputs.index(block.arguments[a]), d) if a >= 0 else (a, d)
                                       for a, d in pairs])
                for r, cr in zip(op.results, c.results):
                    kmap[r] = cr
            func.ReturnOp([kmap[r] for r in outputs], loc=f.location)
        kfunc.operation.move_before(f)  # kernel functions precede the schedule that calls them
        with ir.InsertionPoint(ret), f.location:
            call = func.CallOp(kfunc, [mapped(v) for v in inputs])
        for r, cr in zip(outputs, call.results):
            mapping[r] = cr
            r.replace_all_uses_with(cr)
    # Host ops moved before the return use mapped values already (replace_all_uses_with);
    # the original kernel ops and fills are now dead.
    # (views by identity: an operation that moved compares differently afterwards)
    for op in reversed(body):
        if op.name.startswith("kf.") and op.name not in _HOST and id(op) not in view_ids:
            op.erase()
