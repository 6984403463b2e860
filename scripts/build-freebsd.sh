#!/usr/bin/env bash
# Build a FreeBSD kernel (and the boot pieces) from a FreeBSD source tree on Debian 12.
# Not yet one of tandem's meson targets. The tree comes from --freebsd-src DIR or TANDEM_FREEBSD_SRC;
# everything is written under ${TANDEM_FREEBSD_CACHE:-~/.cache/tandem/freebsd}/.
#
#   scripts/build-freebsd.sh [--freebsd-src DIR] toolchain|kernel|rootfs|all [KERNCONF]
#
#   toolchain  kernel-toolchain (bmake, the bootstrap tools incl. makefs/mkimg); Debian's clang
#   kernel     buildkernel NO_MODULES=yes of guest-kernel/freebsd/KERNCONF (default TANDEM-NATIVE)
#   rootfs     the demo guest: its libc-less /sbin/init, kvd on port 7000 (guest-kernel/freebsd/init/kvd-init.c), on an 8 MiB UFS2
#              image made by the bootstrap makefs: $cache/work/root.img
#
# Needs (Debian 12): clang-19 lld-19 llvm-19 (make.py --cross-bindir=/usr/lib/llvm-19/bin),
# libarchive-dev libbz2-dev (the bootstrap tools), python3, a host cc and make.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${TANDEM_FREEBSD_SRC:-}
if [ "${1:-}" = --freebsd-src ]; then src=$2; shift 2; fi
[ -n "$src" ] && [ -f "$src/tools/build/make.py" ] || { echo "need --freebsd-src DIR or TANDEM_FREEBSD_SRC (a FreeBSD source tree)" >&2; exit 2; }
src=$(cd "$src" && pwd); export TANDEM_FREEBSD_SRC=$src
cache=${TANDEM_FREEBSD_CACHE:-$HOME/.cache/tandem/freebsd}
obj=$cache/obj
conf=${2:-TANDEM-NATIVE}
jobs=${JOBS:-2}
mkdir -p "$obj" "$cache/logs"
export MAKEOBJDIRPREFIX=$obj
knobs=(-DWITHOUT_CLANG -DWITHOUT_LLD -DWITHOUT_LLDB -DWITHOUT_LLVM_BINUTILS
       -DWITHOUT_CLANG_BOOTSTRAP -DWITHOUT_LLD_BOOTSTRAP -DWITH_DISK_IMAGE_TOOLS_BOOTSTRAP)
mk() {
  # bmake's bootstrap runs its unit tests, two of which send SIGINT: a job started in the
  # background inherits SIGINT ignored, so they fail; put it back to default first.
  (cd "$src" && nice -n10 python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
     python3 tools/build/make.py --cross-bindir=/usr/lib/llvm-19/bin \
     TARGET=amd64 TARGET_ARCH=amd64 -j"$jobs" "${knobs[@]}" "$@")
}
# step CMD...: run it, with its wall time and the machine's load before and after
step() { local t0=$SECONDS; echo "== $* start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; "$@"; echo "== done in $((SECONDS-t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg)"; }
case ${1:-all} in
  toolchain) step mk kernel-toolchain ;;
  kernel)
    # our configs live in guest-kernel/freebsd/; the build wants them in sys/amd64/conf,
    # so it is given their directory through KERNCONFDIR.
    step mk buildkernel NO_MODULES=yes KERNCONF="$conf" KERNCONFDIR="$here/guest-kernel/freebsd" ;;
  rootfs)
    legacy=$(find "$obj" -path '*/tmp/legacy/bin/makefs' -print -quit | xargs -r dirname)
    [ -x "$legacy/makefs" ] || { echo "no makefs: run '$0 toolchain' first" >&2; exit 1; }
    w=$cache/work; rm -rf "$w/root"; mkdir -p "$w/root/sbin" "$w/root/dev"
    clang-19 --target=x86_64-unknown-freebsd14.0 -O2 -Wall -Werror -nostdlib -static -ffreestanding \
      -fno-stack-protector -fuse-ld=lld -o "$w/root/sbin/init" "$here/guest-kernel/freebsd/init/kvd-init.c"
    "$legacy/makefs" -t ffs -o version=2 -s 8m "$w/root.img" "$w/root" ;;
  all) "$0" toolchain && "$0" kernel "$conf" && "$0" rootfs ;;
  *) echo "usage: $0 [--freebsd-src DIR] toolchain|kernel|rootfs|all [KERNCONF]" >&2; exit 2 ;;
esac
