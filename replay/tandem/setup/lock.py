"""The setup lock: one install or build step at a time per cache.

Two tandem commands started together (`./tandem demo`, then `./tandem test` in another
terminal) once both created the same venv and both failed. Every step that installs
or builds (Debian packages, the venv, meson) runs holding an exclusive flock(2) on
CACHE/setup.lock; a second command waits, saying for what, then uses what the first
one made. The launcher (bash, `flock 9`) and this module take the same lock.

CACHE/setup.owner says who holds it and what it is doing ("pid 123 (./tandem demo),
building ..."), written after the lock is taken and removed before it is released.
flock's lock dies with its process, so a killed command leaves no lock but leaves its
owner record: the next holder reports it. What the killed command left half-made is
found by each step's own completion marker (the venv's .complete, the build scripts'
atomic renames) and redone, never used.
"""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from ..artifacts import cache_dir

log = logging.getLogger(__name__)


def lock_path() -> Path:
    return cache_dir() / "setup.lock"


def owner_path() -> Path:
    return cache_dir() / "setup.owner"


def owner() -> str:
    """Who holds (or last held, if it was killed) the lock; "" when nobody."""
    try:
        return owner_path().read_text().strip()
    except FileNotFoundError:
        return ""


def held() -> bool:
    """Whether some process holds the lock now (without waiting for it)."""
    if not lock_path().exists():
        return False
    fd = os.open(lock_path(), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class SetupLock:
    """with SetupLock("building kernel-kasan"): ...  (waits for another holder, saying so)."""

    def __init__(self, doing: str, command: str = "tandem"):
        self.doing = doing
        self.command = command
        self.fd: int | None = None

    def __enter__(self) -> SetupLock:
        lock_path().parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(lock_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another tandem command: %s (lock %s)", owner() or "starting", lock_path())
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        left = owner()
        if left:
            log.warning("%s was stopped before it finished; what it left half-made is redone", left)
        self.update(self.doing)
        return self

    def update(self, doing: str) -> None:
        tmp = owner_path().with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(f"pid {os.getpid()} ({self.command}), {doing}\n")
        os.replace(tmp, owner_path())

    def __exit__(self, *exc) -> None:
        owner_path().unlink(missing_ok=True)
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
