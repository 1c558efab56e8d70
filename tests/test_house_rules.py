"""House rules of the ``dlrover`` package, checked by reading the source with ``ast``.

No package import is needed (nor wanted: a rule broken at import time must still be
reported as a rule, not as an ImportError). Every import statement counts, wherever it
is: module level, inside a function, or under ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlrover"
MAX_LINES = 400

# Files still over MAX_LINES because they are being rewritten; the list may only shrink
# (a listed file that is already short enough fails the test until it is taken off).
LINE_LIMIT_EXEMPT: frozenset[str] = frozenset()

# The simulator and the allocation policies run without a live job: they import nothing
# of the actors that make one up.
INDEPENDENT = ("dlrover.resource", "dlrover.sim")
ACTOR_PACKAGES = ("dlrover.master", "dlrover.worker", "dlrover.ps")


@dataclass(frozen=True)
class Import:
    """One imported module, the names taken from it (empty for ``import x``), and the
    local name bound to the module itself, if any (``import a.b as m``, ``from a import b``)."""

    module: str
    names: tuple[str, ...]
    line: int
    bound: str | None = None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(source: str, module: str, is_package: bool, known: Collection[str]) -> list[Import]:
    """The imports of ``module``'s source, relative ones resolved. ``from a import b`` is an
    import of module ``a.b`` when that is a module in ``known``, else of ``a`` taking ``b``."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, (), node.lineno, alias.asname) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            taken: list[str] = []
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    out.append(Import(f"{target}.{alias.name}", (), node.lineno, alias.asname or alias.name))
                else:
                    taken.append(alias.name)
            if taken:
                out.append(Import(target, tuple(taken), node.lineno))
    return out


@cache
def package_imports() -> dict[str, list[Import]]:
    """The imports of every module that name a module of the package."""
    known = frozenset(modules())
    graph = {}
    for name, path in modules().items():
        found = imports_of(path.read_text(), name, path.name == "__init__.py", known)
        graph[name] = [i for i in found if i.module in known]
    return graph


def where(module: str) -> str:
    return modules()[module].relative_to(ROOT).as_posix()


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import loop through the component's first module (for the message)."""
    members, start = set(component), component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    loop = [v]
                    while loop[-1] != start:
                        loop.append(parent[loop[-1]])
                    return [*reversed(loop), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_cycle_check_finds_a_planted_cycle_and_ignores_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["e"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_imports_are_found_at_every_level_and_relative_ones_resolved() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from dlrover.data import criteo\n"
        "from . import sibling\n"
        "from ..errors import _hidden\n"
        "if TYPE_CHECKING:\n"
        "    from dlrover.spec import JobSpec\n"
        "def f():\n"
        "    import dlrover.ps.shm\n"
    )
    known = {"dlrover.data", "dlrover.data.criteo", "dlrover.sim.sibling", "dlrover.errors", "dlrover.spec", "dlrover.ps.shm"}
    found = {(i.module, i.names) for i in imports_of(source, "dlrover.sim.engine", False, known)}
    assert {
        ("dlrover.data.criteo", ()),
        ("dlrover.sim.sibling", ()),
        ("dlrover.errors", ("_hidden",)),
        ("dlrover.spec", ("JobSpec",)),
        ("dlrover.ps.shm", ()),
    } <= found


def test_no_import_cycles_between_dlrover_modules() -> None:
    graph = {m: {i.module for i in imps} - {m} for m, imps in package_imports().items()}
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"among {', '.join(where(m) for m in c)}; e.g. {' -> '.join(where(m) for m in one_cycle(graph, c))}" for c in cycles
    )


def test_resource_and_sim_import_nothing_of_master_worker_or_ps() -> None:
    bad = [
        f"{where(m)}:{i.line} imports {i.module}"
        for m, imps in package_imports().items()
        if m.startswith(INDEPENDENT)
        for i in imps
        if any(i.module == p or i.module.startswith(p + ".") for p in ACTOR_PACKAGES)
    ]
    assert not bad, "dlrover/resource and dlrover/sim must not depend on the live job:\n" + "\n".join(bad)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module ``start`` imports, directly or through others: each with the module
    it was reached from (``start`` itself maps to None), for a path in the message."""
    parent: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return parent


def path_to(parent: dict[str, str | None], end: str) -> list[str]:
    out = [end]
    while parent[out[-1]] is not None:
        out.append(parent[out[-1]])  # type: ignore[arg-type]
    return out[::-1]


def test_reachability_follows_imports_through_other_modules() -> None:
    parent = reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a")
    assert set(parent) == {"a", "b", "c"} and path_to(parent, "c") == ["a", "b", "c"]


def test_resource_and_sim_reach_nothing_of_master_worker_or_ps_through_any_module() -> None:
    graph = {m: {i.module for i in imps} - {m} for m, imps in package_imports().items()}
    bad = []
    for m in sorted(graph):
        if not m.startswith(INDEPENDENT):
            continue
        parent = reachable(graph, m)
        hit = next((w for w in parent if any(w == p or w.startswith(p + ".") for p in ACTOR_PACKAGES)), None)
        if hit:
            bad.append(" -> ".join(where(x) for x in path_to(parent, hit)))
    assert not bad, "dlrover/resource and dlrover/sim must not depend on the live job, even through another module:\n" + "\n".join(bad)


MAX_ROOT_MODULES = 10


def test_the_package_root_holds_at_most_ten_modules() -> None:
    """The root is what the package is (the spec, shared primitives); the rest lives in
    packages named for what they hold."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at dlrover/ (at most {MAX_ROOT_MODULES}): {', '.join(root)}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_attribute_uses(source: str, imports: list[Import]) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of each ``m._name`` where ``m`` is a name bound to a module
    by ``imports``: the same dependency as importing ``_name``, spelled differently."""
    bound = {i.bound: i.module for i in imports if i.bound}
    return [
        (node.lineno, bound[node.value.id], node.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound and is_private(node.attr)
    ]


def test_private_attribute_of_an_imported_module_counts_as_importing_it() -> None:
    source = "from dlrover import cli\nimport dlrover.spec as spec\nx = cli._out_dir(spec._format_error, cli.main)\n"
    imports = imports_of(source, "dlrover.sim.cli", False, {"dlrover", "dlrover.cli", "dlrover.spec"})
    assert sorted(private_attribute_uses(source, imports)) == [(3, "dlrover.cli", "_out_dir"), (3, "dlrover.spec", "_format_error")]


def test_no_module_imports_a_private_name_of_another_module() -> None:
    bad = [
        f"{where(m)}:{i.line} imports {name} from {i.module}"
        for m, imps in package_imports().items()
        for i in imps
        if i.module != m
        for name in (*i.names, *i.module.split("."))
        if is_private(name)
    ]
    bad += [
        f"{where(m)}:{line} uses {name} of {module}"
        for m, imps in package_imports().items()
        for line, module, name in private_attribute_uses(modules()[m].read_text(), imps)
        if module != m
    ]
    assert not bad, "private names imported across modules (make them public or move them):\n" + "\n".join(bad)


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_file_is_over_the_line_limit_except_those_being_rewritten() -> None:
    counts = {where(m): line_count(p) for m, p in modules().items()}
    too_long = sorted(f"{f} ({n} lines)" for f, n in counts.items() if n > MAX_LINES and f not in LINE_LIMIT_EXEMPT)
    assert not too_long, f"files over {MAX_LINES} lines (split them by responsibility):\n" + "\n".join(too_long)


def test_line_limit_exemptions_only_list_files_still_over_the_limit() -> None:
    counts = {where(m): line_count(p) for m, p in modules().items()}
    stale = sorted(f"{f} ({counts[f]} lines)" if f in counts else f"{f} (gone)" for f in LINE_LIMIT_EXEMPT if counts.get(f, 0) <= MAX_LINES)
    assert not stale, "take these off LINE_LIMIT_EXEMPT, they are within the limit now:\n" + "\n".join(stale)


RAY_BOUNDARY = "dlrover.master.cluster"


def test_inside_the_master_package_only_its_cluster_module_imports_ray() -> None:
    """Every Ray call of the master goes through ``dlrover.master.cluster``, which tests
    replace with a fake: any other master module importing ray would escape it."""
    known = frozenset(modules())
    bad = [
        f"{where(m)}:{i.line} imports {i.module}"
        for m, path in modules().items()
        if m.startswith("dlrover.master.") and m != RAY_BOUNDARY
        for i in imports_of(path.read_text(), m, path.name == "__init__.py", known)
        if i.module == "ray" or i.module.startswith("ray.")
    ]
    assert not bad, f"only {RAY_BOUNDARY} may import ray inside dlrover/master:\n" + "\n".join(bad)


VMAP_OWNER = "dlrover.master.launcher"


def map_switches(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of each assignment to an attribute ``vmap`` and each
    ``<x>.set_routing.remote(...)`` call in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        out += [(node.lineno, ".vmap =") for t in targets for a in ast.walk(t) if isinstance(a, ast.Attribute) and a.attr == "vmap"]
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and f.attr == "remote" and isinstance(f.value, ast.Attribute) and f.value.attr == "set_routing":
            out.append((node.lineno, "set_routing.remote"))
    return sorted(out)


def test_map_switches_are_found_in_assignments_tuples_and_calls() -> None:
    source = "lz.vmap = v\na, lz.vmap = 1, v\nh.set_routing.remote(ps, v)\nself.vmap: X = v\nh.set_routing(ps, v)\nx = lz.vmap\n"
    assert map_switches(source) == [(1, ".vmap ="), (2, ".vmap ="), (3, "set_routing.remote"), (4, ".vmap =")]


def test_only_the_launcher_changes_a_running_jobs_vshard_map_and_tells_the_workers() -> None:
    """``Launcher.switch_map`` is the one place: the master's map and the workers' routing
    change together, or a worker would route by a map the master no longer holds."""
    bad = [
        f"{where(m)}:{line} {what}"
        for m, path in modules().items()
        if m.startswith("dlrover.master.") and m != VMAP_OWNER
        for line, what in map_switches(path.read_text())
    ]
    assert not bad, f"only {where(VMAP_OWNER)} may set the job's vshard map or call set_routing (use Launcher.switch_map):\n" + "\n".join(bad)
