#!/usr/bin/env bash
# Build a tandem TCG plugin (replay/plugins/NAME.c) against the QEMU build's
# installed qemu-plugin.h and glib.
#
#   scripts/build-plugin.sh SOURCE QEMU_JSON OUT_JSON
#
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/plugins/NAME-KEY.so with
# KEY = sha256(source, qemu-plugin.h, this script, gcc version, glib cflags)[:16],
# written once by atomic rename. OUT_JSON: {"plugin": PATH, "key": KEY}.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 SOURCE QEMU_JSON OUT_JSON" >&2; exit 1; }
SRC=$(realpath "$1")
QJSON=$2
OUT=$(realpath -m "$3")
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
NAME=$(basename "$SRC" .c)
INC=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["plugin_include"])' "$QJSON")
[ -f "$INC/qemu-plugin.h" ] || { echo "tandem: error: $INC/qemu-plugin.h missing (rebuild QEMU)" >&2; exit 1; }
GLIB=$(pkg-config --cflags --libs glib-2.0)
KEY=$({ sha256sum <"$SRC"; sha256sum <"$INC/qemu-plugin.h"; sha256sum <"$0"; gcc --version | head -n1; echo "$GLIB"; } |
      sha256sum | cut -c1-16)
SO=$CACHE/plugins/$NAME-$KEY.so
if [ ! -f "$SO" ]; then
  mkdir -p "$CACHE/plugins"
  tmp="$SO.tmp$$"
  # shellcheck disable=SC2086
  gcc -O2 -g -Wall -Werror -shared -fPIC -std=gnu11 -I"$INC" -o "$tmp" "$SRC" $GLIB
  mv "$tmp" "$SO"
  echo "tandem: built plugin $SO" >&2
fi
printf '{"plugin": "%s", "key": "%s"}\n' "$SO" "$KEY" >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
