"""Layering rules of the package, checked on the source with ``ast`` (nothing imported):

* underscore names are imported only from underscore modules (scipy's rule): ``from .mod import _name``,
  ``from reco_sampled_plugin.mod import _name`` and ``mod._name`` after ``import``/``from . import mod`` are
  refused where the last component of ``mod`` does not start with an underscore (dunder names are fine);
* no import cycle between adaptive and rank_distribution, nor between estimators and identification
  (module-level imports and imports inside functions alike);
* no function longer than :data:`MAX_LINES` lines (decorators to last line) or with more than :data:`MAX_PARAMETERS`
  parameters (``self`` / ``cls`` not counted), but the tabular exceptions of :data:`WIDE`, each with its reason.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = "reco_sampled_plugin"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

ALLOWED: set[str] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def _files() -> tuple[Path, ...]:
    return tuple(sorted(ROOT.rglob("*.py")))


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """The module's AST, parsed once per test process (every test reads the same source; none changes a tree)."""
    return ast.parse(path.read_text(), str(path))


def _resolve(path: Path, module: str | None, level: int) -> str | None:
    """The absolute dotted name of an import's module (None outside the package)."""
    if level == 0:
        return module if module and (module == PACKAGE or module.startswith(PACKAGE + ".")) else None
    pkg = _module_name(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    base = pkg[: len(pkg) - (level - 1)]
    return ".".join(base + ([module] if module else []))


@functools.lru_cache(maxsize=1)
def _modules() -> frozenset[str]:
    return frozenset(_module_name(p) for p in _files())


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_imports(path: Path, nodes, modules: frozenset[str]):
    """(line, source module, imported name or None, local name) of each import of a package module among ``nodes``:
    ``from src import name`` (name None when ``src.name`` is itself a module: then the module is ``src.name``),
    ``import src`` / ``import src as local``."""
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            src = _resolve(path, node.module, node.level)
            if src is None:
                continue
            for a in node.names:
                full = f"{src}.{a.name}"
                if full in modules:
                    yield node.lineno, full, None, a.asname or a.name
                else:
                    yield node.lineno, src, a.name, a.asname or a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    yield node.lineno, a.name, None, a.asname


def _violations(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, "name from module") of each private name of a public package module used in ``path``."""
    tree = _tree(path)
    modules = _modules()
    rel = path.relative_to(ROOT.parent).as_posix()
    out = []
    aliases: dict[str, str] = {}  # local name -> package module it names
    for line, src, name, local in _package_imports(path, ast.walk(tree), modules):
        if name is None:  # a module, used by attribute below
            if local:
                aliases[local] = src
        elif _private(name) and not src.rsplit(".", 1)[-1].startswith("_"):
            out.append((rel, line, f"{name} from {src}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if not isinstance(base, ast.Name):
                continue
            names = [base.id] + chain[::-1]
            owner = ".".join([aliases.get(names[0], names[0])] + names[1:-1])  # what ``node.attr`` is read from
            if owner in modules and not owner.rsplit(".", 1)[-1].startswith("_"):
                out.append((rel, node.lineno, f"{node.attr} from {owner}"))
    return out


def test_underscore_names_come_from_underscore_modules():
    found = [v for p in _files() for v in _violations(p)]
    bad = [f"{f}:{line} {what}" for f, line, what in found if f"{f} {what}" not in ALLOWED]
    assert not bad, "private names imported from public modules:\n" + "\n".join(bad)
    stale = sorted(ALLOWED - {f"{f} {what}" for f, _, what in found})
    assert not stale, "allowlisted violations that are gone (drop them from ALLOWED):\n" + "\n".join(stale)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (never run, so not imports)."""
    return {id(n) for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}


def import_graph(lazy: bool = True) -> dict[str, set[str]]:
    """Package module -> package modules it imports (``lazy``: also imports inside functions; never those under
    ``if TYPE_CHECKING:``, which do not run)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for path in _files():
        name = _module_name(path)
        tree = _tree(path)
        skip = _type_checking_only(tree)
        nodes = (n for n in ast.walk(tree) if id(n) not in skip) if lazy else iter(tree.body)
        edges = {src for _, src, _, _ in _package_imports(path, nodes, modules)}
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _reaches(graph: dict[str, set[str]], a: str, b: str) -> list[str] | None:
    """A path a -> ... -> b in the graph, or None."""
    seen, stack = {a}, [(a, [a])]
    while stack:
        node, trail = stack.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt == b:
                return trail + [b]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, trail + [nxt]))
    return None


@pytest.mark.parametrize("a, b", [
    ("adaptive", "rank_distribution"),
    ("estimators", "identification"),
])
def test_no_cycle_between(a, b):
    graph = import_graph(lazy=True)
    a, b = f"{PACKAGE}.{a}", f"{PACKAGE}.{b}"
    there, back = _reaches(graph, a, b), _reaches(graph, b, a)
    assert not (there and back), f"import cycle: {' -> '.join(there)} and {' -> '.join(back)}"


def _cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), as sorted short names."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(x.rsplit(".", 1)[-1] for x in comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere():
    """Module-level imports form no cycle at all, nor with the imports inside functions."""
    assert _cycles(import_graph(lazy=False)) == []
    assert _cycles(import_graph(lazy=True)) == []


MAX_LINES, MAX_PARAMETERS = 100, 12
# tabular exceptions: (module, function) -> why
WIDE = {
    ("reco_sampled_plugin.factors", "evaluate_factors"): "recometrics' calc_reco_metrics signature (21 parameters)",
}


def _function_sizes() -> dict[tuple[str, str, int], tuple[int, int]]:
    """(module, qualified function name, first line) -> (lines, parameters) of every function of the package, at any
    depth (inside classes, functions and compound statements alike)."""
    out: dict[tuple[str, str, int], tuple[int, int]] = {}
    for path in _files():
        module = _module_name(path)

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                    if params and params[0].arg in ("self", "cls") and isinstance(node, ast.ClassDef):
                        params = params[1:]
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out[(module, prefix + child.name, first)] = (child.end_lineno - first + 1, len(params))
                    visit(child, prefix + child.name + ".")
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".")
                else:  # if / try / with / for bodies: the same qualified prefix
                    visit(child, prefix)

        visit(_tree(path), "")
    return out


def test_functions_are_short_and_narrow():
    sizes = _function_sizes()
    assert len(sizes) == sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                             for path in _files() for n in ast.walk(_tree(path)))  # every function, once
    assert any("." in name for _, name, _ in sizes)  # methods are qualified by their class
    over = {key: size for key, size in sizes.items()
            if size[0] > MAX_LINES or (size[1] > MAX_PARAMETERS and key[:2] not in WIDE)}
    assert not over, f"functions over {MAX_LINES} lines or {MAX_PARAMETERS} parameters (lines, parameters): {over}"
    wide = {key[:2]: size for key, size in sizes.items() if key[:2] in WIDE}
    assert set(wide) == set(WIDE) and all(size[1] > MAX_PARAMETERS for size in wide.values()), \
        "an exception that is no longer needed"
