#!/usr/bin/env python3
"""zero-gpt with model.tensor_parallel: 2 on 2 ranks against the same run on 1 rank.

The same global batch and initial model: every step's loss and gradient norm in metrics.jsonl
agree within 1e-4 relative, the validation loss likewise, and the greedy sample is the same
text. The start record and the log show the grid. A world that tensor groups of 2 do not fill
(3 ranks) and a model whose heads do not divide are refused with a message naming the setting.
--autotune with tensor_parallel 2 tunes at that grid and its winner's file keeps it. Checkpoints
under tensor parallelism: gpt_tensor_parallel_checkpoint.py.

    gpt_tensor_parallel.py MPIEXEC "FLAGS;..." ZERO_GPT CONFIG WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

mpiexec, flags, exe, config, work = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4], sys.argv[5]
STEPS = 20
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(ranks, out_dir, *extra):
    cmd = [mpiexec, *flags, "-n", str(ranks), exe, "--config", config,
           "--set", f"run.steps={STEPS}", "--set", "steps_per_print=1",
           "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
           "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=4",
           "--set", "scheduler.params.warmup_num_steps=5", "--set", "run.eval_interval=0",
           "--set", "run.eval_sequences=8", "--set", "run.sample_tokens=40",
           "--set", "run.temperature=0", "--set", "run.peak_tflops=1",
           "--set", f"run.out_dir={out_dir}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def close(a, b, what):
    if abs(a - b) > 1e-4 * abs(b):
        sys.exit(f"{what}: {a} with tensor parallelism, {b} on one rank")
    return abs(a - b) / abs(b)


one_dir, tp_dir = os.path.join(work, "one_rank"), os.path.join(work, "tp2")
one = run(1, one_dir)
if one.returncode != 0:
    sys.exit(f"the 1-rank run failed ({one.returncode}):\n{one.stdout}\n{one.stderr}")
tp = run(2, tp_dir, "--set", "model.tensor_parallel=2")
if tp.returncode != 0:
    sys.exit(f"the TP 2 run failed ({tp.returncode}):\n{tp.stdout}\n{tp.stderr}")

want, got = records(one_dir), records(tp_dir)
start = next(r for r in got if r["type"] == "start")
if start.get("grid") != "TP 2 x DP 1 x PP 1" or start.get("world") != 2:
    sys.exit(f"the start record does not show the grid: {start}")
if "grid TP 2 x DP 1 x PP 1" not in tp.stdout:
    sys.exit(f"the log does not show the grid:\n{tp.stdout}")
train_w = [r for r in want if r["type"] == "train"]
train_g = [r for r in got if r["type"] == "train"]
if [r["step"] for r in train_g] != list(range(1, STEPS + 1)) or len(train_w) != STEPS:
    sys.exit(f"steps logged: {[r['step'] for r in train_g]} and {[r['step'] for r in train_w]}")
worst = 0.0
for w, g in zip(train_w, train_g):
    worst = max(worst, close(g["loss"], w["loss"], f"step {w['step']} loss"),
                close(g["grad_norm"], w["grad_norm"], f"step {w['step']} gradient norm"))
val_w = [r for r in want if r["type"] == "eval"][-1]["val_loss"]
val_g = [r for r in got if r["type"] == "eval"][-1]["val_loss"]
close(val_g, val_w, "validation loss")
with open(os.path.join(one_dir, "sample.txt"), encoding="utf-8") as f:
    sample_w = f.read()
with open(os.path.join(tp_dir, "sample.txt"), encoding="utf-8") as f:
    sample_g = f.read()
if sample_w != sample_g:
    sys.exit(f"greedy samples differ:\n{sample_w!r}\n{sample_g!r}")
if train_w[-1]["loss"] > train_w[0]["loss"] - 0.5:
    sys.exit(f"the model did not learn: {train_w[0]['loss']} -> {train_w[-1]['loss']}")

bad_world = run(3, os.path.join(work, "three"), "--set", "model.tensor_parallel=2")
if bad_world.returncode == 0 or "3 ranks cannot form groups of model.tensor_parallel = 2" not in bad_world.stdout + bad_world.stderr:
    sys.exit(f"3 ranks at tensor_parallel 2 were not refused clearly:\n{bad_world.stdout}\n{bad_world.stderr}")
bad_heads = run(1, os.path.join(work, "heads"), "--set", "model.tensor_parallel=4")
if bad_heads.returncode == 0 or "n_head = 2" not in bad_heads.stdout + bad_heads.stderr:
    sys.exit(f"2 heads at tensor_parallel 4 were not refused clearly:\n{bad_heads.stdout}\n{bad_heads.stderr}")

tune_dir = os.path.join(work, "tune")
tune = run(2, tune_dir, "--set", "model.tensor_parallel=2", "--autotune", "--autotune-stages", "0,1",
           "--autotune-micro-batches", "4", "--autotune-offload", "none", "--autotune-steps", "1")
if tune.returncode != 0 or "fastest: " not in tune.stdout:
    sys.exit(f"--autotune at tensor_parallel 2 did not tune:\n{tune.stdout}\n{tune.stderr}")
with open(os.path.join(tune_dir, "autotune.yaml"), encoding="utf-8") as f:
    tuned = f.read()
if "  tensor_parallel: 2\n" not in tuned or "TP 2 x DP 1 x PP 1" not in tune.stdout + open(
        os.path.join(tune_dir, "autotune.txt"), encoding="utf-8").read():
    sys.exit(f"--autotune's winner lost the grid tensor_parallel 2:\n{tuned}\n{tune.stdout}")

print(f"TP 2 on 2 ranks = 1 rank over {STEPS} steps: loss {train_w[0]['loss']:.4f} -> "
      f"{train_w[-1]['loss']:.4f}, largest deviation {worst:.1e} (loss, gradient norm); "
      f"validation {val_g:.5f} vs {val_w:.5f}; the same greedy sample")
