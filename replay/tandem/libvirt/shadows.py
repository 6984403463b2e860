"""Shadow domains (`tandem attach --no-follow` / `tandem detach`).

`attach` reads an existing domain (its disk, NIC model and MAC), and per analysis
defines and starts `DOMAIN-tandem-NAME` (a `ShadowDomain`): the analysis kernel, a qcow2
overlay over the native's disk, the native's NIC model and MAC, and the feed
(qemu-patches/0027) on a unix socket the caller serves with a `qemu.feed.FeedServer`.
What tandem created is kept in each domain's own `<metadata>`, so `detach` removes
exactly that. live/attach.py's `follow` is `tandem attach` itself.
"""
from __future__ import annotations

import datetime
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import artifacts, catalog, private
from ..errors import InfraError, TandemError
from ..machine import (
    LOOKAHEAD_NS,
    NIC_MODELS,
    Feed,
    Guest,
    Run,
    analyses_given,
    check_mac,
)
from ..qemu.image import make_overlay
from .daemon import binding
from .domain import SHADOW_SUFFIX, domain_xml

if TYPE_CHECKING:     # libvirt-python has no type information: the names say what is held
    import libvirt

NS = "urn:tandem:libvirt:1"          # tandem's <metadata> namespace
ET.register_namespace("tandem", NS)


FEED_RECONNECT_MS = 200     # a shadow's QEMU retries the feed socket until its feeder listens


@dataclass
class ShadowDomain:
    """One analysis VM of a native domain, as libvirt knows it.

    feed_socket: the shadow's QEMU connects here (retrying every FEED_RECONNECT_MS)
    and waits at VM time 0 until it is fed: bind a qemu.feed.FeedServer on this path,
    accept, then send inputs and horizons. qmp_socket: tandem's own QMP (libvirt keeps
    its monitor to itself).
    """
    name: str
    native: str
    analysis: str
    state_dir: Path
    overlay: Path | None
    feed_socket: Path
    qmp_socket: Path

    def qmp(self, timeout: float = 10.0):
        """A connected QMP client on tandem's own monitor socket of the shadow's QEMU."""
        from ..qemu.vm import QMPUnavailable, qmp_connect
        try:
            return qmp_connect(self.qmp_socket, timeout, poll_s=0.1)
        except QMPUnavailable as e:
            raise InfraError(f"{self.name}: {e}") from None

    def to_json(self) -> dict:
        return {"name": self.name, "native": self.native, "analysis": self.analysis,
                "state_dir": str(self.state_dir), "overlay": str(self.overlay) if self.overlay else None,
                "feed_socket": str(self.feed_socket), "qmp_socket": str(self.qmp_socket)}


@dataclass
class NativeInfo:
    """What a shadow takes from the native domain."""
    name: str
    uuid: str
    active: bool
    disk: Path | None
    disk_format: str | None
    disk_readonly: bool
    nic_model: str | None
    mac: str | None
    memory_mib: int
    nic_type: str | None = None     # <interface type>: user, network, bridge, ...
    kernel: str | None = None       # direct kernel boot: <os><kernel>, <initrd>, <cmdline>
    initrd: str | None = None
    cmdline: str = ""
    vcpus: int = 1
    disks: tuple[tuple[Path, str], ...] = ()    # every disk, (file, format), in the domain's order
    virt_type: str = "qemu"         # <domain type>: qemu (TCG) or kvm
    clock: str = "utc"              # <clock offset>
    acpi: bool = True               # <features><acpi/>
    nic_source: str | None = None   # the NIC's libvirt network or bridge
    passthrough: str | None = None  # the first device whose work is outside QEMU (<hostdev>, a vhost-user NIC)
    machine: str = "pc"             # <os><type machine>: "q35" for any pc-q35-*, else "pc" (i440FX)
    display: str | None = None      # the first device of a graphical console (<graphics>, <video>, ...)
    side_channel: str | None = None     # the first character device beside the first serial port (<channel>, ...)


def shadow_name(native: str, analysis: str) -> str:
    return f"{native}{SHADOW_SUFFIX}{analysis}"


def read_native(dom) -> NativeInfo:
    """The native domain's disk, NIC and memory, from its (inactive) definition."""
    libvirt = binding()
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    name = root.findtext("name", "")
    if root.find(f"metadata/{{{NS}}}shadow") is not None:
        raise TandemError(f"{name}: is itself a tandem shadow (attach to its native domain)")
    disks: list[tuple[Path, str]] = []
    readonly = False
    for d in root.findall("devices/disk"):
        if d.get("device", "disk") != "disk":      # cdrom, floppy, lun
            raise TandemError(f"{name}: a {d.get('device')} device; tandem records disks only (the guest "
                              f"would boot without it): remove it from the domain, or make it a disk")
        src = d.find("source")
        file = src.get("file") if src is not None else None
        if d.get("type") != "file" or not file:
            raise TandemError(f"{name}: its disk {len(disks)} is not a file (type {d.get('type')!r}); "
                              f"a recording's and a shadow's overlays need a file to back onto")
        target = d.find("target")
        bus = target.get("bus") if target is not None else None
        if bus not in (None, "virtio"):
            raise TandemError(f"{name}: disk {file}: bus {bus!r}; tandem's QEMU runs disks on virtio-blk")
        drv = d.find("driver")
        disks.append((Path(file), (drv.get("type") if drv is not None else None) or "raw"))
        readonly = readonly or d.find("readonly") is not None
    disk, fmt = disks[0] if disks else (None, None)
    nics = root.findall("devices/interface")
    if len(nics) > 1:
        raise TandemError(f"{name}: {len(nics)} network interfaces; tandem feeds one")
    model = mac = nic_type = nic_source = None
    if nics:
        nic_type = nics[0].get("type")
        src = nics[0].find("source")
        nic_source = (src.get("network") or src.get("bridge")) if src is not None else None
        m = nics[0].find("model")
        model = m.get("type") if m is not None else "rtl8139"    # libvirt's default on pc
        a = nics[0].find("mac")
        mac = check_mac(a.get("address") if a is not None else None, f"{name}: its NIC's <mac address>")
    mem = root.find("memory")
    if mem is None or not (mem.text or "").strip().isdigit():
        raise TandemError(f"{name}: its <memory> is missing or not a number of KiB")
    scale = {"KiB": 1 / 1024, "k": 1 / 1024, "MiB": 1, "M": 1, "GiB": 1024, "G": 1024}
    memory = int(int(mem.text or "") * scale.get(mem.get("unit", "KiB"), 1 / 1024))
    clock = root.find("clock")
    return NativeInfo(name, root.findtext("uuid", ""), bool(dom.isActive()), disk, fmt, readonly,
                      model, mac, memory, nic_type, root.findtext("os/kernel"), root.findtext("os/initrd"),
                      root.findtext("os/cmdline") or "", int(root.findtext("vcpu") or 1), tuple(disks),
                      virt_type=root.get("type", "qemu"),
                      clock=clock.get("offset", "utc") if clock is not None else "utc",
                      acpi=root.find("features/acpi") is not None, nic_source=nic_source,
                      passthrough=_passthrough(root), machine=_machine(root), display=_display(root),
                      side_channel=_side_channel(root))


def _display(root: ET.Element) -> str | None:
    """The first device of the domain that belongs to a graphical console, as its XML
    says it: what virt-install adds beside <graphics> (a <video> card, <sound>, a USB
    tablet, SPICE's channels and USB redirection)."""
    devices = root.find("devices")
    for el in devices if devices is not None else ():
        model = el.find("model")
        if el.tag == "graphics":
            return f"<graphics type='{el.get('type', '')}'>"
        if el.tag == "video" and (model is None or model.get("type") != "none"):
            return f"<video> model {model.get('type') if model is not None else 'default'!r}"
        if el.tag in ("sound", "redirdev", "smartcard"):
            return f"<{el.tag}>"
        if el.tag == "input" and el.get("bus") == "usb":
            return f"<input type='{el.get('type', '')}' bus='usb'>"
        if el.tag == "channel" and el.get("type") in ("spicevmc", "spiceport", "qemu-vdagent"):
            return f"<channel type='{el.get('type')}'>"
    return None


def _side_channel(root: ET.Element) -> str | None:
    """The first character device of the domain beside its first serial port and the
    console that stands for it: a <channel> (the guest agent's), another <serial>, a
    <parallel>, a <console> of its own (virtio)."""
    devices = root.find("devices")
    serials = 0
    for el in devices if devices is not None else ():
        target = el.find("target")
        if el.tag == "serial":
            serials += 1
            if serials > 1:
                return f"a second <serial> (port {target.get('port', '?') if target is not None else '?'})"
        elif el.tag == "console" and target is not None and target.get("type", "serial") != "serial":
            return f"<console> of target type {target.get('type')!r}"
        elif el.tag == "channel":
            name = target.get("name") if target is not None else None
            return f"<channel type='{el.get('type', '')}'>" + (f" ({name})" if name else "")
        elif el.tag == "parallel":
            return "<parallel>"
    return None


def _machine(root: ET.Element) -> str:
    """The domain's machine as tandem's manifest names it: q35 for libvirt's pc-q35-*
    (or plain q35), else pc (pc, pc-i440fx-*, or none given: libvirt's default on x86)."""
    t = root.find("os/type")
    return "q35" if t is not None and "q35" in t.get("machine", "") else "pc"


def _passthrough(root: ET.Element) -> str | None:
    """The first device of the domain whose work QEMU does not see: a host device passed
    through (<hostdev>, a NIC of type hostdev) or a vhost-user NIC (its frames go between
    the guest's memory and another process)."""
    for el in root.iter():
        if el.tag == "hostdev":
            return f"a host device passed through (<hostdev type='{el.get('type', '')}'>)"
        if el.tag == "interface" and el.get("type") in ("hostdev", "vhostuser", "vdpa"):
            return f"a NIC of type {el.get('type')!r}"
    return None


_device_help: dict[str, str] = {}


def _has_device(binary: str, device: str) -> bool:
    if binary not in _device_help:
        r = subprocess.run([binary, "-device", "help"], check=False, capture_output=True, text=True, timeout=30)
        _device_help[binary] = r.stdout + r.stderr
    return f'name "{device}"' in _device_help[binary]


def _shadow_nic(binary: str, native: NativeInfo) -> str:
    """The QEMU device of the native's NIC model, refused by name when tandem's QEMU lacks it."""
    model = native.nic_model or "virtio"
    dev = NIC_MODELS.get(model)
    if dev is None or not _has_device(binary, dev):
        raise TandemError(f"{native.name}: NIC model {model!r}: tandem's QEMU has no such "
                          f"device (its device set is qemu-patches/0001: virtio-net)")
    return dev


def _metadata(native: NativeInfo, analysis: str, guest: Guest, sh: ShadowDomain, backing: Path | None,
              rtc_base: str) -> ET.Element:
    md = ET.Element(f"{{{NS}}}shadow", native=native.name, analysis=analysis)
    if native.uuid:
        md.set("native-uuid", native.uuid)
    md.set("created", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    ET.SubElement(md, f"{{{NS}}}statedir", path=str(sh.state_dir))
    if sh.overlay:
        ET.SubElement(md, f"{{{NS}}}overlay", path=str(sh.overlay), backing=str(backing),
                      format=native.disk_format or "raw")
    ET.SubElement(md, f"{{{NS}}}socket", role="feed", path=str(sh.feed_socket))
    ET.SubElement(md, f"{{{NS}}}socket", role="qmp", path=str(sh.qmp_socket))
    if guest.kernel is None:
        raise TandemError(f"{analysis}: an analysis guest boots a kernel of its own (this one has none)")
    kernel = ET.SubElement(md, f"{{{NS}}}kernel", path=guest.kernel)
    if guest.initrd:
        kernel.set("initrd", guest.initrd)
    ET.SubElement(md, f"{{{NS}}}rtc", base=rtc_base)
    return md


def default_state_dir(native: str) -> Path:
    return artifacts.cache_dir() / "shadows" / native


def attach(conn, domain: str, analyses: list[catalog.Analysis], *, state_dir: str | Path | None = None,
           lookahead_ns: int | None = None, rtc_base: str | None = None,
           start: bool = True) -> list[ShadowDomain]:
    """Define (and start) one shadow domain per analysis for the native `domain`.

    Each shadow: the analysis kernel and initramfs, a qcow2 overlay over the native's
    disk, the native's NIC model and MAC, 1 vCPU, tandem's analysis-mode QEMU argv
    (icount, sleep=off, the feed for network, serial and entropy), and <metadata>
    naming everything tandem created. A started shadow's QEMU waits at VM time 0
    for its feeder on ShadowDomain.feed_socket. rtc_base: the guest's wall clock at boot
    (the native's start, UTC; default now).
    """
    libvirt = binding()
    analyses = analyses_given(analyses)
    dom = native_domain(conn, domain)
    native = read_native(dom)
    if len(native.disks) > 1:
        raise TandemError(f"{domain}: {len(native.disks)} disks; a shadow defined without tandem attach "
                          f"(--no-follow) boots one (tandem attach without --no-follow takes several)")
    if native.disk and native.active and not native.disk_readonly:
        raise TandemError(f"{domain}: running and writing {native.disk}, which the shadows' overlays "
                          f"would back onto; attach before starting it, or give it a read-only disk")
    if native.disk and not native.disk.is_file():
        raise TandemError(f"{domain}: its disk {native.disk} is not a file tandem can read")
    existing = {d.name() for d in conn.listAllDomains()}
    for a in analyses:
        if shadow_name(domain, a.name) in existing:
            raise TandemError(f"{shadow_name(domain, a.name)}: already defined (tandem detach {domain})")
    base = Path(state_dir).absolute() if state_dir else default_state_dir(domain)
    rtc_base = rtc_base or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", rtc_base):
        raise TandemError(f"--rtc-base {rtc_base!r}: give UTC as YYYY-MM-DDTHH:MM:SS")
    lookahead_ns = LOOKAHEAD_NS if lookahead_ns is None else lookahead_ns

    shadows: list[ShadowDomain] = []
    try:
        for a in analyses:
            sdir = base / a.name
            if sdir.exists():
                raise TandemError(f"{sdir}: exists (left by an earlier attach? tandem detach {domain})")
            # 0700 (with the state directory when tandem makes it): the feed and QMP
            # sockets in it steer the shadow, and a unix socket's own mode is not
            # checked everywhere; the directory's is. (The shadow's QEMU runs as this
            # user or root: it creates qmp.sock here, so it could not run as another.)
            private.make_dir(sdir)
            sh = ShadowDomain(shadow_name(domain, a.name), domain, a.name, sdir,
                        sdir / "disk.qcow2" if native.disk else None,
                        sdir / "feed.sock", sdir / "qmp.sock")
            shadows.append(sh)
            if len(str(sh.feed_socket)) > 107:
                raise TandemError(f"{sh.feed_socket}: too long for a unix socket path (use --state-dir)")
            guest = Guest.for_analysis(a).with_disk(str(native.disk) if native.disk else None,
                                                    native.disk_format or "raw")
            guest = guest.with_nic(_shadow_nic(artifacts.qemu()["binary"], native), native.mac)
            guest.memory_mb = max(guest.memory_mb, native.memory_mib)
            if native.disk and sh.overlay:
                make_overlay(str(native.disk), sh.overlay, native.disk_format or "raw")
            # The feed socket waits for its feeder instead of failing when nobody listens yet.
            run = Run(sdir, net=Feed(sh.feed_socket, lookahead_ns=lookahead_ns, rtc_base=rtc_base,
                                     reconnect_ms=FEED_RECONNECT_MS), overlay=sh.overlay)
            md = _metadata(native, a.name, guest, sh, native.disk, rtc_base)
            xml = domain_xml(sh.name, guest, run, metadata=md, title=f"tandem {a.name} analysis of {domain}")
            try:
                sdom = conn.defineXML(xml)
                if start:
                    sdom.create()
            except libvirt.libvirtError as e:
                raise InfraError(f"{sh.name}: {e.get_error_message()}") from None
    except BaseException:
        _remove(conn, shadows)
        raise
    return shadows


def shadows_of(conn, domain: str) -> list[tuple[libvirt.virDomain, ET.Element]]:
    """The shadow domains tandem created for `domain`, with their tandem metadata."""
    libvirt = binding()
    found = []
    for d in conn.listAllDomains():
        try:
            md = ET.fromstring(d.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS))
        except libvirt.libvirtError:
            continue            # no tandem metadata: not ours
        # libvirt hands the element back without its namespace: tags are local names.
        if _local(md.tag) == "shadow" and md.get("native") == domain:
            found.append((d, md))
    return found


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _shadow_from_metadata(name: str, md: ET.Element) -> ShadowDomain:
    def path(tag, **attrs):
        for e in md:
            if _local(e.tag) == tag and all(e.get(k) == v for k, v in attrs.items()):
                return Path(e.get("path"))
        return None
    return ShadowDomain(name, md.get("native", ""), md.get("analysis", ""), path("statedir"), path("overlay"),
                  path("socket", role="feed"), path("socket", role="qmp"))


@dataclass
class Detached:
    """What `detach` removed: the shadows, and what became of the native (None: untouched)."""
    shadows: list[ShadowDomain]
    native: str | None = None

    def to_json(self) -> dict:
        return {"shadows": [s.to_json() for s in self.shadows], "native": self.native}


def detach(conn, domain: str) -> Detached:
    """Destroy and undefine every shadow of `domain`; remove their overlays, sockets and
    state directories. A native tandem runs (left by a `tandem attach` or `tandem shadow
    --libvirt` that did not get to clean up, or running under one now) is stopped, and
    its own definition put back (attach) or the domain undefined (tandem's own)."""
    shadows = [_shadow_from_metadata(d.name(), md) for d, md in shadows_of(conn, domain)]
    native = _tandem_native(conn, domain)
    if not shadows and native is None:
        raise TandemError(f"{domain}: no tandem shadows (nothing to detach)")
    _remove(conn, shadows)
    return Detached(shadows, _release_native(conn, *native) if native else None)


def native_domain(conn, domain: str):
    """The domain to shadow: it exists and tandem does not run it already."""
    libvirt = binding()
    try:
        dom = conn.lookupByName(domain)
    except libvirt.libvirtError as e:
        raise TandemError(f"domain {domain!r}: {e.get_error_message()}") from None
    if _tandem_native(conn, domain):
        raise TandemError(f"{domain}: tandem runs it already (tandem attach, or tandem shadow --libvirt), "
                          f"or an earlier run did not clean up; tandem detach {domain} first")
    return dom


def _tandem_native(conn, domain: str):
    """(domain, its <tandem:native> metadata) if tandem runs (or ran) `domain` as a native."""
    libvirt = binding()
    try:
        dom = conn.lookupByName(domain)
        md = ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS))
    except libvirt.libvirtError:
        return None
    return (dom, md) if _local(md.tag) == "native" else None


def _release_native(conn, dom, md: ET.Element) -> str:
    """Stop a native tandem runs (libvirt's SIGTERM: QEMU ends its recording cleanly), then
    put its own definition back, or undefine it if tandem made it; remove its run directory."""
    libvirt = binding()
    name = dom.name()
    original = next((e.text for e in md if _local(e.tag) == "original"), None)
    try:
        if dom.isActive():
            dom.destroy()
        if original:
            conn.defineXML(original)
        else:
            dom.undefine()
    except libvirt.libvirtError as e:
        raise InfraError(f"{name}: {e.get_error_message()}") from None
    rundir = md.get("rundir")
    if rundir and Path(rundir).is_dir():
        shutil.rmtree(rundir, ignore_errors=True)
    return f"restored {name}'s own definition" if original else f"removed {name} (tandem's domain)"


def _remove(conn, shadows: list[ShadowDomain]) -> None:
    libvirt = binding()
    for sh in shadows:
        try:
            d = conn.lookupByName(sh.name)
        except libvirt.libvirtError:
            d = None
        if d is not None:
            try:
                if d.isActive():
                    d.destroy()
            except libvirt.libvirtError:
                pass
            try:
                d.undefine()
            except libvirt.libvirtError as e:
                raise InfraError(f"{sh.name}: cannot undefine: {e.get_error_message()}") from None
        for p in (sh.overlay, sh.feed_socket, sh.qmp_socket):
            if p:
                p.unlink(missing_ok=True)
        if sh.state_dir and sh.state_dir.is_dir():
            shutil.rmtree(sh.state_dir)
            parent = sh.state_dir.parent
            if parent != Path(tempfile.gettempdir()):   # a live shadow's run directory is in /tmp
                try:
                    parent.rmdir()      # the native's directory, once its last shadow is gone
                except OSError:
                    pass
