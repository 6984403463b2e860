"""The recording bundle directory `NAME.tdm/` and its `manifest.json`.

The manifest records what a replay needs to be exact (the QEMU build, the input
artifacts, the machine) and the size/sha256 of every file in the bundle, so a
replay can refuse a bundle that would silently diverge.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from . import __version__, private
from .errors import BundleError

SCHEMA = 1
MANIFEST = "manifest.json"
STREAM = "replay.tdrs"
DEVLOG = "devices.pcapng"
STATES = ("recording", "complete", "interrupted")
INPUTS = ("kernel", "initrd", "disk_base")
# Files a crashed recording leaves torn; their own readers validate the intact prefix.
PARTIAL_TOLERANT = (STREAM, DEVLOG)


class Problem(NamedTuple):
    file: str   # name relative to the bundle ("" for bundle-wide problems)
    kind: str   # missing | size | hash | input | qemu | state | stream | devlog
    message: str

    def __str__(self) -> str:
        return self.message


def new_manifest() -> dict[str, Any]:
    """A manifest skeleton with every required key, in state 'recording'."""
    return {
        "schema": SCHEMA,
        "tandem_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "state": "recording",
        "qemu": {"binary": None, "build_id": None, "patch_series": None, "version": None},
        "inputs": {},
        "machine": {},
        "files": {},
        "stop": {"reason": None, "vm_ns": None, "icount": None},
        "channels": {},
        "wall_time_s": None,
    }


def new_bundle(path: str | os.PathLike, manifest: dict[str, Any] | None = None) -> Path:
    """Create the bundle directory, 0700 (private.py), and write its first manifest;
    an existing non-empty one is never overwritten, an existing empty one becomes the
    bundle and is made 0700 too.

    Two recorders started together on one path must not both find it empty: the check
    and the first manifest happen under an exclusive flock on the directory, so the
    second finds the first's manifest (or the lock) and is refused before it writes
    anything. (QEMU's logs have their own lock, qemu-patches/0016; qemu-img refuses
    to recreate an overlay a running QEMU holds.)"""
    p = Path(path)
    refuse_existing(p)
    try:
        private.make_dir(p)
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise BundleError(f"{p}: cannot create the bundle directory: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BundleError(f"{p}: another tandem is creating a recording here") from None
        refuse_existing(p)
        try:
            os.chmod(p, private.DIR_MODE)
        except OSError as e:     # an empty directory of another user's
            raise BundleError(f"{p}: cannot make it private (0700): {e.strerror}") from None
        if manifest is not None:
            write_manifest(p, manifest)
    finally:
        os.close(fd)
    return p


def refuse_existing(path: str | os.PathLike) -> None:
    """Raise unless path is free for a new bundle (absent, or an empty directory): the
    cheap check a recorder makes before hashing its inputs; new_bundle repeats it under
    its lock."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise BundleError(f"{p}: exists and is not a directory")
    if p.is_dir() and any(p.iterdir()):
        raise BundleError(f"{p}: already exists and is not empty (refusing to overwrite a recording)")


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(bundle_dir: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Replace manifest.json atomically: a crash leaves the old or the new one, never half."""
    d = Path(bundle_dir)
    tmp = d / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8", opener=private.opener) as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / MANIFEST)
    _fsync_dir(d)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: str | os.PathLike) -> dict[str, Any]:
    """{size, sha256} of a file, hashed in chunks (bundle files can be GBs)."""
    return {"size": os.stat(path).st_size, "sha256": sha256_file(path)}


def input_entry(path: str | os.PathLike) -> dict[str, Any]:
    """{path, sha256, size} of an input artifact (kernel, initrd, disk base)."""
    return {"path": str(Path(path).resolve()), **file_entry(path)}


def load_manifest(bundle_dir: str | os.PathLike) -> dict[str, Any]:
    d = Path(bundle_dir)
    if not d.is_dir():
        raise BundleError(f"{d}: no such recording bundle")
    mf = d / MANIFEST
    try:
        text = mf.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BundleError(f"{mf}: missing (not a tandem bundle, or recording never started)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BundleError(f"{mf}: unreadable: {e}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise BundleError(f"{mf}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{mf}: not a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"{mf}: schema {manifest.get('schema')!r}, this tandem reads schema {SCHEMA}")
    return manifest


def verify_files(bundle_dir: str | os.PathLike, manifest: dict[str, Any], *,
                 check_hash: bool = True) -> list[Problem]:
    """Compare the bundle's files against the manifest's `files` section."""
    d = Path(bundle_dir)
    problems = []
    for name, entry in sorted((manifest.get("files") or {}).items()):
        p = d / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            problems.append(Problem(name, "missing", f"{p}: file name escapes the bundle"))
        elif not p.is_file():
            problems.append(Problem(name, "missing", f"{p}: missing"))
        elif (size := p.stat().st_size) != (want := entry.get("size")):
            what = "truncated" if isinstance(want, int) and size < want else "size mismatch"
            problems.append(Problem(name, "size", f"{what}: {p} has {size} bytes, manifest says {want}"))
        elif check_hash and sha256_file(p) != entry.get("sha256"):
            problems.append(Problem(name, "hash", f"{p}: checksum mismatch (sha256 differs from manifest)"))
    return problems


def verify_inputs(manifest: dict[str, Any]) -> list[Problem]:
    problems = []
    for kind in INPUTS:
        entry = (manifest.get("inputs") or {}).get(kind)
        if not entry:
            continue  # e.g. no initrd
        path = entry.get("path")
        if not path or not os.path.isfile(path):
            problems.append(Problem("", "input", f"{kind} {path}: not found"))
        elif os.stat(path).st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            problems.append(Problem("", "input", f"{kind} {path}: changed since recording"))
    return problems


def _short(build_id: Any) -> str:
    return str(build_id)[:12]


def check_bundle(bundle_dir: str | os.PathLike, *, qemu_build_id: str | None = None,
                 partial: bool = False) -> dict[str, Any]:
    """Raise BundleError for the first reason the bundle cannot be replayed; return the manifest.

    partial=True accepts an unfinished recording: the stream and the device log may
    differ from the manifest (their readers find the intact prefix).
    """
    d = Path(bundle_dir)
    manifest = load_manifest(d)
    state = manifest.get("state")
    if state not in STATES:
        raise BundleError(f"{d / MANIFEST}: unknown state {state!r}")
    if state != "complete" and not partial:
        raise BundleError(f"{d}: recording is {state}, not complete (replay the intact prefix with --partial)")
    recorded = (manifest.get("qemu") or {}).get("build_id")
    if qemu_build_id is not None and recorded != qemu_build_id:
        raise BundleError(f"{d}: recorded with QEMU build {_short(recorded)}, this is {_short(qemu_build_id)}")
    for problem in verify_files(d, manifest):
        if partial and problem.file in PARTIAL_TOLERANT and problem.kind in ("size", "hash"):
            continue
        raise BundleError(problem.message)
    for problem in verify_inputs(manifest):
        raise BundleError(problem.message)
    return manifest
