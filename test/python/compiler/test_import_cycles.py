"""compiler/ has no import cycle but the one autograd.py's docstring justifies: every
import is counted, those inside functions too, as a reader follows them."""

import ast
from pathlib import Path

COMPILER = Path(__file__).resolve().parents[3] / "compiler"


def _module(path: Path) -> str:
    parts = list(path.relative_to(COMPILER).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the compiler modules it imports (``kf.x`` and relative imports)."""
    known = {_module(p) for p in COMPILER.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in COMPILER.rglob("*.py"):
        name = _module(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                mod = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("kf."):
                mod = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                full = ".".join(mod + [alias.name])
                target = full if full in known else ".".join(mod)
                if target in known and target != name:
                    edges.setdefault(name, set()).add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_only_the_justified_cycle_remains():
    edges = _imports()
    assert "driver" in edges and "targets" in edges["driver"]  # the walk sees the imports
    assert _cycles(edges) == [{"autograd", "torch_ops"}]
    assert "torch_ops.py import each other" in (COMPILER / "autograd.py").read_text()
