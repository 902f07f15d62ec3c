"""Every kf function as a ``torch.library`` custom op: ``torch.ops.kf.<name>_<hash>``.

Why: torch.compile, torch.export and autograd see a kf call as one opaque op with a known
schema, a fake implementation and a backward, instead of tracing into kf's Python (which
calls ctypes, MLIR and the launchers and cannot be traced).

Each KfFunction registers its ops when it is made (about a millisecond, and no
torch._dynamo, so a function first called under torch.compile already has them):

    kf::<name>_<hash>(Tensor[] tensors, str structure) -> Tensor[]
    kf::<name>_<hash>_backward(Tensor[] tensors, Tensor[] grads, str structure) -> Tensor[]

The hash is of the function's module, qualified name and options (``op_name``), so the
names are the same in every process. ``tensors`` are the call's tensors, flattened in
parameter order; ``structure`` is the rest of the call signature written as text: ``T``
for a tensor, ``L2``/``U2`` for a list or tuple of two tensors, ``N`` for None, ``D`` for
a constant left at its default and ``=repr`` for a constant given (``T|T|T|D``,
``T|T|T|=1e-06``). It is computed by plain Python that Dynamo traces without a graph
break; shapes and dtypes travel with the tensors.

- The real implementation runs the compiled kf program (the ordinary dispatch of
  ``KfFunction``), outside any mode or tracing context of the caller (``_opaque``);
  outputs that alias an input are copied, as custom ops require. A function that writes
  to an argument raises MutationError there (mutation.py): the schema declares no
  writes, so torch.compile and autograd would not see them.
- A call under ``torch.autocast`` (with the precision option ``auto``) writes the
  autocast precision before its structure, ``@bf16;T|T``: the implementations run the
  function's variant of that precision (``KfFunction.variant``) and its backward. The
  implementation cannot read the state itself: autocast's dispatch keys are excluded
  inside it, and a compiled graph runs it after the region it was traced in has ended;
  Dynamo folds the autocast queries in ``call`` to constants and guards on them.
- The fake implementation runs the user's own function on the fake tensors: it is the
  captured function itself, so its output shapes and dtypes are those of the capture,
  and it follows symbolic shapes under ``torch.compile(dynamic=True)``.
- The autograd formula saves the inputs and calls ``kf::<name>_<hash>_backward``, whose
  implementation runs the kf-compiled backward of the specialization (autograd.py).
  The backward op's own formula differentiates that backward function in turn (double
  backward).
- A function that draws random numbers (dropout) returns one more tensor from the op:
  the random state its program drew (random_state.py), which the autograd formula saves
  with the inputs and hands to the backward, so that the backward recomputes the same
  numbers (the same dropout mask). Whether a function draws is read off its run on fake
  tensors (an op torch tags ``nondeterministic_seeded``), in the fake implementation and,
  before the first call, in the real one, so the two agree on the outputs.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import re
import threading
from typing import Any, Callable, Sequence

import torch
from torch._guards import TracingContext

from . import mutation
from .patching import originals
from .errors import SignatureError
from .logs import recompile_log
from .results import unflatten
from .signature import invoke, split_call

_LOCK = threading.Lock()


def op_name_base(fn: Callable) -> str:
    """The function's name as an op name (identifier characters only)."""
    name = re.sub(r"\W", "_", getattr(fn, "__name__", "fn")) or "fn"
    return name if not name[0].isdigit() else f"f_{name}"


def op_name(kfn) -> str:
    """``<name>_<hash>``: the function's name and a hash of its module, qualified name,
    where its code is and options. The name is the same in every process, whatever order
    functions are made in, so that code Inductor or AOTAutograd cached in one process
    calls the right op in another; a function defined again (same module, name, place
    and options) takes its op over. The place (first line, and for lambdas the column)
    is what tells apart two lambdas or two nested functions of one name in one scope,
    which share a qualified name: without it the second took the first's op over, and a
    call of the first through the op (autograd, torch.compile) ran the second."""
    fn = kfn.fn
    module = getattr(fn, "__module__", "")
    module = "__main__" if module == "__mp_main__" else module  # a script, as spawned workers import it
    code = getattr(fn, "__code__", None)
    place = "" if code is None else str(code.co_firstlineno)
    if code is not None and code.co_name == "<lambda>":  # two on one line: the body's column
        cols = [p[2] for p in code.co_positions() if p[2]]
        place += f":{min(cols)}" if cols else ""
    ident = f"{module}:{getattr(fn, '__qualname__', fn.__name__)}:{place}:{kfn.options.stable_hash()}"
    return f"{op_name_base(fn)}_{hashlib.sha256(ident.encode()).hexdigest()[:8]}"


#: op name -> the KfFunction its implementations run (the newest definition)
_OWNERS: dict[str, Any] = {}
#: op name -> (the op, its backward op, the op's implementation, the backward's)
_OPS: dict[str, tuple] = {}


# ----------------------------------------------------------------------------- structure


def parameters(fn: Callable) -> tuple:
    """(name, default, keyword_only) of each parameter, computed once so that binding a
    call needs no ``inspect`` (which Dynamo cannot trace); () for *args/**kwargs."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return ()  # *args / **kwargs: bound with inspect, outside Dynamo
        out.append((p.name, p.default, p.kind == p.KEYWORD_ONLY))
    return tuple(out)


def flatten_call(kfn, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], str]:
    """(flat tensors, structure) of a call; plain Python that Dynamo traces."""
    params = kfn._params
    if not params:
        bound = inspect.signature(kfn.fn).bind(*args, **kwargs)
        bound.apply_defaults()
        values = list(bound.arguments.values())
    else:
        positional = sum(1 for p in params if not p[2])
        if len(args) > positional:
            raise SignatureError(f"{kfn.fn.__name__}() takes {positional} positional arguments, got {len(args)}")
        values = list(args)
        for name, default, _ in params[len(args):]:
            if name in kwargs:
                values.append(kwargs[name])
            elif default is not inspect.Parameter.empty:
                # a constant default is written "D": under torch.compile(dynamic=True) Dynamo
                # may treat a float default as symbolic, and a symbolic float has no repr
                is_const = not isinstance(default, (torch.Tensor, list, tuple)) and default is not None
                values.append(_DEFAULT if is_const else default)
            else:
                raise SignatureError(f"{kfn.fn.__name__}() missing argument '{name}'")
        for name in kwargs:
            if not any(name == p[0] for p in params):
                raise SignatureError(f"{kfn.fn.__name__}() got an unexpected argument '{name}'")
        for name, _, _ in params[:len(args)]:
            if name in kwargs:
                raise SignatureError(f"{kfn.fn.__name__}() got multiple values for argument '{name}'")
    tensors, parts = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append("T")
            tensors.append(v)
        elif isinstance(v, (list, tuple)) and len(v) > 0 and isinstance(v[0], torch.Tensor):
            parts.append(("L" if isinstance(v, list) else "U") + str(len(v)))
            tensors.extend(v)
        elif v is None:
            parts.append("N")
        elif v is _DEFAULT:
            parts.append("D")
        else:
            if isinstance(v, torch.SymInt):  # a shape passed on: kf specializes on its value
                v = int(v)
            elif isinstance(v, torch.SymFloat):
                v = float(v)
            parts.append("=" + repr(v))
    return tensors, "|".join(parts)


_DEFAULT = object()  # "the parameter's default" in flatten_call


def _parse_const(text: str) -> Any:
    if text.startswith("torch."):
        value = getattr(torch, text[len("torch."):], None)
        if isinstance(value, torch.dtype):
            return value
    return ast.literal_eval(text)


@functools.lru_cache(maxsize=4096)
def _parse(structure: str) -> tuple[tuple[str, Any], ...]:
    """The structure's parts: ("T", None), ("L", n), ("U", n), ("N", None), ("D", None) for
    the parameter's default, ("=", value)."""
    out: list[tuple[str, Any]] = []
    pieces = structure.split("|") if structure else []
    i = 0
    while i < len(pieces):
        p = pieces[i]
        if p in ("T", "N", "D"):
            out.append((p, None))
        elif p[:1] in "LU" and p[1:].isdigit():
            out.append((p[0], int(p[1:])))
        elif p.startswith("="):
            # A constant's repr may itself hold "|" (a string): join pieces until it parses.
            text, j = p[1:], i
            while True:
                try:
                    out.append(("=", _parse_const(text)))
                    break
                except (ValueError, SyntaxError):
                    j += 1
                    if j >= len(pieces):
                        raise ValueError(f"kf: cannot read the call structure {structure!r}") from None
                    text += "|" + pieces[j]
            i = j
        else:
            raise ValueError(f"kf: cannot read the call structure {structure!r}")
        i += 1
    return tuple(out)


#: Written before a call's structure (before its precision) where autograd records the
#: call: the op then runs the forward that also returns what its backward needs.
TRAINING = "!"
#: after ``TRAINING``: which of the call's tensors want a gradient (``~0110;``, one digit a
#: tensor), so that the backward computes only those (a frozen weight, a float mask)
GRADS = "~"


def is_training(structure: str) -> bool:
    """Whether a call's structure asks for the forward that saves (``TRAINING``)."""
    return structure.startswith(TRAINING)


@functools.lru_cache(maxsize=4096)
def _strip_marks(structure: str) -> tuple[tuple[bool, ...] | None, str]:
    """(the gradients the ``GRADS`` mark asks for, or None; the structure without the
    ``TRAINING`` and ``GRADS`` marks)."""
    structure = structure.removeprefix(TRAINING)
    if structure.startswith(GRADS):
        bits, _, structure = structure[1:].partition(";")
        return tuple(b == "1" for b in bits), structure
    return None, structure


def wants_of(structure: str, tensors: Sequence[torch.Tensor]) -> tuple[bool, ...]:
    """Which of the call's tensors get a gradient: the floating-point ones, and of those
    only the ones the ``GRADS`` mark names where the structure has it."""
    asked, _ = _strip_marks(structure)
    floats = tuple(t.is_floating_point() for t in tensors)
    if asked is None or len(asked) != len(floats):
        return floats
    return tuple(f and a for f, a in zip(floats, asked))


@functools.lru_cache(maxsize=4096)
def split_precision(structure: str) -> tuple[str | None, str]:
    """(the precision a call's structure asks for, the structure without it and without
    the ``TRAINING`` and ``GRADS`` marks): a call under ``torch.autocast`` writes
    ``@bf16;`` (or ``@fp16;``) before its structure, which otherwise starts with a
    parameter's part (never ``@``, ``!`` or ``~``)."""
    _, structure = _strip_marks(structure)
    if structure.startswith("@"):
        precision, _, rest = structure[1:].partition(";")
        return precision, rest
    return None, structure


def implementation(kfn, structure: str) -> tuple[Any, str]:
    """(the KfFunction that runs a call of this structure, the structure without its
    precision): the function itself, or its variant for the autocast precision."""
    precision, rest = split_precision(structure)
    return (kfn if precision is None else kfn.variant(precision)), rest


def rebuild(kfn, structure: str, tensors: list) -> dict[str, Any]:
    """Keyword arguments of the function from a structure and its flat tensors."""
    structure = split_precision(structure)[1]
    if kfn._params:
        names = [p[0] for p in kfn._params]
        defaults = {p[0]: p[1] for p in kfn._params}
    else:
        names, defaults = list(inspect.signature(kfn.fn).parameters), {}
    out, it = {}, iter(tensors)
    for name, (kind, value) in zip(names, _parse(structure)):
        if kind == "T":
            out[name] = next(it)
        elif kind in "LU":
            seq = [next(it) for _ in range(value)]
            out[name] = seq if kind == "L" else tuple(seq)
        elif kind == "N":
            out[name] = None
        elif kind == "D":
            out[name] = defaults[name]
        else:
            out[name] = value
    return out


def flatten_results(result: Any) -> list[torch.Tensor]:
    """The tensors of a result (tensors, tuples and lists of them), depth first. A loop
    over a stack, not a recursive closure: a closure that calls itself is a reference
    cycle, which would hold the result's tensors until the garbage collector runs (a
    softmax's output, 512 MiB at 32768x8192 bf16, once a training step)."""
    flat: list[torch.Tensor] = []
    stack = [result]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            flat.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        elif x is None and result is None:  # the function only writes to its arguments
            continue
        else:
            raise TypeError(f"kf functions return tensors, got a {type(x).__name__}")
    return flat


def result_tree(result: Any, counter: list | None = None) -> Any:
    counter = counter if counter is not None else [0]
    if result is None:
        return ("none", [])
    if isinstance(result, torch.Tensor):
        counter[0] += 1
        return ("tensor", counter[0] - 1)
    kind = "tuple" if isinstance(result, tuple) else "list"
    if isinstance(result, tuple) and type(result) is not tuple:  # torch.max(x, 1), a namedtuple
        from .results import named_kind

        kind = named_kind(type(result)) or kind
    return (kind, [result_tree(r, counter) for r in result])


# ----------------------------------------------------------------------------- the op


def register(kfn) -> Any:
    """Register ``torch.ops.kf.<name>`` and ``torch.ops.kf.<name>_backward`` for a
    KfFunction; returns the forward op.

    Both are made here, before any tracing: Dynamo cannot trace a registration, and
    cached compiled code names the backward op without tracing the backward again."""
    name = op_name(kfn)
    kfn.op_name = f"kf::{name}"
    kfn._op_key = name
    with _LOCK:
        previous = _OWNERS.get(name)
        # f.with_options(...) made twice is one function: it shares what was learnt
        # (result structures, derived backwards); a redefinition starts afresh
        same = previous is not None and previous.fn is kfn.fn
        kfn._trees = previous._trees if same else {}
        kfn._backwards = previous._backwards if same else {}
        kfn._random = previous._random if same else {}  # structure -> whether it draws
        kfn._trainings = previous._trainings if same else {}  # forward and backward split for autograd
        # (structure, dtypes, ranks, sizes 0 and 1, wants) -> the sizes met, the training
        # traced on symbolic sizes (training_of)
        kfn._training_kinds = previous._training_kinds if same else {}
        kfn._writes = previous._writes if same else set()  # structures whose calls write to an argument
        kfn._eager_plans = {}  # (structure, tensors' shapes, dtypes, devices) -> _EagerPlan
        _OWNERS[name] = kfn
        if name not in _OPS:
            _OPS[name] = _define(name)
    return _OPS[name][0]


class _Opaque:
    """A context in which a kernel runs, or compiles, outside any tracing: opcheck's schema
    checker or a user's TorchDispatchMode must not see (or check) the ATen ops that kf's
    capture traces, and Inductor runs compiled code inside the compile's TracingContext,
    whose fake mode torch.export would otherwise pick up. The dispatcher's thread-local
    key sets are reset too: inside a mode's __torch_dispatch__ the Python key is excluded,
    and torch.export's fake tensors cannot work without it. Patched sites call torch's
    originals inside it (patching.originals).

    It is entered on every call through kf's op (forward and backward under autograd), so
    it leaves alone what is not there: the dispatch modes and the tracing context are
    set aside only where one is active (a few microseconds each, and most calls have
    none)."""

    __slots__ = ("_stack",)

    def __enter__(self):
        stack = []
        if _dispatch_modes():
            from torch.utils._python_dispatch import _disable_current_modes

            stack.append(_disable_current_modes())
        if _tracing_context() is not None:
            from torch._guards import tracing

            stack.append(tracing(None))
        stack.append(torch._C._ForceDispatchKeyGuard(*_TOP_LEVEL_KEYS))
        stack.append(originals())
        entered = []
        try:
            for c in stack:
                c.__enter__()
                entered.append(c)
        except BaseException:
            for c in reversed(entered):
                c.__exit__(None, None, None)
            raise
        self._stack = entered
        return self

    def __exit__(self, *exc):
        for c in reversed(self._stack):
            c.__exit__(*exc)
        return False


def _opaque() -> _Opaque:
    return _Opaque()


_dispatch_modes = torch._C._len_torch_dispatch_stack
_tracing_context = TracingContext.try_get


def _autocast_keys() -> torch._C.DispatchKeySet:
    keys = None
    for name in dir(torch._C.DispatchKey):
        if name.startswith("Autocast"):
            key = getattr(torch._C.DispatchKey, name)
            keys = torch._C.DispatchKeySet(key) if keys is None else keys.add(key)
    return keys


#: Every autocast dispatch key: excluding them is what leaving a torch.autocast region
#: does (``torch.is_autocast_enabled`` reads their exclusion).
AUTOCAST_KEYS = _autocast_keys()

#: the dispatcher's thread-local (included, excluded) key sets of a plain call, as they are
#: when this module is imported (autocast keys are excluded by default)
_TOP_LEVEL_KEYS = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


#: why a call through the op may not write to its arguments (mutation.py)
_REFUSED_WRITES = ("when it is called through its torch op (torch.compile, torch.export, or autograd because an "
                   "argument requires grad): the op promises to write to none of its inputs")


def _define(name: str) -> tuple:
    def real(tensors: list[torch.Tensor], structure: str) -> list[torch.Tensor]:
        from .random_state import STATE_SHAPE, device_for

        kfn = _OWNERS[name]
        impl, rest = implementation(kfn, structure)  # the autocast precision's variant, if any
        with _opaque(), mutation.refused(_REFUSED_WRITES):
            if structure not in kfn._random:
                kfn._trees[structure], kfn._random[structure], writes = _tree_of(kfn, structure, tensors)
                if writes:  # the function's own program refuses it, at the user's line
                    kfn._writes.add(structure)
            if _split(kfn, structure):
                # under autograd: the forward that also returns what its backward needs;
                # where that is nothing beyond the results, the function's own program
                training, _ = training_of(impl, rest, list(tensors), wants_of(structure, tensors))
                if training.extras:
                    return _fresh(training.run_forward(list(tensors)), tensors)
            drawn = [] if kfn._random[structure] else None  # receives the state the call draws
            call = rebuild(kfn, structure, list(tensors))
            if kfn._params and not any(p[2] for p in kfn._params):
                # every parameter positionally, in order: KfFunction's fast path, no binding
                result = impl._kernel_call(tuple(call.values()), {}, drawn)
            else:
                result = impl._kernel_call(*split_call(impl.fn, call), drawn)
        outs = _fresh(flatten_results(result), tensors)
        if drawn is not None:  # a program that drew nothing (dropout(p=0)) replays nothing
            outs.append(drawn[0] if drawn else torch.zeros(STATE_SHAPE, dtype=torch.int64,
                                                            device=device_for(tensors, impl.options.target)))
        return outs

    def fake(tensors, structure):
        from .random_state import STATE_SHAPE, device_for

        kfn = _OWNERS[name]
        # the function's own body, with torch's functions unpatched, and outside any
        # autocast region: kf's programs return the function's own dtypes under autocast
        with originals(), torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS), _RandomOps() as seen:
            result = invoke(kfn.fn, rebuild(kfn, structure, list(tensors)))
        kfn._trees[structure] = result_tree(result)
        kfn._random[structure] = seen.draws
        # kf's programs return new row-major tensors
        outs = [o.new_empty(o.shape) for o in flatten_results(result)]
        if is_training(structure) and not seen.draws:
            impl, rest = implementation(kfn, structure)
            with _opaque():
                training, _ = training_of(impl, rest, list(tensors), wants_of(structure, tensors))
            outs += [tensors[0].new_empty(shape, dtype=dtype) for shape, dtype, _ in training.extras]
        if seen.draws:
            outs.append(torch.empty(STATE_SHAPE, dtype=torch.int64, device=device_for(tensors, kfn.options.target)))
        return outs

    def backward_real(tensors: list[torch.Tensor], grads: list[torch.Tensor], structure: str) -> list[torch.Tensor]:
        owner = _OWNERS[name]
        impl, rest = implementation(owner, structure)
        inputs, state = split_state(owner, list(tensors), structure)
        wants = wants_of(structure, inputs)
        with _opaque():
            if _split(owner, structure):
                bwd = training_of(impl, rest, inputs, wants)[0].backward
                grad_in = bwd(list(tensors), list(grads))
            else:
                grad_in = _backward_of(impl, rest, inputs, list(grads), wants)(inputs, list(grads), state)
            return _fresh([g for g in grad_in if g is not None], list(tensors) + list(grads))

    def backward_fake(tensors, grads, structure):
        inputs = tensors[:_tensor_count(structure)]
        return [t.new_empty(t.shape) for t, w in zip(inputs, wants_of(structure, inputs)) if w]

    schema = "(Tensor[] tensors, str structure) -> Tensor[]"
    op = torch.library.custom_op(f"kf::{name}", real, mutates_args=(), schema=schema)
    op.register_fake(fake)
    bop = torch.library.custom_op(f"kf::{name}_backward", backward_real, mutates_args=(),
                                  schema="(Tensor[] tensors, Tensor[] grads, str structure) -> Tensor[]")
    bop.register_fake(backward_fake)
    op.register_autograd(_backward_formula(name), setup_context=_setup_context(name))
    bop.register_autograd(_double_backward_formula(name), setup_context=_setup_double)
    return op, bop, real, backward_real


def _tree_of(kfn, structure: str, tensors: list) -> tuple[Any, bool, bool]:
    """(how the function's results nest, whether it draws random numbers, whether it
    writes to an argument), from a run of the function on fake tensors (the compiled
    program returns its results flat)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t).detach() for t in tensors]
        versions = [f._version for f in fakes]
        with _RandomOps() as seen:
            result = invoke(kfn.fn, rebuild(kfn, structure, fakes))
        writes = any(f._version != v for f, v in zip(fakes, versions))
        return result_tree(result), seen.draws, writes


class _RandomOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes whether any op of a run draws from torch's generator (torch tags those ops
    ``nondeterministic_seeded``: dropout, rand, bernoulli, ...)."""

    def __init__(self):
        super().__init__()
        self.draws = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.draws = True
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=4096)
def _tensor_count(structure: str) -> int:
    """How many tensors a call of this structure passes."""
    return sum(1 if kind == "T" else value for kind, value in _parse(split_precision(structure)[1])
               if kind in ("T", "L", "U"))


def split_state(owner, tensors: list, structure: str) -> tuple[list, torch.Tensor | None]:
    """(the call's tensors, the random state the forward drew, or None): the forward's
    saved tensors hold the state after the call's own when its function draws (and the
    saved results and extras after them, where the forward was split: ``_split``)."""
    n = _tensor_count(structure)
    if _split(owner, structure):
        return tensors[:n], None
    return (tensors[:n], tensors[n]) if len(tensors) > n else (tensors, None)


def _split(owner, structure: str) -> bool:
    """Whether a call of this structure ran the split forward (``training_of``): under
    autograd, for a function that draws no random numbers and writes to none of its
    arguments (its own program refuses that at the user's line; ``owner``: the function
    whose op was called, which records both per structure)."""
    return is_training(structure) and not owner._random.get(structure, False) and structure not in owner._writes


def training_of(kfn, structure: str, tensors: list, wants: tuple[bool, ...] | None = None
                ) -> tuple[Any, list[tuple[tuple[int, ...], torch.dtype]]]:
    """(the split forward and backward of kfn for this structure -- without its marks --
    and these tensors, derived once: autograd.Training; (shape, dtype) of each of the
    function's flat results). ``wants``: which tensors get a gradient (every
    floating-point one where None)."""
    from . import autograd

    wants = tuple(t.is_floating_point() for t in tensors) if wants is None else tuple(wants)
    shapes = tuple(autograd.concrete_shape(t) for t in tensors)
    key = (structure, tuple((shape, t.dtype, t.device.type) for shape, t in zip(shapes, tensors)), wants)
    hit = kfn._trainings.get(key)
    if hit is not None:
        return hit
    metas = _result_metas(kfn, structure, tensors)
    grads = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in metas if dtype.is_floating_point]
    # Sizes that change: from the second set of sizes of one kind of call (its dtypes,
    # ranks, and sizes 0 and 1 where they are) on, a training traced on symbolic sizes
    # serves every call its guards admit: one forward and one backward function, which
    # compile with run-time sizes as a kf function does when its sizes change
    # (compiler/dynamic.py), instead of a trace and two compiles for each size.
    kind = (structure, tuple((tuple(min(n, 2) for n in shape), t.dtype, t.device.type)
                             for shape, t in zip(shapes, tensors)), wants)
    state = kfn._training_kinds.setdefault(kind, {"sizes": 0, "symbolic": None, "failed": False})
    state["sizes"] += 1
    if state["sizes"] > 1 and state["symbolic"] is None and not state["failed"]:
        try:
            state["symbolic"] = autograd.derive_training(kfn, structure, list(tensors), grads, wants, symbolic=True)
        except Exception as e:  # each set of sizes traces its own, as the first did
            state["failed"] = True
            recompile_log.info("%s: its forward and backward for changing sizes could not be traced "
                               "(%s: %s); each set of sizes traces its own", kfn.fn.__name__, type(e).__name__, e)
    training = state["symbolic"]
    if training is not None and training.guards.admit([*tensors, *grads]):
        hit = kfn._trainings[key] = (training.for_sizes(list(tensors), grads), metas)
        return hit
    hit = kfn._trainings[key] = (autograd.derive_training(kfn, structure, list(tensors), grads, wants), metas)
    return hit


def _result_metas(kfn, structure: str, tensors: list) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each flat result of the function, from a run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _disable_current_modes

    from . import autograd

    with _disable_current_modes(), FakeTensorMode():
        fakes = [torch.empty(autograd.concrete_shape(t), dtype=t.dtype, device=t.device) for t in tensors]
        with originals(), torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS):
            outs = flatten_results(invoke(kfn.fn, rebuild(kfn, structure, fakes)))
        return [(tuple(int(d) for d in o.shape), o.dtype) for o in outs]


def _backward_of(kfn, structure: str, tensors: list, grads: list, wants: tuple[bool, ...] | None = None):
    from . import autograd

    wants = tuple(t.is_floating_point() for t in tensors) if wants is None else tuple(wants)
    key = (structure, tuple((tuple(t.shape), t.dtype, t.device.type) for t in tensors),
           tuple((tuple(g.shape), g.dtype) for g in grads), wants)
    bwd = kfn._backwards.get(key)
    if bwd is None:
        bwd = kfn._backwards[key] = autograd.derive(kfn, structure, tensors, grads, wants)
    return bwd


def _fresh(outs: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs that alias an input or an earlier output, copied (a custom op's outputs
    are new tensors; a kf program may return an input reshaped, or one result twice)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    out = []
    for o in outs:
        ptr = o.untyped_storage().data_ptr() if o.numel() else None
        if ptr is not None and ptr in seen:
            o = o.clone()
            ptr = o.untyped_storage().data_ptr()
        if ptr is not None:
            seen.add(ptr)
        out.append(o)
    return out


def _setup_context(name: str):
    def setup(ctx, inputs, output):
        tensors, structure = inputs
        owner = _OWNERS[name]
        ctx.structure = structure
        # the inputs that get a gradient (the backward op returns one for each)
        ctx.float_inputs = list(wants_of(structure, tensors[:_tensor_count(structure)]))
        ctx.float_inputs += [False] * (len(tensors) - len(ctx.float_inputs))
        if _split(owner, structure):
            # the results, then the extras the split forward returned (training_of)
            impl, rest = implementation(owner, structure)
            training, _ = training_of(impl, rest, list(tensors), wants_of(structure, tensors))
            n = training.n_outputs
            ctx.outputs_meta = [(o.shape, o.dtype, o.device) for o in output[:n]]
            if len(output) > n:
                ctx.mark_non_differentiable(*output[n:])
            ctx.save_for_backward(*training.saved(list(tensors), list(output)))
            return
        ctx.outputs_meta = [(o.shape, o.dtype, o.device) for o in output]  # the state: int64, no gradient
        draws = owner._random.get(structure, False)
        ctx.save_for_backward(*tensors, *output[-1:] if draws else ())

    return setup


def _tangents(grads, outputs_meta: list) -> list:
    """The gradients of the floating-point outputs (zeros for unused ones); integer
    outputs such as topk's indices have none."""
    return [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
            for g, (shape, dtype, device) in zip(grads, outputs_meta) if dtype.is_floating_point]


def _backward_formula(name: str):
    def backward(ctx, grads):
        tangents = _tangents(grads, ctx.outputs_meta)
        # a first-order backward of an eager call runs the implementation itself; one that
        # builds a graph (create_graph) or is traced goes through the op, whose own
        # autograd gives the double backward
        plain = not torch.is_grad_enabled() and not (_is_compiling() or _dispatch_modes())
        flat = _OPS[name][3 if plain else 1](list(ctx.saved_tensors), tangents, ctx.structure)
        it = iter(flat)
        return [next(it) if f else None for f in ctx.float_inputs], None

    return backward


def _setup_double(ctx, inputs, output):
    tensors, grads, structure = inputs
    ctx.structure = structure
    ctx.n = len(tensors)
    ctx.save_for_backward(*tensors, *grads)


def _double_backward_formula(name: str):
    """The backward of the backward op: the generated backward function is a kf function
    with an op of its own, so differentiating a call of it derives (and compiles) its
    backward the same way as the forward's."""
    def backward(ctx, ggs):
        saved = list(ctx.saved_tensors)
        tensors, grads = saved[:ctx.n], saved[ctx.n:]
        owner = _OWNERS[name]
        impl, rest = implementation(owner, ctx.structure)
        inputs, state = split_state(owner, tensors, ctx.structure)
        n = len(inputs)
        # the derivative of the backward that recomputes the forward from the inputs: the
        # same function of (inputs, gradients) as a split backward, whose saved results
        # and extras are functions of the inputs too (they get no gradient of their own)
        bwd = _backward_of(impl, rest, [t.detach() for t in inputs], [g.detach() for g in grads],
                           wants_of(ctx.structure, inputs))
        with torch.enable_grad():
            ins = [t.detach().requires_grad_(t.is_floating_point() and (i < n or i >= ctx.n))
                   for i, t in enumerate(saved)]
            # that backward takes the forward's tensors, the gradients, then the state
            args = ins[:n] + ins[ctx.n:] + ([ins[n]] if bwd.random else [])
            outs = bwd.fn(*args)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            pairs = [(o, gg) for o, gg in zip(outs, ggs) if gg is not None]
            wrt = [i for i in ins if i.requires_grad]
            got = torch.autograd.grad([o for o, _ in pairs], wrt, [gg for _, gg in pairs], allow_unused=True,
                                      create_graph=torch.is_grad_enabled()) if pairs else [None] * len(wrt)
        it = iter(got)
        per_input = [next(it) if i.requires_grad else None for i in ins]
        return per_input[:ctx.n], per_input[ctx.n:], None

    return backward


def call(kfn, args: tuple, kwargs: dict) -> Any:
    """Call a KfFunction through its op: what __call__ does under tracing or autograd."""
    tensors, structure = flatten_call(kfn, args, kwargs)
    # The autocast state travels in the structure: the op's implementation runs with the
    # autocast dispatch keys excluded (and a compiled graph runs it outside the region
    # it was traced in), so it cannot read the state itself.
    precision = kfn.autocast_precision(tensors[0].device.type if tensors else "cpu")
    if precision is not None:
        structure = f"@{precision};{structure}"
    if _grad_enabled() and _any_requires_grad(tensors) and not (_is_compiling() or _dispatch_modes()):
        # autograd records an eager call: the forward also returns what its backward
        # needs. Not under torch.compile, torch.export or tracing: their graphs keep the
        # structure, and the split is made at one shape (a symbolic shape has none) --
        # there the backward recomputes the forward from the inputs (``derive``)
        wants = "".join("1" if t.requires_grad else "0" for t in tensors)
        structure = f"{TRAINING}{GRADS}{wants};{structure}"
    if structure.startswith(TRAINING):
        # an eager call that autograd records: the op's forward and backward as a plain
        # autograd.Function, without torch.library's layers around a custom op's autograd
        # (a few hundred microseconds a forward and backward, more than the programs' own
        # host time); torch.compile and tracing see the op
        owner = _OWNERS[kfn._op_key]
        key = (structure, tuple((t.shape, t.dtype, t.device) for t in tensors))
        plan = owner._eager_plans.get(key)
        if plan is None:
            plan = _eager_plan(owner, key, tensors)
        if plan is not None:
            return unflatten(plan.tree, list(_PlannedEagerCall.apply(plan, *tensors))[:plan.tree_size])
        flat = _EagerCall.apply(kfn._op_key, structure, *tensors)
    else:
        flat = kfn._torch_op(tensors, structure)
    # the implementations record the structure on the op's current owner (and whether a
    # random state follows the results); the results come first, then what is saved
    owner = _OWNERS[kfn._op_key]
    tree = owner._trees[structure]
    return unflatten(tree, list(flat)[:tree_size(tree)])


#: eager-call plans a function keeps (_eager_plan)
EAGER_PLANS = 256


class _EagerPlan:
    """What an eager call that autograd records needs, worked out once for its structure
    and its tensors' shapes, dtypes and devices: the split forward and backward
    (``training_of``), which tensors get a gradient, how the results nest. Its calls
    skip the op's per-call derivations (``_PlannedEagerCall``)."""

    __slots__ = ("name", "structure", "training", "float_inputs", "tree", "tree_size")

    def __init__(self, name: str, structure: str, training, float_inputs: list, tree):
        self.name, self.structure, self.training = name, structure, training
        self.float_inputs, self.tree, self.tree_size = float_inputs, tree, tree_size(tree)


def _eager_plan(owner, key: tuple, tensors: list) -> _EagerPlan | None:
    """The plan of an eager training call (kept on ``owner``, the op's function, under
    ``key``: the structure, then the tensors' shapes, dtypes and devices), or None
    where the call takes the op's general path: its first call (which learns how the
    results nest and whether it draws random numbers), a function that draws or writes
    to an argument, a forward that saves nothing beyond its results."""
    structure = key[0]
    if structure not in owner._random or structure not in owner._trees or not _split(owner, structure):
        return None
    impl, rest = implementation(owner, structure)
    with _opaque():
        training, _ = training_of(impl, rest, list(tensors), wants_of(structure, tensors))
    if training.forward is None or not training.extras:
        return None
    n = _tensor_count(structure)
    float_inputs = list(wants_of(structure, tensors[:n])) + [False] * (len(tensors) - n)
    plan = _EagerPlan(owner._op_key, structure, training, float_inputs, owner._trees[structure])
    plans = owner._eager_plans
    if len(plans) >= EAGER_PLANS:
        plans.pop(next(iter(plans)))
    plans[key] = plan
    return plan


class _PlannedEagerCall(torch.autograd.Function):
    """``_EagerCall`` for a call whose plan is known (``_EagerPlan``): the split forward's
    program, its results and extras saved for the backward, and the split backward's
    program, with nothing derived again."""

    @staticmethod
    def forward(ctx, plan: _EagerPlan, *tensors: torch.Tensor):
        training = plan.training
        with _opaque(), mutation.refused(_REFUSED_WRITES):
            outs = _fresh(training.run_forward(list(tensors)), tensors)
        ctx.plan, ctx.name, ctx.structure, ctx.float_inputs = plan, plan.name, plan.structure, plan.float_inputs
        ctx.set_materialize_grads(False)  # the backward makes the zeros it needs
        n = training.n_outputs
        ctx.outputs_meta = [(o.shape, o.dtype, o.device) for o in outs[:n]]
        if len(outs) > n:
            ctx.mark_non_differentiable(*outs[n:])
        ctx.save_for_backward(*training.saved(list(tensors), outs))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled() or _is_compiling() or _dispatch_modes():
            # a backward that builds a graph (create_graph) or is traced: through the op
            per_tensor, _ = _backward_formula(ctx.name)(ctx, grads)
            return (None, *per_tensor)
        tangents = _tangents(grads, ctx.outputs_meta)
        saved = list(ctx.saved_tensors)
        with _opaque():
            grad_in = ctx.plan.training.backward(saved, tangents)
            flat = _fresh([g for g in grad_in if g is not None], saved + tangents)
        it = iter(flat)
        return (None, *[next(it) if f else None for f in ctx.float_inputs])


class _EagerCall(torch.autograd.Function):
    """A kf function's op in an eager call that autograd records: the op's implementation
    forward, its setup_context and its backward formula (``_define``), as one
    autograd.Function."""

    @staticmethod
    def forward(ctx, name: str, structure: str, *tensors: torch.Tensor):
        outs = _OPS[name][2](list(tensors), structure)
        ctx.name = name
        ctx.set_materialize_grads(False)  # the backward formula makes the zeros it needs
        _setup_context(name)(ctx, (list(tensors), structure), outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        per_tensor, _ = _backward_formula(ctx.name)(ctx, grads)
        return (None, None, *per_tensor)


def _any_requires_grad(tensors: list) -> bool:
    for t in tensors:
        if t.requires_grad:
            return True
    return False


def tree_size(tree: Any) -> int:
    """How many tensors a result tree (``result_tree``) holds."""
    if tree[0] == "tensor":
        return 1
    return sum(tree_size(t) for t in tree[1])


_is_compiling = torch.compiler.is_compiling  # the function itself: dynamo folds it under torch.compile
_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch._C.is_grad_enabled


def needs_op(args: tuple, kwargs: dict) -> bool:
    """Whether a call must go through the op: under torch.compile, torch.export or any
    tracing mode, or when autograd records it. Otherwise the plain fast path runs.
    (Module-level names for the three checks: this runs on every call.)"""
    if _is_compiling() or _dispatch_modes():
        return True
    if not _grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
                return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
            return True
    return False
