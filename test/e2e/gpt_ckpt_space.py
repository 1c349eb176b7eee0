#!/usr/bin/env python3
"""The checkpoint root's space at start, and a resume from a read-only checkpoint, end to end.

On a small loop-mounted ext4 image holding a run's step 2:
- less free space than one save: the resumed run stops before step 1 with the free space and a
  save's size; room for one save but not two: a warning, and the run trains and saves;
- the image remounted read-only: --resume-from reads step 2 there and saves into another root;
- a checkpoint root on ramfs (no capacity figure): a warning, not a refusal.
Each resumed run saves step 4 byte-identical to an uninterrupted run's.

Needs root and loop devices; otherwise exits 77 (skipped) saying why.

    gpt_ckpt_space.py ZERO_GPT CONFIG WORKDIR
"""
import filecmp
import os
import shutil
import subprocess
import sys

import loop_disk
from loop_disk import expect

exe, config, work = sys.argv[1:4]
mnt = loop_disk.fresh_mount(work, "gpt_ckpt_space")


def zero_gpt(ckpt, steps, *args):
    cmd = [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=0", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
           "--set", "model.n_head=2", "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", "run.peak_tflops=1",
           "--set", "run.save_interval=2", "--set", f"run.out_dir={os.path.join(work, 'run')}",
           "--checkpoint", ckpt, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def same_step4(root):
    a = os.path.join(root, "step_00000004", "shard_00000.ckpt")
    return os.path.exists(a) and filecmp.cmp(a, os.path.join(reference, "step_00000004", "shard_00000.ckpt"),
                                             shallow=False)


ramfs = os.path.join(work, "ramfs")
try:
    reference = os.path.join(work, "reference")
    loop_disk.must(zero_gpt(reference, 4), "the reference run")
    root = os.path.join(mnt, "ckpt")
    loop_disk.must(zero_gpt(root, 2), "the run to step 2")
    save = loop_disk.kib_used(os.path.join(root, "step_00000002"))

    loop_disk.fill(mnt, leave_kib=save // 2)
    rc, out = zero_gpt(root, 4, "--resume")
    expect("less than one save free: refused before step 1", rc not in (0, None), out,
           [f"checkpoint root '{root}' has", "less than one save of this model", "--checkpoint"],
           absent=["step 3/4", "step 1/"])
    os.remove(os.path.join(mnt, "filler"))
    loop_disk.fill(mnt, leave_kib=save + save // 2)
    rc, out = zero_gpt(root, 4, "--resume")
    expect("room for one save, not two: a warning, trained and saved", rc == 0 and same_step4(root), out,
           ["room for one save", "but not two", "done: 2 steps"])
    os.remove(os.path.join(mnt, "filler"))
    shutil.rmtree(os.path.join(root, "step_00000004"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("step_00000002\n")

    # Read-only: the source is only read; saves go elsewhere.
    r = loop_disk.sh("mount", "-o", "remount,ro", mnt)
    if r.returncode != 0:
        sys.exit(f"cannot remount the image read-only: {r.stderr}")
    rc, out = zero_gpt(root, 4, "--resume")
    print(f"resume saving into the read-only root itself: exit {rc} (an error is right)")
    elsewhere = os.path.join(work, "elsewhere")
    rc, out = zero_gpt(elsewhere, 4, "--resume-from", root)
    expect("resume from a read-only checkpoint into another root", rc == 0 and same_step4(elsewhere), out,
           [f"resumed from {root} at step 2", "done: 2 steps"])

    # ramfs reports no capacity: warned, not refused.
    os.makedirs(ramfs)
    r = loop_disk.sh("mount", "-t", "ramfs", "ramfs", ramfs)
    if r.returncode != 0:
        print(f"ramfs cannot be mounted here ({r.stderr.strip()}); that case is skipped")
    else:
        rc, out = zero_gpt(os.path.join(ramfs, "ckpt"), 4)
        expect("checkpoint root on ramfs: a warning, trained and saved",
               rc == 0 and same_step4(os.path.join(ramfs, "ckpt")), out, ["reports no capacity", "done: 4 steps"])
finally:
    loop_disk.sh("umount", ramfs)
    loop_disk.unmount(mnt)

loop_disk.finish()
