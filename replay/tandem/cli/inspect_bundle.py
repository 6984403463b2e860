"""`tandem inspect`: summarise a bundle and report its integrity.

Inspect is a diagnosis tool, so it never stops at the first problem: every
reader error, torn tail and manifest mismatch becomes an entry in `problems`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .. import private
from ..errors import BundleError
from ..formats import bundle, pcapng, rrstream

log = logging.getLogger(__name__)


def _channels(path: Path, problems: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    reader = pcapng.DevlogReader(path)
    chans: dict[str, dict[str, Any]] = {}
    try:
        for ev in reader:
            c = chans.setdefault(ev.channel, {
                "kind": ev.kind, "events": 0, "bytes": 0, "first_vm_ns": ev.vm_ns,
                "last_vm_ns": ev.vm_ns, "in": {"events": 0, "bytes": 0},
                "out": {"events": 0, "bytes": 0}})
            c["events"] += 1
            c["bytes"] += len(ev.data)
            c["last_vm_ns"] = ev.vm_ns
            if ev.direction:
                c[ev.direction]["events"] += 1
                c[ev.direction]["bytes"] += len(ev.data)
    except BundleError as e:
        problems.append(str(e))
        if not reader.interfaces:       # refused at open (a directory) or no header: nothing to count
            return {}, {"error": str(e)}
    for iface, stats in zip(reader.interfaces, reader.stats):
        c = chans.setdefault(iface.name, {"kind": iface.kind, "events": 0, "bytes": 0,
                                          "first_vm_ns": None, "last_vm_ns": None,
                                          "in": {"events": 0, "bytes": 0},
                                          "out": {"events": 0, "bytes": 0}})
        c["records"] = reader.records[iface.id]
        if stats is not None and stats.count is not None and stats.count != c["records"]:
            problems.append(f"{path}: channel {iface.name}: {c['records']} records, "
                            f"statistics block says {stats.count}")
    closed = bool(reader.stats) and all(s is not None for s in reader.stats)
    if reader.torn_at is not None:
        problems.append(f"{path}: torn tail at offset {reader.torn_at}")
    elif not closed:
        problems.append(f"{path}: not closed cleanly (no statistics blocks)")
    return chans, {"closed_cleanly": closed, "torn_at": reader.torn_at, "format": reader.format,
                   "records": sum(reader.records)}


def _stream(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        info = rrstream.scan(path)
        live = rrstream.is_being_written(path)
    except BundleError as e:
        problems.append(str(e))
        return {"error": str(e)}
    if info.torn_at is not None:
        problems.append(f"{path}: torn tail at offset {info.torn_at}")
    elif not info.finished and not live:
        problems.append(f"{path}: unfinished (no END segment)")
    return {
        "version": info.version, "segments": len(info.segments),
        "raw_bytes": info.raw_bytes, "stored_bytes": info.stored_bytes,
        "ratio": info.raw_bytes / info.stored_bytes if info.stored_bytes else None,
        "last_icount": info.last_icount, "finished": info.finished,
        "torn_at": info.torn_at, "being_written": live,
    }


def inspect(bundle_dir: str | os.PathLike) -> dict[str, Any]:
    d = Path(bundle_dir)
    if not d.is_dir():
        raise BundleError(f"{d}: no such recording bundle")
    problems: list[str] = []
    result: dict[str, Any] = {"bundle": str(d), "manifest": None, "channels": {},
                              "devlog": None, "stream": None}
    try:
        manifest = bundle.load_manifest(d)
        result["manifest"] = {k: manifest.get(k) for k in
                              ("state", "created", "tandem_version", "stop", "wall_time_s")}
        result["manifest"]["qemu_version"] = (manifest.get("qemu") or {}).get("version")
        if manifest.get("state") != "complete":
            problems.append(f"{d}: recording state is {manifest.get('state')}")
        problems += [p.message for p in bundle.verify_files(d, manifest)]
        problems += [p.message for p in bundle.verify_inputs(manifest)]
    except BundleError as e:
        problems.append(str(e))
    not_files = bundle.symlink_problems(d)
    problems += not_files
    result["files"] = {p.name: p.stat().st_size for p in sorted(d.iterdir()) if bundle.regular_file(p)}
    # A link or FIFO is listed above and not opened; anything else there is read through
    # bundle.open_member, which refuses what is not a file (a directory) in one line.
    refused = {line.split(": ", 1)[0] for line in not_files}
    if os.path.lexists(d / bundle.DEVLOG) and str(d / bundle.DEVLOG) not in refused:
        result["channels"], result["devlog"] = _channels(d / bundle.DEVLOG, problems)
    if os.path.lexists(d / bundle.STREAM) and str(d / bundle.STREAM) not in refused:
        result["stream"] = _stream(d / bundle.STREAM, problems)
    problems = list(dict.fromkeys(problems))    # a member the manifest lists is refused twice
    result["integrity"] = {"ok": not problems, "problems": problems}
    result["exposed"] = {str(p): f"{mode:04o}" for p, mode in private.exposed(d)}
    if result["exposed"]:
        log.warning("%s", exposure_warning(d, result["exposed"]))
    return result


def exposure_warning(d: Path, exposed: dict[str, str]) -> str:
    """One line: the bundle, what of it group/others may read or write, and the fix. A
    warning, not an integrity problem: the recording is intact, only not private (one
    recorded before tandem made bundles 0700/0600, or copied with a loose umask)."""
    first, mode = next(iter(exposed.items()))
    more = f" and {len(exposed) - 1} more" if len(exposed) > 1 else ""
    return (f"warning: {d}: readable or writable by group/others ({first} is {mode}{more}), and a "
            f"recording holds the guest's traffic and disk writes; make it private: chmod -R go= {d}")


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [["-" if v is None else bundle.printable(str(v)) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:  # numbers right-aligned, text left-aligned
        return "  ".join(v.rjust(w) if v.replace(".", "", 1).isdigit() else v.ljust(w)
                         for v, w in zip(row, widths)).rstrip()

    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def render(info: dict[str, Any]) -> str:
    out = [f"bundle {info['bundle']}"]
    m = info.get("manifest")
    if m:       # the manifest's strings as printable text: a bundle must not drive the terminal
        m = {k: bundle.printable(v) if isinstance(v, str) else v for k, v in m.items()}
        stop = {k: bundle.printable(v) if isinstance(v, str) else v for k, v in (m.get("stop") or {}).items()}
        out.append(f"state {m.get('state')}, created {m.get('created')}, QEMU {m.get('qemu_version')}, "
                   f"stop {stop.get('reason')} at vm_ns {stop.get('vm_ns')} icount {stop.get('icount')}, "
                   f"wall {m.get('wall_time_s')} s")
    if info["channels"]:
        rows = [[name, c["kind"], c["events"], c.get("records"), c["bytes"], c["in"]["events"],
                 c["in"]["bytes"], c["out"]["events"], c["out"]["bytes"], c["first_vm_ns"], c["last_vm_ns"]]
                for name, c in info["channels"].items()]
        dl = info.get("devlog") or {}
        out += ["", f"device log: format {dl.get('format')}, {dl.get('records')} pcapng records "
                    "(what Wireshark counts)",
                _table(["channel", "kind", "events", "records", "bytes", "in ev", "in bytes",
                        "out ev", "out bytes", "first vm_ns", "last vm_ns"], rows)]
    s = info.get("stream")
    if s and "error" not in s:
        ratio = f"{s['ratio']:.2f}" if s["ratio"] else None
        out += ["", _table(["replay stream", "segments", "raw bytes", "stored bytes", "ratio",
                            "last icount", "finished"],
                           [[bundle.STREAM, s["segments"], s["raw_bytes"], s["stored_bytes"], ratio,
                             s["last_icount"], "yes" if s["finished"] else
                             ("being written" if s["being_written"] else "no")]])]
    if info.get("files"):
        out += ["", _table(["file", "size"], [[n, sz] for n, sz in info["files"].items()])]
    integ = info["integrity"]
    out += ["", "integrity: ok" if integ["ok"] else f"integrity: {len(integ['problems'])} problem(s)"]
    out += [f"  - {bundle.printable(p)}" for p in integ["problems"]]     # names of the bundle's files
    return "\n".join(out)
