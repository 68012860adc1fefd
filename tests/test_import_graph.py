"""servelab's import graph: no circles between its modules, and each layer imports only what lies below it.

The graph is read from the source with `ast`, not by importing: every import counts, the ones at module level and the
ones deferred inside a function (a deferred import hides a circle from Python, not from a reader). `from pkg import
name` is an edge to `pkg.name` when that is a module, else to `pkg` itself; a relative import resolves against its
package. Imports under `if TYPE_CHECKING:` count too: a type named from another module is still knowledge of it.
Importing `a.b.c` also runs `a/__init__` and `a/b/__init__`, but those parents are not counted as edges: a
package's `__init__` that re-exports its children would otherwise make every child-to-sibling import a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "servelab"

# Circles other work is removing right now; each entry is the set of modules of one strongly connected component
# as it stood, and a circle among some of them passes while the work goes on. Empty this list as they go: the
# test then holds the whole package to "no circles".
IN_PROGRESS: list[frozenset[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def imports_of(name: str, modules: dict[str, Path]) -> set[str]:
    """The servelab modules `name` imports anywhere in its body."""
    tree = ast.parse(modules[name].read_text(encoding="utf-8"), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    found: set[str] = set()

    def nearest_module(dotted: str) -> str | None:
        # `import servelab.bench.metrics.x` where x is not a module still runs servelab.bench.metrics
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "servelab" and (target := nearest_module(alias.name)):
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "servelab":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in modules else nearest_module(base)
                if target:
                    found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, modules) for name in modules}


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iterative (the graph is a few hundred nodes, recursion would do, but needn't)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.add(top)
                    if top == node:
                        break
                if len(members) > 1:
                    components.append(frozenset(members))
    return components


def one_cycle(component: frozenset[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle through the component's first module, as a readable path (breadth-first)."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    return [start]


def describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    short = lambda m: m.removeprefix("servelab.")  # noqa: E731
    edges = sorted(f"{short(a)} -> {short(b)}" for a in component for b in graph[a] & component)
    cycle = " -> ".join(short(m) for m in one_cycle(component, graph))
    return f"{sorted(short(m) for m in component)}\n    e.g. {cycle}\n    edges: " + "; ".join(edges)


def test_the_graph_sees_deferred_and_submodule_imports():
    # guards the walker itself: a function-level `from servelab.protocol import sse`-style import must show up
    modules = all_modules()
    assert "servelab.protocol.sse" in modules
    graph = import_graph()
    assert any("servelab.protocol.sse" in targets or "servelab.protocol.http1" in targets for targets in graph.values())
    assert all(target in modules for targets in graph.values() for target in targets)


def test_no_import_cycles_outside_work_in_progress():
    graph = import_graph()
    components = strongly_connected(graph)
    for component in components:
        print("import cycle:", describe(component, graph))
    unexpected = [c for c in components if not any(c <= known for known in IN_PROGRESS)]
    assert not unexpected, "import cycles between servelab modules:\n" + "\n".join(
        describe(c, graph) for c in unexpected
    )


def test_in_progress_cycles_are_still_cycles():
    # an entry whose circle has been broken should leave the list, so the list never hides a new one
    components = strongly_connected(import_graph())
    stale = [sorted(c) for c in IN_PROGRESS if not any(c >= found for found in components)]
    if stale:
        pytest.fail(f"these IN_PROGRESS cycles are gone; remove them from the list: {stale}")


# What every compare reader shares lies below them all: a run (compare/run_data.py) below the readers and the key
# metrics, the peer formats' types and field readers (compare/peers/common.py) below the formats and their registry.
# Importing a reader, a format or the metrics from there would make the circle these modules were split to break.
SHARED_BELOW_READERS = {
    "servelab.compare.run_data": set(),
    "servelab.compare.peers.common": {"servelab.compare.run_data"},
}


@pytest.mark.parametrize("module", sorted(SHARED_BELOW_READERS))
def test_what_compare_readers_share_imports_no_reader(module):
    graph = import_graph()
    reached = sorted(dst for dst in graph[module] if dst.startswith("servelab.compare")
                     and dst not in SHARED_BELOW_READERS[module])
    assert not reached, f"{module} imports what sits above it: {reached}"


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


# A package's allowed servelab imports beyond itself. These are the bottom layers: a fact kept below its users.
SHARED_BELOW = {"servelab", "servelab.records", "servelab.errors"}
LAYERS = {
    "servelab.protocol": SHARED_BELOW,
    "servelab.host": SHARED_BELOW,
}
# Pairs that must never import each other in this direction (downstream reaching back upstream).
FORBIDDEN = [
    ("servelab.store", "servelab.compare"),
    ("servelab.verify", "servelab.store"),
    ("servelab.lifecycle", "servelab.bench"),
    ("servelab.calibration", "servelab.bench"),
    ("servelab.engines", "servelab.bench"),
    ("servelab.engines", "servelab.lifecycle"),
    ("servelab.provenance", "servelab.bench"),
]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_bottom_layers_import_only_what_is_below_them(package):
    graph = import_graph()
    bad = sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        if _package_of(src) == package
        for dst in targets
        if _package_of(dst) != package and dst not in LAYERS[package]
    )
    assert not bad, f"{package} reaches above itself:\n" + "\n".join(bad)


# Back-edges other work is removing now, as "src -> dst" module pairs; empty it as they go.
FORBIDDEN_IN_PROGRESS: set[str] = set()


@pytest.mark.parametrize(("lower", "upper"), FORBIDDEN, ids=[f"{a}-{b}" for a, b in FORBIDDEN])
def test_no_back_edges(lower, upper):
    graph = import_graph()
    bad = sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        if src == lower or src.startswith(lower + ".")
        for dst in targets
        if dst == upper or dst.startswith(upper + ".")
    )
    bad = [edge for edge in bad if edge not in FORBIDDEN_IN_PROGRESS]
    assert not bad, f"{lower} must not import {upper}:\n" + "\n".join(bad)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """servelab's packages (and top-level modules) and which others each imports."""
    packages: dict[str, set[str]] = {}
    for src, targets in graph.items():
        a = _package_of(src)
        packages.setdefault(a, set())
        for dst in targets:
            b = _package_of(dst)
            if a != b:
                packages[a].add(b)
    return packages


# Package-level circles other work is removing now (see FORBIDDEN_IN_PROGRESS for the edges that close them).
PACKAGE_CYCLES_IN_PROGRESS: list[frozenset[str]] = []


def test_no_package_cycles():
    graph = import_graph()
    packages = package_graph(graph)
    components = strongly_connected(packages)
    for component in components:
        edges = sorted(f"{s} -> {d}" for s in graph for d in graph[s]
                       if _package_of(s) in component and _package_of(d) in component
                       and _package_of(s) != _package_of(d))
        print("package cycle:", sorted(component), "\n    " + "; ".join(edges))
    unexpected = [sorted(c) for c in components if c not in PACKAGE_CYCLES_IN_PROGRESS]
    assert not unexpected, f"import cycles between servelab packages: {unexpected}"
    stale = [sorted(c) for c in PACKAGE_CYCLES_IN_PROGRESS if c not in components]
    assert not stale, f"these PACKAGE_CYCLES_IN_PROGRESS are gone or changed; remove or update them: {stale}"


def test_in_progress_back_edges_are_still_there():
    graph = import_graph()
    gone = sorted(edge for edge in FORBIDDEN_IN_PROGRESS
                  if edge.split(" -> ")[1] not in graph.get(edge.split(" -> ")[0], set()))
    assert not gone, f"these FORBIDDEN_IN_PROGRESS edges are gone; remove them from the list: {gone}"


# What starts a process. The report draws what it is told (a launch view is handed to the launcher); it never
# calls one of these, whichever module it reaches them through.
LAUNCHERS = {"start_engine", "prepare_launch", "start_process", "start_calibration_server", "Popen"}


def test_report_never_launches():
    modules = all_modules()
    found = []
    for name, path in modules.items():
        if not name.startswith("servelab.report"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            found += [f"{name}: {n}" for n in names if n in LAUNCHERS]
    assert not found, "servelab/report reaches for a launcher:\n" + "\n".join(found)
