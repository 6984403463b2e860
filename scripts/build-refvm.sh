#!/usr/bin/env bash
# Build the reference ordinary VM: a Debian 12 disk image that stands for "the user's VM"
# in tests, benchmarks and `./tandem demo --guest debian`. Nothing of tandem
# is inside it; or, as a variant, tandem's own kernel is its distribution kernel.
#
#   scripts/build-refvm.sh OUT_JSON
#   scripts/build-refvm.sh --tandem-kernel KERNEL_JSON MODULES_JSON OUT_JSON
#
# Result: ${TANDEM_CACHE:-~/.cache/tandem}/refvm/KEY/ with
#   disk.qcow2   2 GiB disk: MBR, one ext4 partition (the root), GRUB for BIOS boot
#   vmlinuz      the guest's own kernel, for a direct boot of the same disk
#   initrd.img   the guest's own initramfs
#   refvm.json   what OUT_JSON says (with paths relative to this directory)
# The guest: bookworm with systemd, Debian's kernel (linux-image-amd64) and GRUB (from
# the guest's own grub-pc-bin), systemd-networkd doing DHCP on any en*/eth* NIC, nginx-light
# serving a static site (index.html and 1 KiB, 64 KiB, 1 MiB, 4 MiB files generated from
# fixed seeds) on port 80 and proxying /backend/ to the host's port 18081, redis-server on
# all addresses port 6379 (protected mode off: a test VM on user networking), a serial getty on ttyS0 (console=ttyS0). No root password.
#
# How, without loop mounts: mmdebstrap into a directory, `mkfs.ext4 -d` of that directory
# into a file, a partition table written into the disk file by sfdisk, the filesystem
# dd'ed at the partition's offset, GRUB's boot.img (first 440 bytes) into the MBR and a
# core.img made by the guest's grub-mkimage at sector 1 (boot.img's kernel_sector is 1 by
# default and grub-mkimage fills diskboot's blocklist length: no grub-install).
#
# Reproducible: fixed filesystem UUID and hash seed, MBR label id and machine-id, every
# inode's times at SOURCE_DATE_EPOCH or before, mkfs's own times faked, apt's partial
# directories owned as apt leaves them whatever the cache's path. Seven cold builds within
# an hour (five keys; under /root/.cache and under /tmp; the last two with no grub-pc-bin on
# the host) gave byte-identical disks (inode times and apt's owners differ between
# builds unless fixed). What varies: the package versions, as Debian updates
# bookworm (only deb.debian.org is reachable here: no snapshot.debian.org to pin a
# date), so builds on different days may differ; the JSON names the versions of the
# kernel, systemd, nginx, redis and GRUB it got.
# KEY = sha256(this script without its comment lines, the versions of mmdebstrap,
# e2fsprogs, fdisk and qemu-utils on the host)[:16]: a comment (these figures) does not
# cost a 1-4 min rebuild from the network. It does not cover the bookworm archive's
# state: a cached build is used until this script's code or those tools change.
#
# Measured on this 2-core machine shared with other jobs (TCG: its /dev/kvm cannot boot
# stock kernels; docs/guests.md has the details):
#   cold build 66 s at load 3 (mmdebstrap 36 s of it), 143 s at load 5 (111 s), 198-230 s
#   at load 6-7, 249-260 s for two at once at load 9; cached 0.4 s (3.4 s through
#   ./tandem build refvm);
#   disk.qcow2 238.6 MB for 2 GiB (721 MB as uncompressed qcow2), root 15418 inodes and
#   752 MiB used, vmlinuz 8.2 MB, initrd.img 7.0 MB;
#   power-on to nginx answering under -icount shift=2: through GRUB 45 s at load 2.5,
#   51 s at load 3.7 (12-13 s of it GRUB reading the kernel and initrd through the BIOS,
#   compressed or not), 55 s at load 6, 117 s at load 8; directly 29-32 s at load 3.2,
#   51 s at load 7;
#   about 29 s of guest time either way; ACPI power-off to QEMU's exit 1.2-4.8 s.
#
# --tandem-kernel (meson target refvm-tandem; for a bug in the guest's own kernel
# reached by an ordinary client): the same VM with tandem's kernel installed as its
# distribution kernel. KERNEL_JSON and MODULES_JSON are a flavor's build/kernel-FLAVOR.json
# and build/modules-FLAVOR.json (native's, from meson); scripts/build-kernel-deb.sh makes
# them a Debian package, linux-image-RELEASE, which mmdebstrap installs instead of
# linux-image-amd64 (not installed: the disk has no other kernel to boot). Its maintainer
# scripts are Debian's: depmod, the initramfs made by initramfs-tools' postinst.d hook
# (gzip: what tandem's kernels unpack), /vmlinuz and /initrd.img pointed at it by
# linux-update-symlinks, which the same grub.cfg boots. tandem_bugs is loaded at boot
# (/etc/modules-load.d) with udp_port=4444 (/etc/modprobe.d): a datagram to that port
# is a planted-bug command (docs/planted-bugs.md, "From the network"). Result in
# ${TANDEM_CACHE:-~/.cache/tandem}/refvm-tandem/KEY/ with the .deb beside the disk; the
# JSON says what refvm.json says (kernel_release: tandem's) and udp_port, kernel_key,
# modules_key, deb. KEY covers also the kernel's and modules' keys and the code of
# build-kernel-deb.sh. Measured (docs/guests.md): cold build 151-192 s at load 6-7 (the
# package about 4 s of it), two of them byte-identical (one under /root/.cache, one
# under /work/scratch); disk.qcow2 121.2 MB (root 357 MiB used: no Debian kernel and its
# modules), vmlinuz 3.95 MB, initrd.img 6.1 MB; through GRUB to nginx in 11.0 s of guest
# time under -icount shift=2 (Debian's xz kernel: about 29 s).
set -euo pipefail
# The whole script is one function so bash parses it fully before running: editing
# this file while a build runs cannot corrupt that build.
main() {

die() { echo "tandem: error: $*" >&2; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/progress.sh"
log() { echo "tandem: $*" >&2; }

TK_KJSON=
TK_MJSON=
NAME=refvm               # its cache directory and progress name
WITH_KERNEL=             # said in the log and GRUB's menu
if [ "${1:-}" = --tandem-kernel ]; then
  [ $# -eq 4 ] || die "usage: $0 --tandem-kernel KERNEL_JSON MODULES_JSON OUT_JSON"
  TK_KJSON=$2
  TK_MJSON=$3
  NAME=refvm-tandem
  WITH_KERNEL=", with the tandem kernel"   # no quote: GRUB's menu title is in single quotes
  shift 3
fi
[ $# -eq 1 ] || die "usage: $0 [--tandem-kernel KERNEL_JSON MODULES_JSON] OUT_JSON"
OUT_JSON=$1

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
RDIR="$CACHE/$NAME"
MIRROR=http://deb.debian.org
SUITE=bookworm
# dbus: systemd-logind needs it, and logind is what powers off on ACPI's power button
# (without it system_powerdown is ignored: tried). e2fsprogs: the initramfs checks the
# root before mounting it (without fsck.ext4 it warns and sleeps 5 s: measured).
PACKAGES=systemd-sysv,udev,dbus,e2fsprogs,linux-image-amd64,initramfs-tools,zstd,grub-pc-bin,nginx-light,redis-server
DISTRO_KERNEL=linux-image-amd64
# --tandem-kernel: the port tandem_bugs listens on, and no Debian kernel.
UDP_PORT=4444
if [ -n "$TK_KJSON" ]; then
  # (and the package's dependencies, which linux-image-amd64 pulled in before)
  PACKAGES=${PACKAGES/$DISTRO_KERNEL,/kmod,linux-base,}
  DISTRO_KERNEL=
fi
HOST_TOOLS=(mmdebstrap e2fsprogs fdisk qemu-utils)
# Fixed identities: the same disk boots the same way, and GRUB's and the kernel's
# command lines are known before the image exists.
UUID=2f6e1c8a-5b3d-4e7a-9c21-7d4b8e0f6a13
LABEL_ID=0x7a6e6431
MACHINE_ID=5e7a4d2c9b8f4a61a3c0d1e2f3a4b5c6
export SOURCE_DATE_EPOCH=1735689600      # 2025-01-01T00:00:00Z
DISK_MIB=2048                            # the partition starts at 1 MiB and fills the rest
ROOT_ARG="root=UUID=$UUID"
export DATA_LABEL=tandem-data            # a second disk's ext4 with this label...
export DATA_MOUNT=/srv/data              # ...mounted here...
export DATA_LOG=$DATA_MOUNT/nginx-access.log   # ...where nginx logs every request too
export BACKEND_PORT=18081                # nginx's /backend/ goes to this port of the host
CMDLINE="$ROOT_ARG ro console=ttyS0"

for t in mmdebstrap mkfs.ext4 debugfs dumpe2fs e2fsck sfdisk qemu-img dd chroot dpkg-query python3 sha256sum flock; do
  command -v "$t" >/dev/null || die "$t not found (scripts/host-deps.sh installs it)"
done
mkdir -p "$RDIR"

TK_KEYS=
if [ -n "$TK_KJSON" ]; then
  # The kernel's and the modules' keys (the modules' covers the kernel's image and the
  # module sources), read from their JSONs: what the package is made from.
  TK_KEYS=$(python3 -c 'import json,sys; print(*(json.load(open(p))["key"] for p in sys.argv[1:]))' \
            "$TK_KJSON" "$TK_MJSON") || die "cannot read the keys of $TK_KJSON and $TK_MJSON"
  TK_RELEASE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$TK_KJSON")
fi
KEY=$({
  grep -v '^[[:space:]]*#' "$SELF" | sha256sum
  dpkg-query -W -f='${Package} ${Version}\n' "${HOST_TOOLS[@]}"
  if [ -n "$TK_KJSON" ]; then
    echo "tandem kernel and modules: $TK_KEYS"
    grep -v '^[[:space:]]*#' "$HERE/build-kernel-deb.sh" | sha256sum
  fi
} | sha256sum | cut -c1-16)
FINAL="$RDIR/$KEY"
# TANDEM_KEY_ONLY=1: print the key these sources give and the file whose presence says
# the build of that key is cached; build nothing (tandem doctor, setup/state.py).
[ -z "${TANDEM_KEY_ONLY:-}" ] || { echo "$KEY"; echo "$FINAL/refvm.json"; exit 0; }

write_json() {
  python3 - "$OUT_JSON" "$FINAL" <<'PY'
import json, os, sys
out, d = sys.argv[1:]
with open(os.path.join(d, "refvm.json")) as f:
    j = json.load(f)
for name in ("disk", "kernel", "initrd", "deb"):
    if name in j:
        j[name] = os.path.join(d, j[name])
tmp = out + ".tmp%d" % os.getpid()
with open(tmp, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
os.replace(tmp, out)
PY
}

if [ -f "$FINAL/refvm.json" ]; then write_json; exit 0; fi
[ "$(id -u)" = 0 ] || die "the reference VM build needs root (mmdebstrap --mode=root, chroot)"
exec 9>"$RDIR/.lock"
flock 9
if [ -f "$FINAL/refvm.json" ]; then write_json; exit 0; fi

log "building the reference VM$WITH_KERNEL $KEY (Debian $SUITE from $MIRROR; 1-4 min)..."
TMP="$RDIR/.tmp-$KEY-$$"
rm -rf "$TMP"
mkdir -p "$TMP/out"
BUILD_LOG="$TMP/out/build.log"
trap 'rm -rf "$TMP"; progress_end "$NAME"' EXIT
# Progress in tenths of the whole, each step weighted by its share of a cold build's time
# (measured: see the header), so the launcher's estimate of what is left holds.
START=$(date +%s)
step() {
  progress "$NAME" "$START" "$1" 10 tenths
  echo "tandem: $(( $(date +%s) - START )) s: $2" >>"$BUILD_LOG"
}
step 0 "mmdebstrap"

fail() {
  echo "tandem: refvm build failed: $1; last lines of its log:" >&2
  tail -n 30 "$BUILD_LOG" >&2
  exit 1
}
run() { "$@" >>"$BUILD_LOG" 2>&1 || fail "$*"; }

# --- what goes into the root besides Debian's packages --------------------------------
# Written before mmdebstrap and copied in by its hooks: the initramfs configuration
# before the kernel's package builds the initramfs (once, small), the rest at the end.
OV="$TMP/overlay"          # copied in after all packages are installed
IOV="$TMP/initramfs"       # copied in before the kernel is installed
mkdir -p "$IOV/etc/initramfs-tools/conf.d" "$IOV/etc/initramfs-tools/hooks"
# Debian's default (MODULES=most) makes a 36 MB initramfs; this one holds the disk
# drivers QEMU offers (virtio-blk/-scsi, IDE, AHCI: udev in the initramfs loads those
# present) and ext4: 7 MB with gzip, less with zstd (measured).
cat >"$IOV/etc/initramfs-tools/conf.d/refvm.conf" <<'EOF'
# tandem reference VM: only the modules listed by hooks/refvm-modules.
MODULES=list
RESUME=none
FSTYPE=ext4
EOF
cat >"$IOV/etc/initramfs-tools/hooks/refvm-modules" <<'EOF'
#!/bin/sh
# tandem reference VM: the root's disk drivers (loaded by udev when present) and ext4.
case "$1" in prereqs) exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules virtio_pci virtio_blk virtio_scsi sd_mod ata_piix ahci
force_load ext4
EOF
chmod 0755 "$IOV/etc/initramfs-tools/hooks/refvm-modules"

TK_HOOKS=()
if [ -n "$TK_KJSON" ]; then
  # tandem's kernel unpacks a gzip initramfs only (CONFIG_RD_GZIP): said here, where
  # mkinitramfs would otherwise fall back from zstd to gzip with a warning.
  echo "COMPRESS=gzip" >>"$IOV/etc/initramfs-tools/conf.d/refvm.conf"
  DEB=$(bash "$HERE/build-kernel-deb.sh" "$TK_KJSON" "$TK_MJSON" "$TMP/out" 2>>"$BUILD_LOG") ||
    fail "the Debian package of tandem's kernel"
  # Installed by dpkg in the root once apt has installed the rest, its dependencies with
  # it (PACKAGES). Not --include=PATH: apt would hand dpkg the host's path, which
  # mmdebstrap's hook for that bind-mounts into the root, leaving the build's temporary
  # directories (a PID in their name) in the image.
  TK_HOOKS=(--customize-hook="copy-in $DEB /tmp"
            --customize-hook="chroot \"\$1\" dpkg -i /tmp/$(basename "$DEB") && rm \"\$1/tmp/$(basename "$DEB")\"")
fi

mkdir -p "$OV/etc/systemd/network" "$OV/etc/systemd/system/systemd-networkd-wait-online.service.d" \
  "$OV/boot/grub" "$OV/var/www/html"
if [ -n "$TK_KJSON" ]; then
  mkdir -p "$OV/etc/modules-load.d" "$OV/etc/modprobe.d"
  printf '# tandem reference VM: the planted-bug module of tandem'"'"'s kernel (docs/planted-bugs.md)\ntandem_bugs\n' \
    >"$OV/etc/modules-load.d/tandem_bugs.conf"
  printf '# tandem reference VM: each UDP datagram to this port is a tandem_bugs command\noptions tandem_bugs udp_port=%s\n' \
    "$UDP_PORT" >"$OV/etc/modprobe.d/tandem_bugs.conf"
fi
echo refvm >"$OV/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\trefvm\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$OV/etc/hosts"
echo "nameserver 10.0.2.3" >"$OV/etc/resolv.conf"        # QEMU user networking's DNS
echo "$MACHINE_ID" >"$OV/etc/machine-id"
# A data disk, if the VM is given one (a second disk with an ext4 labelled $DATA_LABEL):
# mounted at $DATA_MOUNT, where nginx logs every request too; without it the boot goes on
# (nofail) and the log lands on the root in $DATA_MOUNT.
cat >"$OV/etc/fstab" <<EOF
UUID=$UUID / ext4 errors=remount-ro 0 1
LABEL=$DATA_LABEL $DATA_MOUNT ext4 nofail,x-systemd.device-timeout=10s 0 2
EOF
mkdir -p "$OV$DATA_MOUNT" "$OV/etc/nginx/conf.d"
echo "access_log $DATA_LOG;" >"$OV/etc/nginx/conf.d/refvm-data.conf"
# Debian's default site without its comments, and a backend the guest connects to
# itself: /backend/ is proxied to port $BACKEND_PORT of the host (QEMU user networking's
# 10.0.2.2), a connection the guest opens (answered from the recording when the
# recording is replayed). Nothing listens there unless a test starts it: 502 otherwise.
cat >"$TMP/nginx-site" <<EOF
server {
	listen 80 default_server;
	listen [::]:80 default_server;
	root /var/www/html;
	index index.html;
	server_name _;
	location /backend/ {
		proxy_pass http://10.0.2.2:$BACKEND_PORT/;
	}
	location / {
		try_files \$uri \$uri/ =404;
	}
}
EOF
cat >"$OV/etc/systemd/network/20-wired.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
# IPv6 as networkd has it by default (link-local addresses, router advertisements):
# an ordinary guest's neighbour discovery and MLD reports are on the recorded wire.
EOF
# Wait for any one NIC, not all: a second NIC on another network must not hold nginx
# (After=network-online.target) for wait-online's 2 minutes.
cat >"$OV/etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=30
EOF
cat >"$OV/boot/grub/grub.cfg" <<EOF
# tandem reference VM (scripts/build-refvm.sh): boot at once, GRUB on the serial line.
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set timeout=0
set default=0
menuentry 'Debian GNU/Linux 12 (tandem reference VM$WITH_KERNEL)' {
  linux /vmlinuz $CMDLINE
  initrd /initrd.img
}
EOF
# GRUB's first config, inside core.img: find the root by its UUID (not "the first
# disk": a second disk may come first in the BIOS order), then load normal from it.
printf 'search.fs_uuid %s root hd0,msdos1\nset prefix=($root)/boot/grub\n' "$UUID" >"$TMP/early.cfg"
# The static site: content from fixed seeds (SHAKE-256), sizes up to a few MiB.
python3 - "$OV/var/www/html" <<'PY'
import hashlib, os, sys
d = sys.argv[1]
files = [("1k.bin", 1 << 10), ("64k.bin", 64 << 10), ("1m.bin", 1 << 20), ("4m.bin", 4 << 20)]
for name, size in files:
    with open(os.path.join(d, name), "wb") as f:
        f.write(hashlib.shake_256(f"tandem refvm site {name}".encode()).digest(size))
links = "\n".join(f'<li><a href="/{n}">{n}</a> ({s} bytes)</li>' for n, s in files)
with open(os.path.join(d, "index.html"), "w") as f:
    f.write("<!DOCTYPE html>\n<html><head><title>tandem reference VM</title></head>\n"
            f"<body><h1>tandem reference VM</h1>\n<ul>\n{links}\n</ul></body></html>\n")
PY

# --- the root: Debian bookworm ----------------------------------------------------------
R="$TMP/root"
# Off: timers that would run apt, dpkg's backup, fstrim or e2scrub in the middle of a
# recording; pstore; the getty on tty1 (no display: the serial getty is the console).
UNITS_OFF="apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer e2scrub_all.timer \
e2scrub_reap.service man-db.timer systemd-pstore.service"
mmdebstrap --mode=root --variant=apt --include="$PACKAGES" "${TK_HOOKS[@]}" \
  --essential-hook="sync-in $IOV /" \
  --customize-hook="sync-in $OV /" \
  --customize-hook='sed -i -e "s/^bind .*/bind * -::*/" -e "s/^protected-mode yes/protected-mode no/" "$1/etc/redis/redis.conf"' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd.service' \
  --customize-hook="for u in $UNITS_OFF; do [ ! -e \"\$1/lib/systemd/system/\$u\" ] || chroot \"\$1\" systemctl disable \"\$u\"; done" \
  --customize-hook='chroot "$1" systemctl disable getty@tty1.service' \
  --customize-hook='chroot "$1" chown _apt:root /var/cache/apt/archives/partial /var/lib/apt/lists/partial' \
  --customize-hook='rm -f "$1/var/www/html/index.nginx-debian.html" "$1/vmlinuz.old" "$1/initrd.img.old"' \
  --customize-hook="cp $TMP/nginx-site \"\$1/etc/nginx/sites-available/default\"" \
  --customize-hook='mkdir -p "$1/boot/grub/i386-pc" && cp "$1"/usr/lib/grub/i386-pc/*.mod "$1"/usr/lib/grub/i386-pc/*.lst "$1/boot/grub/i386-pc/"' \
  --customize-hook="copy-in $TMP/early.cfg /tmp" \
  --customize-hook='chroot "$1" grub-mkimage -O i386-pc -o /boot/grub/i386-pc/core.img -c /tmp/early.cfg -p /boot/grub biosdisk part_msdos ext2 search_fs_uuid normal linux serial terminal && rm "$1/tmp/early.cfg"' \
  "$SUITE" "$R" \
  "deb $MIRROR/debian $SUITE main" "deb $MIRROR/debian $SUITE-updates main" \
  "deb $MIRROR/debian-security $SUITE-security main" >>"$BUILD_LOG" 2>&1 ||
  fail "mmdebstrap could not make the Debian root (is $MIRROR reachable?)"
# mmdebstrap's reproducibility cleanup empties /etc/machine-id (a first boot would then
# run `systemctl preset-all` and undo the units set above): a fixed one instead.
echo "$MACHINE_ID" >"$R/etc/machine-id"
[ -f "$R/vmlinuz" ] && [ -f "$R/initrd.img" ] || die "the root has no /vmlinuz or /initrd.img (linux-image-amd64 not installed?)"
if [ -n "$TK_KJSON" ]; then
  # What the package's maintainer scripts were to do: the default kernel, its initramfs
  # (gzip), the module known to depmod; and no other kernel.
  [ "$(readlink "$R/vmlinuz")" = "boot/vmlinuz-$TK_RELEASE" ] || die "/vmlinuz is not tandem's kernel: $(readlink "$R/vmlinuz")"
  [ "$(readlink "$R/initrd.img")" = "boot/initrd.img-$TK_RELEASE" ] || die "/initrd.img is not tandem's kernel's"
  gzip -t "$R/initrd.img" 2>/dev/null || die "the initramfs is not gzip (tandem's kernel unpacks no other)"
  grep -q '^extra/tandem_bugs.ko:' "$R/lib/modules/$TK_RELEASE/modules.dep" || die "depmod did not list tandem_bugs"
  others=$(cd "$R/boot" && ls vmlinuz-* | grep -v -x "vmlinuz-$TK_RELEASE" || true)
  [ -z "$others" ] || die "another kernel is installed: $others"
fi
CORE="$R/boot/grub/i386-pc/core.img"
core_bytes=$(stat -c %s "$CORE")
[ "$core_bytes" -le $((2047 * 512)) ] || die "core.img is $core_bytes bytes: more than the 1 MiB gap before the partition"

# --- what the JSON says about the root ----------------------------------------------------
step 6 "the JSON, the kernel and initrd copied out"
DISTRO_KERNEL=$DISTRO_KERNEL TK_KEYS=$TK_KEYS TK_UDP_PORT=${TK_KJSON:+$UDP_PORT} TK_DEB=${TK_KJSON:+$(basename "${DEB:-}")} \
python3 - "$R" "$TMP/out/refvm.json" "$KEY" "$ROOT_ARG" "$CMDLINE" <<'PY'
import glob, hashlib, json, os, subprocess, sys
root, out, key, root_arg, cmdline = sys.argv[1:]
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
release = os.path.basename(os.path.realpath(os.path.join(root, "vmlinuz")))[len("vmlinuz-"):]
def version(pkg):
    r = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Version}", pkg],
                       capture_output=True, text=True, check=True)
    return r.stdout
html = os.path.join(root, "var/www/html")
site = [{"path": "/" + n, "bytes": os.path.getsize(os.path.join(html, n)), "sha256": sha(os.path.join(html, n))}
        for n in sorted(os.listdir(html))]
j = {"key": key, "disk": "disk.qcow2", "disk_format": "qcow2",
     "kernel": "vmlinuz", "initrd": "initrd.img", "kernel_release": release,
     "root": root_arg, "cmdline": cmdline,
     "services": {"http": 80, "redis": 6379},
     "backend": {"path": "/backend/", "host_port": int(os.environ["BACKEND_PORT"])},
     "data_disk": {"label": os.environ["DATA_LABEL"], "mount": os.environ["DATA_MOUNT"], "log": os.environ["DATA_LOG"]},
     "packages": {p: version(p) for p in (f"linux-image-{release}", os.environ["DISTRO_KERNEL"], "systemd",
                                          "nginx-light", "redis-server", "grub-pc-bin") if p},
     "site": site}
if os.environ["TK_UDP_PORT"]:       # --tandem-kernel
    j["kernel_key"], j["modules_key"] = os.environ["TK_KEYS"].split()
    j["udp_port"] = int(os.environ["TK_UDP_PORT"])
    j["deb"] = os.environ["TK_DEB"]
with open(out, "w") as f:
    json.dump(j, f, indent=2)
PY
cp "$R/vmlinuz" "$TMP/out/vmlinuz"
cp "$R/initrd.img" "$TMP/out/initrd.img"
cp "$R/usr/lib/grub/i386-pc/boot.img" "$TMP/boot.img"
cp "$CORE" "$TMP/core.img"

# --- the disk -------------------------------------------------------------------------------
step 6 "the filesystem"
# Every file's time at most SOURCE_DATE_EPOCH: the filesystem's inodes do not carry the
# build's date.
find "$R" -xdev -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
# GRUB 2.06 reads no filesystem with metadata_csum_seed (incompat): off, and orphan_file
# with it (Debian's bookworm defaults, said explicitly).
FS="$TMP/root.ext4"
run env E2FSPROGS_FAKE_TIME="$SOURCE_DATE_EPOCH" mkfs.ext4 -q -F -L refvm-root -U "$UUID" \
  -O ^metadata_csum_seed,^orphan_file -E hash_seed="$UUID",lazy_itable_init=0,lazy_journal_init=0 \
  -d "$R" "$FS" "$((DISK_MIB - 1))M"
# mkfs -d copies each file's ctime (the build's time: no tool sets it) and atime (the
# build reads files): both set to SOURCE_DATE_EPOCH in every inode it made. It allocates
# them in order after the reserved ones, so they are first_ino+1 .. the count in use.
# Two cold builds then differed in nothing else (compared file by file and byte by byte).
used=$(dumpe2fs -h "$FS" 2>/dev/null | awk -F: '/^Inode count/ {n = $2} /^Free inodes/ {f = $2} END {print n - f}')
first=$(dumpe2fs -h "$FS" 2>/dev/null | awk -F: '/^First inode/ {print $2 + 1}')
seq "$first" "$used" | awk -v t="@$SOURCE_DATE_EPOCH" '{print "sif <" $1 "> ctime " t; print "sif <" $1 "> atime " t}' \
  >"$TMP/times.debugfs"
# (debugfs echoes each command: 31k lines kept out of the log; its complaints stay in it)
env E2FSPROGS_FAKE_TIME="$SOURCE_DATE_EPOCH" debugfs -w -f "$TMP/times.debugfs" "$FS" >/dev/null 2>>"$BUILD_LOG" ||
  fail "debugfs could not set the inode times of the root filesystem"
run e2fsck -fn "$FS"
rm -rf "$R"
step 8 "the disk"
RAW="$TMP/disk.raw"
truncate -s "${DISK_MIB}M" "$RAW"
printf 'label: dos\nlabel-id: %s\nunit: sectors\n\nstart=2048, type=83, bootable\n' "$LABEL_ID" >"$TMP/table"
run sfdisk --no-reread --no-tell-kernel "$RAW" <"$TMP/table"
run dd if="$FS" of="$RAW" bs=1M seek=1 conv=notrunc,sparse status=none
rm -f "$FS"
# boot.img's first 440 bytes (its code; the disk signature and partition table stay
# sfdisk's) into the MBR, core.img from sector 1: the sectors boot.img and diskboot.img
# load by default (grub-install would patch the same defaults in).
run dd if="$TMP/boot.img" of="$RAW" bs=440 count=1 conv=notrunc status=none
run dd if="$TMP/core.img" of="$RAW" bs=512 seek=1 conv=notrunc status=none
step 9 "qcow2"
# Compressed (-c): 238.6 MB instead of 721 MB, and not slower to boot: GRUB reached the
# kernel in 13.0 s from either at load 2.8; to nginx 55 s compressed at load 6, 67 s
# uncompressed at load 7 (the host's load moves it more than compression does).
run qemu-img convert -c -f raw -O qcow2 "$RAW" "$TMP/out/disk.qcow2"
rm -f "$RAW"
python3 - "$TMP/out" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
h = hashlib.sha256()
with open(os.path.join(d, "disk.qcow2"), "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
p = os.path.join(d, "refvm.json")
with open(p) as f:
    j = json.load(f)
j["disk_sha256"] = h.hexdigest()
with open(p, "w") as f:
    json.dump(j, f, indent=2)
    f.write("\n")
PY

# --- publish ----------------------------------------------------------------------------------
step 10 "published"
rm -rf "$FINAL"
mv -T "$TMP/out" "$FINAL"
rm -rf "$TMP"
trap - EXIT
progress_end "$NAME"
write_json
log "reference VM ready in $(( $(date +%s) - START )) s: $FINAL"
}
main "$@"; exit $?   # exit here: bash must not read on into a file edited meanwhile
