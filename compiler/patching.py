"""Swapping a model's standard ops for kf functions: ``kf.patch`` and ``kf.unpatch``.

    report = kf.patch(model, {torch.nn.LayerNorm: layer_norm, torch.nn.functional.gelu: gelu},
                      validate=0.05)
    print(report)            # what was replaced, where, and what was left alone and why
    kf.unpatch(model)        # everything back as it was

Module types (keys that are ``nn.Module`` subclasses) are matched against every
submodule of ``model`` (exact type: a subclass may change what forward means). The
matching module's ``forward`` is replaced, on that instance only, by a call of the kf
function whose arguments come from two places: parameters the module has as attributes
(``weight``, ``bias``, ``eps``, ``dim``, ``approximate``, ...) are read from the module at
each call, so training updates and ``load_state_dict`` are seen, and the others are filled
in order from the forward's own arguments. So ``layer_norm(x, weight, bias, eps=1e-5)``
fits ``nn.LayerNorm`` and ``linear(x, weight, bias)`` fits ``nn.Linear`` with no glue code.
A module the function cannot stand for (LayerNorm over two dims, a parameter that is
neither an attribute of the module nor an argument of its forward) is left alone at patch
time and the report says why. Calls under ``torch.compile`` change no Python state (they
are not counted), so a patched model compiles once, ``fullgraph=True`` included.

Functions of ``torch.nn.functional`` (keys that are functions) are replaced in that module
while patched, so every caller that looks them up there sees kf, including the standard
modules that call them (``nn.GELU`` calls ``F.gelu``). Arguments are matched by name, the
function's first parameter standing for torch's ``input``; a call whose arguments the kf
function does not take (``F.gelu(x, approximate="tanh")`` for a kf GELU without
``approximate``) runs torch's own function.

``validate=p`` runs torch's original beside kf on a fraction p of calls (chosen by a seeded
generator, so runs repeat) and compares the results with the tolerance of their dtype
(``TOLERANCES``); a call whose kf function writes to tensors it is given (a batch norm's
running statistics) has those writes undone before torch's original runs from the same
values, and they are compared too. On a mismatch that call returns torch's result, the site keeps using
torch from then on, and one warning names the site and the difference. A kf function that
fails to compile for a call (an unsupported op, a target that cannot run the tensors)
warns once and falls back to torch the same way: patching never breaks a working model.
"""

from __future__ import annotations

import inspect
import random
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .errors import CompileError

#: (rtol, atol) per dtype for validate=: looser than torch.testing's defaults because kf
#: sums in another order and accumulates low precision in float32, as any fused kernel does
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float8_e4m3fn: (0.125, 0.0625),
    torch.float8_e5m2: (0.25, 0.125),
}


@dataclass
class Replacement:
    """One patched site: a submodule (``where`` is its qualified name) or a function."""

    where: str
    original: str
    kf_function: str
    status: str = "replaced"  # replaced | skipped | fell back
    reason: str = ""
    calls: int = 0  # calls kf ran
    validated: int = 0  # of those, how many were checked against torch


@dataclass
class PatchReport:
    """What ``kf.patch`` did; ``kf.unpatch(report)`` or ``kf.unpatch(model)`` undoes it."""

    entries: list[Replacement] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    active: bool = True

    @property
    def replaced(self) -> list[Replacement]:
        return [e for e in self.entries if e.status != "skipped"]

    @property
    def skipped(self) -> list[Replacement]:
        return [e for e in self.entries if e.status == "skipped"]

    def __str__(self) -> str:
        lines = [f"kf.patch: {len(self.replaced)} replaced, {len(self.skipped)} left alone"]
        for e in self.entries:
            line = f"  {e.status:<10} {e.where or '(model)'}: {e.original} -> {e.kf_function}"
            if e.status != "skipped":
                line += f"  [{e.calls} calls, {e.validated} validated]"
            if e.reason:
                line += f"  ({e.reason})"
            lines.append(line)
        return "\n".join(lines)


_PATCHED_FUNCTIONS: dict[str, Any] = {}  # F name -> the original, while patched
_LOCK = threading.Lock()
#: >0 while kf runs a function's own body (capture, the fake implementation, the backward's
#: trace): a kf GELU written with F.gelu must see torch's F.gelu, not itself. A plain
#: counter rather than a threading.local, which Dynamo cannot trace.
_BYPASS = [0]


class originals:
    """Patched sites call torch's originals inside this context. A class, not a generator:
    kf's op enters it on every call (torch_ops._Opaque)."""

    __slots__ = ()

    def __enter__(self):
        _BYPASS[0] += 1
        return self

    def __exit__(self, *exc):
        _BYPASS[0] -= 1
        return False


def patch(model: torch.nn.Module | None, replacements: dict, *, validate: float = 0.0,
          seed: int = 0) -> PatchReport:
    """Replace modules (by type) in ``model`` and ``torch.nn.functional`` functions by kf
    functions; returns the report. See the module docstring for the rules."""
    if not 0.0 <= validate <= 1.0:
        raise ValueError(f"validate is a fraction of calls in [0, 1], got {validate}")
    report = PatchReport()
    rng = random.Random(seed)
    module_types = {k: v for k, v in replacements.items() if isinstance(k, type)}
    functions = {k: v for k, v in replacements.items() if not isinstance(k, type)}
    for key in module_types:
        if not issubclass(key, torch.nn.Module):
            raise TypeError(f"kf.patch: {key.__name__} is not a torch.nn.Module subclass")
    if module_types:
        if model is None:
            raise TypeError("kf.patch: module types need a model to look for them in")
        for name, module in model.named_modules():
            kfn = module_types.get(type(module))
            if kfn is not None:
                _patch_module(report, name, module, kfn, validate, rng)
    for fn, kfn in functions.items():
        _patch_function(report, fn, kfn, validate, rng)
    if model is not None:
        model.__dict__.setdefault("_kf_patches", []).append(report)
    return report


def unpatch(target: torch.nn.Module | PatchReport) -> None:
    """Undo ``kf.patch``: every patch of a model (newest first), or one report's."""
    if isinstance(target, PatchReport):
        reports = [target]
    else:
        reports = list(reversed(target.__dict__.pop("_kf_patches", [])))
    for report in reports:
        if not report.active:
            continue
        for undo in reversed(report._undo):
            undo()
        report.active = False


# ----------------------------------------------------------------------------- modules


def _kf_name(kfn) -> str:
    fn = getattr(kfn, "fn", kfn)
    return f"kf {getattr(fn, '__name__', repr(fn))}"


def _plan_module_call(module: torch.nn.Module, kfn) -> tuple[list[str], list[str]] | str:
    """(names read from the module, names filled from forward's arguments), or the reason
    the function cannot stand for this module."""
    params = list(inspect.signature(getattr(kfn, "fn", kfn)).parameters.values())
    from_module, from_args = [], []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return f"{_kf_name(kfn)} takes *args/**kwargs: kf.patch cannot tell which argument is which"
        if hasattr(module, p.name) and not callable(getattr(type(module), p.name, None)) \
                and not isinstance(getattr(module, p.name), torch.nn.Module):
            from_module.append(p.name)
        else:
            from_args.append(p.name)
    if not from_args:
        return f"{_kf_name(kfn)} takes no argument the forward could give"
    unfilled = _unfilled(module, [p for p in params if p.name in from_args])
    if unfilled:
        attrs = ", ".join(n for n, _ in module.named_parameters(recurse=False)) or "none"
        return (f"{_kf_name(kfn)}'s parameter '{unfilled}' is neither an attribute of {type(module).__name__} "
                f"(its parameters: {attrs}) nor given by its forward{_forward_text(module)}; name it after the "
                f"attribute it stands for")
    if isinstance(module, torch.nn.LayerNorm) and len(module.normalized_shape) != 1:
        return f"normalizes over {len(module.normalized_shape)} dims; the kf function normalizes the last one"
    return from_module, from_args


def _forward_parameters(module: torch.nn.Module) -> list[inspect.Parameter] | None:
    """The parameters of the module's forward (self excluded), or None where they cannot be read."""
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def _forward_text(module: torch.nn.Module) -> str:
    params = _forward_parameters(module)
    return "" if params is None else f"({', '.join(p.name for p in params)})"


def _unfilled(module: torch.nn.Module, wanted: list[inspect.Parameter]) -> str | None:
    """The first required parameter of the kf function that a call of the module's forward
    cannot fill: forward's arguments fill ``wanted`` in order, and by name."""
    given = _forward_parameters(module)
    if given is None or any(p.kind == p.VAR_POSITIONAL for p in given):
        return None
    positional = [p for p in given if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name for p in given if p.kind != p.POSITIONAL_ONLY} if not any(
        p.kind == p.VAR_KEYWORD for p in given) else None
    for i, p in enumerate(wanted):
        if i < len(positional) or p.default is not p.empty or by_name is None or p.name in by_name:
            continue
        return p.name
    return None


def _module_value(module: torch.nn.Module, name: str, args: tuple):
    """The module's attribute ``name`` as the kf function's argument. ``eps=None``
    (nn.RMSNorm's default) means the machine epsilon of the input's dtype, as torch's
    rms_norm reads it."""
    value = getattr(module, name)
    if value is None and name == "eps" and args and isinstance(args[0], torch.Tensor) \
            and args[0].is_floating_point():
        return torch.finfo(args[0].dtype).eps
    return value


def _patch_module(report, name, module, kfn, validate, rng) -> None:
    entry = Replacement(name, type(module).__name__, _kf_name(kfn))
    report.entries.append(entry)
    plan = _plan_module_call(module, kfn)
    if isinstance(plan, str):
        entry.status, entry.reason = "skipped", plan
        return
    from_module, from_args = plan
    original = module.forward
    had_own = "forward" in module.__dict__

    def kf_forward(*args, **kwargs):
        call = {n: _module_value(module, n, args) for n in from_module}
        call.update(zip(from_args, args))
        call.update(kwargs)
        return kfn(**call)

    module.forward = _guarded(entry, kf_forward, original, validate, rng,
                              lambda: [getattr(module, n) for n in from_module])

    def undo():
        if had_own:
            module.forward = original
        else:
            module.__dict__.pop("forward", None)

    report._undo.append(undo)


# ----------------------------------------------------------------------------- functions


def _patch_function(report, fn, kfn, validate, rng) -> None:
    import torch.nn.functional as F

    name = getattr(fn, "__name__", None)
    if name is None or getattr(F, name, None) is not fn and _PATCHED_FUNCTIONS.get(name) is not fn:
        raise TypeError(f"kf.patch: {fn!r} is neither a torch.nn.Module type nor a torch.nn.functional function")
    entry = Replacement(f"torch.nn.functional.{name}", name, _kf_name(kfn))
    report.entries.append(entry)
    with _LOCK:
        if name in _PATCHED_FUNCTIONS:
            entry.status, entry.reason = "skipped", "already patched by another kf.patch"
            return
        original = getattr(F, name)
        try:
            torch_sig = inspect.signature(original)
        except ValueError:  # builtins (F.gelu, F.linear) have no Python signature
            torch_sig = None
        defaults = dict(_BUILTIN_DEFAULTS.get(name, {}))
        if torch_sig is not None:
            defaults.update({k: p.default for k, p in torch_sig.parameters.items() if p.default is not p.empty})
        kf_params = list(inspect.signature(getattr(kfn, "fn", kfn)).parameters)

        def kf_function(*args, **kwargs):
            if torch_sig is not None:
                given = dict(torch_sig.bind(*args, **kwargs).arguments)
                x = given.pop(next(iter(torch_sig.parameters)))
            elif args:
                # positional arguments stand for the kf function's parameters in order
                if len(args) > len(kf_params):
                    raise _NotRepresentable(f"{name} with {len(args)} positional arguments")
                x, given = args[0], dict(kwargs)
                given.update(zip(kf_params[1:], args[1:]))
            else:
                raise _NotRepresentable(f"{name} without positional arguments")
            call = {kf_params[0]: x}
            for k, v in given.items():
                if k in kf_params:
                    call[k] = v
                elif k == "normalized_shape" and isinstance(x, torch.Tensor) and tuple(v) == tuple(x.shape[-1:]):
                    continue  # the kf function normalizes the last dim, as asked
                elif k in defaults and _same_constant(v, defaults[k]):
                    continue  # torch's default: nothing the kf function needs to know
                else:
                    raise _NotRepresentable(f"{name}({k}={v!r})")
            return kfn(**call)

        setattr(F, name, _guarded(entry, kf_function, original, validate, rng))
        _PATCHED_FUNCTIONS[name] = original

    def undo():
        with _LOCK:
            setattr(F, name, _PATCHED_FUNCTIONS.pop(name))

    report._undo.append(undo)


#: defaults of builtin torch.nn.functional functions, which inspect cannot read
_BUILTIN_DEFAULTS = {
    "gelu": {"approximate": "none"},
    "linear": {"bias": None},
    "scaled_dot_product_attention": {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                                     "enable_gqa": False},
}


def _same_constant(v, default) -> bool:
    return v is default or (isinstance(v, (bool, int, float, str)) and type(v) is type(default) and v == default)


class _NotRepresentable(Exception):
    """A call the kf function cannot express: torch's original runs it."""


# ----------------------------------------------------------------------------- calls


def _guarded(entry: Replacement, kf_call: Callable, original: Callable, validate: float, rng,
             state: Callable[[], list] = list) -> Callable:
    """kf_call with the fallbacks and the validation; original is torch's; state gives the
    tensors a call may write besides its arguments (a module's parameters and buffers)."""

    warned = {"once": False}

    def fall_back(reason: str):
        entry.status, entry.reason = "fell back", reason
        if not warned["once"]:
            warned["once"] = True
            warnings.warn(f"kf.patch: {entry.where or '(model)'} ({entry.original} -> {entry.kf_function}): {reason}; "
                          f"using torch from now on", RuntimeWarning, stacklevel=3)

    def call(*args, **kwargs):
        if entry.status == "fell back" or _BYPASS[0]:
            return original(*args, **kwargs)
        check = validate and not torch.compiler.is_compiling() and rng.random() < validate
        # a kf function may write to the tensors it is given (a batch norm's running
        # statistics): a validated call keeps what they held, so that torch's original
        # writes them once, from the same values
        before = _snapshot(args, kwargs, state) if check else []
        try:
            with originals():
                out = kf_call(*args, **kwargs)
        except _NotRepresentable:
            return original(*args, **kwargs)
        except CompileError as e:
            fall_back(f"kf could not compile it: {e.message}")
            return original(*args, **kwargs)
        if torch.compiler.is_compiling():
            # Python state changed inside a compiled region is a guard Dynamo must re-check:
            # a counter would recompile the model on every call. Compiled calls are not counted.
            return out
        entry.calls += 1  # calls that kf ran
        if check:
            entry.validated += 1
            written = [(t, t.detach().clone()) for t, version, value in before if t._version != version]
            with torch.no_grad():
                for t, _ in written:
                    t.copy_(next(value for u, _, value in before if u is t))
                want = original(*args, **kwargs)
            diff = _difference((out, [w for _, w in written]), (want, [t for t, _ in written]))
            if diff is not None:
                fall_back(f"kf's result differs from torch's: {diff}")
                return want
        return out

    call.__wrapped__ = original
    call.__kf_patch__ = entry
    return call


def _snapshot(args: tuple, kwargs: dict, state: Callable[[], list]) -> list:
    """(tensor, its version, a copy of its values) of each tensor a call is given."""
    seen, out = set(), []
    for t in [*args, *kwargs.values(), *state()]:
        for u in (t if isinstance(t, (list, tuple)) else [t]):
            if isinstance(u, torch.Tensor) and id(u) not in seen:
                seen.add(id(u))
                out.append((u, u._version, u.detach().clone()))
    return out


def _difference(got: Any, want: Any) -> str | None:
    """None when got matches want within TOLERANCES, else what differs."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return (f"got {type(got).__name__} {getattr(got, 'dtype', '')}{list(getattr(got, 'shape', []))}, "
                    f"torch gives {want.dtype}{list(want.shape)}")
        if not want.is_floating_point():
            bad = (got != want).sum().item()
            return f"{bad} of {want.numel()} elements differ" if bad else None
        rtol, atol = TOLERANCES.get(want.dtype, (1e-4, 1e-5))
        g, w = got.detach().double(), want.detach().double()
        err = (g - w).abs()
        allowed = atol + rtol * w.abs()
        both_nan = torch.isnan(g) & torch.isnan(w)
        bad = ((err > allowed) | torch.isnan(err)) & ~both_nan
        if not bad.any():
            return None
        i = int(torch.argmax(torch.where(bad, err - allowed, torch.full_like(err, -1.0))).item())
        return (f"max abs difference {err[bad].max().item():.3g} at flat index {i} (kf {g.flatten()[i].item():.6g}, "
                f"torch {w.flatten()[i].item():.6g}); {int(bad.sum())} of {want.numel()} elements outside "
                f"rtol={rtol:g}, atol={atol:g} for {want.dtype}")
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return f"got {type(got).__name__} of {len(got) if hasattr(got, '__len__') else '?'} results, " \
                   f"torch gives {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            d = _difference(g, w)
            if d is not None:
                return f"result {i}: {d}"
        return None
    return None if got == want else f"got {got!r}, torch gives {want!r}"
