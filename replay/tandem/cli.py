"""The `tandem` command line: record, replay, assert, inspect, demo, attach/detach (libvirt).

Every failure the user can cause ends as one line `tandem: error: ...` naming
the culprit and a non-zero exit; tracebacks are for bugs only.
"""
from __future__ import annotations

import argparse
import logging
import json
import signal
import sys
import time
from pathlib import Path


from . import __version__, catalog
from .render import console, print_live_finding, print_summary
from .errors import TandemError

# soft_wrap: one message, one line, whatever the terminal width (tests and logs grep them).


def parse_duration(text: str) -> int:
    """'10s', '500ms', '2m' or plain seconds -> nanoseconds of VM time."""
    units = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            num, mult = text[: -len(suffix)], units[suffix]
            break
    else:
        num, mult = text, units["s"]
    try:
        value = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 10s, 500ms, 2m)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return int(value * mult)


def _progress(label: str, status):
    def show(st: dict):
        if st:
            status.update(f"{label}: VM time {st.get('vm-clock-ns', 0) / 1e9:7.2f}s, "
                          f"{st.get('events', 0)} device log records, "
                          f"{st.get('icount', 0) / 1e6:,.0f}M instructions")
    return show


def cmd_record(args) -> int:
    from .record import Recording
    from .vm import Guest
    guest = Guest.default(args.kernel, args.userland)
    if args.kernel_image:
        guest.kernel = args.kernel_image
    declared = None
    if args.assertions:     # checked now, so a broken pack is found before the recording
        from .assertions.check import declare_pack
        declared = declare_pack(args.assertions, args.kernel)
    rec = Recording(args.bundle, guest, duration_ns=args.duration or 0, port=args.port,
                    assertions=declared)
    rec.start()
    console.print(f"recording {args.bundle}: guest service on 127.0.0.1:{rec.port}, "
                  f"stop with {'--duration, ' if args.duration else ''}guest poweroff or Ctrl-C")
    interrupted = False

    def on_sigint(*_):
        nonlocal interrupted
        interrupted = True
        rec.stop()
    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)
    with console.status("booting") as status:
        rec.wait(progress=_progress("recording", status))
    m = rec.finish()
    if m["stop"]["reason"] in ("guest-reset", "guest-panic"):
        console.print(f"tandem: warning: the guest stopped by {m['stop']['reason']} (a kernel panic "
                      f"reboots with panic=-1); its console is in {args.bundle}/devices.pcapng",
                      markup=False)
    console.print(f"[bold]recorded[/] {args.bundle}: stop={m['stop']['reason']}, "
                  f"VM time {m['stop']['vm_ns'] / 1e9:.2f}s, "
                  f"{sum(c['in']['events'] + c['out']['events'] for c in m['channels'].values())} "
                  f"device events, wall {m['wall_time_s']:.1f}s")
    return 0


def _shadow_table(rows: list[dict]):
    from rich.table import Table
    t = Table(title="tandem shadow", title_justify="left")
    for col in ("VM", "VM time", "lag (VM / wall)", "buffer", "peak", "findings", "state"):
        t.add_column(col)
    for r in rows:
        buf = f"{r['buffer_events']} ev / {r['buffer_bytes'] // 1024} KiB" if "buffer_events" in r else "-"
        peak = f"{r['peak_events']} ev / {r['peak_bytes'] // 1024} KiB" if "peak_events" in r else "-"
        state = r["state"] + (" (holding the native)" if r.get("blocking") else "")
        t.add_row(r["vm"], f"{r['vm_ns'] / 1e9:.3f}s", f"{r['lag_ns'] / 1e9:.3f}s / {r['lag_wall_s']:.1f}s", buf, peak,
                  str(r.get("findings", "-")), state)
    return t


def _watch(sh):
    """Sample the native and show the live table until it stops (Ctrl-C stops it), then
    let the analyses finish: their summary."""
    from rich.live import Live

    from .live import SAMPLE_S
    signal.signal(signal.SIGINT, lambda *_: sh.stop_native())
    signal.signal(signal.SIGTERM, lambda *_: sh.stop_native())
    with Live(_shadow_table(sh.status()), console=console, refresh_per_second=4) as live:
        while sh.native.vm.proc.poll() is None:
            sh.sample()
            sh.native.vm.poll_events()
            live.update(_shadow_table(sh.status()))
            time.sleep(SAMPLE_S)
        s = sh.finish()
        live.update(_shadow_table(sh.status()))
    return s


def cmd_shadow(args) -> int:
    from .live import Shadow
    names = [a for item in args.analysis for a in item.split(",") if a]
    domains = None
    if args.libvirt is not None:    # --libvirt [URI]: the native and the analyses as libvirt domains
        from .virt import LiveDomains
        domains = LiveDomains.for_bundle(args.libvirt or None, args.bundle, names)
    sh = Shadow(args.bundle, names, workdir=Path(args.workdir) if args.workdir else None,
                duration_ns=args.duration or 0, port=args.port, buffer_events=args.buffer_events,
                buffer_bytes=args.buffer_bytes, record_analyses=not args.no_record,
                metrics_port=args.metrics_port, release=args.release,
                agree_timeout_ns=args.agree_timeout, overflow=args.overflow,
                block_budget_s=args.block_budget, idle_analyses=args.analysis_priority == "idle",
                analysis_cpus=args.analysis_cpus, spec_path=args.spec, libvirt=domains,
                on_finding=print_live_finding)
    sh.start()
    console.print(f"shadowing {args.bundle}: guest service on 127.0.0.1:{sh.port}; analyses "
                  f"{', '.join(sh.analyses)} trail it; findings in {sh.workdir / 'findings.jsonl'}; "
                  + (f"metrics on http://127.0.0.1:{sh.metrics_port}/metrics; " if sh.metrics_port is not None else "")
                  + (f"libvirt domains {domains.native}, {', '.join(domains.shadow_names())}; " if domains else "")
                  + f"stop with {'--duration, ' if args.duration else ''}guest poweroff or Ctrl-C")
    s = _watch(sh)
    print_summary(s)
    return 0 if s.ok else 1


def cmd_replay(args) -> int:
    from .replay_exact import replay
    if args.analysis:
        return cmd_analyze(args)
    with console.status("replaying") as status:
        v = replay(args.bundle, follow=args.follow, partial=args.partial,
                   progress=_progress("replaying", status))
    if args.json:
        print(json.dumps({"ok": v.ok, "events": v.events, "mismatch": str(v.mismatch) if v.mismatch else None,
                          "replay_wall_s": v.replay_wall_s, "partial": v.partial}))
    console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())
    return 0 if v.ok else 1


def cmd_assert(args) -> int:
    from .assertions.check import check, render
    with console.status("replaying with the assertion plugin") as status:
        res = check(args.bundle, args.assertions, select=args.select,
                    progress=_progress("replaying with assertions", status))
    render(res, console)
    if args.json:
        print(res.to_json())
    return 1 if res.fatal else 0


def cmd_analyze(args) -> int:
    from .semantic import analyze
    if args.follow or args.partial:
        raise TandemError("--follow and --partial are for exact replay; not with --analysis")
    names = [a for item in args.analysis for a in item.split(",") if a]
    state: dict[str, str] = {}
    with console.status("replaying into analysis VMs") as status:
        def progress(name, run, done, total):
            state[name] = f"{name} {run.end_ns / 1e9:.1f}s {done}/{total}"
            status.update("semantic replay: " + ", ".join(state.values()))
        s = analyze(args.bundle, names, spec_path=args.spec, jobs=args.jobs, noise=not args.no_noise,
                    workdir=Path(args.workdir) if args.workdir else None, progress=progress,
                    record=not args.no_record)
    print_summary(s)
    if args.json:
        print((Path(args.workdir) if args.workdir else Path(args.bundle) / "analysis").joinpath(
            "summary.json").read_text())
    return 0 if s.ok else 1


def cmd_inspect(args) -> int:
    from .inspect_bundle import inspect, render
    info = inspect(args.bundle)
    print(json.dumps(info, indent=2, default=str) if args.json else render(info))
    return 0 if info["integrity"]["ok"] else 1


def cmd_wireshark(args) -> int:
    from . import wireshark
    if args.action == "path":
        print(wireshark.DISSECTOR)
        return 0
    target = wireshark.install(Path(args.dir) if args.dir else None)
    print(f"installed {target}; Wireshark and tshark load it at start "
          f"(try: tshark -r BUNDLE/devices.pcapng -Y 'tandem.block.offset > 0x100000')")
    return 0


def cmd_doctor(args) -> int:
    from .setup import doctor
    return doctor.main(["--no-kvm-boot"] if args.no_kvm_boot else [])


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(console, Path(args.workdir) if args.workdir else None)


def _analysis_names(items: list[str] | None) -> list[str]:
    return [a for item in items or [] for a in item.split(",") if a]


def cmd_attach(args) -> int:
    from . import virt
    if not (args.no_follow or args.no_start):
        return _attach_live(args)
    for opt, given in (("--bundle", args.bundle), ("--workdir", args.workdir), ("--port", args.port),
                       ("--duration", args.duration)):
        if given:
            raise TandemError(f"{opt}: not with --no-follow (the native is not recorded)")
    conn = virt.connect(args.uri)
    shadows = virt.attach(conn, args.domain, _analysis_names(args.analysis), state_dir=args.state_dir,
                          rtc_base=args.rtc_base, start=not args.no_start)
    for s in shadows:
        console.print(f"[bold]{s.name}[/]: {s.analysis} analysis of {s.native}"
                      f"{'' if args.no_start else ', waiting for its feed'}", markup=True)
        console.print(f"  feed {s.feed_socket}, qmp {s.qmp_socket}"
                      + (f", overlay {s.overlay}" if s.overlay else ""), markup=False)
    if args.json:
        print(json.dumps([s.to_json() for s in shadows], indent=1))
    return 0


def _attach_live(args) -> int:
    """tandem attach DOMAIN: DOMAIN recorded from boot, its shadows fed live, until it stops."""
    from .virt import follow
    for opt, given in (("--state-dir", args.state_dir), ("--rtc-base", args.rtc_base), ("--json", args.json)):
        if given:
            raise TandemError(f"{opt}: only with --no-follow (a followed domain's shadows run in the "
                              f"analysis workdir, on the native's clock)")
    sh = follow(args.uri, args.domain, _analysis_names(args.analysis), bundle=args.bundle,
                workdir=Path(args.workdir) if args.workdir else None, port=args.port,
                duration_ns=args.duration or 0,
                on_finding=print_live_finding)
    try:
        sh.start()
        console.print(f"attached to {args.domain}: recording into {sh.path}, guest service on "
                      f"127.0.0.1:{sh.port}; shadows {', '.join(sh.libvirt.shadow_names())} trail it; "
                      f"findings in {sh.workdir / 'findings.jsonl'}; stop with guest poweroff, "
                      f"virsh destroy {args.domain} or Ctrl-C", markup=False)
        s = _watch(sh)
    finally:        # the native's own definition back, whatever happened
        if sh.native.vm:
            sh.native.vm.close()
    print_summary(s)
    console.print(f"{args.domain}: its own definition is back; the recording is {sh.path}", markup=False)
    return 0 if s.ok else 1


def cmd_detach(args) -> int:
    from . import virt
    conn = virt.connect(args.uri)
    removed = virt.detach(conn, args.domain)
    for s in removed.shadows:
        console.print(f"removed {s.name} and {s.state_dir}", markup=False)
    if removed.native:
        console.print(removed.native, markup=False)
    if args.json:
        print(json.dumps(removed.to_json(), indent=1))
    return 0


def cmd_plan(args) -> int:
    from .plan import plan, render
    p = plan(args.bundle, slowdown=args.slowdown, concurrency=args.concurrency,
             from_workdir=args.from_workdir, analysis=args.analysis, stat=args.per_request,
             boot=not args.no_boot)
    console.print(render(p), markup=False)
    if args.json:
        print(json.dumps(p.to_json(), indent=1))
    return 0


def cmd_libvirtd(args) -> int:
    from .virt import Libvirtd
    d = Libvirtd(args.dir)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        d.start()
        console.print(f"private libvirtd running; stop with Ctrl-C\nexport LIBVIRT_DEFAULT_URI='{d.uri}'",
                      markup=False)
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        d.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="Record a guest at its device "
                                "boundary and replay it exactly.")
    p.add_argument("--version", action="version", version=f"tandem {__version__}")
    p.add_argument("--debug", action="store_true", help="log what tandem does in detail")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("shadow", help="record a serving guest while analysis VMs trail it live")
    r.add_argument("bundle", help="bundle directory to create for the native (NAME.tdm)")
    r.add_argument("--analysis", action="append", required=True,
                   help="analysis to run live (repeatable, or comma-separated): "
                        + catalog.help_lines())
    r.add_argument("--duration", type=parse_duration, help="stop after this much VM time (e.g. 30s)")
    r.add_argument("--port", type=int, help="host port forwarded to the guest service (default: free port)")
    r.add_argument("--buffer-events", type=int, default=100_000,
                   help="inputs an analysis may trail by (default 100000); over that, --overflow applies")
    r.add_argument("--buffer-bytes", type=int, default=64 << 20,
                   help="bytes of inputs an analysis may trail by (default 64 MiB); over that, --overflow applies")
    r.add_argument("--overflow", choices=["detach", "block"], default="detach",
                   help="an analysis whose buffer is full: detach it and go on (default), or block: hold "
                        "the native's incoming frames until it has room, for at most --block-budget")
    r.add_argument("--block-budget", type=float, default=10.0, metavar="SECONDS",
                   help="with --overflow block: wall time the native may be held at a stretch before "
                        "the analysis is detached after all (default 10)")
    r.add_argument("--release", choices=["now", "agreed"], default="now",
                   help="now: the native's outputs leave at once (default); agreed: each network output "
                        "leaves only once every analysis produced the same one")
    r.add_argument("--agree-timeout", type=parse_duration, default=2_000_000_000,
                   help="with --release agreed: VM time an analysis may take to answer before the "
                        "output is released without it (default 2s)")
    r.add_argument("--no-record", action="store_true", help="do not record the analysis VMs themselves")
    r.add_argument("--spec", help="equivalence spec (TOML, docs/equivalence.md) for comparing outputs and "
                   "for --release agreed (default: the demo service's, agent/kvd.equiv.toml)")
    r.add_argument("--analysis-priority", choices=["idle", "normal"], default="idle",
                   help="CPU priority of the analysis VMs: idle (SCHED_IDLE, default: they take only "
                        "CPU time the native leaves) or normal")
    r.add_argument("--analysis-cpus", default="auto", metavar="auto|all|LIST",
                   help="CPUs the analysis VMs run on: auto (default: every CPU but the first, left to "
                        "the native), all, or a list such as 1,3-5")
    r.add_argument("--metrics-port", type=int,
                   help="serve Prometheus metrics (lag, buffer, findings) on 127.0.0.1:PORT (0: any free port)")
    r.add_argument("--workdir", help="analysis logs and findings.jsonl (default NAME.tdm.analysis)")
    r.add_argument("--libvirt", nargs="?", const="", metavar="URI",
                   help="run the native and the analysis VMs as libvirt domains NAME and "
                        "NAME-tandem-ANALYSIS, destroyed and undefined at the end (URI default: "
                        "libvirt's; write --libvirt=URI; docs/libvirt.md)")
    r.set_defaults(func=cmd_shadow)

    r = sub.add_parser("record", help="boot a guest and record it into a bundle")
    r.add_argument("bundle", help="bundle directory to create (NAME.tdm)")
    r.add_argument("--duration", type=parse_duration, help="stop after this much VM time (e.g. 30s)")
    r.add_argument("--port", type=int, help="host port forwarded to the guest service (default: free port)")
    r.add_argument("--kernel", default="native", choices=list(catalog.KERNELS),
                   help="guest kernel flavor (default native)")
    r.add_argument("--kernel-image", help="boot this bzImage instead of a built flavor")
    r.add_argument("--userland", default="native", choices=list(catalog.USERLANDS),
                   help="guest userland (default native; asan: its services built with ASan)")
    r.add_argument("--assertions", metavar="FILE",
                   help="declare an assertion pack for later `tandem assert` (checked, hashed into "
                        "the manifest; the recording itself is unchanged)")
    r.set_defaults(func=cmd_record)

    r = sub.add_parser("replay", help="replay a bundle exactly and verify its outputs, or "
                       "semantically into analysis VMs (--analysis)")
    r.add_argument("bundle")
    r.add_argument("--follow", action="store_true", help="replay a recording that is still running")
    r.add_argument("--partial", action="store_true", help="replay up to the last intact segment")
    r.add_argument("--analysis", action="append", metavar="NAME",
                   help="semantic replay into this analysis VM (repeatable, or comma-separated): "
                        + catalog.help_lines())
    r.add_argument("--spec", help="equivalence spec (TOML) added to the built-in one (docs/equivalence.md)")
    r.add_argument("--jobs", type=int, default=2, help="analysis VMs run at once (default 2)")
    r.add_argument("--no-noise", action="store_true",
                   help="do not replay into the native kernel to learn what differs between runs")
    r.add_argument("--no-record", action="store_true",
                   help="do not record the analysis VMs (by default each leaves WORKDIR/NAME.tdm, "
                        "which `tandem replay` replays exactly)")
    r.add_argument("--workdir", help="where analysis logs go (default BUNDLE/analysis)")
    r.add_argument("--json", action="store_true", help="also print the verdict as JSON on stdout")
    r.set_defaults(func=cmd_replay)

    r = sub.add_parser("assert", help="check temporal kernel assertions on an exact replay "
                       "(docs/assertions-running.md)")
    r.add_argument("bundle")
    r.add_argument("--assertions", metavar="FILE",
                   help="assertion pack (default: the one the recording declared)")
    r.add_argument("--select", action="append", metavar="NAME",
                   help="check only this assertion (repeatable)")
    r.add_argument("--json", action="store_true", help="also print the violations as JSON on stdout")
    r.set_defaults(func=cmd_assert)

    r = sub.add_parser("inspect", help="per-channel counts, sizes, integrity of a bundle")
    r.add_argument("bundle")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_inspect)

    r = sub.add_parser("plan", help="predict the input buffer an analysis needs (FreeDA's "
                       "equation 2) from a recording's requests")
    r.add_argument("bundle", help="the native's recording")
    r.add_argument("--slowdown", type=float, metavar="F",
                   help="how many times slower the analysis runs than the native")
    r.add_argument("--from", dest="from_workdir", metavar="WORKDIR",
                   help="measure the slowdown from a finished semantic replay's summary.json "
                        "(tandem replay BUNDLE --analysis NAME --workdir WORKDIR)")
    r.add_argument("--analysis", help="with --from: that analysis only (default: each, and the largest)")
    r.add_argument("--concurrency", type=int, metavar="N_T",
                   help="requests the native issues before the analysis catches up (default: "
                        "measured from the recording for the slowdown)")
    r.add_argument("--no-boot", action="store_true",
                   help="the analysis is booted before the native serves: no boot backlog")
    r.add_argument("--per-request", choices=["mean", "max"], default="mean",
                   help="S_req as the mean request (FreeDA's choice, default) or the largest")
    r.add_argument("--json", action="store_true", help="also print the inputs and result as JSON on stdout")
    r.set_defaults(func=cmd_plan)

    r = sub.add_parser("attach", help="record a shut-off libvirt domain from boot (started by tandem) "
                       "while shadow analysis domains DOMAIN-tandem-NAME trail it live, until it stops; "
                       "its own definition is put back at the end")
    r.add_argument("domain", help="the native libvirt domain (shut off; direct kernel boot, one virtio "
                   "NIC on user networking, one file disk on virtio)")
    r.add_argument("--analysis", action="append", metavar="NAME", required=True,
                   help="analysis VM to create (repeatable, or comma-separated): "
                        + catalog.help_lines())
    r.add_argument("--uri", help="libvirt URI (default: libvirt's, e.g. $LIBVIRT_DEFAULT_URI)")
    r.add_argument("--bundle", help="the native's recording (default DOMAIN.tdm here)")
    r.add_argument("--workdir", help="the analyses' recordings, findings.jsonl, summary.json "
                   "(default BUNDLE.analysis)")
    r.add_argument("--port", type=int, help="host port forwarded to the guest's port 7000 (default: free port)")
    r.add_argument("--duration", type=parse_duration, help="stop the native after this much VM time")
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

    r = sub.add_parser("wireshark", help="install the device log's Wireshark dissector (serial, block, "
                       "rng records, VM time, instruction count), or print its path")
    r.add_argument("action", choices=["install", "path"],
                   help="install: copy it into Wireshark's personal Lua plugins folder; path: print "
                        "where it is (for tshark -X lua_script:PATH)")
    r.add_argument("--dir", help="install into this folder instead")
    r.set_defaults(func=cmd_wireshark)

    r = sub.add_parser("doctor", help="check the host, the cache and its builds; one line a check, "
                       "with the fix (also ./tandem doctor, which needs no venv)")
    r.add_argument("--no-kvm-boot", action="store_true", help="do not boot a guest to check /dev/kvm")
    r.set_defaults(func=cmd_doctor)

    r = sub.add_parser("demo", help="record the demo guest under client traffic and replay it")
    r.add_argument("--workdir", help="where to keep the demo bundle (default: a temp dir)")
    r.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="tandem: %(message)s")
    if not args.debug:
        # qemu.qmp logs what happens on its socket itself: "Task.Reader: EOFError" at INFO
        # when a QEMU quits (every run), and "Negotiation failed: EOFError" / "Failed to
        # establish session" at ERROR when a QEMU exits at start while tandem connects
        # (whether it does depends on timing: under load, always). tandem turns every QMP
        # failure into its own one-line error, so those lines are for --debug only.
        logging.getLogger("qemu").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except TandemError as e:
        console.print(f"tandem: error: {e}", markup=False)
        return e.exit_code
    except KeyboardInterrupt:
        console.print("tandem: interrupted", markup=False)
        return 130


if __name__ == "__main__":
    sys.exit(main())
