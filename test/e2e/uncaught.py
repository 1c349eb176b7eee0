#!/usr/bin/env python3
"""An exception that escapes outside Context::run ends the job cleanly (throw_job.cpp runs it).

Each rank that throws prints the zero::Error's message once, with its rank prefix; nothing says
"terminate called", no rank raises SIGABRT (no MPI runtime backtrace), and the job exits non-zero
within seconds, also when the other ranks wait in a collective for the one that threw.

    uncaught.py MPIEXEC "FLAGS;..." THROW_JOB
"""
import os
import re
import subprocess
import sys

mpiexec, flags, exe = sys.argv[1], sys.argv[2].split(";"), sys.argv[3]
failures = []
MESSAGE = r"error: throw_job: the loop failed outside ctx\.run\(\) on rank {r}; this is the message the test expects"


def check(ok, what, p):
    if not ok:
        failures.append(f"{what}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")


def run(cmd):
    # A long collective deadline: the terminate handler, not the deadline, must end the job.
    env = dict(os.environ, ZERO_TIMEOUT_S="300")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def common(p, name):
    out = p.stdout + p.stderr
    check(p.returncode != 0, f"{name}: exit status 0, expected non-zero", p)
    check("terminate called" not in out, f"{name}: the default terminate handler ran", p)
    check("Process received signal" not in out and "Aborted" not in out, f"{name}: a rank raised SIGABRT", p)
    return out


p = run([mpiexec, *flags, "-n", "2", exe, "last"])
out = common(p, "last")
check(len(re.findall(r"\[rank 1/2\] " + MESSAGE.format(r=1), out)) == 1, "last: rank 1's message not printed once", p)
check("on rank 0" not in out, "last: rank 0 threw", p)

p = run([mpiexec, *flags, "-n", "2", exe, "all"])
out = common(p, "all")
counts = [len(re.findall(rf"\[rank {r}/2\] " + MESSAGE.format(r=r), out)) for r in (0, 1)]
# The first rank to report aborts the job, which may stop the other before it prints.
check(1 <= sum(counts) and max(counts) == 1, f"all: messages per rank {counts}, expected each at most once", p)
print(f"all: messages per rank {counts}")

p = run([exe, "all"])  # world size 1, no launcher
out = common(p, "single")
check(len(re.findall(r"^" + MESSAGE.format(r=0), out, re.M)) == 1, "single: the message not printed once", p)

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
