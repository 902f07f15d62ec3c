"""kf-fuse's recognition of attention backwards: the ops of the gradient of
``softmax(f(q @ k^T)) @ v`` that become one ``attention_backward`` kernel.

What kf's autograd gives the backward of an attention (compiler/partition.py): the scores
recomputed from q and k with the forward's own ops (scale, mask), the probabilities
``P = exp(x - lse)`` from the saved row logsumexp, ``dV = P^T dO``, ``dP = dO V^T``, the
softmax's backward with FlashAttention's ``D = rowsum(dO * O)``, the mask's and the
scale's backward, ``dQ = dS K`` and ``dK = dS^T Q``. A group grows from each
``exp(x - L)`` whose x reads one product and L none:

- back from the exp, through the elementwise ops of x, to its product (q @ k^T) and the
  transpose of k it reads;
- forward, through elementwise ops and transposes, to the products that read them (the
  results dV, dK, dQ) and the casts, constant scales and transposes after those;
- back again from what the group's ops read: the other product they read (dO @ v^T), the
  row sum (D) and the elementwise ops that only the group reads (the mask's comparison,
  dO * O, casts).

The group is an attention backward only where ``BackwardChain`` (the strategy's own
reading of a kernel function) takes it: the same rules decide what kf-fuse groups and
what the strategy writes. ``D`` must already be rowsum(dO * O) (what the autograd
writes): rowsum(dP * P) needs every key of a row first, which no block of the backward
has.
"""

from __future__ import annotations

from mlir import ir

from kf.dialects import BY_NAME, spec_of
from kf.dialects.types import defining, transposes_last_two


def _pointwise(op: ir.Operation) -> bool:
    spec = BY_NAME.get(op.name)
    return spec is not None and spec.category == "elementwise"


def _users(v: ir.Value) -> list[ir.Operation]:
    return [getattr(u.owner, "operation", u.owner) for u in v.uses]


def _reads_product(v: ir.Value, stop: set) -> list[ir.Operation]:
    """The matmuls v is computed from through elementwise ops and transposes."""
    found, seen, stack = [], set(), [v]
    while stack:
        w = stack.pop()
        op = defining(w)
        if op is None or op in seen:
            continue
        seen.add(op)
        if op.name == "kf.matmul":
            found.append(op)
        elif (_pointwise(op) or transposes_last_two(op)) and op not in stop:
            stack.extend(op.operands)
    return found


class _GroupView:
    """A candidate group as ``BackwardChain`` reads a kernel function: its ops, the
    values it reads from outside (arguments) and those used outside it (results)."""

    def __init__(self, ops: list[ir.Operation]):
        self.name = "attention_backward"
        members = set(ops)
        self.ops = ops
        self.args, self.results = [], []
        for op in ops:
            for v in op.operands:
                d = defining(v)
                if (d is None or d not in members) and (d is None or d.name != "kf.fill") and v not in self.args:
                    self.args.append(v)
            for r in op.results:
                if any(u not in members for u in _users(r)):
                    self.results.append(r)
        self.arg_specs = [spec_of(a.type) for a in self.args]
        self.result_specs = [spec_of(r.type) for r in self.results]

    def arg_index(self, v: ir.Value) -> int | None:
        for i, a in enumerate(self.args):
            if a == v:
                return i
        return None


def _epilogue_link(op: ir.Operation, x: ir.Value) -> bool:
    """Whether op continues a product's epilogue from x: a float cast, a transpose of the
    last two dims, x times or over a rank-0 value."""
    if op.name == "kf.cast":
        return spec_of(op.operands[0].type).is_float and spec_of(op.result.type).is_float
    if transposes_last_two(op):
        return True
    if op.name in ("kf.mul", "kf.div"):
        a, b = op.operands
        return (a == x and not spec_of(b.type).shape) or (op.name == "kf.mul" and b == x and not spec_of(a.type).shape)
    return False


def _grow(exp: ir.Operation, ops: set) -> set | None:
    """The ops of the candidate group around ``exp`` (among ``ops``), or None."""
    sub = defining(exp.operands[0])
    if sub is None or sub.name != "kf.sub" or sub not in ops:
        return None
    x, lse = sub.operands
    products = _reads_product(x, set())
    if len(products) != 1 or _reads_product(lse, set()):
        return None
    mm_s = products[0]
    group: set = {exp, sub, mm_s}
    outputs: set = set()  # the products that read the chain, and their epilogues
    # back from the exp to the scores' product
    stack = [x]
    while stack:
        op = defining(stack.pop())
        if op is None or op in group or op not in ops:
            continue
        if _pointwise(op) or transposes_last_two(op):
            group.add(op)
            stack.extend(op.operands)
    changed = True
    while changed:
        changed = False
        # forward: elementwise users and transposes of the chain, the products that read
        # them, and those products' epilogues
        for op in list(group):
            if op.name == "kf.matmul" and op not in outputs and op != mm_s:
                continue  # dO @ v^T: read by the chain only
            for r in op.results:
                for u in _users(r):
                    if u in group or u not in ops:
                        continue
                    if op in outputs:
                        take = _epilogue_link(u, r)
                    else:
                        take = _pointwise(u) or transposes_last_two(u) or u.name == "kf.matmul"
                    if take:
                        group.add(u)
                        if op in outputs or u.name == "kf.matmul":
                            outputs.add(u)
                        changed = True
        # back: what only the group reads
        for op in list(group):
            for v in op.operands:
                d = defining(v)
                if d is None or d in group or d not in ops or not all(u in group for u in _users(v)):
                    continue
                if _pointwise(d) or transposes_last_two(d) or d.name in ("kf.matmul", "kf.sum"):
                    group.add(d)
                    changed = True
    return group


def attention_backward_groups(ops: list[ir.Operation]) -> list[list[ir.Operation]]:
    """The ops of each attention backward among ``ops`` (kf-fuse's kernel ops, in block
    order), each list in that order."""
    from kf.passes.strategies.attention.backward.chain import BackwardChain
    from kf.passes.strategies.base import NotApplicable

    index = {op: i for i, op in enumerate(ops)}
    members = set(ops)
    out, taken = [], set()
    for op in ops:
        if op.name != "kf.exp" or op in taken:
            continue
        group = _grow(op, members)
        if group is None or any(g in taken for g in group):
            continue
        group = sorted(group, key=index.__getitem__)
        try:
            BackwardChain(view=_GroupView(group))
        except NotApplicable:
            continue
        taken.update(group)
        out.append(group)
    return out
