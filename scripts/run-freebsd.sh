#!/usr/bin/env bash
# Boot a FreeBSD kernel built by scripts/build-freebsd.sh under the project's QEMU (TCG),
# directly (PVH: -kernel), with the FreeBSD demo guest's UFS root on virtio-blk, outside
# tandem (tandem record --kernel freebsd-native does it through tandem's machine model);
# the serial console goes to stdout. For trying a kernel config by hand.
#   scripts/run-freebsd.sh [FLAVOR] [extra qemu args...]     (FLAVOR: native, debug, kasan)
# Env: QEMU (qemu-system-x86_64), QEMU_FW (its firmware dir), TIMEOUT (s, default 120),
#      ROOT_IMG, KERNEL, CPU (the -cpu value),
#      RR=record|replay (with RRFILE): under -icount shift=2 as tandem runs them, the disk
#      behind blkreplay, on a fresh copy of the root image.
# The CPU: qemu64 as tandem's guests get it, but with an Intel vendor and a frequency in the
# brand string, which TANDEM-NATIVE's tunables use for its early TSC frequency (see
# docs/freebsd-boot-notes.md). Not -cpu max: its x2APIC puts the LAPIC behind rdmsr/wrmsr,
# which QEMU 10 does not mark as I/O, and under -icount that aborts ("Bad icount read").
set -euo pipefail
cache=${TANDEM_CACHE:-$HOME/.cache/tandem}/freebsd
flavor=${1:-native}; shift || true
newest() { ls -td $1 2>/dev/null | head -n1; }
kern=${KERNEL:-$(newest "$cache/kernel-$flavor-*")/kernel}
[ -f "$kern" ] || { echo "no $flavor kernel built (./tandem build kernel-freebsd-$flavor; or KERNEL=path)" >&2; exit 2; }
: "${QEMU:?QEMU=path to qemu-system-x86_64 (tandem.artifacts.qemu()['binary'])}"
: "${QEMU_FW:?QEMU_FW=its firmware dir}"
root=${ROOT_IMG:-$(newest "$cache/guest-*")/root.img}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
disk=(-drive file="$root",format=raw,if=none,id=d0,snapshot=on)
clock=()
case ${RR:-} in
  "") ;;
  record|replay)
    : "${RRFILE:?RRFILE=the record/replay log}"
    copy="$work/root-${RR}.img"
    cp "$root" "$copy"
    disk=(-drive file="$copy",format=raw,if=none,id=img0 -drive driver=blkreplay,if=none,image=img0,id=d0)
    skip=; [ "$RR" = replay ] && skip=,rrskipidle=on
    clock=(-icount "shift=2,sleep=on,rr=$RR,rrfile=$RRFILE$skip") ;;
  *) echo "RR=record|replay" >&2; exit 2 ;;
esac
timeout "${TIMEOUT:-120}" "$QEMU" -L "$QEMU_FW" -accel tcg -machine pc \
  -cpu "${CPU:-qemu64,vendor=GenuineIntel,model-id=tandem TCG CPU @ 1.00GHz}" -m 512 -smp 1 \
  -nodefaults -no-user-config -display none -serial stdio -no-reboot "${clock[@]}" \
  -kernel "$kern" -append "vfs.root.mountfrom=ufs:/dev/vtbd0" \
  "${disk[@]}" -device virtio-blk-pci,drive=d0 "$@"
