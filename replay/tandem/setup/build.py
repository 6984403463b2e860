"""Build what tandem runs (QEMU, the guest kernels and modules, the guest image, the
TCG plugin, the reference ordinary VM) through meson, and the console parser through mypyc (report/compiled.py),
under the setup lock, showing progress.

    python -m tandem.setup.build [TARGET | GROUP ...]     (default: GROUP all)

meson.build lists one target per piece; each runs a script in scripts/ that builds into
the content-addressed cache and is a no-op when the piece is cached. The targets run in
parallel (ninja, two at a time): on 2 cores a kernel build leaves one core idle for
about a minute in each link, and QEMU's configure and the source unpacking are serial.

Progress: a script building something long writes CACHE/progress/TARGET, one line
"START DONE TOTAL UNIT" (start as Unix time; TOTAL 0 when unknown), and removes it when
done. This module turns them into one updating line in a terminal, or a plain line every
30 s otherwise (CI), with what is left estimated from each target's own rate so far.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import REPO, build_dir, cache_dir
from ..catalog import DEFAULT_KERNEL, FLAVORS
from ..errors import InfraError, TandemError
from ..report import compiled as compiled_parser
from . import state
from .lock import SetupLock

log = logging.getLogger(__name__)

# What `tandem record` and an exact replay of the demo guest need; what analyses and
# assertions need; the ordinary guests that stand for a user's own VM (tests, benchmarks,
# `tandem demo --guest debian`; the CLI itself never needs them).
GROUPS = {
    "record": ["qemu", f"kernel-{DEFAULT_KERNEL}", f"modules-{DEFAULT_KERNEL}", "guest"],
    "analyses": [t for f in FLAVORS if f != DEFAULT_KERNEL for t in (f"kernel-{f}", f"modules-{f}")]
    + ["plugin-calls", "plugin-stop"],
    "guests": ["refvm", "refvm-tandem", "asan-redis"],
    # FreeBSD guests, from the tree TANDEM_FREEBSD_SRC names; not in "all" (a Linux user has none)
    "freebsd": list(state.FREEBSD_TARGETS),
}
GROUPS["all"] = GROUPS["record"] + GROUPS["analyses"] + GROUPS["guests"]
PLAIN_EVERY = 30.0      # seconds between progress lines when not on a terminal
JOBS = 2                # build targets at once (each script runs make -j$(nproc) itself)
FREEBSD_CONFIG = "kernel-freebsd-config"    # scripts/build-freebsd.sh's target for a user's config
CONFIG_DOES_NOT_BUILD = 3                   # its exit status when that config does not build


def expand(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names or ["all"]:
        for t in GROUPS.get(n, [n]):
            if t not in out:
                out.append(t)
    return out


@dataclass
class Progress:
    target: str
    start: float
    done: int
    total: int
    unit: str

    def text(self, now: float) -> str:
        if self.total <= 0 and self.done <= 0:      # a short step that counts nothing
            return f"{self.target} ({_duration(now - self.start)})"
        if self.total <= 0 or self.done <= 0:
            return f"{self.target} {self.done} {self.unit}"
        if self.done >= self.total:
            return f"{self.target} {self.done}/{self.total} {self.unit}, linking"
        left = (now - self.start) * (self.total - self.done) / self.done
        return (f"{self.target} {self.done}/{self.total} {self.unit} "
                f"({100 * self.done // self.total}%, ~{_duration(left)} left)")


_duration = state.duration


def progress_dir() -> Path:
    return cache_dir() / "progress"


def read_progress(targets: list[str]) -> list[Progress]:
    """The progress files of these targets that are being built now."""
    out = []
    for t in targets:
        try:
            start, done, total, *unit = (progress_dir() / t).read_text().split()
            out.append(Progress(t, float(start), int(done), int(total), " ".join(unit)))
        except (FileNotFoundError, ValueError):
            continue      # not started, finished, or caught mid-write: next poll
    return out


def meson() -> str:
    """meson: the venv's (beside this Python; ./tandem puts it on PATH, `python -m tandem`
    from the venv does not), else PATH's; a one-line error when there is none."""
    found = shutil.which("meson", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise InfraError("meson not found (it is in replay/requirements.txt: ./tandem setup)")
    return found


def _meson_setup() -> None:
    b = build_dir()
    if (b / "build.ninja").is_file():
        # Regenerated if meson.build or a file it reads changed (guest-kernel/linux/FLAVORS:
        # a new kernel flavor's targets): `meson compile TARGET` looks a target up before
        # ninja would regenerate, so a flavor added since the last setup would be "not found".
        r = subprocess.run(["ninja", "-C", str(b), "build.ninja"], capture_output=True, text=True)
        if r.returncode != 0:
            raise InfraError(f"meson regenerate {b} failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
        return
    if b.exists():      # a setup cut short: meson refuses a half-made build directory
        log.info("redoing the meson setup of %s (left half-made)", b)
        shutil.rmtree(b)
    r = subprocess.run([meson(), "setup", str(b), str(REPO)], capture_output=True, text=True)
    if r.returncode != 0:
        raise InfraError(f"meson setup {b} failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")


def _show(line: str, tty: bool, last: list) -> None:
    now = time.monotonic()
    if tty:
        width = os.get_terminal_size(sys.stderr.fileno()).columns - 1
        sys.stderr.write("\r\033[K" + line[:width])
        sys.stderr.flush()
    elif line != last[0] and now - last[1] >= PLAIN_EVERY:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        last[:] = [line, now]


def build(targets: list[str], command: str = "tandem", compile_parser: bool = True) -> None:
    """Build these targets (groups expanded) under the setup lock; raise on failure."""
    targets = expand(targets)
    if any(t in state.FREEBSD_TARGETS for t in targets):
        freebsd_source()
    with SetupLock(f"building {', '.join(targets)}", command):
        if compile_parser:
            # The console parser compiled by mypyc (report/compiled.py): 1.3x faster on
            # long consoles; the .py modules run until it is built. A no-op when built.
            compiled_parser.build()
        caches = {t: state.cached(t) for t in targets if t in state.KEYED}
        prune(caches)
        room(targets, caches)
        _meson_setup()
        log_offset = state.ninja_log_size()
        logfile = cache_dir() / "logs" / "build.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        progress_dir().mkdir(parents=True, exist_ok=True)
        for t in targets:      # left by a build that was killed: nobody else builds now
            (progress_dir() / t).unlink(missing_ok=True)
        log.info("building what is missing of %s (cached in %s; log %s)", ", ".join(targets), cache_dir(), logfile)
        t0 = time.monotonic()
        with open(logfile, "w") as out:
            proc = subprocess.Popen([meson(), "compile", "-C", str(build_dir()), "-j", str(JOBS), *targets],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            _wait_showing_progress(proc, targets)
        if proc.returncode != 0:
            tail = logfile.read_text(errors="replace").splitlines()[-40:]
            sys.stderr.write("\n".join(tail) + "\n")
            failed = [l.split("FAILED: ", 1)[1].strip() for l in tail if "FAILED: " in l]
            raise InfraError(f"build of {failed[0] if failed else ', '.join(targets)} failed "
                             f"(whole log: {logfile})")
        state.record_times(targets, log_offset)
        for c in caches.values():
            if c:
                state.used(c)
        log.info("built %s in %s", ", ".join(targets), _duration(time.monotonic() - t0))


def prune(caches: dict[str, state.Cached | None]) -> None:
    """Remove the cache's builds of these targets for keys other than their current one
    but the most recently used (state.superseded): each change to a kernel config or the
    QEMU series makes a new key, and a cache that kept them all grew without bound. Under
    the setup lock, which every build of every checkout takes, so no build is using them."""
    gone = [d for c in caches.values() if c for d in state.superseded(c) if d.is_relative_to(cache_dir())]
    if not gone:
        return
    freed = _disk_bytes(gone)
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    log.info("removed %d superseded build%s from the cache (%.1f GiB): %s", len(gone), "s" * (len(gone) > 1),
             freed / 2**30, ", ".join(str(d.relative_to(cache_dir())) for d in gone))


def _disk_bytes(dirs: list[Path]) -> int:
    """The disk space the files under dirs take, each inode once: what removing them frees
    (the file system's free space before and after is not: other writers change it
    meanwhile, and can make a removal read as negative)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            for name in subdirs + files:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def room(targets: list[str], caches: dict[str, state.Cached | None]) -> None:
    """Refuse before building when the disk under the cache cannot hold what these targets
    add to it (state.growth) and a test run's recordings besides (doctor.WARM_BYTES)."""
    from .doctor import WARM_BYTES
    need, todo = state.growth(targets, caches)
    probe = state.disk_of(cache_dir())
    free = shutil.disk_usage(probe).free
    if free < need + WARM_BYTES:
        raise InfraError(f"disk: {free / 2**30:.1f} GiB free under {probe}; building {', '.join(todo)} adds about "
                         f"{need / 2**30:.1f} GiB and recordings need {WARM_BYTES / 2**30:.0f} GiB more; fix: free "
                         "space there, or set TANDEM_CACHE to a larger disk")


def _wait_showing_progress(proc: subprocess.Popen, targets: list[str]) -> None:
    """Until proc ends, the progress of these targets as one line (module docstring)."""
    tty, last = sys.stderr.isatty(), ["", time.monotonic()]
    while proc.poll() is None:
        if active := read_progress(targets):
            now = time.time()
            _show("tandem: building " + "; ".join(p.text(now) for p in active), tty, last)
        time.sleep(1.0)
    if tty:
        sys.stderr.write("\r\033[K")


def build_freebsd_config(conf: str, command: str = "tandem build") -> dict[str, str]:
    """Build a FreeBSD kernel config of the user's from the tree TANDEM_FREEBSD_SRC names
    (scripts/build-freebsd.sh kernel-freebsd-config; cached by the config's content and
    the files beside it that it includes) and return its build record: `bzImage` the
    kernel, `vmlinux` its kernel.debug. Not a meson target: the config is the user's file,
    not a piece of tandem. A config that does not build is a one-line error naming it and
    its first error (config(8)'s, the compiler's or the linker's), with the log's path."""
    freebsd_source()
    path = Path(conf)
    if not path.is_file():
        raise TandemError(f"FreeBSD kernel config {conf}: no such file")
    out_dir = cache_dir() / "freebsd"
    out_dir.mkdir(parents=True, exist_ok=True)
    out, err = out_dir / f".config-{os.getpid()}.json", out_dir / f".config-{os.getpid()}.err"
    env = dict(os.environ, TANDEM_FREEBSD_KERNCONF=str(path.resolve()))
    try:
        with SetupLock(f"building FreeBSD kernel config {path}", command), open(err, "wb") as errf:
            t0 = time.monotonic()
            proc = subprocess.Popen(["bash", str(REPO / "scripts" / "build-freebsd.sh"), FREEBSD_CONFIG, str(out)],
                                    stdout=subprocess.DEVNULL, stderr=errf, stdin=subprocess.DEVNULL, env=env)
            _wait_showing_progress(proc, [FREEBSD_CONFIG])
            lines = err.read_text(errors="replace").splitlines()
            if proc.returncode != 0:
                said = [ln.removeprefix("tandem: error: ") for ln in lines if ln.startswith("tandem: error: ")]
                why = said[-1] if said else f"building FreeBSD kernel config {path} failed: " + (
                    lines[-1] if lines else f"exit status {proc.returncode}")
                # 3: the config itself does not build (the user's input); else the build's own failure
                raise (TandemError if proc.returncode == CONFIG_DOES_NOT_BUILD else InfraError)(why)
            built = json.loads(out.read_text())
            how = (f"built in {_duration(time.monotonic() - t0)}" if any("building FreeBSD kernel" in ln for ln in lines)
                   else "cached")
            log.info("FreeBSD kernel config %s (%s), %s: %s", path, built.get("version", "?"), how, built["bzImage"])
            return built
    finally:
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)


def freebsd_source() -> Path:
    """The FreeBSD source tree or archive FreeBSD targets build from (TANDEM_FREEBSD_SRC:
    a setting, never a path in the code); a one-line error when it is not there."""
    src = os.environ.get("TANDEM_FREEBSD_SRC", "")
    if not src:
        raise TandemError("FreeBSD targets need a FreeBSD source tree: --freebsd-src PATH or TANDEM_FREEBSD_SRC "
                          "(a checkout, or a release's src.txz: docs/freebsd.md)")
    if not Path(src).exists():
        raise TandemError(f"TANDEM_FREEBSD_SRC={src}: no such file or directory")
    # as scripts/build-freebsd.sh checks it, but before meson and ninja say anything; an
    # archive's tree is checked as it is unpacked
    if Path(src).is_dir() and not all((Path(src) / f).is_file() for f in ("tools/build/make.py",
                                                                          "sys/conf/newvers.sh")):
        raise TandemError(f"{src}: not a FreeBSD source tree (no tools/build/make.py or sys/conf/newvers.sh)")
    return Path(src)


class Background:
    """Build targets in a child process at the lowest CPU priority while the caller
    runs VMs (the demo records and replays the native while the analyses' kernels
    build): the VMs keep their speed, the build takes the CPU time they leave.

        bg = Background(["analyses"]); ...; bg.wait(status)   # status(line): progress
    """

    def __init__(self, targets: list[str], command: str = "tandem demo", parser: bool = False):
        """parser: also compile the console parser (a minute of CPU the kernels could use;
        the demo's consoles are short, and the .py parser reads them as well)."""
        self.targets = expand(targets)
        self.log = cache_dir() / "logs" / "build-background.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TANDEM_COMMAND=f"{command} (in the background)",
                   PYTHONPATH=os.pathsep.join([str(REPO / "replay"), os.environ.get("PYTHONPATH", "")]))
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tandem.setup.build", *self.targets,
                                          *([] if parser else ["--no-parser"])],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, preexec_fn=lambda: os.nice(19), start_new_session=True)

    def wait_for(self, done, status=lambda line: None, poll_s: float = 5.0) -> None:
        """Until done() (polled every poll_s: it may run build scripts to read keys) or
        the build has ended, with its progress line given to status."""
        last = 0.0
        while self.proc.poll() is None:
            if time.monotonic() - last >= poll_s:
                if done():
                    return
                last = time.monotonic()
            active = read_progress(self.targets)
            status("building " + ("; ".join(p.text(time.time()) for p in active) if active else
                                  ", ".join(self.targets)))
            time.sleep(1.0)

    def wait(self, status=lambda line: None) -> None:
        """Until the build ends, with its progress line given to status; raise if it failed."""
        while self.proc.poll() is None:
            active = read_progress(self.targets)
            status("building " + ("; ".join(p.text(time.time()) for p in active) if active else
                                  ", ".join(self.targets)))
            time.sleep(1.0)
        if self.proc.returncode != 0:
            last = self.log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise InfraError(f"building {', '.join(self.targets)} failed: {last[0]} (log: {self.log})")

    def stop(self) -> None:
        """End the build and everything it started (meson, ninja, make): a build cut short
        leaves nothing that counts as built (the scripts publish by atomic rename)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()


def ensure(targets: list[str], why: str, command: str = "tandem", parser: bool = False) -> None:
    """Build what of these targets (groups expanded) is missing or stale before a command
    uses them, saying first what for and about how long; nothing when all are up to date
    (a check of their keys, under a second each). `why` says what asked for them
    ("recording", "--analysis kasan"); `parser`: also compile the console parser (a
    minute, once), for commands that read analyses' consoles."""
    targets = expand(targets)
    if parser:
        compiled_parser.build()
    todo = [t for t in targets if state.why_stale(t)]
    if not todo:
        return
    from .doctor import preflight
    for c in preflight()[:1]:
        raise InfraError(f"{c.name}: {c.found}; fix: {c.fix}")
    log.info("building %s for %s: %s, once (then cached in %s)", ", ".join(todo), why,
             state.estimate_text(todo), cache_dir())
    build(todo, command=command, compile_parser=False)
    # A build directory meson had to set up again loses the descriptions of what was
    # built: those are written again from the cache (each script a no-op there).
    if again := [t for t in targets if t not in todo and state.why_stale(t)]:
        build(again, command=command, compile_parser=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.setup.build", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help=f"meson targets or groups ({', '.join(GROUPS)}; default all)")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--no-parser", action="store_true",
                   help="do not compile the console parser (the .py modules run without it)")
    p.add_argument("--freebsd-src", metavar="PATH",
                   help="the FreeBSD source tree (a checkout or a release's src.txz) FreeBSD targets build from "
                        "(default: $TANDEM_FREEBSD_SRC)")
    p.add_argument("--freebsd-config", metavar="FILE",
                   help="build this FreeBSD kernel config of yours (from --freebsd-src's tree; it may include "
                        "GENERIC or tandem's TANDEM-NATIVE) and say how to analyse with it (docs/freebsd.md)")
    args = p.parse_args(argv)
    if args.freebsd_src:
        os.environ["TANDEM_FREEBSD_SRC"] = os.path.abspath(args.freebsd_src)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="tandem: %(message)s")
    command = os.environ.get("TANDEM_COMMAND", "tandem build")
    try:
        if args.freebsd_config:
            if args.targets:
                build(args.targets, command=command, compile_parser=not args.no_parser)
            built = build_freebsd_config(args.freebsd_config, command)
            name = re.sub(r"[^a-z0-9._-]", "-", Path(args.freebsd_config).name.lower())
            log.info("analyse a recording of your FreeBSD VM with it: tandem replay BUNDLE --analysis-kernel "
                     "%s=%s,%s", name, built["bzImage"], built["vmlinux"])
            return 0
        build(args.targets, command=command, compile_parser=not args.no_parser)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
