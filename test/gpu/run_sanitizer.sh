#!/bin/sh
# run_sanitizer.sh <test exe> <compute-sanitizer> [sanitizer args...] -- [test args...]
#
# compute-sanitizer reports its own failure (not the test's exit 77) when there is no device to
# instrument, so the device probe of gpu_main.cpp runs first, without the sanitizer
# (ZERO_TEST_PROBE=1: probe, print, exit). Its 77 (no device) and its failure (a broken GPU
# setup) are passed on as they are; only a machine with a working device runs the sanitizer.
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
# shellcheck disable=SC2086  # the sanitizer's arguments are single words by construction
exec $sanitizer_args "$exe" "$@"
