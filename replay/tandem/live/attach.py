"""Live runs as libvirt domains: `tandem shadow --libvirt` and `tandem attach DOMAIN`.

`follow` is `tandem attach` itself: the native redefined for the run as tandem's
record-mode QEMU (or, on a libvirt network or a bridge, as itself with tandem's
recording added: libvirt/recorded.py), the shadows fed live by live.shadow.ShadowRun, the native's own
definition put back at the end (libvirt/shadows.py keeps what tandem created in each
domain's `<metadata>`).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from .. import catalog
from ..errors import TandemError
from ..libvirt.daemon import binding, connect
from ..libvirt.launcher import Launcher
from ..libvirt.recorded import OwnCommandLine
from ..libvirt.shadows import NS, NativeInfo, native_domain, read_native, shadow_name
from ..machine import Forward, Guest, analyses_given
from ..machine.guest import OS_CPU
from ..qemu import kernel_image
from ..qemu.image import check_bootable, disk_os, probe_disk
from .shadow import ShadowOptions, ShadowRun


class LiveDomains:
    """The VMs of a live shadow run (live.shadow.ShadowRun(..., libvirt=...)) as libvirt domains.

    The native is the domain `native`, each analysis shadow_name(native, analysis);
    each carries tandem's <metadata>, so `tandem detach NATIVE` finds them should tandem
    die mid-run. When the run ends, each is destroyed and undefined, except an attached
    native (`original`: its own definition), whose own definition is put back.

    native_guest, info: what `tandem attach` read from the native domain (its kernel,
    disk, MAC, memory); the analyses then get the native's disk (through their overlay),
    MAC and memory. Without them (`tandem shadow --libvirt`) both run tandem's guest.
    """

    def __init__(self, uri: str | None, native: str, analyses: list[catalog.Analysis], *,
                 native_guest: Guest | None = None, native_uuid: str | None = None,
                 original: str | None = None, info: NativeInfo | None = None, own_line: bool = False):
        if not native or "/" in native or native.startswith("."):
            raise TandemError(f"{native!r}: not usable as a libvirt domain name")
        if own_line and original is None:
            raise TandemError(f"{native}: libvirt's own command line needs the domain's own definition")
        self.uri, self.native, self.analyses = uri, native, list(dict.fromkeys(analyses))
        self.guest, self.uuid, self.original, self.info = native_guest, native_uuid, original, info
        self.own_line = own_line
        conn = connect(uri)
        try:
            taken = {d.name() for d in conn.listAllDomains()}
        finally:
            conn.close()
        names = self.shadow_names() + ([] if original else [native])
        for n in names:
            if n in taken:
                raise TandemError(f"domain {n}: already defined in libvirt (tandem detach {native}, "
                                  f"or virsh undefine {n})")

    @classmethod
    def for_bundle(cls, uri: str | None, bundle: str | Path, analyses: list[catalog.Analysis]) -> LiveDomains:
        """tandem shadow NAME.tdm --libvirt: the native is domain NAME, on tandem's guest."""
        name = Path(bundle).name
        return cls(uri, name[:-4] if name.endswith(".tdm") else name, analyses)

    def shadow_names(self) -> list[str]:
        return [shadow_name(self.native, a.name) for a in self.analyses]

    def native_guest(self) -> Guest | None:
        return self.guest

    def native_launcher(self) -> Launcher:
        def metadata(vm) -> ET.Element:
            recorded = vm.run.rr.rrfile if vm.run.rr else vm.run.devlog     # exact, or device mode
            md = ET.Element(f"{{{NS}}}native", rundir=str(vm.run.rundir), bundle=str(recorded.parent))
            if self.original:
                ET.SubElement(md, f"{{{NS}}}original").text = self.original
            return md

        return Launcher(self.uri, self.native, uuid=self.uuid, metadata=metadata, restore=self.original,
                        title=f"tandem: {self.native} recorded" + (", analyses trailing it live" if self.analyses else ""),
                        own=OwnCommandLine(self.original or "") if self.own_line else None)

    def analysis_guest(self, analysis: catalog.Analysis) -> Guest | None:
        if self.info is None:
            return None         # driving.replay.run's own: tandem's guest with the analysis kernel
        g = Guest.for_analysis(analysis)
        g = g.with_disk(str(self.info.disk) if self.info.disk else None, self.info.disk_format or "raw")
        g.memory_mb = max(g.memory_mb, self.info.memory_mib)
        g = g.with_nic(mac=self.info.mac)
        return g

    def analysis_launcher(self, analysis: catalog.Analysis) -> Launcher:
        name = shadow_name(self.native, analysis.name)

        def metadata(vm) -> ET.Element:
            md = ET.Element(f"{{{NS}}}shadow", native=self.native, analysis=analysis.name, live="yes")
            ET.SubElement(md, f"{{{NS}}}statedir", path=str(vm.run.rundir))
            ET.SubElement(md, f"{{{NS}}}socket", role="feed", path=str(vm.run.net.socket))
            ET.SubElement(md, f"{{{NS}}}socket", role="qmp", path=str(vm.run.rundir / "qmp.sock"))
            ET.SubElement(md, f"{{{NS}}}kernel", path=vm.guest.kernel, initrd=vm.guest.initrd or "")
            ET.SubElement(md, f"{{{NS}}}rtc", base=vm.run.net.rtc_base)
            return md
        return Launcher(self.uri, name, metadata=metadata,
                        title=f"tandem {analysis.name} analysis of {self.native}, live")


def follow(uri: str | None, domain: str, analyses: list[catalog.Analysis], *, bundle: str | Path | None = None,
           options: ShadowOptions | None = None, forwards: tuple[Forward, ...] | None = None,
           root: str | None = None, users_options: bool = False, **run_kw):
    """`tandem attach DOMAIN`: a live.shadow.ShadowRun (not started) whose native is the libvirt domain
    `domain`, redefined for the run as tandem's record-mode QEMU (or as itself with the
    recording added: own_command_line), and whose analyses are shadow domains fed live. start() starts the native; when it stops, its own definition
    is put back and the shadows are undefined.

    A domain that boots through its firmware (a disk's bootloader), or is given
    `forwards`, is a VM of the user's as `tandem record --disk` takes it: its disks (all
    of them, each through the bundle's overlay), its MAC, user networking with the
    forwards; its analyses boot its disks with their kernels (semantic/guests.py, `root`
    as given or as its kernel prints it); so is one on a libvirt network or a bridge in
    device mode. Otherwise it is a guest of tandem's kind (its
    kernel, one disk, the demo service's port forward); `users_options`
    (--analysis-kernel, --overlay given) is refused there."""
    libvirt = binding()
    analyses = analyses_given(analyses)
    conn = connect(uri)
    try:
        dom = native_domain(conn, domain)
        n = read_native(dom)
        o = options or ShadowOptions()
        own = own_command_line(n)
        users = n.kernel is None or forwards is not None or own
        _check_native(n, users, o.record_mode)
        if own and forwards:
            raise TandemError(f"{domain}: --forward is for a NIC on user networking; this one is on "
                              f"{n.nic_type} {n.nic_source!r}, where the guest has an address of its own")
        original = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    finally:
        conn.close()
    guest_os = native_os(n)
    if users:
        _check_users_disks(n)
        guest = Guest.of_disks([(str(p), fmt) for p, fmt in n.disks], kernel=n.kernel, initrd=n.initrd,
                               append=n.cmdline if n.kernel else None, memory_mb=n.memory_mib,
                               os=guest_os).with_nic(mac=n.mac)
        guest.vcpus = n.vcpus
        if own:     # what libvirt runs it on, as the manifest says it
            guest.accel = "kvm" if n.virt_type == "kvm" else "tcg"
            guest.machine_type = n.machine
        domains = LiveDomains(uri, domain, analyses, native_uuid=n.uuid, original=original, own_line=own)
        return ShadowRun(bundle or f"{domain}.tdm", analyses, options, libvirt=domains, guest=guest,
                         forwards=forwards or (), root=root, **run_kw)
    if root is not None or users_options:
        raise TandemError(f"{domain}: --root, --analysis-kernel and --overlay are for a VM of your own "
                          f"(firmware boot, or --forward given); this one boots its kernel as tandem's guest")
    guest = Guest(kernel=n.kernel, initrd=n.initrd, memory_mb=n.memory_mib, cmdline=n.cmdline, os=guest_os,
                  cpu=OS_CPU.get(guest_os))
    guest = guest.with_disk(str(n.disk) if n.disk else None, n.disk_format or "raw").with_nic(mac=n.mac)
    guest.vcpus = n.vcpus
    domains = LiveDomains(uri, domain, analyses, native_guest=guest, native_uuid=n.uuid,
                          original=original, info=n)
    return ShadowRun(bundle or f"{domain}.tdm", analyses, options, libvirt=domains, **run_kw)


def native_os(n: NativeInfo) -> str:
    """The OS of the native domain's guest: FreeBSD when its directly booted kernel's file
    is a FreeBSD kernel (one QEMU cannot boot directly, without a PVH entry, a one-line
    error naming the domain and the file), or, booted by its firmware, when its first disk
    has FreeBSD's partition types (qemu.image.disk_os: FreeBSD's loader boots it); else
    Linux, whose kernel files (a bzImage, a vmlinux with a PVH note) QEMU takes as the
    domain gives them."""
    if n.kernel is None:
        return (disk_os(str(n.disks[0][0]), n.disks[0][1]) if n.disks else None) or "linux"
    if not kernel_image.is_freebsd(n.kernel, f"{n.name}: its kernel"):
        return "linux"
    kernel_image.freebsd_version(n.kernel, f"{n.name}: its kernel")
    return "freebsd"


def _check_users_disks(n: NativeInfo) -> None:
    """A VM of the user's: its disks as `tandem record --disk` takes them (standalone qcow2
    or raw images, qemu.image.probe_disk), each of the format the domain says it is, the
    first with a boot sector when the firmware boots it; a one-line error naming the disk."""
    try:
        images = [probe_disk(str(path)) for path, _ in n.disks]
        for (path, fmt), image in zip(n.disks, images):
            if image.format != fmt:
                raise TandemError(f"disk {path}: the domain says {fmt}, the file is a {image.format} image")
        if n.kernel is None:
            check_bootable(images[0])
    except TandemError as e:
        raise TandemError(f"{n.name}: {e}") from None


# The NICs a domain recorded on libvirt's own command line may have: backends whose
# frames pass through QEMU's net layer, where tandem's filters are.
OWN_LINE_NICS = ("network", "bridge")


def own_command_line(n: NativeInfo) -> bool:
    """Is the native recorded on libvirt's own command line (libvirt/recorded.py)? When
    its NIC is on a network libvirt provides (a libvirt network, a bridge): a tap whose
    descriptor libvirt opens, which tandem's command line cannot make. A NIC on user
    networking keeps tandem's, whose backend carries --forward."""
    return n.nic_type in OWN_LINE_NICS


def _check_native(n: NativeInfo, users: bool, mode: str = "exact") -> None:
    """What tandem attach refuses in a native domain (recorded in `mode`), each as a one-line error."""
    domain = n.name
    if n.active:
        raise TandemError(f"{domain}: running; tandem attach starts it itself, recorded from boot "
                          f"(shut it down first)")
    if n.passthrough:
        raise TandemError(f"{domain}: {n.passthrough}: what it does never crosses QEMU's device "
                          f"boundary, where tandem records; remove it from the domain to attach it")
    if mode == "exact" and n.clock not in ("utc", "variable"):
        raise TandemError(f"{domain}: <clock offset='{n.clock}'>: an exact recording runs the guest's RTC "
                          f"on UTC; give the domain <clock offset='utc'/>, or attach it with --mode device")
    if own_command_line(n) and n.display:
        raise TandemError(f"{domain}: {n.display}: a graphical console, which tandem's QEMU is built without "
                          f"(and what is typed there is not recorded); remove the domain's <graphics>, <video>, "
                          f"<sound>, USB <input> and SPICE devices to attach it (its serial console stays)")
    if own_command_line(n) and not n.acpi:
        raise TandemError(f"{domain}: no <features><acpi/>: libvirt then passes -no-acpi, which "
                          f"QEMU 10 no longer has; add <acpi/> to its <features>")
    if not users and len(n.disks) > 1:
        raise TandemError(f"{domain}: {len(n.disks)} disks on a direct kernel boot; give --forward to attach "
                          f"it as a VM of your own (its disks booted by the analyses' kernels)")
    if n.nic_type is None:
        raise TandemError(f"{domain}: no network interface; tandem records a guest with one "
                          f"(<interface type='user'><model type='virtio'/></interface>)")
    if n.nic_type != "user" and not own_command_line(n):
        raise TandemError(f"{domain}: interface type {n.nic_type!r}; tandem records a NIC on user "
                          f"networking, a libvirt network or a bridge")
    if mode == "exact" and own_command_line(n) and n.side_channel:
        raise TandemError(f"{domain}: {n.side_channel}: an exact recording records the input of the first serial "
                          f"port only, and a replay would depart at the first byte this one gave the guest; "
                          f"remove it from the domain, or attach it with --mode device")
    if n.nic_model != "virtio":
        raise TandemError(f"{domain}: NIC model {n.nic_model!r}: tandem's QEMU has virtio-net only "
                          f"(qemu-patches/0001)")
    if n.disk_readonly:
        raise TandemError(f"{domain}: a disk of it is read-only; tandem's recording writes through an overlay")
    for path, _ in n.disks:
        if not path.is_file():
            raise TandemError(f"{domain}: its disk {path} is not a file tandem can read")
    if users and not n.disks:
        raise TandemError(f"{domain}: boots through firmware but has no disk to boot from")
