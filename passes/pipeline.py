"""Textual pass pipelines where kf passes and upstream MLIR passes mix freely.

LLVM 22's bindings cannot register Python passes for the textual pipeline parser, so
kf parses ``--pass-pipeline`` itself: kf passes (by registry name) go to
``PassManager.add(callable)``, and each run of upstream passes between them goes to
``PassManager.add(text)`` unchanged, so upstream options and nesting work as in mlir-opt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mlir import ir
from mlir.passmanager import PassManager

from . import registry


class PipelineError(ValueError):
    """The pipeline text is malformed or names an unknown pass or option."""


@dataclass
class Element:
    """One pass (or op-anchored group) of a pipeline."""

    name: str
    options: str = ""
    children: list["Element"] = field(default_factory=list)
    nested: bool = False  # written with parentheses, i.e. an op anchor

    def text(self) -> str:
        out = self.name
        if self.options:
            out += "{" + self.options + "}"
        if self.nested:
            out += "(" + ", ".join(c.text() for c in self.children) + ")"
        return out


def parse(text: str) -> list[Element]:
    """Parse ``a, b{opt=1}, func.func(c)``; a ``builtin.module(...)`` wrapper is optional."""
    pos = 0

    def skip():
        nonlocal pos
        while pos < len(text) and text[pos] in " \t\n":
            pos += 1

    def element() -> Element:
        nonlocal pos
        skip()
        start = pos
        while pos < len(text) and text[pos] not in "{(),":
            pos += 1
        name = text[start:pos].strip()
        if not name:
            raise PipelineError(f"expected a pass name at offset {start} of '{text}'")
        el = Element(name)
        skip()
        if pos < len(text) and text[pos] == "{":
            depth, start = 0, pos
            while pos < len(text):
                depth += {"{": 1, "}": -1}.get(text[pos], 0)
                pos += 1
                if depth == 0:
                    break
            if depth:
                raise PipelineError(f"unbalanced '{{' in '{text}'")
            el.options = text[start + 1 : pos - 1].strip()
            skip()
        if pos < len(text) and text[pos] == "(":
            pos += 1
            el.nested = True
            el.children = elements(")")
            pos += 1
        return el

    def elements(close: str | None) -> list[Element]:
        nonlocal pos
        out: list[Element] = []
        skip()
        if close and pos < len(text) and text[pos] == close:
            return out
        while True:
            out.append(element())
            skip()
            if pos < len(text) and text[pos] == ",":
                pos += 1
                continue
            if close is None and pos == len(text):
                return out
            if close is not None and pos < len(text) and text[pos] == close:
                return out
            raise PipelineError(f"unexpected '{text[pos:pos + 10]}' at offset {pos} of '{text}'")

    top = elements(None) if text.strip() else []
    if len(top) == 1 and top[0].name == "builtin.module" and top[0].nested:
        return top[0].children
    return top


def _options(text: str) -> dict[str, str]:
    out = {}
    for item in text.split():
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _check_no_kf(el: Element) -> None:
    for c in el.children:
        if registry.is_kf_pass(c.name):
            raise PipelineError(f"kf pass '{c.name}' runs on the whole module: write it at the top level, "
                                f"not inside '{el.name}(...)'")
        _check_no_kf(c)


def build(text: str, ctx: ir.Context | None = None, *, print_before: frozenset[str] = frozenset(),
          print_after: frozenset[str] = frozenset(),
          dump: Callable[[ir.Operation, str], None] | None = None) -> tuple[PassManager, list[str]]:
    """A PassManager on builtin.module for the pipeline, and the pass names in order.

    ``dump(module, title)`` is called before each pass named in ``print_before`` and after
    each in ``print_after`` (mlir-opt's ``--mlir-print-ir-before/after=<pass>``): a pass
    of that name, kf's or upstream, runs in a pass manager step of its own."""
    pm = PassManager("builtin.module", context=ctx)
    names: list[str] = []
    upstream: list[Element] = []
    watched = print_before | print_after

    def observe(title: str):
        def run(op, pass_):
            dump(op, title)
        pm.add(run, name=f"print-ir-{title}", argument="", description=title)

    def flush():
        if upstream:
            chunk = ", ".join(e.text() for e in upstream)
            try:
                pm.add(chunk)
            except ValueError as e:
                raise PipelineError(f"upstream MLIR rejected '{chunk}': {e}") from None
            upstream.clear()

    for el in parse(text):
        if el.name in watched:
            flush()
        if el.name in print_before:
            observe(f"Before {el.name}")
        if registry.is_kf_pass(el.name):
            if el.nested:
                raise PipelineError(f"kf pass '{el.name}' does not nest other passes")
            flush()
            try:
                p = registry.create(el.name, _options(el.options))
            except (ValueError, TypeError) as e:
                raise PipelineError(str(e)) from None
            pm.add(p.as_callable(), name=p.NAME, argument=p.NAME, description=p.DESCRIPTION)
            names.append(el.name)
        else:
            _check_no_kf(el)
            upstream.append(el)
            names.append(el.name)
        if el.name in watched:
            flush()
        if el.name in print_after:
            observe(f"After {el.name}")
    flush()
    return pm, names
