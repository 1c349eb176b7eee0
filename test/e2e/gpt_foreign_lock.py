#!/usr/bin/env python3
"""Another user's lock file in a shared directory (mode 0777), end to end.

The job runs as user nobody; zero.lock in its checkpoint root belongs to root.
- A stale lock file (mode 0644, nobody holds it): the job cannot open it for writing, takes the
  lock through a read-only handle, trains and saves; its step 4 is byte-identical to a run's in
  a directory of its own.
- The same file held by a live process: the job is refused as by any second job.
- Mode 0600 (not even readable): the job stops with a message naming the file, its owner and mode.

Needs root (to act as two users); otherwise exits 77 (skipped) saying why.

    gpt_foreign_lock.py ZERO_GPT CONFIG WORKDIR
"""
import fcntl
import filecmp
import os
import shutil
import subprocess
import sys

import loop_disk
from loop_disk import expect

exe, config, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chmod(work, 0o755)
if os.geteuid() != 0:
    print("gpt_foreign_lock: SKIPPED: needs root to act as two users")
    sys.exit(77)
NOBODY = 65534
home = os.path.join(work, "home")  # MPI's session files, writable by both users
os.makedirs(home)
os.chmod(home, 0o777)


def zero_gpt(ckpt, run_dir, user=None):
    cmd = [exe, "--config", config, "--set", "run.steps=4", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=0", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
           "--set", "model.n_head=2", "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", "run.peak_tflops=1",
           "--set", "run.save_interval=2", "--set", f"run.out_dir={run_dir}", "--checkpoint", ckpt]
    env = dict(os.environ, HOME=home, TMPDIR=home)
    extra = {} if user is None else {"user": user, "group": user, "extra_groups": []}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, **extra)
    return r.returncode, r.stdout + r.stderr


reference = os.path.join(work, "reference")
loop_disk.must(zero_gpt(reference, os.path.join(work, "reference_run")), "the reference run")

shared = os.path.join(work, "shared")
os.makedirs(shared)
os.chmod(shared, 0o777)
lock = os.path.join(shared, "zero.lock")
with open(lock, "w") as f:
    f.write("host elsewhere pid 1\n")  # a stale line from a job long gone
os.chmod(lock, 0o644)

rc, out = zero_gpt(shared, os.path.join(shared, "run"), NOBODY)
step4 = os.path.join(shared, "step_00000004", "shard_00000.ckpt")
expect("stale foreign lock file (0644): used read-only, trained and saved",
       rc == 0 and os.path.exists(step4) and
       filecmp.cmp(step4, os.path.join(reference, "step_00000004", "shard_00000.ckpt"), shallow=False),
       out, ["done: 4 steps"], absent=["check the permissions of its directory"])

with open(lock) as held:
    fcntl.flock(held, fcntl.LOCK_SH)  # a live job reading the root
    rc, out = zero_gpt(shared, os.path.join(shared, "run2"), NOBODY)
    expect("foreign lock file held by a live job: refused", rc not in (0, None), out,
           ["in use by another job", lock])

os.chmod(lock, 0o600)
rc, out = zero_gpt(shared, os.path.join(shared, "run3"), NOBODY)
expect("foreign lock file not readable (0600): named with owner and mode", rc not in (0, None), out,
       [f"cannot open the lock file {lock}", "belongs to root (uid 0) with mode 0600", f"uid {NOBODY}"])
loop_disk.finish()
