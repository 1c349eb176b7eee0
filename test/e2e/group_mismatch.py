#!/usr/bin/env python3
"""Collective-order mistakes between process groups, end to end (group_mismatch_job.cpp).

tensor-vs-data: on 4 ranks (TP 2 x DP 2) rank 0 all-reduces over its tensor group while the
others reduce-scatter over their data groups. No collective check can pair statements made on
different communicators, so the stuck ranks are caught by the deadline (ZERO_TIMEOUT_S=3): the
job must end within seconds with a non-zero status, no rank may pass the mismatch, and the
reports must name both calls with their groups in world ranks: rank 0's tensor all_reduce
waiting for world rank 1, and rank 2's data reduce_scatter waiting for world rank 0.

data-order: within the data groups, ranks 0 and 1 all-reduce while 2 and 3 reduce-scatter: the
collective check of the data group's communicator ends the job at once (deadline 60 s), each
rank's call named.

    group_mismatch.py MPIEXEC "FLAGS;..." GROUP_MISMATCH_JOB
"""
import re
import sys

from mpi_job import MpiJob

job = MpiJob(*sys.argv[1:4])
check = job.check



def run(mode, timeout_s, limit_s):
    """Runs one mode on 4 ranks; checks it ended, non-zero, within limit_s, no rank passing."""
    p, took = job.run(4, mode, env={"ZERO_TIMEOUT_S": str(timeout_s)}, limit=60)
    print(f"{mode}: the job ended in {took:.1f} s with status {p.returncode}")
    out = p.stdout + p.stderr
    check(p.returncode != 0, f"{mode}: exit status {p.returncode}, expected non-zero", p)
    check(took < limit_s, f"{mode}: the job took {took:.1f} s to end with ZERO_TIMEOUT_S={timeout_s}", p)
    check("passed the mismatched" not in out, f"{mode}: a rank passed the mismatched collectives", p)
    for bad in ("MPI Error", "Segmentation", "terminate called"):
        check(bad not in out, f"{mode}: '{bad}' in the output", p)
    return p, out


p, out = run("tensor-vs-data", 3, 30)
check(re.search(r"\[rank 0/4\] error: all_reduce #\d+ of 4 fp32 \(16 bytes\) on the tensor group \(world ranks 0, 1\) "
                r"did not complete within the collective deadline .*: world rank 1 \(host [^)]+\) did not arrive", out) is not None,
      "tensor-vs-data: no report of rank 0's tensor all_reduce naming world rank 1", p)
check(re.search(r"\[rank 2/4\] error: reduce_scatter #\d+ of 4 fp32 .* on the data group \(world ranks 0, 2\) "
                r"did not complete within the collective deadline .*: world rank 0 \(host [^)]+\) did not arrive", out) is not None,
      "tensor-vs-data: no report of rank 2's data reduce_scatter naming world rank 0", p)

p, out = run("data-order", 60, 30)
check("collective mismatch" in out and "did not complete within" not in out,
      "data-order: no collective-mismatch error, or a deadline instead", p)
check(re.search(r"rank 0: a direct communicator call: all_reduce of 4 fp32", out) is not None and
      re.search(r"rank 1: a direct communicator call: reduce_scatter of 4 fp32", out) is not None,
      "data-order: the error does not name both ranks' calls (data-group ranks 0 and 1)", p)

sys.exit(job.finish())
