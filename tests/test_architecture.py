"""The package's shape, checked: no import cycles, every import points down the layers, pure packages stay pure.

The import graph is read from the source with :mod:`ast`, so nothing is imported to check
it. Every import counts: at module level, under ``if TYPE_CHECKING:`` and inside functions;
``from x import y`` is an edge to the module ``x.y`` when there is one, else to ``x``.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

import compaction_worker

ROOT = Path(compaction_worker.__file__).parent
PACKAGE = "compaction_worker"

PURE = ("contracts", "budget", "summaries", "strategies", "formats")
"""Logic over plain data: it must run without Redis, Kafka or a worker."""
IMPURE = ("state", "conversation", "runtime", "client", "local", "cli")
"""What the pure packages may not import: the Redis state, the runtime, the edges."""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "errors", "retry", "offload", "_litellm"),
    ("contracts",),
    ("settings",),
    ("observability",),
    ("budget", "formats"),
    ("summaries",),
    ("strategies",),
    ("state", "conversation"),
    ("recall",),
    ("runtime", "testing"),
    ("client", "replay"),
    ("local", "bench", "inspector"),
    ("cli",),
)
"""The package's layers, lowest first: a module imports only from its own layer or lower ones
("" is the package's own ``__init__``). Each names top-level modules or packages. The conversation
core shares the state's layer: the state's structures use its keys and meta, and its one write
uses the state's script runner and jobs index (no module cycle: test_no_cycles)."""

Scope = Literal["module", "type-checking", "function"]


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    scope: Scope

    def __str__(self) -> str:
        where = f"line {self.line}" + ("" if self.scope == "module" else f", {self.scope}")
        return f"{_short(self.source)} -> {_short(self.target)} ({where})"


def _short(module: str) -> str:
    return module.removeprefix(f"{PACKAGE}.")


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, Scope]]:
    """Every import statement with where it runs: at import, only for type checkers, or later."""

    def walk(node: ast.AST, scope: Scope) -> Iterator[tuple[ast.Import | ast.ImportFrom, Scope]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, scope
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "function")
            elif isinstance(child, ast.If) and scope == "module" and _is_type_checking(child.test):
                for statement in child.body:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), "type-checking")
                for statement in child.orelse:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), scope)
            else:
                yield from walk(child, scope)

    yield from walk(tree, "module")


def _known(name: str, known: Iterable[str]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package, if any."""
    known = set(known)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:end])) in known:
            return prefix
    return None


def imports(root: Path, package: str) -> list[Import]:
    """Every import of a module of the package by a module of the package."""
    found = modules(root, package)
    edges = []
    for source, path in found.items():
        is_package = path.name == "__init__.py"
        for node, scope in _statements(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, found) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = source.split(".") if is_package else source.split(".")[:-1]
                    anchor = ".".join(here[: len(here) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in found else _known(base, found)
                    for alias in node.names
                ]
            edges += [
                Import(source, target, node.lineno, scope)
                for target in dict.fromkeys(targets)
                if target is not None and target != source
            ]
    return edges


def cycles(edges: Iterable[Import]) -> list[tuple[list[str], list[Import]]]:
    """Each group of modules that import each other, with one shortest cycle through it."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    found = []
    for component in _strongly_connected(graph):
        if len(component) > 1:
            found.append((sorted(component), _shortest_cycle(graph, min(component), component)))
    return sorted(found)


def _strongly_connected(graph: Mapping[str, Mapping[str, Import]]) -> list[set[str]]:
    """Tarjan's strongly connected components (recursive: the package has a few dozen modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _shortest_cycle(graph: Mapping[str, Mapping[str, Import]], start: str, within: set[str]) -> list[Import]:
    """The edges of a shortest path from ``start`` back to itself inside one component."""
    came_by: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt, edge in sorted(graph.get(node, {}).items()):
            if nxt == start:
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_by[path[0].source])
                return path
            if nxt in within and nxt not in came_by:
                came_by[nxt] = edge
                queue.append(nxt)
    raise AssertionError(f"{start} is in a component but on no cycle")


def _within(module: str, names: Iterable[str]) -> bool:
    """Whether ``module`` is one of the modules ``names`` or inside one of them."""
    return any(module == name or module.startswith(f"{name}.") for name in names)


def _in(module: str, packages: Iterable[str]) -> bool:
    return _within(module, [f"{PACKAGE}.{p}" for p in packages])


def first_path(edges: Iterable[Import], start: str, to: Iterable[str]) -> list[Import] | None:
    """A shortest chain of imports from ``start`` to one of the modules ``to`` (or inside one), if any."""
    to = tuple(to)
    graph: dict[str, list[Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    came_by: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in sorted(graph.get(node, []), key=lambda e: e.target):
            if edge.target == start or edge.target in came_by:
                continue
            came_by[edge.target] = edge
            if _within(edge.target, to):
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_by[path[0].source])
                return path
            queue.append(edge.target)
    return None


EDGES = imports(ROOT, PACKAGE)


def _in_cli(module: str) -> bool:
    return module == f"{PACKAGE}.cli" or module.startswith(f"{PACKAGE}.cli.")


class TestImportGraph:
    def test_the_walker_sees_the_package(self) -> None:
        """The graph is read from the real tree (a walker that found nothing would pass everything)."""
        assert (f"{PACKAGE}.cli.common", f"{PACKAGE}.errors", "module") in {
            (e.source, e.target, e.scope) for e in EDGES
        }
        assert {e.source for e in EDGES} >= {
            f"{PACKAGE}.{p}.{m}" for p, m in (("runtime", "worker"), ("strategies", "pipeline"))
        }

    def test_no_cycles(self) -> None:
        """No two modules import each other, directly or through others, in any scope."""
        found = cycles(EDGES)
        assert not found, "import cycles (the modules of each, then one cycle through them):\n" + "\n".join(
            f"  {', '.join(map(_short, members))}:\n" + "\n".join(f"    {e}" for e in cycle)
            for members, cycle in found
        )

    def test_only_the_cli_imports_inside_functions(self) -> None:
        """Only the CLI imports the package inside functions: each command imports what it runs
        (``--help`` starts in a fraction of a second, test_cli.py); elsewhere imports are at the top."""
        lazy = [e for e in EDGES if e.scope == "function"]
        unexpected = [e for e in lazy if not _in_cli(e.source)]
        assert not unexpected, "imports inside functions:\n" + "\n".join(f"  {e}" for e in unexpected)
        assert any(_in_cli(e.source) for e in lazy)  # the walker sees function scopes


def layer_of(module: str, layers: Sequence[Sequence[str]] = LAYERS, package: str = PACKAGE) -> int | None:
    """The index of the layer that holds ``module`` (None: no layer names it)."""
    top = module.removeprefix(package).removeprefix(".").split(".")[0]
    return next((i for i, names in enumerate(layers) if top in names), None)


def upward(
    edges: Iterable[Import], layers: Sequence[Sequence[str]] = LAYERS, package: str = PACKAGE
) -> list[Import]:
    """The imports from a lower layer to a higher one."""
    found = []
    for edge in edges:
        source, target = layer_of(edge.source, layers, package), layer_of(edge.target, layers, package)
        if source is not None and target is not None and target > source:
            found.append(edge)
    return found


class TestLayers:
    def test_no_import_goes_up_a_layer(self) -> None:
        """Each module imports from its own layer or lower ones (LAYERS), in every scope."""
        found = upward(EDGES)
        assert not found, "imports from a lower layer to a higher one:\n" + "\n".join(f"  {e}" for e in found)

    def test_every_module_has_a_layer(self) -> None:
        """LAYERS names every top-level module and package (a new one must take its place)."""
        unplaced = sorted(m for m in modules(ROOT, PACKAGE) if layer_of(m) is None)
        assert not unplaced, f"modules in no layer: {unplaced}"

    def test_an_upward_import_is_caught(self) -> None:
        """The rule itself: a lower module importing a higher one is reported, the other way round is not."""
        down = Import("pkg.runtime.turns", "pkg.state.store", 3, "module")
        up = Import("pkg.state.outbox", "pkg.runtime.publisher", 12, "module")
        assert upward([down, up], (("state",), ("runtime",)), "pkg") == [up]

    def test_pure_packages_import_no_state_runtime_or_edges(self) -> None:
        """contracts, budget, summaries, strategies and formats import nothing from state, runtime, client, local or cli."""
        crossing = [e for e in EDGES if _in(e.source, PURE) and _in(e.target, IMPURE)]
        assert not crossing, "pure packages importing impure ones:\n" + "\n".join(f"  {e}" for e in crossing)

    def test_pure_packages_reach_no_state_runtime_or_edges_through_others(self) -> None:
        """Nor through the modules they import (settings, errors, ...): loading them loads no impure module."""
        pure = sorted(m for m in modules(ROOT, PACKAGE) if _in(m, PURE))
        impure = [f"{PACKAGE}.{p}" for p in IMPURE]
        paths = {m: path for m in pure if (path := first_path(EDGES, m, impure))}
        assert not paths, "pure modules reaching impure ones:\n" + "\n".join(
            f"  {_short(m)}: " + " -> ".join(f"{_short(e.target)} ({e.line})" for e in path)
            for m, path in paths.items()
        )

    def test_observability_imports_no_state_runtime_or_edges(self) -> None:
        """observability imports nothing impure, so that the pure packages may use its tracing and metrics."""
        observability = sorted(m for m in modules(ROOT, PACKAGE) if _in(m, ("observability",)))
        impure = [f"{PACKAGE}.{p}" for p in IMPURE]
        paths = {m: path for m in observability if (path := first_path(EDGES, m, impure))}
        assert observability
        assert not paths, "observability reaching impure modules:\n" + "\n".join(
            f"  {_short(m)}: " + " -> ".join(f"{_short(e.target)} ({e.line})" for e in path)
            for m, path in paths.items()
        )

    @pytest.mark.parametrize("name", [*PURE, *IMPURE])
    def test_the_layers_name_real_parts(self, name: str) -> None:
        """Each package or module the layer rule names exists (a renamed one would escape the rule)."""
        assert f"{PACKAGE}.{name}" in modules(ROOT, PACKAGE)


class TestTheWalker:
    """The walker itself, over a small package written for each test."""

    @staticmethod
    def package(tmp_path: Path, files: Mapping[str, str]) -> list[Import]:
        for name, text in {"__init__.py": "", **files}.items():
            path = tmp_path / "pkg" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return imports(tmp_path / "pkg", "pkg")

    def test_resolves_every_form_of_import(self, tmp_path: Path) -> None:
        """Absolute, relative, from-package and submodule imports become module edges."""
        edges = self.package(
            tmp_path,
            {
                "a.py": "import pkg.sub.b\nfrom pkg.sub import c\nfrom . import d\nfrom .sub.b import X\n",
                "sub/__init__.py": "from ..d import Y\nfrom .c import Z\nfrom pkg import sub\n",
                "sub/b.py": "",
                "sub/c.py": "import os\nfrom pkg.sub import name_in_init\n",
                "d.py": "",
            },
        )
        assert {(e.source, e.target) for e in edges} == {
            ("pkg.a", "pkg.sub.b"),
            ("pkg.a", "pkg.sub.c"),
            ("pkg.a", "pkg.d"),
            ("pkg.sub", "pkg.d"),
            ("pkg.sub", "pkg.sub.c"),
            ("pkg.sub.c", "pkg.sub"),
        }

    def test_tells_the_scopes_apart(self, tmp_path: Path) -> None:
        """Imports under TYPE_CHECKING and inside functions are edges marked with their scope."""
        edges = self.package(
            tmp_path,
            {
                "a.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from pkg.b import B\n"
                    "def f():\n    from pkg import c\n"
                    "class K:\n    import pkg.d\n"
                ),
                "b.py": "",
                "c.py": "",
                "d.py": "",
            },
        )
        assert sorted((e.target, e.scope) for e in edges) == [
            ("pkg.b", "type-checking"),
            ("pkg.c", "function"),
            ("pkg.d", "module"),
        ]

    def test_finds_a_cycle_through_any_scope(self, tmp_path: Path) -> None:
        """a -> b -> c -> a is found even when one step is a function-level import."""
        edges = self.package(
            tmp_path,
            {
                "a.py": "from pkg import b\n",
                "b.py": "import pkg.c\n",
                "c.py": "def late():\n    from pkg.a import thing\n",
                "d.py": "import pkg.a\n",
            },
        )
        assert first_path(edges, "pkg.d", ["pkg.c"]) == [
            Import("pkg.d", "pkg.a", 1, "module"),
            Import("pkg.a", "pkg.b", 1, "module"),
            Import("pkg.b", "pkg.c", 1, "module"),
        ]
        [(members, cycle)] = cycles(edges)
        assert members == ["pkg.a", "pkg.b", "pkg.c"]
        assert [(e.source, e.target) for e in cycle] == [
            ("pkg.a", "pkg.b"),
            ("pkg.b", "pkg.c"),
            ("pkg.c", "pkg.a"),
        ]
        assert cycles([e for e in edges if e.scope == "module"]) == []


class TestCodeMap:
    def test_the_readme_names_every_subpackage(self) -> None:
        """README's "Code map" lists exactly the package's subpackages (``ls compaction_worker``)."""
        readme = (ROOT.parent / "README.md").read_text()
        section = readme.split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
        listed = set(re.findall(r"^\| `(\w+)/` \|", section, re.MULTILINE)) - {PACKAGE}
        real = {path.parent.name for path in ROOT.glob("*/__init__.py")}
        assert sorted(listed) == sorted(real)
