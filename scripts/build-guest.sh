#!/usr/bin/env bash
# Build the tandem guest userland into a content-addressed cache.
#
#   scripts/build-guest.sh OUT_JSON
#
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/guest/KEY/ with
#   initramfs-native.cpio.gz  busybox + kvd + tandem-agent + /init
#   initramfs-asan.cpio.gz    the same + /usr/bin/kvd-asan and its shared libraries
#   disk-base.img             16 MiB empty ext4 (byte-reproducible)
# KEY = sha256(agent sources, this script, sha256(/bin/busybox), gcc version)[:16].
# The directory appears only by atomic rename once complete. OUT_JSON describes it.
set -euo pipefail
# The whole script is one function so bash parses it fully before running: editing
# this file while a build runs cannot corrupt that build.
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
log() { echo "tandem: $*" >&2; }

[ $# -eq 1 ] || die "usage: $0 OUT_JSON"
OUT_JSON=$1

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
AGENT="$ROOT/agent"
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
GDIR="$CACHE/guest"
BUSYBOX=${TANDEM_BUSYBOX:-/bin/busybox}
CC=${CC:-gcc}
SOURCES=(kvd.c tandem-agent.c init)

[ -x "$BUSYBOX" ] || die "$BUSYBOX missing (apt-get install busybox-static)"
! readelf -l "$BUSYBOX" | grep -q 'program interpreter' || die "$BUSYBOX is not statically linked (need busybox-static)"
for t in cpio gzip mkfs.ext4 ldd readelf unshare chroot sha256sum python3; do
  command -v "$t" >/dev/null || die "$t not found"
done
mkdir -p "$GDIR"

KEY=$({
  for f in "${SOURCES[@]}"; do echo "$f"; sha256sum <"$AGENT/$f"; done
  sha256sum <"$SELF"
  sha256sum <"$BUSYBOX"
  "$CC" --version | head -n1
} | sha256sum | cut -c1-16)
FINAL="$GDIR/$KEY"
# TANDEM_KEY_ONLY=1: print the key these sources give and the file whose presence says
# the build of that key is cached; build nothing (tandem doctor, setup/state.py).
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$FINAL/disk-base.img"; exit 0; }
[ "$(id -u)" = 0 ] || die "needs root (mknod of /dev/console, chroot smoke test)"

write_json() {
  python3 - "$OUT_JSON" "$KEY" "$FINAL" <<'PY'
import hashlib, json, os, sys
out, key, d = sys.argv[1:]
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
j = {"key": key}
for name, fn in (("initramfs_native", "initramfs-native.cpio.gz"),
                 ("initramfs_asan", "initramfs-asan.cpio.gz"),
                 ("disk_base", "disk-base.img")):
    p = os.path.join(d, fn)
    j[name] = p
    j[name + "_sha256"] = sha(p)
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

if [ -f "$FINAL/disk-base.img" ]; then write_json; exit 0; fi
exec 9>"$GDIR/.lock"
flock 9
if [ -f "$FINAL/disk-base.img" ]; then write_json; exit 0; fi

log "building guest image $KEY (~20 s)..."
progress guest "$(date +%s)" 0 0 -
TMP="$GDIR/.tmp-$KEY-$$"
rm -rf "$TMP"
mkdir -p "$TMP/bin"
BUILD_LOG="$TMP/build.log"
trap 'rm -rf "$TMP"' EXIT

run() {
  if ! "$@" >>"$BUILD_LOG" 2>&1; then
    echo "tandem: guest build failed: $*; last lines of log:" >&2
    tail -n 30 "$BUILD_LOG" >&2
    exit 1
  fi
}

# --- binaries ------------------------------------------------------------------
CFLAGS=(-O2 -Wall -Wextra -ffile-prefix-map="$AGENT"=agent)
run "$CC" "${CFLAGS[@]}" -static -o "$TMP/bin/kvd" "$AGENT/kvd.c"
run "$CC" "${CFLAGS[@]}" -static -o "$TMP/bin/tandem-agent" "$AGENT/tandem-agent.c"
run "$CC" "${CFLAGS[@]}" -fsanitize=address,undefined -fno-omit-frame-pointer -g \
  -o "$TMP/bin/kvd-asan" "$AGENT/kvd.c"
run strip "$TMP/bin/kvd" "$TMP/bin/tandem-agent"

# --- root trees ------------------------------------------------------------------
mkroot() {
  local r=$1
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,data,tmp,etc,root}
  chmod 1777 "$r/tmp"
  cp "$BUSYBOX" "$r/bin/busybox"
  # Equivalent of "busybox --install -s", but with links to /bin/busybox (the host's
  # busybox would resolve its own path through the /usr merge).
  local a
  while read -r a; do
    [ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /bin/busybox "$r/$a"
  done < <("$BUSYBOX" --list-full | grep -v '^bin/busybox$')
  install -m 0755 "$TMP/bin/kvd" "$r/usr/bin/kvd"
  install -m 0755 "$TMP/bin/tandem-agent" "$r/usr/bin/tandem-agent"
  install -m 0755 "$AGENT/init" "$r/init"
  mknod -m 0600 "$r/dev/console" c 5 1
  mknod -m 0666 "$r/dev/null" c 1 3
  echo "root:x:0:0:root:/root:/bin/sh" >"$r/etc/passwd"
  echo "root:x:0:" >"$r/etc/group"
}

R_NATIVE="$TMP/root-native"
R_ASAN="$TMP/root-asan"
mkroot "$R_NATIVE"
mkroot "$R_ASAN"
install -m 0755 "$TMP/bin/kvd-asan" "$R_ASAN/usr/bin/kvd-asan"
# shared libraries + dynamic loader of kvd-asan, at the paths ldd reports
while read -r lib; do
  [ -n "$lib" ] || continue
  mkdir -p "$R_ASAN$(dirname "$lib")"
  cp -L "$lib" "$R_ASAN$lib"
done < <(ldd "$TMP/bin/kvd-asan" | awk '/=> \//{print $3} /^\s*\/[^ ]*ld-linux/{print $1}' | sort -u)
# the interpreter path baked into the binary (e.g. /lib64/ld-linux-x86-64.so.2)
interp=$(readelf -l "$TMP/bin/kvd-asan" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [ -n "$interp" ] && [ ! -e "$R_ASAN$interp" ]; then
  mkdir -p "$R_ASAN$(dirname "$interp")"
  cp -L "$interp" "$R_ASAN$interp"
fi
# smoke test: the asan binary must at least start inside its own root
rc=0
unshare -m chroot "$R_ASAN" /bin/sh -c 'mount -t proc proc /proc && exec /usr/bin/kvd-asan --bogus' \
  >>"$BUILD_LOG" 2>&1 || rc=$?
if [ $rc -ne 2 ]; then
  echo "tandem: guest build failed: kvd-asan does not run inside its initramfs root" >&2
  tail -n 20 "$BUILD_LOG" >&2
  exit 1
fi

# --- reproducible archives ---------------------------------------------------------
mkcpio() {
  local r=$1 out=$2
  find "$r" -exec touch -h -d @0 {} +
  (cd "$r" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
     cpio -o -H newc --reproducible -R 0:0 --quiet) | gzip -n -9 >"$out"
}
mkcpio "$R_NATIVE" "$TMP/initramfs-native.cpio.gz"
mkcpio "$R_ASAN" "$TMP/initramfs-asan.cpio.gz"

# 16 MiB ext4 with fixed UUID, hash seed and time => byte-reproducible
UUID=6b0a3f4e-1d2c-4c5b-9a8e-7f6e5d4c3b2a
truncate -s 16M "$TMP/disk-base.img"
run env E2FSPROGS_FAKE_TIME=1 MKE2FS_CONFIG=/etc/mke2fs.conf \
  mkfs.ext4 -q -F -L tandem-data -U "$UUID" -E root_owner=0:0,hash_seed="$UUID",lazy_itable_init=0,lazy_journal_init=0 \
  "$TMP/disk-base.img"

# --- publish -------------------------------------------------------------------------
rm -rf "$R_NATIVE" "$R_ASAN"
mkdir "$TMP/out"
mv "$TMP"/initramfs-*.cpio.gz "$TMP/disk-base.img" "$TMP/bin" "$BUILD_LOG" "$TMP/out/"
rm -rf "$FINAL"
mv -T "$TMP/out" "$FINAL"
rm -rf "$TMP"
trap - EXIT
progress_end guest
write_json
log "guest image ready: $FINAL"
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
