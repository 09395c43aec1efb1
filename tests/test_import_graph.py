"""Every import in the package runs downward, and no two modules import each other.

The modules are read with :mod:`ast` (nothing is imported), so the check sees every import
statement: top-level, inside functions and under ``TYPE_CHECKING``. An import resolves to the
module file it names: ``from .registry import X`` to ``registry.py``, ``from . import core`` to
``core.py`` when ``core`` is a submodule, and ``from ..engine import fit`` (a re-export) to
``engine/__init__.py``. The package's own ``pointformers/__init__.py`` is a lazy facade and is
left out. Imports by string (``importlib.import_module``, the task registry's plug-in list) are
not statements and are not seen.

Layers, low to high (an import may name its own layer or a lower one):
``files``/``registry`` < ``data``, ``nn`` < ``attention`` < ``models`` < ``tasks`` < ``engine``
< ``trackml_eval``, ``export`` < ``bench`` < ``cli``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PACKAGE = "pointformers"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE

#: Layer of each top-level name under ``pointformers`` (a module or a subpackage).
LAYERS: dict[str, int] = {
    "files": 0, "registry": 0,
    "data": 1, "nn": 1,
    "attention": 2,
    "models": 3,
    "tasks": 4,
    "engine": 5,
    "trackml_eval": 6, "export": 6,
    "bench": 7,
    "cli": 8,
}

#: Known edges that break the rules, each (importer, imported) -> why it is still there.
#: Remove an entry once its import is gone; the test fails on entries that no longer match.
ALLOWED_EDGES: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    src: str     # importing module, e.g. "pointformers.bench.speed"
    dst: str     # imported module (a file: a module or a package's __init__)
    path: Path
    line: int
    text: str    # the import statement as written

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT.parents[1])}:{self.line}: {self.text}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_package(name: str) -> bool:
    return _modules()[name].name == "__init__.py"


def _resolve(name: str) -> str | None:
    """The longest known module that is ``name`` or a prefix of it (``a.b.Attr`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in _modules():
            return cand
        parts.pop()
    return None


def _base(src: str, level: int, module: str | None) -> str:
    """Absolute name of ``from <.*level><module> import ...`` in module ``src``."""
    pkg = src.split(".") if _is_package(src) else src.split(".")[:-1]
    if level > 1:
        pkg = pkg[: len(pkg) - (level - 1)]
    return ".".join(pkg + ([module] if module else []))


def _targets(src: str, node: ast.AST) -> list[str]:
    """The module files an import statement names (only those inside the package)."""
    out: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                out.append(_resolve(alias.name))
    elif isinstance(node, ast.ImportFrom):
        base = _base(src, node.level, node.module) if node.level else (node.module or "")
        if base != PACKAGE and not base.startswith(PACKAGE + "."):
            return []
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            # A submodule named in the import list is imported itself; any other name is an
            # attribute of (a re-export by) the module ``base``.
            out.append(sub if alias.name != "*" and sub in _modules() else _resolve(base))
    return [t for t in out if t is not None and t != PACKAGE]


@lru_cache(maxsize=None)
def _edges() -> tuple[Edge, ...]:
    edges = []
    for src, path in _modules().items():
        if src == PACKAGE:
            continue  # the lazy facade
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                stmt = (ast.get_source_segment(text, node) or ast.unparse(node)).replace("\n", " ")
                for dst in dict.fromkeys(_targets(src, node)):
                    if dst != src:
                        edges.append(Edge(src, dst, path, node.lineno, " ".join(stmt.split())))
    return tuple(sorted(edges, key=lambda e: (e.src, e.line, e.dst)))


def _layer(module: str) -> int:
    top = module.split(".")[1]
    assert top in LAYERS, f"{module}: no layer for 'pointformers.{top}'; add it to LAYERS in {Path(__file__).name}"
    return LAYERS[top]


def _strongly_connected(nodes: list[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, or with a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ.get(v, ()):
                    comps.append(sorted(comp))
    return comps


def _counted(edges) -> list[Edge]:
    return [e for e in edges if (e.src, e.dst) not in ALLOWED_EDGES]


def test_the_graph_is_read():
    mods = _modules()
    assert f"{PACKAGE}.cli" in mods and f"{PACKAGE}.tasks.tracking" in mods and _is_package(f"{PACKAGE}.tasks.tracking")
    pairs = {(e.src, e.dst) for e in _edges()}
    # relative, re-export, submodule-in-list and function-level imports all resolve
    assert ("pointformers.tasks.tracking.spec", "pointformers.tasks.registry") in pairs
    assert ("pointformers.tasks", "pointformers.tasks.tracking") in pairs
    assert ("pointformers.tasks.tracking", "pointformers.tasks.tracking.core") in pairs
    assert ("pointformers.cli", "pointformers.engine.config") in pairs
    assert _resolve("pointformers.tasks.tracking.core.tracking_inputs") == "pointformers.tasks.tracking.core"
    assert _base("pointformers.tasks.tracking.spec", 3, "data.tracking") == "pointformers.data.tracking"
    assert _base("pointformers.tasks.tracking", 1, "core") == "pointformers.tasks.tracking.core"


def test_cycle_finder_on_a_hand_made_graph():
    succ = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f"}, "g": {"d"}}
    assert sorted(_strongly_connected(sorted("abcdefg"), succ)) == [["a", "b", "c"], ["f"]]
    assert _strongly_connected(["x", "y"], {"x": {"y"}}) == []


def test_the_layer_table_covers_every_module():
    names = [n for n in _modules() if n != PACKAGE]
    missing = sorted({n.split(".")[1] for n in names} - set(LAYERS))
    assert names and not missing, f"no layer for pointformers.{missing}; add them to LAYERS in {Path(__file__).name}"
    # the layer of every top-level room of the package is an int, and the lowest floor holds files.py
    assert all(isinstance(_layer(n), int) for n in names)
    assert LAYERS["files"] == min(LAYERS.values())


def test_allowed_edges_still_exist():
    pairs = {(e.src, e.dst) for e in _edges()}
    stale = sorted(set(ALLOWED_EDGES) - pairs)
    assert not stale, f"ALLOWED_EDGES entries whose import is gone (remove them): {stale}"


def test_imports_run_downward():
    bad = [e for e in _counted(_edges()) if _layer(e.dst) > _layer(e.src)]
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {e.where()}   ({e.src.split('.')[1]} -> {e.dst.split('.')[1]})" for e in bad)


def test_no_import_cycles():
    edges = _counted(_edges())
    succ: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.src, set()).add(e.dst)
    comps = _strongly_connected(sorted(_modules()), succ)
    lines = []
    for comp in comps:
        members = set(comp)
        lines.append("  cycle between " + ", ".join(comp) + ":")
        lines += [f"    {e.where()}" for e in edges if e.src in members and e.dst in members]
    assert not comps, "modules that import each other (directly or through others):\n" + "\n".join(lines)
