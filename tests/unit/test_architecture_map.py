"""docs/architecture.md is the map of replay/tandem: its module table names every module
of the package, and nothing that is not one, so the map cannot fall behind the code
unnoticed. The table's rows are `| `path/of/module.py` | what it holds |`."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "replay" / "tandem"
MAP = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([a-z_/]+\.py)` \| (.+) \|$", re.MULTILINE)


def modules() -> set[str]:
    """Every module of the package but a package's __init__ (its folder's rows say it)."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def mapped(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in ROW.finditer(text)}


def test_the_map_names_every_module_and_no_other():
    rows = mapped(MAP.read_text())
    missing = sorted(modules() - set(rows))
    stale = sorted(set(rows) - modules())
    assert not missing, f"docs/architecture.md: modules not in its table: {missing}"
    assert not stale, f"docs/architecture.md: rows for modules that do not exist: {stale}"
    assert all(rows.values()), "a row says what its module holds"


def test_the_check_finds_a_missing_and_a_stale_row():
    text = MAP.read_text()
    rows = mapped(text)
    some = sorted(rows)[0]
    assert some not in mapped(text.replace(f"| `{some}` |", "| x |"))
    assert "gone/module.py" in mapped(text + "\n| `gone/module.py` | a module that was |\n")


def test_the_map_points_at_nothing_outside_the_repository():
    """A link is relative to docs/; a path in the prose to the repository's root."""
    text = MAP.read_text()
    links = [MAP.parent / t for t in re.findall(r"\]\(([^)#]+)\)", text)]
    paths = [ROOT / t for t in re.findall(r"`([^`\s]*\.\./[^`\s]*)`", text)]
    for target in links + paths:
        assert target.resolve().is_relative_to(ROOT), target


def test_the_docs_name_files_that_are_there():
    """A module path in the docs (`semantic/driving/replay.py`, `tests/unit/test_x.py`)
    names a file of the tree: read from the repository's root, the package, tests/ or
    replay/, as the docs write them."""
    path = re.compile(r"(?<![\w/.-])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*\.py)\b")
    bases = (ROOT, PACKAGE, ROOT / "tests", ROOT / "replay")
    gone = sorted({f"{md.name}: {p}" for md in [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md"]
                   for p in path.findall(md.read_text()) if not any((b / p).exists() for b in bases)})
    assert gone == []
