"""`tandem attach` / `tandem detach` / `tandem libvirtd`: tandem with libvirt domains."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from .. import catalog
from ..errors import TandemError
from .common import (add_analysis_run_options, add_analysis_vcpus_option, add_cpu_idle_option, add_gate_options,
                     add_mode_option, add_stop_option, add_users_analysis_options, analysis_run_options,
                     build_for_analyses, catalogued, gate_options, parse_duration, users_analyses)
from .guest_options import parse_forward
from .render import console, print_live_finding, print_summary
from .shadow import watch


def add_parsers(sub) -> None:
    r = sub.add_parser("attach", help="record a shut-off libvirt domain from boot (started by tandem) "
                       "while shadow analysis domains DOMAIN-tandem-NAME trail it live, until it stops; "
                       "its own definition is put back at the end")
    r.add_argument("domain", help="the native libvirt domain (shut off; one virtio NIC on user networking, or "
                   "with --mode device on a libvirt network or bridge; file disks on virtio; booted by its "
                   "firmware and a disk's bootloader, or directly by its kernel)")
    r.add_argument("--analysis", action="append", metavar="NAME", default=[],
                   help="analysis VM to create (repeatable, or comma-separated): "
                        + catalog.help_lines())
    add_users_analysis_options(r)
    r.add_argument("--forward", action="append", type=parse_forward, metavar="tcp:HOSTPORT:GUESTPORT",
                   help="a VM of your own: forward this host port to the guest's (repeatable); a domain that "
                        "boots through its firmware is always one")
    r.add_argument("--root", metavar="DEVICE",
                   help="a VM of your own: the root device its analysis kernels mount (default: the root= its "
                        "kernel booted with, a UUID or LABEL found on its disks; e.g. /dev/vda1)")
    r.add_argument("--uri", help="libvirt URI (default: libvirt's, e.g. $LIBVIRT_DEFAULT_URI)")
    r.add_argument("--bundle", help="the native's recording (default DOMAIN.tdm here)")
    r.add_argument("--workdir", help="the analyses' recordings, findings.jsonl, summary.json "
                   "(default BUNDLE.analysis)")
    r.add_argument("--port", type=int, help="tandem's guest: host port forwarded to its port 7000 "
                   "(default: free port)")
    r.add_argument("--duration", type=parse_duration, help="stop the native after this much VM time")
    r.add_argument("--no-drain", action="store_true",
                   help="do not analyse again offline, from the native's recording, a shadow stopped for lag")
    add_gate_options(r)
    add_cpu_idle_option(r)
    add_stop_option(r)
    add_mode_option(r)
    add_analysis_vcpus_option(r)
    add_analysis_run_options(r)
    r.add_argument("--no-follow", action="store_true",
                   help="only define and start the shadows (the native is untouched): each waits for a "
                        "feeder on its feed socket (--json)")
    r.add_argument("--state-dir", help="with --no-follow: where the shadows' overlays and sockets go "
                   "(default ~/.cache/tandem/shadows/DOMAIN)")
    r.add_argument("--rtc-base", help="with --no-follow: the shadows' wall clock at boot, UTC (default: now)")
    r.add_argument("--no-start", action="store_true", help="with --no-follow: define the shadows, do not start them")
    r.add_argument("--json", action="store_true", help="with --no-follow: also print the shadows as JSON on stdout")
    r.set_defaults(func=cmd_attach)

    r = sub.add_parser("detach", help="remove a libvirt domain's shadows, their overlays and sockets; "
                       "put back the domain's own definition if a tandem attach left it tandem's")
    r.add_argument("domain")
    r.add_argument("--uri", help="libvirt URI (default: libvirt's)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_detach)

    r = sub.add_parser("libvirtd", help="run a private libvirtd (and virtlogd) with all its files "
                       "in DIR, until Ctrl-C")
    r.add_argument("dir", help="an empty or new directory, not under /etc, /var or /run")
    r.set_defaults(func=cmd_libvirtd)


def cmd_attach(args) -> int:
    from ..libvirt import daemon, shadows
    if not (args.no_follow or args.no_start):
        return _attach_live(args)
    for opt, given in (("--bundle", args.bundle), ("--workdir", args.workdir), ("--port", args.port),
                       ("--duration", args.duration)):
        if given:
            raise TandemError(f"{opt}: not with --no-follow (the native is not recorded)")
    for opt, given in (("--forward", args.forward), ("--root", args.root), ("--analysis-kernel", args.analysis_kernel),
                       ("--overlay", args.overlay)):
        if given:
            raise TandemError(f"{opt}: not with --no-follow (its shadows boot tandem's guest setup)")
    for opt, given in (("--release", args.release != "now"), ("--overflow", args.overflow != "detach"),
                       ("--spec", args.spec), ("--metrics-port", args.metrics_port is not None),
                       ("--analysis-cpus", args.analysis_cpus != "auto"),
                       ("--analysis-priority", args.analysis_priority != "idle")):
        if given:
            raise TandemError(f"{opt}: not with --no-follow (tandem does not feed the shadows it leaves waiting)")
    analyses = catalogued(args.analysis)
    build_for_analyses(analyses, noise=False)
    conn = daemon.connect(args.uri)
    made = shadows.attach(conn, args.domain, analyses, state_dir=args.state_dir,
                          rtc_base=args.rtc_base, start=not args.no_start)
    for s in made:
        console.print(f"[bold]{s.name}[/]: {s.analysis} analysis of {s.native}"
                      f"{'' if args.no_start else ', waiting for its feed'}", markup=True)
        console.print(f"  feed {s.feed_socket}, qmp {s.qmp_socket}"
                      + (f", overlay {s.overlay}" if s.overlay else ""), markup=False)
    if args.json:
        print(json.dumps([s.to_json() for s in made], indent=1))
    return 0


def _attach_live(args) -> int:
    """tandem attach DOMAIN: DOMAIN recorded from boot, its shadows fed live, until it stops."""
    from ..live.attach import follow
    from ..live.shadow import ShadowOptions
    for opt, given in (("--state-dir", args.state_dir), ("--rtc-base", args.rtc_base), ("--json", args.json)):
        if given:
            raise TandemError(f"{opt}: only with --no-follow (a followed domain's shadows run in the "
                              f"analysis workdir, on the native's clock)")
    analyses = users_analyses(args)
    if not analyses:
        raise TandemError("no analysis given (--analysis, --analysis-kernel or --overlay)")
    if args.forward and args.port is not None:
        raise TandemError("--port is tandem's guest's service; forward your VM's ports with --forward")
    options = ShadowOptions(port=args.port, duration_ns=args.duration or 0, drain=not args.no_drain,
                            **gate_options(args), **analysis_run_options(args), cpu_idle=args.cpu_idle,
                            stop=args.stop, shutdown_timeout_s=args.shutdown_timeout,
                            record_mode=args.mode, analysis_vcpus=args.analysis_vcpus)     # checked before a build
    build_for_analyses(analyses, noise=False)
    sh = follow(args.uri, args.domain, analyses, bundle=args.bundle, options=options,
                forwards=tuple(args.forward) if args.forward else None, root=args.root,
                users_options=bool(args.analysis_kernel or args.overlay),
                workdir=Path(args.workdir) if args.workdir else None, on_finding=print_live_finding)
    with sh:        # closed whatever happens: the native's own definition is put back
        if sh.libvirt.own_line:
            where = "on libvirt's own command line, its network as libvirt makes it"
        elif sh.users_guest:
            where = ", ".join(f"{f.protocol} 127.0.0.1:{f.host_port} -> guest {f.guest_port}"
                              for f in sh.native.all_forwards()) or "no forwards"
        else:
            where = f"guest service on 127.0.0.1:{sh.port}"
        console.print(f"attached to {args.domain}: recording into {sh.path}, {where}; "
                      f"shadows {', '.join(sh.libvirt.shadow_names())} trail it; "
                      f"findings in {sh.workdir / 'findings.jsonl'}; "
                      + (f"metrics on http://127.0.0.1:{sh.metrics_port}/metrics; " if sh.metrics_port is not None else "")
                      + f"stop with guest poweroff, "
                      f"virsh destroy {args.domain} or Ctrl-C", markup=False)
        s = watch(sh)
    print_summary(s)
    console.print(f"{args.domain}: its own definition is back; the recording is {sh.path}", markup=False)
    return s.exit_status()


def cmd_detach(args) -> int:
    from ..libvirt import daemon, shadows
    conn = daemon.connect(args.uri)
    removed = shadows.detach(conn, args.domain)
    for s in removed.shadows:
        console.print(f"removed {s.name} and {s.state_dir}", markup=False)
    if removed.native:
        console.print(removed.native, markup=False)
    if args.json:
        print(json.dumps(removed.to_json(), indent=1))
    return 0


def cmd_libvirtd(args) -> int:
    from ..libvirt.daemon import Libvirtd
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        with Libvirtd(args.dir) as d:
            console.print(f"private libvirtd running; stop with Ctrl-C\nexport LIBVIRT_DEFAULT_URI='{d.uri}'",
                          markup=False)
            while not stop:
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    return 0
