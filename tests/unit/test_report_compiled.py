"""The parser's mypyc build (report/compiled.py) is used only for the very sources it was
built from: an edited source runs as Python, never shadowed by an older build."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.report import compiled

REPLAY = Path(__file__).resolve().parents[2] / "replay"
CONSOLE = b"[   1.0] BUG: KASAN: use-after-free in f+0x1/0x2\n[   1.0] Call Trace:\n[   1.0]  g+0x1/0x2\n"
PROBE = f"""
import json, sys
import tandem.report as report, tandem.report.console as console
reps = report.parse({CONSOLE!r}, "linux")
print(json.dumps([report.PARSER, console.__file__, getattr(console, "EDITED", None),
                  [(r.title, r.start, r.end) for r in reps]]))
"""


def _copy_package(root: Path) -> Path:
    """tandem.errors and tandem.report under `root` (what the parser imports): its sources."""
    (root / "tandem").mkdir(parents=True)
    (root / "tandem" / "__init__.py").touch()
    shutil.copyfile(REPLAY / "tandem" / "errors.py", root / "tandem" / "errors.py")
    shutil.copytree(REPLAY / "tandem" / "report", root / "tandem" / "report",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root / "tandem" / "report"


def _probe(root: Path, cache: Path, **env: str) -> list:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root), "TANDEM_CACHE": str(cache),
                              "TANDEM_REPORT_PURE": "0", **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(compiled.mypy_version() is None, reason="mypy is not installed (replay/requirements.txt)")
def test_an_edited_source_is_not_shadowed_by_an_old_build(tmp_path):
    src = _copy_package(tmp_path / "src")
    cache = tmp_path / "cache"
    # One module compiled (console.py: a few seconds), by the build ./tandem build runs.
    built = compiled.build(source=src, modules=("console",), into=cache / "report-mypyc")
    assert built.name == compiled.source_key(src)

    parser, file, edited, reps = _probe(tmp_path / "src", cache)
    assert parser.startswith("compiled (mypyc") and file.endswith(".so") and edited is None
    pure = _probe(tmp_path / "src", cache, TANDEM_REPORT_PURE="1")
    assert pure[0] == "pure Python" and pure[1].endswith("console.py")
    assert reps == pure[3] and len(reps) == 1

    with open(src / "console.py", "a") as f:        # an edit the old build does not hold
        f.write("\nEDITED = 1\n")
    parser, file, edited, reps_after = _probe(tmp_path / "src", cache)
    assert (parser, edited) == ("pure Python", 1) and file.endswith("console.py")
    assert reps_after == reps


def test_the_key_covers_every_source_mypy_and_python(tmp_path):
    src = _copy_package(tmp_path / "src")
    key = compiled.source_key(src, mypy="2.4.1")
    assert compiled.source_key(src, mypy="2.4.2") != key
    for f in sorted(src.glob("*.py")):
        text = f.read_bytes()
        f.write_bytes(text + b"\n")
        assert compiled.source_key(src, mypy="2.4.1") != key, f.name
        f.write_bytes(text)
    assert compiled.source_key(src, mypy="2.4.1") == key
    assert compiled.source_key(src) == compiled.source_key(REPLAY / "tandem" / "report")


def test_a_build_missing_a_module_is_not_used(tmp_path):
    """A build directory whose manifest names a module it does not hold: pure Python."""
    key = compiled.source_key(REPLAY / "tandem" / "report", mypy="2.4.1")
    build = tmp_path / key
    build.mkdir()
    (build / compiled.MANIFEST).write_text(json.dumps(
        {"key": key, "modules": ["console"], "libs": {}, "suffix": compiled.sysconfig.get_config_var("EXT_SUFFIX")}))
    assert compiled._files(build) is None


@pytest.mark.skipif(compiled.mypy_version() is None, reason="mypy is not installed (replay/requirements.txt)")
def test_a_type_error_fails_the_build_naming_it(tmp_path):
    """mypyc compiles no module with a type error: the build says which, and makes nothing."""
    src = _copy_package(tmp_path / "src")
    with open(src / "console.py", "a") as f:
        f.write("\nWRONG: int = 'text'\n")
    with pytest.raises(compiled.InfraError, match=r"console\.py:\d+: error: Incompatible types"):
        compiled.build(source=src, modules=("console",), into=tmp_path / "cache")
    assert not [d for d in (tmp_path / "cache").iterdir() if not d.name.startswith(".")]
