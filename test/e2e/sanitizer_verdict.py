#!/usr/bin/env python3
"""run_sanitizer.sh tells a sanitizer finding from a sanitizer that could not attach.

Without a GPU: the test program and compute-sanitizer are both stand-ins (shell scripts written
here). The fake sanitizer prints what the real one prints in each case and exits as it does:

  - it cannot attach to the device (seen on some GPU machines): "sanitizer unavailable", status
    77 (ctest: skipped), and the line lands in $ZERO_SANITIZER_REPORT; never a failure;
  - it reports an error (memcheck, racecheck): a failure, whatever the test did;
  - the test fails under a working sanitizer: that failure, passed on;
  - a clean run: 0; no device (the probe's 77): 77 without running the sanitizer;
  - initcheck findings that all lie inside library kernels (cuBLASLt, CUB): listed, not counted,
    where the test itself passed; one in a kernel of ours, or any other tool's, fails.

    sanitizer_verdict.py RUN_SANITIZER_SH WORKDIR
"""
import os
import shutil
import stat
import subprocess
import sys

script, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def write(name, text):
    path = os.path.join(work, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


# The test program: the probe answers PROBE_RC; a real run prints and exits TEST_RC.
exe = write("test_fake", 'if [ -n "$ZERO_TEST_PROBE" ]; then exit "${PROBE_RC:-0}"; fi\n'
                         'echo "test ran: $*"\n'
                         'if [ "${TEST_RC:-0}" = 0 ]; then echo "All tests passed (3 assertions in 1 test case)"; fi\n'
                         'exit "${TEST_RC:-0}"\n')
SANITIZERS = {
    # What compute-sanitizer prints where its debugger interface cannot reach the device.
    "attach": 'echo "========= COMPUTE-SANITIZER"\n'
              'echo "========= Internal Sanitizer Error: The Sanitizer failed to initialize the device"\n'
              'echo "========= Error: Target application terminated before first instrumented API call"\n'
              "exit 255\n",
    "finding": 'echo "========= COMPUTE-SANITIZER"\n'
               'echo "========= Invalid __global__ read of size 4 bytes"\n'
               '"$@"\n'
               'echo "========= ERROR SUMMARY: 3 errors"\n'
               "exit 1\n",
    "race": 'echo "========= COMPUTE-SANITIZER"\n'
            '"$@"\n'
            'echo "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"\n'
            "exit 0\n",
    # initcheck inside cuBLASLt's and CUB's own kernels only (the two forms of the "at" line).
    "library": 'echo "========= COMPUTE-SANITIZER"\n'
               'echo "========= Uninitialized __global__ memory read of size 4 bytes"\n'
               'echo "=========     at void cub::CUB_300000_SM_900::detail::radix_sort::OnesweepKernel<int>(int *)+0x1a0"\n'
               'echo "=========     by thread (0,0,0) in block (0,0,0)"\n'
               'echo "========= Uninitialized __global__ memory read of size 16 bytes"\n'
               'echo "=========     at 0x3f0 in sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"\n'
               '"$@"\n'
               'echo "========= ERROR SUMMARY: 2 errors"\n'
               "exit 1\n",
    # ... and one in a kernel of ours beside them.
    "ours": 'echo "========= COMPUTE-SANITIZER"\n'
            'echo "========= Uninitialized __global__ memory read of size 4 bytes"\n'
            'echo "=========     at void cub::CUB_300000_SM_900::detail::radix_sort::OnesweepKernel<int>(int *)+0x1a0"\n'
            'echo "========= Uninitialized __global__ memory read of size 2 bytes"\n'
            'echo "=========     at void zero::gpt::encoder_backward_kernel(const int *, float *)+0x80"\n'
            '"$@"\n'
            'echo "========= ERROR SUMMARY: 2 errors"\n'
            "exit 1\n",
    "clean": 'echo "========= COMPUTE-SANITIZER"\n'
             '"$@"; rc=$?\n'
             'echo "========= ERROR SUMMARY: 0 errors"\n'
             "exit $rc\n",
}
# Each skips its own options (--tool memcheck ...) to reach the program, as the real one does.
SKIP_OPTIONS = 'while [ "${1#--}" != "$1" ]; do shift 2; done\n'
for name, body in SANITIZERS.items():
    body = SKIP_OPTIONS + body
    os.makedirs(os.path.join(work, name))
    # Named as the real tool and found on PATH, as the kit finds it.
    shutil.move(write(f"{name}.sh", body), os.path.join(work, name, "compute-sanitizer"))

failures = []


def check(what, sanitizer, want_rc, want=(), absent=(), probe_rc=0, test_rc=0, unavailable=False,
          tool="memcheck"):
    report = os.path.join(work, "report.txt")
    if os.path.exists(report):
        os.remove(report)
    env = dict(os.environ, PATH=os.path.join(work, sanitizer) + os.pathsep + os.environ["PATH"],
               PROBE_RC=str(probe_rc), TEST_RC=str(test_rc), ZERO_SANITIZER_REPORT=report)
    p = subprocess.run(["sh", script, exe, "compute-sanitizer", "--tool", tool, "--error-exitcode", "1",
                        "--", "[kernels]"], env=env, capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    reported = open(report, encoding="utf-8").read() if os.path.exists(report) else ""
    problems = []
    if p.returncode != want_rc:
        problems.append(f"status {p.returncode}, want {want_rc}")
    problems += [f"no '{w}' in the output" for w in want if w not in out]
    problems += [f"'{a}' in the output" for a in absent if a in out]
    if unavailable and "sanitizer unavailable" not in reported:
        problems.append("the unavailable sanitizer is not in $ZERO_SANITIZER_REPORT")
    if not unavailable and reported:
        problems.append(f"$ZERO_SANITIZER_REPORT written: {reported!r}")
    print(f"{what}: status {p.returncode}" + ("" if not problems else " -- " + "; ".join(problems)))
    if problems:
        failures.append(f"{what}: " + "; ".join(problems) + "\n" + out)


check("cannot attach", "attach", 77,
      want=["sanitizer unavailable: compute-sanitizer could not attach to the device, so test_fake was not checked",
            "Internal Sanitizer Error", "[status 255]"], unavailable=True)
check("memcheck finding", "finding", 1, want=["ERROR SUMMARY: 3 errors", "test ran: [kernels]"],
      absent=["sanitizer unavailable"])
check("racecheck finding without --error-exitcode's status", "race", 1, absent=["sanitizer unavailable"])
check("clean run", "clean", 0, want=["test ran: [kernels]"], absent=["sanitizer unavailable"])
check("the test fails under a working sanitizer", "clean", 3, test_rc=3, absent=["sanitizer unavailable"])
check("no device: the probe's skip, the sanitizer never runs", "attach", 77, probe_rc=77,
      absent=["COMPUTE-SANITIZER", "sanitizer unavailable"])
check("a broken GPU setup: the probe's failure", "clean", 1, probe_rc=1, absent=["COMPUTE-SANITIZER"])
check("initcheck inside library kernels only: theirs, not counted", "library", 0, tool="initcheck",
      want=["initcheck's 2 displayed finding(s) in test_fake all lie inside library kernels", "library kernel: "])
check("initcheck inside library kernels, but the test failed", "library", 1, tool="initcheck", test_rc=4,
      want=["all lie inside library kernels"])
check("initcheck in a kernel of ours beside a library's: a failure", "ours", 1, tool="initcheck",
      absent=["all lie inside library kernels"])
check("memcheck inside a library kernel: a failure (only initcheck's are excused)", "library", 1,
      absent=["all lie inside library kernels"])

if failures:
    sys.exit("\n".join(failures))
print("run_sanitizer.sh: a finding fails, a sanitizer that cannot attach is reported unavailable")
