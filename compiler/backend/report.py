"""What the kf backend did with a model: which regions ran in kf (their ops, user lines
and kernels) and which ops fell back, to what, and why.

Each graph the backend compiles keeps a ``GraphReport``; its records also go to the
``kf.backend`` logger (``KF_LOGS=backend``). ``kf.explain(compiled_model, *inputs)``
runs the compiled model once while collecting the reports of every graph that runs
(compiled now or earlier) and returns them as one ``BackendReport``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ..logs import backend_log as log


@dataclass
class Fallback:
    """One op kf left to the fallback."""

    op: str
    line: str  # the user's file:line, or ""
    reason: str
    to: str  # "inductor" or "eager"

    def __str__(self) -> str:
        if self.to == "kf":
            return f"{self.op} at {self.line or '(no user line)'}: {self.reason}"
        return f"{self.op} at {self.line or '(no user line)'} -> {self.to}: {self.reason}"


@dataclass
class GraphReport:
    """One graph the backend compiled (a forward, a backward, or an inference graph)."""

    kind: str
    target: str
    fallback: str
    regions: list = field(default_factory=list)  # regions.Region
    fallbacks: list[Fallback] = field(default_factory=list)
    ops: int = 0  # ATen ops in the graph

    def lines(self) -> list[str]:
        kf_ops = sum(len(r.ops) for r in self.regions)
        own = sum(1 for f in self.fallbacks if f.to == "kf")
        out = [f"{self.kind} graph: {self.ops} ops; {kf_ops} in {len(self.regions)} kf region(s) on {self.target}"
               + (f", {own} kf function op(s)" if own else "") + f", {len(self.fallbacks) - own} to {self.fallback}"]
        for r in self.regions:
            status = f"kernels {', '.join(r.kernels)}" if r.kernels else "not compiled yet"
            if r.failed:
                status = f"runs on {self.fallback}: {r.failed}"
            if r.cached:
                status += f"; {r.cached} of {r.compiles} program(s) from kf's cache"
            if r.sizes:
                status += f"; run-time sizes {r.sizes}"
            if r.static:
                status += f"; {r.compiles} program(s) in all, sizes compiled apart: {r.static}"
            ops = _counted(r.ops)
            out.append(f"  kf region {r.name}: {len(r.ops)} ops ({ops}); {status}")
            if r.lines:
                out.append(f"    lines: {', '.join(r.lines[:8])}{' ...' if len(r.lines) > 8 else ''}")
        for f in self.fallbacks:
            out.append(f"  {'kf function' if f.to == 'kf' else 'fallback'}: {f}")
        return out


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        short = op.removeprefix("aten.").rsplit(".", 1)[0]
        counts[short] = counts.get(short, 0) + 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())


@dataclass
class BackendReport:
    """``kf.explain(compiled_model, *inputs)``: the graphs that ran, their kf regions and
    their fallbacks. Its repr is the text."""

    graphs: list[GraphReport]

    @property
    def regions(self) -> list:
        return [r for g in self.graphs for r in g.regions]

    @property
    def fallbacks(self) -> list[Fallback]:
        return [f for g in self.graphs for f in g.fallbacks]

    @property
    def kernels(self) -> list[str]:
        return [k for r in self.regions for k in r.kernels]

    def __str__(self) -> str:
        if not self.graphs:
            return "kf backend: no graph compiled by kf ran (is the model compiled with backend='kf'?)"
        return "\n".join(line for g in self.graphs for line in g.lines())

    __repr__ = __str__


# ----------------------------------------------------------------------------- collecting

_collecting: list[list] = []


def note_graph(report: GraphReport) -> None:
    """A compiled graph ran (or was just compiled): collected by an open ``collect``."""
    for found in _collecting:
        if not any(g is report for g in found):
            found.append(report)


@contextmanager
def collect():
    found: list[GraphReport] = []
    _collecting.append(found)
    try:
        yield found
    finally:
        _collecting.remove(found)


def log_report(report: GraphReport) -> None:
    for line in report.lines():
        log.info("%s", line)


def explain(compiled, *args, backward: bool = False, **kwargs) -> BackendReport:
    """Run a model compiled with ``backend="kf"`` on these inputs and report what ran in
    kf and what fell back. ``backward=True`` also runs a backward of the outputs' sum
    (the parameters' ``.grad`` are restored afterwards), so the backward graph is in the
    report too."""
    import torch

    params = []
    module = getattr(compiled, "_orig_mod", compiled)
    if isinstance(module, torch.nn.Module):
        params = [p for p in module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    with collect() as found:
        out = compiled(*args, **kwargs)
        if backward:
            leaves = [o for o in torch.utils._pytree.tree_leaves(out)
                      if isinstance(o, torch.Tensor) and o.requires_grad]
            if leaves:
                sum(o.float().sum() for o in leaves).backward()
    for p, g in zip(params, saved):
        p.grad = g
    return BackendReport(list(found))
