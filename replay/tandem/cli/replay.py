"""`tandem replay`: exact replay and its verdict, or semantic replay into analysis VMs (--analysis)."""
from __future__ import annotations

import json
from pathlib import Path

from .. import catalog
from ..errors import EXIT_CLEAN, EXIT_FOUND, TandemError
from .common import (add_cpu_idle_option, add_users_analysis_options, build_for, build_for_analyses, progress,
                     users_analyses)
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
    r.add_argument("--workdir", help="where analysis logs go (default BUNDLE/analysis)")
    r.add_argument("--json", action="store_true", help="also print the verdict as JSON on stdout")
    r.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from ..exact.replay import replay
    if args.analysis or args.analysis_kernel or args.overlay:
        return cmd_analyze(args)
    build_for(["qemu"], "an exact replay")
    with console.status("replaying") as status:
        v = replay(args.bundle, follow=args.follow, partial=args.partial,
                   progress=progress("replaying", status))
    if args.json:
        print(json.dumps({"ok": v.ok, "events": v.events, "mismatch": str(v.mismatch) if v.mismatch else None,
                          "replay_wall_s": v.replay_wall_s, "partial": v.partial}))
    console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())
    return EXIT_CLEAN if v.ok else EXIT_FOUND


def cmd_analyze(args) -> int:
    from ..semantic.analyze import analyze
    if args.follow or args.partial:
        raise TandemError("--follow and --partial are for exact replay; not with --analysis")
    analyses = users_analyses(args)
    build_for_analyses(analyses, noise=not args.no_noise, bundles=[args.bundle])
    state: dict[str, str] = {}
    with console.status("replaying into analysis VMs") as status:
        def progress(name, run, done, total):
            state[name] = f"{name} {run.end_ns / 1e9:.1f}s {done}/{total}"
            status.update("semantic replay: " + ", ".join(state.values()))
        s = analyze(args.bundle, analyses, spec_path=args.spec, jobs=args.jobs, noise=not args.no_noise,
                    workdir=Path(args.workdir) if args.workdir else None, progress=progress,
                    record=not args.no_record, root=args.root, cpu_idle=args.cpu_idle)
    print_summary(s)
    if args.json:
        print((Path(args.workdir) if args.workdir else Path(args.bundle) / "analysis").joinpath(
            "summary.json").read_text())
    return s.exit_status()
