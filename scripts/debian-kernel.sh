#!/usr/bin/env bash
# A tandem guest kernel that Debian built: fetched from the archive, not compiled.
#
#   scripts/debian-kernel.sh kernel  FLAVOR OUT_JSON   # the kernel (build-kernel.sh's JSON)
#   scripts/debian-kernel.sh modules FLAVOR OUT_JSON   # its modules cpio (build-modules.sh's JSON)
#
# build-kernel.sh and build-modules.sh hand a flavor here when guest-kernel/linux/FLAVOR.debian
# exists (it names the package variant and the modules the guest loads). The version is the
# installed linux-source-6.12's, so the analysis kernels are built from the same source.
# Fetching takes seconds where compiling tandem's native kernel takes 10 minutes of CPU on
# 2 cores (docs/benchmarks.md, cold setup): it is what the demo guest runs by default.
#
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/kernel/FLAVOR-KEY/ with bzImage (Debian's vmlinuz),
# System.map, config, version, and root/ (the image, headers and kbuild packages unpacked,
# for building tandem's modules against); modules/FLAVOR-KEY/ with tandem_bugs.ko built
# against those headers and modules.cpio.gz:
#   lib/modules/RELEASE/boot/NN-NAME.ko   Debian's modules the guest needs, in load order
#   lib/modules/RELEASE/extra/*.ko        tandem's (agent/init loads and reports these)
# KEY = sha256(package versions, FLAVOR.debian, this script)[:16]; modules add the module
# sources and gcc's version. Directories appear by atomic rename once complete.
set -euo pipefail
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }
log() { echo "tandem: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"

[ $# -eq 3 ] || die "usage: $0 kernel|modules FLAVOR OUT_JSON"
MODE=$1 FLAVOR=$2 OUT_JSON=$3
case $FLAVOR in *[!a-z0-9_-]*|"") die "bad flavor name '$FLAVOR'";; esac
case $MODE in kernel|modules) ;; *) die "mode '$MODE': kernel or modules";; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
SPEC="$ROOT/guest-kernel/linux/$FLAVOR.debian"
COMPAT="$ROOT/guest-kernel/linux/$FLAVOR-lkdtm-compat.c"
TARBALL=${TANDEM_LINUX_TARBALL:-/usr/src/linux-source-6.12.tar.xz}
MODSRC="$ROOT/guest-kernel/modules"
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
KDIR="$CACHE/kernel" MDIR="$CACHE/modules" DL="$CACHE/dl/kernel-$FLAVOR"
[ -f "$SPEC" ] || die "flavor '$FLAVOR' has no $SPEC"
spec() { sed -n "s/^$1=//p" "$SPEC" | tail -n1; }
VARIANT=$(spec variant)
LKDTM=$(spec lkdtm)
read -r -a WANT <<<"$(spec modules)"
[ -n "$VARIANT" ] || die "$SPEC: no variant= line"

# The version: linux-source-6.12's as installed; the ABI name: the image package of that
# version (linux-image-6.12.95+deb12-cloud-amd64-unsigned for 6.12.95-1~bpo12+1).
VERSION=$(dpkg-query -W -f='${Version}' linux-source-6.12 2>/dev/null) \
  || die "linux-source-6.12 is not installed (run scripts/host-deps.sh)"
# Downloaded before: the packages in the cache say it (no apt query: every tandem command
# asks this script for its key). Else the apt lists, by name prefix (apt-cache pkgnames, a
# tenth of a second where a regex search takes seconds).
ABI=
deb=$(ls "$DL"/linux-image-*-"$VARIANT"-unsigned_{"$VERSION","${VERSION//\~/%7e}"}_amd64.deb 2>/dev/null | head -n1 || true)
[ -z "$deb" ] || { ABI=$(basename "$deb"); ABI=${ABI#linux-image-}; ABI=${ABI%%-"$VARIANT"-unsigned_*}; }
if [ -z "$ABI" ]; then
  for p in $(apt-cache pkgnames linux-image-6.12. 2>/dev/null | grep -E "^linux-image-6\.12\.[0-9]+\+.*-$VARIANT-unsigned\$"); do
    if apt-cache madison "$p" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' | grep -qxF "$VERSION"; then
      ABI=${p#linux-image-}; ABI=${ABI%-"$VARIANT"-unsigned}
    fi
  done
fi
[ -n "$ABI" ] || die "no linux-image-6.12.*-$VARIANT-unsigned of version $VERSION (linux-source-6.12's) in the apt lists; run scripts/host-deps.sh"
PKGS=("linux-image-$ABI-$VARIANT-unsigned" "linux-headers-$ABI-$VARIANT" "linux-headers-$ABI-common" "linux-kbuild-$ABI")

KKEY=$({ echo "$VERSION $ABI"; sha256sum <"$SPEC"; sha256sum <"$SELF"; } | sha256sum | cut -c1-16)
KFINAL="$KDIR/$FLAVOR-$KKEY"
if [ "$MODE" = modules ]; then
  mapfile -t SOURCES < <(cd "$MODSRC" && find . -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild \) | LC_ALL=C sort)
  KEY=$({ echo "$KKEY"; for f in "${SOURCES[@]}"; do echo "$f"; sha256sum <"$MODSRC/$f"; done
          gcc --version | head -n1; echo "lkdtm=$LKDTM"; [ "$LKDTM" != yes ] || sha256sum <"$COMPAT"
        } | sha256sum | cut -c1-16)
  FINAL="$MDIR/$FLAVOR-$KEY"
else
  KEY=$KKEY FINAL=$KFINAL
fi
# TANDEM_KEY_ONLY=1: print the key these sources give and the file whose presence says
# that key's build is cached; build nothing (tandem doctor, setup/state.py).
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$FINAL/version"; exit 0; }

json() {   # OUT_JSON for this mode, from the finished directory
  python3 - "$MODE" "$OUT_JSON" "$FLAVOR" "$KEY" "$KKEY" "$FINAL" <<'PY'
import glob, hashlib, json, os, sys
mode, out, flavor, key, kkey, d = sys.argv[1:]
def sha(p):
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
version = open(os.path.join(d, "version")).read().strip()
if mode == "kernel":
    # No vmlinux: Debian keeps its DWARF in the -dbg package (1.8 GB); reports from this
    # kernel keep their addresses, and the assertions run on tandem's own kernels.
    j = {"flavor": flavor, "key": key, "bzImage": os.path.join(d, "bzImage"), "vmlinux": "",
         "system_map": os.path.join(d, "System.map"), "config": os.path.join(d, "config"),
         "bzImage_sha256": sha(os.path.join(d, "bzImage")), "version": version}
else:
    cpio = os.path.join(d, "modules.cpio.gz")
    j = {"flavor": flavor, "key": key, "kernel_key": kkey, "version": version,
         "modules": sorted(glob.glob(os.path.join(d, "*.ko"))),
         "builtin": sorted(glob.glob(os.path.join(d, "modules.builtin*"))),
         "cpio": cpio, "cpio_sha256": sha(cpio)}
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

fetch_kernel() {   # KFINAL, from the archive's packages
  mkdir -p "$DL" "$KDIR"
  local have=1 p
  for p in "${PKGS[@]}"; do ls "$DL/${p}_"*.deb >/dev/null 2>&1 || have=0; done
  if [ $have = 0 ]; then
    log "downloading Debian's kernel $ABI-$VARIANT ($VERSION: image, headers, kbuild; about 50 MB)"
    local spec=() tmp="$DL/.tmp-$$"
    for p in "${PKGS[@]}"; do spec+=("$p=$VERSION"); done
    rm -rf "$tmp"; mkdir -p "$tmp"
    # -o APT::Sandbox::User=root: _apt cannot write into a root-owned cache.
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "${spec[@]}" >/dev/null) \
      || { rm -rf "$tmp"; die "apt-get download ${spec[*]} failed"; }
    mv "$tmp"/*.deb "$DL/" && rm -rf "$tmp"
  fi
  local t="$KDIR/.tmp-$FLAVOR-$KKEY-$$" release
  rm -rf "$t"; mkdir -p "$t/root"
  for p in "${PKGS[@]}"; do dpkg-deb -x "$(ls "$DL/${p}_"*.deb | head -n1)" "$t/root"; done
  release="$ABI-$VARIANT"
  [ -d "$t/root/lib/modules/$release" ] || die "the image package has no lib/modules/$release"
  cp "$t/root/boot/vmlinuz-$release" "$t/bzImage"
  cp "$t/root/boot/System.map-$release" "$t/System.map"
  cp "$t/root/boot/config-$release" "$t/config"
  echo "$release" >"$t/version"
  # The headers' Makefile includes the common headers by their installed path: point it
  # at the unpacked ones.
  echo "include $KFINAL/root/usr/src/linux-headers-$ABI-common/Makefile" \
    >"$t/root/usr/src/linux-headers-$release/Makefile"
  rm -rf "$KFINAL"; mv -T "$t" "$KFINAL"
}

build_modules() {   # FINAL: tandem's modules against the headers, Debian's the guest needs
  local release t H root m ko dep n=0
  release=$(cat "$KFINAL/version")
  t="$MDIR/.tmp-$FLAVOR-$KEY-$$" H="$KFINAL/root/usr/src/linux-headers-$release"
  rm -rf "$t"; mkdir -p "$t/src" "$t/root/lib/modules/$release/boot" "$t/root/lib/modules/$release/extra"
  trap 'rm -rf "$t"' EXIT
  for f in "${SOURCES[@]}"; do install -D -m 0644 "$MODSRC/$f" "$t/src/$f"; done
  # No BTF for the modules (it needs pahole, which nothing else here does); Debian's
  # gcc-12 is the host's gcc on Debian 12.
  make -C "$H" M="$t/src" CONFIG_DEBUG_INFO_BTF_MODULES= CC=gcc modules >"$t/build.log" 2>&1 \
    || { tail -n 30 "$t/build.log" >&2; die "tandem's modules against $release failed (log above)"; }
  for ko in "$t/src"/*.ko; do
    [ "$(modinfo -F vermagic "$ko" | cut -d' ' -f1)" = "$release" ] || die "$(basename "$ko"): vermagic is not $release"
    cp "$ko" "$t/"
    strip --strip-debug -o "$t/root/lib/modules/$release/extra/$(basename "$ko")" "$ko"
  done
  local loaded=" "
  for m in "${WANT[@]}"; do
    ko=$(find "$KFINAL/root/lib/modules/$release/kernel" -name "$m.ko*" | head -n1)
    [ -n "$ko" ] || die "$SPEC: module $m is not in Debian's $release"
    n=$((n + 1))
    root="$t/root/lib/modules/$release/boot/$(printf '%02d' $n)-$m.ko"
    case $ko in *.xz) xz -dc "$ko" >"$root";; *) cp "$ko" "$root";; esac
    for dep in $(modinfo -F depends "$root" | tr ',' ' '); do
      case $loaded in *" $dep "*) ;; *) die "$SPEC: $m needs $dep loaded before it; list it first";; esac
    done
    loaded+="${m//-/_} $m "
  done
  if [ "$LKDTM" = yes ]; then
    # drivers/misc/lkdtm of the same source (linux-source-6.12 is this kernel's version),
    # with the one symbol such a kernel does not export (FLAVOR-lkdtm-compat.c).
    [ -f "$TARBALL" ] || die "kernel source $TARBALL missing (run scripts/host-deps.sh)"
    mkdir -p "$t/lkdtm"
    tar -xJf "$TARBALL" -C "$t/lkdtm" --wildcards --strip-components=4 '*/drivers/misc/lkdtm/*' \
      || die "no drivers/misc/lkdtm in $TARBALL"
    cp "$COMPAT" "$t/lkdtm/tandem_compat.c"
    echo 'lkdtm-m += tandem_compat.o' >>"$t/lkdtm/Makefile"
    make -C "$H" M="$t/lkdtm" CONFIG_LKDTM=m CONFIG_DEBUG_INFO_BTF_MODULES= CC=gcc modules >>"$t/build.log" 2>&1 \
      || { tail -n 30 "$t/build.log" >&2; die "LKDTM against $release failed (log above)"; }
    n=$((n + 1))
    strip --strip-debug -o "$t/root/lib/modules/$release/boot/$(printf '%02d' $n)-lkdtm.ko" "$t/lkdtm/lkdtm.ko"
  fi
  cp "$KFINAL/root/lib/modules/$release"/modules.builtin{,.modinfo} "$t/"
  find "$t/root" -exec touch -h -d @0 {} +
  (cd "$t/root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
     cpio -o -H newc --reproducible -R 0:0 --quiet) | gzip -n -9 >"$t/modules.cpio.gz"
  rm -rf "$t/root" "$t/src" "$t/lkdtm"
  echo "$release" >"$t/version"
  rm -rf "$FINAL"; mv -T "$t" "$FINAL"
  trap - EXIT
}

[ -f "$FINAL/version" ] && { json; exit 0; }
mkdir -p "$KDIR" "$MDIR"
exec 9>"$KDIR/.lock-$FLAVOR"
flock 9
if [ ! -f "$KFINAL/version" ]; then fetch_kernel; log "kernel $FLAVOR ready: Debian's $ABI-$VARIANT ($KFINAL)"; fi
if [ "$MODE" = modules ] && [ ! -f "$FINAL/version" ]; then
  progress "modules-$FLAVOR" "$(date +%s)" 0 0 -
  build_modules
  progress_end "modules-$FLAVOR"
  log "modules for kernel $FLAVOR ready: $FINAL"
fi
json
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
