"""ATen ops to kf ops: one handler per ATen overload, following torch's semantics
(broadcasting, type promotion, defaults) so that the kf function computes what eager does.

Type promotion is read off the graph rather than re-derived: every FX node carries its
result as a fake tensor (``node.meta["val"]``), so each handler casts operands to the
dtype torch computed in and checks that its result matches torch's shape and dtype.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of
from kf.dialects.elements import LOW_PRECISION

from .dtypes import TORCH_TO_KF, kf_elem
from .errors import Unsupported


Handler = Callable[["Converter", torch.fx.Node, list, dict], Any]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str):
    def register(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return register


def _val(node: torch.fx.Node):
    return node.meta.get("val")


def _elem_of(x) -> str | None:
    if isinstance(x, ir.Value):
        return spec_of(x.type).elem
    return None


def _py_kind(x) -> str:
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int"
    return "float"


class Converter:
    """Converts the ATen nodes of one graph, inserting kf ops at the current point."""

    def __init__(self, module: ir.Module, block: ir.Block, fn: Callable):
        self.module = module
        self.block = block
        self.fn = fn
        self._fallbacks = 0
        self.fallback_ops: dict[str, Callable] = {}  # torch-mlir-imported callee -> the ATen op
        # the function's random state (a block argument made on the first random op,
        # see random_state.py) and the counters its random ops have taken so far
        self.random_state: ir.Value | None = None
        self.random_offset = 0

    # ------------------------------------------------------------------ helpers
    def convert(self, node: torch.fx.Node, env: dict) -> Any:
        if node.target is operator.getitem:
            seq, idx = node.args
            return env[seq][idx]
        name = _target_name(node.target)
        args = [_lookup(a, env) for a in node.args]
        kwargs = {k: _lookup(v, env) for k, v in node.kwargs.items()}
        _refuse_data_dependent(node, name)
        _refuse_dtypes(node, name, [*args, *kwargs.values()])
        _refuse_indexing_nothing(node, name)
        empty = _empty_results(_val(node))
        if empty is not None:
            # Nothing to compute: any op whose results have no elements is those empty
            # tensors (and torch-mlir's lowerings divide by zero-sized dims).
            return empty
        handler = HANDLERS.get(name)
        if handler is None and _draws_random(node.target):
            # torch-mlir's random ops keep a seed of their own: torch.manual_seed would not
            # reproduce them, and a backward could not recompute their numbers
            in_place = node.target._opname.endswith("_")
            raise Unsupported(f"{name} draws random numbers, which kf does not support for this op",
                              cause="use the op's out-of-place form (inplace=False)" if in_place else
                              "kf draws them for dropout, rand, rand_like, randn, randn_like and bernoulli")
        if handler is None:
            from . import torch_mlir_import

            return torch_mlir_import.import_op(self, node, name, args, kwargs)
        result = handler(self, node, args, kwargs)
        self._check(node, name, result)
        return result

    def _check(self, node, name, result) -> None:
        val = _val(node)
        if isinstance(val, torch.Tensor) and isinstance(result, ir.Value):
            got = spec_of(result.type)
            want_shape, want_elem = tuple(val.shape), kf_elem(val.dtype)
            if got.shape != want_shape or got.elem != want_elem:
                raise Unsupported(
                    f"kf's lowering of {name} gives {got}, torch gives {want_elem}{list(want_shape)}",
                    cause="an internal error in kf's ATen conversion")

    def out_elem(self, node) -> str:
        val = _val(node)
        return kf_elem(val.dtype)

    def tensor(self, x, elem: str) -> ir.Value:
        """x as a kf tensor of element type elem (Python numbers become rank-0 fills)."""
        if isinstance(x, ir.Value):
            return x if spec_of(x.type).elem == elem else kb.cast(x, elem)
        if isinstance(x, (bool, int, float)):
            return kb.scalar(float(x), elem)
        raise Unsupported(f"expected a tensor or a number, got {type(x).__name__}")

    def constant_tensor(self, t: torch.Tensor) -> ir.Value | "Unconvertible":
        """A kf.constant with the values of a tensor the function made itself (an
        Unconvertible, which the op that uses it reports, for a dtype kf lacks)."""
        import numpy as np

        if t.dtype not in TORCH_TO_KF:
            return Unconvertible(t.dtype)
        elem = kf_elem(t.dtype)
        arr = t.detach().cpu()
        if elem in ("bf16", "f8E4M3FN", "f8E5M2"):
            arr = arr.float()
            elem_store = "f32"
        else:
            elem_store = elem
        attr = ir.DenseElementsAttr.get(np.ascontiguousarray(arr.numpy()),
                                        type=ir.RankedTensorType.get(list(t.shape), ir.Type.parse(elem_store)))
        v = kb.constant(attr)
        return v if elem_store == elem else kb.cast(v, elem)

    def rand(self, shape, distribution: str = "uniform") -> ir.Value:
        """kf.rand of shape (f32 samples) from the function's random state, on the next
        counters: each random op of a function takes its own blocks (dialects/philox.py)."""
        if self.random_state is None:
            from kf.dialects import TensorSpec, mlir_type

            from .random_state import STATE_SHAPE

            self.random_state = self.block.add_argument(mlir_type(TensorSpec(STATE_SHAPE, "i64")),
                                                        ir.Location.unknown())
        from kf.dialects.philox import blocks

        value = kb.rand(self.random_state, tuple(shape), offset=self.random_offset, distribution=distribution)
        self.random_offset += blocks(math.prod(shape), distribution)
        return value

    def compute_elem(self, *xs) -> str:
        """torch's promoted dtype of the operands (tensors win over Python numbers)."""
        tensors = [x for x in xs if isinstance(x, ir.Value)]
        elems = [spec_of(t.type).elem for t in tensors]
        dt = None
        from .dtypes import torch_dtype

        for e in elems:
            dt = torch_dtype(e) if dt is None else torch.promote_types(dt, torch_dtype(e))
        scalars = [x for x in xs if not isinstance(x, ir.Value)]
        if dt is None:
            return "f32"
        if any(_py_kind(s) == "float" for s in scalars) and not dt.is_floating_point:
            dt = torch.get_default_dtype()
        elif any(_py_kind(s) == "int" for s in scalars) and dt == torch.bool:
            dt = torch.int64
        return kf_elem(dt)


class Unconvertible:
    """A constant of a dtype kf has no element type for; the op using it is refused."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


#: ATen ops whose results kf does not support the element type of, or whose arguments
#: it cannot hold, get this advice.
_DTYPE_ADVICE = ("kf's tensors hold " + ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_KF)
                 + "; int8, int16 and uint8 are not supported yet (compute in torch.int32 and convert "
                   "outside the kf function)")


def _refuse_dtypes(node: torch.fx.Node, name: str, args: list) -> None:
    """Unsupported, naming the dtype, for an op that makes or takes a tensor of a dtype
    kf has no element type for (int8, int16, uint8, complex, ...)."""
    def walk(x):
        if isinstance(x, Unconvertible):
            yield x.dtype
        elif isinstance(x, (list, tuple)):
            for y in x:
                yield from walk(y)

    for dtype in walk(args):
        raise Unsupported(f"{name} takes a tensor of {str(dtype).removeprefix('torch.')}, which kf does not support",
                          cause=_DTYPE_ADVICE)
    for t in _tensors(_val(node)):
        if t.dtype not in TORCH_TO_KF:
            raise Unsupported(f"{name} makes a tensor of {str(t.dtype).removeprefix('torch.')}, which kf does "
                              f"not support", cause=_DTYPE_ADVICE)


def _tensors(val) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _symbolic(val) -> bool:
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(val, torch.Tensor):
        return any(not isinstance(d, int) for d in val.shape)
    if isinstance(val, (list, tuple)):
        return any(_symbolic(v) for v in val)
    return False


def _refuse_data_dependent(node: torch.fx.Node, name: str) -> None:
    """Unsupported for an op whose result's shape (nonzero, masked_select, unique,
    boolean-mask indexing) or value as a Python number (item) depends on the values of
    its inputs: kf compiles a function for the shapes of its arguments, so such a result
    would be the one of the example call, silently wrong on other values."""
    if _symbolic(_val(node)):
        what = "value" if not _tensors(_val(node)) else "shape"
        raise Unsupported(f"{name}: the {what} of its result depends on the values of its inputs, not only on "
                          f"their shapes", cause="kf compiles a function for its arguments' shapes; keep "
                          "data-dependent shapes (nonzero, masked_select, x[mask], unique, .item()) outside the "
                          "kf function, or use torch.where / masked_fill with a fixed shape")


#: ATen ops that add into ``self`` along ``dim`` at the positions of ``index``.
_ADD_AT_INDEX = ("aten.index_add.default", "aten.scatter_add.default")


def _refuse_indexing_nothing(node: torch.fx.Node, name: str) -> None:
    """An error for index_add / scatter_add into a dimension of size 0 with indices: every
    index is out of range whatever its value (torch raises), and the result, having no
    elements, would otherwise need no kernel to check them."""
    if name not in _ADD_AT_INDEX:
        return
    x, dim, index = (_val(a) if isinstance(a, torch.fx.Node) else a for a in node.args[:3])
    size = x.shape[dim % max(x.dim(), 1)] if x.dim() else 1
    if size == 0 and index.numel():
        raise Unsupported(f"{name}: index out of range: it adds at {index.numel()} indices into a dimension of size 0",
                          cause="no index is valid in an empty dimension")


def _empty_results(val):
    """Empty kf tensors for a node whose every result has no elements, else None."""
    tensors = _tensors(val)
    if not tensors or any(t.numel() for t in tensors):
        return None

    def make(v):
        if isinstance(v, torch.Tensor):
            return kb.fill(tuple(v.shape), kf_elem(v.dtype), 0.0)
        return type(v)(make(x) for x in v)

    if isinstance(val, (list, tuple)) and any(not isinstance(v, (torch.Tensor, list, tuple)) for v in val):
        return None
    return make(val)


def _lookup(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_lookup(x, env) for x in a)
    return a


def _draws_random(target) -> bool:
    """Whether an ATen op draws from torch's generator (torch tags it so)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._opname}.{target._overloadname}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def _rank(x: ir.Value) -> int:
    return spec_of(x.type).rank


def _shape(x: ir.Value) -> tuple[int, ...]:
    return spec_of(x.type).shape


def _vector(x: ir.Value) -> ir.Value:
    """A 0-dim tensor as a 1-element vector: torch takes dim 0 or -1 of a 0-dim tensor as
    its one element, kf's indexing ops need a dimension to index."""
    return kb.reshape(x, [1]) if _rank(x) == 0 else x


def _dims(dims, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % max(rank, 1) for d in dims]


# ---------------------------------------------------------------- elementwise


def _binary(kf_name: str):
    def handler(c: Converter, node, args, kwargs):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        elem = c.out_elem(node)
        lhs, rhs = c.tensor(a, elem), c.tensor(b, elem)
        if alpha != 1:
            rhs = kb.mul(rhs, c.tensor(alpha, elem))
        return getattr(kb, kf_name)(lhs, rhs)

    return handler


for _n, _k in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("maximum", "max"), ("minimum", "min")]:
    HANDLERS[f"aten.{_n}.Tensor"] = _binary(_k)
    HANDLERS[f"aten.{_n}.Scalar"] = _binary(_k)
    HANDLERS[f"aten.{_n}.default"] = _binary(_k)


@handles("aten.div.Tensor", "aten.div.Scalar", "aten.true_divide.Tensor", "aten.div.Tensor_mode")
def _div(c, node, args, kwargs):
    mode = kwargs.get("rounding_mode")
    if mode is not None:
        raise Unsupported(f"division with rounding_mode={mode!r} is not supported by kf")
    elem = c.out_elem(node)
    return kb.div(c.tensor(args[0], elem), c.tensor(args[1], elem))


@handles("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(c, node, args, kwargs):
    elem = c.out_elem(node)
    alpha = kwargs.get("alpha", 1)
    a = c.tensor(args[0], elem)
    if alpha != 1:
        a = kb.mul(a, c.tensor(alpha, elem))
    return kb.sub(c.tensor(args[1], elem), a)


@handles("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(c, node, args, kwargs):
    elem = c.out_elem(node)
    base, exp = args
    if isinstance(exp, (int, float)) and not isinstance(exp, bool) and isinstance(base, ir.Value):
        x = c.tensor(base, elem)
        if exp == 2:
            return kb.mul(x, x)
        if exp == 1:
            return x
        if exp == 0.5:
            return kb.sqrt(x)
        if exp == -0.5:
            return kb.rsqrt(x)
        if exp == -1:
            return kb.reciprocal(x)
    return kb.pow(c.tensor(base, elem), c.tensor(exp, elem))


def _unary(kf_name: str, float_result: bool = True):
    def handler(c: Converter, node, args, kwargs):
        elem = c.out_elem(node)
        return getattr(kb, kf_name)(c.tensor(args[0], elem))

    return handler


for _n, _k in [("neg", "neg"), ("abs", "abs"), ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"),
               ("rsqrt", "rsqrt"), ("reciprocal", "reciprocal"), ("tanh", "tanh"), ("erf", "erf"),
               ("sigmoid", "sigmoid"), ("relu", "relu")]:
    HANDLERS[f"aten.{_n}.default"] = _unary(_k)


@handles("aten.gelu.default")
def _gelu(c, node, args, kwargs):
    approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    return kb.gelu(c.tensor(args[0], c.out_elem(node)), approximate=approx)


@handles("aten.silu.default")
def _silu(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    return kb.mul(x, kb.sigmoid(x))


@handles("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(c, node, args, kwargs):
    elem = c.out_elem(node)
    x = c.tensor(args[0], elem)
    lo = kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    if lo is not None:
        x = kb.max(x, c.tensor(lo, elem))
    if hi is not None:
        x = kb.min(x, c.tensor(hi, elem))
    return x


def _compare(pred: str):
    def handler(c: Converter, node, args, kwargs):
        elem = c.compute_elem(args[0], args[1])
        return kb.cmp(c.tensor(args[0], elem), c.tensor(args[1], elem), predicate=pred)

    return handler


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    HANDLERS[f"aten.{_n}.Scalar"] = _compare(_n)
    HANDLERS[f"aten.{_n}.Tensor"] = _compare(_n)


@handles("aten.logical_not.default")
def _logical_not(c, node, args, kwargs):
    x = c.tensor(args[0], "i1")
    return kb.cmp(x, c.tensor(False, "i1"), predicate="eq")


@handles("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(c, node, args, kwargs):
    elem = c.out_elem(node)
    cond = c.tensor(args[0], "i1")
    return kb.select(cond, c.tensor(args[1], elem), c.tensor(args[2], elem))


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(c, node, args, kwargs):
    x, mask, value = args
    mask = c.tensor(mask, "i1")
    if isinstance(value, ir.Value):
        return kb.select(mask, c.tensor(value, spec_of(x.type).elem), x)
    return kb.masked_fill(x, mask, value=float(value))


@handles("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
         "aten.type_as.default", "aten._autocast_to_reduced_precision.default",
         "aten._autocast_to_full_precision.default")
def _to(c, node, args, kwargs):
    return c.tensor(args[0], c.out_elem(node))


@handles("aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
         "aten.lift_fresh_copy.default", "aten.lift_fresh.default",
         "aten.detach_.default")  # torch.tensor([...]) detaches its fresh constant in place
def _identity(c, node, args, kwargs):
    return args[0]


# ---------------------------------------------------------------- reductions


@handles("aten.sum.dim_IntList", "aten.sum.default")
def _sum(c, node, args, kwargs):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), _rank(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    elem = c.out_elem(node)
    if spec_of(x.type).is_float or elem == spec_of(x.type).elem:
        return kb.sum(c.tensor(x, elem), dims=dims, keepdim=keep)
    return kb.sum(c.tensor(x, elem), dims=dims, keepdim=keep)


@handles("aten.mean.dim", "aten.mean.default")
def _mean(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), _rank(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    return kb.mean(x, dims=dims, keepdim=keep)


@handles("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")
def _amax(c, node, args, kwargs):
    x = args[0]
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), _rank(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    is_max = node.target._opname in ("amax", "max")
    return (kb.reduce_max if is_max else kb.reduce_min)(x, dims=dims, keepdim=keep)


@handles("aten.max.dim", "aten.min.dim")
def _max_dim(c, node, args, kwargs):
    x, dim = args[0], args[1]
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if node.target._opname == "max":
        values = kb.reduce_max(x, dims=[dim], keepdim=keep)
        indices = kb.argmax(x, dim=dim, keepdim=keep)
    else:
        values = kb.reduce_min(x, dims=[dim], keepdim=keep)
        indices = kb.argmax(kb.neg(x), dim=dim, keepdim=keep)
    return (values, indices)


@handles("aten.argmax.default")
def _argmax(c, node, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dim is None:
        x, dim = kb.reshape(x, [math.prod(_shape(x))]), 0
    return kb.argmax(x, dim=dim, keepdim=keep)


def _bound(node, args, kwargs) -> dict:
    """The call's arguments by their schema names, defaults filled in: overloads such
    as ``var.default(self, unbiased)`` and ``var.dim(self, dim, unbiased, keepdim)`` put
    different things at one position."""
    p = {}
    for i, a in enumerate(node.target._schema.arguments):
        if not a.kwarg_only and i < len(args):
            p[a.name] = args[i]
        elif a.name in kwargs:
            p[a.name] = kwargs[a.name]
        else:
            p[a.name] = a.default_value if a.has_default_value() else None
    return p


#: the element type statistics are computed in: f16/bf16 (and fp8) inputs in f32, rounded once
def _stat_elem(elem: str) -> str:
    return "f32" if elem in LOW_PRECISION else elem


def _variance(c, node, args, kwargs):
    """(variance, mean, keepdim, the result element type) of var/std/var_mean/std_mean,
    in the statistics' precision: torch's correction (``unbiased``: 1 or 0; neither: 1),
    all dims for ``dim=None`` or ``[]``; over no elements both are NaN, and where the
    correction leaves no degrees of freedom the variance is m2 / 0 (inf, NaN for m2 = 0),
    as torch's max(0, N - correction)."""
    p = _bound(node, args, kwargs)
    out = _val(node)
    elem = kf_elem((out[0] if isinstance(out, (tuple, list)) else out).dtype)
    x = c.tensor(p["self"], _stat_elem(elem))
    dims = _dims(p.get("dim"), _rank(x))
    keep = bool(p.get("keepdim") or False)
    if p.get("correction") is not None:
        corr = float(p["correction"])
    elif p.get("unbiased") is not None:
        corr = 1.0 if p["unbiased"] else 0.0
    else:
        corr = 1.0
    n = math.prod(_shape(x)[d] for d in dims) if _rank(x) else 1
    shape = tuple(1 if i in dims else s for i, s in enumerate(_shape(x)) if keep or i not in dims)
    st = spec_of(x.type).elem
    if n == 0:
        nan = kb.fill(shape, st, math.nan)
        return nan, nan, keep, elem
    return kb.var(x, dims=dims, correction=corr, keepdim=keep), kb.mean(x, dims=dims, keepdim=keep), keep, elem


@handles("aten.var.correction", "aten.var.dim", "aten.var.default")
def _var(c, node, args, kwargs):
    var, _, _, elem = _variance(c, node, args, kwargs)
    return c.tensor(var, elem)


@handles("aten.std.correction", "aten.std.dim", "aten.std.default")
def _std(c, node, args, kwargs):
    var, _, _, elem = _variance(c, node, args, kwargs)
    return c.tensor(kb.sqrt(var), elem)


@handles("aten.var_mean.correction", "aten.var_mean.dim", "aten.var_mean.default",
         "aten.std_mean.correction", "aten.std_mean.dim", "aten.std_mean.default")
def _var_mean(c, node, args, kwargs):
    var, mean, _, elem = _variance(c, node, args, kwargs)
    if node.target._opname == "std_mean":
        var = kb.sqrt(var)
    return c.tensor(var, elem), c.tensor(mean, elem)


@handles("aten.logsumexp.default")
def _logsumexp(c, node, args, kwargs):
    x = c.tensor(args[0], c.out_elem(node))
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), _rank(x))
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    out = kb.logsumexp(x, dims=dims, keepdim=keep)
    return out if spec_of(out.type).elem == spec_of(x.type).elem else kb.cast(out, elem=spec_of(x.type).elem)


@handles("kf.logsumexp.default")
def _row_logsumexp(c, node, args, kwargs):
    """kf's own op (compiler/partition.py): the statistic in f32, whatever the input's type."""
    x = args[0]
    return kb.logsumexp(x, dims=_dims(args[1], _rank(x)), keepdim=bool(args[2]))


@handles("aten.softmax.int", "aten._softmax.default")
def _softmax(c, node, args, kwargs):
    return kb.softmax(c.tensor(args[0], c.out_elem(node)), dim=args[1])


@handles("aten.log_softmax.int", "aten._log_softmax.default")
def _log_softmax(c, node, args, kwargs):
    return kb.log_softmax(c.tensor(args[0], c.out_elem(node)), dim=args[1])


# ---------------------------------------------------------------- norms
# Statistics are computed in f32 for f16/bf16 inputs (f64 stays f64) and each result is
# rounded once to its type: what kf promises for norms, and what torch's fused kernels do.


def _normalize(c, xs, mean, var, eps: float, weight, bias, param_shape: tuple | None, elem: str):
    """(xs - mean) * rsqrt(var + eps) [* weight] [+ bias] in xs's (statistics) type,
    rounded once to elem; weight and bias reshaped to param_shape (None: as they are);
    returns (y, rstd)."""
    st = spec_of(xs.type).elem
    rstd = kb.rsqrt(kb.add(var, kb.scalar(float(eps), st)))
    y = kb.mul(kb.sub(xs, mean), rstd)
    for p, op in ((weight, kb.mul), (bias, kb.add)):
        if p is not None:
            p = c.tensor(p, st)
            y = op(y, kb.reshape(p, param_shape) if param_shape and _shape(p) != param_shape else p)
    return c.tensor(y, elem), rstd


@handles("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(c, node, args, kwargs):
    p = _bound(node, args, kwargs)
    x, normalized_shape = p["input"], p["normalized_shape"]
    elem = spec_of(x.type).elem
    xs = c.tensor(x, _stat_elem(elem))
    dims = list(range(_rank(x) - len(normalized_shape), _rank(x)))
    mean = kb.mean(xs, dims=dims, keepdim=True)
    var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    y, rstd = _normalize(c, xs, mean, var, p["eps"], p.get("weight"), p.get("bias"), None, elem)
    if node.target._opname == "native_layer_norm":
        val = _val(node)
        return (y, c.tensor(mean, kf_elem(val[1].dtype)), c.tensor(rstd, kf_elem(val[2].dtype)))
    return y


@handles("aten.rms_norm.default")
def _rms_norm(c, node, args, kwargs):
    """x * rsqrt(mean(x²) + eps) * weight; eps None: the machine epsilon of the type
    the statistics are computed in, as torch."""
    p = _bound(node, args, kwargs)
    x = p["input"]
    elem = spec_of(x.type).elem
    st = _stat_elem(elem)
    xs = c.tensor(x, st)
    eps = p.get("eps")
    eps = torch.finfo(torch.float64 if st == "f64" else torch.float32).eps if eps is None else float(eps)
    dims = list(range(_rank(x) - len(p["normalized_shape"]), _rank(x)))
    ms = kb.mean(kb.mul(xs, xs), dims=dims, keepdim=True)
    y = kb.mul(xs, kb.rsqrt(kb.add(ms, kb.scalar(eps, st))))
    if p.get("weight") is not None:
        y = kb.mul(y, c.tensor(p["weight"], st))
    return c.tensor(y, elem)


def _channel_shape(x) -> tuple[int, ...]:
    """Where a per-channel tensor (dim 1 of x) broadcasts against x: (1, C, 1, ...)."""
    return (1, _shape(x)[1]) + (1,) * (_rank(x) - 2)


def _batch_norm(c, x, weight, bias, running_mean, running_var, training: bool, momentum, eps: float):
    """Batch norm as torch's kernels compute it: (out, mean, rstd, new running mean, new
    running var) in the statistics' type (the last two None without running stats).
    Training normalizes by the batch's statistics over every dim but the channels (the
    biased variance), and moves the running ones towards them: ``(1 - momentum) *
    running + momentum * batch``, with the unbiased variance; otherwise it normalizes by
    the running statistics."""
    elem = spec_of(x.type).elem
    st = _stat_elem(elem)
    xs = c.tensor(x, st)
    ch = _channel_shape(x)
    C = ch[1]
    if training:
        dims = [0] + list(range(2, _rank(x)))
        mean = kb.mean(xs, dims=dims, keepdim=True)
        var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    elif running_mean is None or running_var is None:
        raise Unsupported("batch norm in evaluation mode needs running_mean and running_var")
    else:
        mean = kb.reshape(c.tensor(running_mean, st), ch)
        var = kb.reshape(c.tensor(running_var, st), ch)
    y, rstd = _normalize(c, xs, mean, var, eps, weight, bias, ch, elem)
    new_mean = new_var = None
    if training and running_mean is not None and running_var is not None:
        n = math.prod(_shape(x)) // max(C, 1)
        m = 0.1 if momentum is None else float(momentum)
        batch_var = kb.mul(var, kb.scalar(n / (n - 1), st)) if n > 1 else kb.mul(var, kb.scalar(math.inf, st))
        moved = []
        for running, batch in ((running_mean, mean), (running_var, batch_var)):
            r_elem = spec_of(running.type).elem
            r = kb.add(kb.mul(c.tensor(running, st), kb.scalar(1.0 - m, st)),
                       kb.mul(kb.reshape(batch, (C,)), kb.scalar(m, st)))
            moved.append(c.tensor(r, r_elem))
        new_mean, new_var = moved
    return y, mean, rstd, new_mean, new_var


def _saved(c, node, i: int, stat):
    """Output i of a batch norm node (a saved mean or rstd): the statistic reshaped to the
    shape torch gives (C; 0 elements in evaluation mode) and its type."""
    val = _val(node)[i]
    if math.prod(val.shape) == 0:
        return kb.fill(tuple(val.shape), kf_elem(val.dtype), 0.0)
    return c.tensor(kb.reshape(stat, tuple(val.shape)), kf_elem(val.dtype))


@handles("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.default",
         "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_no_training.default",
         "aten.native_batch_norm.default")
def _native_batch_norm(c, node, args, kwargs):
    """The ATen batch norms of a functionalized graph: (out, save_mean, save_rstd), and the
    new running statistics for ``_functional`` (which capture copies back into the
    caller's tensors). The forms that write to their running statistics themselves appear
    only in a graph capture did not functionalize: they are refused."""
    p = _bound(node, args, kwargs)
    name = _target_name(node.target)
    training = name == "aten._native_batch_norm_legit.no_stats" or bool(p.get("training"))
    rm, rv = p.get("running_mean"), p.get("running_var")
    writes = name in ("aten._native_batch_norm_legit.default", "aten.native_batch_norm.default")
    if writes and training and rm is not None:
        raise Unsupported(f"{name} writes to its running statistics in a graph kf did not functionalize",
                          cause="an internal error in kf's capture")
    y, mean, rstd, new_mean, new_var = _batch_norm(c, p["input"], p.get("weight"), p.get("bias"), rm, rv,
                                                   training, p.get("momentum"), float(p["eps"]))
    outs = (y, _saved(c, node, 1, mean), _saved(c, node, 2, rstd))
    if name == "aten._native_batch_norm_legit_functional.default":
        outs += (new_mean, new_var)
    return outs


@handles("aten.batch_norm.default", "aten.instance_norm.default")
def _batch_norm_op(c, node, args, kwargs):
    """F.batch_norm / F.instance_norm as one op (a graph capture did not functionalize, or
    instance norm, which torch.export keeps whole). The running statistics a training
    norm would update are refused: the graph has no output to write them back from."""
    p = _bound(node, args, kwargs)
    x, rm, rv = p["input"], p.get("running_mean"), p.get("running_var")
    training = bool(p["training"] if "training" in p else p["use_input_stats"])
    name = node.target._opname
    if training and (rm is not None or rv is not None):
        raise Unsupported(f"{name} with running statistics in training mode is not supported by kf",
                          cause="kf does not update the running statistics of this form; pass "
                                "running_mean=None and running_var=None (track_running_stats=False)"
                          if name == "instance_norm" else "an internal error in kf's capture")
    if name == "batch_norm":
        return _batch_norm(c, x, p.get("weight"), p.get("bias"), rm, rv, training, p.get("momentum"),
                           float(p["eps"]))[0]
    if not training:  # instance norm by the running statistics: a batch norm in evaluation
        return _batch_norm(c, x, p.get("weight"), p.get("bias"), rm, rv, False, None, float(p["eps"]))[0]
    elem = spec_of(x.type).elem
    xs = c.tensor(x, _stat_elem(elem))
    dims = list(range(2, _rank(x)))
    mean = kb.mean(xs, dims=dims, keepdim=True)
    var = kb.var(xs, dims=dims, correction=0.0, keepdim=True)
    return _normalize(c, xs, mean, var, float(p["eps"]), p.get("weight"), p.get("bias"), _channel_shape(x),
                      elem)[0]


@handles("aten.group_norm.default", "aten.native_group_norm.default")
def _group_norm(c, node, args, kwargs):
    """Statistics over each group of channels (and every spatial dim), computed on x
    viewed as (N, G, C / G, spatial): the reductions are over trailing dims, and the
    per-channel weight and bias are applied in that view."""
    p = _bound(node, args, kwargs)
    x = p["input"]
    shape = _shape(x)
    if node.target._opname == "native_group_norm":
        g = p["group"]
    else:
        g = p["num_groups"]
    n, ch = shape[0], shape[1]
    if g <= 0 or ch % g:
        raise Unsupported(f"group_norm of {ch} channels in {g} groups")
    elem = spec_of(x.type).elem
    st = _stat_elem(elem)
    spatial = math.prod(shape[2:])
    eps = float(p["eps"])
    if ch // g * spatial == 1:
        # groups of one element, (N, C) with C groups: each is its own mean, its variance
        # is 0 (in x's own layout: no reduction whose result a reshape would carry)
        xs = c.tensor(kb.reshape(x, (n, g)), st)
        y, rstd = _normalize(c, xs, xs, kb.fill((n, g), st, 0.0), eps, p.get("weight"), p.get("bias"), None, elem)
        mean, y = xs, kb.reshape(y, shape)
    else:
        grouped = (n, g, ch // g, spatial)
        xs = c.tensor(kb.reshape(x, grouped), st)
        mean = kb.mean(xs, dims=[2, 3], keepdim=True)
        var = kb.var(xs, dims=[2, 3], correction=0.0, keepdim=True)
        y, rstd = _normalize(c, xs, mean, var, eps, p.get("weight"), p.get("bias"), (1, g, ch // g, 1), elem)
        y = kb.reshape(y, shape)
    if node.target._opname == "native_group_norm":
        val = _val(node)
        return (y, c.tensor(kb.reshape(mean, (n, g)), kf_elem(val[1].dtype)),
                c.tensor(kb.reshape(kb.broadcast_to(rstd, _shape(mean)), (n, g)), kf_elem(val[2].dtype)))
    return y


# ---------------------------------------------------------------- contraction


@handles("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def _matmul(c, node, args, kwargs):
    a, b = args
    elem = c.out_elem(node)
    a, b = c.tensor(a, elem), c.tensor(b, elem)
    ra, rb = _rank(a), _rank(b)
    if ra == 1 and rb == 1:
        return kb.sum(kb.mul(a, b), dims=[0], keepdim=False)
    squeeze = []
    if ra == 1:
        a = kb.reshape(a, (1,) + _shape(a))
        squeeze.append(-2)
    if rb == 1:
        b = kb.reshape(b, _shape(b) + (1,))
        squeeze.append(-1)
    out = kb.matmul(a, b)
    if squeeze:
        shape = list(_shape(out))
        for d in sorted(squeeze):
            shape.pop(len(shape) + d if d == -1 else len(shape) - 2)
        out = kb.reshape(out, shape)
    return out


@handles("aten._scaled_mm.default")
def _scaled_mm(c, node, args, kwargs):
    """torch._scaled_mm, torch's fp8 GEMM: ``(a @ b) * scale_a * scale_b (+ bias)`` with the
    products of the fp8 (or 16-bit) operands accumulated in f32 and one rounding to
    out_dtype. The matmul keeps its narrow operands (the CUDA strategy issues fp8
    mma.sync on them; other targets widen them as they load) and an f32 result."""
    from kf.dialects.types import TensorSpec

    names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    p = dict(zip(names, args))
    p.update(kwargs)
    a, b = p["self"], p["mat2"]
    if p.get("scale_result") is not None:
        raise Unsupported("torch._scaled_mm with scale_result (an fp8 output) is not supported by kf",
                          cause="give out_dtype=torch.bfloat16 or torch.float32")
    if _elem_of(a) != _elem_of(b):
        raise Unsupported(f"torch._scaled_mm of {_elem_of(a)} by {_elem_of(b)}: kf needs both operands of one type",
                          cause="mixed e4m3 x e5m2 products are not supported yet")
    shape = _shape(a)[:-1] + _shape(b)[-1:]
    out = kb.build("matmul", [a, b], None, [TensorSpec(tuple(shape), "f32")]).result
    for s in (p["scale_a"], p["scale_b"]):
        out = kb.mul(out, c.tensor(s, "f32"))
    if p.get("bias") is not None:
        out = kb.add(out, c.tensor(p["bias"], "f32"))
    return c.tensor(out, c.out_elem(node))


def _matmul_plus(c, a, b, bias, elem: str, alpha=1, beta=1):
    """alpha * (a @ b) + beta * bias, rounded once to elem: for f16/bf16 the product is
    kept in its f32 accumulator and the bias added in f32 (as torch's GEMM epilogues do),
    not rounded to elem before the addition."""
    from kf.dialects.types import TensorSpec

    st = _stat_elem(elem)
    a, b = c.tensor(a, elem), c.tensor(b, elem)
    if st == elem:
        out = kb.matmul(a, b)
    else:
        shape = _shape(a)[:-1] + _shape(b)[-1:]
        out = kb.build("matmul", [a, b], None, [TensorSpec(tuple(shape), st)]).result
    if alpha != 1:
        out = kb.mul(out, c.tensor(alpha, st))
    if bias is not None:
        bias = c.tensor(c.tensor(bias, elem), st)
        if beta != 1:
            bias = kb.mul(bias, c.tensor(beta, st))
        out = kb.add(out, bias)
    return c.tensor(out, elem)


@handles("aten.linear.default")
def _linear(c, node, args, kwargs):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    elem = c.out_elem(node)
    return _matmul_plus(c, x, kb.transpose(c.tensor(w, elem), perm=[1, 0]), bias, elem)


@handles("aten.addmm.default", "aten.baddbmm.default")
def _addmm(c, node, args, kwargs):
    bias, a, b = args[:3]
    return _matmul_plus(c, a, b, bias, c.out_elem(node), alpha=kwargs.get("alpha", 1), beta=kwargs.get("beta", 1))


# ---------------------------------------------------------------- layout


@handles("aten.t.default", "aten.numpy_T.default")
def _t(c, node, args, kwargs):
    x = args[0]
    r = _rank(x)
    if r < 2:
        return x
    return kb.transpose(x, perm=list(reversed(range(r))))


@handles("aten.transpose.int", "aten.swapaxes.default")
def _transpose(c, node, args, kwargs):
    x, d0, d1 = args
    r = _rank(x)
    if r == 0:  # transpose(0, 0) or (0, -1) of a 0-dim tensor is the tensor
        return x
    perm = list(range(r))
    d0, d1 = d0 % r, d1 % r
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return kb.transpose(x, perm=perm)


@handles("aten.permute.default")
def _permute(c, node, args, kwargs):
    x, perm = args
    return kb.transpose(x, perm=[p % _rank(x) for p in perm])


@handles("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
         "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints",
         "aten.unflatten.int", "aten.view_as.default", "aten.reshape_as.default")
def _reshape(c, node, args, kwargs):
    return kb.reshape(args[0], tuple(_val(node).shape))


@handles("aten.expand.default", "aten.expand_as.default", "aten.broadcast_to.default")
def _expand(c, node, args, kwargs):
    return kb.broadcast_to(args[0], tuple(_val(node).shape))


@handles("aten.slice.Tensor")
def _slice(c, node, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else 0
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    size = _shape(x)[dim % _rank(x)]
    start, end, step = slice(start, end, step).indices(size)
    end = max(end, start)
    return kb.slice(x, dim=dim % _rank(x), start=start, end=end, step=step)


@handles("aten.select.int")
def _select_int(c, node, args, kwargs):
    x, dim, index = args
    dim = dim % _rank(x)
    index = index % _shape(x)[dim]
    s = kb.slice(x, dim=dim, start=index, end=index + 1, step=1)
    return kb.reshape(s, tuple(_val(node).shape))


@handles("aten.narrow.default")
def _narrow(c, node, args, kwargs):
    x, dim, start, length = args
    return kb.slice(x, dim=dim % _rank(x), start=start, end=start + length, step=1)


@handles("aten.cat.default", "aten.concat.default")
def _cat(c, node, args, kwargs):
    xs = [x for x in args[0] if math.prod(_shape(x)) > 0 or _rank(x) > 1]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    elem = c.out_elem(node)
    return kb.concat([c.tensor(x, elem) for x in xs], dim=dim % _rank(xs[0]))


@handles("aten.stack.default")
def _stack(c, node, args, kwargs):
    xs = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    r = _rank(xs[0]) + 1
    dim = dim % r
    parts = []
    for x in xs:
        shape = list(_shape(x))
        shape.insert(dim, 1)
        parts.append(kb.reshape(x, shape))
    return kb.concat(parts, dim=dim)


@handles("aten.meshgrid.default", "aten.meshgrid.indexing")
def _meshgrid(c, node, args, kwargs):
    xs = [kb.reshape(x, [math.prod(_shape(x))]) for x in args[0]]
    indexing = args[1] if len(args) > 1 else kwargs.get("indexing", "ij")
    shape = [_shape(x)[0] for x in xs]
    order = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:  # the first two grids' axes swapped
        shape[0], shape[1] = shape[1], shape[0]
        order[0], order[1] = 1, 0
    outs = []
    for k, x in enumerate(xs):
        at = [1] * len(xs)
        at[order[k]] = shape[order[k]]
        outs.append(kb.broadcast_to(kb.reshape(x, at), shape))
    return tuple(outs)


@handles("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unsafe_split.Tensor",
         "aten.unsafe_split_with_sizes.default", "aten.unsafe_chunk.default")
def _split(c, node, args, kwargs):
    x = args[0]
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % _rank(x)
    outs, start = [], 0
    for v in _val(node):
        n = v.shape[dim]
        outs.append(kb.slice(x, dim=dim, start=start, end=start + n, step=1))
        start += n
    return tuple(outs)


# ---------------------------------------------------------------- selection and indexing


@handles("aten.topk.default")
def _topk(c, node, args, kwargs):
    x, k = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
    if _rank(x) == 0:
        values, indices = kb.topk(_vector(x), k=k, dim=0, largest=bool(largest))
        shapes = [tuple(v.shape) for v in _val(node)]
        return kb.reshape(values, shapes[0]), kb.reshape(indices, shapes[1])
    return kb.topk(x, k=k, dim=dim % _rank(x), largest=bool(largest))


def _dim(dim: int, x: ir.Value) -> int:
    """dim of x in [0, rank), a 0-dim tensor counting as 1-D (torch's rule for the
    indexing ops); an IndexError-like Unsupported out of range."""
    r = max(_rank(x), 1)
    if not -r <= dim < r:
        raise Unsupported(f"dimension {dim} is out of range for a tensor of rank {_rank(x)}")
    return dim % r


def _wrap_negative(i: ir.Value, size: int) -> ir.Value:
    """Python's rule for negative indices, as advanced indexing and take apply it:
    ``i + size`` where ``-size <= i < 0``. What is still out of range is left so: the
    kernel that uses the index reports it."""
    elem = spec_of(i.type).elem
    zero, n = kb.fill((), elem, 0.0), kb.fill((), elem, float(size))
    return kb.select(kb.cmp(i, zero, predicate="lt"), kb.add(i, n), i)


def _as_shape(c, node, v: ir.Value) -> ir.Value:
    return kb.reshape(v, tuple(_val(node).shape))


@handles("aten.gather.default")
def _gather(c, node, args, kwargs):
    x, dim, index = args[:3]
    return _as_shape(c, node, kb.gather(_vector(x), _vector(index), dim=_dim(dim, x)))


@handles("aten.index_select.default")
def _index_select(c, node, args, kwargs):
    x, dim, index = args
    return _as_shape(c, node, kb.index_select(_vector(x), kb.reshape(index, [math.prod(_shape(index))]),
                                              dim=_dim(dim, x)))


@handles("aten.embedding.default")
def _embedding(c, node, args, kwargs):
    weight, indices = args[0], args[1]
    flat = kb.reshape(indices, [math.prod(_shape(indices))])
    rows = kb.index_select(weight, flat, dim=0)
    return kb.reshape(rows, tuple(_val(node).shape))


@handles("aten.index_add.default")
def _index_add(c, node, args, kwargs):
    x, dim, index, source = args[:4]
    alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
    elem = spec_of(x.type).elem
    source = c.tensor(source, elem)
    if alpha != 1:
        source = kb.mul(source, c.tensor(alpha, elem))
    d = _dim(dim, x)
    index = kb.reshape(index, [math.prod(_shape(index))])
    source = _vector(source) if _rank(x) == 0 else source
    return _as_shape(c, node, kb.index_add(_vector(x), index, source, dim=d))


@handles("aten.scatter_add.default")
def _scatter_add(c, node, args, kwargs):
    x, dim, index, src = args
    src = c.tensor(src, spec_of(x.type).elem)
    return _as_shape(c, node, kb.scatter_add(_vector(x), _vector(index), _vector(src), dim=_dim(dim, x)))


@handles("aten.index.Tensor")
def _index_tensor(c, node, args, kwargs):
    """Advanced indexing ``x[i, j]`` with integer index tensors (a None is a ``:``): the
    index tensors broadcast together and wrap negative values as Python does; the first
    indexed dim is an index_select, each further one a gather along it, so every index
    is checked against its own dimension by the kernel that uses it. The broadcast
    dims go where the indexed ones were when these are adjacent, else first (torch's
    rule)."""
    x, indices = args[0], list(args[1])
    xs = _shape(x)
    pos = [d for d, i in enumerate(indices) if i is not None]
    if not pos or any(_elem_of(indices[d]) not in ("i32", "i64") for d in pos):
        raise Unsupported("indexing with boolean masks or non-integer tensors is not supported by kf",
                          cause="index with integer tensors, or use torch.where / masked_fill")
    bshape = _broadcast([_shape(indices[d]) for d in pos])
    n = math.prod(bshape)
    wrapped = []
    for d in pos:
        i = indices[d]
        if _shape(i) != bshape:
            i = kb.broadcast_to(i, bshape)
        wrapped.append(kb.reshape(_wrap_negative(i, xs[d]), [n]))
    others = [d for d in range(len(xs)) if d not in pos]
    perm = pos + others
    t = kb.transpose(x, perm=perm) if perm != list(range(len(xs))) else x
    r = kb.index_select(t, wrapped[0], dim=0)  # [n, the other indexed dims, the rest]
    for w in wrapped[1:]:
        rest = list(_shape(r)[2:])
        at = kb.broadcast_to(kb.reshape(w, [n, 1] + [1] * len(rest)), [n, 1] + rest)
        r = kb.reshape(kb.gather(r, at, dim=1), [n] + rest)
    rest = [xs[d] for d in others]
    r = kb.reshape(r, list(bshape) + rest)
    if pos == list(range(pos[0], pos[0] + len(pos))) and pos[0] > 0:
        nb, before = len(bshape), pos[0]
        r = kb.transpose(r, perm=list(range(nb, nb + before)) + list(range(nb)) +
                         list(range(nb + before, nb + len(rest))))
    return r


def _broadcast(shapes) -> tuple[int, ...]:
    from kf.dialects.types import broadcast_shapes

    return broadcast_shapes(*shapes)


@handles("aten.take.default")
def _take(c, node, args, kwargs):
    x, index = args
    n = math.prod(_shape(x))
    flat_index = _wrap_negative(kb.reshape(index, [math.prod(_shape(index))]), n)
    return _as_shape(c, node, kb.index_select(kb.reshape(x, [n]), flat_index, dim=0))


@handles("aten.take_along_dim.default")
def _take_along_dim(c, node, args, kwargs):
    x, index = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is None:
        return _take(c, node, [x, index], {})
    d = _dim(dim, x)
    x, index = _vector(x), _vector(index)
    # torch broadcasts the two in every dim but dim
    outside = [_shape(t)[:d] + (1,) + _shape(t)[d + 1:] for t in (x, index)]
    shape = list(_broadcast(outside))
    xb, ib = list(shape), list(shape)
    xb[d], ib[d] = _shape(x)[d], _shape(index)[d]
    x = kb.broadcast_to(x, xb) if list(_shape(x)) != xb else x
    index = kb.broadcast_to(index, ib) if list(_shape(index)) != ib else index
    return _as_shape(c, node, kb.gather(x, _wrap_negative(index, xb[d]), dim=d))


@handles("aten.one_hot.default")
def _one_hot(c, node, args, kwargs):
    """``one_hot(i, C)``: each index is checked (torch refuses classes outside [0, C))
    by an index_select from ``arange(C)``, then compared with every class."""
    i = args[0]
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    n = math.prod(_shape(i))
    table = c.constant_tensor(torch.arange(classes, dtype=torch.int64))
    checked = kb.index_select(table, kb.cast(kb.reshape(i, [n]), "i64") if _elem_of(i) != "i64"
                              else kb.reshape(i, [n]), dim=0)
    hot = kb.cmp(kb.reshape(checked, [n, 1]), kb.reshape(table, [1, classes]), predicate="eq")
    return _as_shape(c, node, kb.cast(hot, "i64"))


@handles("aten.cross_entropy_loss.default", "aten.nll_loss_nd.default", "aten.nll_loss.default",
         "aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll(c, node, args, kwargs):
    """cross_entropy / nll_loss with class indices: the picked log-probability of each
    target (a gather, so each target is checked against the classes; targets equal to
    ignore_index are left out and never read), weighted, then reduced as torch does."""
    cross = node.target._opname == "cross_entropy_loss"
    names = ["self", "target", "weight", "reduction", "ignore_index"] + (["label_smoothing"] if cross else [])
    p = dict(zip(names, args))
    p.update(kwargs)
    x, target = p["self"], p["target"]
    weight, reduction = p.get("weight"), p.get("reduction", 1)
    ignore = p.get("ignore_index", -100)
    if isinstance(reduction, str):
        reduction = {"none": 0, "mean": 1, "sum": 2}[reduction]
    if not isinstance(target, ir.Value) or not _elem_of(target) in ("i32", "i64"):
        raise Unsupported(f"{_target_name(node.target)} with class probabilities as the target is not supported "
                          f"by kf", cause="give class indices")
    if cross and p.get("label_smoothing", 0.0):
        raise Unsupported("cross_entropy with label_smoothing is not supported by kf")
    elem = spec_of(x.type).elem
    logp = kb.log_softmax(x, dim=0 if _rank(x) == 1 else 1) if cross else x
    if _rank(logp) == 1:
        logp, target = kb.reshape(logp, [1, _shape(logp)[0]]), kb.reshape(target, [1])
    ts = _shape(target)
    t_elem = _elem_of(target)
    valid = kb.cmp(target, kb.fill((), t_elem, float(ignore)), predicate="ne")
    safe = kb.select(valid, target, kb.fill((), t_elem, 0.0))  # ignored targets read class 0, weighted 0
    at = kb.reshape(safe, [ts[0], 1, *ts[1:]])
    picked = kb.reshape(kb.gather(logp, at, dim=1), list(ts))
    w = kb.cast(valid, elem)
    if weight is not None:
        w = kb.mul(w, kb.reshape(kb.index_select(weight, kb.reshape(safe, [math.prod(ts)]), dim=0), list(ts)))
    loss = kb.neg(kb.mul(picked, w))
    dims = list(range(len(ts)))
    if node.target._opname in ("nll_loss_forward", "nll_loss2d_forward"):
        total = kb.sum(w, dims=dims)
        out = loss if reduction == 0 else kb.sum(loss, dims=dims)
        if reduction == 1:
            out = kb.div(out, total)
        return (_as_shape(c, node, out) if reduction == 0 else out, total)
    if reduction == 0:
        return _as_shape(c, node, loss)
    out = kb.sum(loss, dims=dims)
    return kb.div(out, kb.sum(w, dims=dims)) if reduction == 1 else out


# ---------------------------------------------------------------- values


def _fill_like(value_of: Callable[[list, dict], float]):
    def handler(c: Converter, node, args, kwargs):
        val = _val(node)
        return kb.fill(tuple(val.shape), kf_elem(val.dtype), float(value_of(args, kwargs)))

    return handler


for _n, _f in [("zeros_like.default", lambda a, k: 0.0), ("ones_like.default", lambda a, k: 1.0),
               ("empty_like.default", lambda a, k: 0.0), ("zeros.default", lambda a, k: 0.0),
               ("ones.default", lambda a, k: 1.0), ("empty.memory_format", lambda a, k: 0.0),
               ("full.default", lambda a, k: a[1]), ("full_like.default", lambda a, k: a[1]),
               ("new_zeros.default", lambda a, k: 0.0), ("new_ones.default", lambda a, k: 1.0),
               ("new_full.default", lambda a, k: a[2]), ("scalar_tensor.default", lambda a, k: a[0]),
               ("new_empty.default", lambda a, k: 0.0)]:
    HANDLERS["aten." + _n] = _fill_like(_f)


@handles("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(c, node, args, kwargs):
    val = _val(node)
    values = torch.arange(*args, dtype=val.dtype)
    return c.constant_tensor(values)


# ---------------------------------------------------------------- random numbers
#
# Random ops take kf.rand samples from the function's random state (Converter.rand),
# each op its own counters, in graph order. A backward recomputes them from the forward's
# state with the ops compiler/autograd.py writes for the same ATen ops (_replay_table), in
# the same order and with the same arithmetic, so the two must change together.


def _probability(p, what: str) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"{what} probability has to be between 0 and 1, but got {p}")
    return p


def _no_generator(name: str, generator) -> None:
    if generator is not None:
        raise Unsupported(f"{name} with a generator of its own is not supported by kf",
                          cause="kf draws from torch's default generator (torch.manual_seed)")


def _dropped(c: Converter, x: ir.Value, p: float) -> tuple[ir.Value, ir.Value]:
    """(x where its uniform sample is > p, scaled by 1 / (1 - p), and zero elsewhere (x * 0:
    NaN stays NaN, as in eager); the keep mask). Computed in f32 (f64 for f64) and rounded
    once to x's type; 0 < p < 1."""
    elem = spec_of(x.type).elem
    if not spec_of(x.type).is_float:
        raise Unsupported(f"dropout of a tensor of {elem}: torch drops out floating-point tensors only")
    keep = kb.cmp(c.rand(_shape(x)), kb.scalar(p, "f32"), predicate="gt")
    ce = "f64" if elem == "f64" else "f32"
    scale = kb.select(keep, kb.scalar(1.0 / (1.0 - p), ce), kb.scalar(0.0, ce))
    return c.tensor(kb.mul(c.tensor(x, ce), scale), elem), keep


@handles("aten.dropout.default")
def _dropout(c, node, args, kwargs):
    x = args[0]
    p = _probability(args[1] if len(args) > 1 else kwargs["p"], "dropout")
    train = args[2] if len(args) > 2 else kwargs["train"]
    if not train or p == 0.0 or math.prod(_shape(x)) == 0:
        return x
    if p == 1.0:  # eager multiplies by zero (NaN stays NaN) and draws nothing
        return kb.mul(x, c.tensor(0.0, spec_of(x.type).elem))
    return _dropped(c, x, p)[0]


@handles("aten.native_dropout.default")
def _native_dropout(c, node, args, kwargs):
    x = args[0]
    p = _probability(args[1] if len(args) > 1 else kwargs["p"], "dropout")
    train = args[2] if len(args) > 2 else kwargs.get("train")
    shape = _shape(x)
    if train is False or p == 0.0 or math.prod(shape) == 0:  # None trains, as in eager
        return x, kb.fill(shape, "i1", 1.0)
    if p == 1.0:
        return kb.mul(x, c.tensor(0.0, spec_of(x.type).elem)), kb.fill(shape, "i1", 0.0)
    return _dropped(c, x, p)


@handles("aten.rand.default", "aten.rand_like.default", "aten.randn.default", "aten.randn_like.default")
def _rand(c, node, args, kwargs):
    val = _val(node)
    shape, elem = tuple(val.shape), kf_elem(val.dtype)
    if math.prod(shape) == 0:
        return kb.fill(shape, elem, 0.0)
    if node.target._opname.startswith("randn"):
        return c.tensor(c.rand(shape, "normal"), elem)
    u = c.tensor(c.rand(shape), elem)
    if elem in ("f32", "f64"):
        return u
    # a narrower type rounds samples near 1 up to 1: those become 0, as torch's CUDA
    # uniform_ does, so the samples stay in [0, 1)
    return kb.select(kb.cmp(u, c.tensor(1.0, elem), predicate="eq"), c.tensor(0.0, elem), u)


@handles("aten.bernoulli.default", "aten.bernoulli.p")
def _bernoulli(c, node, args, kwargs):
    x = args[0]
    if node.target._overloadname == "p":
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        _no_generator("bernoulli", args[2] if len(args) > 2 else kwargs.get("generator"))
    else:
        p = x
        _no_generator("bernoulli", kwargs.get("generator"))
    elem = c.out_elem(node)
    if math.prod(_shape(x)) == 0:
        return kb.fill(_shape(x), elem, 0.0)
    u = c.rand(_shape(x))
    ce = c.compute_elem(u, p)
    return c.tensor(kb.cmp(c.tensor(u, ce), c.tensor(p, ce), predicate="lt"), elem)


@handles("kf.philox_rand.default")
def _philox_rand(c, node, args, kwargs):
    """kf.rand reading an explicit state (a generated backward's: random_state.py)."""
    state, offset, size, distribution = args
    return kb.rand(state, tuple(size), offset=int(offset), distribution=distribution)


@handles("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten.sym_constrain_range.default",
         "aten._assert_async.msg", "aten._functional_assert_async.msg")
def _assertion(c, node, args, kwargs):
    # Checks that export inserts about tensor metadata; the signature already fixes it.
    return None


# ---------------------------------------------------------------- writes, functionalized
# A function that writes to a tensor is captured functionalized (capture.py): each
# write becomes the op that computes the written tensor's new value, below.


@handles("aten.copy.default")
def _copy(c, node, args, kwargs):
    """copy(self, src): src cast to self's dtype and broadcast to its shape."""
    val = _val(node)
    src = c.tensor(args[1], kf_elem(val.dtype))
    return src if _shape(src) == tuple(val.shape) else kb.broadcast_to(src, tuple(val.shape))


@handles("aten.fill.Scalar", "aten.fill.Tensor", "aten.zero.default")
def _fill(c, node, args, kwargs):
    val = _val(node)
    shape, elem = tuple(val.shape), kf_elem(val.dtype)
    value = 0.0 if node.target._opname == "zero" else args[1]
    if isinstance(value, ir.Value):
        return kb.broadcast_to(c.tensor(value, elem), shape)
    return kb.fill(shape, elem, float(value))


@handles("aten.select_scatter.default")
def _select_scatter(c, node, args, kwargs):
    x, src, dim, index = args[:4]
    dim = dim % _rank(x)
    index = index % _shape(x)[dim]
    shape = list(_shape(src))
    shape.insert(dim, 1)
    return _scatter_slice(c, x, kb.reshape(c.tensor(src, spec_of(x.type).elem), shape), dim, index, index + 1, 1)


@handles("aten.slice_scatter.default")
def _slice_scatter(c, node, args, kwargs):
    names = ("self", "src", "dim", "start", "end", "step")
    p = {"dim": 0, "start": None, "end": None, "step": 1, **dict(zip(names, args)), **kwargs}
    x = p["self"]
    dim = p["dim"] % _rank(x)
    start, end, step = slice(p["start"], p["end"], p["step"]).indices(_shape(x)[dim])
    return _scatter_slice(c, x, c.tensor(p["src"], spec_of(x.type).elem), dim, start, max(end, start), step)


def _scatter_slice(c, x, src, dim: int, start: int, end: int, step: int):
    """x with x[start:end:step] along dim replaced by src (of that slice's shape)."""
    n = _shape(x)[dim]
    count = _shape(src)[dim]
    if count == 0:
        return x
    if step == 1:
        parts = [kb.slice(x, dim=dim, start=0, end=start, step=1)] if start > 0 else []
        parts.append(src)
        if end < n:
            parts.append(kb.slice(x, dim=dim, start=end, end=n, step=1))
        return kb.concat(parts, dim=dim)
    # every step-th element: src's rows spread out by a constant index, chosen by a mask
    rows = torch.arange(n)
    hit = (rows >= start) & (rows < end) & ((rows - start) % step == 0)
    pick = ((rows - start) // step).clamp(0, count - 1)
    spread = kb.index_select(src, c.constant_tensor(pick), dim=dim)
    mask_shape = [1] * _rank(x)
    mask_shape[dim] = n
    return kb.select(_mask_constant(c, hit.reshape(mask_shape)), spread, x)


def _mask_constant(c, mask: torch.Tensor) -> ir.Value:
    """A boolean kf constant (built from i32: dense i1 attributes want packed bits)."""
    return kb.cmp(c.constant_tensor(mask.to(torch.int32)), kb.scalar(0.0, "i32"), predicate="ne")


#: The most indices a non-accumulating index_put takes: its repeated indices are found
#: by comparing every pair of them.
INDEX_PUT_PAIRS_LIMIT = 4096


@handles("aten.index_put.default")
def _index_put(c, node, args, kwargs):
    """``x[index] = values`` (and ``+=`` with accumulate) for one index: a boolean mask
    over x's leading dims with one value, or a 1-D integer index along one dim. Where a
    non-accumulating index repeats, the last write wins, as in torch's CPU kernel."""
    x, indices, values = args[:3]
    accumulate = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    elem, shape, rank = spec_of(x.type).elem, _shape(x), _rank(x)
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or not isinstance(given[0][1], ir.Value):
        raise Unsupported("x[i, j, ...] = v with more than one index tensor is not supported by kf",
                          cause="index one dimension at a time, or use torch.where with a mask")
    d, index = given[0]
    ispec = spec_of(index.type)
    v = c.tensor(values, elem)
    if ispec.elem == "i1":
        if d != 0 or ispec.shape != shape[:ispec.rank]:
            raise Unsupported(f"a boolean index of shape {list(ispec.shape)} for a tensor of shape {list(shape)} "
                              f"is not supported by kf", cause="the mask must cover the tensor's leading dims")
        if math.prod(_shape(v)) != 1:
            raise Unsupported("x[mask] = values with more than one value is not supported by kf",
                              cause="how many elements the mask selects is known only at run time; "
                                    "use torch.where(mask, values, x)")
        mask = kb.reshape(index, ispec.shape + (1,) * (rank - ispec.rank))
        v = kb.reshape(v, ())
        if accumulate:
            return kb.add(x, kb.select(mask, v, kb.scalar(0.0, elem)))
        return kb.select(mask, v, x)
    if ispec.rank != 1:
        raise Unsupported(f"x[index] = v with a {ispec.rank}-d index is not supported by kf",
                          cause="flatten the index (and the values) to 1-D")
    return _put_rows(c, x, d, index, v, accumulate)


def _rows_hit(c, x, d: int, index):
    """i1 of shape (1, .., size of dim d, .., 1): whether index names each row."""
    rows_n = [1] * _rank(x)
    rows_n[d] = _shape(x)[d]
    ones = [1] * _rank(x)
    ones[d] = _shape(index)[0]
    hit = kb.index_add(kb.fill(rows_n, "f32", 0.0), index, kb.fill(ones, "f32", 1.0), dim=d)
    return kb.cmp(hit, kb.scalar(0.0, "f32"), predicate="ne")


def _put_rows(c, x, d: int, index, v, accumulate: bool):
    """x with rows index[p] along dim d replaced by v's rows p (added with accumulate);
    where an index repeats the last write wins, as in torch's CPU kernels."""
    elem, shape, rank = spec_of(x.type).elem, _shape(x), _rank(x)
    m = _shape(index)[0]
    if m == 0:
        return x
    rows = list(shape)
    rows[d] = m
    v = c.tensor(v, elem)
    v = kb.broadcast_to(v, tuple(rows)) if _shape(v) != tuple(rows) else v
    if accumulate:
        return kb.index_add(x, index, v, dim=d)
    if m > INDEX_PUT_PAIRS_LIMIT:
        raise Unsupported(f"writing {m} indexed rows is not supported by kf (at most {INDEX_PUT_PAIRS_LIMIT})",
                          cause="repeated indices are found by comparing every pair; use index_put_ with "
                                "accumulate=True on unique indices")
    # keep[p]: no later position writes the same row (the last write wins); computed in
    # the layout of the rows (m along d, a trailing dim over the other positions q), so
    # that nothing is reshaped after a reduction
    along = [1] * rank
    along[d] = m
    same = kb.cmp(kb.reshape(index, along + [1]), kb.reshape(index, [1] * rank + [m]), predicate="eq")
    later = _mask_constant(c, (torch.arange(m)[None, :] > torch.arange(m)[:, None]).reshape(along + [m]))
    overwritten = kb.sum(kb.cast(kb.select(later, same, kb.scalar(0.0, "i1")), "f32"), dims=[rank], keepdim=False)
    v = kb.select(kb.cmp(overwritten, kb.scalar(0.0, "f32"), predicate="eq"), v, kb.scalar(0.0, elem))
    # the rows some position writes are cleared first (a select: NaN rows clear too)
    return kb.index_add(kb.select(_rows_hit(c, x, d, index), kb.scalar(0.0, elem), x), index, v, dim=d)


@handles("aten.index_copy.default")
def _index_copy(c, node, args, kwargs):
    x, dim, index, source = args[:4]
    return _put_rows(c, x, dim % _rank(x), index, source, accumulate=False)


@handles("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def _index_fill(c, node, args, kwargs):
    x, dim, index, value = args[:4]
    index = kb.reshape(index, (1,)) if _rank(index) == 0 else index
    elem = spec_of(x.type).elem
    value = kb.reshape(c.tensor(value, elem), ()) if isinstance(value, ir.Value) else kb.scalar(float(value), elem)
    return kb.select(_rows_hit(c, x, dim % _rank(x), index), value, x)


# ---------------------------------------------------------------- pooling
# Average pooling is separable: the sum over a window is a sum along each pooled dim in
# turn, and torch's divisor is a product of one factor per dim (or divisor_override).
# Along one dim, output o sums input positions window(o) = [lo, hi); the j-th element
# of every window is one index_select of a constant index, masked where a window is
# shorter (padding, ceil_mode's last window, adaptive windows). Sums are in f32 for
# f16/bf16 inputs and rounded once.


def _windows(size: int, out: int, kernel: int, stride: int, pad: int) -> tuple[list, list, list]:
    """torch's avg_pool windows along one dim: (first index, end, window size counting
    padding) per output, the indices clipped to the input."""
    los, his, sizes = [], [], []
    for o in range(out):
        start = o * stride - pad
        end = min(start + kernel, size + pad)
        sizes.append(end - start)
        los.append(max(start, 0))
        his.append(min(end, size))
    return los, his, sizes


def _window_sum(c, x, dim: int, los: list, his: list):
    """out[.., o, ..] = sum of x[.., lo[o]:hi[o], ..] along dim (0 for an empty window)."""
    size, out = _shape(x)[dim], len(los)
    elem = spec_of(x.type).elem
    along = [1] * _rank(x)
    along[dim] = out
    total = None
    for j in range(max((h - lo for lo, h in zip(los, his)), default=0)):
        pos = torch.tensor([lo + j for lo in los])
        valid = torch.tensor([lo + j < h for lo, h in zip(los, his)])
        if pos.tolist() == list(range(size)) and bool(valid.all()):
            term = x
        else:
            term = kb.index_select(x, c.constant_tensor(pos.clamp(0, size - 1)), dim=dim)
        if not bool(valid.all()):
            term = kb.select(_mask_constant(c, valid.reshape(along)), term, kb.scalar(0.0, elem))
        total = term if total is None else kb.add(total, term)
    if total is None:
        shape = list(_shape(x))
        shape[dim] = out
        return kb.fill(shape, elem, 0.0)
    return total


def _pool_mean(c, x, windows: list[tuple[list, list]], divisor: torch.Tensor):
    """x summed over the windows of its last len(windows) dims, divided by divisor (the
    outputs' spatial shape), in the statistics' type and rounded once."""
    elem = spec_of(x.type).elem
    xs = c.tensor(x, _stat_elem(elem))
    k = len(windows)
    for i, (los, his) in enumerate(windows):
        xs = _window_sum(c, xs, _rank(x) - k + i, los, his)
    out = kb.div(xs, c.constant_tensor(divisor.to(torch.float64 if _stat_elem(elem) == "f64" else torch.float32)))
    return c.tensor(out, elem)


def _triple(v, k: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * k if len(v) == 1 else v


@handles("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(c, node, args, kwargs):
    """torch's avg_pool: windows of kernel_size every stride, padding counted in the
    divisor with count_include_pad (up to the padded input's end, so that ceil_mode's
    extra window is not), divisor_override instead of either."""
    p = _bound(node, args, kwargs)
    x = p["self"]
    k = int(node.target._opname[-2])
    kernel = _triple(p["kernel_size"], k)
    stride = _triple(p.get("stride") or kernel, k)
    pad = _triple(p.get("padding") or 0, k)
    out = tuple(_val(node).shape[-k:])
    windows, factors = [], []
    for d in range(k):
        los, his, sizes = _windows(_shape(x)[_rank(x) - k + d], out[d], kernel[d], stride[d], pad[d])
        windows.append((los, his))
        factors.append(torch.tensor(sizes if p.get("count_include_pad", True) else
                                    [h - lo for lo, h in zip(los, his)], dtype=torch.float64))
    counts = _outer([torch.tensor([h - lo for lo, h in zip(*w)], dtype=torch.float64) for w in windows])
    if p.get("divisor_override"):
        divisor = torch.full(out, float(p["divisor_override"]), dtype=torch.float64)
    else:
        divisor = _outer(factors)
    divisor = torch.where(counts > 0, divisor, 1.0)  # an empty window's output is 0, as torch's
    return _pool_mean(c, x, windows, divisor)


@handles("aten.adaptive_avg_pool1d.default", "aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default",
         "aten.adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(c, node, args, kwargs):
    """torch's adaptive windows: output o of n over an input of size s averages
    [floor(o * s / n), ceil((o + 1) * s / n))."""
    x = args[0]
    k = int(node.target._opname[-2])
    out = tuple(_val(node).shape[-k:])
    windows, factors = [], []
    for d in range(k):
        s = _shape(x)[_rank(x) - k + d]
        los = [(o * s) // out[d] for o in range(out[d])]
        his = [-((-(o + 1) * s) // out[d]) for o in range(out[d])]
        windows.append((los, his))
        factors.append(torch.tensor([h - lo for lo, h in zip(los, his)], dtype=torch.float64))
    divisor = _outer(factors)
    return _pool_mean(c, x, windows, torch.where(divisor > 0, divisor, 1.0))


def _outer(factors: list[torch.Tensor]) -> torch.Tensor:
    """The product of one factor per dim, over the grid of the dims."""
    out = torch.ones(())
    for f in factors:
        out = out.unsqueeze(-1) * f.to(out.dtype)
    return out


# ---------------------------------------------------------------- embedding bags


@handles("aten.embedding_bag.default", "aten.embedding_bag.padding_idx", "aten._embedding_bag.default")
def _embedding_bag(c, node, args, kwargs):
    """F.embedding_bag's sums and means (max: not supported): each index's row of the
    weight, times its per_sample_weight (sum only, as torch), rows equal to padding_idx
    left out (of the mean's count too), added into its bag. Bag b holds the positions from
    offsets[b] on; a position's bag is how many offsets it has reached, less one. Empty
    bags give zeros. Only the first result (the bags) is computed. Finding the bags
    compares every position with every offset (n x bags comparisons)."""
    p = _bound(node, args, kwargs)
    weight, idx, offsets, mode = p["weight"], p["indices"], p["offsets"], int(p["mode"])
    for user in node.users:
        if user.target is operator.getitem and user.args[1] != 0 and user.users:
            raise Unsupported("embedding_bag's offset2bag, bag_size and max_indices results are not computed by kf")
    if mode == 2:
        raise Unsupported("embedding_bag with mode='max' is not supported by kf", cause="use mode='sum' or 'mean'")
    if _rank(idx) != 1:
        raise Unsupported(f"embedding_bag of {_rank(idx)}-d indices with offsets")
    psw = p.get("per_sample_weights")
    if psw is not None and mode != 0:
        raise Unsupported("embedding_bag's per_sample_weights need mode='sum' (as torch)")
    pad = p.get("padding_idx")
    pad = None if pad is None or pad < 0 else pad
    elem = spec_of(weight.type).elem
    st = _stat_elem(elem)
    n, dim = _shape(idx)[0], _shape(weight)[1]
    bags = _shape(offsets)[0] - (1 if p.get("include_last_offset") else 0)
    out = kb.fill((bags, dim), st, 0.0)
    if n == 0 or bags <= 0:
        return c.tensor(out, elem), None, None, None
    rows = c.tensor(kb.index_select(weight, idx, dim=0), st)
    if psw is not None:
        rows = kb.mul(rows, kb.reshape(c.tensor(psw, st), (n, 1)))
    kept = None
    if pad is not None:
        kept = kb.reshape(kb.cmp(idx, kb.scalar(float(pad), spec_of(idx.type).elem), predicate="ne"), (n, 1))
        rows = kb.select(kept, rows, kb.scalar(0.0, st))
    starts = kb.slice(offsets, dim=0, start=0, end=bags, step=1)
    reached = kb.cmp(c.constant_tensor(torch.arange(n).reshape(n, 1)), kb.reshape(c.tensor(starts, "i64"), (1, bags)),
                     predicate="ge")
    bag = kb.sum(kb.cast(reached, "f32"), dims=[1], keepdim=False)
    # offsets that break torch's rules (offsets[0] != 0) cannot index outside the bags
    bag = kb.cast(kb.min(kb.max(kb.sub(bag, kb.scalar(1.0, "f32")), kb.scalar(0.0, "f32")),
                         kb.scalar(float(bags - 1), "f32")), "i64")
    out = kb.index_add(out, bag, rows, dim=0)
    if mode == 1:
        ones = kb.fill((n, 1), st, 1.0) if kept is None else kb.cast(kept, st)
        count = kb.index_add(kb.fill((bags, 1), st, 0.0), bag, ones, dim=0)
        out = kb.div(out, kb.max(count, kb.scalar(1.0, st)))
    return c.tensor(out, elem), None, None, None
