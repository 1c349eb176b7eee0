#!/usr/bin/env python3
"""A checkpoint disk that fills exactly while `latest` is written, on a loop-mounted ext4 image.

After step 2 is saved, the image is filled to leave just the room one more step directory takes.
The save of step 4 then completes its directory, and the update of `latest` fails: the run must
say "step 4 is complete on disk; `latest` still names step 2", exit with an error, and leave no
temporary file. zero-ckpt inspect names the orphan step; the run resumed from `latest` (step 2)
on a freed disk re-saves step 4, and its shard is byte-identical to a healthy run's.

Needs root and loop devices; otherwise exits 77 (skipped) saying why.

    gpt_latest_full.py ZERO_GPT ZERO_CKPT CONFIG WORKDIR
"""
import filecmp
import os
import subprocess
import sys

import loop_disk
from loop_disk import expect

exe, ckpt_tool, config, work = sys.argv[1:5]
mnt = loop_disk.fresh_mount(work, "gpt_latest_full")


def zero_gpt(ckpt, steps, *extra, resume=False, tag=None):
    cmd = [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=0", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
           "--set", "model.n_head=2", "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", "run.peak_tflops=1",
           "--set", "run.save_interval=2", "--set", f"run.out_dir={os.path.join(work, 'run')}", "--checkpoint", ckpt]
    for e in extra:
        cmd += ["--set", e]
    if resume:
        cmd.append("--resume")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


try:
    reference = os.path.join(work, "reference")
    loop_disk.must(zero_gpt(reference, 4), "the reference run")

    root = os.path.join(mnt, "ckpt")
    loop_disk.must(zero_gpt(root, 2), "the run to step 2")
    # Room for one more step directory as large as step 2's, and not one block more.
    need = loop_disk.kib_used(os.path.join(root, "step_00000002"))
    loop_disk.fill(mnt, leave_kib=need)

    rc, out = zero_gpt(root, 4, resume=True)
    leftovers = [n for n in os.listdir(root) if n.startswith(".")]
    expect("latest not updatable: the message", rc != 0 and not leftovers, out + f"\nleftovers: {leftovers}",
           ["step 4 is complete on disk; `latest` still names step 2", "No space left on device"])
    with open(os.path.join(root, "latest")) as f:
        expect("latest still names step 2", f.read() == "step_00000002\n", "")
    r = subprocess.run([ckpt_tool, "inspect", root], capture_output=True, text=True)
    expect("inspect names the orphan step", True, r.stdout + r.stderr,
           ["step_00000004 (newer than latest", "step_00000002 (latest)"])

    # Space freed: the resume from latest (step 2) saves step 4 again, bit-exact.
    os.remove(os.path.join(mnt, "filler"))
    rc, out = zero_gpt(root, 4, resume=True)
    a = os.path.join(root, "step_00000004", "shard_00000.ckpt")
    b = os.path.join(reference, "step_00000004", "shard_00000.ckpt")
    with open(os.path.join(root, "latest")) as f:
        latest = f.read()
    expect("resumed from latest: step 4 again, bit-exact", rc == 0 and latest == "step_00000004\n" and
           filecmp.cmp(a, b, shallow=False), out)
finally:
    loop_disk.unmount(mnt)

loop_disk.finish()
