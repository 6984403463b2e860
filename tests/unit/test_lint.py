"""The linters pass: ruff over replay/, tests/, bench/ and scripts/*.py, mypy over
replay/tandem (--strict's flags on the pure modules), both configured in pyproject.toml and
pinned in replay/requirements.txt, so ./tandem's venv always has them. A red run shows
their output. Their caches go under the tandem cache (TANDEM_CACHE, ~/.cache/tandem), never
into the tree. Measured (docs/testing.md): ruff 0.05 s; mypy 2.3 s with an empty cache,
0.15 s warm."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tandem import artifacts

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent       # the venv's: ./tandem test runs its python


def tool(name: str) -> Path:
    path = BIN / name
    if not path.is_file():      # ./tandem's setup installs both (replay/requirements.txt)
        pytest.skip(f"{name} is not in {BIN} (pip install -r replay/requirements.txt)")
    return path


def run(argv: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff():
    r = run([tool("ruff"), "check", "--no-fix", "--output-format", "concise",
             "--cache-dir", artifacts.cache_dir() / "ruff"])
    assert r.returncode == 0, f"ruff check (pyproject.toml [tool.ruff]):\n{r.stdout}{r.stderr}"


def test_mypy():
    r = run([tool("mypy"), "--cache-dir", artifacts.cache_dir() / "mypy"])
    assert r.returncode == 0, f"mypy (pyproject.toml [tool.mypy]):\n{r.stdout}{r.stderr}"


def test_strict_modules_get_every_strict_flag():
    """`strict = true` cannot be set per module (mypy applies it to all), so the pure
    modules' section spells the flags out: it must keep up with what this mypy's
    --strict turns on."""
    help_text = run([tool("mypy"), "--help"]).stdout
    listed = re.search(r"--strict\s+Strict mode; enables the following flags:(.*?)(?=\n  --)", help_text, re.S)
    assert listed, "mypy --help no longer describes --strict"
    flags = re.findall(r"--([a-z-]+)", re.sub(r"-\n\s+", "-", listed.group(1)))    # help wraps inside a flag
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = next(o for o in config["overrides"] if "tandem.errors" in o["module"])
    missing = []
    for flag in flags:
        key, value = (flag[3:], False) if flag.startswith("no-") else (flag, True)
        key = key.replace("-", "_")
        if strict.get(key, config.get(key)) != value:
            missing.append(f"{key} = {str(value).lower()}")
    assert not missing, f"pyproject.toml's strict section lacks: {', '.join(missing)}"
