#!/usr/bin/env python3
"""Benchmark: FreeBSD's builds from cold, on this host.

Each FreeBSD target built in turn (scripts/build-freebsd.sh, as `./tandem build freebsd`
runs it, one at a time here so each time is its own) into a scratch cache
(TANDEM_CACHE=a new directory): the source archive unpacked and the tree copied, the
kernel toolchain, the three kernels, the demo guest's root; then the native kernel again
after a change to tandem's planted-bug source (the incremental rebuild a kernel developer
waits for). Wall time of each, and the total.

Usage: python bench/freebsd_build.py [--out docs/benchmarks.md]   (TANDEM_FREEBSD_SRC set)
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_replay import publish  # noqa: E402

SECTION = "freebsd_build"
TARGETS = ("freebsd-toolchain", "kernel-freebsd-native", "kernel-freebsd-debug", "kernel-freebsd-kasan",
           "freebsd-guest")
WHAT = {"freebsd-toolchain": "the archive unpacked, the tree copied with tandem's patches, `make.py kernel-toolchain`",
        "kernel-freebsd-native": "TANDEM-NATIVE", "kernel-freebsd-debug": "TANDEM-DEBUG (INVARIANTS, WITNESS)",
        "kernel-freebsd-kasan": "TANDEM-KASAN", "freebsd-guest": "the demo guest's root (makefs)"}


def build(tree: Path, cache: Path, target: str, scratch: Path) -> float:
    """One target built by `tree`'s copy of the build script into `cache`; its wall time."""
    env = dict(os.environ, TANDEM_CACHE=str(cache))
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(tree / "scripts" / "build-freebsd.sh"), target, str(scratch / f"{target}.json")],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench/freebsd_build.py: {target} failed: {r.stderr.strip().splitlines()[-1:]}")
    print(f"{target}: {took:.0f} s", flush=True)
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, help="replace this benchmark's section of this markdown file")
    ap.add_argument("--keep", action="store_true", help="keep the scratch cache")
    args = ap.parse_args()
    src = os.environ.get("TANDEM_FREEBSD_SRC")
    if not src:
        raise SystemExit("bench/freebsd_build.py: set TANDEM_FREEBSD_SRC to a FreeBSD tree or source archive")
    scratch = Path(tempfile.mkdtemp(prefix="tandem-bench-fbbuild-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    cache, tree = scratch / "cache", scratch / "tandem"
    # a copy of the build script and what it builds from, so that the change below is
    # made to the copy, never to this checkout
    for d in ("scripts", "guest-kernel"):
        shutil.copytree(ROOT / d, tree / d)
    try:
        times = {t: build(tree, cache, t, scratch) for t in TARGETS}
        bugs = tree / "guest-kernel" / "freebsd" / "sys" / "dev" / "tandem" / "tandem_bugs.c"
        bugs.write_bytes(bugs.read_bytes() + b"/* bench/freebsd_build.py: a change */\n")
        again = build(tree, cache, "kernel-freebsd-native", scratch)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    total = sum(times.values())
    jobs = os.environ.get("JOBS") or str(os.cpu_count())
    lines = [
        "## FreeBSD builds from cold",
        "",
        f"Measured {datetime.date.today()} on a {os.cpu_count()}-core Debian 12 machine, nothing else running: "
        f"`python bench/freebsd_build.py --out docs/benchmarks.md` (TANDEM_FREEBSD_SRC: FreeBSD 15.1's source "
        f"archive). Each target of `./tandem build freebsd` in turn into an empty cache (`make -j{jobs}`), "
        "then the native kernel again after a one-line change to tandem's planted-bug source.",
        "",
        "| target | what | wall (s) |",
        "|---|---|---|",
        *[f"| `{t}` | {WHAT[t]} | {s:.0f} |" for t, s in times.items()],
        f"| all | from the archive to a bootable FreeBSD guest and its three kernels | {total:.0f} |",
        f"| `kernel-freebsd-native` again | `tandem_bugs.c` changed: that file compiled, the kernel linked | {again:.0f} |",
        "",
        "Each target alone; `./tandem build freebsd` runs two at a time (ninja), each with `make -j` of the "
        "host's cores.",
    ]
    return publish("\n".join(lines), args.out, SECTION)


if __name__ == "__main__":
    sys.exit(main())
