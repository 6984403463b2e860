"""The recording bundle directory `NAME.tdm/` and its `manifest.json`.

The manifest (formats/manifest.py: Manifest) records what a replay needs to be exact
(the QEMU build, the input artifacts, the machine) and the size/sha256 of every file in
the bundle, so a replay can refuse a bundle that would silently diverge. Here: the
directory, its members opened safely, and the manifest checked field by field as it
loads (manifest_problem), then read into a Manifest.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import IO, Any, BinaryIO, Literal, NamedTuple, TextIO, overload

from .. import artifacts, catalog, private
from ..errors import BundleError
from ..machine import MAC, NIC_DEVICES, RTC_BASE, OptionError, check_id
from .manifest import OVERLAY as OVERLAY
from .manifest import SCHEMA as SCHEMA
from .manifest import STATES as STATES
from .manifest import FileEntry, InputFile
from .manifest import Manifest as Manifest

MANIFEST = "manifest.json"
MANIFEST_MAX = 1 << 20      # bytes; a recording's manifest is 2-3 KiB, and it is read whole
STREAM = "replay.tdrs"
DEVLOG = "devices.pcapng"
INPUTS = ("kernel", "initrd", "disk_base")     # disk_base.ID: the base of disk ID (after disk0)
# Files a crashed recording leaves torn; their own readers validate the intact prefix.
PARTIAL_TOLERANT = (STREAM, DEVLOG)


class Problem(NamedTuple):
    file: str   # name relative to the bundle ("" for bundle-wide problems)
    kind: str   # missing | size | hash | input | qemu | state | stream | devlog
    message: str

    def __str__(self) -> str:
        return self.message


def new_bundle(path: str | os.PathLike[str], manifest: Manifest | None = None) -> Path:
    """Create the bundle directory, 0700 (private.py), and write its first manifest;
    an existing non-empty one is never overwritten, an existing empty one becomes the
    bundle and is made 0700 too.

    Two recorders started together on one path must not both find it empty: the check
    and the first manifest happen under an exclusive flock on the directory, so the
    second finds the first's manifest (or the lock) and is refused before it writes
    anything. (QEMU's logs have their own lock, qemu-patches/0012 and 0015; qemu-img refuses
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


def refuse_existing(path: str | os.PathLike[str]) -> None:
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


def write_manifest(bundle_dir: str | os.PathLike[str], manifest: Manifest | Mapping[str, Any]) -> None:
    """Replace manifest.json atomically: a crash leaves the old or the new one, never half.
    manifest: a Manifest, or a JSON document (the tests write malformed ones)."""
    d = Path(bundle_dir)
    tmp = d / (MANIFEST + ".tmp")
    document = manifest.to_json() if isinstance(manifest, Manifest) else manifest
    with open(tmp, "w", encoding="utf-8", opener=private.opener) as f:
        json.dump(document, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / MANIFEST)
    _fsync_dir(d)


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return _sha256(f)


def _sha256(f: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


# --- opening a bundle's files ---------------------------------------------------------------
# A bundle comes from outside: a member may be a link to /etc/shadow, a FIFO that blocks
# whoever opens it, or a directory. Every reader of a member opens it here, by one plain
# name relative to the bundle directory's own fd (so no name leaves the directory), without
# following a link (O_NOFOLLOW), without waiting on a FIFO (O_NONBLOCK), and keeps it only
# if fstat says it is a regular file: the check and the read are on the same open file, so
# a member swapped for a link between them is not followed either.

_MEMBER_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class MissingMember(BundleError):
    """A bundle member that is not there (callers with their own word for it catch this)."""


def _kind(mode: int) -> str:
    return next((what for is_kind, what in _KINDS if is_kind(mode)), "not a regular file")


@overload
def open_member(bundle_dir: str | os.PathLike[str], name: str, mode: Literal["rb"] = "rb", *,
                buffering: int = -1, encoding: None = None) -> BinaryIO: ...
@overload
def open_member(bundle_dir: str | os.PathLike[str], name: str, mode: Literal["r"], *,
                buffering: int = -1, encoding: str | None = None) -> TextIO: ...
def open_member(bundle_dir: str | os.PathLike[str], name: str, mode: str = "rb", *,
                buffering: int = -1, encoding: str | None = None) -> IO[Any]:
    """The bundle's file `name` (one plain name), open for reading, or a one-line
    BundleError naming it: a symbolic link, a FIFO, a directory or a device is refused,
    never followed or waited on; a missing one is MissingMember."""
    where = Path(bundle_dir) / str(name)
    if why := file_name_problem(name):
        raise BundleError(f"{where}: {why.split(': ', 1)[1]}")
    if "w" in mode or "a" in mode or "+" in mode or "x" in mode:
        raise ValueError(f"open_member reads; mode {mode!r}")
    try:
        dir_fd = os.open(bundle_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingMember(f"{bundle_dir}: no such recording bundle") from None
    except OSError as e:
        raise BundleError(f"{bundle_dir}: cannot open the bundle directory: {e.strerror}") from None
    try:
        fd = os.open(name, _MEMBER_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise MissingMember(f"{where}: missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:      # what O_NOFOLLOW gives on a link
            raise BundleError(f"{where}: a symbolic link (a bundle holds its files; "
                              f"tandem follows no link in one)") from None
        raise BundleError(f"{where}: cannot open: {e.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{where}: {_kind(st.st_mode)}, not a regular file (a bundle holds files)")
        os.set_blocking(fd, True)       # a regular file: O_NONBLOCK only guarded the open
        return open(fd, mode, buffering=buffering, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def open_path(path: str | os.PathLike[str], *, buffering: int = -1) -> BinaryIO:
    """open_member for a reader given a path (pcapng, rrstream): its last component opened
    as a member of its directory, for reading bytes. The directory itself is the caller's
    to name."""
    p = Path(path)
    return open_member(p.parent, p.name, buffering=buffering)


def file_entry(path: str | os.PathLike[str]) -> FileEntry:
    """The size and sha256 of a file, hashed in chunks (bundle files can be GBs)."""
    return FileEntry(size=os.stat(path).st_size, sha256=sha256_file(path))


def input_entry(path: str | os.PathLike[str]) -> InputFile:
    """The path, size and sha256 of an input artifact (kernel, initrd, disk base)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        return InputFile(path=str(Path(path).resolve()), size=st.st_size, sha256=input_sha256(f, st))


# A user's disk image is GBs, hashed at every record and every replay (1.7 GB/s of sha256
# on one core here: 12 s for a 20 GB disk, each time). A digest is kept per file version
# in the cache, keyed by what changes whenever its content does: device, inode, size,
# mtime and ctime in ns (a write updates ctime, which no tool can set back). Small files
# are hashed every time.
HASH_CACHE_MIN = 64 << 20


def _hash_key(st: os.stat_result) -> str:
    ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def input_sha256(f: IO[bytes], st: os.stat_result) -> str:
    """The sha256 of an open input file, from the cache when this version of it was hashed."""
    if st.st_size < HASH_CACHE_MIN or not stat.S_ISREG(st.st_mode):
        return _sha256(f)
    known = artifacts.cache_dir() / "hashes" / _hash_key(st)
    try:
        digest = known.read_text().strip()
        if _SHA256.fullmatch(digest):
            return digest
    except OSError:
        pass
    digest = _sha256(f)
    if os.fstat(f.fileno()).st_ctime_ns == st.st_ctime_ns:     # not written while hashed
        private.make_dir(known.parent)
        private.write_text(known, digest + "\n")
    return digest


def load_manifest(bundle_dir: str | os.PathLike[str]) -> Manifest:
    """The bundle's manifest, every field tandem reads checked (manifest_problem), or a
    one-line BundleError naming the first that is not well formed."""
    d = Path(bundle_dir)
    if not d.is_dir():
        raise BundleError(f"{d}: no such recording bundle")
    mf = d / MANIFEST
    try:
        with open_member(d, MANIFEST) as f:
            raw = f.read(MANIFEST_MAX + 1)
        if len(raw) > MANIFEST_MAX:
            raise BundleError(f"{mf}: over {MANIFEST_MAX} bytes (a manifest is a few KiB)")
        text = raw.decode("utf-8")
    except MissingMember:
        raise BundleError(f"{mf}: missing (not a tandem bundle, or recording never started)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BundleError(f"{mf}: unreadable: {e}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise BundleError(f"{mf}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:      # about 1,000 nested arrays or objects
        raise BundleError(f"{mf}: not valid JSON (nested too deeply)") from None
    except ValueError as e:     # an integer of more than 4,300 digits
        raise BundleError(f"{mf}: not valid JSON ({str(e).split(';')[0]})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{mf}: not a JSON object")
    if problem := unencodable(manifest):
        raise BundleError(f"{mf}: {problem}")
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"{mf}: schema {_shown(manifest.get('schema'))}, this tandem reads schema {SCHEMA}")
    problem = manifest_problem(manifest)
    if problem:
        raise BundleError(f"{mf}: {problem}")
    return Manifest.from_json(manifest)


# --- the manifest's shape -------------------------------------------------------------------
# A bundle comes from outside (a farm, a colleague, a bug report): every field tandem reads
# is checked for its type and shape when the manifest loads, so no reader meets a string
# where it wants a table (an unchecked manifest can raise ten kinds of raw exceptions in
# its readers), and no value can carry text into a QEMU option string (a `mac` of
# "52:54:00:12:34:56,romfile=..." would be a second key on the NIC's -device).

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NS_MAX = 1 << 63           # nanoseconds and sizes: what QEMU's int64 options hold
NAME_MAX = 255              # a file name in the bundle (one path component)
_DISK_FORMATS = ("raw", "qcow2")
_MAX_DEVICES = 16


def unencodable(value: Any, where: str = "") -> str | None:
    """A string of a decoded JSON document (a key or a value, at any depth) that cannot
    be written back as UTF-8, said with the field that holds it; None if every string
    can. JSON's decoder accepts a lone surrogate escape ("\\ud800") that no file
    name, path, message or file written back can carry: every later use would raise
    UnicodeEncodeError, so a document is refused whole when it is read."""
    todo: list[tuple[str, Any]] = [(where, value)]
    while todo:                  # a stack, not recursion: the decoder allows ~1,000 levels
        at, v = todo.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                name = key if _encodable(key) and key.isprintable() else _shown(key)
                if not _encodable(key):
                    return f"{at + '.' if at else ''}{name}: the key is not text (a lone surrogate escape)"
                todo.append((f"{at}.{name}" if at else name, item))
        elif isinstance(v, list):
            todo.extend((f"{at}[{i}]", item) for i, item in enumerate(v))
        elif isinstance(v, str) and not _encodable(v):
            return f"{at or 'the document'}: {_shown(v)} is not text (a lone surrogate escape)"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def input_kind_ok(kind: Any) -> bool:
    """An inputs key: kernel, initrd, disk_base (disk0's base) or disk_base.ID (disk ID's)."""
    if kind in INPUTS:
        return True
    return isinstance(kind, str) and kind.startswith("disk_base.") and _id_ok(kind[len("disk_base."):])


def _id_ok(value: Any) -> bool:
    try:
        check_id(value)
    except OptionError:
        return False
    return True


def _table_list(value: Any, rules: dict[str, Callable[[Any], bool]], required: tuple[str, ...]) -> bool:
    """A list of at most _MAX_DEVICES tables, each with its required keys set and every key
    it has well formed (machine.disks, machine.nics)."""
    return (isinstance(value, list) and len(value) <= _MAX_DEVICES
            and all(isinstance(t, dict) and all(t.get(k) is not None for k in required)
                    and all(k in rules and (t[k] is None or rules[k](t[k])) for k in t) for t in value))


_DISK_ENTRY = {"id": _id_ok, "format": lambda v: v in _DISK_FORMATS}
_NIC_ENTRY = {"netdev": _id_ok, "model": lambda v: v in NIC_DEVICES,
              "mac": lambda v: isinstance(v, str) and bool(MAC.fullmatch(v))}


def _shown(value: Any) -> str:
    """A manifest value in an error message: repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any, low: int = 0, high: int = _NS_MAX) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _text(value: Any, limit: int = 4096) -> bool:
    return isinstance(value, str) and len(value) <= limit and "\0" not in value


def _texts(value: Any, items: int, limit: int) -> bool:
    return isinstance(value, list) and len(value) <= items and all(_text(v, limit) for v in value)


# field -> (check, what it must be); a field absent or null is not checked here (the code
# that needs it says so), a present one must have its shape.
_MACHINE: FieldRules = {
    "memory_mb": (lambda v: _int(v, 16, 1 << 22), "a whole number of MiB, 16 to 4194303"),
    "smp": (lambda v: _int(v, 1, 1024), "a vCPU count, 1 to 1023"),
    "icount_shift": (lambda v: _int(v, 0, 11), "QEMU's icount shift, 0 to 10"),
    "cmdline": (_text, "a kernel command line (text, at most 4096 characters)"),
    "accel": (lambda v: v in ("tcg", "kvm"), "'tcg' or 'kvm'"),
    "machine": (lambda v: v in ("pc", "q35"), "'pc' or 'q35'"),
    "disk_format": (lambda v: v in _DISK_FORMATS, "'raw' or 'qcow2'"),
    "mac": (lambda v: isinstance(v, str) and bool(MAC.fullmatch(v)), "a MAC address (52:54:00:12:34:56)"),
    "os": (lambda v: v in catalog.GUEST_OSES, f"a guest OS ({', '.join(catalog.GUEST_OSES)})"),
    "nic_model": (lambda v: v in NIC_DEVICES, f"a NIC model of tandem's QEMU ({', '.join(sorted(NIC_DEVICES))})"),
    "stop_after_ns": (_int, "a whole number of nanoseconds"),
    "state_every_ns": (lambda v: _int(v, 100_000, 10**12), "a whole number of nanoseconds, 100000 to 10^12"),
    "lookahead_ns": (_int, "a whole number of nanoseconds"),
    "rtc_base": (lambda v: isinstance(v, str) and bool(RTC_BASE.fullmatch(v)), "a time YYYY-MM-DDTHH:MM:SS"),
    "mode": (lambda v: v in ("record", "device", "analysis"), "'record', 'device' or 'analysis'"),
    "analysis": (lambda v: _text(v, 64), "an analysis name"),
    "libvirt": (lambda v: isinstance(v, dict), "a table"),
    "boot": (lambda v: v in ("direct", "firmware"), "'direct' or 'firmware'"),
    "disks": (lambda v: _table_list(v, _DISK_ENTRY, ("id",)),
              f"a list of at most {_MAX_DEVICES} disks ({{id: a drive id, format: 'raw' or 'qcow2'}})"),
    "nics": (lambda v: _table_list(v, _NIC_ENTRY, ()),
             f"a list of at most {_MAX_DEVICES} NICs ({{netdev: an id, model: a NIC model, mac: a MAC}})"),
    "devices": (lambda v: _texts(v, 4 * _MAX_DEVICES, 64), "a list of QEMU device names"),
    "net": (lambda v: isinstance(v, dict), "a table"),
    "source": (_text, "a bundle's path"),
}
_STOP: FieldRules = {"reason": (lambda v: _text(v, 256), "text"), "vm_ns": (_int, "a whole number of nanoseconds"),
         "icount": (_int, "a whole number of instructions"),
         "power_button": (lambda v: isinstance(v, bool), "true or false"),
         "exit_status": (lambda v: _int(v, -(1 << 31), 1 << 31), "an exit status")}

# The tables of the fields above, and the fields the typed Manifest reads besides
# (their shapes are checked after every other, by _typed_problem).
_NET: FieldRules = {"backend": (lambda v: _text(v, 64), "text"),
                    "forwards": (lambda v: _texts(v, 64, 256), "a list of forwards (tcp:HOST:GUEST)"),
                    "hostfwd_port": (lambda v: _int(v, 0, 1 << 16), "a port number"),
                    "guest_port": (lambda v: _int(v, 0, 1 << 16), "a port number")}
_LIBVIRT: FieldRules = {"uuid": (lambda v: _text(v, 64), "text"), "domain": (_text, "text"),
                        "command_line": (lambda v: _text(v, 64), "text"),
                        "own": (lambda v: isinstance(v, dict), "a table")}
_IDS = (lambda v: _texts(v, _MAX_DEVICES, 256), f"a list of at most {_MAX_DEVICES} QEMU ids")
_OWN_LINE: FieldRules = {"argv": (lambda v: _texts(v, 4096, 1 << 16) and len(v) > 0, "a QEMU command line (a list of text)"),
                         "overlays": (lambda v: _texts(v, _MAX_DEVICES, 4096), "a list of file paths"),
                         "images": _IDS, "drives": _IDS, "netdevs": _IDS,
                         "serial": (lambda v: _text(v, 256), "a QEMU id"), "rng": (lambda v: _text(v, 256), "a QEMU id")}
_TOP: FieldRules = {"created": (lambda v: _text(v, 64), "a time (text)"),
                    "tandem_version": (lambda v: _text(v, 64), "text"),
                    "devlog_format": (lambda v: _int(v, 0, 1 << 16), "a device log format number"),
                    "assertions": (lambda v: isinstance(v, dict), "a table")}
_PACK: FieldRules = {"path": (_text, "a file path"),
                     "sha256": (lambda v: isinstance(v, str) and bool(_SHA256.fullmatch(v)), "a sha256 digest"),
                     "names": (lambda v: _texts(v, 1 << 16, 256), "a list of assertion names")}
_TRAFFIC = (lambda v: _fields_problem("", v, {"events": (_int, ""), "bytes": (_int, "")}) is None,
            "a table {events, bytes: whole numbers}")
_CHANNEL: FieldRules = {"kind": (lambda v: _text(v, 64), "text"), "records": (_int, "a whole number"),
                        "in": _TRAFFIC, "out": _TRAFFIC}


def _entry_problem(where: str, entry: Any, *, with_path: bool) -> str | None:
    if not isinstance(entry, dict):
        return f"{where}: {_shown(entry)} is not a table"
    if with_path and not _text(entry.get("path")):
        return f"{where}.path: {_shown(entry.get('path'))} is not a file path"
    if not _int(entry.get("size")):
        return f"{where}.size: {_shown(entry.get('size'))} is not a size in bytes"
    if not (isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
        return f"{where}.sha256: {_shown(entry.get('sha256'))} is not a sha256 digest"
    return None


# A manifest table's rules: key -> (does a value fit, what it should be, for the message).
FieldRules = dict[str, tuple[Callable[[Any], bool], str]]


def _fields_problem(where: str, table: Any, rules: FieldRules) -> str | None:
    if not isinstance(table, dict):
        return f"{where}: {_shown(table)} is not a table"
    for key, (ok, what) in rules.items():
        value = table.get(key)
        if value is not None and not ok(value):
            return f"{where + '.' if where else ''}{key}: {_shown(value)} is not {what}"
    return None


def file_name_problem(name: Any) -> str | None:
    """Why a `files` key cannot name a file of the bundle, or None: one plain name."""
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"files: {_shown(name)} is not a file name (1 to {NAME_MAX} bytes)"
    if "/" in name or not name.isprintable() or name in (".", ".."):     # a newline would cut a message
        return f"files: {_shown(name)} is not a plain file name in the bundle"
    return None


def manifest_problem(m: dict[str, Any]) -> str | None:
    """The first field of manifest m whose type or shape is wrong, said in one line; None if
    every field tandem reads is well formed."""
    if not isinstance(m.get("state"), str) or m["state"] not in STATES:
        return f"state: {_shown(m.get('state'))} is not one of {', '.join(STATES)}"
    for section in ("qemu", "inputs", "machine", "files", "stop", "channels"):
        if m.get(section) is not None and not isinstance(m[section], dict):
            return f"{section}: {_shown(m[section])} is not a table"
    for key, value in (m.get("qemu") or {}).items():
        if value is not None and not _text(value):
            # The key is the manifest's own: shown as text only if printable (a newline would cut the message).
            return f"qemu.{key if key.isprintable() else _shown(key)}: {_shown(value)} is not text"
    for kind, entry in (m.get("inputs") or {}).items():
        if not input_kind_ok(kind):
            return f"inputs.{_shown(kind)}: not one of {', '.join(INPUTS)} or disk_base.ID"
        if entry is not None and (why := _entry_problem(f"inputs.{kind}", entry, with_path=True)):
            return why
    for name, entry in (m.get("files") or {}).items():
        if why := file_name_problem(name) or _entry_problem(f"files.{name}", entry, with_path=False):
            return why
    for where, table, rules in (("machine", m.get("machine"), _MACHINE), ("stop", m.get("stop"), _STOP)):
        if table is not None and (why := _fields_problem(where, table, rules)):
            return why
    if m.get("wall_time_s") is not None and not (isinstance(m["wall_time_s"], (int, float))
                                                 and not isinstance(m["wall_time_s"], bool)
                                                 and 0 <= m["wall_time_s"] < 1e9):
        return f"wall_time_s: {_shown(m['wall_time_s'])} is not a number of seconds"
    return _typed_problem(m)


def _typed_problem(m: dict[str, Any]) -> str | None:
    """The first field the typed Manifest reads beyond what replay needs (when the
    recording started, its channels, the declared assertions, the machine's network and
    libvirt domain) whose shape is wrong; checked after every other field."""
    machine = m.get("machine") or {}
    tables = [("", m, _TOP), ("assertions", m.get("assertions"), _PACK), ("machine.net", machine.get("net"), _NET),
              ("machine.libvirt", machine.get("libvirt"), _LIBVIRT),
              ("machine.libvirt.own", (machine.get("libvirt") or {}).get("own")
               if isinstance(machine.get("libvirt"), dict) else None, _OWN_LINE)]
    tables += [(f"channels.{name if name.isprintable() else _shown(name)}", entry, _CHANNEL)
               for name, entry in (m.get("channels") or {}).items()]
    for where, table, rules in tables:
        if table is not None and (why := _fields_problem(where, table, rules)):
            return why
    return None


def verify_files(bundle_dir: str | os.PathLike[str], manifest: Manifest, *,
                 check_hash: bool = True) -> list[Problem]:
    """Compare the bundle's files against the manifest's `files` section."""
    d = Path(bundle_dir)
    problems = []
    for name, entry in sorted(manifest.files.items()):
        try:
            with open_member(d, name) as f:
                size = os.fstat(f.fileno()).st_size
                if size != (want := entry.size):
                    what = "truncated" if isinstance(want, int) and size < want else "size mismatch"
                    problems.append(Problem(name, "size", f"{what}: {d / name} has {size} bytes, manifest says {want}"))
                elif check_hash and _sha256(f) != entry.sha256:
                    problems.append(Problem(name, "hash", f"{d / name}: checksum mismatch (sha256 differs from manifest)"))
        except BundleError as e:    # a link, FIFO, directory, bad name: not read
            problems.append(Problem(name, "missing", str(e)))
    return problems


def symlink_problems(bundle_dir: str | os.PathLike[str]) -> list[str]:
    """The entries of a bundle that are neither files nor directories, one line each: a
    symbolic link (one to /etc/shadow must not be read, hashed or even sized), a FIFO (it
    would block its reader), a socket or a device. Directories are the bundle's own (an
    analysis workdir is made in it); one named as a file is refused by open_member."""
    d = Path(bundle_dir)
    out = []
    for p in sorted(d.iterdir()):
        try:
            mode = p.lstat().st_mode
        except FileNotFoundError:   # a live bundle's manifest.json.tmp, renamed meanwhile
            continue
        if stat.S_ISLNK(mode):
            out.append(f"{p}: a symbolic link (a bundle holds its files; tandem follows no link in one)")
        elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            out.append(f"{p}: {_kind(mode)}, not a regular file (a bundle holds files)")
    return out


def regular_file(path: Path) -> bool:
    """path is a file of its own, not a link to one."""
    return path.is_file() and not path.is_symlink()


def verify_inputs(manifest: Manifest) -> list[Problem]:
    """The recorded inputs (host files the manifest names: kernel, initrd, disk base) that
    are missing or changed. A path comes from the bundle: it is opened without waiting on
    a FIFO and kept only if it is a regular file, and what cannot be read is a problem
    (/proc/self/mem is a regular file of size 0 whose read fails with EIO)."""
    problems = []
    for kind, entry in manifest.inputs.items():
        if entry is None or not input_kind_ok(kind):
            continue  # e.g. no initrd
        path = entry.path
        shown = printable(str(path))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK) if isinstance(path, str) and path else None
        except OSError:
            fd = None
        if fd is None:
            problems.append(Problem("", "input", f"{kind} {shown}: not found"))
            continue
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            problems.append(Problem("", "input", f"{kind} {shown}: {_kind(st.st_mode)}, not a file"))
            continue
        with open(fd, "rb") as f:
            try:
                if st.st_size != entry.size or input_sha256(f, st) != entry.sha256:
                    problems.append(Problem("", "input", f"{kind} {shown}: changed since recording"))
            except OSError as e:
                problems.append(Problem("", "input", f"{kind} {shown}: unreadable: {e.strerror}"))
    return problems


def _short(build_id: Any) -> str:
    return printable(str(build_id)[:12])


def printable(text: str) -> str:
    """A manifest string in a message or on a terminal: itself, or its repr if it holds a
    control character (a newline would make two lines, an escape sequence would drive
    the terminal that `tandem inspect` prints to)."""
    return text if text.isprintable() else _shown(text)


def check_bundle(bundle_dir: str | os.PathLike[str], *, qemu_build_id: str | None = None,
                 partial: bool = False) -> Manifest:
    """Raise BundleError for the first reason the bundle cannot be replayed; return the manifest.

    partial=True accepts an unfinished recording: the stream and the device log may
    differ from the manifest (their readers find the intact prefix).
    """
    d = Path(bundle_dir)
    manifest = load_manifest(d)
    state = manifest.state
    if state not in STATES:
        raise BundleError(f"{d / MANIFEST}: unknown state {state!r}")
    if state != "complete" and not partial:
        raise BundleError(f"{d}: recording is {state}, not complete (replay the intact prefix with --partial)")
    recorded = manifest.qemu.build_id
    if qemu_build_id is not None and recorded != qemu_build_id:
        raise BundleError(f"{d}: recorded with QEMU build {_short(recorded)}, this is {_short(qemu_build_id)}")
    for link in symlink_problems(d):
        raise BundleError(link)
    for problem in verify_files(d, manifest):
        if partial and problem.file in PARTIAL_TOLERANT and problem.kind in ("size", "hash"):
            continue
        raise BundleError(problem.message)
    for problem in verify_inputs(manifest):
        raise BundleError(problem.message)
    return manifest
