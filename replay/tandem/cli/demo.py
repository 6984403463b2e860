"""`tandem demo`: the embedded default, end to end.

Record the demo guest while real clients talk to it over the port forward (some
requests hit the planted bugs, which the native guest serves without noticing)
and lines are typed on its serial console; power it off; inspect the bundle;
replay it exactly and show the verdict; then replay it into the analysis VMs
(sanitizer kernels, ASan userland) and show what they found, attributed to the
requests.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .. import catalog, private
from ..errors import EXIT_CLEAN, EXIT_FOUND, TandemError
from ..exact.replay import replay
from ..record.recording import Recording
from ..record.workload import PLANTED_BUGS, bad_requests, demo_traffic
from .inspect_bundle import inspect, render
from .render import console

# Every analysis of the catalogue but the null one (the demo adds it itself, for noise).
DEMO_ANALYSES = catalog.demo_analyses()


def _progress(console, status, every_s: float = 30.0):
    """Show a build's progress lines: on the status line in a terminal; elsewhere (CI, a
    log) as plain lines, one every `every_s` at most, since a status line prints nothing
    there and a cold demo waits about 6 minutes for its analysis kernel (380 s after the exact
    replay on a fresh root, docs/benchmarks.md)."""
    last = -every_s

    def show(line: str) -> None:
        nonlocal last
        if console.is_terminal:
            status.update(line)
        elif time.monotonic() - last >= every_s:
            last = time.monotonic()
            console.print(line, markup=False)
    return show


def run_demo(console, workdir: Path | None = None) -> int:
    tmp = None
    if workdir is None:
        tmp = Path(tempfile.mkdtemp(prefix="tandem-demo-"))
        workdir = tmp
    private.make_dir(workdir)
    path = workdir / "demo.tdm"
    if path.exists():
        shutil.rmtree(path)
    from ..setup import build
    # QEMU, the native kernel, the guest; not the console parser's compile (a minute of
    # CPU: the .py parser reads the demo's short consoles as well).
    build.build(["record"], command="tandem demo", compile_parser=False)
    # The analyses' kernels build while the native is recorded and replayed (measured
    # cold: docs/benchmarks.md, "cold setup"); a no-op when they are cached.
    analyses_build = build.Background(catalog.demo_build_targets())
    try:
        console.rule("[bold]1. record")
        with Recording(path) as rec:
            with console.status("booting the demo guest (Debian's kernel, kvd service)"):
                rec.wait_ready()
            console.print(f"guest ready; service forwarded to 127.0.0.1:{rec.port}")
            with console.status("driving client traffic (python sockets + nc)"):
                stats = demo_traffic(rec.port)
            console.print(f"clients made {stats['requests']} requests")
            replies = bad_requests(rec.port)
            console.print("planted-bug requests, answered normally by the native guest: "
                          + ", ".join(f"{PLANTED_BUGS[k][0][:14]!r}->{v}" for k, v in replies.items()),
                          markup=False)
            rec.serial.type("echo hello from the serial console")
            mark = rec.serial.wait_for(b"hello from the serial console", 30)
            rec.serial.type("stats")
            rec.serial.wait_for(b"STATS", 30, start=mark)
            rec.serial.type("poweroff")
            with console.status("guest powering off"):
                rec.wait(timeout=120)
        console.print(render(inspect(path)))

        console.rule("[bold]2. exact replay")
        with console.status("replaying under icount (idle time skipped)"):
            v = replay(path)
        console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())

        console.rule("[bold]3. semantic replay into analysis VMs")
        completed = _analyse_in_turns(path, analyses_build)
        console.print(f"bundle kept at {path}" if tmp is None else
                      f"(bundle in {path}; removed at exit, use --workdir to keep it)")
        return EXIT_CLEAN if v.ok and completed else EXIT_FOUND
    finally:
        analyses_build.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _analyse_in_turns(path: Path, analyses_build) -> bool:
    """Replay into each analysis as soon as its kernel is built, not after the slowest:
    those on the native kernel at once (with the noise run, whose result every later turn
    uses again), each other one when its kernel and modules are up to date, while the rest
    still build at nice 19. True when every analysis ran to its end."""
    from ..semantic.analyze import Summary, analyze
    from ..setup.state import why_stale
    from .render import print_summary, print_verdict

    def ready(a: catalog.Analysis) -> bool:
        return all(why_stale(t) is None for t in catalog.build_targets([a]) if t not in ("qemu", "guest"))

    def names(analyses: list[catalog.Analysis], sep: str = ", ") -> str:
        return sep.join(a.name for a in analyses)

    pending, first, completed = list(DEMO_ANALYSES), None, True
    whole = Summary(str(path))
    t0 = time.monotonic()
    while pending:
        turn = [a for a in pending if ready(a)]
        if not turn:
            if analyses_build.proc.poll() is not None:
                analyses_build.wait()       # raises if the build failed; else the keys say why
                raise TandemError(f"built, yet not up to date: {names(pending)} (tandem doctor says why)")
            with console.status("building the analyses' kernels") as st:
                analyses_build.wait_for(lambda waiting=pending: any(map(ready, waiting)), _progress(console, st))
            console.print(f"{time.monotonic() - t0:.0f} s since the exact replay: kernels for "
                          f"{names([a for a in pending if ready(a)])} built", markup=False)
            continue
        noise = " (+ the native kernel, for noise)" if first is None else ""
        with console.status(f"replaying into {names(turn)}{noise}"):
            s = analyze(path, turn, workdir=path / "analysis" / names(turn, "-"), noise_from=first)
        first = first or s
        print_summary(s, console)
        completed &= all(r.run.outcome in ("poweroff", "finished") for r in s.results)
        pending = [a for a in pending if a not in turn]
        whole.results += s.results
    if whole.results and len(whole.results) > len(first.results if first else []):
        console.print("all the analyses: ", end="")      # the turns' verdicts as one
        print_verdict(whole, console)
    return completed


def add_parsers(sub) -> None:
    r = sub.add_parser("demo", help="record the demo guest under client traffic and replay it")
    r.add_argument("--workdir", help="where to keep the demo bundle (default: a temp dir)")
    r.add_argument("--guest", choices=("demo", "debian"), default="demo",
                   help="demo: tandem's own guest, recorded, replayed and analysed (default); debian: an "
                        "ordinary VM (Debian 12 from its own disk, nginx and redis) recorded under Debian's "
                        "clients and replayed exactly")
    r.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    workdir = Path(args.workdir) if args.workdir else None
    if args.guest == "debian":
        from .demo_debian import run_debian_demo
        return run_debian_demo(console, workdir)
    return run_demo(console, workdir)
