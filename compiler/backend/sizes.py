"""Run-time sizes for a region of a graph with Dynamo's symbolic sizes.

Under ``dynamic=True`` (or automatic dynamic after a second length) Dynamo's graph has
one ShapeEnv symbol per varying size, and a region's inputs carry them: a tensor of
``(s0, s1, 32)``, its flattened view of ``(s0*s1, 32)``, the size ``s1`` itself. On a
target whose programs take run-time sizes (``Target.dynamic_shapes``) the region is then
one kf program for every size: its graph is converted twice with the symbols replaced by
two sets of hints and unified (compiler/dynamic.py, as kf.jit's run-time sizes), each
input dim that is a bare symbol binding it at the call, each other dim checked against
the symbols (runtime/abi.bind_sizes), each output sized from them.

``plan`` says, before anything is compiled, whether the region's inputs allow that: a
size passed as a float (``x.shape[-1] ** 0.5``) or a size no tensor dim gives cannot be a
run-time size. ``SizePlan.serves`` picks the calls the program takes: every run-time dim
in ``[MIN_SIZE, MAX_DYNAMIC_SIZE]``, as ``Signature.generalize``; sizes 0 and 1 and longer
sizes are compiled for their own values. Dynamo has checked its guards on the symbols
before the graph runs, so nothing else about the sizes needs checking here.

Hints. Where Dynamo bounds a symbol (``freqs[:seq]`` of a table of 2048 rows: seq <=
2048), its two hints are primes of that range, since the graph's sizes hold only there;
a third conversion at each symbol's largest size gives the extent of the region's float
sums (dynamic.long_sum: the cpu target adds long sums in stages for static sizes only).
Symbols can be held at a size (``plan(gm, fixed)``): the region's runner holds those that
do not change where every symbol cannot be one program (regions.RegionRunner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import DynamicFallback
from ..signature import MAX_DYNAMIC_SIZE, MIN_SIZE, Param, Signature, TensorSig


def _expr(x):
    """The sympy expression of a symbolic size, or None for a number."""
    if isinstance(x, torch.SymInt):
        e = x.node.expr
        return None if e.is_number else e
    return None


def times_symbol(e) -> tuple[int, object] | None:
    """(c, s) where the size expression e is ``c*s``, a whole number c > 1 times one
    symbol (the rows of a flattened ``[c, s]`` batch); None for anything else."""
    if e is None or e.is_Symbol or e.is_number:
        return None
    c, rest = e.as_coeff_Mul()
    return (int(c), rest) if rest.is_Symbol and c.is_Integer and int(c) > 1 else None


@dataclass
class SizePlan:
    """How a region's calls give its program's run-time sizes."""

    #: per tensor input: its run-time dims
    dims: list[list[int]]
    #: per tensor input: each dim's size as text (a number, a symbol, an expression)
    input_dims: list[tuple[str, ...]]
    #: the symbols that are run-time sizes, by name
    symbols: dict
    #: the symbols held at one size (name -> size): the program serves calls of that size
    fixed: dict
    #: where a call gives each symbol, run-time or fixed: (position among the region's
    #: arguments, dim; None for an argument that is the size itself), and a third number
    #: where that dim is the symbol times it (the symbol is the dim over it)
    binds: dict
    #: the positions of the region's tensor arguments
    tensor_args: list[int]
    #: every symbol of the inputs, by name
    every: dict
    #: the largest size of each run-time symbol (Dynamo's range of it, at most
    #: MAX_DYNAMIC_SIZE), by name
    upper: dict
    #: where every run-time dim of the graph, not only the inputs', must be at most
    #: MAX_DYNAMIC_SIZE (GPU kernels declare such a buffer's extent with it:
    #: passes/strategies/run_time_sizes.BOUND): those dims' expressions
    bounded: list = None

    def describe(self) -> str:
        fixed = ", ".join(f"{k}={v}" for k, v in sorted(self.fixed.items()))
        return ", ".join(sorted(self.symbols)) + (f" ({fixed} fixed)" if fixed else "")

    def serves(self, args) -> bool:
        """Whether the program of run-time sizes takes this call: no empty tensor with a
        run-time dim (one of fixed sizes, such as an empty cache the model carries, is the
        same in every call), every run-time dim in [MIN_SIZE, MAX_DYNAMIC_SIZE], every
        fixed symbol of its size, every run-time symbol within its range (``upper``, which
        Dynamo guards), and where ``bounded``, every run-time dim of the graph at most
        MAX_DYNAMIC_SIZE."""
        for i, dims in zip(self.tensor_args, self.dims):
            shape = args[i].shape
            if dims and 0 in shape:
                return False
            for d in dims:
                if not MIN_SIZE <= shape[d] <= MAX_DYNAMIC_SIZE:
                    return False
        if not all(self.size_of(name, args) == size for name, size in self.fixed.items()) or \
                not all(self.size_of(name, args) <= size for name, size in self.upper.items()):
            return False
        if self.bounded:
            sizes = self.bind(args)
            return all(int(e.xreplace(sizes)) <= MAX_DYNAMIC_SIZE for e in self.bounded)
        return True

    def size_of(self, name: str, args) -> int:
        i, d, *times = self.binds[name]
        n = int(args[i] if d is None else args[i].shape[d])
        return n // times[0] if times else n

    def signature(self, tensors: list) -> Signature:
        """The program's signature: the tensors' own, their run-time dims DYN."""
        from ..dtypes import kf_elem
        from ..signature import DYN

        params = []
        for i, (t, dims) in enumerate(zip(tensors, self.dims)):
            shape = tuple(DYN if d in dims else n for d, n in enumerate(t.shape))
            params.append(Param(f"in{i}", "tensor", TensorSig(shape, kf_elem(t.dtype), t.device.type, True)))
        return Signature(tuple(params))

    def bind(self, args) -> dict:
        """sympy symbol -> its size in this call, for every symbol of the inputs."""
        return {self.every[name]: self.size_of(name, args) for name in self.binds}

    def held(self) -> dict:
        """sympy symbol -> size, of the fixed symbols."""
        import sympy

        return {self.every[name]: sympy.Integer(size) for name, size in self.fixed.items()}


def plan(gm: torch.fx.GraphModule, fixed: dict | None = None, bound_all: bool = False) -> SizePlan | str:
    """The region's SizePlan with the symbols of ``fixed`` (name -> size) held at those
    sizes and every other one a run-time size, or why its inputs cannot give run-time
    sizes. ``bound_all``: every run-time dim of the graph, not only the inputs', is to be
    at most MAX_DYNAMIC_SIZE (``SizePlan.bounded``)."""
    fixed = dict(fixed or {})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    every, binds, derived = {}, {}, []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                e = _expr(size)
                if e is not None and e.is_Symbol:
                    every.setdefault(str(e), e)
                    binds.setdefault(str(e), (i, d))
                elif e is not None:
                    derived.append((f"{node.name} dim {d}", e))
        elif isinstance(val, torch.SymFloat):
            return (f"a size is used as a float ({node.name} = {val.node.expr}): kf compiles it as a constant "
                    f"of each size")
        elif isinstance(val, float):
            return f"the region reads a float ({node.name}), a constant of each program"
        elif isinstance(val, torch.SymBool):
            return f"a size is compared in the region ({node.name} = {val.node.expr})"
        elif isinstance(val, torch.SymInt) and _expr(val) is not None:
            derived.append((node.name, _expr(val)))
    for i, node in enumerate(placeholders):  # a symbol that inputs give only times a number
        val = node.meta.get("val")  # (rows of a flattened [2, s] batch: 2*s) binds as that dim over it
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                times = times_symbol(_expr(size))
                if times is not None and str(times[1]) not in every:
                    every[str(times[1])] = times[1]
                    binds[str(times[1])] = (i, d, times[0])
    for what, e in derived:
        unbound = sorted(str(s) for s in e.free_symbols if str(s) not in every)
        if unbound and " dim " not in what:
            return (f"the region reads the size {e} ({what}) as a number, and no input dim of the region is "
                    f"{', '.join(unbound)}: a size used as a value is a constant of each program")
        if unbound:
            return f"{what} is {e}: no input dim of the region is {', '.join(unbound)}"
    symbols = {k: v for k, v in every.items() if k not in fixed}
    if not symbols:
        return "no input of the region has a run-time size"
    for i, node in enumerate(placeholders):  # a size the region reads: read from the call itself
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and _expr(val) is not None and _expr(val).is_Symbol:
            binds[str(_expr(val))] = (i, None)
    import sympy

    held = {every[k]: sympy.Integer(v) for k, v in fixed.items() if k in every}
    dims, input_dims, tensor_args = [], [], []
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        tensor_args.append(i)
        row, text = [], []
        for d, size in enumerate(val.shape):
            e = _expr(size)
            e = e.xreplace(held) if e is not None else None
            if e is None or e.is_number:
                text.append(str(int(size) if e is None else int(e)))
                continue
            row.append(d)
            text.append(str(e))
        dims.append(row)
        input_dims.append(tuple(text))
    upper = _ranges(gm, symbols)
    bounded = None
    if bound_all:
        found = set()
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            for t in val if isinstance(val, (list, tuple)) else [val]:
                if isinstance(t, torch.Tensor):
                    found |= {e.xreplace(held) for e in map(_expr, t.shape) if e is not None}
        bounded = sorted((e for e in found if not e.is_number and not e.is_Symbol), key=str)
    return SizePlan(dims, input_dims, symbols, {k: v for k, v in fixed.items() if k in every}, binds, tensor_args,
                    every, upper, bounded)


def _ranges(gm: torch.fx.GraphModule, symbols: dict) -> dict:
    """Each run-time symbol's largest size: Dynamo's ShapeEnv bounds a symbol where the
    trace needed it (``freqs[:seq]`` of a 2048-row table: seq <= 2048, a guard Dynamo
    checks), else MAX_DYNAMIC_SIZE. The region is also converted at these sizes, for the
    extent of its sums (``capture``)."""
    env = next((s.node.shape_env for n in gm.graph.nodes if n.op == "placeholder"
                for s in _sizes_of(n.meta.get("val"))), None)
    upper = {}
    for name, sym in symbols.items():
        vr = env.var_to_range.get(sym) if env is not None else None
        top = MAX_DYNAMIC_SIZE
        if vr is not None and _finite(vr.upper):
            top = max(MIN_SIZE, min(top, int(vr.upper)))
        upper[name] = top
    return upper


def _bounded_hints(gm: torch.fx.GraphModule, sizes: SizePlan) -> tuple[dict, dict]:
    """The two hints of each symbol that Dynamo's ShapeEnv bounds below dynamic._hints'
    primes (``freqs[:seq]`` of a 64-row table: seq <= 64): two distinct primes of its
    range, apart from every other symbol's. The graph's sizes hold only in that range (a
    slice past the table's end is shorter)."""
    import sympy

    env = next((v.node.shape_env for n in gm.graph.nodes if n.op == "placeholder"
                for v in _sizes_of(n.meta.get("val"))), None)
    from ..dynamic import _hints

    out: tuple[dict, dict] = ({}, {})
    if env is None:
        return out
    # apart from the unbounded symbols' hints and the held sizes too
    used = {int(v) for which in (0, 1) for v in _hints(sizes.symbols, {}, which).values()} | set(sizes.fixed.values())
    for name in sorted(sizes.symbols):
        sym = sizes.symbols[name]
        vr = env.var_to_range.get(sym)
        if vr is None or not _finite(vr.upper) or int(vr.upper) >= 4001:
            continue
        lower, upper = max(int(vr.lower), MIN_SIZE), int(vr.upper)
        primes = [p for p in sympy.primerange(lower, upper + 1) if p not in used and p > 2]
        if len(primes) < 2:
            raise DynamicFallback(f"{name} ranges over [{lower}, {upper}]: too few sizes to tell it from others")
        hint0, hint1 = primes[-1], primes[len(primes) // 2 - 1] if len(primes) > 2 else primes[0]
        used |= {hint0, hint1}
        out[0][sym], out[1][sym] = sympy.Integer(hint0), sympy.Integer(hint1)
    return out


def _finite(bound) -> bool:
    """Whether a ShapeEnv range's bound is a number (not torch's int_oo)."""
    from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

    return not isinstance(bound, (IntInfinity, NegativeIntInfinity)) and bool(getattr(bound, "is_finite", False))


def _sizes_of(val) -> list:
    """The SymInts of a placeholder's value: a tensor's symbolic sizes, or the size."""
    if isinstance(val, torch.Tensor):
        return [s for s in val.shape if isinstance(s, torch.SymInt)]
    return [val] if isinstance(val, torch.SymInt) else []


def hinted_graphs(gm: torch.fx.GraphModule, sizes: SizePlan, tensors: list):
    """The region's graph three times, its symbols replaced by each of the two sets of
    hints (dynamic._hints; within Dynamo's ranges: _bounded_hints) and by their largest
    sizes, with meta tensors of the inputs at those sizes: [(graph, metas)]."""
    import sympy

    from ..dynamic import _concrete, _hinted, _hints

    out = []
    bounded = _bounded_hints(gm, sizes)
    top = {sizes.symbols[k]: sympy.Integer(v) for k, v in sizes.upper.items()}
    for which in (0, 1, 2):  # 2: at the largest sizes, for the extent of the sums
        hints = {**_hints(sizes.symbols, {}, which), **bounded[which], **sizes.held()} if which < 2 else \
            {**top, **sizes.held()}
        graph = _hinted(gm, hints)
        metas = []
        for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                metas.append(torch.empty(_concrete(list(val.shape), hints), dtype=val.dtype, device="meta"))
        out.append((graph, metas))
    return out


def capture(gm: torch.fx.GraphModule, sizes: SizePlan, sig: Signature, tensors: list,
            convert: Callable[[torch.fx.GraphModule, list], object]):
    """The region's Captured kf function of run-time sizes; DynamicFallback where it
    cannot be one. ``convert(graph, metas)``: capture's conversion of a graph whose
    sizes are numbers."""
    from ..dynamic import unified
    from ..errors import CompileError, debug

    caps = []
    for k, (graph, metas) in enumerate(hinted_graphs(gm, sizes, tensors)):
        if k == 2:  # at the largest sizes: only the sums' extents are read
            try:
                caps.append(convert(graph, metas))
            except Exception:
                caps.append(None)
            continue
        try:
            caps.append(convert(graph, metas))
        except CompileError as e:
            raise DynamicFallback(f"kf cannot convert the region with run-time sizes: {e.message}") from None
        except Exception as e:  # a handler that reads a size as a number: the static compile says
            if debug():
                raise
            raise DynamicFallback(f"kf cannot convert the region with run-time sizes: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}") from None
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = [o.meta["val"] for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.fx.Node)]
    return unified(caps[0], caps[1], outs, sizes.input_dims, sizes.held(), caps[2])


def output_strides(gm: torch.fx.GraphModule, sizes: SizePlan) -> Callable[[tuple], list]:
    """A call's args -> the strides the graph promises for each output at the call's
    sizes (None where they are the contiguous ones kf's results have)."""
    import sympy

    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None
            for o in (out if isinstance(out, (list, tuple)) else [out])]
    exprs = []
    for v in vals:
        if not isinstance(v, torch.Tensor):
            exprs.append(None)
            continue
        shape = [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in v.shape]
        stride = [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in v.stride()]
        contiguous, run = True, sympy.Integer(1)
        for n, s in reversed(list(zip(shape, stride))):
            contiguous = contiguous and sympy.expand(s - run) == 0
            run = run * n
        unbound = {str(x) for s in stride for x in s.free_symbols} - set(sizes.binds)
        if not contiguous and unbound:
            raise DynamicFallback(f"an output's strides {tuple(stride)} are of sizes no input dim gives")
        exprs.append(None if contiguous else stride)

    def strides(args) -> list:
        if all(e is None for e in exprs):
            return [None] * len(exprs)
        bound = sizes.bind(args)
        return [None if e is None else tuple(int(s.xreplace(bound)) for s in e) for e in exprs]

    return strides
