#!/usr/bin/env bash
# Build a tandem guest kernel flavor into a content-addressed cache.
#
#   scripts/build-kernel.sh FLAVOR OUT_JSON
#   TANDEM_KERNEL_CONFIG_ONLY=1 scripts/build-kernel.sh FLAVOR x   # only generate + check .config
#
# FLAVOR is one of guest-kernel/linux/*.config other than base (native, kasan, ubsan,
# lockdep). The result lives in ${TANDEM_CACHE:-~/.cache/tandem}/kernel/FLAVOR-KEY/
# with KEY = sha256(sha256(tarball), base.config, FLAVOR.config, this script)[:16].
# A finished directory is only ever created by an atomic rename, so an interrupted
# build never looks finished. OUT_JSON describes the result.
set -euo pipefail
# The whole script is one function so bash parses it fully before running: editing
# this file while a build runs cannot corrupt that build.
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
CFGDIR="$ROOT/guest-kernel/linux"
BASE_CFG="$CFGDIR/base.config"
FLAVOR_CFG="$CFGDIR/$FLAVOR.config"
TARBALL=${TANDEM_LINUX_TARBALL:-/usr/src/linux-source-6.12.tar.xz}
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
KDIR="$CACHE/kernel"

# A flavor Debian builds (FLAVOR.debian) is fetched, not compiled.
[ ! -f "$CFGDIR/$FLAVOR.debian" ] || exec bash "$HERE/debian-kernel.sh" kernel "$FLAVOR" "$OUT_JSON"
[ "$FLAVOR" != base ] && [ -f "$FLAVOR_CFG" ] || die "unknown flavor '$FLAVOR' (no $FLAVOR_CFG)"
[ -f "$TARBALL" ] || die "kernel source $TARBALL missing (run scripts/host-deps.sh)"
mkdir -p "$KDIR"

sha() { sha256sum "$1" | cut -d' ' -f1; }

# The tarball hash is costly-ish (150 MB); memoize it by path+size+mtime.
tb_stamp=$(stat -c '%s-%Y' "$TARBALL")
tb_memo="$KDIR/.tarball-sha256-$(printf '%s' "$TARBALL:$tb_stamp" | sha256sum | cut -c1-16)"
if [ -s "$tb_memo" ]; then
  TB_SHA=$(cat "$tb_memo")
else
  TB_SHA=$(sha "$TARBALL")
  echo "$TB_SHA" >"$tb_memo.$$" && mv -f "$tb_memo.$$" "$tb_memo"
fi
TB_KEY=${TB_SHA:0:16}
KEY=$({ echo "$TB_SHA"; sha "$BASE_CFG"; sha "$FLAVOR_CFG"; sha "$SELF"; } | sha256sum | cut -c1-16)
FINAL="$KDIR/$FLAVOR-$KEY"
# TANDEM_KEY_ONLY=1: print the key these sources give, the file whose presence says the
# build of that key is cached, and the source tree it shares with the other flavors;
# build nothing (tandem doctor, setup/state.py).
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$FINAL/version"; echo "$CACHE/linux-src/$TB_KEY"; exit 0; }

write_json() {
  local d=$1
  python3 - "$OUT_JSON" "$FLAVOR" "$KEY" "$d" <<'PY'
import hashlib, json, os, sys
out, flavor, key, d = sys.argv[1:]
h = hashlib.sha256()
with open(os.path.join(d, "bzImage"), "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
j = {
    "flavor": flavor,
    "key": key,
    "bzImage": os.path.join(d, "bzImage"),
    "vmlinux": os.path.join(d, "vmlinux"),
    "system_map": os.path.join(d, "System.map"),
    "config": os.path.join(d, "config"),
    "bzImage_sha256": h.hexdigest(),
    "version": open(os.path.join(d, "version")).read().strip(),
}
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

if [ -f "$FINAL/version" ]; then
  write_json "$FINAL"
  exit 0
fi

# One builder per flavor at a time; re-check after getting the lock.
exec 9>"$KDIR/.lock-$FLAVOR"
flock 9
if [ -f "$FINAL/version" ]; then
  write_json "$FINAL"
  exit 0
fi

# --- source tree, extracted once per tarball hash --------------------------------
SRC="$CACHE/linux-src/$TB_KEY"
if [ ! -f "$SRC/Makefile" ]; then
  mkdir -p "$CACHE/linux-src"
  exec 8>"$CACHE/linux-src/.lock"
  flock 8
  if [ ! -f "$SRC/Makefile" ]; then
    log "extracting $(basename "$TARBALL") (once, ~1 min)..."
    tmp="$CACHE/linux-src/.tmp-$TB_KEY-$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    tar -C "$tmp" --strip-components=1 -xf "$TARBALL" || { rm -rf "$tmp"; die "extracting $TARBALL failed"; }
    [ -f "$tmp/Makefile" ] || { rm -rf "$tmp"; die "$TARBALL does not look like a kernel tree"; }
    rm -rf "$SRC"
    mv -T "$tmp" "$SRC"
  fi
  flock -u 8
fi

# --- configure + build ----------------------------------------------------------
# The object dir has a stable path per flavor so that rebuilds after a config change
# are incremental and ccache sees stable paths. It is wiped when the source changes.
OBJ="$KDIR/obj-$FLAVOR"
if [ "$(cat "$OBJ/.tandem-src" 2>/dev/null)" != "$TB_KEY" ]; then
  rm -rf "$OBJ"
  mkdir -p "$OBJ"
  echo "$TB_KEY" >"$OBJ/.tandem-src"
fi
BUILD_LOG="$KDIR/build-$FLAVOR.log"
: >"$BUILD_LOG"

export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache}
export CCACHE_BASEDIR="$CACHE"
# Every build script caps the shared ccache alike (ccache's own default): the cache's disk
# need (setup/state.py GROWTH) counts on it.
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
export KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC"
export KBUILD_BUILD_USER=tandem KBUILD_BUILD_HOST=tandem KBUILD_BUILD_VERSION=1
# ccache when installed (scripts/host-deps.sh installs it); plain gcc otherwise.
KCC=gcc; command -v ccache >/dev/null && KCC="ccache gcc"
MAKE=(make -C "$SRC" O="$OBJ" ARCH=x86_64 CC="$KCC" HOSTCC=gcc)


fail() {
  echo "tandem: kernel $FLAVOR build failed: $*; last lines of $BUILD_LOG:" >&2
  tail -n 40 "$BUILD_LOG" >&2
  exit 1
}

# allnoconfig + our fragments, then olddefconfig.
(cd "$SRC" && ARCH=x86_64 CC="$KCC" \
   scripts/kconfig/merge_config.sh -n -O "$OBJ" "$BASE_CFG" "$FLAVOR_CFG") >>"$BUILD_LOG" 2>&1 \
  || fail "merge_config"
"${MAKE[@]}" olddefconfig >>"$BUILD_LOG" 2>&1 || fail "olddefconfig"

# Verify every requested option actually ended up with the requested value.
bad=()
while IFS= read -r line; do
  case $line in
    CONFIG_*=*)
      opt=${line%%=*}
      grep -qxF -- "$line" "$OBJ/.config" || bad+=("$line (got: $(grep -E "^$opt=|^# $opt is not set" "$OBJ/.config" || echo unset))")
      ;;
    "# CONFIG_"*" is not set")
      opt=${line#\# }; opt=${opt%% *}
      grep -qE "^$opt=[ym]" "$OBJ/.config" && bad+=("$opt should be unset (got: $(grep -E "^$opt=" "$OBJ/.config"))")
      ;;
  esac
done < <(cat "$BASE_CFG" "$FLAVOR_CFG")
if [ ${#bad[@]} -gt 0 ]; then
  echo "tandem: kernel $FLAVOR config check failed; requested but not in .config:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi

if [ "${TANDEM_KERNEL_CONFIG_ONLY:-0}" = 1 ]; then
  log "kernel $FLAVOR config OK ($OBJ/.config); TANDEM_KERNEL_CONFIG_ONLY=1, not building"
  exit 0
fi

# Progress: files compiled of the total a cold build of this flavor compiled last time
# (kept in the cache), or of the count measured here on Debian 12's 6.12 source.
COUNT="$KDIR/.files-$FLAVOR"
if [ -f "$OBJ/vmlinux" ]; then
  log "building kernel $FLAVOR (incremental)..."
  expect=0
else
  log "building kernel $FLAVOR (cold, $(nproc) cores)..."
  case $FLAVOR in native) expect=1209;; *) expect=1230;; esac
  [ ! -s "$COUNT" ] || expect=$(cat "$COUNT")
fi
# ccache only rebuilds into an object dir that has been built: a miss costs 10% more
# CPU than gcc alone (fs/ext4/inode.c: 1.69 s against 1.53 s user), and a cold build
# is all misses; incremental builds here are make's (the object dir is kept per flavor).
[ -f "$OBJ/vmlinux" ] || export CCACHE_DISABLE=1
start=$(date +%s)
"${MAKE[@]}" -j"$(nproc)" bzImage >>"$BUILD_LOG" 2>&1 &
mpid=$!
while kill -0 "$mpid" 2>/dev/null; do
  progress "kernel-$FLAVOR" "$start" "$(grep -c '^  CC ' "$BUILD_LOG" || true)" "$expect" files
  sleep 2
done
wait "$mpid" || { progress_end "kernel-$FLAVOR"; fail "make"; }
progress_end "kernel-$FLAVOR"
[ "$expect" = 0 ] || grep -c '^  CC ' "$BUILD_LOG" >"$COUNT" || true
log "kernel $FLAVOR built in $(( $(date +%s) - start ))s"

# --- publish atomically ------------------------------------------------------------
tmp="$KDIR/.tmp-$FLAVOR-$KEY-$$"
rm -rf "$tmp"; mkdir -p "$tmp"
cp "$OBJ/arch/x86/boot/bzImage" "$tmp/bzImage"
cp "$OBJ/vmlinux" "$tmp/vmlinux"
cp "$OBJ/System.map" "$tmp/System.map"
cp "$OBJ/.config" "$tmp/config"
cp "$BUILD_LOG" "$tmp/build.log"
"${MAKE[@]}" -s kernelrelease 2>/dev/null | tail -n1 >"$tmp/version"
[ -s "$tmp/version" ] || cat "$OBJ/include/config/kernel.release" >"$tmp/version"
sync -f "$tmp/vmlinux" 2>/dev/null || true
rm -rf "$FINAL"
mv -T "$tmp" "$FINAL"
write_json "$FINAL"
log "kernel $FLAVOR ready: $FINAL"
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
