#!/usr/bin/env bash
# The README's first command on a fresh Debian 12 machine, repeatable.
#
#   scripts/fresh-check.sh [DIR] [-- COMMAND...]    (as root; default DIR /var/tmp/tandem-fresh)
#   scripts/fresh-check.sh --reuse [DIR] [-- COMMAND...]
#                          run COMMAND in the root a last check left, with its cache
#                          (the README's second command after its first: -- ./tandem test)
#
# Makes a clean Debian 12 root in DIR/root with mmdebstrap (Debian's required and
# important packages: what every Debian 12 install has, nothing installed by hand),
# clones this repository's HEAD into it, and runs `./tandem demo` (or COMMAND) inside,
# chrooted in a private mount namespace, with an empty cache of its own and a clean
# environment: nothing of this host's cache, venv or PATH is used. A green CI once hid
# a missing install step (ccache) this way; run this before resolving anything that
# touches setup or builds.
#
# TANDEM_FREEBSD_SRC, when set (a FreeBSD tree or source archive), is seen read-only in the
# root at /srv/freebsd/NAME and passed on under the same name, the one setting carried in
# (-- ./tandem build freebsd: FreeBSD's install steps and builds on a fresh root).
#
# Output: DIR/run.log (every line with the seconds since the start), and a table of
# where the time went (packages, venv, each build, the demo) in DIR/times.md.
set -euo pipefail
# One function, so bash has read it all before it runs: editing this file during a
# check (it takes 20 minutes) cannot change the check.
main() {
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
DIR=/var/tmp/tandem-fresh
reuse=
[ "${1:-}" != --reuse ] || { reuse=1; shift; }
[ $# -gt 0 ] && [ "$1" != -- ] && { DIR=$1; shift; }
[ "${1:-}" != -- ] || shift
CMD=("$@")
[ ${#CMD[@]} -gt 0 ] || CMD=(./tandem demo)
die() { echo "tandem: error: $*" >&2; exit 1; }
say() { echo "fresh-check: $*" >&2; }

[ "$(id -u)" = 0 ] || die "fresh-check needs root (mmdebstrap, chroot, mounts)"
git -C "$REPO" diff --quiet HEAD 2>/dev/null || say "note: uncommitted changes are not in the check (it clones HEAD)"
bash "$HERE/host-deps.sh" --dev

R=$DIR/root
make_root() {   # a clean Debian 12 root in $R with HEAD cloned into it
  rm -rf "$DIR"
  mkdir -p "$DIR"
  t0=$(date +%s)
  say "making a clean Debian 12 root in $R (mmdebstrap, variant important)"
  mmdebstrap --variant=important --quiet bookworm "$R" http://deb.debian.org/debian >"$DIR/mmdebstrap.log" 2>&1 \
    || { tail -n 20 "$DIR/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $DIR/mmdebstrap.log)"; }
  say "root made in $(( $(date +%s) - t0 ))s"
  cp /etc/resolv.conf "$R/etc/resolv.conf"
  # The network's trust, not tandem's: a site whose TLS goes through an intercepting
  # proxy has its CA in /usr/local/share/ca-certificates (picked up when the root's
  # ca-certificates is set up) and pip told to use the system store (/etc/pip.conf).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$R/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
    say "carried in this site's CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  fi
  [ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$R/etc/pip.conf"
  # As in any chroot: package scripts do not start services.
  printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"; chmod +x "$R/usr/sbin/policy-rc.d"
  git clone -q --no-local "$REPO" "$R/root/tandem"
  say "cloned $(git -C "$R/root/tandem" rev-parse --short HEAD) into $R/root/tandem"
}
if [ -n "$reuse" ]; then
  [ -d "$R/root/tandem" ] || die "$R: no root from an earlier check to reuse"
else
  make_root
fi
FREEBSD=()
if [ -n "${TANDEM_FREEBSD_SRC:-}" ]; then
  [ -e "$TANDEM_FREEBSD_SRC" ] || die "TANDEM_FREEBSD_SRC=$TANDEM_FREEBSD_SRC: no such file or directory"
  FREEBSD=("$(readlink -f "$TANDEM_FREEBSD_SRC")" "/srv/freebsd/$(basename "$TANDEM_FREEBSD_SRC")")
  say "the FreeBSD source $TANDEM_FREEBSD_SRC is ${FREEBSD[1]} in the root"
fi
say "running in $R: ${CMD[*]}"
LOG=$DIR/run.log; [ -z "$reuse" ] || LOG=$DIR/run-again.log

start=$(date +%s)
set +e
unshare --mount --fork bash -c '
  set -e
  R=$1 FB_HOST=$2 FB_ROOT=$3; shift 3
  mount --make-rprivate /
  # The root a mount point, as on a machine: unshare -m in the guest image build
  # changes the propagation of / and fails on a plain directory.
  mount --bind "$R" "$R"
  mount -t proc proc "$R/proc"
  mount --rbind /sys "$R/sys"
  mount --rbind /dev "$R/dev"
  mount -t tmpfs tmpfs "$R/tmp"
  fb=()
  if [ -n "$FB_HOST" ]; then
    mkdir -p "$R$(dirname "$FB_ROOT")"
    if [ -d "$FB_HOST" ]; then mkdir -p "$R$FB_ROOT"; else touch "$R$FB_ROOT"; fi
    mount --bind "$FB_HOST" "$R$FB_ROOT" && mount -o remount,bind,ro "$R$FB_ROOT"
    fb=(TANDEM_FREEBSD_SRC="$FB_ROOT")
  fi
  cd "$R/root/tandem"
  exec chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 "${fb[@]}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/tandem && exec \"\$@\"" bash "$@"
' bash "$R" "${FREEBSD[0]:-}" "${FREEBSD[1]:-}" "${CMD[@]}" 2>&1 | while IFS= read -r line; do
  printf '%5d %s\n' $(( $(date +%s) - start )) "$line"
done | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
# The mounts belong to the private namespace above; once they were found on the host
# after a run (cause not found), and a private libvirtd on this host then failed on the
# root's /sys. Never leave any behind.
if grep -q " $R" /proc/self/mountinfo; then
  say "warning: mounts under $R were left on this host; unmounting them"
  umount -R "$R" || die "could not unmount $R: umount -R it before using libvirt here"
fi
total=$(( $(date +%s) - start ))
if [ -z "$reuse" ]; then
  python3 "$HERE/fresh-times.py" "$LOG" "$R/root/tandem/build/.ninja_log" "$total" >"$DIR/times.md" || true
  cat "$DIR/times.md" >&2
fi
[ "$rc" = 0 ] || die "${CMD[*]} failed on a fresh Debian 12 root (exit $rc; log: $LOG)"
say "passed: ${CMD[*]} on a fresh Debian 12 root in $(( total / 60 )) min $(( total % 60 )) s"
}
main "$@"; exit $?
