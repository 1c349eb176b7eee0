#!/usr/bin/env python3
"""The GPU kit's time budget, on simulated durations: a dry run of .ci/gpu/gpu_verify.sh.

A device call is 10 minutes and the kit's budget 570 s; the build, the tests and the sanitizer
share it. No GPU and no minutes are needed to check how: the script runs as it is, but its clock
is a file (ZERO_VERIFY_CLOCK) and the programs it calls (nvidia-smi, nvcc, cmake, ninja, ctest,
timeout, compute-sanitizer, mpicc, mpiexec, nproc and the built tests) are stand-ins that advance that
clock by a simulated duration instead of taking it. The stand-in ctest schedules as ctest 3.25
does (highest COST first, PROCESSORS against -j, each test's timeout cut to --stop-time, nothing
started once the stop time has passed, and its output lines as ctest prints them); the stand-in
timeout ends a step at its cap as timeout(1) would.

The durations are estimates for an H100 machine with 16 cores (the build's 200 s, each test's
seconds), set below; what is checked is the arithmetic around them:

  first call (--no-bench, tests that fit): ctest gets more than its 150 s floor, the longest
      entries (test_cuda_engine_*, gpt_cuda_train_*) start first, the sanitizer step gets at
      least its reserve and runs the short set, and the run passes (status 0);
  slow tests (the engine's runs three times longer): the tests the budget stops are "cut", not
      failed, with a rerun line; the sanitizer still gets its reserve, the sanitizer runs it
      does not reach are cut too, and the verdict is INCOMPLETE (status 3), not FAIL;
  a failure beside a cut: the failure is named as failed and the run fails (status 1).

Then the real ctest, on a project of sleeps with a --stop-time 4 s ahead, so that the reading
of its output (ctest_outcome.py) is checked against what ctest itself prints: a test killed at
the stop time and one never started are cut, one past its own TIMEOUT failed.

    gpu_verify_budget.py GPU_VERIFY_SH WORKDIR CMAKE CTEST
"""
import datetime
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

script, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
cmake_exe, ctest_exe = sys.argv[3], sys.argv[4]
src = os.path.dirname(os.path.dirname(os.path.dirname(script)))  # .ci/gpu/gpu_verify.sh -> root

# ------------------------------------------------------------------------------ the stand-ins
# One program, told apart by the name it is called by (argv[0]).
FAKE = r'''#!/usr/bin/env python3
import datetime, json, os, re, subprocess, sys, time
CLOCK = os.environ["ZERO_VERIFY_CLOCK"]
SIM = json.load(open(os.environ["ZERO_SIM"]))
EVENTS = os.environ["ZERO_SIM_EVENTS"]
me = os.path.basename(sys.argv[0])
args = sys.argv[1:]

def now():
    return int(open(CLOCK).read())

def set_clock(t):
    with open(CLOCK, "w") as f:
        f.write(str(int(t)))

def deadline():
    d = os.environ.get("ZERO_SIM_DEADLINE")
    return int(d) if d else 1 << 62

def event(*words):
    with open(EVENTS, "a") as f:
        f.write(" ".join(str(w) for w in (now(),) + words) + "\n")

def spend(seconds):
    """Advances the clock; False (the clock at the deadline) where the step's timeout ends first."""
    t, d = now(), deadline()
    if t + seconds > d:
        set_clock(max(t, d))
        return False
    set_clock(t + seconds)
    return True

def program(path, name):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write('#!/bin/sh\n[ -n "$ZERO_TEST_PROBE" ] && exit 0\n'
                'echo "All tests passed (12 assertions in 3 test cases)"\n')
    os.chmod(path, 0o755)

def opt(name, default=None):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default

if me == "timeout":
    i = 0
    while args[i].startswith("-"):
        i += 2 if args[i] in ("-k", "-s") else 1
    cap, cmd = int(float(args[i])), args[i + 1:]
    d = min(deadline(), now() + cap)
    env = dict(os.environ, ZERO_SIM_DEADLINE=str(d))
    rc = subprocess.call(cmd, env=env)
    sys.exit(124 if rc == 124 or now() >= d and rc != 0 else rc)

if me == "nvidia-smi":
    if "-L" in args:
        print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-simulated)")
    else:
        print("name, compute_cap, driver_version, memory.total [MiB], memory.used [MiB]")
        print("NVIDIA H100 80GB HBM3, 9.0, 580.65.06, 81559 MiB, 0 MiB")
    sys.exit(0)

# The compilers: what they say when asked, and the probe program they "build" (-o), which
# prints what the real one prints; the deps step's unpacking is charged to the MPI probe's build.
COMPILERS = {
    "nvcc": ("--version", "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88",
             ["cuda probe: 1 device(s) (no error), driver 13000, runtime 13000",
              "cuda probe: device 0 NVIDIA H100, sm_90, 132 SMs, 79.1 GiB",
              "cuda probe: kernel no error, value 3145725 (want 3145725)"], "probe"),
    "mpicc": ("--showme", "-I/usr/lib/x86_64-linux-gnu/openmpi/include", ["mpi probe: 2 ranks, sum 3"], "deps"),
}
if me in COMPILERS:
    ask, answer, lines, cost = COMPILERS[me]
    if any(a.startswith(ask) for a in args):
        print(answer)
        sys.exit(0)
    with open(opt("-o"), "w") as f:
        f.write("#!/bin/sh\n" + "".join(f'echo "{line}"\n' for line in lines))
    os.chmod(opt("-o"), 0o755)
    spend(SIM[cost])
    sys.exit(0)

if me == "mpiexec":
    if "--version" in args:
        print("mpiexec (OpenRTE) 4.1.4")
        sys.exit(0)
    prog = [a for a in args if os.path.isfile(a)]
    sys.exit(subprocess.call(prog[:1]) if prog else 0)

if me == "nproc":  # the H100 machine's cores
    print(16)
    sys.exit(0)

if me == "ninja":
    if "--version" in args:
        print("1.11.1")
    sys.exit(0)

if me == "cmake":
    if "--version" in args:
        print("cmake version 3.28.3")
        sys.exit(0)
    if "--build" in args:
        build = args[args.index("--build") + 1]
        targets = args[args.index("--target") + 1:]
        targets = targets[:targets.index("--")] if "--" in targets else targets
        event("build", *targets)
        if not spend(SIM["build"]):
            print("ninja: build stopped: interrupted by user.")
            sys.exit(124)
        paths = {os.path.basename(p): p for t in SIM["tests"] for p in t["programs"]}
        for t in targets:
            program(paths.get(t, os.path.join(build, "other", t)), t)
        print(f"[{len(targets)}/{len(targets)}] Linking CXX executable ...")
        sys.exit(0)
    build = opt("-B")
    os.makedirs(build, exist_ok=True)
    with open(os.path.join(build, "CMakeCache.txt"), "w") as f:
        f.write("NCCL_INCLUDE_DIR:PATH=/simulated/include\n")
    print("-- CUDA backend: ON")
    sys.exit(0 if spend(SIM["configure"]) else 124)

if me == "compute-sanitizer":
    i, tool = 0, "memcheck"
    while i < len(args) and args[i].startswith("--"):
        if args[i] == "--tool":
            tool = args[i + 1]
        i += 2
    exe = args[i]
    name = f"{os.path.basename(exe)}_{tool}"
    event("sanitizer-start", name)
    print("========= COMPUTE-SANITIZER")
    if not spend(SIM["sanitizer"].get(name, SIM["sanitizer"]["default"])):
        event("sanitizer-killed", name)
        sys.exit(124)
    subprocess.call([exe] + args[i + 1:])
    print("========= ERROR SUMMARY: 0 errors")
    event("sanitizer-end", name)
    sys.exit(0)

if me == "ctest":
    tests = SIM["tests"]
    label, exclude, include = opt("-L"), opt("-E"), opt("-R")
    sel = [t for t in tests if (not label or any(re.search(label, l) for l in t["labels"]))
           and (not exclude or not re.search(exclude, t["name"]))
           and (not include or re.search(include, t["name"]))]
    if "--show-only=json-v1" in args:
        print(json.dumps({"kind": "ctestInfo", "version": {"major": 1, "minor": 0}, "tests": [
            {"name": t["name"], "command": t["programs"],
             "properties": [{"name": "LABELS", "value": t["labels"]}, {"name": "TIMEOUT", "value": t["timeout"]},
                            {"name": "PROCESSORS", "value": t["procs"]}]
                           + ([{"name": "COST", "value": t["cost"]}] if t["cost"] else [])} for t in sel]}))
        sys.exit(0)
    jobs = int(opt("-j", "1"))
    start = now()
    stop = None
    if opt("--stop-time"):
        h, m, s = (int(x) for x in opt("--stop-time").split(":"))
        day = datetime.datetime.fromtimestamp(start).replace(hour=h, minute=m, second=s, microsecond=0)
        stop = int(day.timestamp())
    number = {t["name"]: i + 1 for i, t in enumerate(tests)}
    print(f"Test project {opt('--test-dir')}")
    pending = sorted(sel, key=lambda t: -t["cost"])  # stable: declared order among equals
    running, t, free, done, stopped = [], start, jobs, [], False

    def stop_passed():  # ctest says so once: at a test it kills at the stop time, or at the next start
        global stopped
        if not stopped:
            print("The stop time has been passed. Stopping all tests.")
            stopped = True

    while True:
        if pending and stop is not None and t >= stop:
            stop_passed()
        if not stopped:
            for test in list(pending):
                need = min(test["procs"], jobs)
                if need <= free:
                    limit = test["timeout"] if stop is None else min(test["timeout"], max(stop - t, 1))
                    print(f"      Start {number[test['name']]:>2}: {test['name']}")
                    set_clock(t)
                    event("ctest-start", test["name"])
                    running.append((t + min(test["duration"], limit), t, test, limit))
                    pending.remove(test)
                    free -= need
        if not running:
            break
        nxt = min(r[0] for r in running)
        if nxt > deadline():  # the kit's timeout ends ctest: no summary
            set_clock(deadline())
            sys.exit(124)
        t = nxt
        set_clock(t)
        for r in [r for r in running if r[0] == t]:
            running.remove(r)
            _, began, test, limit = r
            free += min(test["procs"], jobs)
            if test["duration"] > limit:
                status = "Timeout"
                if limit < test["timeout"]:
                    stop_passed()
            else:
                status = {"pass": "Passed", "skip": "Skipped", "fail": "Failed"}[test["result"]]
            done.append((test, status))
            event("ctest-end", test["name"], status)
            field = "   Passed" if status == "Passed" else "***" + status
            print(f"{len(done):>2}/{len(sel)} Test #{number[test['name']]:>2}: {test['name']} "
                  f"{'.' * max(3, 44 - len(test['name']))}{field}  {t - began:7.2f} sec")
    failed = [(x, s) for x, s in done if s in ("Failed", "Timeout")]
    print(f"\n{100 * (len(done) - len(failed)) // max(len(done), 1)}% tests passed, "
          f"{len(failed)} tests failed out of {len(done)}\n\nTotal Test time (real) = {t - start:.2f} sec")
    skipped = [x for x, s in done if s == "Skipped"]
    if skipped:
        print("\nThe following tests did not run:")
        for x in skipped:
            print(f"\t{number[x['name']]:>3} - {x['name']} (Skipped)")
    if failed:
        print("\nThe following tests FAILED:")
        for x, s in failed:
            print(f"\t{number[x['name']]:>3} - {x['name']} ({s})")
        print("Errors while running CTest")
    junit = opt("--output-junit")
    if junit:
        open(junit, "w").write("<testsuite/>\n")
    sys.exit(8 if failed else 0)

sys.exit(f"fake: unknown program {me}")
'''

STUBS = ["nproc", "timeout", "nvidia-smi", "nvcc", "mpicc", "mpiexec", "ninja", "cmake", "ctest", "compute-sanitizer"]


def scenario_tests(build, engine_scale=1.0, failing=()):
    """The gpu entries of test/gpu/CMakeLists.txt: (name, seconds, COST, ranks), one GPU."""
    g = os.path.join(build, "test", "gpu")
    rows = [("test_cuda_kernels", 15, 0, 1), ("test_cuda_watchdog", 20, 0, 1), ("test_cuda_quantize", 10, 0, 1),
            ("test_cuda_sticky_error", 5, 0, 1), ("test_cuda_sticky_error_nccl", 8, 0, 1)]
    rows += [(f"test_cuda_comm_{c}", s, 0, n) for c, s, n in
             (("nccl_np1", 15, 1), ("nccl_np2", 1, 2), ("mpi_np1", 15, 1), ("mpi_np2", 20, 2), ("mpi_np3", 25, 3),
              ("mpi_np4", 30, 4))]
    rows += [(f"test_cuda_engine_{c}", int(s * engine_scale), 100 + n, n) for c, s, n in
             (("nccl_np1", 60, 1), ("nccl_np2", 1, 2), ("mpi_np1", 60, 1), ("mpi_np2", 75, 2), ("mpi_np3", 85, 3),
              ("mpi_np4", 95, 4))]
    rows += [("test_cuda_engine_mpi_np4_nodes2", int(70 * engine_scale), 104, 4),
             ("test_gpt_attention", 10, 0, 1), ("test_gpt_kernels", 20, 0, 1), ("test_gpt_matmul", 20, 0, 1),
             ("test_offload_timeline", 15, 0, 1), ("test_gpt_cuda_model", 40, 0, 1)]
    rows += [(name, s, 100 + n, n) for name, s, n in
             (("gpt_cuda_train_np1", 70, 1), ("gpt_cuda_train_np2", 90, 2), ("gpt_cuda_train_nccl_np1", 60, 1),
              ("gpt_cuda_train_nccl_np2", 1, 2))]
    rows += [("test_gpt_cuda_ops_io", 5, 0, 1)]
    tests = []
    for name, secs, cost, ranks in rows:
        prog = re.sub(r"_(nccl|mpi)_np\d.*$|_np\d$|_nccl$", "", name).replace("test_cuda_sticky_error", "test_cuda_kernels")
        programs = [os.path.join(g, prog)]
        if name.startswith("gpt_cuda_train"):
            programs = [os.path.join(build, "examples", "gpt", "zero-gpt"), os.path.join(g, "test_gpt_cuda_model")]
        skip = "_nccl_np2" in name  # two GPUs needed, the node has one
        tests.append({"name": name, "labels": ["gpu"], "duration": secs, "cost": cost, "procs": ranks,
                      "timeout": 1500 if "engine" in name else 1800 if "train" in name else 600,
                      "result": "skip" if skip else "fail" if name in failing else "pass", "programs": programs})
    # ctest's sanitizer entries (test/gpu/CMakeLists.txt), run by the sanitizer step.
    for prog, tools in (("test_cuda_kernels", ("memcheck", "racecheck")), ("test_cuda_engine", ("memcheck",)),
                        ("test_cuda_quantize", ("memcheck", "racecheck")), ("test_gpt_attention", ("memcheck", "racecheck")),
                        ("test_gpt_kernels", ("memcheck", "racecheck")), ("test_gpt_matmul", ("memcheck", "racecheck")),
                        ("test_gpt_cuda_model", ("memcheck", "racecheck")), ("test_gpt_cuda_ops_io", ("memcheck", "racecheck"))):
        for tool in tools:
            tests.append({"name": f"{prog}_{tool}", "labels": ["gpu"], "duration": 15, "cost": 0, "procs": 1,
                          "timeout": 1800, "result": "pass", "programs": [os.path.join(g, prog)]})
    return tests


def run(name, flags, env_extra=None, engine_scale=1.0, failing=(), sanitizer=None, build_s=200):
    w = os.path.join(work, name)
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(os.path.join(w, "bin"))
    for d in ("include", "lib", "lib64"):
        os.makedirs(os.path.join(w, "cuda", d))
    # The toolkit the kit finds from nvcc (CUDA_HOME): NCCL's header and library, cuBLASLt, the sanitizer.
    open(os.path.join(w, "cuda", "include", "nccl.h"), "w").write(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n")
    open(os.path.join(w, "cuda", "lib", "libnccl.so"), "w").close()
    open(os.path.join(w, "cuda", "lib64", "libcublasLt.so"), "w").close()
    fake = os.path.join(w, "bin", "fake.py")
    with open(fake, "w") as f:
        f.write(FAKE)
    os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
    for s in STUBS:
        os.symlink(fake, os.path.join(w, "bin", s))
    os.symlink(os.path.join(w, "bin"), os.path.join(w, "cuda", "bin"))
    build = os.path.join(w, "build")
    sim = {"probe": 5, "deps": 15, "configure": 30, "build": build_s,
           "tests": scenario_tests(build, engine_scale, failing),
           "sanitizer": dict({"default": 15}, **(sanitizer or {}))}
    json.dump(sim, open(os.path.join(w, "sim.json"), "w"))
    # Noon today: no --stop-time crosses midnight.
    start = int(datetime.datetime.combine(datetime.date.today(), datetime.time(12)).timestamp())
    clock = os.path.join(w, "clock")
    open(clock, "w").write(str(start))
    env = dict(os.environ, PATH=os.path.join(w, "bin") + os.pathsep + os.environ["PATH"],
               ZERO_VERIFY_CLOCK=clock, ZERO_SIM=os.path.join(w, "sim.json"),
               ZERO_SIM_EVENTS=os.path.join(w, "events.txt"), CUDA_HOME=os.path.join(w, "cuda"),
               BUILD_DIR=build, LOG_DIR=os.path.join(w, "logs"), DEPS_PREFIX=os.path.join(w, "deps"))
    for k in ("OUT", "BUDGET_S", "SAN_SET", "SAN_RESERVE_S", "CTEST_REGEX", "CTEST_J", "ZERO_DEBS_DIR", "NCCL_HOME"):
        env.pop(k, None)
    env.update(env_extra or {})
    open(os.path.join(w, "events.txt"), "w").close()
    t0 = time.time()
    p = subprocess.run(["bash", script, "--system-deps"] + flags, cwd=src, env=env, capture_output=True, text=True,
                       timeout=240)
    out = p.stdout + p.stderr
    with open(os.path.join(w, "output.txt"), "w") as f:
        f.write(out)
    events = [line.split() for line in open(os.path.join(w, "events.txt"))]
    caps = {m.group(1): int(m.group(2)) for m in re.finditer(r"=== step (\S+): cap (\d+)s", out)}
    summary = open(os.path.join(w, "logs", "summary.txt")).read()
    used = int(open(clock).read()) - start
    print(f"{name}: status {p.returncode}, {used} simulated s of 570 ({time.time() - t0:.1f} s real); "
          f"caps {caps}")
    return p.returncode, out, summary, events, caps, used


failures = []


def expect(what, ok, detail=""):
    print(f"  {'ok ' if ok else 'NOT'} {what}")
    if not ok:
        failures.append(f"{what}: {detail}")


SHORT = {"test_cuda_kernels_memcheck", "test_cuda_kernels_racecheck", "test_cuda_quantize_memcheck",
         "test_cuda_quantize_racecheck", "test_gpt_attention_memcheck", "test_gpt_attention_racecheck",
         "test_gpt_kernels_memcheck", "test_gpt_kernels_racecheck", "test_cuda_kernels_initcheck",
         "test_cuda_kernels_synccheck", "test_gpt_attention_initcheck", "test_gpt_kernels_initcheck"}
LONG = re.compile(r"^(test_cuda_engine_|gpt_cuda_train_)")

# 1. The README's first call: tests that fit.
rc, out, summary, events, caps, used = run("first_call", ["--no-bench"])
expect("status 0 and PASS", rc == 0 and "overall: PASS" in summary, summary)
expect(f"ctest's cap ({caps.get('ctest_gpu')} s) is above the 150 s floor", caps.get("ctest_gpu", 0) > 150, caps)
expect(f"the sanitizer's cap ({caps.get('sanitizer')} s) is at least its 120 s reserve",
       caps.get("sanitizer", 0) >= 120, caps)
starts = [e[2] for e in events if e[1] == "ctest-start" and not e[2].endswith(("memcheck", "racecheck"))]
first = starts[:sum(1 for n in starts if LONG.search(n))]
expect("the long entries (test_cuda_engine_*, gpt_cuda_train_*) start before every other test",
       all(LONG.search(n) for n in first) and len(first) == 11, starts)
expect("ctest's outcome: all passed but the three two-GPU runs skipped, none cut",
       "ctest -L gpu: 25 passed, 0 failed, 3 skipped, 0 cut" in summary, summary)
ran = {e[2] for e in events if e[1] in ("ctest-start", "sanitizer-start") and e[2].endswith(
    ("memcheck", "racecheck", "initcheck", "synccheck"))}
expect("the sanitizer ran the short set, and only it (SAN_SET=short)", ran == SHORT, sorted(ran ^ SHORT))
expect("the build was asked for the programs of the tests and of the short set, not bench_collectives",
       any(e[1] == "build" and "test_cuda_engine" in e and "zero-gpt" in e and "bench_collectives" not in e
           for e in events), [e for e in events if e[1] == "build"])
expect(f"the run ends inside the budget ({used} s)", used <= 570, used)

# 2. Engine runs three times as long: the budget cuts tests; they are cut, not failed.
rc, out, summary, events, caps, used = run("slow_tests", ["--no-bench"], engine_scale=3.0,
                                           sanitizer={"test_gpt_attention_initcheck": 200})
cut = re.findall(r"^  cut: (\S+)", summary, re.M)
expect(f"tests the budget stopped read 'cut' ({len(cut)}: {' '.join(cut)})",
       any(LONG.search(n) for n in cut) and "0 failed" in summary.split("ctest -L gpu:")[1].split("\n")[0], summary)
expect("stopped at the budget's end, with its TIMEOUT named", "stopped at the budget's end after" in summary, summary)
expect("status 3, INCOMPLETE, not FAIL", rc == 3 and "overall: INCOMPLETE" in summary and "overall: FAIL" not in summary,
       summary)
expect("a rerun line for the cut tests", re.search(r"rerun the cut ones: CTEST_REGEX='\^\(", summary), summary)
expect(f"the sanitizer still gets its reserve ({caps.get('sanitizer')} s)", caps.get("sanitizer", 0) >= 120, caps)
expect("a sanitizer run the step's time does not cover is cut",
       re.search(r"^  cut: test_gpt_attention_initcheck", summary, re.M), summary)
expect(f"the run ends inside the budget ({used} s)", used <= 570, used)

# 3. A test that fails, beside the cut ones: FAIL, and the failure is named.
rc, out, summary, events, caps, used = run("failure_and_cut", ["--no-bench"], engine_scale=3.0,
                                           failing=("gpt_cuda_train_np2",))
expect("status 1 and FAIL", rc == 1 and "overall: FAIL" in summary, summary)
expect("the failure is listed as failed", re.search(r"^  failed: gpt_cuda_train_np2 \(Failed", summary, re.M),
       summary)
expect("the stopped ones are still cut", re.search(r"^  cut: test_cuda_engine_", summary, re.M), summary)

# 4. The real ctest's output, read by ctest_outcome.py.
proj = os.path.join(work, "real_ctest")
shutil.rmtree(proj, ignore_errors=True)
os.makedirs(proj)
with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
    f.write("cmake_minimum_required(VERSION 3.20)\nproject(stop NONE)\nenable_testing()\n"
            "add_test(NAME stopped COMMAND sleep 60)\n"
            "set_tests_properties(stopped PROPERTIES COST 10 TIMEOUT 600)\n"
            "add_test(NAME own_timeout COMMAND sleep 60)\n"
            "set_tests_properties(own_timeout PROPERTIES COST 5 TIMEOUT 1)\n"
            "add_test(NAME quick COMMAND true)\n"
            "set_tests_properties(quick PROPERTIES COST 4 TIMEOUT 600)\n"
            "add_test(NAME later COMMAND sleep 60)\n"
            "set_tests_properties(later PROPERTIES TIMEOUT 600)\n"
            "add_test(NAME never COMMAND sleep 1)\n"
            "set_tests_properties(never PROPERTIES TIMEOUT 600)\n")
b = os.path.join(proj, "build")
subprocess.run([cmake_exe, "-S", proj, "-B", b], check=True, capture_output=True)
with open(os.path.join(proj, "tests.json"), "w") as f:
    subprocess.run([ctest_exe, "--test-dir", b, "--show-only=json-v1"], check=True, stdout=f)
stop = time.time() + 4
if datetime.datetime.fromtimestamp(stop).date() != datetime.date.today():
    time.sleep(5)  # not across midnight
    stop = time.time() + 4
p = subprocess.run([ctest_exe, "--test-dir", b, "-j", "2",
                    "--stop-time", datetime.datetime.fromtimestamp(stop).strftime("%H:%M:%S")],
                   capture_output=True, text=True, timeout=120)
with open(os.path.join(proj, "ctest.log"), "w") as f:
    f.write(p.stdout + p.stderr)
o = subprocess.run([sys.executable, os.path.join(os.path.dirname(script), "ctest_outcome.py"),
                    os.path.join(proj, "tests.json"), os.path.join(proj, "ctest.log"), "--step-rc", str(p.returncode)],
                   capture_output=True, text=True)
print("real ctest:\n" + o.stdout)
expect("killed at the stop time: cut", re.search(r"^  cut: stopped \(stopped at the budget's end", o.stdout, re.M),
       o.stdout + p.stdout)
expect("started late and killed at the stop time: cut", re.search(r"^  cut: later ", o.stdout, re.M), o.stdout)
expect("never started: cut", re.search(r"^  cut: never \(not run", o.stdout, re.M), o.stdout)
expect("past its own TIMEOUT: failed", re.search(r"^  failed: own_timeout \(Timeout", o.stdout, re.M), o.stdout)
expect("1 passed, 1 failed, 0 skipped, 3 cut; status 1", "1 passed, 1 failed, 0 skipped, 3 cut" in o.stdout
       and o.returncode == 1, o.stdout)

if failures:
    sys.exit("gpu_verify_budget: " + "\n".join(failures))
print("gpu_verify_budget: the tests get more than their floor, the long ones start first, the sanitizer its "
      "share, and a test the budget stops reads 'cut'")
