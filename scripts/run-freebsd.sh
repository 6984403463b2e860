#!/usr/bin/env bash
# Boot a FreeBSD kernel built by scripts/build-freebsd.sh under the project's QEMU (TCG),
# directly (PVH: -kernel), with a UFS root on virtio-blk. Rough (issue 44).
#   scripts/run-freebsd.sh [KERNCONF] [extra qemu args...]
# Env: QEMU (binary), QEMU_FW (firmware dir), TIMEOUT (seconds, default 120), ROOT_IMG.
set -euo pipefail
cache=${TANDEM_FREEBSD_CACHE:-$HOME/.cache/tandem/freebsd}
conf=${1:-TANDEM-NATIVE}; shift || true
kern=$(ls -d "$cache"/obj/*/.cache/tandem/freebsd/*/amd64.amd64/sys/"$conf"/kernel 2>/dev/null | head -1 || true)
kern=${KERNEL:-$kern}
[ -f "$kern" ] || { echo "no kernel for $conf (KERNEL=path)" >&2; exit 2; }
: "${QEMU:?QEMU=path to qemu-system-x86_64 (tandem.artifacts.qemu()['binary'])}"
: "${QEMU_FW:?QEMU_FW=its firmware dir}"
root=${ROOT_IMG:-$cache/work/root.img}
exec timeout "${TIMEOUT:-120}" "$QEMU" -L "$QEMU_FW" -accel tcg -machine pc \
  -cpu max,vendor=GenuineIntel,model-id="tandem TCG CPU @ 2.00GHz" -m 512 -smp 1 \
  -nodefaults -no-user-config -display none -serial stdio -no-reboot \
  -kernel "$kern" -append "vfs.root.mountfrom=ufs:/dev/vtbd0" \
  -drive file="$root",format=raw,if=none,id=d0 -device virtio-blk-pci,drive=d0 "$@"
