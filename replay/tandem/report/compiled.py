"""The parser's modules compiled by mypyc, used when their build matches the sources.

mypyc compiles the same Python source to C (one code path: the .py files stay the parser,
and are what runs when there is no build). On syzkaller's and tandem's report corpora it
took the parser from 28 to 36 MB/s (CPU, one core): the interpreter's bookkeeping per line
and per frame gets cheaper, the `re` searches do not.

A build lives in CACHE/report-mypyc/KEY/, KEY a hash of every .py file of this package,
mypy's version and Python's (version and extension suffix): an edited source has another
key, so a build is never used for sources other than its own; with no build for the
current key (or TANDEM_REPORT_PURE=1) the .py modules run, said once at debug level.
`./tandem build` makes it (tandem.setup.build calls build()).
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..errors import InfraError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PACKAGE = __name__.rsplit(".", 1)[0]        # tandem.report
# The modules compiled: all but the package itself, this loader, and symbolize (pyelftools,
# run once per finding, not per console line).
COMPILED = ("console", "dialects", "frames", "freebsd", "kind", "linux", "model", "needles",
            "netbsd", "oops", "openbsd", "rustsym", "scanner", "userland")
PURE_ENV = "TANDEM_REPORT_PURE"
MANIFEST = "manifest.json"


def builds_dir() -> Path:
    """Where builds are kept: tandem's cache (TANDEM_CACHE, else ~/.cache/tandem, as
    tandem.artifacts has it)."""
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "report-mypyc"


def mypy_version() -> str | None:
    try:
        return importlib.metadata.version("mypy")
    except importlib.metadata.PackageNotFoundError:
        return None


def source_key(source: Path = HERE, mypy: str | None = None) -> str | None:
    """The key of a build of the package in `source` (None: mypy is not installed)."""
    mypy = mypy or mypy_version()
    if mypy is None:
        return None
    h = hashlib.sha256()
    for f in sorted(source.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(f"mypy {mypy}\0python {sys.version}\0{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return h.hexdigest()[:24]


def build(source: Path = HERE, modules: tuple[str, ...] = COMPILED, into: Path | None = None) -> Path:
    """Compile `modules` of the package in `source` with mypyc (a no-op when a build for its
    key is there); returns the build's directory. Built aside and renamed into place: a
    build cut short leaves nothing that counts."""
    key = source_key(source)
    if key is None:
        raise InfraError("mypy is not installed in this Python: it is in replay/requirements.txt (./tandem setup)")
    root = into or builds_dir()
    dest = root / key
    if (dest / MANIFEST).is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".building-") as tmp:
        src = Path(tmp) / "src"
        pkg = src.joinpath(*PACKAGE.split("."))
        pkg.mkdir(parents=True)
        for parent in list(pkg.relative_to(src).parents)[:-1]:
            (src / parent / "__init__.py").touch()
        for f in source.glob("*.py"):       # the package's own __init__ (the loader) left out
            shutil.copyfile(f, pkg / f.name) if f.name != "__init__.py" else (pkg / f.name).touch()
        files = [str((pkg / f"{m}.py").relative_to(src)) for m in modules]
        log.info("compiling the console parser with mypyc (%d modules, about a minute)", len(modules))
        r = subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=src, capture_output=True, text=True)
        if r.returncode != 0:     # the first type error (mypyc compiles none), else its last word
            said = (r.stdout + r.stderr).strip().splitlines() or ["no output"]
            first = next((line for line in said if ": error: " in line), said[-1])
            raise InfraError(f"mypyc could not compile the console parser ({source}): {first}")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        out = Path(tmp) / "out"
        out.mkdir()
        # mypyc's shared library: the code of all modules, beside the package (a module
        # name of its own) or, for one module, in it; {module name: file name}
        libs = {".".join(p.relative_to(src).parts)[:-len(suffix)]: p.name for p in src.rglob(f"*__mypyc{suffix}")}
        for path in src.rglob(f"*__mypyc{suffix}"):
            shutil.copyfile(path, out / path.name)
        for m in modules:
            shutil.copyfile(pkg / f"{m}{suffix}", out / f"{m}{suffix}")
        (out / MANIFEST).write_text(json.dumps({"key": key, "modules": list(modules), "libs": libs,
                                                "suffix": suffix}))
        try:
            out.rename(dest)
        except OSError:
            if not (dest / MANIFEST).is_file():    # else another build got there first
                raise
    _prune(root, KEEP)
    return dest


KEEP = 8    # builds kept (checkouts sharing the cache each use their own); the oldest go


def _prune(root: Path, keep: int) -> None:
    builds = sorted((d for d in root.iterdir() if (d / MANIFEST).is_file()), key=lambda d: d.stat().st_mtime)
    for old in builds[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and mypyc's shared library) in one build's directory."""

    def __init__(self, files: dict[str, Path]):
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        f = self.files.get(fullname)
        if f is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, f, loader=importlib.machinery.ExtensionFileLoader(fullname, str(f)))


def _files(build_dir: Path) -> dict[str, Path] | None:
    try:
        built = json.loads((build_dir / MANIFEST).read_text())     # the build's index, not a bundle's
    except (OSError, ValueError):
        return None
    if built.get("suffix") != sysconfig.get_config_var("EXT_SUFFIX"):
        return None
    files = {f"{PACKAGE}.{m}": build_dir / f"{m}{built['suffix']}" for m in built["modules"]}
    files.update({name: build_dir / file for name, file in built["libs"].items()})
    return files if all(f.is_file() for f in files.values()) else None


def install() -> str:
    """Put the build matching this package's sources first on the import path for its
    modules, if there is one; which parser runs: "compiled (mypyc, KEY)" or "pure Python"."""
    if os.environ.get(PURE_ENV) == "1":
        log.debug("console parser: pure Python (%s=1)", PURE_ENV)
        return "pure Python"
    key = source_key()
    if key is None:
        log.debug("console parser: pure Python (mypy is not installed: no build is looked for)")
        return "pure Python"
    files = _files(builds_dir() / key)
    if files is None:
        log.debug("console parser: pure Python (no mypyc build for these sources: %s)", builds_dir() / key)
        return "pure Python"
    if any(f"{PACKAGE}.{m}" in sys.modules for m in COMPILED):
        return "pure Python"      # imported already (importlib.reload of the package)
    sys.meta_path.insert(0, _Finder(files))
    log.debug("console parser: compiled by mypyc (%s)", builds_dir() / key)
    return f"compiled (mypyc, {key})"
