"""A farm file: which recordings a night replays, into which analyses, with which settings
(docs/farm.md). TOML, because a night is a file people edit by hand and keep in git.

    [corpus]
    bundles = ["recordings/*.tdm", "/srv/web-2026-11.tdm"]

    [analyses]
    names = ["kasan", "lockdep"]
    kernels = ["tonight=/builds/bzImage,/builds/vmlinux"]   # as --analysis-kernel takes them

    [settings]
    db = "farm.sqlite"          # a file, or an SQLAlchemy URL (postgresql://...)
    out = "farm-out"
    exact = true                # also replay each recording exactly on this QEMU build
    repeats = 2                 # a new finding is replayed this many more times first
    fixed_after = 3             # nights a finding must be gone for to be called fixed

A farm file comes from outside like a bundle: an unknown key, a wrong type or a glob that
matches nothing is a one-line error naming it. Relative paths are read from the farm
file's directory, so a farm file and its corpus move together.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TandemError

SPEC_MAX = 1 << 20          # bytes; a farm file is a few hundred
NIGHT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Replays of a task a new finding needs before it is reported new (syzbot reproduces a
# crash before it reports it; LKFT reruns a test before calling it a regression); beyond
# 10 a night's cost grows with every flaky finding for little more certainty.
REPEATS_MAX = 10


class FarmSpecError(TandemError):
    """A farm file or a farm flag that cannot be used."""


@dataclass(frozen=True)
class Settings:
    db: str = "farm.sqlite"
    out: str = "farm-out"
    exact: bool = True
    noise: bool = True               # each analysis beside a replay into the native kernel
    repeats: int = 2
    fixed_after: int = 3
    scheduler: str | None = None     # tcp://HOST:8786; None: a LocalCluster on this host
    vms: int | None = None           # VMs at once on this host (LocalCluster); None: from its cores
    pin: bool = True                 # each task's VMs on CPUs of their own (task.cpus_for)
    night: str | None = None         # the night's name; None: today's date


@dataclass(frozen=True)
class FarmSpec:
    """One night's plan, as given: bundle patterns, analysis names and user kernels (turned
    into analyses by the CLI), and the settings."""
    bundles: tuple[str, ...] = ()
    analyses: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    settings: Settings = field(default_factory=Settings)
    base: Path = Path(".")          # where relative paths are read from

    def bundle_dirs(self) -> list[Path]:
        """The recordings the patterns name, each once, in a stable order; a pattern that
        names nothing is an error (a typo would otherwise make an empty, green night)."""
        out: dict[Path, None] = {}
        for pattern in self.bundles:
            full = os.path.join(self.base, os.path.expanduser(pattern))
            found = sorted(Path(p) for p in glob.glob(full) if Path(p).is_dir()) if glob.has_magic(full) else \
                ([Path(full)] if Path(full).is_dir() else [])
            if not found:
                raise FarmSpecError(f"corpus: {pattern!r} names no recording bundle (from {self.base})")
            out.update(dict.fromkeys(p.resolve() for p in found))
        return list(out)

    def path(self, value: str) -> Path:
        """A path setting, read from the farm file's directory when relative."""
        return (self.base / os.path.expanduser(value)).resolve()


_SECTIONS = {"corpus": {"bundles"}, "analyses": {"names", "kernels"},
             "settings": {f.name for f in dataclasses.fields(Settings)}}


def load(path: str | os.PathLike[str]) -> FarmSpec:
    """The farm file at path, checked whole; a one-line FarmSpecError naming the first
    thing wrong."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(SPEC_MAX + 1)
    except OSError as e:
        raise FarmSpecError(f"{p}: cannot read the farm file: {e.strerror}") from None
    if len(raw) > SPEC_MAX:
        raise FarmSpecError(f"{p}: over {SPEC_MAX} bytes (a farm file is a few hundred)")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise FarmSpecError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise FarmSpecError(f"{p}: not valid TOML ({e})") from None
    try:
        return parse(doc, base=p.resolve().parent)
    except FarmSpecError as e:
        raise FarmSpecError(f"{p}: {e}") from None


def parse(doc: dict[str, Any], base: Path = Path(".")) -> FarmSpec:
    """A farm file's decoded TOML as a FarmSpec."""
    for section, table in doc.items():
        if section not in _SECTIONS:
            raise FarmSpecError(f"{_key(section)}: not a farm file section ({', '.join(_SECTIONS)})")
        if not isinstance(table, dict):
            raise FarmSpecError(f"{section}: a table ([{section}]), not {type(table).__name__}")
        for key in table:
            if key not in _SECTIONS[section]:
                raise FarmSpecError(f"{section}.{_key(key)}: not a key of [{section}] "
                                    f"({', '.join(sorted(_SECTIONS[section]))})")
    corpus, analyses = doc.get("corpus", {}), doc.get("analyses", {})
    spec = FarmSpec(bundles=_strings(corpus, "corpus", "bundles"),
                    analyses=_strings(analyses, "analyses", "names"),
                    kernels=_strings(analyses, "analyses", "kernels"),
                    settings=settings(doc.get("settings", {})), base=base)
    return check(spec)


def settings(table: dict[str, Any], where: str = "settings") -> Settings:
    """The [settings] table (or the flags' values) as Settings, each checked."""
    for name, value in table.items():
        want = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
        if not _fits(value, str(want)):
            raise FarmSpecError(f"{where}.{name}: {_shown(value)} is not {_WHAT[str(want)]}")
    return Settings(**table)


def check(spec: FarmSpec) -> FarmSpec:
    """The checks across fields, whether the spec came from a file or from flags."""
    s = spec.settings
    if not 0 <= s.repeats <= REPEATS_MAX:
        raise FarmSpecError(f"settings.repeats: {s.repeats} is not 0 to {REPEATS_MAX}")
    if not 1 <= s.fixed_after <= 365:
        raise FarmSpecError(f"settings.fixed_after: {s.fixed_after} is not a number of nights, 1 to 365")
    if s.vms is not None and not 1 <= s.vms <= 256:
        raise FarmSpecError(f"settings.vms: {s.vms} is not 1 to 256")
    if s.night is not None and not NIGHT.fullmatch(s.night):
        raise FarmSpecError(f"settings.night: {_shown(s.night)} is not a night's name "
                            "(letters, digits, '.', '_', '-'; it names files)")
    if s.scheduler is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx)://[^\s]+", s.scheduler):
        raise FarmSpecError(f"settings.scheduler: {_shown(s.scheduler)} is not a Dask scheduler address "
                            "(tcp://HOST:8786)")
    if not spec.bundles:
        raise FarmSpecError("corpus.bundles: no recordings named (give bundles by path or glob)")
    if not spec.analyses and not spec.kernels and not s.exact:
        raise FarmSpecError("analyses: none named and settings.exact is false: the night would do nothing")
    return spec


_WHAT = {"str": "text", "bool": "true or false", "int": "a whole number",
         "str | None": "text", "int | None": "a whole number"}


def _fits(value: Any, want: str) -> bool:
    if want.startswith("str"):
        return isinstance(value, str) and 0 < len(value) <= 4096 and "\0" not in value
    if want == "bool":
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(table: dict[str, Any], section: str, key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "\0" not in v for v in value):
        raise FarmSpecError(f"{section}.{key}: {_shown(value)} is not a list of text")
    return tuple(value)


def _key(key: str) -> str:
    return key if key.isprintable() and len(key) <= 60 else _shown(key)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
