#!/usr/bin/env bash
# Build tandem's QEMU: Debian's trixie QEMU 10.0 source + qemu-patches/series,
# x86_64-softmmu with TCG plugins, slirp, capstone, zstd; firmware from Debian's
# seabios and qemu-system-data. Content-addressed under $TANDEM_CACHE/qemu/KEY.
# Usage: build-qemu.sh OUT_JSON [stock]
#   stock: the benchmarks' baseline, Debian's QEMU with only qemu-patches/stock-series
#   (the device-set config, no code changes), so its speed is stock QEMU's.
set -euo pipefail
OUT=$(realpath -m "$1")
FLAVOR=${2:-tandem}
SERIES=series; [ "$FLAVOR" = stock ] && SERIES=stock-series
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
PY=${TANDEM_PYTHON:-python3}
say() { echo "tandem: $*" >&2; }
. "$ROOT/scripts/progress.sh"
TARGET=qemu; [ "$FLAVOR" = stock ] && TARGET=qemu-stock

CONFIGURE=(--target-list=x86_64-softmmu --without-default-devices --with-devices-x86_64=tandem
  --enable-plugins --enable-slirp --enable-capstone --enable-zstd --enable-tools
  --disable-download --disable-install-blobs --disable-docs --disable-werror
  --disable-gtk --disable-sdl --disable-vnc --disable-spice --disable-opengl
  --disable-virglrenderer --disable-xen --disable-guest-agent --disable-debug-info
  --enable-trace-backends=nop)

# 1. The Debian source package (downloaded once; its .dsc names every file and hash).
DL=$CACHE/dl/qemu
mkdir -p "$DL"
DSC=$(ls "$DL"/qemu_10.0.*.dsc 2>/dev/null | sort -V | tail -n1 || true)
if [ -z "$DSC" ] && [ -n "${TANDEM_KEY_ONLY:-}" ]; then
  exit 1   # not downloaded yet: no key to give
fi
if [ -z "$DSC" ]; then
  say "downloading QEMU 10.0 source (Debian trixie)"
  ver=$(apt-cache showsrc qemu | awk '/^Version: 1:10\.0\./ {print $2}' | sort -V | tail -n1)
  [ -n "$ver" ] || { say "no QEMU 10.0 in the deb-src lists (run scripts/host-deps.sh)"; exit 1; }
  (cd "$DL" && apt-get source -qq --download-only "qemu=$ver")
  DSC=$(ls "$DL"/qemu_10.0.*.dsc | sort -V | tail -n1)
fi

KEY=$( { sha256sum "$DSC"; cat "$ROOT/qemu-patches/$SERIES";
         (cd "$ROOT/qemu-patches" && sha256sum $(cat $SERIES)); sha256sum <"$0";
         echo "${CONFIGURE[*]}"; } | sha256sum | cut -c1-16)
PATCH_HASH=$( (cd "$ROOT/qemu-patches" && cat $SERIES $(cat $SERIES)) | sha256sum | cut -d' ' -f1)
DIR=$CACHE/qemu/$KEY
# TANDEM_KEY_ONLY=1: print the key these sources give and the file whose presence says
# the build of that key is cached; build nothing (tandem doctor, setup/state.py).
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$DIR/.complete"; exit 0; }
BIN=$DIR/install/bin/qemu-system-x86_64

# One build per key at a time (the test suite and a user may both ask for it).
mkdir -p "$CACHE/qemu"
exec 9>"$CACHE/qemu/.lock-$KEY"
flock 9
if [ ! -f "$DIR/.complete" ]; then
  say "building QEMU ($FLAVOR) $KEY (cold: ~3 min on 2 cores; cached afterwards)"
  # .complete is written last: anything without it is a leftover and is redone.
  rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR"
  dpkg-source -q -x "$DSC" src >/dev/null
  (cd src && for p in $(cat "$ROOT/qemu-patches/$SERIES"); do
     patch -s -p1 --forward < "$ROOT/qemu-patches/$p" || { say "patch $p does not apply"; exit 1; }
   done)
  mkdir build && cd build
  # ccache with paths relative to the key dir, so a rebuild under a new key reuses objects.
  export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache} CCACHE_BASEDIR=$DIR CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
  cc="gcc"; command -v ccache >/dev/null && cc="ccache gcc"
  if ! ../src/configure --python="$PY" --cc="$cc" --prefix="$DIR/install" "${CONFIGURE[@]}" > ../configure.log 2>&1; then
    tail -n 30 ../configure.log >&2; say "QEMU configure failed (log: $DIR/configure.log)"; exit 1
  fi
  # Only what tandem runs: the system emulator and qemu-img (not the test programs).
  make -j"$(nproc)" qemu-system-x86_64 qemu-img > ../build.log 2>&1 &
  pid=$!
  start=$(date +%s)
  while kill -0 $pid 2>/dev/null; do
    sleep 2
    n=$(grep -o '^\[[0-9]*/[0-9]*\]' ../build.log | tail -n1 | tr -d '[]' || true)
    [ -z "$n" ] || progress "$TARGET" "$start" "${n%/*}" "${n#*/}" steps
  done
  progress_end "$TARGET"
  if ! wait $pid; then tail -n 40 ../build.log >&2; say "QEMU build failed (log: $DIR/build.log)"; exit 1; fi
  say "QEMU ($FLAVOR) built in $(( $(date +%s) - start ))s"
  mkdir -p "$DIR/install/bin" "$DIR/install/include"
  cp qemu-system-x86_64 qemu-img "$DIR/install/bin/"
  cp ../src/include/qemu/qemu-plugin.h "$DIR/install/include/"   # for the TCG plugins
  # Firmware: Debian's seabios and qemu-system-data (no blobs from the source tree).
  mkdir -p "$DIR/firmware"
  for f in /usr/share/seabios/bios-256k.bin /usr/share/qemu/linuxboot_dma.bin \
           /usr/share/qemu/kvmvapic.bin /usr/share/qemu/linuxboot.bin \
           /usr/share/qemu/multiboot_dma.bin /usr/share/qemu/pvh.bin; do
    [ -f "$f" ] || { say "firmware $f missing (install seabios and qemu-system-data)"; exit 1; }
    ln -sf "$f" "$DIR/firmware/"
  done
  # ...also where an installed QEMU looks for it (its datadir, PREFIX/share/qemu): the binary
  # run without -L, as QEMU's own functional tests run it (tests/test_qemu_functional.py).
  mkdir -p "$DIR/install/share" && ln -sfn ../../firmware "$DIR/install/share/qemu"
  cd "$DIR" && rm -rf build   # objects live on in ccache; keep src for reference
  touch "$DIR/.complete"
fi

VERSION=$("$BIN" --version | head -n1 | awk '{print $4}')
BUILD_ID=$(sha256sum "$BIN" | cut -d' ' -f1)
mkdir -p "$(dirname "$OUT")"
cat > "$OUT.tmp" <<JSON
{"key": "$KEY", "binary": "$BIN", "img": "$DIR/install/bin/qemu-img",
 "firmware_dir": "$DIR/firmware", "plugin_include": "$DIR/install/include", "source": "$DIR/src",
 "build_id": "$BUILD_ID", "patch_series": "$PATCH_HASH", "version": "$VERSION",
 "stock": $([ "$FLAVOR" = stock ] && echo true || echo false)}
JSON
mv "$OUT.tmp" "$OUT"
