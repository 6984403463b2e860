"""The host side's dependencies point one way, checked over the imports of
replay/tandem (lazy ones included: a cycle hidden in a function is still a cycle).

- No cycle among tandem's modules.
- Packages are layered (docs/architecture.md): the CLI over the stages a user meets,
  the stages over the concerns they share (one QEMU process, libvirt, the host's setup),
  those over the formats and the report parser, those over the base (errors, the
  catalogue, the machine description, file modes). A module imports its own package
  and lower layers only; among the stages, a later one may use an earlier one (semantic
  replay uses the recording's guest; live shadows run semantic replays), never the reverse.
- The pure modules (formats, the report parser, the assertion language, the catalogue,
  the option builders) never import a module that drives QEMU, libvirt or the CLI.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "replay" / "tandem"
# Lowest first: each prefix with its layer; the longest prefix a module starts with wins.
LAYERS = {
    "tandem": 0, "tandem.errors": 0, "tandem.catalog": 0, "tandem.machine": 0,
    "tandem.artifacts": 0, "tandem.private": 0,
    "tandem.formats": 1, "tandem.report": 1,
    "tandem.assertions.lang": 1, "tandem.assertions.model": 1, "tandem.assertions.automata": 1,
    "tandem.assertions.events": 1, "tandem.assertions.symbols": 1, "tandem.assertions.kernel": 1,
    "tandem.qemu": 2, "tandem.setup": 2, "tandem.wireshark": 2,
    "tandem.libvirt": 3,
    "tandem.record": 4,
    "tandem.exact": 5,
    "tandem.semantic": 6, "tandem.assertions.trace": 6,
    "tandem.assertions": 7, "tandem.live": 7, "tandem.plan": 7, "tandem.farm": 7, "tandem.explain": 7,
    "tandem.cli": 8, "tandem.__main__": 9,
}
# What drives processes or talks to people.
DRIVERS = ("tandem.qemu", "tandem.libvirt", "tandem.record", "tandem.exact", "tandem.semantic.driving.replay",
           "tandem.semantic.analyze", "tandem.live", "tandem.cli")
PURE = ("tandem.errors", "tandem.catalog", "tandem.machine", "tandem.formats", "tandem.report",
        "tandem.exact.verify", "tandem.semantic.comparison.equivalence", "tandem.semantic.inputs",
        "tandem.semantic.comparison.compare", "tandem.assertions.lang", "tandem.assertions.model",
        "tandem.assertions.automata", "tandem.assertions.events")


def layer(module: str) -> tuple[int, str]:
    """(layer, the package prefix that set it) of a module."""
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix], prefix


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the tandem modules it imports. As in mypy's module graph, `from P import
    X` imports P, and X too when P.X is a module: `from . import linux` in a submodule
    imports its package (whose __init__ runs first) as well as the sibling."""
    mods = {module_name(p, package.parent): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                deps.add(target)
                deps.update(sub for alias in node.names if (sub := f"{target}.{alias.name}") in mods)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> the modules it imports from a higher layer, or from another package of
    its own layer (two stages of one layer know nothing of each other)."""
    out = {}
    for module, deps in graph.items():
        rank, home = layer(module)
        bad = [d for d in sorted(deps) if layer(d)[0] > rank
               or (layer(d)[0] == rank and layer(d)[1] != home and rank > 1)]
        if bad:
            out[module] = bad
    return out


def test_no_cycles():
    assert cycles(imports()) == []


def test_dependencies_point_down():
    assert upward(imports()) == {}


def test_pure_modules_import_no_driver():
    graph = imports()
    pure = [m for m in graph if m.startswith(PURE)]
    assert {m: sorted(d for d in graph[m] if d.startswith(DRIVERS))
            for m in pure if any(d.startswith(DRIVERS) for d in graph[m])} == {}


def reachable(graph: dict[str, set[str]], start: list[str]) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_the_comparators_read_plain_data():
    """The comparators read what the analysis guest sent as plain values (model.NetOutput),
    never the peer that plays the network nor the loop that drives the VM."""
    graph = imports()
    comparators = [m for m in graph if m.startswith("tandem.semantic.comparison")]
    assert sorted(d for d in reachable(graph, comparators)
                  if d.startswith(("tandem.semantic.network.peer", "tandem.semantic.driving"))) == []


def test_the_checks_find_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_checks_find_an_upward_import():
    assert upward({"tandem.formats.bundle": {"tandem.qemu.vm"}, "tandem.qemu.vm": {"tandem.formats.bundle"},
                   "tandem.live.shadow": {"tandem.plan"}}) == {
        "tandem.formats.bundle": ["tandem.qemu.vm"], "tandem.live.shadow": ["tandem.plan"]}


def test_the_checks_count_from_dot_import_as_the_package(tmp_path):
    """`from . import linux` in report/dialects.py, with report/__init__.py importing
    dialects: a cycle through the half-initialised package, as mypy sees it."""
    pkg = tmp_path / "tandem" / "report"
    pkg.mkdir(parents=True)
    (tmp_path / "tandem" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .dialects import dialect\n")
    (pkg / "dialects.py").write_text("from . import linux\nfrom .model import OSES\n")
    (pkg / "linux.py").write_text("")
    (pkg / "model.py").write_text("OSES = ()\n")
    graph = imports(tmp_path / "tandem")
    assert graph["tandem.report.dialects"] == {"tandem.report", "tandem.report.linux", "tandem.report.model"}
    assert cycles(graph) == [["tandem.report", "tandem.report.dialects"]]
