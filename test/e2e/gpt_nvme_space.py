#!/usr/bin/env python3
"""NVMe swap space shared by two ranks, end to end, on a small loop-mounted ext4 image.

- Room for one rank's swap files but not both ranks': both ranks refuse before either claims
  space, with one message that counts both ranks and one free figure; nothing is left in
  nvme_path (no swap directory, no swap file, no lock file).
- nvme_path on ramfs (no O_DIRECT, no capacity figure): a warning, not a refusal.
A 2-rank run resumed from the last checkpoint of a healthy run then saves shards byte-identical
to that run's.

Needs root and loop devices; otherwise exits 77 (skipped) saying why.

    gpt_nvme_space.py MPIEXEC FLAGS ZERO_GPT CONFIG WORKDIR
"""
import filecmp
import os
import re
import shutil
import subprocess
import sys

import loop_disk
from loop_disk import expect

mpiexec, flags, exe, config, work = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4], sys.argv[5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
mnt = loop_disk.mount(work, "gpt_nvme_space")


def zero_gpt(ckpt, steps, nvme, *args):
    cmd = [mpiexec, *flags, "-n", "2", exe, "--config", config, "--set", f"run.steps={steps}",
           "--set", "run.eval_interval=0", "--set", "run.sample_tokens=0", "--set", "model.n_layer=1",
           "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.seq_len=32",
           "--set", "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1",
           "--set", "run.peak_tflops=1", "--set", "run.save_interval=2",
           "--set", "zero_optimization.offload_optimizer.device=nvme",
           "--set", f"zero_optimization.offload_optimizer.nvme_path={nvme}",
           "--set", f"run.out_dir={os.path.join(work, 'run')}", "--checkpoint", ckpt, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def resume_matches(name, nvme):
    """Resumes a copy of the reference's step 2 with swap in `nvme`; step 4 must equal the reference's."""
    root = os.path.join(work, name)
    shutil.copytree(os.path.join(reference, "step_00000002"), os.path.join(root, "step_00000002"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("step_00000002\n")
    rc, out = zero_gpt(root, 4, nvme, "--resume")
    same = rc == 0 and all(
        filecmp.cmp(os.path.join(root, "step_00000004", s), os.path.join(reference, "step_00000004", s), shallow=False)
        for s in ("shard_00000.ckpt", "shard_00001.ckpt"))
    return same, out


ramfs = os.path.join(work, "ramfs")
try:
    reference = os.path.join(work, "reference")
    os.makedirs(os.path.join(work, "nvme"))
    out = loop_disk.must(zero_gpt(reference, 4, os.path.join(work, "nvme")), "the reference run")
    m = re.search(r"on nvme ([0-9.]+) KiB", out)
    if not m:
        sys.exit(f"no 'on nvme ... KiB' in the reference run's memory line:\n{out}")
    per_rank = float(m.group(1))  # rank 0's swap; rank 1's is the same size or less

    nvme = os.path.join(mnt, "nvme")
    os.makedirs(nvme)
    loop_disk.fill(mnt, leave_kib=int(per_rank * 1.5))
    same, out = resume_matches("shared_fs", nvme)
    expect("room for one rank's swap, not two: both refuse", not same, out,
           ["not enough disk space for NVMe swap: ranks 0, 1 keep their swap files on one filesystem",
            "measured before any rank claimed space"])
    left = os.listdir(nvme)
    expect("nothing left in nvme_path after the refusal", left == [], f"left: {left}")
    messages = set(re.findall(r"need [0-9.]+ \w+ there in all, but [0-9.]+ \w+ are free", out))
    expect("one free figure in every rank's message", len(messages) == 1, f"{messages}\n{out}")

    os.makedirs(ramfs)
    r = loop_disk.sh("mount", "-t", "ramfs", "ramfs", ramfs)
    if r.returncode != 0:
        print(f"ramfs cannot be mounted here ({r.stderr.strip()}); that case is skipped")
    else:
        same, out = resume_matches("ramfs_resumed", ramfs)
        expect("nvme_path on ramfs: a warning, resumed bit-exact", same, out,
               ["reports no capacity"], absent=["only 0 B are free"])
finally:
    loop_disk.sh("umount", ramfs)
    loop_disk.unmount(mnt)
loop_disk.finish()
