"""The host side's dependencies point one way (issue 20), checked over the imports of
replay/tandem (lazy ones included: a cycle hidden in a function is still a cycle).

- No cycle among tandem's modules.
- The pure modules (formats, the report parser, the assertion language, the catalogue,
  the option builders) never import a module that drives QEMU, libvirt or the CLI.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "replay" / "tandem"
# What drives processes or talks to people: the stages and the CLI.
DRIVERS = {"tandem.vm", "tandem.virt", "tandem.record", "tandem.replay_exact", "tandem.replay_semantic",
           "tandem.semantic", "tandem.live", "tandem.cli", "tandem.demo", "tandem.render", "tandem.workload"}
PURE = {"tandem.errors", "tandem.catalog", "tandem.machine", "tandem.pcapng", "tandem.rrstream",
        "tandem.netpkt", "tandem.verify", "tandem.equivalence", "tandem.feedproto"}
PURE_PACKAGES = ("tandem.report", "tandem.assertions.lang", "tandem.assertions.model",
                 "tandem.assertions.automata", "tandem.assertions.events")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the tandem modules it imports (a name imported from a package counts as
    the submodule when there is one)."""
    mods = {module_name(p): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
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


def test_no_cycles():
    assert cycles(imports()) == []


def test_pure_modules_import_no_driver():
    graph = imports()
    pure = [m for m in graph if m in PURE or m.startswith(PURE_PACKAGES)]
    assert {m: sorted(graph[m] & DRIVERS) for m in pure if graph[m] & DRIVERS} == {}


def test_the_checks_find_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
