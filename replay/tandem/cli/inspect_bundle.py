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
from ..formats.bundle import Manifest
from ..formats.wire import WireSummary
from ..machine import NetSection, disk_input

log = logging.getLogger(__name__)


def _channels(path: Path, problems: list[str], wire: WireSummary) -> tuple[dict[str, Any], dict[str, Any]]:
    reader = pcapng.DevlogReader(path)
    chans: dict[str, dict[str, Any]] = {}
    try:
        for ev in reader:
            if ev.kind == "net":
                wire.see(ev.data)
            c = chans.setdefault(ev.channel, {
                "kind": ev.kind, "events": 0, "bytes": 0, "first_vm_ns": ev.vm_ns,
                "last_vm_ns": ev.vm_ns, "in": {"events": 0, "bytes": 0},
                "out": {"events": 0, "bytes": 0}})
            c["events"] += 1
            c["bytes"] += len(ev.data)
            c["last_vm_ns"] = ev.vm_ns
            if ev.vcpu is not None:     # the vCPU whose access made it (docs/formats.md)
                by = c.setdefault("vcpus", {})
                by[str(ev.vcpu)] = by.get(str(ev.vcpu), 0) + 1
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
        c["iface"] = iface.id
        if iface.kind == pcapng.STATE:      # its checkpoints, kept apart from the events
            mine = [s for s in reader.states if s.iface == iface.id]
            c["events"] = c["out"]["events"] = len(mine)
            c["bytes"] = c["out"]["bytes"] = sum(len(s.data) for s in mine)
            c["first_vm_ns"], c["last_vm_ns"] = (mine[0].vm_ns, mine[-1].vm_ns) if mine else (None, None)
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
        result["manifest"] = {"state": manifest.state, "created": manifest.created,
                              "tandem_version": manifest.tandem_version, "stop": manifest.json_of("stop"),
                              "wall_time_s": manifest.wall_time_s, "qemu_version": manifest.qemu.version}
        result["machine"] = _machine(manifest)
        if manifest.state != "complete":
            problems.append(f"{d}: recording state is {manifest.state}")
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
        wire = WireSummary()
        result["channels"], result["devlog"] = _channels(d / bundle.DEVLOG, problems, wire)
        result["wire"] = wire.as_dict()
    if os.path.lexists(d / bundle.STREAM) and str(d / bundle.STREAM) not in refused:
        result["stream"] = _stream(d / bundle.STREAM, problems)
    problems = list(dict.fromkeys(problems))    # a member the manifest lists is refused twice
    result["integrity"] = {"ok": not problems, "problems": problems}
    result["exposed"] = {str(p): f"{mode:04o}" for p, mode in private.exposed(d)}
    if result["exposed"]:
        log.warning("%s", exposure_warning(d, result["exposed"]))
    return result


def _machine(manifest: Manifest) -> dict[str, Any]:
    """How the bundle's guest booted and what it had: boot method, memory, disks (base
    image, hash, size), NICs and the host's forwards, from the manifest (shapes checked
    when it loaded; the texts are printed through bundle.printable)."""
    inputs, machine = manifest.inputs, manifest.machine
    boot = machine.boot or "direct"
    disks = []
    for disk in machine.disk_table(inputs.get("disk_base") is not None):
        base = inputs.get(disk_input(str(disk.id)))
        disks.append({"id": disk.id, "format": disk.format or "raw", "base": base and base.path,
                      "sha256": base and base.sha256, "size": base and base.size})
    net = machine.net or NetSection()
    forwards = net.forwards
    if forwards is None and net.hostfwd_port:
        forwards = (f"tcp:{net.hostfwd_port}:{7000 if net.guest_port is None else net.guest_port}",)
    nics = ([n.to_json() for n in machine.nics] if machine.nics else
            [{"netdev": "net0", "model": machine.nic_model or "virtio-net-pci", "mac": machine.mac}])
    return {"boot": boot, "kernel": manifest.input_paths.get("kernel") if boot == "direct" else None,
            "cmdline": machine.cmdline if boot == "direct" else None, "memory_mb": machine.memory_mb,
            "os": machine.os or "linux", "cpu": machine.cpu, "mode": _mode(machine.mode),
            "vcpus": machine.smp or 1, "accel": machine.accel or "tcg",
            "disks": disks, "nics": nics, "forwards": list(forwards or ()), "network": net.backend}


def _mode(mode: str | None) -> str:
    """How the bundle was recorded: exact (the default), device, or an analysis run's own."""
    return "exact" if mode in (None, "record") else mode


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


_MODE_LINE = {
    "exact": "recorded in exact mode ({cpus}, {accel}, -icount): replays exactly and semantically",
    "device": "recorded in device mode ({cpus}, {accel}, no -icount): replays semantically, not exactly",
    "analysis": "an analysis run's own recording ({cpus}, {accel}, -icount): replays exactly",
}


def _machine_lines(machine: dict[str, Any], channels: dict[str, Any]) -> list[str]:
    """Boot, disks (with the bytes the guest wrote, from the device log's block channel of
    each drive), NICs and forwards."""
    boot = (f"boot: direct, kernel {machine['kernel']}, command line {machine['cmdline']!r}" if machine["boot"] == "direct"
            else "boot: firmware (SeaBIOS, the first disk's own bootloader)")
    cpu = f", CPU {machine['cpu']}" if machine.get("cpu") else ""
    lines = [bundle.printable(f"guest OS {machine['os']}{cpu}; {boot}") + f"; memory {machine.get('memory_mb')} MiB",
             _MODE_LINE[machine["mode"]].format(cpus=f"{machine['vcpus']} vCPU{'s' if machine['vcpus'] > 1 else ''}",
                                                accel=machine["accel"])]
    if machine["disks"]:
        # A disk's channel is named by its drive id; on libvirt's own command line by the
        # device libvirt made for it, in the disks' order.
        blocks = sorted((c for c in channels.values() if c["kind"] == "block"), key=lambda c: c.get("iface", 0))
        by_order = dict(zip((d["id"] for d in machine["disks"]), blocks)) if len(blocks) == len(machine["disks"]) \
            else {}
        rows = [[d["id"], d["format"], d["base"], (d["sha256"] or "")[:16], d["size"],
                 (channels.get(d["id"]) or by_order.get(d["id"]) or {}).get("out", {}).get("bytes")]
                for d in machine["disks"]]
        lines += [_table(["disk", "format", "base image", "sha256", "base bytes", "bytes written"], rows)]
    nics = ", ".join(f"{n.get('netdev')} {n.get('model')}{' ' + n['mac'] if n.get('mac') else ''}"
                     for n in machine["nics"])
    if machine.get("network") == "libvirt":
        lines.append(bundle.printable(f"NICs: {nics}; on libvirt's own command line: its network as libvirt "
                                      f"made it (no forwards)"))
    else:
        lines.append(bundle.printable(f"NICs: {nics}; forwards (host 127.0.0.1 to guest, on net0): "
                                      f"{', '.join(machine['forwards']) or 'none'}"))
    return lines


def _wire_lines(w: dict[str, Any]) -> list[str]:
    """The guest's own ARP, DHCP and DNS, as counts and a few examples."""
    def counts(c: dict[str, int]) -> str:
        return ", ".join(f"{n} {k}" for k, n in c.items()) or "none"
    lines = [f"on the wire: ARP {counts(w['arp'])}; DHCP {counts(w['dhcp'])}"
             + (f" (leased {', '.join(w['leased'])})" if w["leased"] else "") + f"; DNS {counts(w['dns'])}"]
    if w["names"]:
        lines.append("  DNS names asked: " + ", ".join(w["names"]))
    return [bundle.printable(line) for line in lines]


def _vcpus(by: dict[str, int] | None) -> str:
    """A channel's events by the vCPU that made them, `0:12,1:30`; `-` when the log names
    none (frames, a device's own completions, a log older than the field)."""
    return ",".join(f"{v}:{n}" for v, n in sorted(by.items(), key=lambda x: int(x[0]))) if by else "-"


def render(info: dict[str, Any]) -> str:
    out = [f"bundle {info['bundle']}"]
    head = info.get("manifest")
    if head:    # the manifest's strings as printable text: a bundle must not drive the terminal
        head = {k: bundle.printable(v) if isinstance(v, str) else v for k, v in head.items()}
        stop = {k: bundle.printable(v) if isinstance(v, str) else v for k, v in (head.get("stop") or {}).items()}
        out.append(f"state {head.get('state')}, created {head.get('created')}, QEMU {head.get('qemu_version')}, "
                   f"stop {stop.get('reason')} at vm_ns {stop.get('vm_ns')} icount {stop.get('icount')}, "
                   f"wall {head.get('wall_time_s')} s")
    if info.get("machine"):
        out += ["", *_machine_lines(info["machine"], info["channels"])]
    if info["channels"]:
        rows = [[name, c["kind"], c["events"], c.get("records"), c["bytes"], c["in"]["events"],
                 c["in"]["bytes"], c["out"]["events"], c["out"]["bytes"], _vcpus(c.get("vcpus")),
                 c["first_vm_ns"], c["last_vm_ns"]]
                for name, c in info["channels"].items()]
        dl = info.get("devlog") or {}
        out += ["", f"device log: format {dl.get('format')}, {dl.get('records')} pcapng records "
                    "(what Wireshark counts)",
                _table(["channel", "kind", "events", "records", "bytes", "in ev", "in bytes",
                        "out ev", "out bytes", "vCPU:events", "first vm_ns", "last vm_ns"], rows)]
    if info.get("wire"):
        out += ["", *_wire_lines(info["wire"])]
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
