#!/usr/bin/env python3
"""Collective deadlines of the host backend, end to end (stall_job.cpp runs the ranks).

stop: with ZERO_TIMEOUT_S=2 and the last of 3 ranks stopped (SIGSTOP) before an all_reduce,
the job must end within seconds, with status 124 (or any non-zero status mpiexec makes of it),
and every waiting rank must print which collective, its size and which rank did not arrive.

stop-node: ranks 2 and 3 of 4, one simulated node (ZERO_RANKS_PER_NODE=2), stop: the reports name
the node and its host, and say to check the host and the network first.

late: the last of 2 ranks joins 1.5 s late (deadline 60 s): the job succeeds and the waiting
rank spends a small fraction of the wait on the CPU (it backs off instead of spinning).

    stall.py MPIEXEC "FLAGS;..." STALL_JOB
"""
import re
import sys

from mpi_job import MpiJob

job = MpiJob(*sys.argv[1:4])
check = job.check


def run(n, timeout_s, *args, limit=60):
    return job.run(n, *args, env={"ZERO_TIMEOUT_S": str(timeout_s)}, limit=limit)


# A stopped rank: the others report it and the job ends.
p, took = run(3, 2, "stop")
print(f"stop: the job ended in {took:.1f} s with status {p.returncode}")
check(p.returncode != 0, f"stop: exit status {p.returncode}, expected non-zero", p)
check(took < 20, f"stop: the job took {took:.1f} s to end with ZERO_TIMEOUT_S=2", p)
check("completed without the stopped rank" not in p.stderr, "stop: a collective completed without a rank", p)
for r in (0, 1):
    m = re.search(rf"\[rank {r}/3\] error: all_reduce #1 of 1024 fp32 \(4096 bytes\) did not complete within the "
                  rf"collective deadline \(ZERO_TIMEOUT_S=2 s; waited [0-9.]+ s\): rank 2 \(host [^)]+\) did not arrive",
                  p.stderr)
    check(m is not None, f"stop: no exact report from rank {r}", p)
reports = re.findall(r"\[rank \d/3\] error: all_reduce #1 .*", p.stderr)
check(reports and all("waiting in it: ranks 0, 1" in line for line in reports),
      "stop: the reports do not name ranks 0 and 1 as waiting", p)
check(reports and all("ZERO_TIMEOUT_S" in line.split("did not arrive")[1] for line in reports),
      "stop: the reports do not say what to do", p)
# Each report ends with the rank's own last collectives: #1 all_reduce before the one it waits in.
check(reports and all(re.search(r"This rank's last collectives: #1 a direct communicator call: all_reduce of 1024 "
                                 r"fp32; #2 a direct communicator call: all_reduce of 1024 fp32$", line)
                      for line in reports), "stop: the reports do not list the rank's last collectives", p)

# A whole (simulated) node stopped: the reports name the node and its host, and point at the host
# and the network before the processes.
p, took = job.run(4, "stop-node", env={"ZERO_TIMEOUT_S": "2", "ZERO_RANKS_PER_NODE": "2"}, limit=60)
print(f"stop-node: the job ended in {took:.1f} s with status {p.returncode}")
check(p.returncode != 0 and took < 20, f"stop-node: status {p.returncode} after {took:.1f} s", p)
for r in (0, 1):
    m = re.search(rf"\[rank {r}/4\] error: all_reduce #1 .* ranks 2, 3 \(node 1, host [^)]+\) did not arrive .*"
                  rf"No rank of node 1 answered: check that host and the network to it first", p.stderr)
    check(m is not None, f"stop-node: rank {r}'s report does not name node 1 and the network", p)

# A late rank inside the deadline: correct result, and the wait costs little CPU.
p, took = run(2, 60, "late", "1.5")
check(p.returncode == 0, f"late: exit status {p.returncode}", p)
m = re.search(r"rank 0 waited ([0-9.]+) s, cpu ([0-9.]+) s", p.stdout)
check(m is not None, "late: rank 0 printed no wait figures", p)
if m:
    waited, cpu = float(m.group(1)), float(m.group(2))
    print(f"late: rank 0 waited {waited:.3f} s using {cpu:.3f} s of CPU ({100 * cpu / waited:.1f}%)")
    check(waited > 1.0, f"late: rank 0 waited only {waited:.3f} s", p)
    check(cpu < 0.25 * waited, f"late: rank 0 used {cpu:.3f} s of CPU in a {waited:.3f} s wait (spinning)", p)

sys.exit(job.finish())
