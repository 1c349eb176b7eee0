#!/usr/bin/env python3
"""A checkpoint root that is not the same directory on every host, caught at the start.

Rank 1 runs in a mount namespace of its own with an empty tmpfs mounted over the run directory:
the root exists for it, but it is another directory than rank 0's, as a node-local /tmp or
scratch disk is on a second host. The job must stop before its first step, within seconds, with
a message that names rank 1 and says the root must be shared; nothing may be saved. The same
job without the namespace must start and save. Skips (77) where mount namespaces are not
available (no unshare, or not allowed to mount).

    gpt_node_local_root.py MPIEXEC "FLAGS;..." ZERO_GPT CONFIG WORKDIR
"""
import os
import shutil
import subprocess
import sys
import time

mpiexec, flags, exe, config, work = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4], sys.argv[5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
run_dir = os.path.join(work, "run")
os.makedirs(run_dir)

probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {run_dir}"], capture_output=True,
                       text=True)
if probe.returncode != 0:
    print(f"SKIP: cannot mount in a private mount namespace here ({probe.stderr.strip()})")
    sys.exit(77)

args = ["--config", config, "--set", "run.steps=2", "--set", "run.save_interval=1", "--set", "run.eval_interval=0",
        "--set", "scheduler.params.warmup_num_steps=1",
        "--set", "run.sample_tokens=0", "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set",
        "model.n_head=2", "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2", "--set",
        f"run.out_dir={run_dir}"]
failures = []

# Rank 0 as it is; rank 1 with its own, empty run directory.
local = " ".join(["mount -t tmpfs tmpfs", run_dir, "&& exec", exe] + [f"'{a}'" for a in args])
t0 = time.monotonic()
p = subprocess.run([mpiexec, *flags, "-n", "1", exe, *args, ":", "-n", "1", "unshare", "-m", "sh", "-c", local],
                   capture_output=True, text=True, timeout=120)
took = time.monotonic() - t0
out = p.stdout + p.stderr
if p.returncode == 0:
    failures.append("the job with a node-local checkpoint root on rank 1 succeeded")
for text in ("is not the same directory on every host", "rank 1 (host", "must be on storage all hosts share"):
    if text not in out:
        failures.append(f"the message lacks '{text}'")
if "step 1" in out or os.path.exists(os.path.join(run_dir, "checkpoints", "latest")):
    failures.append("the job trained or saved before refusing the root")
if took > 60:
    failures.append(f"the refusal took {took:.0f} s")
if os.path.exists(os.path.join(run_dir, "checkpoints", ".zero-shared-check")):
    failures.append("the marker file was left behind")

# The same job with one directory for both ranks starts and saves.
shutil.rmtree(run_dir)
os.makedirs(run_dir)
q = subprocess.run([mpiexec, *flags, "-n", "2", exe, *args], capture_output=True, text=True, timeout=300)
if q.returncode != 0 or not os.path.exists(os.path.join(run_dir, "checkpoints", "latest")):
    failures.append(f"the job on a shared root failed (status {q.returncode}):\n{q.stdout}\n{q.stderr}")

for f in failures:
    print("FAIL:", f)
if failures:
    print("--- the refused job's output\n" + out)
    sys.exit(1)
print(f"node-local checkpoint root refused at the start in {took:.1f} s, naming rank 1; a shared root saves")
