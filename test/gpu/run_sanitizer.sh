#!/bin/sh
# run_sanitizer.sh <test exe> <compute-sanitizer> [sanitizer args...] -- [test args...]
#
# compute-sanitizer reports its own failure (not the test's exit 77) when there is no device to
# instrument, so the device probe of gpu_main.cpp runs first, without the sanitizer
# (ZERO_TEST_PROBE=1: probe, print, exit). Its 77 (no device) and its failure (a broken GPU
# setup) are passed on as they are; only a machine with a working device runs the sanitizer.
#
# The verdict, from the sanitizer's own lines (each starts with "========="):
#   - a finding (ERROR SUMMARY or RACECHECK SUMMARY with errors): a failure (status 1 or more);
#   - no finding, but the sanitizer could not attach to the device (some GPU machines do not let
#     its debugger interface in: "Internal Sanitizer Error", "terminated before first
#     instrumented API call", "Device not supported"): "sanitizer unavailable", status 77
#     (ctest: skipped), since nothing was checked; the line is also appended to the file
#     $ZERO_SANITIZER_REPORT where that is set (gpu_verify.sh's summary);
#   - otherwise the status of the run: the test's own failure, or 0.
exe=$1
shift
ZERO_TEST_PROBE=1 "$exe"
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
sanitizer_args=""
for a in "$@"; do
  shift
  [ "$a" = "--" ] && break
  sanitizer_args="$sanitizer_args $a"
done
log=$(mktemp "${TMPDIR:-/tmp}/run_sanitizer.XXXXXX") || exit 2
trap 'rm -f "$log" "$log.rc"' EXIT
# The output is shown as it comes and kept for the verdict; the pipe loses the status, so the
# run writes it to a file.
# shellcheck disable=SC2086  # the sanitizer's arguments are single words by construction
{ $sanitizer_args "$exe" "$@" 2>&1; echo $? >"$log.rc"; } | tee "$log"
rc=$(cat "$log.rc")
if grep -qE '^=+ (ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([1-9])' "$log"; then
  [ "$rc" -eq 0 ] && rc=1  # a finding fails even where --error-exitcode was not given
  exit "$rc"
fi
if [ "$rc" -ne 0 ]; then
  reason=$(grep -m1 -iE '^=+ .*(Internal Sanitizer Error|terminated before first instrumented API call|Device not supported|No attachable process|(unable|failed) to (attach|initialize))' "$log" | sed -E 's/^=+ *//')
  if [ -n "$reason" ]; then
    line="sanitizer unavailable: compute-sanitizer could not attach to the device, so $(basename "$exe") was not checked ($reason) [status $rc]"
    echo "$line"
    [ -n "${ZERO_SANITIZER_REPORT:-}" ] && echo "$line" >>"$ZERO_SANITIZER_REPORT"
    exit 77
  fi
fi
exit "$rc"
