"""Habits the test suite keeps, checked over its source.

- No test sleeps for an event: it waits with helpers.wait_until, which fails naming what it
  waited for; time.sleep appears only in tests/helpers/__init__.py (wait_until's poll and
  `pace`, a client's think time).
- No thread is joined unchecked: tests start threads through helpers.start_client, whose
  join fails when the thread is still running and re-raises what it raised.
- No test module imports another, or conftest: shared code is in tests/helpers.
- No assert on wall-clock time (a TCG boot "under 60 s"): speed belongs to bench/ and
  docs/benchmarks.md; a loaded machine is slower, and the suite must not go red for it.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPERS = TESTS / "helpers" / "__init__.py"


def sources() -> dict[Path, ast.AST]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(TESTS.rglob("*.py"))
            if "fuzz" not in p.relative_to(TESTS).parts[:1]}


def calls(tree: ast.AST, dotted: str) -> list[int]:
    """Lines calling `dotted` (time.sleep, threading.Thread) by its module or by a name
    imported from it."""
    module, name = dotted.rsplit(".", 1)
    imported = any(isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)
                   for n in ast.walk(tree))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr == name and isinstance(f.value, ast.Name)
                    and f.value.id == module) or (imported and isinstance(f, ast.Name) and f.id == name):
                out.append(n.lineno)
    return out


def test_no_sleep_outside_the_wait_helper():
    found = {str(p.relative_to(TESTS)): lines for p, t in sources().items()
             if p != HELPERS and (lines := calls(t, "time.sleep"))}
    assert found == {}


def test_threads_only_through_start_client():
    found = {str(p.relative_to(TESTS)): lines for p, t in sources().items()
             if p != HELPERS and (lines := calls(t, "threading.Thread"))}
    assert found == {}


def test_no_test_module_imports_another():
    found = {}
    for p, t in sources().items():
        for n in ast.walk(t):
            names = [n.module or ""] if isinstance(n, ast.ImportFrom) else \
                [a.name for a in n.names] if isinstance(n, ast.Import) else []
            bad = [m for m in names if m.split(".")[0].startswith("test_") or m == "conftest"]
            if bad:
                found.setdefault(str(p.relative_to(TESTS)), []).extend(bad)
    assert found == {}


# What reads the wall clock or holds a wall time: an assert comparing one is a timed assert.
WALL = ("wall", "elapsed", "monotonic", "perf_counter", "process_time")


def wall_clock_asserts(tree: ast.AST) -> list[int]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assert) and any(isinstance(c, ast.Compare) and any(
                isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in c.ops) for c in ast.walk(n.test)):
            names = [x.attr if isinstance(x, ast.Attribute) else x.id for x in ast.walk(n.test)
                     if isinstance(x, ast.Attribute | ast.Name)]
            if any(w in name for name in names for w in WALL) or any(
                    isinstance(x, ast.Attribute) and x.attr == "time" and isinstance(x.value, ast.Name)
                    and x.value.id == "time" for x in ast.walk(n.test)):
                out.append(n.lineno)
    return out


def test_no_wall_clock_assert():
    found = {str(p.relative_to(TESTS)): lines for p, t in sources().items()
             if p != Path(__file__) and (lines := wall_clock_asserts(t))}
    assert found == {}


def test_the_wall_clock_check_finds_one():
    tree = ast.parse("assert r.wall_s < 60\nassert time.monotonic() - t0 <= 5\nassert elapsed > 1\n"
                     "assert r.vm_ns < 60\nassert r.wall_s == 0\n")
    assert wall_clock_asserts(tree) == [1, 2, 3]


def test_the_checks_find_what_they_look_for():
    tree = ast.parse("import time\nfrom time import sleep\nimport threading\n"
                     "time.sleep(1)\nsleep(2)\nthreading.Thread(target=f)\n")
    assert calls(tree, "time.sleep") == [4, 5] and calls(tree, "threading.Thread") == [6]


def test_under_xdist_every_vm_test_is_in_a_group(request):
    """./tandem test runs two xdist workers; the VM tests must run one at a time per
    group (conftest: one per module). xdist groups a test by renaming it "nodeid@group" in
    its worker: a conftest hook that marks the groups after xdist read them leaves every
    test ungrouped, and two VM tests of one module run side by side."""
    if not hasattr(request.config, "workerinput"):
        import pytest
        pytest.skip("not under xdist (-n 0): nothing is grouped")
    unit = TESTS / "unit"
    loose = [i.nodeid for i in request.session.items
             if unit not in i.path.parents and "@" not in i.nodeid.rsplit("::", 1)[-1]]
    assert not loose, f"{len(loose)} VM tests in no xdist group, e.g. {loose[:3]}"
