"""What of the build is up to date, and how long what is not takes to build here.

Standard library only: `tandem doctor` reads it on Debian's python3 (a broken venv is
what it diagnoses), and every command asks it before running which of the targets it
needs must be built first (`build.ensure`).

A target is up to date when build/TARGET.json exists, the files it names exist, and its
key is the key its sources give now (the script run with TANDEM_KEY_ONLY=1 prints it,
well under a second: the kernel tarball's hash is memoized). Modules and the plugin have
no key of their own sources (theirs come from their kernel's and QEMU's outputs): they
are up to date when they were built from the kernel build present now.

How long: each cold build's wall seconds are kept in CACHE/build-times.json when it
ends (from ninja's log: two targets build at once, so a figure is one target's time
beside another build, as a user's build has it). A target never built here is
estimated from REFERENCE_S, the figures of an unloaded fresh-check run on a machine that
built the native kernel in 379 s, scaled by how the targets built here compared with
theirs (machines of one kind differ by 2x).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import REPO, build_dir, cache_dir
from ..catalog import FLAVORS, FREEBSD_FLAVORS

# FreeBSD guests' builds (scripts/build-freebsd.sh), from the tree TANDEM_FREEBSD_SRC names.
FREEBSD_TARGETS = ("freebsd-toolchain", *(f"kernel-{f}" for f in FREEBSD_FLAVORS), "freebsd-guest", "freebsd-boot",
                   "freebsd-disk")
# Build scripts that can print the key their sources give now (TANDEM_KEY_ONLY=1); BUILD/
# is the build directory. refvm-tandem's key covers kernel-native's and modules-native's
# keys as their JSONs say now: stale when either was rebuilt since.
KEYED = {"qemu": ["build-qemu.sh", "OUT"], "guest": ["build-guest.sh", "OUT"], "refvm": ["build-refvm.sh", "OUT"],
         "refvm-tandem": ["build-refvm.sh", "--tandem-kernel", "BUILD/kernel-native.json",
                          "BUILD/modules-native.json", "OUT"],
         "asan-redis": ["build-asan-redis.sh", "OUT"],
         **{f"kernel-{f}": ["build-kernel.sh", f, "OUT"] for f in FLAVORS},
         **{t: ["build-freebsd.sh", t, "OUT"] for t in FREEBSD_TARGETS}}
# Builds whose key comes from another build's output (a module from its kernel's image,
# the plugin from QEMU's header).
UNKEYED = [*(f"modules-{f}" for f in FLAVORS), "plugin-calls", "plugin-stop"]
# The fields of a build's JSON that name the files it made.
ARTIFACTS = ("binary", "bzImage", "vmlinux", "disk_base", "initramfs_native", "cpio", "plugin", "disk", "kernel", "initrd",
             "deb", "obj", "root_image", "loader", "pmbr", "gptboot", "mkimg")

# Wall seconds of each cold build in scripts/fresh-check.sh's unloaded run at b4efb6d
# (docs/benchmarks.md, "cold setup"), two targets at a time; refvm, refvm-tandem and
# asan-redis from its run at fdf6fed, kcsan built alone at load 2-4 (482 s); debug (KASAN
# and lockdep) and stock (Debian's, fetched) from the run at 3ec99a7.
REFERENCE_S = {"qemu": 278, "guest": 7, "kernel-native": 379, "kernel-kasan": 563, "kernel-ubsan": 482,
               "kernel-lockdep": 270, "kernel-kcsan": 482, "kernel-debug": 395, "kernel-stock": 5,
               "plugin-calls": 5, "plugin-stop": 3, "refvm": 374, "refvm-tandem": 249, "asan-redis": 171, "qemu-stock": 278,
               **{f"modules-{f}": 4 for f in FLAVORS},
               # FreeBSD 15.1, cold, two at a time beside a test loop (docs/freebsd.md); native
               # alone at its first build (docs/freebsd-boot-notes.md)
               "freebsd-toolchain": 257, "kernel-freebsd-native": 232, "kernel-freebsd-debug": 210,
               "kernel-freebsd-kasan": 216, "freebsd-guest": 2,
               # alone, cold, LLVM's source package already fetched (docs/freebsd.md)
               "freebsd-boot": 141, "freebsd-disk": 2}
REFERENCE_KERNEL_S = REFERENCE_S["kernel-native"]
TIMES = "build-times.json"


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Cached:
    """Where a keyed target's build lives in the cache, as its script says (TANDEM_KEY_ONLY=1
    prints the key, the file whose presence says that key's build is cached, then the
    directories under the cache it shares with other targets, e.g. the Linux source tree)."""
    key: str
    marker: Path
    shares: tuple[Path, ...] = ()

    @property
    def present(self) -> bool:
        return self.marker.is_file()

    @property
    def dirs(self) -> tuple[Path, ...]:
        """The directories this key's build owns or uses, each named with a key of its own."""
        return (self.marker.parent, *self.shares)


def _key_only(target: str) -> list[str]:
    """What target's script prints with TANDEM_KEY_ONLY=1 (nothing: it cannot say)."""
    script, *args = KEYED[target]
    env = dict(os.environ, TANDEM_KEY_ONLY="1")
    argv = [os.devnull if a == "OUT" else str(build_dir() / a[len("BUILD/"):]) if a.startswith("BUILD/") else a
            for a in args]
    r = subprocess.run(["bash", str(REPO / "scripts" / script), *argv],
                       capture_output=True, text=True, env=env, timeout=120)
    return [l for l in r.stdout.splitlines() if l.strip()] if r.returncode == 0 else []


def current_key(target: str) -> str | None:
    """The key target's sources give now (None: it cannot be computed, e.g. QEMU's source
    not downloaded yet)."""
    lines = _key_only(target)
    return lines[0].strip() if lines else None


def cached(target: str) -> Cached | None:
    """Where target's build for the key its sources give now is, or would be, cached (None:
    the key cannot be computed)."""
    lines = _key_only(target)
    if len(lines) < 2:
        return None
    return Cached(lines[0].strip(), Path(lines[1]), tuple(Path(l) for l in lines[2:]))


# A key in a cache directory's name (every script's keys are 16 hex digits).
KEY_IN_NAME = re.compile(r"[0-9a-f]{16}")
# Builds of other keys kept beside the current one: one, the most recently used, so that a
# second checkout at another commit (a CI clone beside a work tree) does not rebuild at
# every switch, while a cache that sees a new key at every change stays bounded.
KEEP_OTHER = 1


def used(c: Cached) -> None:
    """Mark this key's build as used now (its directories' times order superseded())."""
    for d in c.dirs:
        if d.is_dir():
            os.utime(d)


def superseded(c: Cached, keep: int = KEEP_OTHER) -> list[Path]:
    """The cache directories that are this build's but for other keys, beyond the `keep`
    most recently used: each sibling of c's directories whose name differs from it only in
    its keys."""
    out = []
    for d in c.dirs:
        pattern = re.compile(KEY_IN_NAME.sub("[0-9a-f]{16}", re.escape(d.name)))
        try:
            others = [p for p in d.parent.iterdir()
                      if p.name != d.name and pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
        except OSError:
            continue
        others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        out += others[keep:]
    return out


# Bytes the cache grows by when a target is built cold (its output, its object tree), and
# by the directories builds share, each made once: du after the cold build of a clean-clone
# CI on a fresh machine at 85b2c0a (docs/setup.md, "Disk"), rounded up by a tenth. A figure, not a bound: a
# rebuild into an existing object tree (a config changed) grows it by less.
_MIB = 1 << 20
GROWTH = {"qemu": 620 * _MIB, "guest": 15 * _MIB, "refvm": 270 * _MIB, "refvm-tandem": 145 * _MIB,
          "asan-redis": 20 * _MIB, "kernel-native": 1070 * _MIB, "kernel-kasan": 690 * _MIB,
          "kernel-ubsan": 520 * _MIB, "kernel-lockdep": 580 * _MIB, "kernel-kcsan": 570 * _MIB,
          "kernel-debug": 800 * _MIB, "kernel-stock": 160 * _MIB,
          # FreeBSD's kernels build inside the toolchain's object tree; the toolchain counts Debian's LLVM
          # source, fetched for compiler-rt
          "freebsd-toolchain": 860 * _MIB, **{f"kernel-freebsd-{f}": 70 * _MIB for f in FREEBSD_FLAVORS},
          "freebsd-guest": 10 * _MIB, "freebsd-boot": 80 * _MIB, "freebsd-disk": 10 * _MIB}
SHARED_GROWTH = {"linux-src/KEY": 1760 * _MIB, "freebsd/src-KEY": 1210 * _MIB, "freebsd/tree-KEY": 40 * _MIB,
                 "freebsd/obj-boot-KEY": 0}
UNKNOWN_GROWTH = 1 << 30


def growth(targets: list[str], known: dict[str, Cached | None] | None = None) -> tuple[int, list[str]]:
    """About how many bytes building these targets adds to the cache, and which of them are
    not cached already (a keyed target whose current key's build is in the cache, from
    another checkout or an earlier commit, costs nothing: its script only describes it).
    known: cached() of some of them, already asked."""
    total, todo, shared = 0, [], set()
    for t in targets:
        c = known[t] if known and t in known else cached(t) if t in KEYED else None
        if t not in KEYED or (c is not None and c.present):
            continue
        todo.append(t)
        total += GROWTH.get(t, UNKNOWN_GROWTH)
        for d in c.shares if c else ():
            kind = f"{d.parent.name}/{KEY_IN_NAME.sub('KEY', d.name)}"
            if not d.exists() and kind not in shared:
                shared.add(kind)
                total += SHARED_GROWTH.get(kind, UNKNOWN_GROWTH)
    return total, todo


def disk_of(path: Path) -> Path:
    """path, or its nearest ancestor that exists (the cache before the first command made
    it): what to ask the free space of."""
    return next(p for p in (path, *path.parents) if p.exists())


def gone(built: dict) -> str | None:
    """A file a build's JSON names that is no longer there."""
    return next((v for k, v in built.items() if k in ARTIFACTS and isinstance(v, str) and not Path(v).exists()), None)


def why_stale(target: str) -> str | None:
    """Why target must be built before use ('not built', 'stale', ...), None if up to date."""
    built = _json(build_dir() / f"{target}.json")
    if built is None:
        return "not built"
    if lost := gone(built):
        return f"{lost} is gone from the cache"
    if target in FREEBSD_TARGETS and not os.environ.get("TANDEM_FREEBSD_SRC"):
        return None     # built from the tree its JSON names; no tree given to check it against
    if target in KEYED:
        now = current_key(target)
        return None if now is not None and now == built.get("key") else "stale"
    if target.startswith("modules-"):     # its kernel is checked as a target of its own
        kernel = _json(build_dir() / f"kernel-{target[len('modules-'):]}.json") or {}
        return None if built.get("kernel_key") == kernel.get("key") else "stale"
    return None


def record_times(targets: list[str], log_offset: int) -> None:
    """Keep the wall seconds of these targets' builds from the entries ninja's log gained
    after byte log_offset (ninja_log_size() before the build; each ninja run times its
    entries from its own start), those over 20 s only (a cached target's script is a
    no-op of a second or two)."""
    times = _json(cache_dir() / TIMES) or {}
    try:
        with open(build_dir() / ".ninja_log", "rb") as f:
            if f.seek(0, os.SEEK_END) >= log_offset:      # else ninja rewrote (recompacted) it
                f.seek(log_offset)
            else:
                f.seek(0)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        start, end, out = int(parts[0]), int(parts[1]), parts[3]
        target = out[:-len(".json")] if out.endswith(".json") else out
        if target in targets and end - start > 20_000:
            times[target] = round((end - start) / 1000)
    path = cache_dir() / TIMES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def ninja_log_size() -> int:
    """Where ninja's log ends now (record_times reads what a build adds after it)."""
    try:
        return (build_dir() / ".ninja_log").stat().st_size
    except OSError:
        return 0


def machine_factor() -> float | None:
    """This machine's build times over REFERENCE_S's (median of the targets timed here),
    or None when nothing has been timed here yet."""
    times = _json(cache_dir() / TIMES) or {}
    ratios = [times[t] / REFERENCE_S[t] for t in times
              if t in REFERENCE_S and REFERENCE_S[t] >= 60 and isinstance(times[t], (int, float))]
    return statistics.median(ratios) if ratios else None


def estimate_s(targets: list[str], jobs: int = 2) -> tuple[float, bool]:
    """About how long building these targets takes here (wall seconds, `jobs` at a time),
    and whether the figure comes from this machine's own builds."""
    times = _json(cache_dir() / TIMES) or {}
    factor = machine_factor()
    each = [times[t] if isinstance(times.get(t), (int, float)) else REFERENCE_S.get(t, 60) * (factor or 1.0)
            for t in targets]
    return max(max(each, default=0.0), sum(each) / jobs), factor is not None


def duration(s: float) -> str:
    return f"{int(s)} s" if s < 90 else f"{round(s / 60)} min"


def estimate_text(targets: list[str]) -> str:
    """'about 9 min on this machine' or, before anything was timed here, the reference
    machine's figure and its kernel build time so the user can scale it."""
    s, here = estimate_s(targets)
    if here:
        return f"about {duration(s)} on this machine"
    return (f"about {duration(s)} on a 2-core machine that builds a kernel in "
            f"{duration(REFERENCE_KERNEL_S)} (not timed here yet)")
