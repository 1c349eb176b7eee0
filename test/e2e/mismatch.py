#!/usr/bin/env python3
"""The collective check, end to end (mismatch_job.cpp runs the ranks).

rank0-eval: at stage 3 on 2 ranks, rank 0 alone runs a forward pass while rank 1 trains on (what
llm.c's trainer does when it samples on rank 0). The job must end well within the deadline with
a non-zero status and one libzero error naming each rank's call, and no MPI error or memory
corruption on the way.

rank0-gather-all: rank 0 alone calls gather_all while rank 1 trains on, at stages 0-3: the same
end as rank0-eval (at stages 0-2 gather_all moves nothing, but it is collective all the same).

gather-all: the supported way (Engine::gather_all, then rank 0 reads locally) succeeds.

    mismatch.py MPIEXEC "FLAGS;..." MISMATCH_JOB
"""
import re
import sys

from mpi_job import MpiJob

job = MpiJob(*sys.argv[1:4])
check = job.check


def run(n, *args):
    return job.run(n, *args, env={"ZERO_TIMEOUT_S": "30"})


p, took = run(2, "rank0-eval")
print(f"rank0-eval: the job ended in {took:.1f} s with status {p.returncode}")
check(p.returncode != 0, f"rank0-eval: exit status {p.returncode}, expected non-zero", p)
check(took < 30, f"rank0-eval: {took:.1f} s, longer than the 30 s deadline: the check did not fire", p)
check("trained on after" not in p.stderr, "rank0-eval: a rank trained on past the mismatch", p)
out = p.stdout + p.stderr
check("collective mismatch" in out, "rank0-eval: no collective-mismatch error", p)
# Rank 0 gathers unit 'embed' for its forward pass; rank 1 gathers it to train.
check(re.search(r"rank 0: gather\(embed\) \[eval\]: all_gather of \d+ fp32", out) is not None,
      "rank0-eval: the error does not name rank 0's eval gather", p)
check(re.search(r"rank 1: gather\(embed\): all_gather of \d+ fp32", out) is not None,
      "rank0-eval: the error does not name rank 1's training gather", p)
check("gather_all" in out, "rank0-eval: the error does not say what to do (gather_all)", p)
for bad in ("MPI Error", "invalid pointer", "Segmentation", "terminate called", "did not complete within"):
    check(bad not in out, f"rank0-eval: '{bad}' in the output", p)

# gather_all on rank 0 only: caught at every stage (at stages 0-2 nothing is gathered, but the
# call is collective all the same), not only where it all-gathers.
for stage in ("0", "1", "2", "3"):
    what = f"rank0-gather-all at stage {stage}"
    p, took = run(2, "rank0-gather-all", stage)
    print(f"{what}: the job ended in {took:.1f} s with status {p.returncode}")
    out = p.stdout + p.stderr
    check(p.returncode != 0, f"{what}: exit status {p.returncode}, expected non-zero", p)
    check(took < 30, f"{what}: {took:.1f} s, longer than the 30 s deadline: the check did not fire", p)
    check("trained on after" not in p.stderr, f"{what}: a rank trained on past the mismatch", p)
    check("collective mismatch" in out, f"{what}: no collective-mismatch error", p)
    check(re.search(r"rank 0: gather_all(\(\w+\))? \[eval\]: (barrier|all_gather)", out) is not None,
          f"{what}: the error does not name rank 0's gather_all", p)
    check(re.search(r"rank 1: (reduce|gather)\(\w+\): ", out) is not None,
          f"{what}: the error does not name rank 1's training call", p)

p, took = run(2, "gather-all")
print(f"gather-all: status {p.returncode} in {took:.1f} s")
check(p.returncode == 0, f"gather-all: exit status {p.returncode}", p)
check("rank 0 read 5 units through gather_all, equal to full_params" in p.stdout, "gather-all: rank 0 did not read", p)
check(all(f"rank {r}: trained on, step 3" in p.stdout for r in (0, 1)), "gather-all: the ranks did not train on", p)

sys.exit(job.finish())
