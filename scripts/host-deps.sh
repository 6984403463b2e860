#!/usr/bin/env bash
# Install the Debian packages tandem needs on a Debian 12 host.
#
#   scripts/host-deps.sh           install what is missing (as root, or through sudo)
#   scripts/host-deps.sh --dev     also the developer scripts' (git: fresh-check.sh, stress-ng: ci-under-load.sh,
#                                  linux-perf: bench/device_mode.py --attribute, bench/devlog_profile.py;
#                                  ipxe-qemu: qemu-series.sh make-check)
#   scripts/host-deps.sh --test    also the test suite's own (./tandem test and ./tandem bench pass it)
#   scripts/host-deps.sh --freebsd also what building FreeBSD guests takes (Debian's LLVM 19)
#   scripts/host-deps.sh --list    print the packages, one a line (with --dev, --test: those too)
#   scripts/host-deps.sh --check   exit 0 if nothing is missing, 1 otherwise; installs nothing
# --dev, --test and --freebsd go with each other and with --list and --check.
#
# Every program tandem calls is declared with its package in
# replay/tandem/setup/programs.py; tests/unit/test_host_programs.py checks that each
# package is here or in Debian's required/important set.
# trixie is added as deb-src only (QEMU 10.0 source); never as a binary suite. bookworm's
# sources too (scripts/build-asan-redis.sh: the reference VM's redis, built with ASan).
# bookworm-backports is added as deb for linux-source-6.12.
set -euo pipefail

PKGS=(
  # QEMU build
  build-essential gcc make binutils patch ccache pkgconf ninja-build flex bison dpkg-dev
  python3-minimal python3-venv python3-pip
  libglib2.0-dev libpixman-1-dev libslirp-dev libcapstone-dev zlib1g-dev libfdt-dev
  # firmware for the built QEMU (--disable-install-blobs)
  seabios qemu-system-data/bookworm-backports
  # kernel build
  bc libelf-dev libssl-dev cpio xz-utils kmod rsync
  linux-source-6.12/bookworm-backports
  # guest image
  busybox-static e2fsprogs
  # the reference VM (scripts/build-refvm.sh): a Debian root made into a disk image
  mmdebstrap fdisk qemu-utils
  # the reference VM's redis built with ASan (scripts/build-asan-redis.sh: an overlay's service)
  libsystemd-dev
  # tests and demo clients
  tshark wireshark-common netcat-openbsd curl socat libzstd-dev
  # the reference VM's clients in tests and benchmarks (redis-cli, redis-benchmark, wrk, ab)
  redis-tools wrk apache2-utils
  # libvirt: the daemons (tandem starts its own private libvirtd, never the system's),
  # virsh, and what the libvirt-python binding builds against
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev python3-dev
)
DEV_PKGS=(
  # scripts/fresh-check.sh: the repository cloned into a clean Debian 12 root (made by
  # mmdebstrap, which the reference VM's build needs anyway: in PKGS)
  git
  # scripts/ci-under-load.sh: CI while the machine is loaded
  stress-ng
  # bench/device_mode.py --attribute: the scheduler traced (bench/sched_trace.py);
  # bench/devlog_profile.py: the native QEMU sampled (bench/cpu_profile.py)
  linux-perf
  # scripts/qemu-series.sh make-check / each: a QEMU tree built from source finds its
  # NICs' option ROMs here (Debian's QEMU package depends on it; tandem's build does not)
  ipxe-qemu
)
# Only the tests call these: a newcomer's ./tandem demo does not wait for a browser and a
# database server (861 MB with their dependencies on a clean Debian 12 root) it never uses.
TEST_PKGS=(
  # the farm's HTML report opened in a headless browser, as a reader sees it
  chromium chromium-driver
  # a private PostgreSQL cluster two farms share a night in (Debian 12's server; the
  # metapackage postgresql is only this)
  postgresql-15
  # reverse debugging's tests drive the real gdb against a replay's gdbstub
  gdb
  # libvirt's default network in the tests' private libvirtd, in a network namespace of
  # its own: its bridge (ip), DHCP (dnsmasq) and NAT (iptables), and clients in there (nsenter)
  iproute2 dnsmasq-base iptables
)
# FreeBSD guests (scripts/build-freebsd.sh): Debian's LLVM 19 as FreeBSD's cross toolchain
# (FreeBSD 14.x and 15.x are built with LLVM 18 and 19), and what its bootstrap tools
# (makefs, mkimg, ...) link against. Installed when a FreeBSD target is built: a Linux
# user's ./tandem demo does not wait for them (about 250 MB).
FREEBSD_PKGS=(
  clang-19 lld-19 llvm-19 libarchive-dev libbz2-dev
  # a FreeBSD source archive compressed with zstd (.tar.zst), as tar unpacks it
  zstd
  # GNU time: make.py links it among the host tools of a FreeBSD build (tools/build/Makefile)
  time
)

dev=''; test=''; freebsd=''; check=''; list=''
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --test) test=1 ;;
    --freebsd) freebsd=1 ;;
    --check) check=1 ;;
    --list) list=1 ;;
    *) echo "usage: $0 [--dev] [--test] [--freebsd] [--check | --list]" >&2; exit 2 ;;
  esac
done
[ -z "$dev" ] || PKGS+=("${DEV_PKGS[@]}")
[ -z "$test" ] || PKGS+=("${TEST_PKGS[@]}")
[ -z "$freebsd" ] || PKGS+=("${FREEBSD_PKGS[@]}")
if [ -n "$list" ]; then printf '%s\n' "${PKGS[@]}"; exit 0; fi

src=/etc/apt/sources.list.d/tandem.sources
want=$(cat <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "${p%%/*}" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sources_ok=; [ -f "$src" ] && [ "$(cat "$src")" = "$want" ] && sources_ok=1
if [ -n "$check" ]; then
  [ ${#missing[@]} -eq 0 ] && [ -n "$sources_ok" ]; exit
fi

SUDO=
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "tandem: error: not root and no sudo: run scripts/host-deps.sh as root (or install sudo)" >&2; exit 1; }
  SUDO=sudo
fi

if [ -z "$sources_ok" ]; then
  echo "$want" | $SUDO tee "$src" >/dev/null
  updated=
fi
if [ ${#missing[@]} -gt 0 ] || [ "${updated-x}" = "" ]; then
  echo "tandem: installing Debian packages: ${missing[*]:-(sources only)}" >&2
  $SUDO apt-get update -q
  # tshark asks whether non-root may capture; answer no without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
