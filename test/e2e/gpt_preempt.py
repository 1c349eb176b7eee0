#!/usr/bin/env python3
"""Preemption of a 2-rank zero-gpt run, end to end.

An uninterrupted run gives the reference losses. A second run with the same settings gets
SIGUSR1 on rank 1 only, once it has logged a few steps: every rank must stop after the same
step S, save a checkpoint of step S, say how to resume, and exit with status 75. Resuming from
that checkpoint must then log, for every step after S, exactly the reference's loss. Optional
settings for both runs (model.tensor_parallel=2: the two ranks one tensor group) follow;
--signal-ranks=0,1 signals both ranks instead, as mpirun and srun forward a signal. Each
signalled rank's stop message must be a whole line of its own in the merged log.

    gpt_preempt.py MPIEXEC "FLAGS;..." ZERO_GPT CONFIG WORKDIR [--signal-ranks=R,...] [KEY=VALUE ...]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

mpiexec, flags, exe, config, work = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4], sys.argv[5]
extra = sys.argv[6:]
signal_ranks = [1]
if extra and extra[0].startswith("--signal-ranks="):
    signal_ranks = [int(r) for r in extra.pop(0).split("=", 1)[1].split(",")]
settings = [a for kv in extra for a in ("--set", kv)]
STOP_TEXT = ("SIGUSR1 received: the job stops after the current step on every rank, with a checkpoint if the loop "
             "saves one (if a rank is gone, the collective deadline ends the job instead); signal again to end "
             "this process now, unsaved")
STEPS = 60
EXIT_STOPPED = 75
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def command(out_dir, *extra):
    return [mpiexec, *flags, "-n", "2", exe, "--config", config,
            "--set", f"run.steps={STEPS}", "--set", "steps_per_print=1",
            "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2",
            "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
            "--set", "scheduler.params.warmup_num_steps=5", "--set", "run.eval_interval=0",
            "--set", "run.eval_sequences=4", "--set", "run.sample_tokens=0",
            "--set", "run.peak_tflops=1", "--set", f"run.out_dir={out_dir}", *settings, *extra]


def losses(out_dir):
    """Step -> loss of every train record (a resumed run appends to the same file)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    found = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # being written
            r = json.loads(line)
            if r["type"] == "train":
                found[r["step"]] = r["loss"]
    return found


def rank_pid(launcher_pid, rank):
    """The pid of the launcher's child process that is MPI rank `rank`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                ppid = int(re.search(r"^PPid:\s+(\d+)", f.read(), re.M).group(1))
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, AttributeError):
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(entry)
    return None


reference_dir = os.path.join(work, "reference")
ref = subprocess.run(command(reference_dir), capture_output=True, text=True, timeout=240)
if ref.returncode != 0:
    sys.exit(f"the uninterrupted run failed ({ref.returncode}):\n{ref.stdout}\n{ref.stderr}")
reference = losses(reference_dir)
if sorted(reference) != list(range(1, STEPS + 1)):
    sys.exit(f"the reference logged steps {sorted(reference)}")

run_dir = os.path.join(work, "preempted")
log = open(os.path.join(work, "preempted.log"), "w+")
proc = subprocess.Popen(command(run_dir), stdout=log, stderr=subprocess.STDOUT, text=True)
deadline = time.time() + 120
targets = {}
while time.time() < deadline and proc.poll() is None:
    for r in signal_ranks:
        if targets.get(r) is None:
            targets[r] = rank_pid(proc.pid, r)
    if None not in targets.values() and len(losses(run_dir)) >= 3:
        for r in signal_ranks:
            os.kill(targets[r], signal.SIGUSR1)
        break
    time.sleep(0.01)
else:
    proc.kill()
    sys.exit(f"the run ended or stalled before it could be signalled (rank pids {targets})")
rc = proc.wait(timeout=120)
log.seek(0)
output = log.read()
if rc != EXIT_STOPPED:
    sys.exit(f"the signalled run exited with {rc}, expected {EXIT_STOPPED}:\n{output}")
# The handler's message, whole and ending its line: not cut, nothing glued after it. (Another
# rank's output may have left a line open before it; that is the launcher's interleaving.)
for r in signal_ranks:
    line = f"[rank {r}/2] {STOP_TEXT}"
    whole = [l for l in output.splitlines() if l.endswith(line)]
    if len(whole) != 1:
        sys.exit(f"rank {r}'s stop message is not a whole line ending {line!r}:\n{output}")
if output.count("received: the job stops") != len(signal_ranks):
    sys.exit(f"expected {len(signal_ranks)} stop message(s):\n{output}")
m = re.search(r"^stopped by .* after step (\d+) of (\d+); checkpoint in (\S+); resume with[^\n]*:\n  (.+ --resume)$",
              output, re.M)
if not m:
    sys.exit(f"no stop message with the checkpoint and the resume command:\n{output}")
stopped = int(m.group(1))
if not 3 <= stopped < STEPS:
    sys.exit(f"stopped after step {stopped}, expected between 3 and {STEPS - 1}")
checkpoints = os.path.join(run_dir, "checkpoints")
with open(os.path.join(checkpoints, "latest")) as f:
    latest = f.read().strip()
if latest != f"step_{stopped:08d}" or m.group(3) != checkpoints:
    sys.exit(f"latest checkpoint {latest} in {m.group(3)}, expected step_{stopped:08d} in {checkpoints}")
print(f"SIGUSR1 on rank(s) {signal_ranks}: both ranks stopped after step {stopped}, exit status {rc}, {latest} saved")

resumed = subprocess.run(command(run_dir, "--resume"), capture_output=True, text=True, timeout=240)
if resumed.returncode != 0:
    sys.exit(f"the resumed run failed ({resumed.returncode}):\n{resumed.stdout}\n{resumed.stderr}")
if f"resumed from {checkpoints} at step {stopped}" not in resumed.stdout:
    sys.exit(f"the resumed run did not start at step {stopped}:\n{resumed.stdout}")
got = losses(run_dir)
if sorted(got) != list(range(1, STEPS + 1)):
    sys.exit(f"the preempted and resumed runs logged steps {sorted(got)}")
for step in range(1, STEPS + 1):
    if got[step] != reference[step]:
        sys.exit(f"step {step}: loss {got[step]!r}, the uninterrupted run had {reference[step]!r}")
print(f"resumed at step {stopped + 1}: steps 1-{STEPS} have exactly the uninterrupted run's losses")
