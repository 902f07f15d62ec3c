"""Backward functions for kf functions, derived from the captured forward and compiled by kf.

For one specialization of a forward function ``f`` (its argument structure and tensor
shapes), kf traces the *joint* function

    joint(*inputs, *grad_outputs) = (*f(*inputs), *torch.autograd.grad(f(*inputs), float inputs, grad_outputs))

with ``make_fx`` on fake tensors, decomposing ATen's backward ops (``_softmax_backward_data``,
``native_layer_norm_backward``, ``gelu_backward``, ...) into the primitive ops kf
compiles. compiler/partition.py splits that graph in two (``derive_training``): a
*forward* that returns the user's outputs and then what the backward needs, and a
*backward* that takes it. What crosses is kf's rule, not a min-cut: the inputs, the
outputs, per-row statistics (reduction results: a norm's mean and variance; a softmax's
row logsumexp), and matmul products outside attention's scores; everything else the
backward reads (elementwise chains, views, masks, the scores and probabilities of an
attention) is recomputed inside the backward's kernels. A second set of sizes of the same
kind of call (dtypes, ranks, sizes 0 and 1) traces the joint once more on symbolic sizes
(``SizeGuards``): that forward and backward compute their views' sizes from their inputs
and serve every later call whose sizes their guards admit, compiling with run-time sizes
as any kf function does when its sizes change. Each graph is written out as a
small Python module (under the cache folder, so the cache key, the error locations and
``kf.inspect`` work on it as on any user function) and compiled with ``kf.jit`` for the
forward's own target. Under autograd the op runs that forward (torch_ops.py: a call
whose structure starts with ``!``, an eager call; under torch.compile or export
the backward recomputes the forward, ``derive``): the same fused kernels as without autograd, which
also write the statistics; without autograd nothing of this runs and nothing is saved.

Attention, the interface its backward kernels build on. For a forward that kf-fuse
recognizes as attention (``matmul(q, k^T)`` -> scale -> optional mask -> ``softmax(-1)``
-> ``matmul(., v)``), the forward saves q, k, v, the mask (inputs), O (the output) and

    lse = kf.logsumexp(scores) {dims = [-1], keepdim}     f32 (f64 for f64), shape [..., Sq, 1]

the natural-log logsumexp of the scaled and masked scores of each query row. In the
forward's kf IR it reads the same scores value as the ``kf.softmax``; kf-fuse gives it
to the attention kernel, which writes it as a second output from the running max and
sum it keeps (passes/fuse.py, ``attention_lse``; passes/strategies/attention/chain.py),
so the forward under autograd is the same kernels as without. The backward's kf IR recomputes the scores
from q and k with the forward's own ops (scale, mask), then

    P = cast(exp(scores - lse), the softmax's type)
    D = sum(dO * O, -1, keepdim)                 (FlashAttention's rowsum, from the saved O)
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = dS K * scale,  dK = dS^T Q * scale

(the last line as autograd's decompositions write it: casts, the mask's ``select`` of
dS, the scale as a division). Matmuls over batch dims reach kf-fuse as 4-D ``kf.matmul``
(kf-canonicalize lifts the bmm of merged batch dims that tracing leaves).

A function that draws random numbers (dropout) keeps recomputing its forward in the
backward (``derive``): its random state is an input of the program the forward runs, and
the backward recomputes the same numbers from the state the forward drew (the forward's
op returns it: torch_ops.py), which the joint takes as one more input after the
gradients: the joint's random ops (dropout as ``native_dropout``, ``rand_like``, ...)
become ``kf::philox_rand`` calls on that state (``_replay_table``), on the same counters
and with the same arithmetic as the forward's conversion (aten_to_kf.py), so the
backward keeps the elements the forward kept. Autograd's composite ``dropout`` is traced
through its Python decomposition (the Python dispatcher, as AOTAutograd traces), which
calls ``native_dropout`` on every device. A random op that neither converts is an error
at the user's line, never a fresh mask. Double backward differentiates that recomputing
backward too: the same function of the inputs and gradients as the split one.

Each ATen op of the joint graph remembers the user's line it comes from (forward ops by
the Python stack of the torch call that makes them; backward ops by the creation
traceback, in anomaly mode, of the autograd node that runs them, which is that forward
call's stack: ``_Locate``), so when kf cannot compile the backward the error names the
op and the line of the forward that needs it.

This module and torch_ops.py import each other (each where it calls the other): a kf
function's torch op derives its backward here (``torch_ops._backward_of``), and the
derivation reads the call's flattened arguments with torch_ops' encoding of a call's
structure (``flatten_call``, ``rebuild``), which stays in one place. A third module for
either half would be imported by both and own neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .errors import CompileError, SourceLoc
from .signature import invoke

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _decompositions() -> dict:
    """Core ATen decompositions: every backward op becomes mul/sum/where/... that kf has."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # kf compiles these forward ops as they are (one fused kernel each); decomposing them
    # would only hide the pattern from kf's recognizers.
    for op in (torch.ops.aten.gelu.default, torch.ops.aten._softmax.default,
               torch.ops.aten._log_softmax.default, torch.ops.aten.var.correction):
        table.pop(op, None)
    # slicing's backward (a slice_scatter) as a concatenation; the scatter of topk's and
    # sort's backward stays a scatter (kf.scatter_reduce: each position finds its value
    # among the indices, nothing of k x n in memory)
    table[torch.ops.aten.slice_scatter.default] = _slice_scatter
    return table


def _norm_statistics_decompositions() -> dict:
    """The norms' forwards (layer, group and batch norm) as the ops they are made of.
    Their statistics outputs (mean, rstd) are non-differentiable in torch, whose double
    backward of the norms accounts for them in one formula; a backward traced with the
    norm kept whole and its backward decomposed reads them as constants, and the
    derivative of that backward (a double backward) loses their terms (layer norm's
    gradient of the input's gradient was 95 off for values of order 1)."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
                               aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
                               aten._native_batch_norm_legit_functional])


def _slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    """input with input[start:end] along dim replaced by src (step 1)."""
    if step != 1:
        return NotImplemented
    n = input.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else min(end + n if end < 0 else end, n)
    pieces = [input.narrow(dim, 0, start)] if start > 0 else []
    pieces.append(src)
    if end < n:
        pieces.append(input.narrow(dim, end, n - end))
    return torch.cat(pieces, dim) if len(pieces) > 1 else src.clone()


def _replay_table(box: dict) -> dict:
    """Decompositions of the random ATen ops that recompute their numbers from the
    forward's state ``box["state"]``, taking counters in order from ``box["offset"]``:
    op for op what kf's conversion of the forward computes (aten_to_kf.py, "random
    numbers"), and drawing exactly where it draws."""
    from kf.dialects.philox import blocks

    aten = torch.ops.aten

    def draw(shape, distribution="uniform"):
        offset = box["offset"]
        box["offset"] += blocks(math.prod(shape), distribution)
        return torch.ops.kf.philox_rand(box["state"], offset, [int(s) for s in shape], distribution)

    def native_dropout(x, p, train=None):
        if train is False or p == 0 or x.numel() == 0:
            return x, torch.ones_like(x, dtype=torch.bool)
        if p == 1:
            return x * 0, torch.zeros_like(x, dtype=torch.bool)
        keep = draw(x.shape) > p
        ce = torch.float64 if x.dtype == torch.float64 else torch.float32
        scale = torch.where(keep, x.new_full((), 1.0 / (1.0 - p), dtype=ce), x.new_zeros((), dtype=ce))
        return (x.to(ce) * scale).to(x.dtype), keep

    def uniform(shape, dtype):
        if math.prod(shape) == 0:
            return torch.zeros(shape, dtype=dtype, device=box["state"].device)
        u = draw(shape).to(dtype)
        return u if dtype in (torch.float32, torch.float64) else torch.where(u == 1, 0.0, u)

    def normal(shape, dtype):
        if math.prod(shape) == 0:
            return torch.zeros(shape, dtype=dtype, device=box["state"].device)
        return draw(shape, "normal").to(dtype)

    def like(sample):
        return lambda x, dtype=None, **kw: sample(tuple(x.shape), dtype or x.dtype)

    def new(sample):
        return lambda size, dtype=None, **kw: sample(tuple(size), dtype or torch.get_default_dtype())

    def bernoulli(x, p=None, generator=None):
        if generator is not None:
            return NotImplemented  # left in the graph: derive reports it
        if x.numel() == 0:
            return torch.zeros_like(x)
        return (draw(x.shape) < (x if p is None else p)).to(x.dtype)

    return {
        aten.native_dropout.default: native_dropout,
        aten.rand_like.default: like(uniform), aten.rand.default: new(uniform),
        aten.randn_like.default: like(normal), aten.randn.default: new(normal),
        aten.bernoulli.default: lambda x, generator=None: bernoulli(x, None, generator),
        aten.bernoulli.p: lambda x, p=0.5, generator=None: bernoulli(x, p, generator),
    }


def _check_replayed(gm: torch.fx.GraphModule, user) -> None:
    """No op of the joint draws from torch's generator: the backward would draw numbers
    of its own instead of the forward's."""
    from .errors import UnsupportedOpError

    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
                torch.Tag.nondeterministic_seeded in target.tags:
            raise UnsupportedOpError(
                f"the backward of {user.__name__}: {target} draws random numbers that kf cannot recompute",
                _user_loc(node.meta.get("stack_trace", ""), user.__code__.co_filename),
                cause="kf differentiates dropout, rand, rand_like, randn, randn_like and bernoulli")


@dataclass
class Backward:
    """The compiled backward of one forward specialization.

    ``fn`` takes the tensors the forward saved -- the forward's flat tensor inputs, then,
    where the forward was split (``Training``), the results and extras it saved --, then
    one gradient per floating-point output, then (``random``: the forward draws random
    numbers) the random state the forward drew, and returns one gradient per
    floating-point input (``diff`` says which). Calling it runs the compiled kernel
    directly (it is called from the op ``kf::<name>_backward``, which is what traces and
    compiled graphs see); called as a function, ``fn`` goes through its own op, whose
    backward is derived in turn (double backward). ``example_args``: tensors shaped like
    its arguments, where ``backward_of`` made it (``inspect`` reads its IR with them).
    """

    fn: Any  # a KfFunction
    diff: tuple[bool, ...]
    source: str
    line_locs: dict[int, SourceLoc]
    random: bool = False
    example_args: list | None = None

    def __call__(self, tensors: list[torch.Tensor], grads: list, state: torch.Tensor | None = None) -> list:
        if self.random and state is None:
            raise CompileError(f"the backward of {self.fn.fn.__name__.removesuffix('_backward')} recomputes "
                               f"random numbers, but the forward's random state was not saved",
                               stage="autograd", cause="an internal error in kf's autograd")
        extra = (state,) if self.random else ()
        try:
            # the backward was traced on row-major examples: its views assume that layout
            flat = self.fn._kernel_call(tuple(t.contiguous() for t in (*tensors, *grads, *extra)), {})
        except CompileError as e:
            raise _at_user_line(e, self.fn, self.source, self.line_locs, "backward") from None
        flat = list(flat) if isinstance(flat, (tuple, list)) else [flat]
        out, it = [], iter(flat)
        for d in self.diff:
            out.append(next(it) if d else None)
        return out

    def inspect(self, **options):
        """``kf.inspect`` of ``fn`` on ``example_args`` (``options``: e.g. target="cuda")."""
        if self.example_args is None:
            raise ValueError("this Backward has no example arguments: make it with kf.autograd.backward_of")
        fn = self.fn.with_options(**options) if options else self.fn
        return fn.inspect(*self.example_args)


def _at_user_line(e: CompileError, fn, source: str, line_locs: dict, role: str) -> CompileError:
    """The same error, pointing at the forward line whose backward (or saving forward)
    needs the failing op."""
    loc = line_locs.get(e.loc.line) if e.loc is not None and e.loc.file == source else None
    where = f"generated {role} {source}:{e.loc.line}" if e.loc is not None else f"generated {role} {source}"
    cause = f"{e.cause}; {where}" if e.cause else where
    new = type(e).__new__(type(e))
    name = fn.fn.__name__.removesuffix(f"_{role}")
    CompileError.__init__(new, f"the {role} of {name}: {e.message}",
                          loc or e.loc, stage=e.stage, cause=cause, reproducer=e.reproducer, command=e.command)
    return new


class _Locate(torch.overrides.TorchFunctionMode):
    """Gives each torch call of the forward the Python stack that makes it.

    Under ``fx_traceback.preserve_node_meta`` one stack, ``current_meta["stack_trace"]``,
    names the line of every record made: make_fx copies it into each node it records,
    and anomaly mode into the creation traceback of each autograd node
    (``fx_traceback.format_stack``), which the backward's ops are later given
    (``_backward_at_forward_lines``). Autograd creates its node before the op reaches
    any dispatch mode, so the stack is set here, where the torch call starts (a call's
    inner ops share its line), and cleared when it returns: an op no call covers gets
    no line rather than the previous op's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch.fx.traceback as fx_traceback

        before = fx_traceback.current_meta.get("stack_trace")
        fx_traceback.set_stack_trace([_python_stack()])
        try:
            return func(*args, **(kwargs or {}))
        finally:
            fx_traceback.set_stack_trace([before] if before else [])


def _python_stack() -> str:
    """The calling Python stack, outermost frame first, in traceback's format (file, line
    and function only: reading source lines for every op would be slow)."""
    lines = []
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n')
        frame = frame.f_back
    return "".join(reversed(lines))


def _backward_at_forward_lines(outs: list[torch.Tensor]) -> None:
    """While autograd runs the backward of ``outs``, each autograd node's ops carry the
    stack its forward op was created at: AOTAutograd's hooks (a pre-hook sets the
    node's creation traceback as fx's current stack), as its joint graph does."""
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks

    setup_stacktrace_preservation_hooks([o.grad_fn for o in outs if o.grad_fn is not None])


def _user_loc(stack: str, user_file: str) -> SourceLoc | None:
    found = None
    for file, line, name in _FRAME.findall(stack or ""):
        if file == user_file:
            found = SourceLoc(file, int(line), 1, name)
    return found


def concrete_shape(t) -> tuple[int, ...]:
    """t's shape in ints (t may be fake, functional or symbolic: a symbol's hint)."""
    return tuple(int(s) if isinstance(s, int) else int(s.node.hint) for s in t.shape)


def _trace_joint(kfn, structure: str, tensors: list[torch.Tensor], grads: list[torch.Tensor],
                 with_outputs: bool = False, wants: tuple[bool, ...] | None = None,
                 differentiable: bool = False, symbolic: bool = False
                 ) -> tuple[torch.fx.GraphModule, tuple[bool, ...], int, "SizeGuards | None"]:
    """(the joint graph, which inputs are differentiable, how many outputs it returns
    before the gradients): placeholders are the inputs, the gradients of the floating-point
    outputs and the random state (removed where nothing reads it); it returns the input
    gradients, after every output of the forward (``with_outputs``). ``wants``: the inputs
    that get a gradient (every floating-point one where None): no kernel computes the
    gradient of a frozen weight or a float mask. ``differentiable``: the graph is one that
    is differentiated again (a double backward), with the norms' statistics computed by
    differentiable ops (_norm_statistics_decompositions). ``symbolic``: every size of the
    inputs and gradients is a symbol (sizes 0 and 1 excepted, equal sizes one symbol), so
    the graph computes its views' sizes from its inputs and serves every size its guards
    admit (the fourth result, SizeGuards; None for a graph of these sizes alone)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    import torch.fx.traceback as fx_traceback
    from torch.utils._python_dispatch import _disable_current_modes

    from . import torch_ops
    from .patching import originals

    from torch._dispatch.python import enable_python_dispatcher

    from .aten.attention import SdpaAsTorchOps
    from .random_state import STATE_SHAPE

    user = kfn.fn
    diff = tuple(t.is_floating_point() and (wants is None or bool(w))
                 for t, w in zip(tensors, wants if wants is not None else [True] * len(tensors)))
    box: dict = {}
    table = {**_decompositions(), **(_norm_statistics_decompositions() if differentiable else {}),
             **_replay_table(box)}
    n_outputs = [0]

    def joint(*flat):
        ins = list(flat[:len(tensors)])
        tangents = list(flat[len(tensors):-1])
        box["state"], box["offset"] = flat[-1], 0
        prim = [x.detach().requires_grad_() if d else x for x, d in zip(ins, diff)]
        with torch.enable_grad(), originals(), SdpaAsTorchOps():
            with _Locate():
                every = torch_ops.flatten_results(invoke(user, torch_ops.rebuild(kfn, structure, prim)))
            outs = [o for o in every if o.is_floating_point()]
            wrt = [p for p, d in zip(prim, diff) if d]
            pairs = [(o, g) for o, g in zip(outs, tangents) if o.requires_grad]
            _backward_at_forward_lines([o for o, _ in pairs])
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True) \
                if pairs else [None] * len(wrt)
        grads = tuple(torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt))
        if not with_outputs:
            return grads
        n_outputs[0] = len(every)
        return (*(o.detach() for o in every), *grads)

    with _disable_current_modes(), warnings.catch_warnings(), fx_traceback.preserve_node_meta():
        # anomaly mode only for its creation tracebacks (the user's lines); it warns that it is slow
        warnings.simplefilter("ignore", UserWarning)
        anomaly = torch.autograd.detect_anomaly(check_nan=False)
        anomaly.__enter__()
        # fake examples (no memory): make_fx traces in their mode
        device = tensors[0].device if tensors else torch.device("cpu")
        guards = None
        if symbolic:
            mode, guards = SizeGuards.fake_mode()
            examples = [guards.example(mode, concrete_shape(t), t.dtype, t.device) for t in tensors]
            tangents = [guards.example(mode, concrete_shape(g), g.dtype, device) for g in grads]
            with mode:
                state = torch.zeros(STATE_SHAPE, dtype=torch.int64, device=device)
        else:
            with FakeTensorMode():
                examples = [torch.empty(concrete_shape(t), dtype=t.dtype, device=t.device) for t in tensors]
                tangents = [torch.empty(concrete_shape(g), dtype=g.dtype, device=device) for g in grads]
                state = torch.zeros(STATE_SHAPE, dtype=torch.int64, device=device)
        try:
            with enable_python_dispatcher():
                gm = make_fx(joint, decomposition_table=table, tracing_mode="fake")(*examples, *tangents, state)
        finally:
            anomaly.__exit__(None, None, None)
    gm.graph.eliminate_dead_code()
    _check_replayed(gm, user)
    # the state stays a parameter of the backward only where it recomputes random numbers
    state_node = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    if not state_node.users:
        gm.graph.erase_node(state_node)
    gm.recompile()
    return gm, diff, n_outputs[0], guards


class SizeGuards:
    """What a graph traced on symbolic sizes (``_trace_joint(symbolic=True)``) assumes of
    the sizes of its inputs and gradients: the shape environment's guards (sizes 0 and 1
    kept, equal sizes equal, what the function branches on), checked for a call's
    tensors (``admit``); and the sizes it derives (a saved statistic's shape) for them
    (``sizes``)."""

    def __init__(self, shape_env):
        self.shape_env = shape_env
        self.examples: list = []

    @staticmethod
    def fake_mode():
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        env = ShapeEnv()
        return FakeTensorMode(shape_env=env), SizeGuards(env)

    def example(self, mode, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """A fake tensor of ``shape``'s rank whose sizes are symbols (one per distinct size)."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DUCK] * len(shape))
        t = mode.from_tensor(torch.empty(shape, dtype=dtype, device="meta"), symbolic_context=context)
        with mode:
            t = t.to(device)
        self.examples.append(t)
        return t

    def admit(self, tensors: list) -> bool:
        """Whether the graph holds for tensors of these sizes (the inputs, then the
        gradients). Their strides do not matter: the forward and the backward take their
        tensors contiguous, as the examples were traced (a query projected and transposed
        into heads is a strided view, which the guards' own check of strides refuses)."""
        if len(tensors) != len(self.examples) or any(t.dim() != e.dim() for t, e in zip(tensors, self.examples)):
            return False
        laid_out = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
        try:
            return bool(self.shape_env.evaluate_guards_for_args(self.examples, laid_out, ignore_static=False))
        except Exception:  # a guard that needs what these tensors do not give: not admitted
            return False

    def sizes(self, shape, tensors: list) -> tuple[int, ...]:
        """``shape`` (of ints and the graph's size expressions) for these tensors' sizes."""
        binding = {}
        for e, t in zip(self.examples, tensors):
            for d, n in zip(e.shape, t.shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    binding[d.node.expr] = int(n)
        return tuple(int(d) if isinstance(d, int) else int(d.node.expr.xreplace(binding)) for d in shape)


def derive(kfn, structure: str, tensors: list[torch.Tensor], grads: list[torch.Tensor],
           wants: tuple[bool, ...] | None = None) -> Backward:
    """Trace and wrap the backward of ``kfn`` for this structure and these input shapes,
    recomputing the forward from the inputs (what double backward differentiates, and
    what runs for a function that draws random numbers); ``grads`` are the gradients of
    its floating-point outputs, in order; ``wants`` the inputs that get a gradient."""
    from . import torch_ops

    gm, diff, _, _ = _trace_joint(kfn, structure, tensors, grads, wants=wants, differentiable=True)
    random = len([n for n in gm.graph.nodes if n.op == "placeholder"]) > len(tensors) + len(grads)
    name = torch_ops.op_name_base(kfn.fn)
    fn, path, line_locs = _materialize(kfn, f"{name}_backward", gm, kfn.fn, "backward")
    return Backward(fn, diff, path, line_locs, random)


@dataclass
class Training:
    """A forward and its backward for one specialization, split by compiler/partition.py.

    ``forward`` takes the function's flat tensors and returns its flat results, then the
    extras; ``backward.fn`` takes the flat tensors, the results ``saved_outputs`` names,
    the extras, then one gradient per floating-point result. ``forward`` is None where
    the function draws random numbers: then the plain forward runs, and ``backward``
    recomputes the forward from the inputs and the random state (``derive``)."""

    forward: Any  # a KfFunction, or None
    backward: Backward
    n_outputs: int
    saved_outputs: tuple[int, ...] = ()
    extras: tuple = ()  # (shape, dtype, kind) of each saved value beyond inputs and outputs
    forward_source: str = ""
    forward_locs: dict = None
    #: where the graphs were traced on symbolic sizes: what they assume of the sizes (the
    #: extras' shapes then hold size expressions: ``for_sizes`` gives them for a call)
    guards: SizeGuards | None = None

    def for_sizes(self, tensors: list, grads: list) -> "Training":
        """This training with its extras' shapes for a call of these sizes."""
        if self.guards is None:
            return self
        every = [*tensors, *grads]
        extras = tuple((self.guards.sizes(shape, every), dtype, kind) for shape, dtype, kind in self.extras)
        return dataclasses.replace(self, extras=extras)

    def run_forward(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The forward's results, then the extras."""
        try:
            flat = self.forward._kernel_call(tuple(t.contiguous() for t in tensors), {})
        except CompileError as e:
            raise _at_user_line(e, self.forward, self.forward_source, self.forward_locs, "forward") from None
        return list(flat) if isinstance(flat, (tuple, list)) else [flat]

    def saved(self, tensors: list, results: list) -> list:
        """What the backward takes before the gradients: the inputs, the results it reads
        and the extras (``results``: the forward's results then its extras)."""
        return [*tensors, *(results[i] for i in self.saved_outputs), *results[self.n_outputs:]]

    def example_saved(self, tensors: list[torch.Tensor], results_meta: list) -> list[torch.Tensor]:
        """Empty tensors shaped like ``saved`` (``results_meta``: (shape, dtype) of each result)."""
        device = tensors[0].device if tensors else torch.device("cpu")
        outs = [torch.empty(results_meta[i][0], dtype=results_meta[i][1], device=device) for i in self.saved_outputs]
        extras = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in self.extras]
        return [*tensors, *outs, *extras]


def derive_training(kfn, structure: str, tensors: list[torch.Tensor], grads: list[torch.Tensor],
                    wants: tuple[bool, ...] | None = None, symbolic: bool = False) -> Training:
    """Trace the joint graph of ``kfn`` once and split it (partition.split): the forward
    that also returns what its backward needs, and the backward that takes it, which
    computes the gradients of the inputs ``wants`` names (every floating-point one where
    None). ``symbolic``: traced on symbolic sizes (``Training.guards``), so that one
    forward and one backward function serve every size, each compiling with run-time
    sizes as a kf function does when its sizes change; not for a function that draws
    random numbers (ValueError)."""
    from . import partition, torch_ops

    gm, diff, n_outputs, guards = _trace_joint(kfn, structure, tensors, grads, with_outputs=True, wants=wants,
                                               symbolic=symbolic)
    n_places = len([n for n in gm.graph.nodes if n.op == "placeholder"])
    if n_places > len(tensors) + len(grads):
        if symbolic:
            raise ValueError("a function that draws random numbers is traced for its sizes")
        # random numbers: the forward's kernels draw them; the backward replays them
        return Training(None, derive(kfn, structure, tensors, grads, wants), n_outputs)
    cut = partition.split(gm, len(tensors), n_outputs)
    name = torch_ops.op_name_base(kfn.fn)
    fwd, fpath, flocs = _materialize(kfn, f"{name}_forward", cut.forward, kfn.fn, "forward", torch_op=False)
    bfn, bpath, blocs = _materialize(kfn, f"{name}_backward", cut.backward, kfn.fn, "backward")
    return Training(fwd, Backward(bfn, diff, bpath, blocs), n_outputs, cut.saved_outputs, cut.extras, fpath, flocs,
                    guards)


def _materialize(kfn, fname: str, gm: torch.fx.GraphModule, user, role: str,
                 torch_op: bool = True) -> tuple[Any, str, dict[int, SourceLoc]]:
    """Write a graph as a Python function ``fname`` in a file and make it a KfFunction;
    (the function, the file, the user's line behind each line of the file)."""
    from .cache import cache_dir

    gm.recompile()
    code = gm.graph.python_code(root_module="self")
    src = code.src
    src = re.sub(r"def forward\(self,?\s*", f"def {fname}(", src, count=1)
    header = (f"# The {role} of {user.__name__} ({user.__code__.co_filename}:{user.__code__.co_firstlineno}),\n"
              f"# traced by kf.autograd from the forward. Generated: edits are overwritten.\n"
              f"import torch\n")
    text = header + src
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = cache_dir() / "backward"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{fname}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    glb = dict(code.globals)
    glb.update({"torch": torch, "self": gm, "__name__": f"kf_{role}_{fname}"})
    exec(compile(text, str(path), "exec"), glb)
    fn = glb[fname]
    # one op per generated function (torch_ops names ops by qualified name): each
    # specialization's backward is differentiable in its turn, which double backward uses
    fn.__qualname__ = f"{fname}.{digest}"

    nodes = {n.name: n for n in gm.graph.nodes}
    line_locs: dict[int, SourceLoc] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s+(\w+) = ", line)
        node = nodes.get(m.group(1)) if m else None
        if node is not None:
            loc = _user_loc(node.meta.get("stack_trace", ""), user.__code__.co_filename)
            if loc is not None:
                line_locs[lineno] = loc
    return type(kfn)(fn, kfn.options, torch_op=torch_op), str(path), line_locs


def backward_of(kfn, *args, **kwargs) -> Backward:
    """The backward kf derives for this call of ``kfn`` under autograd (derived now if it
    was not yet), to read or inspect: ``b.source`` is its Python, ``b.inspect()`` (or
    ``kf.inspect(b.fn, *b.example_args)``) its IR -- ``b.inspect(target="cuda")``, its PTX
    without a GPU. It takes what the forward saves (the inputs, the outputs and extras
    ``b.saved`` lists), then the gradients of the floating-point outputs."""
    from . import torch_ops

    tensors, structure = torch_ops.flatten_call(kfn, args, kwargs)
    # the gradients autograd would ask for: of the tensors that require grad, where any does
    wants = tuple(t.is_floating_point() and t.requires_grad for t in tensors)
    tensors = [t.detach() for t in tensors]
    training, metas = torch_ops.training_of(kfn, structure, tensors, wants if any(wants) else None)
    bwd = training.backward
    device = tensors[0].device if tensors else torch.device("cpu")
    grads = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in metas if dtype.is_floating_point]
    saved = training.example_saved(tensors, metas) if training.forward is not None else list(tensors)
    from .random_state import STATE_SHAPE
    state = [torch.zeros(STATE_SHAPE, dtype=torch.int64, device=device)] if bwd.random else []
    bwd.example_args = [*saved, *grads, *state]
    return bwd
