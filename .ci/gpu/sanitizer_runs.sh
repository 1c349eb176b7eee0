#!/usr/bin/env bash
# sanitizer_runs.sh: gpu_verify.sh's sanitizer step, the runs gpu_verify chose (SAN_SET), inside
# the step's end time. Not meant to be run by hand; every input comes from the environment:
#   BUILD_DIR       the CUDA build            SAN            compute-sanitizer
#   RUN_SANITIZER   test/gpu/run_sanitizer.sh (the verdict: a finding fails, 77 is skipped or
#                   "sanitizer unavailable")
#   SAN_END         epoch second by which the step must be over (its timeout)
#   SAN_CTEST       file: ctest's sanitizer entries to run, a name a line (run first, -j 3)
#   SAN_EXTRA       file: the runs outside ctest, NAME=TOOL:PROGRAM[:CATCH_FILTER] a line, in
#                   order (gpu_plan.py writes both)
#   SAN_STATUS      file that gets one line per run outside ctest: "<state> <name> [rc]", state
#                   passed, failed, skipped (77), cut (no time left to start it, or stopped at
#                   SAN_END); a run without an end line was killed with the step (also cut)
#   SAN_MIN_RUN_S   seconds a run outside ctest must have left to start (default 20)
#   ZERO_VERIFY_CLOCK  as in gpu_verify.sh (the simulated clock of its dry-run test)
# The ctest part ends at its --stop-time, 2/3 of the step or the whole step if nothing follows;
# the runs outside ctest share what is left, one at a time, each stopped at SAN_END.
set -uo pipefail
now() { if [ -n "${ZERO_VERIFY_CLOCK:-}" ]; then cat "$ZERO_VERIFY_CLOCK"; else date +%s; fi; }
stop_time() {  # stop_time EPOCH: ctest's --stop-time for that second (omitted across midnight)
  [ "$(date -d "@$1" +%j)" = "$(date -d "@$(now)" +%j)" ] && echo "--stop-time $(date -d "@$1" +%H:%M:%S)"
}
export ZERO_TEST_SMALL=1 ZERO_TEST_COMM=mpi
min_run=${SAN_MIN_RUN_S:-20}
: >"$SAN_STATUS"
rc=0
t0=$(now)
if [ -s "$SAN_CTEST" ]; then
  share=$(( SAN_END - t0 - 10 ))
  [ -s "$SAN_EXTRA" ] && share=$(( (SAN_END - t0) * 2 / 3 ))
  regex="^($(paste -sd '|' "$SAN_CTEST"))\$"
  # shellcheck disable=SC2046
  ctest --test-dir "$BUILD_DIR" -R "$regex" -j 3 --output-on-failure $(stop_time $(( t0 + share ))) || rc=1
fi
while IFS= read -r run; do
  [ -n "$run" ] || continue
  name=${run%%=*}; spec=${run#*=}
  tool=${spec%%:*}; spec=${spec#*:}
  exe=${spec%%:*}; filter=""
  [ "$exe" != "$spec" ] && filter=${spec#*:}
  left=$(( SAN_END - $(now) ))
  if [ "$left" -lt "$min_run" ]; then
    echo "sanitizer: $name cut: $left s left of the step (a run needs $min_run)"
    echo "cut $name" >>"$SAN_STATUS"; continue
  fi
  echo "start $name" >>"$SAN_STATUS"
  args=(); [ -n "$filter" ] && args=("$filter")
  timeout -k 5 "$(( left - 5 ))" "$RUN_SANITIZER" "$exe" "$SAN" --tool "$tool" --error-exitcode 1 -- "${args[@]}" </dev/null
  r=$?
  case $r in
    0) echo "passed $name" >>"$SAN_STATUS" ;;
    77) echo "skipped $name" >>"$SAN_STATUS" ;;
    124|137) echo "sanitizer: $name cut at the step's end"; echo "cut $name" >>"$SAN_STATUS" ;;
    *) echo "failed $name $r" >>"$SAN_STATUS"; rc=1 ;;
  esac
done <"$SAN_EXTRA"
exit $rc
