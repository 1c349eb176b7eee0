#!/usr/bin/env python3
"""--resume refuses a checkpoint of another model that has the same shapes.

model.n_head changes what the attention computes but no parameter's shape, so the engine's load
accepts it. A run trains 2 steps with saves (n_head 2); the resume with n_head 4 must exit with
status 1 naming model.n_head with both values and the key that allows it, and train nothing;
the same resume with run.allow_model_change=true must train on to step 4 and say so. A resume
with the saved value continues as before.

    gpt_resume_model.py ZERO_GPT CONFIG WORKDIR
"""
import os
import shutil
import subprocess
import sys

exe, config, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ckpt = os.path.join(work, "ckpt")
failures = []


# A one-block model that trains a step in milliseconds; n_head comes with each run.
SMALL = {"run.eval_interval": 0, "run.sample_tokens": 0, "model.n_layer": 1, "model.n_embd": 32,
         "model.seq_len": 32, "train_micro_batch_size_per_gpu": 2, "scheduler.params.warmup_num_steps": 1,
         "run.peak_tflops": 1, "run.save_interval": 2, "run.out_dir": os.path.join(work, "run")}


def zero_gpt(steps, *extra, resume=False):
    sets = [f"{k}={v}" for k, v in SMALL.items()] + [f"run.steps={steps}", *extra]
    cmd = [exe, "--config", config, "--checkpoint", ckpt] + [a for s in sets for a in ("--set", s)]
    if resume:
        cmd.append("--resume")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def expect(what, ok, out, needles=()):
    missing = [n for n in needles if n not in out]
    if ok and not missing:
        print(f"ok: {what}")
        return
    failures.append(what)
    print(f"FAILED: {what}" + (f" (missing {missing})" if missing else ""))
    print(out[-4000:])


def latest():
    with open(os.path.join(ckpt, "latest")) as f:
        return f.read().strip()


rc, out = zero_gpt(2, "model.n_head=2")
expect("the first run saves step 2", rc == 0 and latest() == "step_00000002", out)

rc, out = zero_gpt(4, "model.n_head=4", resume=True)
expect("another n_head is refused with both values, status 1",
       rc == 1 and latest() == "step_00000002", out,
       ["model.n_head = 2", "model.n_head = 4", "run.allow_model_change"])

rc, out = zero_gpt(4, "model.n_head=4", "run.allow_model_change=true", resume=True)
expect("run.allow_model_change trains on with the new n_head",
       rc == 0 and latest() == "step_00000004", out, ["continues with model.n_head = 4"])

rc, out = zero_gpt(6, "model.n_head=4", resume=True)
expect("the checkpoint now records n_head 4: the same value resumes",
       rc == 0 and latest() == "step_00000006", out)

if failures:
    print(f"{len(failures)} failed: {failures}")
    sys.exit(1)
print("all passed")
