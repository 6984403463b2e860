"""`tandem doctor`: what a user runs when something is off.

One line a check: "ok", "warn" (works, but not as well as it could) or "FAIL", what
was found, and for anything not ok the fix (the package to install, the command to
run). Exit 1 if a check failed. Standard library only and no install or build first:
the launcher runs this on Debian's python3, because a broken venv or build is what it
is there to diagnose. `--preflight` runs the cheap checks the launcher makes before a
long build, prints only what fails, and exits 1 on the first.

The checks: the host (Debian 12, root for the guest image build), Debian packages
(scripts/host-deps.sh's list), the programs tandem calls (programs.PROGRAMS), free disk
in the cache, the venv, each build in the cache against the key its sources give now,
the setup lock, and /dev/kvm: present, usable, and able to boot a guest kernel
(a paravirtual KVM that runs QEMU but hangs in a stock kernel's early boot exists).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import REPO, build_dir, cache_dir
from ..catalog import DEFAULT_KERNEL
from ..errors import EXIT_CLEAN, EXIT_FOUND
from . import lock, programs, state
from .state import FREEBSD_TARGETS, KEYED, UNKEYED, current_key, gone

# Room for a test run's recordings, overlays and logs beside the builds, whatever is built
# (docs/setup.md, "Disk").
WARM_BYTES = 1 << 30
KVM_BOOT_TIMEOUT = 20.0   # seconds; a KVM boot to the root-mount panic takes under 2
@dataclass
class Check:
    status: str     # ok, warn, FAIL
    name: str
    found: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<5} {self.name}: {self.found}" + (f"; fix: {self.fix}" if self.fix else "")


def host_packages(groups: bool = False) -> list[str]:
    """scripts/host-deps.sh's packages (groups: with those only the developer scripts, the
    tests and FreeBSD guests need, which a Linux user's commands never call)."""
    out = subprocess.run(["bash", str(REPO / "scripts/host-deps.sh"), "--list", *(["--dev", "--test", "--freebsd"] if groups else [])],
                         capture_output=True, text=True, check=True).stdout
    return [p.split("/")[0] for p in out.split()]


def check_host() -> list[Check]:
    checks = []
    try:
        rel = dict(l.split("=", 1) for l in Path("/etc/os-release").read_text().splitlines() if "=" in l)
    except FileNotFoundError:
        rel = {}
    name = rel.get("PRETTY_NAME", "unknown").strip('"')
    if rel.get("ID") == "debian" and rel.get("VERSION_ID", "").strip('"') == "12":
        checks.append(Check("ok", "host", name))
    else:
        checks.append(Check("warn", "host", f"{name}, not Debian 12",
                            "tandem is built and tested on Debian 12 (bookworm); package names may differ"))
    if os.geteuid() == 0:
        checks.append(Check("ok", "root", "running as root"))
    else:
        checks.append(Check("FAIL", "root", "not root: the guest image build needs root (mknod, chroot) and "
                            "the private libvirtd runs QEMU as root", "run ./tandem as root"))
    return checks


def check_packages() -> Check:
    pkgs = host_packages()
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *pkgs], capture_output=True, text=True)
    have = {l.split()[0] for l in r.stdout.splitlines() if l.endswith("install ok installed")}
    missing = [p for p in pkgs if p not in have]
    if missing:
        return Check("FAIL", "packages", f"{len(missing)} of {len(pkgs)} missing: {' '.join(missing)}",
                     "scripts/host-deps.sh (or: apt-get install " + " ".join(missing) + ")")
    return Check("ok", "packages", f"all {len(pkgs)} of scripts/host-deps.sh installed")


def check_programs() -> Check:
    grouped = set(host_packages(groups=True)) - set(host_packages())
    missing = [p for p in programs.PROGRAMS.values()
               if p.package != programs.VENV and p.package not in grouped and not p.optional
               and not programs.which(p.name)]
    if missing:
        return Check("FAIL", "programs", "not found: " + ", ".join(f"{p.name} ({p.package})" for p in missing),
                     "apt-get install " + " ".join(sorted({p.package for p in missing})))
    optional = [p.name for p in programs.PROGRAMS.values() if p.optional and not programs.which(p.name)]
    note = f" (optional, absent: {', '.join(optional)})" if optional else ""
    return Check("ok", "programs", f"every program tandem calls is on PATH{note}")


def check_disk(targets: list[str] | None = None) -> Check:
    """Free disk under the cache against what building these targets adds to it and a test
    run's recordings (the launcher's preflight passes none: the build itself checks its
    targets' room once it knows which are not cached, setup/build.room)."""
    probe = state.disk_of(cache_dir())
    free = shutil.disk_usage(probe).free
    grow, todo = state.growth(targets) if targets else (0, [])
    need = grow + WARM_BYTES
    what = f"building {len(todo)} target{'s' * (len(todo) != 1)} and recordings" if todo else "recordings"
    if free < need:
        return Check("FAIL", "disk", f"{free / 2**30:.1f} GiB free under {probe}, {what} need "
                     f"{need / 2**30:.1f} GiB", "free space there, or set TANDEM_CACHE to a larger disk")
    return Check("ok", "disk", f"{free / 2**30:.1f} GiB free under {probe} ({what} need {need / 2**30:.1f} GiB)")


def check_venv() -> Check:
    key = hashlib.sha256((REPO / "replay/requirements.txt").read_bytes()).hexdigest()[:16]
    venv = cache_dir() / f"venv-{key}"
    if (venv / ".complete").is_file():
        return Check("ok", "venv", str(venv))
    if venv.exists():
        return Check("FAIL", "venv", f"{venv} half-made (a command was stopped while creating it)",
                     "./tandem setup (makes it again)")
    return Check("warn", "venv", f"{venv} not created yet", "./tandem setup")


def check_builds() -> list[Check]:
    checks = []
    freebsd = [t for t in FREEBSD_TARGETS if (build_dir() / f"{t}.json").is_file()]
    if not freebsd:
        checks.append(Check("ok", "freebsd", "none built (FreeBSD guests only: ./tandem build freebsd "
                                             "--freebsd-src PATH)"))
    for target in [*KEYED, *UNKEYED]:
        path = build_dir() / f"{target}.json"
        build = "./tandem build freebsd" if target in FREEBSD_TARGETS else "./tandem build"
        if target in FREEBSD_TARGETS and target not in freebsd:
            continue
        try:
            built = json.loads(path.read_text())
        except FileNotFoundError:
            checks.append(Check("warn", target, "not built", build))
            continue
        except json.JSONDecodeError:
            checks.append(Check("FAIL", target, f"{path} unreadable", f"rm {path}; ./tandem build"))
            continue
        lost = gone(built)
        now = current_key(target) if target in KEYED else built.get("key")
        if lost:
            checks.append(Check("FAIL", target, f"{lost} is gone from the cache", build))
        elif target in FREEBSD_TARGETS and not os.environ.get("TANDEM_FREEBSD_SRC"):
            checks.append(Check("ok", target, f"key {built.get('key')}, built from {built.get('tree')} "
                                "(no TANDEM_FREEBSD_SRC to check it against)"))
        elif now is None:
            checks.append(Check("warn", target, f"built with key {built.get('key')}; its current key "
                                "cannot be computed (sources not downloaded yet?)", "./tandem build"))
        elif now != built.get("key"):
            checks.append(Check("warn", target, f"built with key {built.get('key')}, its sources now give "
                                f"{now}: stale", build))
        else:
            checks.append(Check("ok", target, f"key {now}, up to date" if target in KEYED else
                                f"key {now}, built (its inputs' keys are checked above)"))
    return checks


def check_lock() -> Check:
    who = lock.owner()
    if lock.held():
        return Check("ok", "lock", f"held by {who or 'a tandem command'}: other commands wait for it")
    if who:
        return Check("warn", "lock", f"{who} was stopped before it finished",
                     "nothing to do: the next ./tandem command redoes what it left half-made")
    return Check("ok", "lock", "free")


def check_kvm(boot: bool = True) -> Check:
    dev = Path("/dev/kvm")
    if not dev.exists():
        return Check("warn", "kvm", "/dev/kvm absent: VMs run under TCG (slower, same recordings; --mode device "
                     "records on multi-threaded TCG)",
                     "load kvm_intel or kvm_amd, or enable nested virtualization")
    if not os.access(dev, os.R_OK | os.W_OK):
        return Check("warn", "kvm", "/dev/kvm not usable by this user: VMs run under TCG", "add the user to group kvm")
    if not boot:
        return Check("ok", "kvm", "/dev/kvm present")
    try:
        qemu = json.loads((build_dir() / "qemu.json").read_text())
        # the demo guest's kernel (Debian's, which the demo builds first), else tandem's own
        kernel = next(json.loads(p.read_text()) for p in (build_dir() / f"kernel-{f}.json"
                                                            for f in (DEFAULT_KERNEL, "native")) if p.is_file())
    except (FileNotFoundError, StopIteration, json.JSONDecodeError):
        return Check("warn", "kvm", "/dev/kvm present; whether it boots a stock guest is checked once QEMU "
                     "and a guest kernel are built", "./tandem build, then ./tandem doctor")
    return _kvm_boot(qemu, kernel)


def _kvm_boot(qemu: dict, kernel: dict) -> Check:
    """Boot a guest kernel under KVM with no root filesystem: it gets as far as the panic
    for the missing root, or it does not boot here."""
    argv = [qemu["binary"], "-accel", "kvm", "-M", "pc", "-cpu", "host", "-m", "256", "-nodefaults", "-no-user-config",
            "-display", "none", "-serial", "stdio", "-no-reboot", "-L", qemu["firmware_dir"],
            "-kernel", kernel["bzImage"], "-append", "console=ttyS0 panic=-1 root=/dev/null"]
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, timeout=KVM_BOOT_TIMEOUT, stdin=subprocess.DEVNULL)
        out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
    booted = "VFS: Unable to mount root" in out or "Kernel panic" in out
    if booted:
        return Check("ok", "kvm", f"/dev/kvm boots the {kernel['flavor']} kernel ({time.monotonic() - t0:.1f} s to its "
                     "root-mount panic): record --mode device --accel kvm runs the native at native speed")
    last = next((l for l in reversed(out.strip().splitlines()) if l.strip()), "no console output")
    return Check("warn", "kvm", f"/dev/kvm cannot boot a stock guest (last: {last[:100]!r}): "
                 "VMs run under TCG (--mode device: multi-threaded TCG, not --accel kvm)",
                 "use a host with hardware KVM for speed; recordings do not change")


def run_all(boot_kvm: bool = True) -> list[Check]:
    wanted = [t for t in KEYED if t not in FREEBSD_TARGETS or os.environ.get("TANDEM_FREEBSD_SRC")]
    return [*check_host(), check_packages(), check_programs(), check_disk(wanted), check_venv(),
            *check_builds(), check_lock(), check_kvm(boot_kvm)]


def preflight() -> list[Check]:
    """What the launcher checks before building: cheap, and fatal if it fails."""
    return [c for c in (*check_host(), check_programs(), check_disk()) if c.status == "FAIL"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tandem doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--preflight", action="store_true", help="only the launcher's cheap checks before a build")
    p.add_argument("--no-kvm-boot", action="store_true", help="do not boot a guest to check /dev/kvm")
    args = p.parse_args(argv)
    if args.preflight:
        for c in preflight()[:1]:
            print(f"tandem: error: {c.name}: {c.found}; fix: {c.fix}", file=sys.stderr)
            return EXIT_FOUND
        return EXIT_CLEAN
    failed = False
    for c in run_all(not args.no_kvm_boot):
        print(c.line(), flush=True)
        failed |= c.status == "FAIL"
    return EXIT_FOUND if failed else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
