# Progress of a long build step, for the launcher's progress line (tandem/setup/build.py):
# CACHE/progress/TARGET holds one line "START DONE TOTAL UNIT" (START: Unix time;
# TOTAL 0 when unknown), replaced atomically, removed when the step ends.
#   . scripts/progress.sh; progress kernel-native "$start" 412 1830 files; progress_end kernel-native
progress() {
  local f="${TANDEM_CACHE:-$HOME/.cache/tandem}/progress/$1"
  mkdir -p "${f%/*}"
  printf '%s %s %s %s\n' "$2" "$3" "$4" "$5" >"$f.tmp$$" && mv -f "$f.tmp$$" "$f"
}
progress_end() { rm -f "${TANDEM_CACHE:-$HOME/.cache/tandem}/progress/$1"; }
