"""`tandem shadow`: record a serving guest while analysis VMs trail it live, with a live table."""
from __future__ import annotations

import signal
import time
from pathlib import Path

from .. import catalog
from .common import (add_analysis_run_options, add_analysis_vcpus_option, add_cpu_idle_option, add_gate_options,
                     add_mode_option, add_stop_option, add_users_analysis_options, analysis_run_options, build_for,
                     build_for_analyses, gate_options, parse_duration, record_targets, users_analyses)
from .guest_options import add_guest_options, guest_from_args, kernel_flavor
from .render import console, print_live_finding, print_summary


def add_parsers(sub) -> None:
    r = sub.add_parser("shadow", help="record a serving guest while analysis VMs trail it live")
    r.add_argument("bundle", help="bundle directory to create for the native (NAME.tdm)")
    r.add_argument("--analysis", action="append",
                   help="analysis to run live (repeatable, or comma-separated): "
                        + catalog.help_lines())
    add_users_analysis_options(r)
    r.add_argument("--root", metavar="DEVICE",
                   help="your VM (--disk): the root device its analysis kernels mount (default: the root= its "
                        "kernel booted with, a UUID or LABEL found on its disks; e.g. /dev/vda1)")
    r.add_argument("--duration", type=parse_duration, help="stop after this much VM time (e.g. 30s)")
    r.add_argument("--port", type=int, help="host port forwarded to the guest service (default: free port)")
    add_gate_options(r)
    r.add_argument("--no-record", action="store_true", help="do not record the analysis VMs themselves")
    r.add_argument("--no-drain", action="store_true",
                   help="do not analyse again offline, from the native's recording, an analysis stopped "
                        "for lag (by default it is, so that every recorded input is analysed)")
    add_cpu_idle_option(r)
    add_stop_option(r)
    add_analysis_run_options(r)
    r.add_argument("--workdir", help="analysis logs and findings.jsonl (default NAME.tdm.analysis)")
    r.add_argument("--libvirt", nargs="?", const="", metavar="URI",
                   help="run the native and the analysis VMs as libvirt domains NAME and "
                        "NAME-tandem-ANALYSIS, destroyed and undefined at the end (URI default: "
                        "libvirt's; write --libvirt=URI; docs/libvirt.md)")
    add_mode_option(r)
    add_analysis_vcpus_option(r)
    add_guest_options(r)
    r.set_defaults(func=cmd_shadow)


def _shadow_table(rows: list[dict]):
    from rich.table import Table
    t = Table(title="tandem shadow", title_justify="left")
    for col in ("VM", "VM time", "lag (VM / wall)", "buffer", "peak", "findings", "state"):
        t.add_column(col)
    for r in rows:
        buf = f"{r['buffer_events']} ev / {r['buffer_bytes'] // 1024} KiB" if "buffer_events" in r else "-"
        peak = f"{r['peak_events']} ev / {r['peak_bytes'] // 1024} KiB" if "peak_events" in r else "-"
        state = r["state"] + (" (holding the native)" if r.get("blocking") else "") \
            + (" (yielding: the native is busy)" if r.get("yielding") and r["state"] == "running" else "")
        t.add_row(r["vm"], f"{r['vm_ns'] / 1e9:.3f}s", f"{r['lag_ns'] / 1e9:.3f}s / {r['lag_wall_s']:.1f}s", buf, peak,
                  str(r.get("findings", "-")), state)
    return t


# How often the live table is drawn and the native sampled. This loop runs at normal
# priority beside the native: at 10 a second each pass took the native's CPUs for some
# 1 ms on the benchmark machine (perf sched, bench/device_mode.py), 8 us per request.
WATCH_S = 0.5


def watch(sh):
    """Sample the native and show the live table until it stops (Ctrl-C stops it), then
    let the analyses finish: their summary."""
    from rich.live import Live
    from rich.text import Text

    signal.signal(signal.SIGINT, lambda *_: sh.native.request_stop())
    signal.signal(signal.SIGTERM, lambda *_: sh.native.request_stop())
    with Live(_shadow_table(sh.status()), console=console, refresh_per_second=1 / WATCH_S) as live:
        while sh.native.vm.proc.poll() is None:
            # here, not in the handler: QMP is not reentrant
            sh.native.act_on_stop_requests(lambda line: live.console.print(f"tandem: {line}", markup=False))
            sh.sample()
            sh.native.vm.poll_events()
            live.update(_shadow_table(sh.status()))
            time.sleep(WATCH_S)
        sh.on_drain_progress = lambda name, run, done, total: live.update(Text(
            f"{name} stopped live for lag; analysing it again offline from {sh.path}: "
            f"VM {run.end_ns / 1e9:.1f}s, {done} inputs delivered"))
        s = sh.finish()
        live.update(_shadow_table(sh.status()))
    return s


def cmd_shadow(args) -> int:
    from ..errors import TandemError
    from ..live.shadow import ShadowRun
    analyses = users_analyses(args)
    if not analyses:
        raise TandemError("no analysis given (--analysis, --analysis-kernel or --overlay)")
    users = bool(args.disk)         # your VM, booted as `tandem record --disk` boots it
    if not users:                   # the native analysis: the demo guest's own kernel
        native = catalog.native_on(catalog.kernel(kernel_flavor(args)))
        analyses = [native if a == catalog.NATIVE else a for a in analyses]
    domains = None
    if args.libvirt is not None:    # --libvirt [URI]: the native and the analyses as libvirt domains
        from ..live.attach import LiveDomains
        domains = LiveDomains.for_bundle(args.libvirt or None, args.bundle, analyses)
    if not users and (args.forward or args.root or args.analysis_kernel or args.overlay):
        raise TandemError("--forward, --root, --analysis-kernel and --overlay go with --disk (your own VM)")
    if users and args.port is not None:
        raise TandemError("--port is the demo guest's service; forward your VM's ports with --forward")
    options = options_from(args)        # checked before a build
    build_for(record_targets(args), "recording")
    build_for_analyses(analyses, noise=False)
    sh = ShadowRun(args.bundle, analyses, options, libvirt=domains, on_finding=print_live_finding,
                   workdir=Path(args.workdir) if args.workdir else None,
                   guest=guest_from_args(args) if users or not domains else None,
                   forwards=tuple(args.forward) if users else None, root=args.root)
    with sh:            # started; closed whatever happens
        where = (", ".join(f"{f.protocol} 127.0.0.1:{f.host_port} -> guest {f.guest_port}"
                           for f in sh.native.all_forwards()) or "no forwards") if users \
            else f"guest service on 127.0.0.1:{sh.port}"
        console.print(f"shadowing {args.bundle}: {where}; analyses "
                      f"{', '.join(a.name for a in sh.analyses)} trail it; findings in {sh.workdir / 'findings.jsonl'}; "
                      + (f"metrics on http://127.0.0.1:{sh.metrics_port}/metrics; "
                         if sh.metrics_port is not None else "")
                      + (f"libvirt domains {domains.native}, {', '.join(domains.shadow_names())}; " if domains else "")
                      + f"stop with {'--duration, ' if args.duration else ''}guest poweroff or Ctrl-C")
        s = watch(sh)
    print_summary(s)
    return s.exit_status()


def options_from(args):
    """The run's options (live.shadow.ShadowOptions) from `tandem shadow`'s command line,
    checked as they are made."""
    from ..live.shadow import ShadowOptions
    return ShadowOptions(
        duration_ns=args.duration or 0, port=args.port, **gate_options(args), record_analyses=not args.no_record,
        **analysis_run_options(args), drain=not args.no_drain,
        cpu_idle=args.cpu_idle, stop=args.stop, shutdown_timeout_s=args.shutdown_timeout,
        record_mode=args.mode, analysis_vcpus=args.analysis_vcpus)
