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
#   scripts/qemu-series.sh each DIR [FIRST] [--suite N,N...]
#                                        every patch at its own point (bisectability): for
#                                        each commit of DIR after the first (from patch FIRST),
#                                        build x86_64-softmmu (build-qemu.sh's device set) and
#                                        run QEMU's functional tests of record/replay that
#                                        exist at that point (test_x86_64_reverse_debug,
#                                        test_x86_64_tandem_*); at the patches --suite names,
#                                        also tandem's record/replay tests
#                                        (tests/test_record_replay.py) on that point's QEMU;
#                                        a line a patch in DIR/build/each.log; exit 1 at the
#                                        first failure
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
# QEMU 10.0's configure needs meson 1.5 or later (Debian 12 has 1.0.1) and, with
# --disable-download, finds it only in its Python's environment: tandem's venv has it
# (./tandem setup), and ./tandem exports TANDEM_PYTHON as build-qemu.sh uses it.
if [ -z "${TANDEM_PYTHON:-}" ]; then
  for v in "$CACHE"/venv-*/bin/python3; do
    [ -x "$v" ] && "$v" -c 'import mesonbuild' 2>/dev/null && { TANDEM_PYTHON=$v; break; }
  done
fi
PY=${TANDEM_PYTHON:-python3}
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

build_tree() {
  # configure (once, with QEMU's defaults and the options after $1) and build the tree in
  # $1 for x86_64-softmmu, its binary able to find Debian's firmware; the logs in $1/build
  local tree=$1
  shift
  [ -e /usr/lib/ipxe/qemu/efi-virtio.rom ] ||
    die "building a tree needs the NICs' option ROMs of Debian's ipxe-qemu (apt install ipxe-qemu)"
  mkdir -p "$tree/build"
  if [ ! -f "$tree/build/build.ninja" ]; then
    # Debian's source has no firmware blobs (linked from its packages below)
    local cc="gcc"
    command -v ccache >/dev/null && cc="ccache gcc"
    (cd "$tree/build" && ../configure --python="$PY" --cc="$cc" --target-list=x86_64-softmmu \
      --disable-download --disable-install-blobs --disable-docs --disable-werror "$@" >configure.log 2>&1) ||
      { tail -n 30 "$tree/build/configure.log" >&2; die "configure failed (log: $tree/build/configure.log)"; }
  fi
  make -C "$tree/build" -j"$(nproc)" >"$tree/build/make.log" 2>&1 ||
    { tail -n 30 "$tree/build/make.log" >&2; die "build failed (log: $tree/build/make.log)"; }
  # A binary in the build tree reads its data from qemu-bundle/: Debian's firmware there
  local f
  for f in /usr/share/seabios/*.bin /usr/share/qemu/*.bin /usr/share/qemu/*.rom /usr/lib/ipxe/qemu/*.rom; do
    [ -e "$f" ] && ln -sf "$f" "$tree/build/qemu-bundle/usr/local/share/qemu/"
  done
  return 0
}

functional() {
  # QEMU's functional test file $2 (tests/functional/$2.py) against the build in $1, as
  # make check-functional runs it (flaky tests included); its output in $1/build/$2.log.
  # A skipped test fails here: each one is meant to run.
  (cd "$1/build" && QEMU_TEST_QEMU_BINARY=$PWD/qemu-system-x86_64 QEMU_TEST_QEMU_IMG=$PWD/qemu-img \
    QEMU_BUILD_ROOT=$PWD QEMU_TEST_FLAKY_TESTS=1 PYTHONPATH=$1/python:$1/tests/functional \
    timeout 600 "$PY" "$1/tests/functional/$2.py" >"$2.log" 2>&1) &&
    grep -q '^ok ' "$1/build/$2.log" && ! grep -qE '^not ok |# SKIP' "$1/build/$2.log"
}

suite_at() {
  # tandem's record/replay tests on the QEMU built in $1 (at patch $2, commit $3): a build
  # directory of tandem's whose qemu.json names that binary; the rest of tandem's builds
  # (kernels, guest image) as they are. A point before rrskipidle (qemu-patches/0022)
  # is run as tandem runs a stock QEMU. Output in $1/build/suite-$2.log
  local b=$1/build/tandem-build-$2 stock=false
  rm -rf "$b" && mkdir -p "$b"
  cp "$ROOT"/build/*.json "$b"/
  grep -q rrskipidle "$1/qemu-options.hx" || stock=true
  python3 -c '
import json, sys
path, tree, commit, stock = sys.argv[1:]
q = json.load(open(path))
q.update(binary=f"{tree}/build/qemu-system-x86_64", img=f"{tree}/build/qemu-img",
         firmware_dir=f"{tree}/build/qemu-bundle/usr/local/share/qemu", source=tree,
         plugin_include=f"{tree}/include", build_id=f"series-{commit}", stock=stock == "true")
json.dump(q, open(path, "w"))
' "$b/qemu.json" "$1" "$3" "$stock"
  (cd "$ROOT" && TANDEM_BUILD_DIR=$b PYTHONPATH=replay:tests timeout 1800 "$PY" -m pytest -q \
    -p no:cacheprovider --basetemp "$1/build/suite-$2" tests/test_record_replay.py) >"$1/build/suite-$2.log" 2>&1
}

# One function, so bash has read it all before it runs: editing this file while `each` runs
# (it takes an hour) cannot change the run.
main() {
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
    build_tree "$2"
    cd "$2/build"
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
  each)
    [ $# -ge 2 ] && [ -d "$2/.git" ] || die "usage: $0 each DIR [FIRST] [--suite N,N...] (a tree made by: $0 tree DIR)"
    dir=$(realpath "$2")
    shift 2
    first=1 suite=,
    while [ $# -gt 0 ]; do
      case $1 in
        --suite) [ $# -ge 2 ] || die "--suite: a list of patch numbers (20,26)"; suite=",$2,"; shift 2 ;;
        *[!0-9]*) die "each: $1: not a patch number" ;;
        *) first=$1; shift ;;
      esac
    done
    git -C "$dir" diff --quiet HEAD || die "$dir: uncommitted changes (each checks out every commit)"
    head=$(git -C "$dir" symbolic-ref -q --short HEAD || git -C "$dir" rev-parse HEAD)
    base=$(git -C "$dir" rev-list --max-parents=0 HEAD)
    mapfile -t commits < <(git -C "$dir" rev-list --reverse "$base..HEAD")
    mkdir -p "$dir/build"
    log=$dir/build/each.log
    : >"$log"
    bad=0
    for i in "${!commits[@]}"; do
      n=$((i + 1))
      [ $n -ge "$first" ] || continue
      c=${commits[$i]}
      git -C "$dir" checkout -q "$c"
      s=$(date +%s)
      line="$(printf '%02d' $n) $(git -C "$dir" log -1 --format=%s "$c" | cut -c1-60):"
      # build-qemu.sh's device set and options that change what is compiled
      # (in a subshell: its die ends the build, not the walk; its message says which log)
      if (build_tree "$dir" --without-default-devices --with-devices-x86_64=tandem --enable-plugins \
          --enable-slirp --enable-capstone --enable-zstd); then
        line="$line built ($(( $(date +%s) - s )) s, $(grep -c 'warning:' "$dir/build/make.log" || true) warnings)"
        for f in "$dir"/tests/functional/test_x86_64_reverse_debug.py "$dir"/tests/functional/test_x86_64_tandem_*.py; do
          [ -e "$f" ] || continue
          t=$(basename "$f" .py)
          if functional "$dir" "$t"; then line="$line, $t ok"; else line="$line, $t FAILED"; bad=1; fi
        done
        if [ "${suite#*,$n,}" != "$suite" ]; then
          if suite_at "$dir" "$n" "$c"; then line="$line, tandem's record/replay tests ok"
          else line="$line, tandem's record/replay tests FAILED (log: build/suite-$n.log)"; bad=1; fi
        fi
      else
        line="$line BUILD FAILED"
        bad=1
      fi
      echo "$line" | tee -a "$log"
      [ $bad -eq 0 ] || break
    done
    git -C "$dir" checkout -q "$head"
    [ $bad -eq 0 ] && echo "qemu-series: every patch from $first builds and passes its functional tests (log: $log)"
    exit $bad
    ;;
  *) die "usage: $0 [--upstream] tree DIR | export DIR | check [PATCH...] | make-check DIR | each DIR [FIRST]" ;;
esac
}

main "$@"
