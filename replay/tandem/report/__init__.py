"""Crash reports in guest console output (the model is syzkaller's pkg/report).

    parse(text, os)       every report in a console log, in order
    Scanner(os).feed(b)   the same, incrementally, for live consoles
    symbolize(rep, vmlinux)  source locations of a report's frames

OSes: "linux", "freebsd", "openbsd", "netbsd" (OSES). A Linux or FreeBSD console also
yields the sanitizer reports of guest userland processes (os "userland"). Report types are the closed set TYPES; titles follow
syzkaller's: stable across runs (no addresses, pids, numbers), naming the
guilty frame. docs/reports.md has the rules.
"""
from __future__ import annotations

from . import compiled

# Which parser runs: the mypyc build of exactly these sources when ./tandem build made one, else
# these .py modules (report/compiled.py).
PARSER = compiled.install()

from .dialects import dialect  # noqa: E402  (after install(): it decides where they come from)
from .model import OSES, TYPES, USERLAND_TYPES, Report  # noqa: E402
from .scanner import Scanner  # noqa: E402
from .symbolize import symbolize  # noqa: E402


def parse(text: str | bytes, os: str = "linux") -> list[Report]:
    """All reports in a console log, in order."""
    scanner = Scanner(os)
    return scanner.feed(text) + scanner.flush()


__all__ = ["OSES", "PARSER", "Report", "Scanner", "TYPES", "USERLAND_TYPES", "dialect", "parse", "symbolize"]
