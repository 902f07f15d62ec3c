"""The conversion's core: the handler table (``HANDLERS``, ``handles``), the ``Converter``
that walks an FX graph and calls a handler per ATen node, and the helpers every
family of handlers uses (result dtypes, dims, refusals with the user's line)."""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..dtypes import TORCH_TO_KF, kf_elem
from ..errors import Unsupported


Handler = Callable[["Converter", torch.fx.Node, list, dict], Any]


HANDLERS: dict[str, Handler] = {}
#: how an op with no handler converts ("op": decompositions.convert_unhandled, which
#: registers itself: torch's decomposition, else torch-mlir)
UNHANDLED: dict[str, Callable] = {}


def handles(*names: str):
    def register(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return register


def fake_value(node: torch.fx.Node):
    return node.meta.get("val")


def elem_of(x) -> str | None:
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
        self.decomposing: set = set()  # the ops whose decomposition is being converted (decompositions.py)

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
        empty = _empty_results(fake_value(node), indices_after_first=name in _INDEX_RESULTS)
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
            return UNHANDLED["op"](self, node, name, args, kwargs)
        result = handler(self, node, args, kwargs)
        self._check(node, name, result)
        return result

    def _check(self, node, name, result) -> None:
        val = fake_value(node)
        if isinstance(val, torch.Tensor) and isinstance(result, ir.Value):
            got = spec_of(result.type)
            want_shape, want_elem = tuple(val.shape), kf_elem(val.dtype)
            if got.shape != want_shape or got.elem != want_elem:
                raise Unsupported(
                    f"kf's lowering of {name} gives {got}, torch gives {want_elem}{list(want_shape)}",
                    cause="an internal error in kf's ATen conversion")

    def out_elem(self, node) -> str:
        val = fake_value(node)
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

            from ..random_state import STATE_SHAPE

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
        from ..dtypes import torch_dtype

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
                 + " (other dtypes: convert to one of them outside the kf function)")


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
    for t in _tensors(fake_value(node)):
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
    if _symbolic(fake_value(node)):
        what = "value" if not _tensors(fake_value(node)) else "shape"
        raise Unsupported(f"{name}: the {what} of its result depends on the values of its inputs, not only on "
                          f"their shapes", cause="kf compiles a function for its arguments' shapes; keep "
                          "data-dependent shapes (nonzero, masked_select, x[mask], unique, .item()) outside the "
                          "kf function, or use torch.where / masked_fill with a fixed shape")


#: ATen ops that add or write into ``self`` along ``dim`` at the positions of ``index``.
_ADD_AT_INDEX = ("aten.index_add.default", "aten.scatter_add.default", "aten.scatter.src", "aten.scatter.value",
                 "aten.scatter.reduce", "aten.scatter.value_reduce", "aten.scatter_reduce.two")


def _refuse_indexing_nothing(node: torch.fx.Node, name: str) -> None:
    """An error for index_add / scatter_add into a dimension of size 0 with indices: every
    index is out of range whatever its value (torch raises), and the result, having no
    elements, would otherwise need no kernel to check them."""
    if name not in _ADD_AT_INDEX:
        return
    x, dim, index = (fake_value(a) if isinstance(a, torch.fx.Node) else a for a in node.args[:3])
    size = x.shape[dim % max(x.dim(), 1)] if x.dim() else 1
    if size == 0 and index.numel():
        raise Unsupported(f"{name}: index out of range: it adds at {index.numel()} indices into a dimension of size 0",
                          cause="no index is valid in an empty dimension")


#: ATen ops whose results after the first are int64 (inverse indices and counts), whatever
#: dtype torch's fake implementation gives them (torch 2.11's gives the input's)
_INDEX_RESULTS = {"aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
                  "aten.unique_dim_consecutive.default"}


def _empty_results(val, indices_after_first: bool = False):
    """Empty kf tensors for a node whose every result has no elements, else None
    (``indices_after_first``: every result but the first is int64)."""
    tensors = _tensors(val)
    if not tensors or any(t.numel() for t in tensors):
        return None
    made = []

    def make(v):
        if isinstance(v, torch.Tensor):
            elem = "i64" if indices_after_first and made else kf_elem(v.dtype)
            made.append(v)
            return kb.fill(tuple(v.shape), elem, 0.0)
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


def rank_of(x: ir.Value) -> int:
    return spec_of(x.type).rank


def shape_of(x: ir.Value) -> tuple[int, ...]:
    return spec_of(x.type).shape


def as_vector(x: ir.Value) -> ir.Value:
    """A 0-dim tensor as a 1-element vector: torch takes dim 0 or -1 of a 0-dim tensor as
    its one element, kf's indexing ops need a dimension to index."""
    return kb.reshape(x, [1]) if rank_of(x) == 0 else x


def norm_dims(dims, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % max(rank, 1) for d in dims]
