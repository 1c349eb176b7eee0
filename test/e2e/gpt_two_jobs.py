#!/usr/bin/env python3
"""Two zero-gpt jobs on one directory, end to end.

A first job (optimizer state swapped to NVMe) trains and is then frozen with SIGSTOP. A second
job on the same run directory (checkpoint root), one on the same nvme_path, and one on the same
run directory with its checkpoints elsewhere must each stop at start, naming the lock file and the first job's host and pid; a --sample, which only reads, may
run beside it. After the first job is killed (SIGKILL: it cleans up nothing), a new job on both
directories runs: it removes the swap files the killed job left, says so, and leaves none of its
own.

    gpt_two_jobs.py ZERO_GPT CONFIG WORKDIR
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

exe, config, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def command(out_dir, nvme, steps, *extra):
    os.makedirs(nvme, exist_ok=True)
    return [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "steps_per_print=1",
            "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2",
            "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
            "--set", "scheduler.params.warmup_num_steps=1", "--set", "run.eval_interval=0",
            "--set", "run.sample_tokens=0", "--set", "run.peak_tflops=1",
            "--set", "zero_optimization.offload_optimizer.device=nvme",
            "--set", f"zero_optimization.offload_optimizer.nvme_path={nvme}",
            "--set", f"run.out_dir={out_dir}", *extra]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


run_dir, nvme = os.path.join(work, "run"), os.path.join(work, "nvme")
swap_dir = os.path.join(nvme, "zero_rank0")
log = open(os.path.join(work, "first.log"), "w+")
first = subprocess.Popen(command(run_dir, nvme, 100000, "--set", "run.save_interval=1"), stdout=log,
                         stderr=subprocess.STDOUT)
deadline = time.time() + 60
while time.time() < deadline and first.poll() is None:
    if os.path.exists(os.path.join(run_dir, "checkpoints", "latest")):
        break
    time.sleep(0.05)
else:
    first.kill()
    log.seek(0)
    sys.exit(f"the first job ended or saved no checkpoint in 60 s:\n{log.read()}")
os.kill(first.pid, signal.SIGSTOP)
try:
    holder = f"host {socket.gethostname()} pid {first.pid}"
    for what, cmd, lock in [
            ("checkpoint root", command(run_dir, os.path.join(work, "nvme2"), 5),
             os.path.join(run_dir, "checkpoints", "zero.lock")),
            ("NVMe swap directory", command(os.path.join(work, "run2"), nvme, 5), swap_dir + ".lock"),
            ("run directory (its checkpoints elsewhere)",
             command(run_dir, os.path.join(work, "nvme4"), 5, "--checkpoint", os.path.join(work, "ckpt4")),
             os.path.join(run_dir, "zero.lock"))]:
        second = run(cmd)
        out = second.stdout + second.stderr
        if second.returncode == 0 or "in use by another job" not in out or holder not in out or lock not in out:
            sys.exit(f"a second job on the first one's {what} was not refused with '{lock}' and '{holder}' "
                     f"(exit status {second.returncode}):\n{out}")
        print(f"second job on the same {what}: refused, naming {lock} and {holder}")
    # Reading is no writing: a sample from the checkpoints of the running job is allowed.
    sample = run(command(run_dir, os.path.join(work, "nvme3"), 5, "--sample"))
    if sample.returncode != 0 or "loaded " not in sample.stdout:
        sys.exit(f"--sample beside the running job failed ({sample.returncode}):\n{sample.stdout}{sample.stderr}")
    print("a sample from the running job's checkpoint: allowed")
    if not os.listdir(swap_dir):
        sys.exit("the first job's swap files are gone: a refused job deleted them")
finally:
    first.kill()  # SIGKILL also ends a stopped process
    first.wait()
left = sorted(os.listdir(swap_dir))
if not left:
    sys.exit("the killed job left no swap files; nothing to reclaim")
third = run(command(run_dir, nvme, 2))
out = third.stdout + third.stderr
if third.returncode != 0:
    sys.exit(f"the job after the killed one failed ({third.returncode}):\n{out}")
if f"removed {len(left)} swap file" not in out or f"pid {first.pid}" not in out:
    sys.exit(f"the {len(left)} swap files the killed job left were not reported as removed:\n{out}")
if os.path.exists(swap_dir) or os.path.exists(swap_dir + ".lock"):
    sys.exit(f"swap files or the lock remain after a clean run: {os.listdir(nvme)}")
print(f"after SIGKILL: the next job removed the {len(left)} swap files left, ran, and left none")
