#!/usr/bin/env bash
# Build tandem's guest kernel modules (guest-kernel/modules/) for one kernel flavor.
#
#   scripts/build-modules.sh FLAVOR OUT_JSON
#
# The modules are built out of tree against the flavor's kept object directory
# (${TANDEM_CACHE:-~/.cache/tandem}/kernel/obj-FLAVOR), so they carry that kernel's
# sanitizer instrumentation and vermagic, and the kernel itself is not rebuilt.
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/modules/FLAVOR-KEY/ with
#   *.ko              as built (with debug info, for symbolizing reports)
#   modules.cpio.gz   /lib/modules/VERSION/extra/*.ko (debug info stripped), a cpio
#                     that tandem appends to the shared initramfs (vm.py) so that
#                     each kernel flavor boots with its own modules
#   modules.builtin, modules.builtin.modinfo
#                     the kernel's list of what it has built in (made with its image in
#                     the object dir, not kept by build-kernel.sh): a distribution's
#                     modprobe needs it to find ext4 built in rather than missing
#                     (scripts/build-kernel-deb.sh packages it)
# KEY = sha256(kernel key + bzImage hash, module sources, this script, gcc version)[:16].
# The directory appears only by atomic rename once complete. OUT_JSON describes it.
set -euo pipefail
# The whole script is one function so bash parses it fully before running.
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
log() { echo "tandem: $*" >&2; }

[ $# -eq 2 ] || die "usage: $0 FLAVOR OUT_JSON"
FLAVOR=$1
OUT_JSON=$2
case $FLAVOR in *[!a-z0-9_-]*|"") die "bad flavor name '$FLAVOR'";; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
MODSRC="$ROOT/guest-kernel/modules"
# A kernel Debian builds (guest-kernel/linux/FLAVOR.debian): its modules are built there.
[ ! -f "$ROOT/guest-kernel/linux/$FLAVOR.debian" ] || exec bash "$HERE/debian-kernel.sh" modules "$FLAVOR" "$OUT_JSON"
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
KDIR="$CACHE/kernel"
MDIR="$CACHE/modules"
OBJ="$KDIR/obj-$FLAVOR"
mkdir -p "$MDIR"

# The kernel first (a no-op when it is cached): its JSON names the published build.
kjson="$MDIR/.kernel-$FLAVOR-$$.json"
trap 'rm -f "$kjson"' EXIT
bash "$HERE/build-kernel.sh" "$FLAVOR" "$kjson"
kfield() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$kjson" "$1"; }
KKEY=$(kfield key)
KSHA=$(kfield bzImage_sha256)
KCONFIG=$(kfield config)
KVER=$(kfield version)

mapfile -t SOURCES < <(cd "$MODSRC" && find . -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild \) | LC_ALL=C sort)
[ ${#SOURCES[@]} -gt 0 ] || die "no module sources in $MODSRC"
KEY=$({
  echo "$KKEY $KSHA"
  for f in "${SOURCES[@]}"; do echo "$f"; sha256sum <"$MODSRC/$f"; done
  sha256sum <"$SELF"
  gcc --version | head -n1
} | sha256sum | cut -c1-16)
FINAL="$MDIR/$FLAVOR-$KEY"

write_json() {
  python3 - "$OUT_JSON" "$FLAVOR" "$KEY" "$KKEY" "$FINAL" <<'PY'
import glob, hashlib, json, os, sys
out, flavor, key, kkey, d = sys.argv[1:]
h = hashlib.sha256()
cpio = os.path.join(d, "modules.cpio.gz")
with open(cpio, "rb") as f:
    h.update(f.read())
j = {
    "flavor": flavor,
    "key": key,
    "kernel_key": kkey,
    "version": open(os.path.join(d, "version")).read().strip(),
    "modules": sorted(glob.glob(os.path.join(d, "*.ko"))),
    "builtin": sorted(glob.glob(os.path.join(d, "modules.builtin*"))),
    "cpio": cpio,
    "cpio_sha256": h.hexdigest(),
}
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

if [ -f "$FINAL/modules.cpio.gz" ]; then write_json; exit 0; fi

# The kernel build holds this lock while it rebuilds obj-FLAVOR; hold it too so the
# object directory cannot change under the module build.
exec 9>"$KDIR/.lock-$FLAVOR"
flock 9
if [ -f "$FINAL/modules.cpio.gz" ]; then write_json; exit 0; fi

BUILD_LOG="$MDIR/build-$FLAVOR.log"
: >"$BUILD_LOG"
fail() {
  echo "tandem: modules for $FLAVOR failed: $*; last lines of $BUILD_LOG:" >&2
  tail -n 30 "$BUILD_LOG" >&2
  exit 1
}
export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache}
export CCACHE_BASEDIR="$CACHE" CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
export KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC"
export KBUILD_BUILD_USER=tandem KBUILD_BUILD_HOST=tandem KBUILD_BUILD_VERSION=1
# ccache when installed (scripts/host-deps.sh installs it); plain gcc otherwise.
KCC=gcc; command -v ccache >/dev/null && KCC="ccache gcc"
MAKE=(make -C "$OBJ" ARCH=x86_64 CC="$KCC" HOSTCC=gcc)

# obj-FLAVOR holds the flavor's most recent kernel build, which is not necessarily
# the published one (a later build with another config may have used it). Struct
# layouts and vermagic come from .config, so that is what must match.
[ -f "$OBJ/Makefile" ] && [ -e "$OBJ/source" ] \
  || die "$OBJ missing: remove $(dirname "$KCONFIG") and rebuild kernel $FLAVOR"
if ! cmp -s "$OBJ/.config" "$KCONFIG" || [ "$(cat "$OBJ/include/config/kernel.release" 2>/dev/null)" != "$KVER" ] \
   || [ ! -f "$OBJ/vmlinux.symvers" ]; then
  log "kernel $FLAVOR object dir was left at another config; rebuilding it for $KKEY (incremental)..."
  cp "$KCONFIG" "$OBJ/.config"
  "${MAKE[@]}" olddefconfig >>"$BUILD_LOG" 2>&1 || fail "olddefconfig"
  "${MAKE[@]}" -j"$(nproc)" bzImage >>"$BUILD_LOG" 2>&1 || fail "kernel rebuild"
  cmp -s "$OBJ/.config" "$KCONFIG" || fail "$OBJ/.config differs from $KCONFIG after olddefconfig"
fi
# scripts/module.lds and friends: not produced by "make bzImage".
"${MAKE[@]}" modules_prepare >>"$BUILD_LOG" 2>&1 || fail "modules_prepare"

log "building modules for kernel $FLAVOR..."
progress "modules-$FLAVOR" "$(date +%s)" 0 0 -
TMP="$MDIR/.tmp-$FLAVOR-$KEY-$$"
# Built inside the object dir (under the flavor lock) at the repository's own path:
# kbuild names sources relative to the object dir, and that name is what UBSAN's
# reports and the debug info show (gcc 12 does not remap UBSAN's file names).
B="$OBJ/guest-kernel/modules"
rm -rf "$TMP" "$B"
trap 'rm -rf "$TMP" "$kjson"' EXIT
mkdir -p "$TMP" "$B"
for f in "${SOURCES[@]}"; do install -D -m 0644 "$MODSRC/$f" "$B/$f"; done
# No in-tree modules, so vmlinux's exports are all there is to link against.
"${MAKE[@]}" M="$B" KBUILD_EXTRA_SYMBOLS="$OBJ/vmlinux.symvers" modules >>"$BUILD_LOG" 2>&1 \
  || fail "make modules"

root="$TMP/root/lib/modules/$KVER/extra"
mkdir -p "$root"
for ko in "$B"/*.ko; do
  v=$(modinfo -F vermagic "$ko" | cut -d' ' -f1)
  [ "$v" = "$KVER" ] || fail "$(basename "$ko") has vermagic $v, kernel is $KVER"
  cp "$ko" "$TMP/"
  strip --strip-debug -o "$root/$(basename "$ko")" "$ko"
done
find "$TMP/root" -exec touch -h -d @0 {} +
(cd "$TMP/root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
   cpio -o -H newc --reproducible -R 0:0 --quiet) | gzip -n -9 >"$TMP/modules.cpio.gz"
rm -rf "$TMP/root"
# Made by the kernel's own build (above, at the published .config), so they are that
# kernel's: copied beside its modules.
for f in modules.builtin modules.builtin.modinfo; do
  [ -f "$OBJ/$f" ] || fail "$OBJ/$f missing (a kernel built without CONFIG_MODULES?)"
  cp "$OBJ/$f" "$TMP/$f"
done
echo "$KVER" >"$TMP/version"
cp "$BUILD_LOG" "$TMP/build.log"
rm -rf "$FINAL"
mv -T "$TMP" "$FINAL"
progress_end "modules-$FLAVOR"
write_json
log "modules for kernel $FLAVOR ready: $FINAL"
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
