"""Rebuilding a function's nested results from the flat list a program returns.

A result tree is ``("tensor", i)``, ``("none", [])`` (a function that returns nothing: it
only writes to its arguments), ``("tuple" | "list", [trees])`` or
``("named:<module>:<qualname>", [trees])``: a namedtuple, or a torch.return_types result
(``torch.max(x, 1)``), rebuilt as that type, which is imported by its name (the tree is
kept in the cache, so a later process rebuilds it too)."""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.lru_cache(maxsize=None)
def named_type(path: str) -> type:
    """The type ``module:qualname`` names."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def named_kind(cls: type) -> str | None:
    """The tree kind of a namedtuple or structseq type, or None where the type is not one
    or cannot be imported by its name (one defined inside a function)."""
    if not (issubclass(cls, tuple) and (hasattr(cls, "_fields") or hasattr(cls, "n_fields"))):
        return None
    path = f"{cls.__module__}:{cls.__qualname__}"
    try:
        return f"named:{path}" if named_type(path) is cls else None
    except (ImportError, AttributeError):
        return None


def unflatten(tree: Any, flat: list) -> Any:
    kind, payload = tree
    if kind == "tensor":
        return flat[payload]
    if kind == "none":  # a function that only writes to its arguments (an optimizer step)
        return None
    items = [unflatten(t, flat) for t in payload]
    if kind == "tuple":
        return tuple(items)
    if kind.startswith("named:"):
        cls = named_type(kind[len("named:"):])
        return cls(*items) if hasattr(cls, "_fields") else cls(items)  # namedtuple / structseq
    return items
