"""What a kf function reads besides its arguments, and the guards that say it is unchanged.

A compiled program is specialized to its arguments (signature.py) and to everything else
its code reads: globals and closure cells it names, the helper functions it calls (their
code, globals and closures, recursively), attributes of modules and objects it names
(``cfg.scale``, ``mymod.K``), the contents of dicts, lists and tuples it reaches, and
callables by what they are (``torch.relu`` is not ``torch.sigmoid``; a
``functools.partial`` by its function and arguments). ``walk(fn)`` visits all of that
once and gives back a ``Reads``:

- ``fingerprint``: a hash of what was read, type-exact and bit-exact (``2``, ``2.0`` and
  ``True`` differ; so do ``0.0`` and ``-0.0``), the same in every process: part of the
  disk cache key (cache.py).
- the guards: for each value read, where it was read from (a path from fixed roots such
  as the function's globals dict or a closure cell) and a cheap check that it is still
  the value the program was built for (identity, or type-exact equality for scalars, the
  keys of a dict, the length of a list). Every call runs them before the program
  (``Guarded``: in C, kf.runtime._launcher.Guarded, where it is built); a failed check
  sends the call back to the slow path, which walks again and compiles anew if the
  fingerprint changed, as torch.compile's guards do.
- the tensors it reaches (globals, closure cells, attributes, parameters and buffers of
  ``nn.Module``s): never baked into the program. Capture makes the ones the function uses
  inputs of the program, and the guards read them afresh at every call (a ``G.add_(10)``
  or a new ``G`` is seen; a new shape, dtype or device specializes again). The
  fingerprint has their shapes and dtypes, not their data.

What is walked is decided by names: the union of the names the function's code and the
code of the helpers it reaches mention (``co_names`` and string constants that are
identifiers, which covers ``getattr(cfg, "scale")``). A module or an object is followed
only into the attributes so named; containers are followed entirely; an ``nn.Module`` is
followed entirely (torch's own ``forward`` reads attributes the user's code does not
name). Code of libraries (the standard library, site-packages, torch, kf) is identified
by its module, qualified name and bytecode, and not followed into: its globals are the
library's own. A library function's closure and defaults are walked, though: one library
code makes many functions (torch.unique and torch.unique_consecutive are one
``boolean_dispatch`` closure over different branches). A library object is described by
its settings (scalars, and small containers of them) and the attributes the code names.

Not seen: attribute names computed at run time (``getattr(o, "na" + "me")``) and state
inside library objects that the walk does not name. A value whose identity cannot be
written down the same way in another process (an object with neither attributes nor a
stable ``repr``) makes the specialization ``persistent = False``: it is compiled for this
process and never stored in, or loaded from, the disk cache.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import re
import site
import struct
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .packages import kf_package_dirs

# Getter codes: how an operation gets its value from the register `src`.
GET_SAME, GET_ITEM, GET_ATTR, GET_CELL, GET_INDEX = range(5)
# Check codes: what an operation asks of the value it got.
CHECK_NONE, CHECK_IS, CHECK_EQ, CHECK_KEYS, CHECK_LEN, CHECK_TENSOR, CHECK_NOKEY = range(7)

#: Scalars compared by value (type-exact, floats bit-exact) rather than identity: a value
#: computed anew at every step (``cfg.lr = base * 0.5``) keeps its program.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
#: torch's value types: dtypes, layouts and memory formats are singletons; devices compare by value.
_TORCH_SINGLETONS = (torch.dtype, torch.layout, torch.memory_format)
#: Entries of an nn.Module's __dict__ that its forward never reads.
#: (The hooks' companions, ``_forward_hooks_with_kwargs`` and the like, are keyed by the
#: ids of hooks in ``_forward_hooks`` and ``_forward_pre_hooks``, whose keys are checked.)
_MODULE_SKIP = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks", "_non_persistent_buffers_set", "_backward_hooks",
                "_backward_pre_hooks", "_is_full_backward_hook", "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
#: Names that reach a method without being written: calling an object, an nn.Module's forward.
_IMPLICIT = frozenset({"__call__", "forward"})


def _miss():
    try:
        from kf.runtime import _launcher
        return _launcher.MISS
    except (ImportError, AttributeError):
        return object()


#: What a Guarded call answers when a guard fails (kf.runtime._launcher.MISS where built).
MISS = _miss()


# ----------------------------------------------------------------------------- library code


@functools.lru_cache(maxsize=None)
def _library_roots() -> tuple[str, ...]:
    roots = set()
    paths = sysconfig.get_paths()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(name):
            roots.add(paths[name])
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # some virtualenvs' site module
        pass
    roots.add(os.path.dirname(torch.__file__))
    roots.update(kf_package_dirs())
    return tuple(sorted(os.path.realpath(r).rstrip(os.sep) + os.sep for r in roots))


@functools.lru_cache(maxsize=8192)
def _library_file(filename: str) -> bool:
    """Whether code from this file is a library's (followed no further than its identity)."""
    if not filename or filename.startswith("<"):
        return filename.startswith("<frozen")  # the frozen standard library; "<string>", "<stdin>": the user's
    return (os.path.realpath(filename) + "").startswith(_library_roots())


def _library_module(module: types.ModuleType) -> bool:
    if module.__name__ in ("__main__", "__mp_main__"):
        return False
    file = getattr(module, "__file__", None)
    return file is None or _library_file(file)


def _library_class(cls: type) -> bool:
    name = getattr(cls, "__module__", None) or ""
    if name == "builtins":
        return True
    module = sys.modules.get(name)
    return module is not None and _library_module(module)


def _is_identifier(s: Any) -> bool:
    return type(s) is str and s.isidentifier()


def _code_names(code: types.CodeType) -> set[str]:
    """The names a code object (and the code nested in it) mentions: globals, attributes,
    and identifier-like string constants (``getattr(o, "name")``, ``d["key"]``)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
        elif _is_identifier(c):
            names.add(c)
        elif type(c) in (tuple, frozenset):
            names.update(x for x in c if _is_identifier(x))
    return names


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


# ----------------------------------------------------------------------------- describing values


def scalar_text(v: Any) -> str:
    """A scalar written type-exactly and bit-exactly (``float.hex``: -0.0 and 0.0 differ)."""
    t = type(v)
    if t is float:
        return "float:" + v.hex()
    if t is complex:
        return f"complex:{v.real.hex()},{v.imag.hex()}"
    if t is bytes:
        return "bytes:" + hashlib.sha256(v).hexdigest()
    return f"{t.__name__}:{v!r}"


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    if module == "__mp_main__":  # a script, as spawned workers import it
        module = "__main__"
    return f"{module}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _code_text(code: types.CodeType, h) -> None:
    """What a code object computes: its bytecode, names, constants and arguments, and
    where its lines are (file, first line, line table): a compiled program names the
    user's lines in its errors (an index out of range), so two functions of the same
    code on other lines are other programs."""
    h.update(code.co_code)
    h.update(f"{code.co_filename}:{code.co_firstlineno}".encode())
    h.update(getattr(code, "co_linetable", b"") or b"")
    h.update(repr((code.co_names, code.co_varnames[:code.co_argcount + code.co_kwonlyargcount], code.co_freevars,
                   code.co_cellvars, code.co_flags, code.co_argcount, code.co_posonlyargcount,
                   code.co_kwonlyargcount)).encode())
    h.update(getattr(code, "co_exceptiontable", b""))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_text(c, h)
        else:
            h.update(_const_text(c).encode())
        h.update(b"\x1f")


def _const_text(c: Any) -> str:
    if type(c) in (tuple, frozenset):
        parts = [_const_text(x) for x in c]
        return f"{type(c).__name__}({','.join(sorted(parts) if type(c) is frozenset else parts)})"
    if type(c) in _SCALARS:
        return scalar_text(c)
    return f"{type(c).__name__}:{c!r}"


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256()
    _code_text(code, h)
    return h.hexdigest()


# ----------------------------------------------------------------------------- the walk


@dataclass
class _Check:
    src: int
    code: int
    expected: Any = None
    candidate: int = -1  # CHECK_TENSOR: which reached tensor; CHECK_IS of an alias: whose


class _Walker:
    """One walk from a function: sources, checks, reached tensors and the fingerprint."""

    def __init__(self, names: set[str]):
        self.names = set(names)
        self.h = hashlib.sha256()
        self.sources: list[tuple] = []  # ("const", obj) | (getter, parent source, arg)
        self._const_of: dict[int, int] = {}
        self.checks: list[_Check] = []
        self.tensors: list[torch.Tensor] = []
        self.labels: list[str] = []
        self.persistent = True
        self.unstable: list[str] = []
        #: a digest of what was read at each label: says which read changed (logs.py)
        self.parts: dict[str, str] = {}
        self._seen: dict[int, str] = {}
        self._candidate_of: dict[int, int] = {}
        self._keep: list = []  # what the walk saw, alive while it runs (ids stay unique)

    # sources
    def const(self, obj: Any) -> int:
        i = self._const_of.get(id(obj))
        if i is None:
            i = self._const_of[id(obj)] = len(self.sources)
            self.sources.append(("const", obj))
            self._keep.append(obj)
        return i

    def child(self, parent: int, getter: int, arg: Any = None) -> int:
        self.sources.append((getter, parent, arg))
        return len(self.sources) - 1

    def check(self, src: int, code: int, expected: Any = None, candidate: int = -1) -> None:
        self.checks.append(_Check(src, code, expected, candidate))

    def note(self, label: str, text: str) -> None:
        self.h.update(f"{label}\x1f{text}\x1e".encode())
        self.parts[label] = hashlib.blake2b(f"{self.parts.get(label, '')}{text}".encode(), digest_size=8).hexdigest()

    # values
    def value(self, v: Any, src: int, label: str, implied: bool = False) -> None:
        """Walk v, read at src; ``implied``: its identity follows from a check already made
        (an element of a tuple whose identity is checked), so it needs none of its own.
        A value the walk cannot take apart (its attributes raise, it nests too deep) is
        held by identity, for this process only."""
        try:
            self._value(v, src, label, implied)
        except Exception:
            self.persistent = False
            self.unstable.append(label)
            self.note(label, f"unwalked:{id(v)}")
            self.check(src, CHECK_IS, v)

    def _value(self, v: Any, src: int, label: str, implied: bool) -> None:
        t = type(v)
        if t in _SCALARS:
            self.note(label, scalar_text(v))
            if not implied:
                self.check(src, CHECK_EQ, v)
            return
        if isinstance(v, torch.Tensor):
            self.tensor(v, src, label)
            return
        first = self._seen.get(id(v))
        if first is not None:
            self.note(label, "same:" + first)
            if not implied:
                self.check(src, CHECK_IS, v)
            return
        self._seen[id(v)] = label
        self._keep.append(v)
        if isinstance(v, enum.Enum):
            self.note(label, f"enum:{_qualname(t)}.{v.name}:{_value_text(v.value)}")
        elif isinstance(v, _TORCH_SINGLETONS) or isinstance(v, torch.device):
            self.note(label, f"{t.__name__}:{v}")
            if not implied:
                self.check(src, CHECK_EQ if isinstance(v, torch.device) else CHECK_IS, v)
            return
        elif isinstance(v, (bool, int, float, complex, str, bytes)):  # subclasses: numpy's float64, ...
            self.note(label, f"{_qualname(t)}:{v!r}")
            if not implied:
                self.check(src, CHECK_EQ, v)
            return
        elif isinstance(v, (slice, range)):
            self.note(label, f"{t.__name__}:{_value_text(v.start)}:{_value_text(v.stop)}:{_value_text(v.step)}")
        elif isinstance(v, tuple):
            self.note(label, f"{_qualname(t)}[{len(v)}]")
        elif isinstance(v, list):
            self.note(label, f"{_qualname(t)}[{len(v)}]")
        elif isinstance(v, dict):
            self.note(label, f"{_qualname(t)}[{len(v)}]")
        elif isinstance(v, (set, frozenset)):
            self.note(label, f"{t.__name__}{{{','.join(sorted(_value_text(x) for x in v))}}}")
        else:
            self._object(v, src, label, implied)
            return
        if not implied and not isinstance(v, (list, dict)):
            # a list or a dict needs no identity of its own: its length or keys are checked
            # on whatever object is there, and its elements are read from that object
            self.check(src, CHECK_IS, v)
        if isinstance(v, tuple):
            for i, x in enumerate(v):
                self.value(x, self.child(src, GET_INDEX, i), f"{label}[{i}]", implied=True)
        elif isinstance(v, list):
            self.check(src, CHECK_LEN, len(v))
            for i, x in enumerate(v):
                self.value(x, self.child(src, GET_INDEX, i), f"{label}[{i}]")
        elif isinstance(v, dict):
            self._dict(v, src, label)
        elif isinstance(v, set):
            self.check(src, CHECK_EQ, set(v))

    def _dict(self, d: dict, src: int, label: str, skip: tuple = ()) -> None:
        keys = tuple(d)
        self.check(src, CHECK_KEYS, keys)
        for k in keys:
            if k in skip:
                continue
            self.value(d[k], self.child(src, GET_ITEM, k), f"{label}{{{_value_text(k)}}}")

    def tensor(self, t: torch.Tensor, src: int, label: str) -> None:
        j = self._candidate_of.get(id(t))
        if j is not None:  # the same tensor by another path: that path must still reach it
            self.note(label, f"same:{j}")
            self.check(src, CHECK_IS, t, candidate=j)
            return
        j = self._candidate_of[id(t)] = len(self.tensors)
        self.tensors.append(t)
        self.labels.append(_display(label))
        self._keep.append(t)
        self.note(label, "tensor:" + repr(tensor_key(t)))
        self.check(src, CHECK_TENSOR, tensor_key(t), candidate=j)

    def _object(self, v: Any, src: int, label: str, implied: bool) -> None:
        t = type(v)
        if not implied:
            self.check(src, CHECK_IS, v)
        if isinstance(v, types.ModuleType):
            self.note(label, f"module:{v.__name__}")
            self._attributes_of_module(v, label)
        elif isinstance(v, type):
            self.note(label, f"class:{_qualname(v)}")
            if not _library_class(v):
                self._class(v, label)
        elif isinstance(v, types.FunctionType):
            self.function(v, label)
        elif isinstance(v, types.MethodType):
            self.note(label, "method")
            self.value(v.__func__, self.const(v.__func__), label + ".__func__", implied=True)
            self.value(v.__self__, self.const(v.__self__), label + ".__self__", implied=True)
        elif isinstance(v, functools.partial):
            self.note(label, "partial")
            self.value(v.func, self.const(v.func), label + ".func", implied=True)
            self.value(v.args, self.const(v.args), label + ".args", implied=True)
            self.value(v.keywords, self.const(v.keywords), label + ".keywords", implied=True)
        elif getattr(v, "__kf_function__", None) is v:
            self.note(label, f"kf:{v.options.stable_hash()}")
            self.function(v.fn, label + ".fn")
        elif isinstance(v, (property, staticmethod, classmethod)):
            self.note(label, t.__name__)
            for part in ("fget", "fset", "__func__"):
                f = getattr(v, part, None)
                if f is not None:
                    self.value(f, self.const(f), f"{label}.{part}", implied=True)
        elif isinstance(v, torch.nn.Module):
            self._nn_module(v, label)
        elif callable(v) and not hasattr(v, "__dict__") and hasattr(v, "__qualname__"):
            # builtins (torch.relu), C methods, slot wrappers: what they are is their name
            # and, for a bound one, what they are bound to
            self.note(label, f"builtin:{_qualname(v)}")
            owner = getattr(v, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.value(owner, self.const(owner), label + ".__self__", implied=True)
        else:
            self._instance(v, label)

    def function(self, fn: types.FunctionType, label: str) -> None:
        code = fn.__code__
        self.note(label, f"function:{_qualname(fn)}:{_code_digest(code)}")
        if _library_file(code.co_filename):
            # not followed into, but one code makes many functions: what tells them apart
            # is their closure and defaults (torch.unique and torch.unique_consecutive are
            # both torch._jit_internal.boolean_dispatch's ``fn``; OpInfo's lambdas close
            # over the order of polygamma or mvlgamma)
            self._cells_and_defaults(fn, label)
            return
        self.note(label, f"file:{code.co_filename}")
        self.names |= _code_names(code)
        glb = fn.__globals__
        g = None
        builtins = glb.get("__builtins__", {})
        builtins = builtins if isinstance(builtins, dict) else vars(builtins)
        for name in sorted(_global_names(code)):
            if name in glb:
                if g is None:
                    g = self.const(glb)
                self.value(glb[name], self.child(g, GET_ITEM, name), f"{label}:{name}")
            elif name in builtins:
                self.note(f"{label}:{name}", "builtin")
        self._cells_and_defaults(fn, label)

    def _cells_and_defaults(self, fn: types.FunctionType, label: str) -> None:
        """The values a function's closure cells and default arguments hold."""
        code = fn.__code__
        for i, cell in enumerate(fn.__closure__ or ()):
            name = code.co_freevars[i]
            try:
                contents = cell.cell_contents
            except ValueError:  # not yet filled (a function defined after the one that reads it)
                self.note(f"{label}:<{name}>", "empty")
                continue
            self.value(contents, self.child(self.const(cell), GET_CELL), f"{label}:<{name}>")
        if fn.__defaults__:
            self.value(fn.__defaults__, self.child(self.const(fn), GET_ATTR, "__defaults__"), label + ".__defaults__")
        if fn.__kwdefaults__:
            self.value(fn.__kwdefaults__, self.child(self.const(fn), GET_ATTR, "__kwdefaults__"),
                       label + ".__kwdefaults__")

    def _attributes_of_module(self, m: types.ModuleType, label: str) -> None:
        if m is sys.modules.get("builtins"):
            return
        d = vars(m)
        src = None
        for name in sorted(self.names & d.keys()):
            if src is None:
                src = self.const(d)
            self.value(d[name], self.child(src, GET_ITEM, name), f"{label}.{name}")

    def _class(self, cls: type, label: str) -> None:
        """A user's class: its methods (the code its instances run) and the attributes the
        code names, each read from the class of the MRO that holds it."""
        for klass in cls.__mro__:
            if _library_class(klass):
                continue
            proxy = vars(klass)
            src = self.const(proxy)
            for name, attr in proxy.items():
                if name in self.names or name in _IMPLICIT:
                    self.value(attr, self.child(src, GET_ITEM, name), f"{label}.{klass.__name__}.{name}")
                else:
                    # a method no code names may still run (a dunder): its code is part of what
                    # the class is (its globals are followed once something names it)
                    fn = getattr(attr, "__func__", getattr(attr, "fget", attr))
                    if isinstance(fn, types.FunctionType):
                        self.note(f"{label}.{klass.__name__}.{name}", _code_digest(fn.__code__))

    def _attribute(self, obj: Any, name: str, label: str, library: bool) -> None:
        """Walk obj.name as Python looks it up: a data descriptor of its class (a property,
        a slot), its own __dict__, else the class's attribute (the instance must then still
        lack one of its own), else the class's __getattr__."""
        cls = type(obj)
        attr = _ABSENT
        for klass in cls.__mro__:
            attr = vars(klass).get(name, _ABSENT)
            if attr is not _ABSENT:
                break
        d = getattr(obj, "__dict__", None)
        d = d if isinstance(d, dict) else None
        descriptor = attr is not _ABSENT and (hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"))
        if descriptor or (attr is _ABSENT and (d is None or name not in d)):
            if library or (attr is _ABSENT and not hasattr(cls, "__getattr__")):
                return  # a library's computed attribute is its own state; an absent one is absent
            try:
                value = getattr(obj, name)
            except Exception:
                return
            self.value(value, self.child(self.const(obj), GET_ATTR, name), f"{label}.{name}")
        elif d is not None and name in d:
            self.value(d[name], self.child(self.const(d), GET_ITEM, name), f"{label}.{name}")
        elif d is not None:
            # the class's attribute (a method, a class constant), which the class's own walk
            # checks: the instance must not gain one of its own
            self.check(self.const(d), CHECK_NOKEY, name)

    def _instance(self, v: Any, label: str) -> None:
        t = type(v)
        self.value(t, self.const(t), label + ".__class__", implied=True)
        library = _library_class(t)
        d = getattr(v, "__dict__", None)
        d = d if isinstance(d, dict) else None
        if d is None:
            text = _stable_repr(v)
            if text is None:
                self.persistent = False
                self.unstable.append(label)
                self.note(label, f"object:{_qualname(t)}:{id(v)}")
            else:
                self.note(label, f"object:{_qualname(t)}:{text}")
        else:
            self.note(label, f"object:{_qualname(t)}")
            for k in d if library else ():  # a library object's own settings, shallowly
                text = _setting_text(d[k])
                if text is not None:
                    self.note(f"{label}.{k}", text)
        names = self.names | _IMPLICIT
        if d is not None and "__dict__" in names:
            names |= {k for k in d if isinstance(k, str)}
        for name in sorted(names):
            self._attribute(v, name, label, library)
        for k, x in (d or {}).items():  # tensors it holds are read where it is, whatever reads them
            if isinstance(x, torch.Tensor) and k not in names:
                self.tensor(x, self.child(self.const(d), GET_ITEM, k), f"{label}.{k}")

    def _nn_module(self, m: torch.nn.Module, label: str) -> None:
        """An nn.Module whole: torch's forward reads its parameters, buffers, submodules and
        settings (``eps``, ``training``) without the user's code naming them."""
        t = type(m)
        self.value(t, self.const(t), label + ".__class__", implied=True)
        self.note(label, f"nn.Module:{_qualname(t)}")
        d = vars(m)
        self._dict(d, self.const(d), label, skip=_MODULE_SKIP)


_ABSENT = object()


def _display(label: str) -> str:
    """A walk's label as a person writes it: ``G``, ``lin.weight``, ``table['w'][1]``
    (labels are ``fn:name`` for a global, ``fn:<name>`` for a closure cell, and ``{key}``
    for a dict's item, which for a module's parameters, buffers and submodules reads as
    an attribute)."""
    label = re.sub(r"^[^:]*:", "", label, count=1)  # the function's own name
    label = re.sub(r"<([^>]*)>", r"\1", label)
    label = re.sub(r"\{str:'_(?:parameters|buffers|modules)'\}\{str:'([^']*)'\}", r".\1", label)
    label = re.sub(r"\{str:('[^']*')\}", r"[\1]", label)
    return label.replace(":", ".")


def _value_text(v: Any) -> str:
    if type(v) in _SCALARS:
        return scalar_text(v)
    if isinstance(v, enum.Enum):
        return f"enum:{_qualname(type(v))}.{v.name}"
    if isinstance(v, (tuple, frozenset)):
        return f"{type(v).__name__}({','.join(_value_text(x) for x in v)})"
    if isinstance(v, _TORCH_SINGLETONS) or isinstance(v, torch.device):
        return f"{type(v).__name__}:{v}"
    if isinstance(v, type):
        return f"class:{_qualname(v)}"
    return f"{_qualname(type(v))}:{_stable_repr(v) or id(v)}"


def _setting_text(x: Any, depth: int = 0) -> str | None:
    """A library object's setting as text: a scalar, an enum, a dtype or device, or a
    small list, tuple or dict of them (a torch.cuda.jiterator function's extra
    arguments); None for anything else (what the walk follows by name, if at all)."""
    if type(x) in _SCALARS or isinstance(x, (enum.Enum, *_TORCH_SINGLETONS, torch.device)):
        return _value_text(x)
    if depth < 2 and type(x) in (list, tuple, dict) and len(x) <= 64:
        items = x.items() if type(x) is dict else enumerate(x)
        parts = []
        for k, v in items:
            key, value = _setting_text(k, depth + 1), _setting_text(v, depth + 1)
            if key is None or value is None:
                return None
            parts.append(f"{key}={value}" if type(x) is dict else value)
        return f"{type(x).__name__}({','.join(parts)})"
    return None


def _stable_repr(v: Any) -> str | None:
    """repr(v) where it says what v is in every process (no address in it), else None."""
    try:
        text = repr(v)
    except Exception:
        return None
    return None if " at 0x" in text or "object at" in text else text


def tensor_key(t: torch.Tensor) -> tuple:
    """What a program compiled for a reached tensor depends on (as a call argument's
    dispatch key: shape, dtype, device, contiguity)."""
    return (t.shape, t.dtype, t.device, t.is_contiguous())


# ----------------------------------------------------------------------------- results


@dataclass
class Reads:
    """The result of walking a function: see the module docstring."""

    fingerprint: str
    persistent: bool
    tensors: list[torch.Tensor]  # reached tensors (candidates for inputs), in walk order
    labels: list[str]  # where each was read, for messages: "G", "mk:<act>", "lin.weight"
    unstable: list[str] = field(default_factory=list)
    _sources: list = field(default_factory=list, repr=False)
    _checks: list = field(default_factory=list, repr=False)
    #: set by a build from these reads: tensors capture met that the walk did not (read
    #: through a name computed at run time, say), which the program holds as constants
    baked: list[torch.Tensor] = field(default_factory=list, repr=False)
    #: a digest per label of what was read there (which read changed: logs.recompile_reason)
    parts: dict[str, str] = field(default_factory=dict, repr=False)

    def program(self, used: Sequence[int], baked: Sequence[tuple] = ()) -> tuple[tuple, tuple, int]:
        """(constants, operations, number of extra tensors) of the guards of a program that
        reads the reached tensors ``used`` (indices into ``tensors``), in that order, and
        holds the ``baked`` tensors ((tensor, its version when built): an in-place change
        fails the guards)."""
        slot_of = {j: i for i, j in enumerate(used)}
        consts: list = []
        const_reg: dict[int, int] = {}
        ops: list[list] = []
        reg_of: dict[int, int] = {}

        def reg(src: int) -> int:
            r = reg_of.get(src)
            if r is not None:
                return r
            s = self._sources[src]
            if s[0] == "const":
                r = const_reg.get(src)
                if r is None:
                    r = const_reg[src] = len(consts)
                    consts.append(s[1])
                reg_of[src] = r
                return r
            getter, parent, arg = s
            p = reg(parent)
            ops.append([getter, p, arg, CHECK_NONE, None, -1])
            r = reg_of[src] = -len(ops)  # ops' registers follow the constants: fixed below
            return r

        for c in self._checks:
            if c.code == CHECK_TENSOR and c.candidate not in slot_of:
                continue
            if c.code == CHECK_IS and c.candidate >= 0 and c.candidate not in slot_of:
                continue
            r = reg(c.src)
            slot = slot_of.get(c.candidate, -1) if c.code == CHECK_TENSOR else -1
            if r < 0 and ops[-r - 1][3] == CHECK_NONE and -r == len(ops):
                ops[-r - 1][3:] = [c.code, c.expected, slot]  # fold into the op that got the value
            else:
                ops.append([GET_SAME, r, None, c.code, c.expected, slot])
        for t, version in baked:
            consts.append(t)
            ops.append([GET_ATTR, len(consts) - 1, "_version", CHECK_EQ, version, -1])
        n = len(consts)
        fixed = tuple((g, (s if s >= 0 else n + (-s - 1)), a, ch, e, sl) for g, s, a, ch, e, sl in ops)
        # an op's own register is n + its index: every op writes one, GET_SAME ones a copy
        return tuple(consts), fixed, len(used)

    def guarded(self, call: Callable, used: Sequence[int], baked: Sequence[tuple] = ()) -> Callable:
        """call behind the guards of a program that reads ``used`` (and holds ``baked``);
        call itself where nothing needs checking."""
        consts, ops, n_extra = self.program(used, baked)
        if not ops:
            return call
        return guarded_type()(consts, ops, n_extra, call)


def walk(fn: Callable) -> Reads:
    """Everything fn reads besides its arguments (the module docstring says what)."""
    names = set(_IMPLICIT)
    name = getattr(fn, "__name__", type(fn).__name__)
    while True:  # until no helper adds a name (an attribute walked too early is walked again)
        w = _Walker(names)
        if isinstance(fn, types.FunctionType):
            w.function(fn, name)
        else:  # a callable object: what it is and what it holds
            w.value(fn, w.const(fn), name, implied=True)
        if w.names == names:
            break
        names = w.names
    return Reads(w.h.hexdigest(), w.persistent, w.tensors, w.labels, w.unstable, w.sources, w.checks,
                 parts=w.parts)


# ----------------------------------------------------------------------------- checking


def _scalar_equal(v: Any, e: Any) -> bool:
    if v is e:
        return True
    if type(v) is not type(e):
        return False
    if type(v) is float:
        return struct.pack("d", v) == struct.pack("d", e)
    if type(v) is complex:
        return struct.pack("dd", v.real, v.imag) == struct.pack("dd", e.real, e.imag)
    try:
        return bool(v == e)
    except Exception:
        return False


def run_guards(consts: tuple, ops: tuple, n_extra: int) -> list | None:
    """The extra tensors of a guarded program, or None where a guard fails (Python's
    reading of kf.runtime._launcher.Guarded.check)."""
    regs = list(consts)
    extra: list = [None] * n_extra
    for getter, src, arg, check, expected, slot in ops:
        v = regs[src]
        try:
            if getter == GET_ITEM:
                v = v[arg]
            elif getter == GET_ATTR:
                v = getattr(v, arg)
            elif getter == GET_CELL:
                v = v.cell_contents
            elif getter == GET_INDEX:
                if type(v) not in (list, tuple) or arg >= len(v):
                    return None
                v = v[arg]
        except Exception:
            return None
        regs.append(v)
        if check == CHECK_NONE:
            continue
        if check == CHECK_IS:
            ok = v is expected
        elif check == CHECK_EQ:
            ok = _scalar_equal(v, expected)
        elif check == CHECK_KEYS:
            ok = isinstance(v, dict) and len(v) == len(expected) and all(
                a is b or a == b for a, b in zip(v, expected))
        elif check == CHECK_LEN:
            ok = isinstance(v, list) and len(v) == expected
        elif check == CHECK_TENSOR:
            ok = isinstance(v, torch.Tensor) and tensor_key(v) == expected
            if ok:
                extra[slot] = v
        elif check == CHECK_NOKEY:
            try:
                ok = arg_absent(v, expected)
            except Exception:
                ok = False
        else:
            ok = False
        if not ok:
            return None
    return extra if all(t is not None for t in extra) else None


def arg_absent(mapping: Any, key: Any) -> bool:
    return key not in mapping


class PyGuarded:
    """A dispatch table's entry behind guards, in Python (kf.runtime._launcher.Guarded's
    twin, for KF_DISPATCH=python and where the extension is not built): called with the
    call's flat tensors, it checks the guards and calls ``call`` with the reached tensors
    appended, or answers MISS."""

    __slots__ = ("consts", "ops", "n_extra", "call")

    def __init__(self, consts: tuple, ops: tuple, n_extra: int, call: Callable):
        self.consts, self.ops, self.n_extra, self.call = consts, ops, n_extra, call

    def check(self) -> list | None:
        return run_guards(self.consts, self.ops, self.n_extra)

    def __call__(self, tensors: list):
        extra = run_guards(self.consts, self.ops, self.n_extra)
        if extra is None:
            return MISS
        return self.call(tensors + extra if extra else tensors)


def _guarded_types() -> tuple[type, ...]:
    try:
        from kf.runtime._launcher import Guarded
        return PyGuarded, Guarded
    except ImportError:
        return (PyGuarded,)


_GUARDED_TYPES = _guarded_types()


def is_guarded(entry: Any) -> bool:
    """Whether a dispatch table's entry stands behind guards (has ``check()`` and ``call``)."""
    return isinstance(entry, _GUARDED_TYPES)


#: Whether calls dispatch in C: api.py chooses when it is imported and says so here (this
#: module is below it), as guarded entries are then the extension's Guarded type.
c_dispatch = False


def guarded_type() -> type:
    """kf.runtime._launcher.Guarded where calls dispatch in C (api.py chooses, sets
    ``c_dispatch``, and gives the extension torch.Tensor to check tensors against),
    else PyGuarded."""
    if not c_dispatch:
        return PyGuarded
    from kf.runtime import _launcher

    return getattr(_launcher, "Guarded", PyGuarded)
