#!/usr/bin/env bash
# CI on a clean clone, N times in a row, while another CPU-heavy job runs (the suite
# must not flake on a loaded machine).
#
#   scripts/ci-under-load.sh [N] [-- LOAD COMMAND...]
#       N            runs of .ci/run, each on a fresh clone of HEAD (default 3); stops at
#                    the first failure
#       LOAD COMMAND the job that loads the machine meanwhile (default: stress-ng with one
#                    CPU worker per core, from Debian's stress-ng: scripts/host-deps.sh --dev)
#
# Output: DIR/ci-N.log per run and DIR/summary.txt (each run's result and wall time, and
# the load average meanwhile), DIR=/var/tmp/tandem-ci-load. Exit 0 if every run passed.
set -euo pipefail
main() {
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
DIR=${TANDEM_CI_LOAD_DIR:-/var/tmp/tandem-ci-load}
N=3
[ $# -gt 0 ] && [ "$1" != -- ] && { N=$1; shift; }
[ "${1:-}" != -- ] || shift
LOAD=("$@")
if [ ${#LOAD[@]} -eq 0 ]; then
  command -v stress-ng >/dev/null || { echo "ci-under-load: error: stress-ng missing (scripts/host-deps.sh --dev installs it)" >&2; exit 1; }
  LOAD=(stress-ng --cpu "$(nproc)" --cpu-method matrixprod --quiet)
fi
rm -rf "$DIR"; mkdir -p "$DIR"
SHARED=$(cd "$REPO/.." && pwd)/shared
setsid "${LOAD[@]}" >"$DIR/load.log" 2>&1 &
load=$!
trap 'kill -- -$load 2>/dev/null || true' EXIT
echo "load: ${LOAD[*]} (pid $load)" | tee "$DIR/summary.txt"
for i in $(seq 1 "$N"); do
  rm -rf "$DIR/run"; mkdir -p "$DIR/run"
  git clone -q "$REPO" "$DIR/run/main"
  [ -d "$SHARED" ] && ln -s "$SHARED" "$DIR/run/shared"
  t0=$(date +%s)
  if (cd "$DIR/run/main" && CI=true bash .ci/run) >"$DIR/ci-$i.log" 2>&1; then rc=0; else rc=$?; fi
  line="run $i: rc $rc, $(( $(date +%s) - t0 )) s, load average $(cut -d' ' -f1-3 /proc/loadavg), $(tail -n1 "$DIR/ci-$i.log" | tr -d '=')"
  echo "$line" | tee -a "$DIR/summary.txt"
  kill -0 "$load" 2>/dev/null || echo "warning: the load command has ended" | tee -a "$DIR/summary.txt"
  [ "$rc" = 0 ] || exit "$rc"
done
}
main "$@"
