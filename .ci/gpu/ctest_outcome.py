#!/usr/bin/env python3
"""ctest_outcome.py: what became of each test of one ctest run inside the GPU kit's time budget.

    ctest_outcome.py TESTS_JSON CTEST_LOG [--step-rc RC] [--what LABEL] [--rerun TEMPLATE]

TESTS_JSON is `ctest --show-only=json-v1` for the same selection as the run (it names every test
that should have run, with its TIMEOUT); CTEST_LOG is the run's output. Each test is

  passed   ctest's "Passed";
  skipped  ctest's "***Skipped" (SKIP_RETURN_CODE: no device, or fewer GPUs than the run needs);
  failed   "***Failed", "***Exception", "***Not Run" (no program: the build failed), or
           "***Timeout" at the test's own TIMEOUT (a hang is a failure);
  cut      stopped by the time budget, not by anything the test did: killed at ctest's
           --stop-time ("***Timeout" before its own TIMEOUT; ctest then also prints "The stop
           time has been passed"), or never started because the stop time had passed or the
           kit's step timeout (status 124 / 137) ended ctest first.

ctest counts a cut test as failed (and leaves the unstarted ones out of its count altogether):
the kit would then read FAIL for lack of time. A cut test says nothing about the code; the kit
reports it apart and gives the command that reruns exactly the cut ones.

Prints one summary line, then a line per test not passed, then the command that reruns the cut
ones (TEMPLATE with {regex} replaced by a regular expression naming exactly them). Exit status:
0 (all passed or skipped), 1 (a test failed, or one is missing from a run that was not cut
short), 3 (nothing failed, some were cut).
"""
import argparse
import json
import re
import sys

RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\s*\d+: (\S+)\s+\.*\s*(?:\*\*\*)?"
                    r"(Passed|Failed|Skipped|Timeout|Not Run|Exception|Disabled)\b(?::\s*(\S+))?.*?\s([\d.]+) sec\s*$")
STOP = "The stop time has been passed"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tests_json")
    ap.add_argument("log")
    ap.add_argument("--step-rc", type=int, default=0, help="the status of the kit's step around ctest")
    ap.add_argument("--rerun", default="ctest --test-dir <build dir> -R '{regex}'")
    ap.add_argument("--what", default="ctest")
    a = ap.parse_args()

    try:
        with open(a.tests_json, encoding="utf-8") as f:
            tests = json.load(f).get("tests", [])
    except (OSError, ValueError) as e:
        print(f"{a.what}: the test list is unreadable ({e}); the outcome rests on ctest's status alone")
        return 0 if a.step_rc == 0 else 1
    timeout = {}
    for t in tests:
        for p in t.get("properties") or []:
            if p.get("name") == "TIMEOUT":
                timeout[t["name"]] = float(p["value"])
    names = [t["name"] for t in tests]
    try:
        with open(a.log, encoding="utf-8", errors="replace") as f:
            log = f.read()
    except OSError:
        log = ""
    stop_passed = STOP in log
    step_cut = a.step_rc in (124, 137)

    seen = {}
    for line in log.splitlines():
        m = RESULT.match(line)
        if m:
            status = m.group(2) + (f" ({m.group(3)})" if m.group(3) else "")
            seen[m.group(1)] = (status, float(m.group(4)))

    outcome = {}
    for n in names:
        if n not in seen:
            # Never reported: not started (or still running when the step's timeout ended ctest).
            if stop_passed or step_cut:
                outcome[n] = ("cut", "not run: the time budget ended first")
            else:
                outcome[n] = ("failed", "missing from ctest's output")
            continue
        status, secs = seen[n]
        if status == "Passed":
            outcome[n] = ("passed", "")
        elif status in ("Skipped", "Disabled"):
            outcome[n] = ("skipped", status)
        elif status == "Timeout":
            # Before its own TIMEOUT, only the stop time ends a test (ctest then also says so;
            # without a TIMEOUT to compare with, that line decides).
            own = timeout.get(n)
            if (own is not None and secs < own - 1.0) or (own is None and stop_passed):
                outcome[n] = ("cut", f"stopped at the budget's end after {secs:.0f} s (its TIMEOUT is "
                                     f"{own:.0f} s)" if own else f"stopped at the budget's end after {secs:.0f} s")
            else:
                outcome[n] = ("failed", f"Timeout after {secs:.0f} s (its own TIMEOUT)")
        else:
            outcome[n] = ("failed", f"{status} after {secs:.1f} s")

    count = {k: sum(1 for v in outcome.values() if v[0] == k) for k in ("passed", "failed", "skipped", "cut")}
    print(f"{a.what}: {count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped, "
          f"{count['cut']} cut by the time budget (not failures), of {len(names)}")
    for kind in ("failed", "cut", "skipped"):
        for n in names:
            if outcome[n][0] == kind:
                print(f"  {kind}: {n}" + (f" ({outcome[n][1]})" if outcome[n][1] else ""))
    cut = [n for n in names if outcome[n][0] == "cut"]
    if cut:
        print("  rerun the cut ones: " + a.rerun.replace("{regex}", "^(" + "|".join(cut) + ")$"))
    if count["failed"]:
        return 1
    return 3 if cut else 0


if __name__ == "__main__":
    sys.exit(main())
