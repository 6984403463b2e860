"""Habits the code keeps: no error swallowed without its cause; no module or
function too long to read; code text that tells reasons, not history.

An `except Exception` (or a bare `except`, or `except BaseException`) that does not raise
again hides whatever went wrong, a bug in tandem included; errors that are expected are
caught by their own types (vm.QMP_GONE for a QEMU that has gone) and logged."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "replay" / "tandem"
BROAD = {"Exception", "BaseException"}


def broad_handlers_that_swallow(tree: ast.AST) -> list[int]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler):
            continue
        names = ([node.type] if not isinstance(node.type, ast.Tuple) else node.type.elts) if node.type else []
        broad = node.type is None or any(isinstance(n, ast.Name) and n.id in BROAD for n in names)
        if broad and not any(isinstance(n, ast.Raise) for b in node.body for n in ast.walk(b)):
            out.append(node.lineno)
    return out


def test_no_broad_except_that_swallows():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := broad_handlers_that_swallow(ast.parse(p.read_text(), str(p))))}
    assert found == {}


def test_the_check_finds_one():
    assert broad_handlers_that_swallow(ast.parse("try:\n    f()\nexcept Exception:\n    pass\n")) == [3]
    assert broad_handlers_that_swallow(ast.parse("try:\n    f()\nexcept:\n    pass\n")) == [3]
    assert broad_handlers_that_swallow(ast.parse("try:\n    f()\nexcept BaseException:\n    g()\n    raise\n")) == []


# Sizes a reader can hold. The anchors' largest files do one job each (QEMU's machine.py
# 31 kB, Firecracker's microvm.py 38 kB); a module past 800 lines is likely doing several.
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120


def too_long(package: Path = PACKAGE) -> list[str]:
    out = []
    for p in sorted(package.rglob("*.py")):
        text = p.read_text()
        if (n := text.count("\n")) > MAX_MODULE_LINES:
            out.append(f"{p.relative_to(package)}: {n} lines")
        for node in ast.walk(ast.parse(text, str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    out.append(f"{p.relative_to(package)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_module_or_function_too_long():
    assert too_long() == []


def test_the_size_check_finds_one(tmp_path):
    (tmp_path / "big.py").write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert too_long(tmp_path) == [f"big.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]


# History is in git log: a tracker's issue number says nothing to a reader of the tree, and
# an import alias that keeps a module's old name alive sends the reader to a module that
# is not there.
ISSUE = re.compile(r"\b[Ii]ssues? \d+")


def history(package: Path = PACKAGE) -> list[str]:
    out = []
    for p in sorted(package.rglob("*.py")):
        text = p.read_text()
        out += [f"{p.relative_to(package)}:{n}: issue number" for n, line in enumerate(text.splitlines(), 1)
                if ISSUE.search(line)]
        out += [f"{p.relative_to(package)}:{node.lineno}: alias {a.asname}"
                for node in ast.walk(ast.parse(text, str(p))) if isinstance(node, ast.Import | ast.ImportFrom)
                for a in node.names if a.asname and a.asname.endswith("_mod")]
    return out


def test_code_text_tells_no_history():
    assert history() == []


def test_the_history_check_finds_both(tmp_path):
    (tmp_path / "old.py").write_text("from . import inputs as inputs_mod  # issue 23\n")
    assert history(tmp_path) == ["old.py:1: issue number", "old.py:1: alias inputs_mod"]


# semantic/ (the replay's loop, the network it plays, the comparators) keeps to a screen
# a function, so each reads at a glance; driving/replay.run, which sets one analysis VM
# up and tears it down step by step, is the one exception.
MAX_SEMANTIC_FUNCTION_LINES = 60
SEMANTIC_EXCEPTIONS = {"driving/replay.py:run"}


def long_functions(package: Path, limit: int) -> dict[str, int]:
    """path:function -> its lines, for the functions over `limit` lines under package."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > limit:
                    out[f"{p.relative_to(package)}:{node.name}"] = n
    return out


def test_semantic_functions_fit_a_screen():
    found = long_functions(PACKAGE / "semantic", MAX_SEMANTIC_FUNCTION_LINES)
    assert {k: n for k, n in found.items() if k not in SEMANTIC_EXCEPTIONS} == {}


def test_the_screen_check_finds_one(tmp_path):
    (tmp_path / "loop.py").write_text("def f():\n" + "    x = 1\n" * MAX_SEMANTIC_FUNCTION_LINES)
    assert long_functions(tmp_path, MAX_SEMANTIC_FUNCTION_LINES) == {"loop.py:f": MAX_SEMANTIC_FUNCTION_LINES + 1}
