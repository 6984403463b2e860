#!/usr/bin/env bash
# tandem's QEMU series (qemu-patches/) as a QEMU developer works on it: a git tree to edit,
# the patches exported from it, and QEMU's own checkpatch.pl over them.
#
#   scripts/qemu-series.sh tree DIR      Debian's QEMU 10.0 source (the one build-qemu.sh
#                                        builds) as a git repository in DIR, one commit, then
#                                        the series applied with git am, one commit per patch
#   scripts/qemu-series.sh export DIR    qemu-patches/ rewritten from DIR's commits after the
#                                        first: git format-patch, numbered N/M, with the cover
#                                        letter qemu-patches/cover-letter.txt (subject line,
#                                        blank line, body) as 0000-cover-letter.patch
#   scripts/qemu-series.sh check [PATCH...]
#                                        QEMU 10.0's scripts/checkpatch.pl (from that source)
#                                        over each patch of the series (or those given); exit
#                                        1 when one has an error or a warning
#   scripts/qemu-series.sh make-check DIR
#                                        configure and build the tree in DIR (x86_64-softmmu),
#                                        then QEMU's own tests of the parts the upstream series
#                                        touches: make check-unit, the x86_64 qtests qmp-test
#                                        and test-hmp, qos-test's virtio-net and virtio-rng
#                                        tests, and the functional test_x86_64_reverse_debug
#
# --upstream first (scripts/qemu-series.sh --upstream tree DIR, ...) works on
# qemu-patches/upstream/ instead: the small general fixes, on Debian's QEMU 10.0 alone.
#
# Edit in the tree (git rebase -i, git commit --amend: each change in the patch that makes
# it), export, check, and commit qemu-patches/ with a message that says what changed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
PATCHES=$ROOT/qemu-patches
if [ "${1:-}" = --upstream ]; then
  PATCHES=$PATCHES/upstream
  shift
fi
IDENT=(-c user.name=tandem -c user.email=tandem@localhost)
die() { echo "qemu-series: $*" >&2; exit 1; }

dsc() {
  local d
  d=$(ls "$CACHE"/dl/qemu/qemu_10.0.*.dsc 2>/dev/null | sort -V | tail -n1 || true)
  [ -n "$d" ] || die "no Debian QEMU 10.0 source in $CACHE/dl/qemu: ./tandem build qemu fetches it"
  echo "$d"
}

checkpatch() {
  # QEMU 10.0's own checkpatch.pl, unpacked once from Debian's orig tarball
  local orig dir
  orig=$(ls "$CACHE"/dl/qemu/qemu_10.0.*.orig.tar.xz | sort -V | tail -n1)
  dir=$CACHE/dl/qemu/checkpatch-$(basename "$orig" .orig.tar.xz)
  if [ ! -f "$dir/checkpatch.pl" ]; then
    mkdir -p "$dir.tmp"
    tar -xJf "$orig" -C "$dir.tmp" --wildcards --strip-components=2 '*/scripts/checkpatch.pl'
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir/checkpatch.pl"
}

case ${1:-} in
  tree)
    [ $# -eq 2 ] || die "usage: $0 tree DIR"
    [ ! -e "$2" ] || die "$2: exists (the tree is made in a new directory)"
    dpkg-source -q -x "$(dsc)" "$2" >/dev/null
    cd "$2"
    git init -q
    git add -A >/dev/null
    git "${IDENT[@]}" commit -qm "Debian's QEMU source as build-qemu.sh builds it" --date="2026-01-01T00:00:00Z"
    while read -r p; do
      git "${IDENT[@]}" am -q --keep-cr "$PATCHES/$p" || die "$p does not apply (git am --abort in $2)"
    done <"$PATCHES/series"
    echo "qemu-series: $2: $(git rev-list --count HEAD) commits, the series on top of Debian's source"
    ;;
  export)
    [ $# -eq 2 ] || die "usage: $0 export DIR"
    base=$(git -C "$2" rev-list --max-parents=0 HEAD)
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    # core.abbrev fixed: the index lines do not change with the tree's object count
    git -C "$2" "${IDENT[@]}" -c core.abbrev=8 format-patch -q --no-signature --zero-commit --cover-letter -o "$out" "$base..HEAD"
    cover=$PATCHES/cover-letter.txt
    [ -f "$cover" ] || die "$cover: missing (its first line is the cover letter's subject)"
    python3 - "$out"/0000-cover-letter.patch "$cover" <<'EOF'
import sys
path, cover = sys.argv[1:]
text = open(path).read()
subject, _, body = open(cover).read().partition("\n")
text = text.replace("*** SUBJECT HERE ***", subject.strip()).replace("*** BLURB HERE ***", body.strip())
open(path, "w").write(text)
EOF
    rm -f "$PATCHES"/0*.patch
    cp "$out"/*.patch "$PATCHES"/
    (cd "$out" && ls 0*.patch | grep -v '^0000-cover-letter') >"$PATCHES/series"
    echo "qemu-series: $(grep -c . "$PATCHES/series") patches and the cover letter in $PATCHES"
    ;;
  check)
    shift
    cp=$(checkpatch)
    [ $# -gt 0 ] || set -- $(cat "$PATCHES/series")
    # checkpatch.pl leaves a cache file in its working directory: not in qemu-patches/
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    bad=0
    for p in "$@"; do
      case $p in /*) ;; *) [ -f "$p" ] && p=$(realpath "$p") || p=$PATCHES/$p ;; esac
      res=$(cd "$scratch" && perl "$cp" --no-tree --terse "$p" 2>&1 || true)
      if grep -qE '(ERROR|WARNING):' <<<"$res"; then
        grep -E "(ERROR|WARNING):" <<<"$res"
        bad=1
      fi
    done
    [ $bad -eq 0 ] && echo "qemu-series: $# patches clean under QEMU 10.0's checkpatch.pl"
    exit $bad
    ;;
  make-check)
    [ $# -eq 2 ] && [ -d "$2/.git" ] || die "usage: $0 make-check DIR (a tree made by: $0 --upstream tree DIR)"
    [ -e /usr/lib/ipxe/qemu/efi-virtio.rom ] ||
      die "make-check needs the NICs' option ROMs of Debian's ipxe-qemu (apt install ipxe-qemu)"
    cd "$2"
    mkdir -p build
    cd build
    if [ ! -f build.ninja ]; then
      # Debian's source has no firmware blobs (linked from its packages below)
      cc="gcc"; command -v ccache >/dev/null && cc="ccache gcc"
      ../configure --python="${TANDEM_PYTHON:-python3}" --cc="$cc" --target-list=x86_64-softmmu \
        --disable-download --disable-install-blobs --disable-docs --disable-werror >configure.log 2>&1 ||
        { tail -n 30 configure.log >&2; die "configure failed (log: $2/build/configure.log)"; }
    fi
    make -j"$(nproc)" >make.log 2>&1 || { tail -n 30 make.log >&2; die "build failed (log: $2/build/make.log)"; }
    # A binary in the build tree reads its data from qemu-bundle/: Debian's firmware there
    for f in /usr/share/seabios/*.bin /usr/share/qemu/*.bin /usr/share/qemu/*.rom /usr/lib/ipxe/qemu/*.rom; do
      [ -e "$f" ] && ln -sf "$f" qemu-bundle/usr/local/share/qemu/
    done
    # pipefail: a failing make or meson test fails this
    make -j"$(nproc)" check-unit 2>&1 | tee check-unit.log | tail -n 5
    QEMU_TEST_FLAKY_TESTS=1 pyvenv/bin/meson test --setup thorough --no-rebuild --print-errorlogs \
      qtest-x86_64/qmp-test qtest-x86_64/test-hmp func-x86_64-x86_64_reverse_debug 2>&1 | tee check-parts.log | tail -n 8
    # qos-test's virtio-net and virtio-rng paths (its virtio-9p xattr tests fail on Debian's
    # unpatched source too on a host whose file system refuses their xattrs)
    export QTEST_QEMU_BINARY=./qemu-system-x86_64 QTEST_QEMU_IMG=./qemu-img
    mapfile -t paths < <(./tests/qtest/qos-test -l | grep -E '^/.*/virtio-(net|rng)-pci/')
    [ ${#paths[@]} -gt 0 ] || die "qos-test lists no virtio-net or virtio-rng test"
    args=()
    for p in "${paths[@]}"; do args+=(-p "$p"); done
    ./tests/qtest/qos-test --tap -k "${args[@]}" 2>qos-test.err | tee qos-test.log | grep -c '^ok' |
      { read -r n; echo "qos-test: $n of ${#paths[@]} virtio-net and virtio-rng tests ok"; [ "$n" -eq ${#paths[@]} ]; }
    ;;
  *) die "usage: $0 [--upstream] tree DIR | export DIR | check [PATCH...] | make-check DIR" ;;
esac
