"""The kf interpreter: runs captured kf IR op by op with torch, on any device.

It is the reference semantics of the dialect (each op's torch meaning in one place), a
debugging mode (``kf.jit(interpret=True)`` or ``KF_INTERPRET=1``: set breakpoints, print
intermediates) and the oracle that compiled kernels are tested against. Reductions and
softmax of low-precision inputs are computed in float32 and rounded once, as kf's
kernels do.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from mlir import ir

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.ops import slice_bounds
from kf.dialects.types import DYN

from .dtypes import torch_dtype

_LOW = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in _LOW else x


def _binary(fn):
    def run(args, attrs, out):
        a, b = args
        return fn(_acc(a), _acc(b)).to(out)

    return run


def _division(remainder: bool):
    """kf.div and kf.fmod: torch's on floats; on integers C's (toward zero, the sign of
    the dividend), a divisor of 0 or -1 dividing by 1 and then negating (kf.div's rule)."""
    def run(args, attrs, out):
        a, b = (_acc(x) for x in args)
        if a.is_floating_point():
            return (torch.fmod(a, b) if remainder else torch.div(a, b)).to(out)
        a, b = torch.broadcast_tensors(a, b)
        minus_one, bad = b == -1, (b == 0) | (b == -1)
        safe = torch.where(bad, torch.ones_like(b), b)
        if remainder:
            value = torch.where(minus_one, torch.zeros_like(a), torch.fmod(a, safe))
        else:
            value = torch.where(minus_one, -a, torch.div(a, safe, rounding_mode="trunc"))
        return value.to(out)

    return run


def _bitwise(args, attrs, out):
    """kf.bitwise: torch's own ops (its shifts give 0 or the sign past the width)."""
    a, b = args
    return {"and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
            "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift}[attrs["kind"]](a, b).to(out)


def _unary(fn):
    def run(args, attrs, out):
        return fn(_acc(args[0])).to(out)

    return run


def _dims(attrs, x):
    dims = attrs.get("dims") or list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in dims]


def _reduce(fn):
    def run(args, attrs, out):
        x = args[0]
        if x.dim() == 0:
            return x.to(out)
        return fn(_acc(x), _dims(attrs, x), bool(attrs.get("keepdim", False))).to(out)

    return run


def _topk(args, attrs, out):
    values, indices = torch.topk(args[0], int(attrs["k"]), dim=int(attrs["dim"]),
                                 largest=bool(attrs.get("largest", True)))
    return values, indices


def _scan(x, dim: int, kind: str):
    if kind == "max" or kind == "min":
        return (torch.cummax if kind == "max" else torch.cummin)(x, dim).values
    acc = _acc(x)
    return {"sum": torch.cumsum, "prod": torch.cumprod, "logsumexp": torch.logcumsumexp}[kind](acc, dim)


def _slice(x: torch.Tensor, attrs: dict, run_time: bool) -> torch.Tensor:
    """kf.slice; along a run-time dim (``run_time``: the input's type has ``?`` there)
    its bounds may count from the end (dialects.ops.slice_bounds), which the tensor's
    size gives here."""
    dim, start, end, step = int(attrs["dim"]), int(attrs["start"]), int(attrs["end"]), int(attrs.get("step", 1))
    dim %= x.dim()
    if run_time:
        lo, hi = slice_bounds(start, end, None)
        start = x.shape[dim] + start if lo is None else lo
        end = x.shape[dim] + end if hi is None else hi
    return x.narrow(dim, start, end - start)[(slice(None),) * dim + (slice(None, None, step),)]


def _constant(args, attrs, out, device):
    import numpy as np

    value = attrs["value"]
    arr = np.array(value)
    t = torch.from_numpy(arr.copy()).to(device)
    return t.reshape(tuple(spec_of(value.type).shape)).to(out)


OPS: dict[str, Callable] = {
    "kf.add": _binary(torch.add), "kf.sub": _binary(torch.sub), "kf.mul": _binary(torch.mul),
    "kf.div": _division(False), "kf.pow": _binary(torch.pow), "kf.fmod": _division(True), "kf.max": _binary(torch.maximum),
    "kf.min": _binary(torch.minimum),
    "kf.neg": _unary(torch.neg), "kf.abs": _unary(torch.abs), "kf.exp": _unary(torch.exp),
    "kf.log": _unary(torch.log), "kf.sqrt": _unary(torch.sqrt), "kf.rsqrt": _unary(torch.rsqrt),
    "kf.reciprocal": _unary(torch.reciprocal), "kf.tanh": _unary(torch.tanh), "kf.erf": _unary(torch.erf),
    "kf.erfc": _unary(torch.erfc), "kf.sin": _unary(torch.sin), "kf.cos": _unary(torch.cos), "kf.trunc": _unary(torch.trunc), "kf.round": _unary(torch.round),
    "kf.signbit": lambda a, at, o: torch.signbit(a[0]),
    "kf.sigmoid": _unary(torch.sigmoid), "kf.relu": _unary(torch.relu),
    "kf.gelu": lambda a, at, o: torch.nn.functional.gelu(_acc(a[0]), approximate=at.get("approximate", "none")).to(o),
    "kf.cmp": lambda a, at, o: {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
                                "ge": torch.ge}[at["predicate"]](a[0], a[1]),
    "kf.bitwise": _bitwise,
    "kf.select": lambda a, at, o: torch.where(a[0], a[1], a[2]).to(o),
    "kf.masked_fill": lambda a, at, o: a[0].masked_fill(a[1], at["value"]),
    "kf.cast": lambda a, at, o: a[0].to(o),
    "kf.sum": _reduce(lambda x, d, k: torch.sum(x, d, keepdim=k)),
    "kf.mean": _reduce(lambda x, d, k: torch.mean(x, d, keepdim=k)),
    "kf.reduce_max": _reduce(lambda x, d, k: torch.amax(x, d, keepdim=k)),
    "kf.reduce_min": _reduce(lambda x, d, k: torch.amin(x, d, keepdim=k)),
    "kf.logsumexp": _reduce(lambda x, d, k: torch.logsumexp(x, d, keepdim=k)),
    "kf.argmax": lambda a, at, o: torch.argmax(a[0], dim=int(at["dim"]), keepdim=bool(at.get("keepdim", False))),
    "kf.softmax": lambda a, at, o: torch.softmax(_acc(a[0]), dim=int(at["dim"])).to(o),
    "kf.log_softmax": lambda a, at, o: torch.log_softmax(_acc(a[0]), dim=int(at["dim"])).to(o),
    "kf.matmul": lambda a, at, o: torch.matmul(_acc(a[0]), _acc(a[1])).to(o),
    "kf.transpose": lambda a, at, o: a[0].permute(*at["perm"]),
    "kf.topk": _topk,
    "kf.scan": lambda a, at, o: _scan(a[0], int(at["dim"]), at["kind"]).to(o),
    "kf.concat": lambda a, at, o: torch.cat(list(a), dim=int(at["dim"])),
    "kf.gather": lambda a, at, o: torch.gather(a[0], int(at["dim"]), a[1].long()),
    "kf.index_select": lambda a, at, o: torch.index_select(a[0], int(at["dim"]), a[1].long()),
    "kf.index_add": lambda a, at, o: a[0].index_add(int(at["dim"]), a[1].long(), a[2]),
    "kf.scatter_add": lambda a, at, o: a[0].scatter_add(int(at["dim"]), a[1].long(), a[2]),
    "kf.scatter_reduce": lambda a, at, o: a[0].scatter(int(at["dim"]), a[1].long(), a[2]) if at["reduce"] == "none"
    else a[0].scatter_reduce(int(at["dim"]), a[1].long(), a[2], at["reduce"], include_self=bool(at["include_self"])),
}


def _var(args, attrs, out):
    x = _acc(args[0])
    return torch.var(x, _dims(attrs, x), correction=float(attrs.get("correction", 1.0)),
                     keepdim=bool(attrs.get("keepdim", False))).to(out)


OPS["kf.var"] = _var


class Interpreter:
    """Runs one kf function; ``fallbacks`` maps torch-mlir-imported callees to ATen ops."""

    def __init__(self, module: ir.Module, name: str, fallbacks: dict[str, Callable] | None = None,
                 trace: Callable[[ir.Operation, Any], None] | None = None):
        self.module = module
        self.name = name
        self.fallbacks = fallbacks or {}
        self.trace = trace

    def _func(self, name: str) -> ir.Operation:
        for op in self.module.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
                return op.operation
        raise KeyError(name)

    def run(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        f = self._func(self.name)
        block = f.regions[0].blocks[0]
        device = inputs[0].device if inputs else torch.device("cpu")
        env: dict = {}
        for arg, t in zip(block.arguments, inputs):
            env[arg] = t
        for op in block.operations:
            op = op.operation
            if op.name == "func.return":
                return [env[v] for v in op.operands]
            args = [env[v] for v in op.operands]
            if op.name == "func.call":
                callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                result = self.fallbacks[callee](*args)
                results = result if isinstance(result, (tuple, list)) else (result,)
            else:
                attrs = op_attrs(op)
                outs = [torch_dtype(spec_of(r.type).elem) for r in op.results]
                if op.name == "kf.fill":
                    shape = spec_of(op.result.type).shape
                    results = (torch.full(shape, attrs["value"], dtype=outs[0], device=device),)
                elif op.name == "kf.iota":
                    shape = spec_of(op.result.type).shape
                    dim = int(attrs["dim"]) % len(shape)
                    line = torch.arange(shape[dim], dtype=outs[0], device=device)
                    results = (line.reshape([-1 if d == dim else 1 for d in range(len(shape))]).expand(shape),)
                elif op.name == "kf.constant":
                    results = (_constant(args, attrs, outs[0], device),)
                elif op.name == "kf.rand":
                    from .random_state import samples

                    shape = spec_of(op.result.type).shape
                    results = (samples(args[0], int(attrs["offset"]), shape, attrs["distribution"]),)
                elif op.name == "kf.slice":
                    x = spec_of(op.operands[0].type)
                    results = (_slice(args[0], attrs, x.shape[int(attrs["dim"]) % x.rank] == DYN),)
                elif op.name in ("kf.reshape", "kf.broadcast_to"):
                    shape = spec_of(op.result.type).shape
                    x = args[0]
                    results = (x.reshape(shape) if op.name == "kf.reshape" else x.expand(shape),)
                else:
                    r = OPS[op.name](args, attrs, outs[0])
                    results = r if isinstance(r, tuple) else (r,)
            for v, t in zip(op.results, results):
                env[v] = t
            if self.trace is not None:
                self.trace(op, results)
        raise RuntimeError(f"function {self.name} has no return")
