#!/usr/bin/env bash
# Build what a FreeBSD guest runs, from a FreeBSD source tree, into tandem's content-addressed
# cache; one meson target a call (meson.build, group "freebsd" of tandem/setup/build.py).
#
#   scripts/build-freebsd.sh TARGET OUT_JSON
#   TANDEM_KEY_ONLY=1 scripts/build-freebsd.sh TARGET x      # print the key, build nothing
#
# Exit status 1: the build failed; 3: the user's config (kernel-freebsd-config) is no config or does not build.
#
#   freebsd-toolchain     make.py kernel-toolchain with Debian's LLVM 19 (bmake, the bootstrap
#                         tools, makefs); ~3.5 min on 2 cores
#   kernel-freebsd-FLAVOR buildkernel of guest-kernel/freebsd/TANDEM-FLAVOR (native, debug:
#                         INVARIANTS + WITNESS, kasan: debug + KASAN) and, of the modules, only
#                         tandem's KLDs (the planted bugs) built against it; ~1.5 min each
#   freebsd-guest         the demo guest's root: a libc-less /sbin/init serving kvd on port 7000
#                         (guest-kernel/freebsd/init/kvd-init.c) and each kernel-freebsd-FLAVOR's
#                         KLDs in /boot/kernel.TANDEM-FLAVOR/, on a UFS2 image (makefs)
#   freebsd-boot          FreeBSD's BIOS boot blocks and loader (stand/: pmbr, gptboot, the loader
#                         with its simple interpreter), in an object tree of their own; ~1 min
#                         after its own kernel-toolchain
#   freebsd-disk          the demo guest on a GPT disk that FreeBSD's loader boots (pmbr, gptboot,
#                         a UFS root with freebsd-guest's files, the native kernel in /boot/kernel)
#   kernel-freebsd-config a kernel config of the user's, TANDEM_FREEBSD_KERNCONF=FILE: buildkernel of
#                         it and tandem's KLDs, its includes found beside it, in the tree's
#                         sys/amd64/conf (GENERIC) and among tandem's (TANDEM-NATIVE: what a
#                         tandem VM needs)
#
# The tree: TANDEM_FREEBSD_SRC, a checkout (FreeBSD's git, 14.x or 15.x) or a release's source
# archive (src.txz, .tar.xz, .tar.zst, .tar.gz: unpacked once into the cache, keyed by its
# hash). A checkout's key is its files' names, sizes and times (1 s for 80,000 files).
# Everything lands in ${TANDEM_CACHE:-~/.cache/tandem}/freebsd/NAME-KEY, published by an
# atomic rename; KEY = sha256 of what it is built from and this script, [:16].
# Needs (Debian 12): scripts/host-deps.sh --freebsd (clang-19 lld-19 llvm-19 libarchive-dev
# libbz2-dev zstd time); it is run when one of its programs is missing. A tree without LLVM's
# source also needs Debian's llvm-toolchain-19 source package (freebsd-boot: compiler_rt).
set -euo pipefail
# One function, parsed whole before it runs: editing this file cannot corrupt a build.
main() {
die() { echo "tandem: error: $*" >&2; exit "${DIE_STATUS:-1}"; }
log() { echo "tandem: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
[ $# -eq 2 ] || die "usage: $0 freebsd-toolchain|kernel-freebsd-FLAVOR|kernel-freebsd-config|freebsd-guest|freebsd-boot|freebsd-disk OUT_JSON"
TARGET=$1 OUT_JSON=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CONFDIR="$ROOT/guest-kernel/freebsd"
FB="${TANDEM_CACHE:-$HOME/.cache/tandem}/freebsd"
JOBS=${JOBS:-$(nproc)}
conf_of() { echo "TANDEM-$(echo "$1" | tr a-z A-Z)"; }    # a flavor's config: debug -> TANDEM-DEBUG
case $TARGET in
  freebsd-toolchain|freebsd-guest|freebsd-boot|freebsd-disk) ;;
  kernel-freebsd-config)
    USERCONF=${TANDEM_FREEBSD_KERNCONF:-}
    [ -n "$USERCONF" ] || { [ -z "${TANDEM_KEY_ONLY:-}" ] || exit 0; die "$TARGET: set TANDEM_FREEBSD_KERNCONF to your kernel config"; }
    [ -f "$USERCONF" ] || DIE_STATUS=3 die "FreeBSD kernel config $USERCONF: no such file"
    USERCONF=$(cd "$(dirname "$USERCONF")" && pwd)/$(basename "$USERCONF")
    KERNCONF=$(basename "$USERCONF")
    case $KERNCONF in
      TANDEM-*) DIE_STATUS=3 die "FreeBSD kernel config $USERCONF: name it otherwise (TANDEM-* are tandem's own configs)" ;;
      *[!A-Za-z0-9_.-]*|.*) DIE_STATUS=3 die "FreeBSD kernel config $USERCONF: a config's name is letters, digits, '_', '.' and '-' (make's KERNCONF)" ;;
    esac ;;
  kernel-freebsd-*) FLAVOR=${TARGET#kernel-freebsd-}
    KERNCONF=$(conf_of "$FLAVOR")
    case $FLAVOR in *[!a-z0-9]*|"") die "bad flavor '$FLAVOR'";; esac
    [ -f "$CONFDIR/$KERNCONF" ] || die "unknown FreeBSD flavor '$FLAVOR' (no guest-kernel/freebsd/$KERNCONF)" ;;
  *) die "unknown target '$TARGET' (freebsd-toolchain, kernel-freebsd-FLAVOR, freebsd-guest, freebsd-boot, freebsd-disk)" ;;
esac
sha() { sha256sum "$@" | cut -d' ' -f1; }
key() { { printf '%s\n' "$@"; sha "$SELF"; } | sha256sum | cut -c1-16; }
conf_chain() {    # a kernel config and the configs it includes (guest-kernel/freebsd/)
  echo "$1"
  local i; for i in $(awk '$1 == "include" { print $2 }' "$CONFDIR/$1"); do conf_chain "$i"; done
}
user_chain() {    # a user's config and the files beside it that it includes, each once (a cycle is config(8)'s to say)
  local dir i seen=" "; dir=$(dirname "$1")
  set -- "$1"
  while [ $# -gt 0 ]; do
    case $seen in *" $1 "*) shift; continue ;; esac
    seen="$seen$1 "; echo "$1"
    for i in $(awk '$1 == "include" { gsub(/"/, "", $2); print $2 }' "$1"); do
      [ -f "$dir/$i" ] && set -- "$@" "$dir/$i"
    done
    shift
  done
}

# -- the source tree -------------------------------------------------------------------
SRC=${TANDEM_FREEBSD_SRC:-}
if [ -z "$SRC" ]; then
  [ -z "${TANDEM_KEY_ONLY:-}" ] || exit 0     # no key: the target is stale until a tree is given
  die "no FreeBSD source tree: set TANDEM_FREEBSD_SRC (or --freebsd-src) to a checkout or a release's src.txz (docs/freebsd.md)"
fi
[ -e "$SRC" ] || die "TANDEM_FREEBSD_SRC=$SRC: no such file or directory"
mkdir -p "$FB"
# What FreeBSD builds take from Debian (scripts/host-deps.sh --freebsd: LLVM 19, zstd for a
# .tar.zst tree, GNU time), installed before the tree is unpacked
host_tools() { local p; for p in clang-19 ld.lld-19 zstd /usr/bin/time; do command -v "$p" >/dev/null || return 1; done; }
if [ -z "${TANDEM_KEY_ONLY:-}" ] && ! host_tools; then
  exec 5>"$FB/.lock-host-deps"; flock 5      # one apt at a time: targets build two at once
  if ! host_tools; then
    log "installing what FreeBSD builds need: Debian's LLVM 19, zstd, time (scripts/host-deps.sh --freebsd)"
    bash "$HERE/host-deps.sh" --freebsd >&2 || die "scripts/host-deps.sh --freebsd failed"
  fi
  exec 5>&-
fi
if [ -f "$SRC" ]; then
  # A source archive: its hash (memoized by path, size and time; 155 MB hash in ~1 s) names
  # the tree unpacked from it.
  stamp=$(stat -c '%s-%Y' "$SRC")
  memo="$FB/.archive-sha256-$(printf '%s' "$(readlink -f "$SRC"):$stamp" | sha256sum | cut -c1-16)"
  if [ -s "$memo" ]; then TREE_KEY=$(cat "$memo"); else
    TREE_KEY=$(sha "$SRC"); echo "$TREE_KEY" >"$memo.$$" && mv -f "$memo.$$" "$memo"; fi
  TREE="$FB/src-${TREE_KEY:0:16}"
  [ -n "${TANDEM_KEY_ONLY:-}" ] || { exec 4>"$FB/.lock-unpack"; flock 4; }    # one unpacking at a time
  if [ -z "${TANDEM_KEY_ONLY:-}" ] && [ ! -d "$TREE" ]; then
    log "unpacking $SRC into $TREE"
    tmp="$TREE.tmp$$"; rm -rf "$tmp"; mkdir -p "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    tar -xf "$SRC" -C "$tmp" --no-same-owner || die "$SRC: not a source archive tar can read"
    top=$(find "$tmp" -mindepth 1 -maxdepth 2 -name Makefile.inc1 -printf '%h\n' -quit)
    [ -n "$top" ] || die "$SRC: no FreeBSD source tree in it (no Makefile.inc1 at its top)"
    mv "$top" "$TREE.new$$" && rm -rf "$tmp" && mv -T "$TREE.new$$" "$TREE" || die "unpacking $SRC failed"
    trap - EXIT
  fi
  [ -n "${TANDEM_KEY_ONLY:-}" ] || exec 4>&-
elif [ -d "$SRC" ]; then
  TREE=$(cd "$SRC" && pwd)
  TREE_KEY=$(cd "$TREE" && find . -path ./.git -prune -o -type f -printf '%P %s %T@\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1)
else
  die "TANDEM_FREEBSD_SRC=$SRC: neither a directory nor an archive"
fi
if [ -z "${TANDEM_KEY_ONLY:-}" ]; then
  [ -f "$TREE/tools/build/make.py" ] && [ -f "$TREE/sys/conf/newvers.sh" ] \
    || die "$SRC: not a FreeBSD source tree (no tools/build/make.py or sys/conf/newvers.sh)"
fi
# tandem's patches (guest-kernel/freebsd/patches/, each saying why) are applied to a copy of
# the tree made of hard links (a plain copy across file systems), never to the tree itself:
# every kernel is built from that copy, so the toolchain is built once.
PATCHES=("$CONFDIR"/patches/*.patch)
[ -f "${PATCHES[0]}" ] || PATCHES=()
TREE_KEY=$(printf '%s\n' "$TREE_KEY" ${PATCHES[@]+$(sha "${PATCHES[@]}")} | sha256sum | cut -c1-16)
patched_tree() {
  local dst="$FB/tree-$TREE_KEY" tmp p f
  if [ ! -d "$dst" ]; then
    tmp="$dst.tmp$$"; rm -rf "$tmp"
    log "copying $TREE to $dst with tandem's patches (guest-kernel/freebsd/patches)"
    cp -al "$TREE" "$tmp" 2>/dev/null || { rm -rf "$tmp"; cp -a "$TREE" "$tmp"; }
    for p in ${PATCHES[@]+"${PATCHES[@]}"}; do
      for f in $(sed -n 's#^+++ b/\([^\t ]*\).*#\1#p' "$p"); do    # its own copy of each file patched (once)
        [ ! "$tmp/$f" -ef "$TREE/$f" ] || cp --remove-destination "$TREE/$f" "$tmp/$f"
      done
      patch -s -p1 -d "$tmp" <"$p" >&2 || { rm -rf "$tmp"; die "$p does not apply to $TREE"; }
    done
    mv -T "$tmp" "$dst"
  fi
  TREE=$dst
}
# tandem's own kernel sources (guest-kernel/freebsd/sys/: the planted bugs, a KLD) stay out
# of the tree: a kernel build takes them from a copy keyed by their content, through
# FreeBSD's LOCAL_MODULES (LOCAL_MODULES_DIR, the copy's modules/), which buildkernel builds
# against the kernel it has just built, as it would a port's kernel module. A change to them
# rebuilds the module (make.py keeps the kernel's objects), not the tree or the toolchain.
ADDED=$(cd "$CONFDIR/sys" && find . -type f | LC_ALL=C sort)
ADDED_KEY=$( (cd "$CONFDIR/sys" && sha256sum $ADDED; sha "$SELF") | sha256sum | cut -c1-16)
added_sources() {    # -> ADDED_DIR: the copy
  ADDED_DIR="$FB/added-$ADDED_KEY"
  [ ! -d "$ADDED_DIR" ] || return 0
  local tmp="$ADDED_DIR.tmp$$"
  # copied new (not cp -a): a copy younger than the objects, so make compiles it again
  rm -rf "$tmp"; cp -r "$CONFDIR/sys" "$tmp"
  mv -T "$tmp" "$ADDED_DIR" 2>/dev/null || rm -rf "$tmp"    # another build published it first
}
KLDS=(tandem_bugs)    # the KLDs each kernel gets (guest-kernel/freebsd/sys/modules/)

knobs=(-DWITHOUT_CLANG -DWITHOUT_LLD -DWITHOUT_LLDB -DWITHOUT_LLVM_BINUTILS
       -DWITHOUT_CLANG_BOOTSTRAP -DWITHOUT_LLD_BOOTSTRAP -DWITH_DISK_IMAGE_TOOLS_BOOTSTRAP)
# The toolchain's key is the tree's and these knobs', not this script's: an edit of the
# kernel or guest steps below does not cost a 3.5-minute toolchain build.
TC_KEY=$(printf '%s\n' "$TREE_KEY" "${knobs[*]}" "kernel-toolchain, Debian LLVM 19" | sha256sum | cut -c1-16)
kernel_key() { key "$TC_KEY" "$1" "$ADDED_KEY" $(for f in $(conf_chain "$1"); do sha "$CONFDIR/$f"; done); }
# The kernels whose KLDs the demo guest's root holds, each in /boot/kernel.IDENT/ as
# `make installkernel INSTKERNNAME=kernel.IDENT` would put them
GUEST_KERNELS=(native debug kasan)
OBJ="$FB/obj-$TC_KEY"         # MAKEOBJDIRPREFIX: the toolchain, and the kernels built with it
guest_key() { key "$TC_KEY" "$(sha "$CONFDIR/init/kvd-init.c")" guest \
                $(for f in "${GUEST_KERNELS[@]}"; do kernel_key "$(conf_of "$f")"; done); }
# The boot blocks and loader: BIOS only (no EFI), the loader's simple interpreter (Lua's
# and Forth's need their scripts in /boot and a flua), no ZFS, GELI, PXE or kboot. Built
# by buildworld of stand/ in an object tree of its own: a world build's stages rewrite the
# tree's temporary root, which the kernels' builds use at the same time.
boot_knobs=(-DWITHOUT_LOADER_LUA -DWITHOUT_FORTH -DWITHOUT_ZFS -DWITHOUT_EFI -DWITHOUT_LOADER_PXEBOOT
            -DWITHOUT_LOADER_GELI -DWITHOUT_LOADER_KBOOT)
BOOT_KEY=$(printf '%s\n' "$TC_KEY" "${boot_knobs[*]}" "stand/libsa32 stand/i386" | sha256sum | cut -c1-16)
case $TARGET in
  freebsd-toolchain) KEY=$TC_KEY ;;
  kernel-freebsd-config) KEY=$(key "$TC_KEY" "$KERNCONF" "$ADDED_KEY" $(sha "$CONFDIR"/TANDEM-*) \
                           $(for f in $(user_chain "$USERCONF"); do printf '%s:%s\n' "$(basename "$f")" "$(sha "$f")"; done)) ;;
  kernel-freebsd-*) KEY=$(kernel_key "$KERNCONF") ;;
  freebsd-guest) KEY=$(guest_key) ;;
  freebsd-boot) KEY=$BOOT_KEY ;;
  freebsd-disk) KEY=$(key "$BOOT_KEY" "$(guest_key)" disk) ;;
esac
# TANDEM_KEY_ONLY=1: print the key, the file whose presence says the build of that key is
# cached, and the directories under the cache it shares with other targets; build nothing
# (tandem doctor, setup/state.py).
if [ -n "${TANDEM_KEY_ONLY:-}" ]; then
  echo "$KEY"
  case $TARGET in
    freebsd-toolchain) echo "$OBJ/.toolchain-done"; echo "$FB/tree-$TREE_KEY"
                       case $TREE in "$FB"/src-*) echo "$TREE" ;; esac ;;
    kernel-freebsd-config) echo "$FB/kernel-config-$KERNCONF-$KEY/kernel" ;;
    kernel-freebsd-*) echo "$FB/kernel-$FLAVOR-$KEY/kernel" ;;
    freebsd-guest) echo "$FB/guest-$KEY/root.img" ;;
    freebsd-boot) echo "$FB/boot-$BOOT_KEY/loader"; echo "$FB/obj-boot-$BOOT_KEY" ;;
    freebsd-disk) echo "$FB/disk-$KEY/disk.img" ;;
  esac
  exit 0
fi

write_json() {    # KEY=VALUE or KEY[]=VALUE (a list of each)... into OUT_JSON (atomically), with key and target
  python3 - "$OUT_JSON" "target=$TARGET" "key=$KEY" "tree=$TREE" "$@" <<'PY'
import json, os, sys
out = sys.argv[1]
j = {}
for k, v in (a.split("=", 1) for a in sys.argv[2:]):
    if k.endswith("[]"):
        j.setdefault(k[:-2], []).append(v)
    else:
        j[k] = v
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
os.replace(tmp, out)
PY
}

mk() {   # make.py in the tree with Debian's LLVM, objects under $OBJ; its output to $LOG
  # bmake's bootstrap runs its unit tests, two of which send SIGINT: a job started in the
  # background inherits SIGINT ignored, so they fail; put it back to default first.
  (cd "$TREE" && MAKEOBJDIRPREFIX="$OBJ" python3 -c \
     'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
     python3 tools/build/make.py --cross-bindir=/usr/lib/llvm-19/bin \
     TARGET=amd64 TARGET_ARCH=amd64 -j"$JOBS" "${knobs[@]}" "$@") >>"$LOG" 2>&1
}
# watch NAME TOTAL PID: the progress line (compiled files) until PID ends
watch() {
  local start; start=$(date +%s)
  while kill -0 "$3" 2>/dev/null; do
    progress "$TARGET" "$start" "$(grep -c -E '^(/usr/bin/cc|/usr/bin/c\+\+|cc |c\+\+ |/usr/lib/llvm-19/bin/clang)' "$LOG" || true)" "$2" files
    sleep 2
  done
  progress_end "$TARGET"
}
run_logged() {    # CMD...: CMD in the background with its progress (of TOTAL files), failing with the log's tail
  "$@" & local pid=$!
  watch "$TARGET" "$TOTAL" "$pid"
  wait "$pid" || { tail -n 30 "$LOG" >&2; DIE_STATUS=${FAILED:+3}
                   die "${FAILED:-$TARGET: ${*:1:2} failed}${FAILED:+: $(first_error)} (log: $LOG)"; }
}
first_error() {   # the first line of $LOG that says what went wrong: config(8)'s, the compiler's or the linker's, else make's
  { grep -m1 -E '^config: |: unknown option |:[0-9]+: syntax error|: (fatal )?error: |^ld(\.lld)?(-[0-9]+)?: error: ' "$LOG" \
    || grep -m1 -E '\*\*\* Error code|^make(\[[0-9]+\])?: ' "$LOG" || echo "see the log"; } | cut -c1-300
}
mkdir -p "$FB/logs"
exec 9>"$FB/.lock-$TARGET"
flock 9
exec 7>"$FB/.lock-tree"; flock 7; patched_tree; flock -u 7

# -- freebsd-toolchain ---------------------------------------------------------------------
toolchain() {
  [ -f "$OBJ/.toolchain-done" ] && return 0
  exec 8>"$FB/.lock-obj-$TC_KEY"; flock 8
  [ -f "$OBJ/.toolchain-done" ] && return 0
  LOG="$FB/logs/freebsd-toolchain.log"; : >"$LOG"
  log "building FreeBSD's kernel toolchain from $TREE (log $LOG)"
  rm -rf "$OBJ"; mkdir -p "$OBJ"
  TOTAL=954 run_logged mk kernel-toolchain       # its compiler calls at 15.1
  touch "$OBJ/.toolchain-done"
}
legacy_bin() { find "${1:-$OBJ}" -path '*/tmp/legacy/bin/makefs' -printf '%h\n' -quit; }
guest_klds() {    # ROOT: each of GUEST_KERNELS' KLDs in ROOT/boot/kernel.IDENT/
  local f ident kdir k
  for f in "${GUEST_KERNELS[@]}"; do
    ident=$(conf_of "$f"); kdir="$FB/kernel-$f-$(kernel_key "$ident")"
    for k in "${KLDS[@]}"; do
      [ -f "$kdir/$k.ko" ] || die "$TARGET: kernel-freebsd-$f is not built ($kdir/$k.ko: ./tandem build freebsd)"
      mkdir -p "$1/boot/kernel.$ident"; cp "$kdir/$k.ko" "$1/boot/kernel.$ident/"
    done
  done
}
ufs_image() {     # MAKEFS DIR IMAGE: a UFS2 image of DIR, its files and as much again free, at least 8 MiB
  local mb; mb=$(( $(du -sm "$2" | cut -f1) * 2 )); [ "$mb" -ge 8 ] || mb=8
  "$1" -t ffs -o version=2 -s "$mb"m "$3" "$2" >/dev/null || die "$TARGET: makefs of $2 failed"
}

# compiler-rt's builtins, which libsa and boot2 compile (divdi3.c, ashldi3.c, ...): the
# tree's own contrib/llvm-project, or, in a tree without LLVM's source (a trimmed archive),
# those of Debian's llvm-toolchain-MAJOR source package of the tree's LLVM major release
# (deb-src), linked into tandem's copy of the tree.
compiler_rt() {
  local rt="$TREE/contrib/llvm-project/compiler-rt" ver major dir orig
  [ ! -d "$rt/lib/builtins" ] || return 0
  ver=$(sed -n 's/.*LLVM_REVISION "llvmorg-\([0-9.]*\).*/\1/p' "$TREE/lib/clang/include/VCSVersion.inc" 2>/dev/null)
  [ -n "$ver" ] || die "$TREE: neither LLVM's source (contrib/llvm-project/compiler-rt) nor its release (lib/clang/include/VCSVersion.inc)"
  major=${ver%%.*}
  dir="$FB/compiler-rt-$major"
  if [ ! -d "$dir/lib/builtins" ]; then
    mkdir -p "$FB/llvm-src"
    log "the tree has no compiler-rt (LLVM $ver): taking its builtins from Debian's llvm-toolchain-$major source"
    orig=$(ls "$FB"/llvm-src/llvm-toolchain-"$major"_*.orig.tar.xz 2>/dev/null | tail -n1 || true)
    if [ -z "$orig" ]; then
      # only the upstream tarball is used; a .dsc or .debian.tar.xz that 404s does not matter
      (cd "$FB/llvm-src" && apt-get source --download-only "llvm-toolchain-$major") >"$FB/logs/llvm-src.log" 2>&1 || true
      orig=$(ls "$FB"/llvm-src/llvm-toolchain-"$major"_*.orig.tar.xz 2>/dev/null | tail -n1 || true)
      [ -n "$orig" ] || die "$TREE has no compiler-rt and Debian's llvm-toolchain-$major source could not be had (a deb-src line in apt's sources? log: $FB/logs/llvm-src.log)"
    fi
    rm -rf "$dir.tmp$$"; mkdir -p "$dir.tmp$$"
    tar -C "$dir.tmp$$" -xJf "$orig" --strip-components=2 --wildcards '*/compiler-rt/lib/builtins' \
      || die "$orig: no compiler-rt/lib/builtins in it"
    mv -T "$dir.tmp$$" "$dir" 2>/dev/null || rm -rf "$dir.tmp$$"    # another build published it first
  fi
  mkdir -p "$TREE/contrib/llvm-project"
  ln -sfn "$dir" "$rt"
}

# -- freebsd-boot: kernel-toolchain, then stand/'s 32-bit libsa and the BIOS boot programs
boot_blocks() {    # -> BOOT_DIR
  BOOT_DIR="$FB/boot-$BOOT_KEY"
  [ ! -f "$BOOT_DIR/loader" ] || return 0
  local obj="$FB/obj-boot-$BOOT_KEY" tmp stand
  exec 6>"$FB/.lock-obj-boot-$BOOT_KEY"; flock 6
  compiler_rt
  LOG="$FB/logs/freebsd-boot.log"; : >"$LOG"
  log "building FreeBSD's boot blocks and loader from $TREE (log $LOG)"
  if [ ! -f "$obj/.toolchain-done" ]; then
    rm -rf "$obj"; mkdir -p "$obj"
    OBJ=$obj TOTAL=954 run_logged mk "${boot_knobs[@]}" kernel-toolchain
    touch "$obj/.toolchain-done"
  fi
  # WORLDFAST: only the build itself (the stages before it would rebuild the toolchain's
  # tools without the bootstrap ones); stand/userboot (bhyve's) is left out: it needs a
  # world's headers.
  OBJ=$obj TOTAL=150 run_logged mk "${boot_knobs[@]}" -DWORLDFAST -DNO_LIBS \
    "SUBDIR_OVERRIDE=stand/libsa32 .WAIT stand/i386" buildworld
  stand=$(find "$obj" -type d -path '*/stand/i386' -print -quit)
  tmp="$BOOT_DIR.tmp$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  cp "$stand/pmbr/pmbr" "$stand/gptboot/gptboot" "$tmp/" && cp "$stand/loader_simp/loader_simp" "$tmp/loader" \
    && cp "$(legacy_bin "$obj")/mkimg" "$(legacy_bin "$obj")/makefs" "$tmp/" || die "$TARGET: stand/ left no boot blocks (log: $LOG)"
  rm -rf "$BOOT_DIR"; mv -T "$tmp" "$BOOT_DIR"
}

case $TARGET in
freebsd-toolchain)
  toolchain
  write_json "obj=$OBJ" "makefs=$(legacy_bin)/makefs" ;;
kernel-freebsd-*)
  if [ "$TARGET" = kernel-freebsd-config ]; then
    FLAVOR="config-$KERNCONF"
  fi
  FINAL="$FB/kernel-$FLAVOR-$KEY"
  if [ ! -f "$FINAL/kernel" ]; then
    toolchain
    LOG="$FB/logs/kernel-freebsd-$FLAVOR.log"; : >"$LOG"
    log "building FreeBSD kernel $KERNCONF from $TREE (log $LOG)"
    # Our configs are taken from their directory (KERNCONFDIR, also the include path of
    # TANDEM-DEBUG's `include TANDEM-NATIVE`); a user's from its own, with ours on config(8)'s
    # include path. No module of the tree's is built (MODULES_OVERRIDE empty), only tandem's
    # KLDs (LOCAL_MODULES; WITH_LOCAL_MODULES: a cross build leaves them out otherwise).
    added_sources
    modules=(MODULES_OVERRIDE= WITH_LOCAL_MODULES=yes LOCAL_MODULES_DIR="$ADDED_DIR/modules" LOCAL_MODULES="${KLDS[*]}")
    if [ "$TARGET" = kernel-freebsd-config ]; then
      FAILED="FreeBSD kernel config $USERCONF does not build" TOTAL=836 run_logged mk buildkernel "${modules[@]}" \
        KERNCONF="$KERNCONF" KERNCONFDIR="$(dirname "$USERCONF")" CONFIGARGS="-I $CONFDIR"
    else
      TOTAL=836 run_logged mk buildkernel "${modules[@]}" KERNCONF="$KERNCONF" KERNCONFDIR="$CONFDIR"
    fi
    kobj=$(find "$OBJ" -type d -path "*/sys/$KERNCONF" -print -quit)
    [ -f "$kobj/kernel" ] || die "$TARGET: no kernel in $kobj"
    tmp="$FINAL.tmp$$"; rm -rf "$tmp"; mkdir -p "$tmp"
    cp "$kobj/kernel" "$tmp/kernel"
    [ ! -f "$kobj/kernel.debug" ] || cp "$kobj/kernel.debug" "$tmp/kernel.debug"
    # Its symbols as a System.map ("address type name", nm's format), for tandem assert
    nm -n "$tmp/kernel.debug" >"$tmp/System.map" 2>/dev/null || nm -n "$tmp/kernel" >"$tmp/System.map" \
      || die "$TARGET: nm cannot read $tmp/kernel"
    # Each KLD as built, with its debug info: the file the guest loads is the one its
    # frames are symbolized with (the kernel keeps only its sections with SHF_ALLOC).
    for k in "${KLDS[@]}"; do
      ko=$(find "$kobj/modules" -name "$k.ko.full" -print -quit); [ -n "$ko" ] || ko=$(find "$kobj/modules" -name "$k.ko" -print -quit)
      [ -n "$ko" ] || die "$TARGET: the KLD $k was not built (log: $LOG)"
      cp "$ko" "$tmp/$k.ko"
    done
    cp "${USERCONF:-$CONFDIR/$KERNCONF}" "$tmp/config"
    grep -a -o -m1 -E 'FreeBSD [0-9]+\.[0-9]+-[A-Za-z0-9-]+ [A-Z0-9-]+' "$kobj/kernel" | head -n1 >"$tmp/version" || true
    rm -rf "$FINAL"; mv -T "$tmp" "$FINAL"
  fi
  # The keys a Linux kernel's JSON has (tandem.artifacts.KernelBuild): bzImage is what QEMU's
  # -kernel boots (here the ELF kernel, through its PVH note), vmlinux what reports are
  # symbolized with (kernel.debug, its DWARF and symbols).
  syms="$FINAL/kernel"; [ -f "$FINAL/kernel.debug" ] && syms="$FINAL/kernel.debug"
  klds=(); for k in "${KLDS[@]}"; do klds+=("klds[]=$FINAL/$k.ko"); done
  write_json "flavor=freebsd-$FLAVOR" "os=freebsd" "bzImage=$FINAL/kernel" "vmlinux=$syms" "system_map=$FINAL/System.map" \
    "config=$FINAL/config" "version=$(cat "$FINAL/version")" "bzImage_sha256=$(sha "$FINAL/kernel")" \
    "${klds[@]}" ;;
freebsd-guest)
  FINAL="$FB/guest-$KEY"
  if [ ! -f "$FINAL/root.img" ]; then
    toolchain
    makefs="$(legacy_bin)/makefs"
    [ -x "$makefs" ] || die "no makefs among the bootstrap tools in $OBJ"
    tmp="$FINAL.tmp$$"; rm -rf "$tmp"; mkdir -p "$tmp/root/sbin" "$tmp/root/dev"
    guest_klds "$tmp/root"
    clang-19 --target=x86_64-unknown-freebsd14.0 -O2 -Wall -Werror -nostdlib -static -ffreestanding \
      -fno-stack-protector -fuse-ld=lld -o "$tmp/root/sbin/init" "$CONFDIR/init/kvd-init.c"
    ufs_image "$makefs" "$tmp/root" "$tmp/root.img"
    cp "$tmp/root/sbin/init" "$tmp/init"; rm -rf "$tmp/root"
    rm -rf "$FINAL"; mv -T "$tmp" "$FINAL"
  fi
  write_json "root_image=$FINAL/root.img" "init=$FINAL/init" ;;
freebsd-boot)
  boot_blocks
  write_json "pmbr=$BOOT_DIR/pmbr" "gptboot=$BOOT_DIR/gptboot" "loader=$BOOT_DIR/loader" "mkimg=$BOOT_DIR/mkimg" ;;
freebsd-disk)
  FINAL="$FB/disk-$KEY"
  if [ ! -f "$FINAL/disk.img" ]; then
    boot_blocks
    GUEST="$FB/guest-$(guest_key)"
    [ -f "$GUEST/init" ] || die "$TARGET: freebsd-guest is not built ($GUEST: ./tandem build freebsd)"
    tmp="$FINAL.tmp$$"; rm -rf "$tmp"; mkdir -p "$tmp/root/sbin" "$tmp/root/dev" "$tmp/root/etc" "$tmp/root/boot/kernel"
    cp "$GUEST/init" "$tmp/root/sbin/init"
    guest_klds "$tmp/root"
    cp "$FB/kernel-native-$(kernel_key TANDEM-NATIVE)/kernel" "$tmp/root/boot/kernel/kernel"
    cp "$BOOT_DIR/loader" "$tmp/root/boot/loader"
    # gptboot and the loader on the serial port (-h), as a VM without a screen needs; the
    # loader's script loads and boots the kernel, which mounts the root /etc/fstab names
    # (the loader reads it into vfs.root.mountfrom)
    printf -- '-h\n' >"$tmp/root/boot.config"
    printf 'load /boot/kernel/kernel\nboot\n' >"$tmp/root/boot/loader.rc"
    printf '/dev/vtbd0p2\t/\tufs\trw\t1\t1\n' >"$tmp/root/etc/fstab"
    ufs_image "$BOOT_DIR/makefs" "$tmp/root" "$tmp/root.img"
    "$BOOT_DIR/mkimg" -s gpt -b "$BOOT_DIR/pmbr" -p freebsd-boot:="$BOOT_DIR/gptboot" -p freebsd-ufs:="$tmp/root.img" \
      -o "$tmp/disk.img" || die "$TARGET: mkimg failed"
    rm -rf "$tmp/root" "$tmp/root.img"
    rm -rf "$FINAL"; mv -T "$tmp" "$FINAL"
  fi
  write_json "disk=$FINAL/disk.img" "root=ufs:/dev/vtbd0p2" ;;
esac
}
main "$@"
