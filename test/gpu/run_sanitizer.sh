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
#   - initcheck only: where every finding it displays lies inside a library's own kernel
#     (cuBLASLt's, CUB's, NCCL's: $ZERO_SANITIZER_LIBRARY_KERNELS, an extended regex matched
#     against the finding's "at" line), the findings are listed as the library's and not counted:
#     initcheck flags those libraries' internal reads of scratch they never initialise, which
#     is not ours to fix (a wrong input we hand them shows as wrong results in the tests); the
#     test itself must still have passed (Catch's "All tests passed");
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
case " $sanitizer_args " in
  *" initcheck "*)
    library=${ZERO_SANITIZER_LIBRARY_KERNELS:-'cub::|cutlass|cublas|xmma|nvjet|nccl'}
    # Each finding: its header (an access, or an API call that failed), then its "at" line.
    counts=$(awk -v lib="$library" '
      /^=+ [A-Z][^:]*(read|write|access)/ || /^=+ Program hit/ { n++; want = 1; next }
      want && /^=+ +at / { if (tolower($0) ~ tolower(lib)) f++; want = 0 }
      END { print n + 0, f + 0 }' "$log")
    shown=${counts% *}
    theirs=${counts#* }
    if [ "$shown" -gt 0 ] && [ "$theirs" -eq "$shown" ] &&
       grep -qE '^=+ ERROR SUMMARY: [1-9]' "$log"; then
      echo "sanitizer: initcheck's $shown displayed finding(s) in $(basename "$exe") all lie inside library kernels ($library): theirs, not counted"
      grep -E '^=+ +at ' "$log" | sed -E 's/^=+ +at /  library kernel: /' | sort | uniq -c | head -5
      # The sanitizer's error status hides the test's own: Catch's last line tells.
      grep -q '^All tests passed' "$log" && exit 0
      [ "$rc" -eq 0 ] && rc=1
      exit "$rc"
    fi
    ;;
esac
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
