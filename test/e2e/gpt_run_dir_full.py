#!/usr/bin/env python3
"""A run directory on a full disk, end to end, on a small loop-mounted ext4 image.

- Full at start (checkpoints elsewhere): config.yaml, metrics.jsonl and sample.txt cannot be
  written; each gets one warning with its path and the OS error, the log says config.yaml was
  NOT saved, training finishes (exit 0). With run.strict_outputs: true the run stops instead.
- Filling mid-run: metrics.jsonl stops with one warning; exit 0.
- After space is freed, --resume into the same directory ends the record the full disk cut
  (a note says so), appends, and zero-plot reads the file.
In every case the last checkpoint resumes bit-exact: a run resumed from it saves shards
byte-identical to the uninterrupted run's.

Needs root and loop devices; otherwise exits 77 (skipped) saying why.

    gpt_run_dir_full.py ZERO_GPT ZERO_PLOT CONFIG WORKDIR
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys

import loop_disk
from loop_disk import expect

exe, plot, config, work = sys.argv[1:5]
mnt = loop_disk.fresh_mount(work, "gpt_run_dir_full")


def zero_gpt(out_dir, ckpt, steps, *extra, resume=False):
    cmd = [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=8", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
           "--set", "model.n_head=2", "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", "steps_per_print=1",
           "--set", "run.peak_tflops=1", "--set", f"run.out_dir={out_dir}", "--checkpoint", ckpt]
    for e in extra:
        cmd += ["--set", e]
    if resume:
        cmd.append("--resume")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def bit_exact(name, ckpt, from_step, to_step):
    """Resumes a copy of `ckpt` at from_step, trains to to_step; its shard must equal the reference's."""
    root = os.path.join(work, name + "_resumed")
    os.makedirs(root)
    shutil.copytree(os.path.join(ckpt, f"step_{from_step:08d}"), os.path.join(root, f"step_{from_step:08d}"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(f"step_{from_step:08d}\n")
    rc, out = zero_gpt(os.path.join(work, name + "_resumed_run"), root, to_step, f"run.save_interval={to_step}",
                       resume=True)
    a = os.path.join(root, f"step_{to_step:08d}", "shard_00000.ckpt")
    b = os.path.join(reference, f"step_{to_step:08d}", "shard_00000.ckpt")
    same = rc == 0 and os.path.exists(a) and filecmp.cmp(a, b, shallow=False)
    expect(f"{name}: step {from_step} resumes bit-exact to step {to_step}", same, out)


try:
    # The reference: the same training on a healthy disk.
    reference = os.path.join(work, "reference_ckpt")
    rc, out = zero_gpt(os.path.join(work, "reference_run"), reference, 8, "run.save_interval=4")
    if rc != 0:
        sys.exit(f"the reference run failed ({rc}):\n{out}")

    # Full at start; the run directory exists (a full disk cannot create it).
    run_dir, plots = os.path.join(mnt, "run"), os.path.join(mnt, "plots")
    os.makedirs(run_dir)
    os.makedirs(plots)
    loop_disk.fill(mnt)
    ckpt = os.path.join(work, "full_start_ckpt")
    rc, out = zero_gpt(run_dir, ckpt, 8, "run.save_interval=4")
    enospc = "No space left on device"
    expect("full at start: warnings, exit 0", rc == 0, out,
           [f"cannot write '{run_dir}/config.yaml': {enospc}", f"NOT saved to {run_dir}/config.yaml",
            f"'{run_dir}/metrics.jsonl': {enospc}", f"cannot write '{run_dir}/sample.txt': {enospc}",
            "training continues", "done: 8 steps"])
    warnings = out.count("zero-gpt: warning:")
    expect("full at start: one warning per file", warnings == 3, f"{warnings} warnings\n{out}")
    bit_exact("full_start", ckpt, 4, 8)

    rc, out = zero_gpt(run_dir, os.path.join(work, "strict_ckpt"), 8, "run.strict_outputs=true")
    expect("full at start, strict_outputs: an error", rc not in (0, None), out,
           [f"{run_dir}/config.yaml", enospc, "run.strict_outputs is true"], absent=["done: 8 steps"])

    # zero-plot writing onto the full disk: each plot it cannot write is named, then exit 1.
    r = subprocess.run([sys.executable, plot, os.path.join(work, "reference_run", "metrics.jsonl"), "-o", plots],
                       capture_output=True, text=True)
    if "No module named" in r.stderr:
        print("zero-plot: matplotlib is missing; plot check skipped")
    else:
        expect("zero-plot onto a full disk: named, exit 1", r.returncode == 1, r.stdout + r.stderr,
               [f"cannot write {plots}/loss_steps.png: {enospc}", "4 of 4 plots not written"], absent=["Traceback"])

    # Filling mid-run: a few KiB free, enough for config.yaml and the first records.
    os.remove(os.path.join(mnt, "filler"))
    shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    loop_disk.fill(mnt, leave_kib=7)
    ckpt = os.path.join(work, "mid_run_ckpt")
    rc, out = zero_gpt(run_dir, ckpt, 8, "run.save_interval=4", "run.sample_tokens=0")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    with open(metrics, "rb") as f:
        content = f.read()
    expect("filling mid-run: one warning, exit 0", rc == 0 and content.count(b"\n") >= 2, out,
           [f"cannot append to '{metrics}': {enospc}", "done: 8 steps"], absent=["config.yaml':"])
    torn = not content.endswith(b"\n")
    # The disk may fill exactly at a record's newline: then the last record is whole and
    # zero-plot has nothing to skip after the resume ends the line.
    try:
        json.loads(content.rsplit(b"\n", 1)[-1])
        cut_inside = False
    except ValueError:
        cut_inside = torn
    print(f"metrics.jsonl after the full disk: {content.count(b'{')} records begun, last one cut: {torn}")
    bit_exact("mid_run", ckpt, 4, 8)

    # Space freed, --resume into the same directory: the cut record is ended, new ones follow.
    os.remove(os.path.join(mnt, "filler"))
    rc, out = zero_gpt(run_dir, ckpt, 10, "run.save_interval=0", "run.sample_tokens=0", resume=True)
    with open(metrics, "rb") as f:
        lines = f.read().split(b"\n")
    expect("resume after the full disk: the cut line ended", rc == 0 and lines[-1] == b"", out,
           ["record cut short", "(1 line)"] if torn else [], absent=[] if torn else ["record cut short"])
    r = subprocess.run([sys.executable, plot, metrics, "-o", os.path.join(work, "plots")], capture_output=True,
                       text=True)
    if "No module named" in r.stderr:
        print("zero-plot: matplotlib is missing; plot check skipped")
    else:
        expect("zero-plot reads the resumed file", r.returncode == 0, r.stdout + r.stderr,
               ["skipped a record cut short"] if cut_inside else [])
finally:
    loop_disk.unmount(mnt)

loop_disk.finish()
