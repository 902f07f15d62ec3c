"""What a rowwise kernel function computes: its values as a graph of ``Node``s, the row
space its reductions share (``analyze``: NotApplicable where they do not share one),
the statistics in dependency order, and which inputs each phase reads.

A value's coordinates at the point being computed are tokens: ``("r", i)`` for the
i-th leading (row) dim, ``("c", k)`` for the k-th reduced (column) dim, ``("g", 0)``
for the group of rows a column partial sums (below), None for a dim of size 1 (read at
index 0).

Column partials: ``kf.sum(kf.reshape(e) to [G, B, cols...], dims=[1])`` with e a value
of the row space (what kf-split-reductions makes of a weight's gradient ``sum(dy *
xhat, 0)`` and kf-fuse puts beside the rows: ``kf.passes.fuse.column_partial``) is a
``Node("partial")`` of shape [G, cols...]: the sums of e over each group of B
consecutive rows. It is an output only; no value of the kernel reads it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlir import ir

from kf.dialects.attrs import op_attrs
from kf.dialects.types import spec_of

from ..base import NotApplicable

ELEMENTWISE = {"kf.add", "kf.sub", "kf.mul", "kf.div", "kf.pow", "kf.fmod", "kf.max", "kf.min", "kf.neg", "kf.abs",
                "kf.exp", "kf.log", "kf.sqrt", "kf.rsqrt", "kf.reciprocal", "kf.tanh", "kf.erf", "kf.sigmoid",
                "kf.erfc", "kf.sin", "kf.cos", "kf.trunc", "kf.round", "kf.signbit",
                "kf.relu", "kf.gelu", "kf.cmp", "kf.bitwise", "kf.select", "kf.masked_fill"}
REDUCTIONS = {"kf.sum": "add", "kf.mean": "add", "kf.reduce_max": "max", "kf.reduce_min": "min",
               "kf.var": "add"}
ELEM_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i1": 1}


@dataclass
class Node:
    """One value of the kernel function."""

    op: str  # kf op name, or "arg"
    shape: tuple[int, ...]
    elem: str
    operands: list["Node"] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    loc: ir.Location | None = None
    arg: int = -1  # kernel input index for "arg"
    frame: str = "F"  # "S" (right-aligned into the row space), "L" (into its leading dims), "F" (either)

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other


@dataclass
class Analysis:
    inputs: list[Node]
    outputs: list[Node]
    space: tuple[int, ...]  # S: the row space (shape of every reduction's input)
    nred: int  # k: how many trailing dims are reduced
    stats: list[tuple]  # statistics in dependency order: (kind, node) - see _stat_keys

    @property
    def lead(self) -> tuple[int, ...]:
        return self.space[:len(self.space) - self.nred]

    @property
    def cols(self) -> tuple[int, ...]:
        return self.space[len(self.space) - self.nred:]

    @property
    def rows(self) -> int:
        return math.prod(self.lead)

    @property
    def row_length(self) -> int:
        return math.prod(self.cols)

    @property
    def partials(self) -> list[tuple[int, Node]]:
        """(output index, node) of the column partials."""
        return [(i, o) for i, o in enumerate(self.outputs) if o.op == "partial"]

    @property
    def groups(self) -> int:
        """The groups of rows the column partials sum (0: no partials)."""
        return next((o.shape[0] for _, o in self.partials), 0)


def row_tokens(a: Analysis) -> tuple:
    return tuple(("r", i) if s > 1 else None for i, s in enumerate(a.lead))


def full_tokens(a: Analysis) -> tuple:
    return row_tokens(a) + tuple(("c", k) if s > 1 else None for k, s in enumerate(a.cols))


def align(coords: tuple, out_shape, in_shape) -> tuple:
    """Torch broadcasting: the coordinates of an operand of shape in_shape at the point
    coords of a result of shape out_shape (right-aligned, size-1 dims read index 0)."""
    off = len(out_shape) - len(in_shape)
    return tuple(None if in_shape[k] == 1 else coords[k + off] for k in range(len(in_shape)))


def natural(a: Analysis, node: Node) -> tuple:
    """The coordinates of node's own element at the current (row, column) point."""
    if node.op == "partial":
        return (("g", 0),) + full_tokens(a)[len(a.lead):]
    tokens = row_tokens(a) if node.frame == "L" else full_tokens(a)
    frame = a.lead if node.frame == "L" else a.space
    off = len(frame) - len(node.shape)  # negative: leading dims beyond the frame, which must be 1
    if any(s != 1 and (k + off < 0 or s != frame[k + off]) for k, s in enumerate(node.shape)):
        raise NotApplicable(f"a value of shape {list(node.shape)} does not fit the row space {list(a.space)}")
    return tuple(None if s == 1 else tokens[k + off] for k, s in enumerate(node.shape))


def stat_coords(a: Analysis, node: Node) -> tuple:
    """Where a reduction result may be read: at the current row only."""
    if node.attrs.get("keepdim") or node.op in ("kf.softmax", "kf.log_softmax"):
        return row_tokens(a) + (None,) * a.nred
    return row_tokens(a)


def _build_graph(kernel: ir.Operation) -> tuple[list[Node], list[Node]]:
    from kf.passes.fuse import column_partial

    body = kernel.regions[0].blocks[0]
    nodes: dict = {}
    # the reshapes into [G, B, cols...] that column partials read: part of the partial
    blocks = {}
    for op in body.operations:
        e = column_partial(op.operation)
        if e is not None:
            blocks[op.operation.operands[0]] = e
    partial_reshapes = {r for r in blocks if all(column_partial(getattr(u.owner, "operation", u.owner)) is not None
                                                for u in r.uses)}
    inputs = []
    for i, arg in enumerate(body.arguments):
        try:
            s = spec_of(arg.type)
        except Exception as e:
            raise NotApplicable(f"kernel input {i}: {e}") from None
        n = Node("arg", s.shape, s.elem, arg=i, loc=kernel.location)
        nodes[arg] = n
        inputs.append(n)
    outputs = None
    for op in body.operations:
        op = op.operation
        if op.name == "func.return":
            outputs = [nodes[v] for v in op.operands]
            break
        if len(op.results) != 1:
            raise NotApplicable(f"{op.name} has {len(op.results)} results")
        if op.results[0] in partial_reshapes:
            continue
        s = spec_of(op.results[0].type)
        if op.operands and op.operands[0] in partial_reshapes:
            e = blocks[op.operands[0]]
            nodes[op.results[0]] = Node("partial", s.shape, s.elem, [nodes[e]], {"groups": s.shape[0]}, op.location)
            continue
        n = Node(op.name, s.shape, s.elem, [nodes[v] for v in op.operands], op_attrs(op), op.location)
        if op.name == "kf.reshape":
            # Only unit dims may come or go: then the elements keep their coordinates.
            src = n.operands[0]
            if [d for d in src.shape if d != 1] != [d for d in n.shape if d != 1]:
                raise NotApplicable(f"kf.reshape {list(src.shape)} -> {list(n.shape)} moves elements")
        elif op.name == "kf.constant":
            value = n.attrs.get("value")
            if not isinstance(value, ir.DenseElementsAttr) or not value.is_splat:
                raise NotApplicable("kf.constant that is not a splat")
        elif op.name not in ELEMENTWISE and op.name not in REDUCTIONS and op.name not in (
                "kf.softmax", "kf.log_softmax", "kf.cast", "kf.fill", "kf.iota", "kf.broadcast_to"):
            raise NotApplicable(f"{op.name} is not a rowwise op")
        nodes[op.results[0]] = n
    if outputs is None:
        raise NotApplicable("kernel function has no func.return")
    return inputs, outputs


def _uniform(n: Node) -> bool:
    return all(d == 1 for d in n.shape)


def analyze(kernel: ir.Operation) -> Analysis:
    """Find the row space and the statistics of a kernel function; NotApplicable if it is
    not rowwise."""
    inputs, outputs = _build_graph(kernel)
    order: list[Node] = []
    seen = set()

    def visit(n):
        if id(n) in seen:
            return
        seen.add(id(n))
        for o in n.operands:
            visit(o)
        order.append(n)

    for o in outputs:
        visit(o)
    space, dims = None, None
    for n in order:
        if n.op in REDUCTIONS or n.op in ("kf.softmax", "kf.log_softmax"):
            x = n.operands[0]
            rank = len(x.shape)
            if n.op in REDUCTIONS:
                d = sorted({int(v) % max(rank, 1) for v in n.attrs.get("dims", [])}) or list(range(rank))
            else:
                d = [int(n.attrs["dim"]) % max(rank, 1)]
            if not x.elem.startswith(("f", "bf")):
                raise NotApplicable(f"{n.op} of {x.elem}: the rowwise strategy reduces floats")
            if space is None:
                space, dims = x.shape, d
            elif x.shape != space or d != dims:
                raise NotApplicable(f"reductions over different row spaces: {list(space)} dims {dims} and "
                                    f"{list(x.shape)} dims {d}")
    if space is None:
        raise NotApplicable("no reduction: not a rowwise kernel")
    if dims != list(range(len(space) - len(dims), len(space))):
        raise NotApplicable(f"reduced dims {dims} of {list(space)} are not the trailing dims")
    # Frames: a keepdim=False reduction moves its result into the leading-dims frame.
    for n in order:
        if n.op == "arg" or n.op in ("kf.fill", "kf.constant", "kf.iota"):
            n.frame = "F"
        elif n.op == "partial":
            e = n.operands[0]
            if e.frame == "L" or tuple(e.shape) != tuple(space) or tuple(n.shape[1:]) != tuple(space[len(space) - len(dims):]):
                raise NotApplicable(f"column partial of a value of shape {list(e.shape)} in the row space "
                                    f"{list(space)}: it sums rows of the row space")
            n.frame = "P"
        elif n.op in REDUCTIONS:
            if n.operands[0].frame == "L":
                raise NotApplicable("a reduction of a per-row value")
            n.frame = "S" if n.attrs.get("keepdim") else "L"
        elif n.op in ("kf.softmax", "kf.log_softmax"):
            n.frame = "S"
        else:
            frames = {o.frame for o in n.operands if not _uniform(o)} - {"F"}
            lead = space[:len(space) - len(dims)]
            free_fit = all(len(o.shape) <= len(lead) and all(
                d in (1, lead[k + len(lead) - len(o.shape)]) for k, d in enumerate(o.shape))
                for o in n.operands if o.frame == "F" and not _uniform(o))
            if len(frames) > 1 or (frames == {"L"} and not free_fit):
                raise NotApplicable("a keepdim=False reduction result meets full rows: torch aligns it with "
                                    "the wrong dims, which no rowwise kernel computes")
            n.frame = frames.pop() if frames else "F"
    if any(o.op == "partial" for n in order for o in n.operands):
        raise NotApplicable("a column partial read inside the kernel: partials are outputs")
    a = Analysis(inputs, outputs, tuple(space), len(dims), [])
    if len({o.shape[0] for _, o in a.partials}) > 1 or (a.partials and a.rows % a.groups):
        raise NotApplicable(f"column partials over {sorted({o.shape[0] for _, o in a.partials})} groups of "
                            f"{a.rows} rows: one count of groups dividing the rows")
    for o in outputs:
        natural(a, o)  # raises for outputs that do not fit the row space
    a.stats = _stat_order(a, order)
    return a


def _stat_keys(n: Node) -> list[tuple]:
    """The statistics a reduction or softmax node needs, in order, keyed by kind and
    input so that mean(x) and var(x) share one sum of x."""
    x = n.operands[0]
    if n.op == "kf.var":
        return [("sum", x), ("m2", x)]
    if n.op in ("kf.softmax", "kf.log_softmax"):
        return [("max", x), ("sumexp", x)]
    return [({"kf.sum": "sum", "kf.mean": "sum", "kf.reduce_max": "max", "kf.reduce_min": "min"}[n.op], x)]


def _stat_order(a: Analysis, order: list[Node]) -> list[tuple]:
    """Every statistic once, in an order where each comes after those its input needs
    (order is topological: an input's statistics come before its users')."""
    out: list[tuple] = []
    for n in order:
        if n.op in REDUCTIONS or n.op in ("kf.softmax", "kf.log_softmax"):
            for key in _stat_keys(n):
                if not any(k == key[0] and m is key[1] for k, m in out):
                    out.append(key)
    return out


def element_loads(a: Analysis, node: Node, coords: tuple, acc: set, seen: set) -> None:
    """The (input, coordinates) loaded while computing node at coords inside a row loop,
    stopping at statistics (computed before the loop)."""
    key = (id(node), coords)
    if key in seen:
        return
    seen.add(key)
    if not any(c and c[0] == "c" for c in coords):
        return  # per-row: computed once, outside the loop
    if node.op == "arg":
        acc.add((node.arg, coords))
        return
    if node.op in REDUCTIONS:
        return
    if node.op == "partial":  # the summed rows, at the current point
        element_loads(a, node.operands[0], full_tokens(a), acc, seen)
        return
    if node.op in ("kf.softmax", "kf.log_softmax"):
        element_loads(a, node.operands[0], coords, acc, seen)
        return
    for o in node.operands:
        element_loads(a, o, align(coords, node.shape, o.shape), acc, seen)

def phase_loads(a: Analysis) -> list[set]:
    """For each phase (each statistic, then the output phase), the inputs it reads."""
    out = []
    full = full_tokens(a)
    for kind, x in a.stats:
        s: set = set()
        element_loads(a, x, full, s, set())
        out.append({arg for arg, _ in s})
    s = set()
    for o in a.outputs:
        element_loads(a, o, natural(a, o), s, set())
    out.append({arg for arg, _ in s})
    return out


def has_column(coords: tuple) -> bool:
    return any(c and c[0] == "c" for c in coords)
