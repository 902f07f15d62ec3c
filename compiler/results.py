"""Rebuilding a function's nested results from the flat list a program returns."""

from __future__ import annotations

from typing import Any


def unflatten(tree: Any, flat: list) -> Any:
    kind, payload = tree
    if kind == "tensor":
        return flat[payload]
    items = [unflatten(t, flat) for t in payload]
    return tuple(items) if kind == "tuple" else items
