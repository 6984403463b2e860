#!/usr/bin/env bash
# Make a Debian package of a built tandem kernel, to install it into a Debian guest as its
# distribution kernel (scripts/build-refvm.sh --tandem-kernel: the reference VM booting
# tandem's native kernel through its own GRUB).
#
#   scripts/build-kernel-deb.sh KERNEL_JSON MODULES_JSON OUT_DIR
#
# KERNEL_JSON and MODULES_JSON are a flavor's build/kernel-FLAVOR.json and
# build/modules-FLAVOR.json. Nothing is compiled: tandem's kernels have every driver built
# in and no loadable module but tandem_bugs, so the package is the built files, laid out
# as Debian's linux-image-RELEASE packages lay theirs out:
#   /boot/vmlinuz-RELEASE, /boot/System.map-RELEASE, /boot/config-RELEASE
#     (initramfs-tools reads the config: the initramfs is compressed with what the
#     kernel unpacks, gzip for tandem's kernels, where Debian's default is zstd)
#   /lib/modules/RELEASE/extra/*.ko            debug info stripped
#   /lib/modules/RELEASE/modules.builtin{,.modinfo}   when the modules build has them:
#     what is built in, so that modprobe and the initramfs's force_load of a built-in
#     driver (ext4, virtio_blk) succeed quietly instead of "module not found"
#   /lib/modules/RELEASE/modules.order   empty: the kernel has no in-tree modules (what
#     its modules_install would install; without it depmod warns on every run)
#   /usr/share/doc/linux-image-RELEASE/copyright
# and Debian's own maintainer scripts (linux-image-6.1.0-*-amd64's in bookworm, with this
# release put in): preinst marks a fresh install, postinst runs depmod, points /vmlinuz
# and /initrd.img at this kernel with linux-update-symlinks (a fresh install becomes the
# default) and runs the /etc/kernel/postinst.d hooks (initramfs-tools builds
# /boot/initrd.img-RELEASE there); prerm and postrm undo it. Depends as Debian's do:
# kmod, linux-base, initramfs-tools | linux-initramfs-tool.
#
# Package linux-image-RELEASE, version RELEASE-1+MODULES_KEY (the modules build's key
# covers the kernel's key, its image and the module sources: another build is another
# version). Reproducible: every file's time is SOURCE_DATE_EPOCH (the kernel build's own
# 1970-01-01 unless set), owners root:root (--root-owner-group), modes set here, and
# dpkg-deb sorts the archive's members. Prints the .deb's path.
# Measured: 4.1-4.3 s at load 6 for the native kernel, a 4.2 MB package; the
# same bytes every time (and in two reference VM builds).
set -euo pipefail
# The whole script is one function so bash parses it fully before running.
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }

[ $# -eq 3 ] || die "usage: $0 KERNEL_JSON MODULES_JSON OUT_DIR"
KJSON=$1
MJSON=$2
OUT=$3
for t in dpkg-deb strip python3 install; do
  command -v "$t" >/dev/null || die "$t not found (scripts/host-deps.sh installs it)"
done
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}

# Shell assignments from the two JSONs, each value quoted, checked to be one kernel's.
vars=$(python3 - "$KJSON" "$MJSON" <<'PY'
import json, shlex, sys
k, m = (json.load(open(p)) for p in sys.argv[1:])
if k["version"] != m["version"]:
    sys.exit(f"tandem: error: kernel {k['version']} but modules for {m['version']}")
if m.get("kernel_key", k["key"]) != k["key"]:
    sys.exit(f"tandem: error: modules built for kernel {m['kernel_key']}, not {k['key']}")
v = {"RELEASE": k["version"], "FLAVOR": k["flavor"], "KKEY": k["key"], "MKEY": m["key"],
     "BZIMAGE": k["bzImage"], "SYSMAP": k["system_map"], "KCONFIG": k["config"]}
print(" ".join(f"{n}={shlex.quote(s)}" for n, s in v.items()))
print("MODULES=(" + " ".join(shlex.quote(p) for p in m.get("modules", [])) + ")")
print("BUILTIN=(" + " ".join(shlex.quote(p) for p in m.get("builtin", [])) + ")")
PY
) || die "cannot read $KJSON and $MJSON as one kernel's builds"
eval "$vars"
case $RELEASE in *[!A-Za-z0-9.+_-]*|"") die "bad kernel release '$RELEASE'";; esac
PKG="linux-image-$RELEASE"
VERSION="$RELEASE-1+$MKEY"
DEB="$OUT/${PKG}_${VERSION}_amd64.deb"

mkdir -p "$OUT"
T="$OUT/.deb-$$"
rm -rf "$T"
trap 'rm -rf "$T"' EXIT
P="$T/pkg"
install -d -m 0755 "$P/DEBIAN" "$P/boot" "$P/lib/modules/$RELEASE/extra" "$P/usr/share/doc/$PKG"
install -m 0644 "$BZIMAGE" "$P/boot/vmlinuz-$RELEASE"
install -m 0644 "$SYSMAP" "$P/boot/System.map-$RELEASE"
install -m 0644 "$KCONFIG" "$P/boot/config-$RELEASE"
for ko in "${MODULES[@]}"; do
  strip --strip-debug -o "$P/lib/modules/$RELEASE/extra/$(basename "$ko")" "$ko"
  chmod 0644 "$P/lib/modules/$RELEASE/extra/$(basename "$ko")"
done
for f in "${BUILTIN[@]}"; do install -m 0644 "$f" "$P/lib/modules/$RELEASE/$(basename "$f")"; done
install -m 0644 /dev/null "$P/lib/modules/$RELEASE/modules.order"
cat >"$P/usr/share/doc/$PKG/copyright" <<EOF
Linux $RELEASE, as built by tandem (guest-kernel/linux/: Linux 6.12 from Debian's
linux-source-6.12, configured with base.config and $FLAVOR.config), and tandem's guest
kernel modules (guest-kernel/modules/).

License: GPL-2
 On Debian systems, the complete text of the GNU General Public License version 2
 can be found in /usr/share/common-licenses/GPL-2.
EOF
chmod 0644 "$P/usr/share/doc/$PKG/copyright"

# Debian's maintainer scripts for its kernel images, with this release.
script() {
  printf '#!/bin/sh -e\n\nversion=%s\nimage_path=/boot/vmlinuz-$version\n\n' "$RELEASE" >"$P/DEBIAN/$1"
  cat >>"$P/DEBIAN/$1"
  printf '\nexit 0\n' >>"$P/DEBIAN/$1"
  chmod 0755 "$P/DEBIAN/$1"
}
script preinst <<'EOF'
if [ "$1" = abort-upgrade ]; then
    exit 0
fi

if [ "$1" = install ]; then
    # Create a flag file for postinst
    mkdir -p /lib/modules/$version
    touch /lib/modules/$version/.fresh-install
fi

if [ -d /etc/kernel/preinst.d ]; then
    DEB_MAINT_PARAMS="$*" run-parts --report --exit-on-error --arg=$version \
	      --arg=$image_path /etc/kernel/preinst.d
fi
EOF
script postinst <<'EOF'
if [ "$1" != configure ]; then
    exit 0
fi

depmod $version

if [ -f /lib/modules/$version/.fresh-install ]; then
    change=install
else
    change=upgrade
fi
linux-update-symlinks $change $version $image_path
rm -f /lib/modules/$version/.fresh-install

if [ -d /etc/kernel/postinst.d ]; then
    DEB_MAINT_PARAMS="$*" run-parts --report --exit-on-error --arg=$version \
	      --arg=$image_path /etc/kernel/postinst.d
fi
EOF
script prerm <<'EOF'
if [ "$1" != remove ]; then
    exit 0
fi

linux-check-removal $version

if [ -d /etc/kernel/prerm.d ]; then
    DEB_MAINT_PARAMS="$*" run-parts --report --exit-on-error --arg=$version \
	      --arg=$image_path /etc/kernel/prerm.d
fi
EOF
script postrm <<'EOF'
rm -f /lib/modules/$version/.fresh-install

if [ "$1" != upgrade ] && command -v linux-update-symlinks >/dev/null; then
    linux-update-symlinks remove $version $image_path
fi

if [ -d /etc/kernel/postrm.d ]; then
    DEB_MAINT_PARAMS="$*" run-parts --report --exit-on-error --arg=$version \
	      --arg=$image_path /etc/kernel/postrm.d
fi

if [ "$1" = purge ]; then
    for extra_file in modules.dep modules.isapnpmap modules.pcimap \
                      modules.usbmap modules.parportmap \
                      modules.generic_string modules.ieee1394map \
                      modules.ieee1394map modules.pnpbiosmap \
                      modules.alias modules.ccwmap modules.inputmap \
                      modules.symbols modules.ofmap \
                      modules.seriomap modules.\*.bin \
		      modules.softdep modules.devname; do
	eval rm -f /lib/modules/$version/$extra_file
    done
    rmdir /lib/modules/$version || true
fi
EOF

# control and md5sums: Installed-Size as dpkg-gencontrol counts it (each file's size in
# KiB rounded up, 1 for anything else).
python3 - "$P" "$PKG" "$VERSION" "$RELEASE" "$FLAVOR" <<'PY'
import hashlib, os, sys
root, pkg, version, release, flavor = sys.argv[1:]
size, sums = 0, []
for d, dirs, files in os.walk(root):
    dirs.sort()
    rel = os.path.relpath(d, root)
    if rel.split(os.sep)[0] == "DEBIAN":
        continue
    size += 1
    for f in sorted(files):
        p = os.path.join(d, f)
        size += (os.path.getsize(p) + 1023) // 1024
        with open(p, "rb") as fh:
            sums.append(f"{hashlib.md5(fh.read()).hexdigest()}  {os.path.relpath(p, root)}\n")
series = ".".join(release.split(".")[:2])
control = f"""Package: {pkg}
Source: linux-tandem
Version: {version}
Architecture: amd64
Maintainer: tandem <tandem@localhost>
Installed-Size: {size}
Depends: kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool
Section: kernel
Priority: optional
Description: Linux {series} for tandem's guests ({flavor} flavor)
 Linux {release}, tandem's {flavor} guest kernel: its drivers built in, and
 tandem_bugs, the planted-bug module of tandem's tests (docs/planted-bugs.md).
 For a Debian guest that boots tandem's kernel as its own, through its own
 bootloader.
"""
with open(os.path.join(root, "DEBIAN/control"), "w") as f:
    f.write(control)
with open(os.path.join(root, "DEBIAN/md5sums"), "w") as f:
    f.writelines(sums)
for n in ("control", "md5sums"):
    os.chmod(os.path.join(root, "DEBIAN", n), 0o644)
PY

find "$P" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
# xz on one thread: the archive does not depend on the host's core count.
dpkg-deb --root-owner-group -Zxz --threads-max=1 --build "$P" "$T/pkg.deb" >/dev/null \
  || die "dpkg-deb could not build $PKG"
mv -f "$T/pkg.deb" "$DEB"
echo "$DEB"
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
