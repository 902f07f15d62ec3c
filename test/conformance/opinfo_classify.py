"""One case of the OpInfo conformance suite (opinfo.py), run in this process and
classified: the kf function that calls the op on the sample (its call is the user's
line of every case, CALL_LINE), eager on clones of the same inputs, and the class."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from opinfo_cases import (COMPILE_ONLY, REPO, SUMS_OF_PRODUCTS, UNDEFINED_VALUES, Case, Result, cached_samples,
                          first_line, op_table, quiet, torch_dtype)
from opinfo_compare import compare, tolerance
from opinfo_scope import scope_of


def kf_function(call_op, sample, target: str):
    """(kf function, its tensors): a kf function of one list of tensors that calls the op
    on the sample, its non-tensor arguments closed over as constants."""
    import kf
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    constants = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]

    def opinfo_case(tensors):
        values = list(constants)
        for i, t in zip(where, tensors):
            values[i] = t
        x, args, kwargs = tree_unflatten(values, spec)
        return call_op(x, *args, **kwargs)  # CALL_LINE: the user's line of every case

    return kf.jit(target=COMPILE_ONLY.get(target, target))(opinfo_case), [leaves[i] for i in where]


def _call_line() -> int:
    for n, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if "# CALL_LINE" in line and "return call_op" in line:
            return n
    return 0


CALL_LINE = _call_line()


#: ops whose index result may name any of several equal values (torch leaves which one
#: unspecified): op -> (position of dim among the sample's args, whether it has keepdim)
TIED_INDICES = {"topk": (1, False), "kthvalue": (1, True), "mode": (0, True), "sort": (0, False),
                "argsort": (0, False)}


def _ties_only(op: str, sample, got, want) -> bool:
    """Whether kf's result differs from eager's only in which index it gives among equal
    values: the same values, and the input's values at kf's indices those at eager's."""
    import torch

    x = sample.input
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return False
    pos, has_keepdim = TIED_INDICES[op]
    args = list(sample.args)
    dim = sample.kwargs.get("dim", args[pos] if len(args) > pos else -1)
    if op == "argsort":
        gi, wi = got, want
    else:
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and torch.equal(got[0], want[0])):
            return False
        gi, wi = got[1], want[1]
    if not isinstance(gi, torch.Tensor) or gi.shape != wi.shape or gi.dtype != wi.dtype:
        return False
    keepdim = sample.kwargs.get("keepdim", args[pos + 1] if has_keepdim and len(args) > pos + 1 else False)
    if has_keepdim and not keepdim:
        gi, wi = gi.unsqueeze(dim), wi.unsqueeze(dim)
    try:
        return torch.equal(x.gather(dim, gi), x.gather(dim, wi))
    except (RuntimeError, IndexError):
        return False


def _clone(tensors):
    return [t.detach().clone() for t in tensors]


def _with(sample, tensors):
    """The sample's (input, args, kwargs) with its tensors replaced, in order."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    it = iter(tensors)
    return tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _eager(call_op, sample, tensors, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    x, args, kwargs = _with(sample, _clone(tensors))
    return call_op(x, *args, **kwargs)


def _is_kf_error(e: BaseException) -> bool:
    """Whether e is one of kf's own exception types (defined in kf's packages)."""
    return any(getattr(t, "__module__", "").split(".")[0] == "kf" for t in type(e).__mro__)


def classify_exception(e: BaseException) -> tuple[str, str, str, bool | None]:
    """(class, one-line detail, error type, user_line) of an exception from a kf call."""
    import kf

    text = str(e)
    first = first_line(e)
    kind = f"{type(e).__module__}.{type(e).__qualname__}"
    if _is_kf_error(e):
        if isinstance(e, kf.CompileError) and "internal compiler error" in e.message:
            return "INTERNAL", f"{first} | {e.cause or ''}"[:300], kind, None
        names_line = f'{Path(__file__).name}", line {CALL_LINE}' in text
        return "KF_ERROR", first, kind, names_line
    where = _innermost_frame(e)
    return "INTERNAL", f"{type(e).__name__}: {first}{' at ' + where if where else ''}"[:300], kind, None


def _innermost_frame(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    frame = tb[-1]
    try:
        path = str(Path(frame.filename).resolve().relative_to(REPO))
    except ValueError:
        path = Path(frame.filename).name
    return f"{path}:{frame.lineno}"


def _reference(call_op, sample, tensors, dtype, magnitude: bool = False):
    """The op on float64 copies of the float tensors of the tested dtype (their absolute
    values with ``magnitude``, and then the result's), or None."""
    import torch
    from torch.utils._pytree import tree_map

    try:
        up = [(t.detach().to(torch.float64).abs() if magnitude else t.detach().to(torch.float64))
              if t.dtype == dtype else t.detach().clone() for t in tensors]
        x, args, kwargs = _with(sample, up)
        with quiet():
            out = call_op(x, *args, **kwargs)
        return tree_map(lambda t: t.abs() if isinstance(t, torch.Tensor) else t, out) if magnitude else out
    except Exception:
        return None


def _is_random(call_op, sample, tensors, first) -> bool:
    """Whether eager gives other values with another seed (a random op). An op that
    seeds itself (torch's wrapper_set_seed) gets another seed there."""
    import torch

    seed = torch.manual_seed
    try:
        if _seeds_itself(call_op):
            torch.manual_seed = lambda s: seed(s + 1)
        second = _eager(call_op, sample, tensors, seed=1)
    except Exception:
        return False
    finally:
        torch.manual_seed = seed
    return compare(second, first, None, 0.0, 0.0) != ""


def _seeds_itself(call_op) -> bool:
    """Whether the OpInfo wraps its op in torch's wrapper_set_seed (random ops do)."""
    code = getattr(call_op, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def scope_case(case: Case) -> str:
    """The case's scope reason (``opinfo_scope.scope_of``) without running kf: for results
    recorded before scopes were."""
    opinfo = op_table()[(case.op, case.variant)]
    sample = cached_samples(opinfo, case.target, case.dtype)[case.index]
    _, tensors = kf_function(opinfo.op, sample, case.target)
    try:
        with quiet():
            want = _eager(opinfo.op, sample, tensors)
            random = case.op not in UNDEFINED_VALUES and _is_random(opinfo.op, sample, tensors, want)
            return scope_of(case.op, opinfo.op, sample, want, random)
    except Exception:
        return ""


def run_case(case: Case) -> Result:
    """Run one case in this process and classify it."""
    start = time.perf_counter()
    opinfo = op_table()[(case.op, case.variant)]
    dtype = torch_dtype(case.dtype)
    sample = cached_samples(opinfo, case.target, case.dtype)[case.index]
    call_op = opinfo.op

    scope = ""

    def done(cls, detail="", error_type="", user_line=None):
        return Result(case, cls, detail, error_type, user_line, round(time.perf_counter() - start, 3), scope)

    fn, tensors = kf_function(call_op, sample, case.target)
    try:
        with quiet():
            want = _eager(call_op, sample, tensors)
    except Exception as e:
        return done("SKIP", f"eager raises {type(e).__name__}: {first_line(e)}")
    values_defined = case.op not in UNDEFINED_VALUES
    with quiet():
        random = values_defined and _is_random(call_op, sample, tensors, want)
        scope = scope_of(case.op, call_op, sample, want, random)
    if case.target in COMPILE_ONLY:
        # every stage built (for cuda: the PTX, assembled by ptxas); PASS means it compiled
        try:
            with quiet():
                fn.inspect(_clone(tensors)).stages
        except Exception as e:
            return done(*classify_exception(e))
        return done("PASS", "compiled; not run")
    try:
        with quiet():
            got = fn(_clone(tensors))
    except Exception as e:
        return done(*classify_exception(e))
    rtol, atol = tolerance(opinfo, dtype)
    shape_only = compare(got, want, None, rtol, atol, values=False)
    if shape_only:
        return done("MISMATCH", shape_only)
    if not values_defined or random:
        why = "undefined values (uninitialized memory)" if not values_defined else "random op"
        return done("SKIP", f"{why}: kf ran, structure, dtype and shape match; values not comparable")
    problem = compare(got, want, None, rtol, atol)
    if problem:
        reference = _reference(call_op, sample, tensors, dtype)
        magnitude = _reference(call_op, sample, tensors, dtype, magnitude=True) if case.op in SUMS_OF_PRODUCTS \
            else None
        problem = compare(got, want, reference, rtol, atol, magnitude=magnitude)
    if problem and case.op in TIED_INDICES and _ties_only(case.op, sample, got, want):
        return done("PASS", "indices of tied values differ from eager's (torch leaves which one unspecified)")
    if problem and _seeds_itself(call_op):
        # eager reseeds itself on every call (torch's wrapper_set_seed), so it is the
        # same each time; kf's random numbers are its own: random if another call differs
        # (up to eleven calls: a one-element dropout repeats its value one time in two)
        for _ in range(10):
            with quiet():
                again = fn(_clone(tensors))
            if compare(again, got, None, 0.0, 0.0):
                return done("SKIP", "random op: kf ran, structure, dtype and shape match; values not comparable")
    return done("MISMATCH", problem) if problem else done("PASS")
