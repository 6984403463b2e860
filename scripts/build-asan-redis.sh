#!/usr/bin/env bash
# Build the reference VM's redis with AddressSanitizer, laid out as an overlay tree for
# `tandem replay --overlay NAME=DIR`: an analysis of the reference VM that runs
# this redis in place of Debian's, everything else unchanged.
#
#   scripts/build-asan-redis.sh OUT_JSON
#
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/asan-redis/KEY/ with
#   overlay/usr/bin/redis-server                           redis built with ASan (-O1)
#   overlay/usr/lib/x86_64-linux-gnu/libasan.so.8          its runtime (the guest has none)
#   overlay/etc/systemd/system/redis-server.service.d/asan.conf
#                          ASan's reports to the console too (StandardError=journal+console),
#                          where tandem scans them; no leak check at exit (redis frees
#                          little on shutdown by design: every power-off would be a finding)
#   asan-redis.json        what OUT_JSON says
# The source is bookworm's (apt-get source redis/bookworm, Debian's patches applied), the
# version the reference VM runs; built as upstream's `make SANITIZER=address` does (libc
# malloc, frame pointers) with systemd's notify support (the guest's unit is Type=notify)
# and without TLS (the unit does not use it). The host is Debian 12 like the guest, so
# the binary's glibc and libsystemd are the guest's.
# KEY = sha256(this script without comments, the source's version, gcc's version)[:16].
# Measured on this 2-core machine: cold build about 2 min (a kernel build beside it: 4);
# cached 0.1 s.
set -euo pipefail
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }
log() { echo "tandem: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

[ $# -eq 1 ] || die "usage: $0 OUT_JSON"
OUT_JSON=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
ADIR="$CACHE/asan-redis"
for t in apt-get apt-cache dpkg-source gcc make sha256sum flock python3; do
  command -v "$t" >/dev/null || die "$t not found (scripts/host-deps.sh installs it)"
done
[ -f /usr/include/systemd/sd-daemon.h ] || die "libsystemd-dev is not installed (scripts/host-deps.sh installs it)"
VERSION=$(apt-cache showsrc redis 2>/dev/null | awk '/^Version:/ {print $2}' | grep -- '~deb12' | sort -V | tail -1)
[ -n "$VERSION" ] || die "no bookworm redis in the deb-src lists (run scripts/host-deps.sh)"
KEY=$({ grep -v '^[[:space:]]*#' "$SELF"; echo "$VERSION"; gcc --version | head -1; } | sha256sum | cut -c1-16)
FINAL="$ADIR/$KEY"
# TANDEM_KEY_ONLY=1: print the key and the file whose presence says its build is cached.
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$FINAL/asan-redis.json"; exit 0; }

write_json() {
  python3 - "$OUT_JSON" "$FINAL" "$VERSION" <<'PY'
import json, os, sys
out, d, version = sys.argv[1:]
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump({"key": os.path.basename(d), "overlay": os.path.join(d, "overlay"), "redis_source": version,
               "binary": os.path.join(d, "overlay/usr/bin/redis-server")}, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

if [ -f "$FINAL/asan-redis.json" ]; then write_json; exit 0; fi
mkdir -p "$ADIR"
exec 9>"$ADIR/.lock"
flock 9
if [ -f "$FINAL/asan-redis.json" ]; then write_json; exit 0; fi

log "building redis $VERSION with ASan ($KEY; about 2 min)..."
TMP="$ADIR/.tmp-$KEY-$$"
rm -rf "$TMP"
mkdir -p "$TMP/src"
trap 'rm -rf "$TMP"; progress_end asan-redis' EXIT
START=$(date +%s)
progress asan-redis "$START" 0 0 steps
(cd "$TMP/src" && apt-get source -qq --download-only "redis=$VERSION" >"$TMP/build.log" 2>&1) \
  || die "apt-get source redis=$VERSION failed: $(tail -1 "$TMP/build.log")"
dpkg-source -x "$TMP/src"/redis_*.dsc "$TMP/src/redis" >>"$TMP/build.log" 2>&1 \
  || die "dpkg-source -x failed: $(tail -1 "$TMP/build.log")"
make -C "$TMP/src/redis" -j"$(nproc)" SANITIZER=address OPTIMIZATION=-O1 USE_SYSTEMD=yes BUILD_TLS=no \
  redis-server >>"$TMP/build.log" 2>&1 || die "make failed (log: $TMP/build.log): $(tail -3 "$TMP/build.log")"

O="$TMP/out/overlay"
mkdir -p "$O/usr/bin" "$O/usr/lib/x86_64-linux-gnu" "$O/etc/systemd/system/redis-server.service.d"
install -m 0755 "$TMP/src/redis/src/redis-server" "$O/usr/bin/redis-server"
ASAN_LIB=$(gcc -print-file-name=libasan.so.8)
[ -f "$ASAN_LIB" ] || die "no libasan.so.8 next to gcc ($ASAN_LIB)"
install -m 0644 "$(readlink -f "$ASAN_LIB")" "$O/usr/lib/x86_64-linux-gnu/libasan.so.8"
cat >"$O/etc/systemd/system/redis-server.service.d/asan.conf" <<'UNIT'
# tandem: redis built with ASan (scripts/build-asan-redis.sh). Its reports go to the
# console as well, where tandem's analysis reads them.
[Service]
Environment=ASAN_OPTIONS=detect_leaks=0:color=never:abort_on_error=0
StandardError=journal+console
UNIT
"$O/usr/bin/redis-server" --version >/dev/null 2>&1 || die "the ASan redis-server does not run on the host"
echo '{}' >"$TMP/out/asan-redis.json"
mv "$TMP/build.log" "$TMP/out/build.log"
rm -rf "$FINAL"
mv "$TMP/out" "$FINAL"
log "redis with ASan in $FINAL ($(( $(date +%s) - START )) s)"
write_json
}
main "$@"
