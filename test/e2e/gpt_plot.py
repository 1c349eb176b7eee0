#!/usr/bin/env python3
"""A short zero-gpt run, its metrics.jsonl plotted by zero-plot (the run twice, overlaid under
two names): every PNG must be a well-formed PNG file of the asked size, and the records must
hold what the plots draw (train loss and tokens at every printed step, validation loss with its
token count).

    gpt_plot.py ZERO_GPT ZERO_PLOT CONFIG WORKDIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

exe, plot, config, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
run_dir = os.path.join(work, "run")
steps, seq_len, micro = 6, 32, 2
cmd = [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "steps_per_print=2",
       "--set", "run.eval_interval=3", "--set", "run.eval_sequences=8", "--set", "run.sample_tokens=0",
       "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2",
       "--set", f"model.seq_len={seq_len}", "--set", f"train_micro_batch_size_per_gpu={micro}",
       "--set", "scheduler.params.warmup_num_steps=2", "--set", f"run.out_dir={run_dir}"]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
if out.returncode != 0:
    sys.exit(f"zero-gpt failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

# The scheduler's "auto" length is run.steps, read from the same (once-loaded) file.
if f'scheduler.params.total_num_steps: "auto" -> {steps} (run.steps)' not in out.stdout:
    sys.exit(f"no note that total_num_steps became run.steps = {steps}:\n{out.stdout}")
if f"total_num_steps: {steps}\n" not in open(os.path.join(run_dir, "config.yaml")).read():
    sys.exit(f"config.yaml does not record total_num_steps: {steps}")

metrics = os.path.join(run_dir, "metrics.jsonl")
records = [json.loads(line) for line in open(metrics, encoding="utf-8")]
train = [r for r in records if r["type"] == "train"]
evals = [r for r in records if r["type"] == "eval"]
if [r["step"] for r in train] != [1, 2, 4, 6]:
    sys.exit(f"train records at steps {[r['step'] for r in train]}, expected 1, 2, 4, 6")
for r in train:
    if r["tokens"] != r["step"] * micro * seq_len:
        sys.exit(f"step {r['step']}: tokens {r['tokens']}, expected {r['step'] * micro * seq_len}")
if [(r["step"], r["val_tokens"]) for r in evals] != [(3, 8 * seq_len), (6, 8 * seq_len)]:
    sys.exit(f"eval records {evals}: expected steps 3 and 6 over {8 * seq_len} tokens")

width, height = 640, 480
plots = os.path.join(work, "plots")
out = subprocess.run([plot, metrics, metrics, "--name", "first", "--name", "second",
                      "-o", plots, "--size", f"{width}x{height}"],
                     capture_output=True, text=True, timeout=120)
if out.returncode != 0:
    sys.exit(f"zero-plot failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


def check_png(path):
    """Signature, then an IHDR chunk first with a correct CRC; returns (width, height)."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG (signature {data[:8]!r})")
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        sys.exit(f"{path}: first chunk is {kind!r} of {length} bytes, expected IHDR of 13")
    body = data[16:16 + length]
    (crc,) = struct.unpack(">I", data[16 + length:20 + length])
    if zlib.crc32(kind + body) != crc:
        sys.exit(f"{path}: IHDR checksum mismatch")
    if not data.endswith(b"IEND\xaeB`\x82"):
        sys.exit(f"{path}: no IEND chunk at the end (truncated)")
    w, h = struct.unpack(">II", body[:8])
    return w, h


for name in ["loss_steps.png", "loss_tokens.png", "throughput.png", "memory.png"]:
    size = check_png(os.path.join(plots, name))
    if size != (width, height):
        sys.exit(f"{name}: {size[0]}x{size[1]} pixels, asked {width}x{height}")
    print(f"{name}: valid PNG, {size[0]}x{size[1]}")
