"""Files of a user's VM swapped for an analysis (tandem replay --overlay NAME=DIR): an
ASan build of one service, a changed configuration, a file served differently.

DIR holds a tree laid out as the guest's root (DIR/usr/bin/redis-server replaces
/usr/bin/redis-server; a path the guest lacks is created). Before the analysis boots, a
preparation boot writes the tree into the analysis's own overlays of the guest's disks:
the analysis kernel boots a small initramfs (a static busybox, this tree and an /init)
that mounts the guest's root read-write, copies each file in from inside a chroot of that
root (so the guest's own symlinks, /lib -> usr/lib and absolute ones alike, resolve as the
guest resolves them), syncs and powers off. The analysis then boots those overlays as its
disks: the same boot as without the files, with only them changed. Nothing of tandem stays
on the disk (busybox and the tree sit in a tmpfs over the root's /dev while it runs).

Why a boot and not a host tool: a user's root may be any file system its kernel mounts,
in a qcow2 or a raw image, and the host needs neither root, loop devices nor FUSE. What
it costs: one kernel boot to a shell, a few seconds under TCG for tandem's kernels
(measured in tests/test_analyse_any_guest.py's overlay run), and a root that has been
mounted once more than the native's (its mount count and journal state differ; a guest
that runs fsck at boot sees a clean file system either way).

Files are copied as root:root with their modes: what a service needs of its owner is
set by its unit (User=), not by the file.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from .. import private
from ..errors import TandemError
from ..machine import Disk, Guest, Run
from ..qemu.argv import overlay_path
from ..qemu.image import make_overlays
from ..qemu.vm import VM
from ..setup import programs

log = logging.getLogger(__name__)

# The tree goes into the preparation VM's memory (the initramfs): at most this part of it.
MAX_SHARE_OF_MEMORY = 0.5
PREPARE_TIMEOUT_S = 300.0       # a KASAN kernel boots to its initramfs in 5-15 s under TCG
DONE = re.compile(rb"tandem-overlay: done (\d+)")
FAILED = re.compile(rb"tandem-overlay: error: ([^\r\n]*)")

# /init of the preparation initramfs (busybox sh). The root device comes as tandem.root=;
# the copy runs chrooted into the guest's root with busybox and the tree in a tmpfs over
# its /dev (a directory every Linux root has, and the kernel's devtmpfs hides it anyway).
INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /dev /root
$B mount -t proc proc /proc
$B mount -t devtmpfs devtmpfs /dev
fail() { echo "tandem-overlay: error: $*"; $B sync; $B poweroff -f; }
R=
for a in $($B cat /proc/cmdline); do case $a in tandem.root=*) R=${a#tandem.root=};; esac; done
i=0
while [ ! -b "$R" ] && [ $i -lt 200 ]; do $B usleep 50000; i=$((i+1)); done
[ -b "$R" ] || fail "root device $R: not found by the analysis kernel"
$B mount -o rw "$R" /root || fail "root device $R: the analysis kernel cannot mount it read-write"
[ -d /root/dev ] || fail "root device $R: no /dev directory on it (not a Linux root?)"
$B mount -t tmpfs -o mode=0755 tandem /root/dev || fail "no tmpfs in the analysis kernel"
$B cp /bin/busybox /root/dev/busybox && $B cp -a /files /root/dev/files || fail "copying the tree into memory"
$B chroot /root /dev/busybox sh -c '
  n=0
  cd /dev/files || exit 1
  for f in $(/dev/busybox find . ! -type d | /dev/busybox sed "s|^\.||"); do
    d=${f%/*}
    [ -n "$d" ] && { /dev/busybox mkdir -p "$d" || exit 1; }
    /dev/busybox rm -f "$f"
    /dev/busybox cp -a "/dev/files$f" "$f" || exit 1
    echo "tandem-overlay: wrote $f"
    n=$((n+1))
  done
  echo "tandem-overlay: copied $n"
' > /tmp.log 2>&1
rc=$?
$B cat /tmp.log
[ $rc -eq 0 ] || fail "copying into the guest's root failed: $($B tail -n 1 /tmp.log)"
n=$($B sed -n 's/^tandem-overlay: copied //p' /tmp.log)
$B umount /root/dev
$B sync
$B umount /root || $B mount -o remount,ro /root
$B sync
echo "tandem-overlay: done $n"
$B poweroff -f
"""


def check_tree(directory: str, what: str = "--overlay") -> tuple[int, int]:
    """(files, bytes) of the tree under directory, or a one-line error naming the culprit:
    not a directory, empty, a file that is no regular file, directory or symlink (a
    device, a socket, a FIFO), a name with a newline or space (the guest's shell copies
    by name), one that cannot be read."""
    root = Path(directory)
    if not root.is_dir():
        raise TandemError(f"{what} {directory}: {'not found' if not root.exists() else 'not a directory'}")
    files = size = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(c in str(rel) for c in " \t\n\r"):
            raise TandemError(f"{what} {path}: a name with white space (not taken: the copy goes by name)")
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            continue
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise TandemError(f"{what} {path}: not a regular file, directory or symlink")
        if stat.S_ISREG(st.st_mode) and not os.access(path, os.R_OK):
            raise TandemError(f"{what} {path}: cannot be read")
        files, size = files + 1, size + (st.st_size if stat.S_ISREG(st.st_mode) else 0)
    if not files:
        raise TandemError(f"{what} {directory}: no files in it (lay them out as the guest's root: "
                          "DIR/usr/bin/NAME replaces /usr/bin/NAME)")
    return files, size


def initramfs(trees: list[str], out: Path) -> None:
    """The preparation initramfs: busybox, /init and the trees under /files, a later
    tree's file over an earlier's (newc cpio, everything owned by root)."""
    busybox, cpio = programs.require("busybox"), programs.require("cpio")
    with tempfile.TemporaryDirectory(prefix="tandem-overlay-") as tmp:
        stage = Path(tmp)
        (stage / "bin").mkdir()
        shutil.copy(busybox, stage / "bin" / "busybox")
        (stage / "init").write_text(INIT)
        (stage / "init").chmod(0o755)
        for tree in trees:
            shutil.copytree(tree, stage / "files", symlinks=True, dirs_exist_ok=True)
        names = subprocess.run(["find", "."], cwd=stage, capture_output=True, check=True).stdout
        with open(out, "wb", opener=private.opener) as f:
            r = subprocess.run([cpio, "-o", "-H", "newc", "-R", "0:0", "--quiet"], cwd=stage, input=names,
                               stdout=f, stderr=subprocess.PIPE)
        if r.returncode:
            raise TandemError(f"{out}: cpio failed: {r.stderr.decode(errors='replace').strip()}")


def prepare(guest: Guest, trees: list[str], root: str, workdir: Path, name: str) -> Guest:
    """guest with the trees copied over its root device `root` (a later tree's file over
    an earlier's): its disks become qcow2 overlays in workdir/NAME-overlay written by a
    preparation boot of its own kernel. A tree the VM cannot hold, a kernel that cannot
    mount the root, or no answer within PREPARE_TIMEOUT_S: a one-line error naming the
    analysis."""
    counted = [check_tree(tree, f"--overlay {name}:") for tree in trees]
    files = len({p.relative_to(tree) for tree in trees for p in Path(tree).rglob("*")
                 if p.is_symlink() or not p.is_dir()})     # as the guest's `find ! -type d` counts
    size = sum(n for _, n in counted)
    if size > guest.memory_mb * (1 << 20) * MAX_SHARE_OF_MEMORY:
        raise TandemError(f"--overlay {name}: {size >> 20} MiB of files; the preparation VM holds them in memory "
                          f"and has {guest.memory_mb} MiB (give --memory when recording, or fewer files)")
    if guest.kernel is None:
        raise TandemError(f"--overlay {name}: the analysis boots its disk's bootloader; an overlay needs a kernel "
                          "tandem boots directly")
    here = workdir / f"{name}-overlay"
    private.make_dir(here)
    first = here / "disk.qcow2"
    for disk in guest.disks:
        overlay_path(first, disk.id).unlink(missing_ok=True)
    make_overlays(guest, first)
    cpio = here / "overlay.cpio"
    initramfs(trees, cpio)
    prep = dataclasses.replace(guest, initrd=str(cpio), cmdline=f"console=ttyS0 panic=-1 rdinit=/init tandem.root={root}")
    log.info("%s: writing %d files (%d bytes) of %s into its disk overlays", name, files, size, ", ".join(trees))
    # QMP and console sockets in a short temp path: a unix socket's path is at most 108 bytes
    rundir = Path(tempfile.mkdtemp(prefix="tandem-ovl-"))
    try:
        console = _prepare_boot(prep, rundir, first, name, here)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    _keep(here / "console.log", console)
    done = DONE.search(console)
    if done is None or int(done.group(1)) != files:
        raise TandemError(f"--overlay {name}: {done.group(1).decode() if done else 'no'} of {files} files written "
                          f"(console: {here / 'console.log'})")
    disks = tuple(Disk(str(overlay_path(first, d.id)), "qcow2", id=d.id) for d in guest.disks)
    return dataclasses.replace(guest, disks=disks)


def _prepare_boot(prep: Guest, rundir: Path, first: Path, name: str, here: Path) -> bytes:
    """Boot the preparation VM; its console once it has said it is done (a one-line
    error with what it said instead, if it did not)."""
    # -icount: the boot's clock counts instructions, as every analysis VM's does, so the
    # kernel's early timer and IO-APIC setup do not see the host's load (the KASAN kernel
    # oopsed there on a loaded host).
    with VM(prep, Run(rundir, overlay=first, icount=True), name=f"{name} overlay") as vm:
        assert vm.serial is not None        # a plain run has its console on a socket
        try:
            end = vm.serial.wait_for(b"tandem-overlay: done", PREPARE_TIMEOUT_S)
            vm.serial.wait_for(b"\n", 30, start=end)      # the count, which comes after
        except TandemError:
            console = vm.serial.output()
            failed = FAILED.search(console)
            _keep(here / "console.log", console)
            why = failed.group(1).decode("utf-8", "replace") if failed else \
                f"no answer within {PREPARE_TIMEOUT_S:.0f}s (console: {here / 'console.log'})"
            raise TandemError(f"--overlay {name}: {why}") from None
        console = vm.serial.output()
        vm.wait(60)                 # it powers off after that line
    return console


def _keep(path: Path, console: bytes) -> None:
    with open(path, "wb", opener=private.opener) as f:
        f.write(console)
