#!/usr/bin/env bash
# An experiment, not part of tandem's build: how much of FreeBSD's world it takes to
# get /rescue (a crunched sh, init, ifconfig, dhclient, route, mount, ...), built on Debian 12.
#
#   scripts/freebsd-world-rescue-experiment.sh [--freebsd-src DIR]
#
# The shared tree lacks two things a world build needs, so this works on a copy of it
# (hard links, $cache/src-world) with:
#   - lib/Makefile without libsqlite3 (contrib/sqlite3/sqlite3.c is not in the tree), and
#     lib/Makefile and Makefile.inc1 (_prebuild_libs) without libc++ and libc++experimental
#     (FreeBSD's list of libc++ headers does not match Debian's LLVM 19.1.7 libcxx), and
#     lib/Makefile without libdevdctl and libutil++ (C++, built even WITHOUT_CXX: no libc++ here);
#   - contrib/llvm-project/{compiler-rt,libunwind} (libcompiler_rt, libgcc_eh, libgcc_s) taken
#     from Debian's llvm-toolchain-19 19.1.7 source (apt-get source: the same LLVM release as
#     FreeBSD's own, llvmorg-19.1.7).
# Stages: `toolchain` (bootstrap and cross tools, includes, libraries), then only rescue
# (SUBDIR_OVERRIDE=rescue skips the bootstrap tools, and on Linux fails without them).
set -euo pipefail
src=${TANDEM_FREEBSD_SRC:-}
if [ "${1:-}" = --freebsd-src ]; then src=$2; shift 2; fi
[ -n "$src" ] && [ -f "$src/tools/build/make.py" ] || { echo "need --freebsd-src DIR or TANDEM_FREEBSD_SRC" >&2; exit 2; }
src=$(cd "$src" && pwd)
cache=${TANDEM_FREEBSD_CACHE:-$HOME/.cache/tandem/freebsd}
world=$cache/src-world
if [ ! -d "$world" ]; then
  cp -al "$src" "$world"
  # sed -i writes a new file: the shared tree's copy (a hard link) is left as it was
  sed -i '/^\tlibsqlite3 \\$/d; /^\tlibc++ \\$/d; /^\tlibc++experimental \\$/d; /^\tlibdevdctl \\$/d; /^\tlibutil++ \\$/d' "$world/lib/Makefile"
  sed -i '/^\t\tlib\/libc++ \\$/d' "$world/Makefile.inc1"
fi
if [ ! -e "$world/contrib/llvm-project/compiler-rt" ]; then
  mkdir -p "$cache/llvm-src"
  (cd "$cache/llvm-src" && apt-get source --download-only llvm-toolchain-19 || true)   # the .debian.tar.xz may 404: only the orig is used
  tar -C "$cache/llvm-src" -xJf "$cache"/llvm-src/llvm-toolchain-19_19.1.7.orig.tar.xz \
    llvm-toolchain-19_19.1.7/compiler-rt llvm-toolchain-19_19.1.7/libunwind
  mkdir -p "$world/contrib/llvm-project"
  for d in compiler-rt libunwind; do ln -sfn "$cache/llvm-src/llvm-toolchain-19_19.1.7/$d" "$world/contrib/llvm-project/$d"; done
fi
export MAKEOBJDIRPREFIX=$cache/obj-world
mkdir -p "$MAKEOBJDIRPREFIX"
knobs=(-DWITHOUT_CLANG -DWITHOUT_LLD -DWITHOUT_LLDB -DWITHOUT_LLVM_BINUTILS -DWITHOUT_CLANG_BOOTSTRAP -DWITHOUT_LLD_BOOTSTRAP
  -DWITHOUT_KERBEROS -DWITHOUT_TESTS -DWITHOUT_SOUND -DWITHOUT_LOCALES -DWITHOUT_LIB32 -DWITHOUT_ZFS
  -DWITHOUT_OFED -DWITHOUT_CXX -DWITHOUT_LIBCPLUSPLUS -DWITHOUT_OPENMP -DWITHOUT_DEBUG_FILES -DWITHOUT_MAN -DWITHOUT_NLS -DWITHOUT_PROFILE
  -DWITHOUT_BLUETOOTH -DWITHOUT_BSNMP -DWITHOUT_LDNS -DWITHOUT_UNBOUND -DWITHOUT_NTP -DWITHOUT_GAMES
  -DWITHOUT_BHYVE -DWITHOUT_PMC -DWITHOUT_OPENSSH -DWITHOUT_SENDMAIL -DWITHOUT_MAIL -DWITHOUT_DICT
  -DWITHOUT_SHAREDOCS -DWITHOUT_EXAMPLES -DWITHOUT_HTML -DWITHOUT_INFO -DWITHOUT_GOOGLETEST)
mk() {
  # SIGINT back to default: bmake's bootstrap tests send it (see build-freebsd.sh)
  (cd "$world" && nice -n19 python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
     python3 tools/build/make.py --cross-bindir=/usr/lib/llvm-19/bin TARGET=amd64 TARGET_ARCH=amd64 -j2 "${knobs[@]}" "$@")
}
echo "== start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
mk -DWITHOUT_CLEAN toolchain   # WITHOUT_CLEAN: a rerun keeps what was built
echo "== toolchain (bootstrap, includes, libraries) done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
mk -DWORLDFAST -DNO_LIBS SUBDIR_OVERRIDE=rescue buildworld
echo "== rescue done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"

# A root for it: /rescue/rescue with the names it answers to, /sbin/init and /bin/sh among
# them, and guest-kernel/freebsd/rescue/rc as /etc/rc. Boot: ROOT_IMG=$cache/work/rescue-root.img
# scripts/run-freebsd.sh TANDEM-NATIVE -netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=
here=$(cd "$(dirname "$0")/.." && pwd)
rescue=$(find "$MAKEOBJDIRPREFIX" -path '*/rescue/rescue/rescue' -type f -print -quit)
legacy=$(find "$cache/obj" -path '*/tmp/legacy/bin/makefs' -print -quit | xargs -r dirname)
r=$cache/work/rescue-root
rm -rf "$r"; mkdir -p "$r/rescue" "$r/sbin" "$r/bin" "$r/etc" "$r/dev" "$r/tmp" "$r/var/run" "$r/var/db"
cp "$rescue" "$r/rescue/rescue"
for n in sh init ifconfig route ping reboot echo ls mount dhclient sysctl dmesg kenv ps; do
  ln "$r/rescue/rescue" "$r/rescue/$n"
done
ln "$r/rescue/rescue" "$r/sbin/init"
ln "$r/rescue/rescue" "$r/bin/sh"
install -m 755 "$here/guest-kernel/freebsd/rescue/rc" "$r/etc/rc"
"$legacy/makefs" -t ffs -o version=2 -s 32m "$cache/work/rescue-root.img" "$r"
