"""Running a small MPI job under test and collecting what failed, for the job-level tests
(stall.py, mismatch.py): each runs a job program and checks what it prints and how it ends."""
import os
import subprocess
import time


class MpiJob:
    def __init__(self, mpiexec, flags, exe):
        self.mpiexec, self.flags, self.exe = mpiexec, flags.split(";"), exe
        self.failures = []

    def run(self, n, *args, env=None, limit=60):
        """Runs the job on n ranks; returns the CompletedProcess and the seconds it took."""
        e = dict(os.environ, **(env or {}))
        e.pop("ZERO_NCCL_TIMEOUT_S", None)
        e.pop("ZERO_COLLECTIVE_CHECK", None)
        t0 = time.monotonic()
        p = subprocess.run([self.mpiexec, *self.flags, "-n", str(n), self.exe, *args], env=e, capture_output=True,
                           text=True, timeout=limit)
        return p, time.monotonic() - t0

    def check(self, ok, what, p=None):
        if not ok:
            self.failures.append(what + ("" if p is None else f"\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"))

    def finish(self):
        for f in self.failures:
            print("FAIL:", f)
        return 1 if self.failures else 0
