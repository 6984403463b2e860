#!/usr/bin/env bash
# Install the Debian packages tandem needs on a Debian 12 host.
# trixie is added as deb-src only (QEMU 10.0 source); never as a binary suite.
# bookworm-backports is added as deb for linux-source-6.12.
set -euo pipefail
[ "$(id -u)" = 0 ] || SUDO=sudo
SUDO=${SUDO:-}

PKGS=(
  # QEMU build
  build-essential pkg-config ninja-build flex bison python3-venv python3-pip dpkg-dev
  libglib2.0-dev libpixman-1-dev libslirp-dev libcapstone-dev zlib1g-dev libfdt-dev
  # firmware for the built QEMU (--disable-install-blobs)
  seabios qemu-system-data/bookworm-backports
  # kernel build
  bc libelf-dev libssl-dev cpio xz-utils kmod rsync
  linux-source-6.12/bookworm-backports
  # guest image
  busybox-static e2fsprogs
  # tests and demo clients
  tshark netcat-openbsd curl socat libzstd-dev
  # libvirt: the daemons (tandem starts its own private libvirtd, never the system's),
  # virsh, and what the libvirt-python binding builds against
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev python3-dev gcc
)

src=/etc/apt/sources.list.d/tandem.sources
want=$(cat <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
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
if [ ! -f "$src" ] || [ "$(cat "$src")" != "$want" ]; then
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
