"""`tandem replay`: exact replay and its verdict, or semantic replay into analysis VMs (--analysis)."""
from __future__ import annotations

import json
import signal
from pathlib import Path

from .. import catalog
from ..errors import EXIT_CLEAN, EXIT_FOUND, TandemError
from .common import (add_analysis_vcpus_option, add_cpu_idle_option, add_users_analysis_options, build_for,
                     build_for_analyses, progress, users_analyses)
from .render import console, print_summary


def add_parsers(sub) -> None:
    r = sub.add_parser("replay", help="replay a bundle exactly and verify its outputs, or "
                       "semantically into analysis VMs (--analysis)")
    r.add_argument("bundle")
    r.add_argument("--follow", action="store_true", help="replay a recording that is still running")
    r.add_argument("--partial", action="store_true", help="replay up to the last intact segment")
    r.add_argument("--analysis", action="append", metavar="NAME",
                   help="semantic replay into this analysis VM (repeatable, or comma-separated): "
                        + catalog.help_lines())
    add_users_analysis_options(r)
    r.add_argument("--spec", help="equivalence spec (TOML) added to the built-in one (docs/equivalence.md)")
    r.add_argument("--root", metavar="DEVICE",
                   help="a recording of your own VM: the root device its analysis kernels mount (default: the "
                        "root= it booted with, a UUID or LABEL found on its disks; e.g. /dev/vda1)")
    r.add_argument("--jobs", type=int, default=2, help="analysis VMs run at once (default 2)")
    r.add_argument("--no-noise", action="store_true",
                   help="do not replay into the native kernel to learn what differs between runs")
    r.add_argument("--no-record", action="store_true",
                   help="do not record the analysis VMs (by default each leaves WORKDIR/NAME.tdm, "
                        "which `tandem replay` replays exactly)")
    add_cpu_idle_option(r)
    add_analysis_vcpus_option(r)
    r.add_argument("--workdir", help="where analysis logs go (default BUNDLE/analysis)")
    r.add_argument("--explain", action="store_true",
                   help="with --analysis: explain each finding that names a kernel function on the native "
                        "(tandem explain: did the native make the same access?); a section of the summary")
    r.add_argument("--json", action="store_true", help="also print the verdict as JSON on stdout")
    r.add_argument("--gdb", type=int, metavar="PORT",
                   help="reverse debugging: replay under gdb (its stub on 127.0.0.1:PORT, 0 for a free "
                        "port), paused at power-on once snapshots are taken through the recording; "
                        "gdb's reverse-stepi and reverse-continue, QMP replay-seek (docs/reverse-debugging.md)")
    r.add_argument("--snapshot-every", type=float, metavar="SECONDS", default=None,
                   help="with --gdb: host seconds of replay between snapshots, the most a seek replays "
                        "(default 0.5)")
    r.add_argument("--locate", action="store_true",
                   help="a replay that does not match: find where it departs from the recording (the "
                        "instruction, the guest's code and registers there, the output it led to)")
    r.add_argument("--vmlinux", type=Path, metavar="PATH",
                   help="with --locate: the native's vmlinux, to name its code (default: the kernel "
                        "beside a directly booted recording, or the built one whose banner it printed)")
    r.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from ..exact.replay import replay
    if args.analysis or args.analysis_kernel or args.overlay:
        return cmd_analyze(args)
    if args.gdb is not None:
        return cmd_debug(args)
    if args.snapshot_every is not None:
        raise TandemError("--snapshot-every: only with --gdb")
    if args.locate:
        return cmd_locate(args)
    if args.vmlinux is not None:
        raise TandemError("--vmlinux: only with --locate")
    build_for(["qemu"], "an exact replay")
    with console.status("replaying") as status:
        v = replay(args.bundle, follow=args.follow, partial=args.partial,
                   progress=progress("replaying", status))
    if args.json:
        print(json.dumps({"ok": v.ok, "events": v.events, "mismatch": str(v.mismatch) if v.mismatch else None,
                          "replay_wall_s": v.replay_wall_s, "partial": v.partial}))
    console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())
    return EXIT_CLEAN if v.ok else EXIT_FOUND


def cmd_debug(args) -> int:
    """Reverse debugging: the replay paused under gdb until QEMU exits or Ctrl-C."""
    from ..exact.debug import SPACING_S, debug
    from ..qemu.vm import free_port
    if args.follow or args.partial:
        raise TandemError("--gdb: a finished recording only; not with --follow or --partial")
    if not 0 <= args.gdb <= 65535:
        raise TandemError(f"--gdb {args.gdb}: not a TCP port")
    spacing = SPACING_S if args.snapshot_every is None else args.snapshot_every
    if not spacing > 0:
        raise TandemError(f"--snapshot-every {args.snapshot_every}: must be more than 0 seconds")
    build_for(["qemu"], "a replay under gdb")
    port = args.gdb or free_port()
    with console.status("snapshots through the recording") as status, \
            debug(args.bundle, port, spacing_s=spacing, progress=status.update) as session:
        status.stop()
        last = session.snapshots[-1]
        console.print(f"replay paused at power-on, {len(session.snapshots)} snapshots up to instruction "
                      f"{last.icount} (VM time {last.vm_ns / 1e9:.3f}s) of {session.end[1]}\n"
                      f"  gdb: target remote 127.0.0.1:{port}   (reverse-stepi, reverse-continue)\n"
                      f"  QMP: {session.vm.run.rundir / 'qmp.sock'}   (replay-seek, replay-break, query-replay)\n"
                      f"Ctrl-C or gdb's kill ends it.", markup=False)
        signal.signal(signal.SIGTERM, _interrupted)     # kill PID ends it as Ctrl-C does: QEMU is
        try:                                            # in a session of its own and would stay
            session.vm.process().wait()
        except KeyboardInterrupt:
            pass
    return EXIT_CLEAN


def _interrupted(*_) -> None:
    raise KeyboardInterrupt


def cmd_locate(args) -> int:
    """A failed exact replay located (exact/locate.py)."""
    from ..exact.locate import locate
    from ..explain.native import describe_pc
    if args.follow or args.partial:
        raise TandemError("--locate: a finished recording only; not with --follow or --partial")
    if args.vmlinux is not None and not args.vmlinux.is_file():
        raise TandemError(f"--vmlinux {args.vmlinux}: not a file")
    build_for(["qemu"], "locating a replay's departure")
    with console.status("replaying") as status:
        dep = locate(args.bundle, name=lambda pc: describe_pc(Path(args.bundle), pc, args.vmlinux),
                     progress=status.update)
    if args.json:
        print(json.dumps(None if dep is None else departure_json(dep)))
    if dep is None:
        console.print("[bold green]the replay matches its recording: nothing to locate")
        return EXIT_CLEAN
    console.print(render_departure(dep), markup=False)
    return EXIT_FOUND


def departure_json(dep) -> dict:
    return {"how": dep.how, "first_difference": str(dep.mismatch), "icount": dep.icount, "vm_ns": dep.vm_ns,
            "agreed_icount": dep.agreed_icount, "window": dep.window, "pc": dep.pc, "symbol": dep.symbol,
            "registers": {name: {"recorded": a, "replayed": b} for name, a, b in dep.registers},
            "vcpu": dep.vcpu, "vcpus": [{"index": v.index, "pc": v.pc, "symbol": v.symbol} for v in dep.vcpus],
            "led_to": str(dep.led_to) if dep.led_to else None, "checkpoints": dep.checkpoints}


REGISTERS_SHOWN = 20


def render_departure(dep) -> str:
    t = f"{dep.vm_ns / 1e9:.6f}s" if dep.vm_ns is not None else "?"
    where = {"input": f"exactly at instruction {dep.icount} (VM time {t}): an input the replay delivered "
                      f"differs from the one recorded",
             "state": f"at or before instruction {dep.icount} (VM time {t}): a state checkpoint's "
                      f"registers differ",
             "output": f"at or before instruction {dep.icount} (VM time {t}): an output differs"}[dep.how]
    lines = [f"the replay departs from its recording {where}", f"  first difference: {dep.mismatch}"]
    if dep.how != "input":
        lines.append(f"  after: instruction {dep.agreed_icount}, the last state checkpoint that agreed "
                     f"({dep.window} instructions before)" if dep.agreed_icount is not None else
                     "  after: power-on (no state checkpoint before it; a bundle recorded without them "
                     "has none)" if not dep.checkpoints else "  after: power-on (no checkpoint agreed)")
    lines += _vcpu_lines(dep) or ["  guest pc: ?"]
    lines.append(f"  led to: {dep.led_to}" if dep.led_to else "  led to: no output that differs")
    return "\n".join(lines)


def _vcpu_lines(dep) -> list[str]:
    """The first vCPU's pc and registers; on several vCPUs, whose they are and the
    others' pcs after them."""
    lines = []
    for n, v in enumerate(dep.vcpus):
        if n:
            said = v.symbol == dep.vcpus[0].symbol and (v.symbol or "").startswith("not named")
            lines.append(f"  vCPU {v.index}: pc {_pc(v.pc)} {'(not named, as above)' if said else v.symbol or ''}".rstrip())
            continue
        whose = "" if len(dep.vcpus) == 1 else f" (vCPU {v.index}: {_whose(dep)})"
        lines.append(f"  guest pc{whose}: {_pc(v.pc)} {v.symbol or ''}".rstrip())
        rows = [f"{name}={'' if a is None or a == b else f'{a:#x}->'}{'-' if b is None else f'{b:#x}'}"
                for name, a, b in v.registers[:REGISTERS_SHOWN]]
        if rows:
            lines.append("  registers" + (" (recorded->replayed where they differ)" if dep.how == "state" else "")
                         + ": " + " ".join(rows))
    return lines


def _pc(pc: int | None) -> str:
    return f"{pc:#x}" if pc is not None else "?"


def _whose(dep) -> str:
    if dep.vcpu is None:
        return "the first; the difference names no vCPU"
    return "its registers differ" if dep.how == "state" else "its access made the event"


def cmd_analyze(args) -> int:
    from ..formats import bundle
    from ..semantic.analyze import analyze
    if args.follow or args.partial:
        raise TandemError("--follow and --partial are for exact replay; not with --analysis")
    analyses = users_analyses(args)
    # --analysis-vcpus native: as many as the recording's machine had
    vcpus = (bundle.load_manifest(args.bundle).machine.smp or 1) if args.analysis_vcpus == "native" else 1
    build_for_analyses(analyses, noise=not args.no_noise, bundles=[args.bundle])
    state: dict[str, str] = {}
    with console.status("replaying into analysis VMs") as status:
        def progress(name, run, done, total):
            state[name] = f"{name} {run.end_ns / 1e9:.1f}s {done}/{total}"
            status.update("semantic replay: " + ", ".join(state.values()))
        s = analyze(args.bundle, analyses, spec_path=args.spec, jobs=args.jobs, noise=not args.no_noise,
                    workdir=Path(args.workdir) if args.workdir else None, progress=progress,
                    record=not args.no_record, root=args.root, cpu_idle=args.cpu_idle,
                    vcpus=vcpus)
    print_summary(s)
    workdir = Path(args.workdir) if args.workdir else Path(args.bundle) / "analysis"
    if args.explain:
        explain_findings(Path(args.bundle), workdir)
    if args.json:
        print(workdir.joinpath("summary.json").read_text())
    return s.exit_status()


def explain_findings(bundle: Path, workdir: Path) -> None:
    """The summary's explanations: each finding with a kernel function, on the native
    (explain.explain_all), printed and added to summary.json."""
    from ..explain.explain import explain_all
    from ..private import write_text
    build_for(["plugin-calls", "plugin-stop"], "explaining findings")
    with console.status("explaining findings on the native") as status:
        done = explain_all(bundle, workdir / "findings.jsonl",
                           progress=lambda n, title: status.update(f"explaining finding {n}: {title}"))
    console.print("\nExplained on the native (tandem explain):")
    for x in done:
        mark = {True: "MADE", False: "not made", None: "unknown"}[x["same"]]
        console.print(f"  {x['finding']}. [{mark}] {x['title']}: {x['verdict']}", markup=False)
    if not done:
        console.print("  no finding names a kernel function")
    summary = workdir / "summary.json"
    doc = json.loads(summary.read_text())
    doc["explanations"] = done
    write_text(summary, json.dumps(doc, indent=1))
