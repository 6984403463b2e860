"""`tandem farm run` / `tandem farm report`: the nightly replay farm (docs/farm.md)."""
from __future__ import annotations

import argparse
import datetime
import hashlib
import logging
import re
from pathlib import Path

from .. import __version__, artifacts, catalog
from ..errors import EXIT_CLEAN, EXIT_FOUND, EXIT_INCOMPLETE, TandemError
from .common import analysis_names, bring_kernel, build_for, build_for_analyses
from .render import console

SINCE = re.compile(r"(\d{1,4})([dhw])")


def add_parsers(sub) -> None:
    f = sub.add_parser("farm", help="the nightly replay farm: recordings x analyses on Dask, remembered and triaged")
    fs = f.add_subparsers(dest="farm_cmd", required=True)
    r = fs.add_parser("run", help="run one night (a farm file, or flags for the common case)")
    r.add_argument("farm_file", nargs="?", metavar="FARM.toml", help="the farm file (docs/farm.md)")
    r.add_argument("--bundle", action="append", default=[], metavar="PATH|GLOB", help="a recording (repeatable)")
    r.add_argument("--analysis", action="append", metavar="NAME", help="an analysis (repeatable, or comma-separated): "
                   + catalog.help_lines())
    r.add_argument("--analysis-kernel", action="append", default=[], metavar="NAME=BZIMAGE[,VMLINUX]",
                   help="also replay into this kernel of yours, as analysis NAME (repeatable)")
    r.add_argument("--no-exact", action="store_true", help="do not replay each recording exactly on this QEMU")
    r.add_argument("--no-noise", action="store_true", help="each analysis alone, without its replay into the native "
                   "kernel (one VM a task, not two; what the native's kernel also does is then not told apart)")
    r.add_argument("--db", help="the farm's database: a file (SQLite) or an SQLAlchemy URL (default farm.sqlite)")
    r.add_argument("--out", help="where reports and each task's logs go (default farm-out)")
    r.add_argument("--night", help="the night's name (default: today's date, UTC); the same name continues it")
    r.add_argument("--scheduler", metavar="tcp://HOST:8786", help="a running Dask scheduler (default: a "
                   "LocalCluster on this host)")
    r.add_argument("--vms", type=int, help="VMs at once on this host's LocalCluster (default: its cores)")
    r.add_argument("--no-pin", action="store_true", help="let each task's VMs run on any CPU (default: a CPU of "
                   "their own each, when the worker's host has them free)")
    r.add_argument("--repeats", type=int, help="replays of a task more before a never-seen finding is called new "
                   "(default 2)")
    r.add_argument("--fixed-after", type=int, metavar="N", help="nights without a finding before it is fixed "
                   "(default 3)")
    r.set_defaults(func=cmd_run)
    p = fs.add_parser("report", help="render the farm's nights as HTML, JUnit XML and JSON")
    p.add_argument("--db", default="farm.sqlite", help="the farm's database (default farm.sqlite)")
    p.add_argument("--out", default="farm-out", help="where the reports go (default farm-out)")
    p.add_argument("--night", help="the night to report (default the last)")
    p.add_argument("--since", metavar="7d", help="nights started within this long (d, h or w) in the plots")
    p.add_argument("--fixed-after", type=int, default=3, metavar="N", help="nights without a finding before it is "
                   "fixed (default 3)")
    p.set_defaults(func=cmd_report)


def farm_spec(args: argparse.Namespace):
    """The farm file with the flags over it, or the flags alone."""
    from ..farm import spec
    given = spec.load(args.farm_file) if args.farm_file else spec.FarmSpec(base=Path.cwd())
    flags = {k: v for k, v in (("db", args.db), ("out", args.out), ("night", args.night),
                                 ("scheduler", args.scheduler), ("vms", args.vms), ("repeats", args.repeats),
                                 ("fixed_after", args.fixed_after))
             if v is not None}
    if args.no_exact:
        flags["exact"] = False
    if args.no_noise:
        flags["noise"] = False
    if args.no_pin:
        flags["pin"] = False
    settings = spec.settings({**_fields(given.settings), **flags}, where="flag")
    return spec.check(spec.FarmSpec(bundles=given.bundles + tuple(args.bundle),
                                    analyses=given.analyses + tuple(analysis_names(args.analysis)),
                                    kernels=given.kernels + tuple(args.analysis_kernel),
                                    settings=settings, base=given.base))


def _fields(settings) -> dict:
    import dataclasses
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if getattr(settings, f.name) != f.default}


def targets(names: tuple[str, ...], kernels: tuple[str, ...]):
    """The night's analyses as the farm schedules them, each with the key of the kernel
    build it boots (tonight's build is a new task): a catalogue kernel's bzImage and the
    build of tandem's modules it loads (a module fixed and rebuilt is a new build), a user
    kernel's bzImage; a user kernel checked now, a one-line error naming it."""
    from ..farm.night import Guests, Target
    out = []
    for a in dict.fromkeys(catalog.get(name) for name in names):
        image = artifacts.kernel(a.flavor)["bzImage_sha256"][:16]
        modules = f":{artifacts.modules(a.flavor)['key']}" if a.os == "linux" else ""     # FreeBSD's are built in
        out.append(Target(a.name, f"{a.flavor}:{image}{modules}:{a.userland.name}",
                          guests=Guests.ANY if a.userland.name == "native" else Guests.DEMO, os=a.os))
    for item in kernels:
        a = bring_kernel(item)          # its files and name checked: a one-line error naming them
        assert a.kernel.image is not None
        digest = hashlib.sha256(Path(a.kernel.image).read_bytes()).hexdigest()[:16]
        out.append(Target(a.name, f"user:{digest}", kernel_spec=item, guests=Guests.USERS, os=a.os))
    return out


def corpus(spec):
    from ..farm.night import Corpus
    from ..formats import bundle
    from ..semantic.guests import recorded_os
    out = []
    for d in spec.bundle_dirs():
        manifest = bundle.load_manifest(d)
        entry = manifest.files.get(bundle.DEVLOG)
        if entry is None or entry.sha256 is None:
            raise TandemError(f"{d}: no device log in its manifest (a recording that never started?)")
        out.append(Corpus(str(d), entry.sha256, users_guest=manifest.users_guest, os=recorded_os(manifest),
                          icount=manifest.stop.icount or 0))
    return out


def quiet_dask() -> None:
    """Dask's scheduler and workers log every connection at INFO, and matplotlib its font
    cache: tandem's own lines are the farm's progress; --debug shows theirs."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        for name in ("distributed", "matplotlib", "bokeh", "tornado"):
            logging.getLogger(name).setLevel(logging.WARNING)


def cmd_run(args: argparse.Namespace) -> int:
    from ..farm import night as farm_night, report, store
    quiet_dask()
    spec = farm_spec(args)
    s = spec.settings
    build_for(["qemu"], "the farm's replays")
    recordings = corpus(spec)
    if spec.analyses:
        build_for_analyses([catalog.get(n) for n in spec.analyses], noise=s.noise,
                           bundles=[r.bundle for r in recordings], mixed=True)
    plan_targets = targets(spec.analyses, spec.kernels)
    name = s.night or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = spec.path(s.out) / name
    db = store.Store(store.engine(store.url_of(s.db, spec.base)))
    qemu_build = artifacts.qemu()["build_id"]
    db.begin_night(name, qemu_build=qemu_build, version=__version__)
    planned = farm_night.plan(recordings, plan_targets, qemu_build if s.exact else None)
    skipped = {k: why for k, why in planned if why is not None}
    db.add_tasks([k for k, _ in planned], skipped)
    console.print(f"farm night {name}: {len(recordings)} recording(s) x {len(plan_targets)} analysis(es)"
                  f"{' + exact' if s.exact else ''}: {len(planned)} task(s)"
                  f"{f' ({len(skipped)} skipped: an analysis that does not apply)' if skipped else ''}; "
                  f"database {store.url_of(s.db, spec.base)}")
    with farm_night.cluster(s) as client:
        console.print(f"Dask dashboard: {client.dashboard_link}")
        with console.status("farm: starting") as status:
            done = [0]

            def shown(key, result):
                done[0] += 1
                status.update(f"farm night {name}: {done[0]} done; last: {Path(key.bundle).name} "
                              f"{key.analysis} r{key.repeat}: {result.status}")
            tally = farm_night.Night(db, client, plan_targets, s, out, on_result=shown,
                                    corpus=recordings).run()
    db.end_night()
    v = report.view(db.engine, name, fixed_after=s.fixed_after)
    paths = report.write(v, out)
    console.print(f"night {name}: " + ", ".join(f"{n} {k}" for k, n in sorted(tally.items())) +
                  f"; {v.new} new finding(s); report {paths['html']}")
    return EXIT_FOUND if v.new else EXIT_INCOMPLETE if v.errors else EXIT_CLEAN


def cmd_report(args: argparse.Namespace) -> int:
    from ..farm import report, store
    quiet_dask()
    since = None
    if args.since:
        m = SINCE.fullmatch(args.since)
        if not m:
            raise TandemError(f"--since {args.since!r}: give a number of days, hours or weeks (7d, 12h, 2w)")
        unit = {"d": "days", "h": "hours", "w": "weeks"}[m.group(2)]
        since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(**{unit: int(m.group(1))})
    url = store.url_of(args.db)
    if url.startswith("sqlite:") and not Path(args.db).is_file():
        raise TandemError(f"{args.db}: no such farm database (tandem farm run --db makes one)")
    v = report.view(store.engine(url), args.night, since, args.fixed_after)
    if not v.night:
        raise TandemError(f"{args.db}: no night{' called ' + repr(args.night) if args.night else ''} in it")
    paths = report.write(v, Path(args.out) / v.night)
    console.print(f"night {v.night}: {v.new} new; {paths['html']}, {paths['junit']}, {paths['json']}")
    return EXIT_CLEAN
