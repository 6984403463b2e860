#!/usr/bin/env bash
# Boot a FreeBSD kernel built by scripts/build-freebsd.sh under the project's QEMU (TCG),
# directly (PVH: -kernel), with the UFS root of `build-freebsd.sh rootfs` on virtio-blk.
# Not yet through tandem's machine model; the serial console goes to stdout.
#   scripts/run-freebsd.sh [KERNCONF] [extra qemu args...]
# Env: QEMU (qemu-system-x86_64), QEMU_FW (its firmware dir), TIMEOUT (s, default 120),
#      ROOT_IMG, KERNEL, CPU (the -cpu value),
#      RR=record|replay (with RRFILE): under -icount shift=2 as tandem runs them, the disk
#      behind blkreplay, on a fresh copy of the root image.
# The CPU: qemu64 as tandem's guests get it, but with an Intel vendor and a frequency in the
# brand string, which TANDEM-NATIVE's tunables use for its early TSC frequency (see
# docs/freebsd-boot-notes.md). Not -cpu max: its x2APIC puts the LAPIC behind rdmsr/wrmsr,
# which QEMU 10 does not mark as I/O, and under -icount that aborts ("Bad icount read").
set -euo pipefail
cache=${TANDEM_FREEBSD_CACHE:-$HOME/.cache/tandem/freebsd}
conf=${1:-TANDEM-NATIVE}; shift || true
kern=${KERNEL:-$(find "$cache/obj" -path "*/sys/$conf/kernel" -print -quit 2>/dev/null)}
[ -f "$kern" ] || { echo "no kernel for $conf (KERNEL=path)" >&2; exit 2; }
: "${QEMU:?QEMU=path to qemu-system-x86_64 (tandem.artifacts.qemu()['binary'])}"
: "${QEMU_FW:?QEMU_FW=its firmware dir}"
root=${ROOT_IMG:-$cache/work/root.img}
disk=(-drive file="$root",format=raw,if=none,id=d0,snapshot=on)
clock=()
case ${RR:-} in
  "") ;;
  record|replay)
    : "${RRFILE:?RRFILE=the record/replay log}"
    copy="$cache/work/root-${RR}.img"
    cp "$root" "$copy"
    disk=(-drive file="$copy",format=raw,if=none,id=img0 -drive driver=blkreplay,if=none,image=img0,id=d0)
    skip=; [ "$RR" = replay ] && skip=,rrskipidle=on
    clock=(-icount "shift=2,sleep=on,rr=$RR,rrfile=$RRFILE$skip") ;;
  *) echo "RR=record|replay" >&2; exit 2 ;;
esac
exec timeout "${TIMEOUT:-120}" "$QEMU" -L "$QEMU_FW" -accel tcg -machine pc \
  -cpu "${CPU:-qemu64,vendor=GenuineIntel,model-id=tandem TCG CPU @ 1.00GHz}" -m 512 -smp 1 \
  -nodefaults -no-user-config -display none -serial stdio -no-reboot "${clock[@]}" \
  -kernel "$kern" -append "vfs.root.mountfrom=ufs:/dev/vtbd0" \
  "${disk[@]}" -device virtio-blk-pci,drive=d0 "$@"
