#!/usr/bin/env python3
"""Checkpoints whose values pass every checksum but not every range, end to end.

A short fp16 zero-gpt run saves real checkpoints. Each case copies one, edits it as a buggy
writer or a hand edit would, re-signs it (ckpt_edit) and hands it to `zero-ckpt inspect`,
`zero-ckpt export --format hf` or a resume, which must answer with a clear error (or a clear
outcome) within seconds: no overflow, no hang, no raw control byte on the terminal.

    gpt_hostile_checkpoint.py ZERO_GPT ZERO_CKPT CKPT_EDIT CONFIG WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import yaml

exe, ckpt_tool, edit_tool, config, work = sys.argv[1:6]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
INT64_MAX = 2**63 - 1
failures = []


def run(cmd, timeout=60):
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).decode("latin-1")
    except subprocess.TimeoutExpired as e:
        return "timeout", ((e.stdout or b"") + (e.stderr or b"")).decode("latin-1")


def zero_gpt(run_dir, steps, *extra, ckpt=None, resume=False):
    cmd = [exe, "--config", config, "--set", f"run.steps={steps}", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=0", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
           "--set", "model.n_head=2", "--set", "model.seq_len=32", "--set", "model.vocab_size=130",
           "--set", "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1",
           "--set", "fp16.enabled=true", "--set", "fp16.hysteresis=2", "--set", "run.save_interval=2",
           "--set", "run.peak_tflops=1", "--set", f"run.out_dir={run_dir}"]
    for e in extra:
        cmd += ["--set", e]
    if ckpt:
        cmd += ["--checkpoint", ckpt]
    if resume:
        cmd += ["--resume"]
    return run(cmd)


def dump(step_dir):
    out = subprocess.run([edit_tool, "dump", step_dir], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def write(step_dir, meta):
    path = os.path.join(work, "edited.json")
    with open(path, "w") as f:
        json.dump(meta, f, indent=2)
    subprocess.run([edit_tool, "write", step_dir, path], check=True)


def expect(name, rc, out, parts, ok_status=lambda r: r not in (0, "timeout"), absent=()):
    missing = [p for p in parts if p not in out]
    present = [p for p in absent if p in out]
    if not ok_status(rc) or missing or present:
        failures.append(name)
        print(f"FAIL: {name}: exit status {rc}, missing {missing}, unwanted {present}:\n{out[-3000:]}")
    else:
        print(f"{name}: ok")


base = os.path.join(work, "base")
rc, out = zero_gpt(base, 4)
if rc != 0:
    sys.exit(f"the first run failed ({rc}):\n{out}")
good = os.path.join(base, "checkpoints")


def copy(name):
    """A copy of the run's checkpoints (steps 2 and 4, latest 4): its run directory, root, step 4."""
    root = os.path.join(work, name, "checkpoints")
    shutil.copytree(good, root, ignore=shutil.ignore_patterns("zero.lock"))
    return os.path.join(work, name, "run"), root, os.path.join(root, "step_00000004")


def inspect(root, *extra):
    return run([ckpt_tool, "inspect", root, *extra], timeout=20)


# loss_scaler.iter = INT64_MAX: the first fp16 step after the resume would overflow it.
d, root, step = copy("scaler_iter")
m = dump(step)
m["loss_scaler"]["iter"] = INT64_MAX
write(step, m)
rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
expect("loss_scaler.iter = INT64_MAX", rc, out, ["loss_scaler.iter", "out of range"])

# A step of INT64_MAX, consistent in the metadata and every shard index: start_step + 1 overflows.
d, root, step = copy("step_max")
subprocess.run([edit_tool, "shard-step", step, str(INT64_MAX)], check=True)
m = dump(step)
m["step"] = INT64_MAX
write(step, m)
rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
expect("step = INT64_MAX", rc, out, ["field 'step'", "out of range"])

# hysteresis_left above anything this run configures (fp16.hysteresis 2): the resumed scaler
# starts from the run's setting, as the next checkpoint records.
d, root, step = copy("hysteresis")
m = dump(step)
m["loss_scaler"]["hysteresis_left"] = 2**30
write(step, m)
rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
saved = dump(os.path.join(root, "step_00000006")) if rc == 0 else {"loss_scaler": {"hysteresis_left": None}}
left = saved["loss_scaler"]["hysteresis_left"]
expect("hysteresis_left = 2^30", rc, out + f"\nsaved hysteresis_left {left}",
       [f"saved hysteresis_left {left}"], ok_status=lambda r: r == 0 and left is not None and left <= 2)

# Any string as scheduler.type, with a control byte: refused, named, escaped.
d, root, step = copy("scheduler")
m = dump(step)
m["scheduler"]["type"] = "Warmup\x1bLR"
write(step, m)
rc, out = inspect(root)
expect("scheduler.type", rc, out, ["scheduler.type", "Warmup\\x1bLR", "is not one of"], absent=["\x1b"])

# A step directory holding another step's files.
d, root, step = copy("other_step")
shutil.rmtree(step)
shutil.copytree(os.path.join(root, "step_00000002"), step)
rc, out = inspect(root)
expect("step_4 holding step 2", rc, out, ["step_00000004", "= 2", "belong to another step"])
rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
expect("resume of step_4 holding step 2", rc, out, ["belong to another step"])

# Names and client-state keys with control bytes are printed escaped by inspect.
d, root, step = copy("names")
m = dump(step)
m["client_state"]["key\x1b[2J"] = "00"
write(step, m)
rc, out = inspect(root)
expect("client-state key escaped", rc, out, ["key\\x1b[2J"], ok_status=lambda r: r == 0, absent=["\x1b"])

# The saved config shown by inspect --config is escaped line by line.
d, root, step = copy("config_text")
m = dump(step)
m["config_yaml"] = m["config_yaml"] + "# \x1b]0;title\x07\n"
write(step, m)
rc, out = inspect(root, "--config")
expect("saved config escaped", rc, out, ["\\x1b]0;title\\x07"], ok_status=lambda r: r == 0, absent=["\x1b"])

# The samples counter in the client state: the resume error quotes it escaped.
d, root, step = copy("samples")
m = dump(step)
m["client_state"]["gpt.samples_read"] = "1b5b324a"  # ESC [ 2 J
write(step, m)
rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
expect("samples counter escaped", rc, out, ["gpt.samples_read", "\\x1b[2J"], absent=["\x1b"])

# vocab_size 2147483647 in the saved config: export refuses it instead of overflowing.
d, root, step = copy("vocab")
m = dump(step)
m["config_yaml"] = m["config_yaml"].replace("vocab_size: 130", "vocab_size: 2147483647")
assert "2147483647" in m["config_yaml"]
write(step, m)
rc, out = run([ckpt_tool, "export", root, "--format", "hf", "-o", os.path.join(work, "vocab_hf")], timeout=20)
expect("export vocab_size 2^31-1", rc, out, ["vocab_size", "2147483647", "2^24"], absent=["-2147483520"])

# A renamed parameter: export says what is missing, not "n_layer must be positive (got 0)".
d, root, step = copy("renamed")
m = dump(step)
for u in m["units"]:
    for p in u["params"]:
        if p["name"] == "h.0.ln_1.weight":
            p["name"] = "h.0.ln_one.weight"
write(step, m)
rc, out = run([ckpt_tool, "export", root, "--format", "hf", "-o", os.path.join(work, "renamed_hf")], timeout=20)
expect("export with a renamed parameter", rc, out, ["h.0.ln_1.weight", "--format safetensors"],
       absent=["n_layer must be positive"])

# A FIFO in place of metadata.ckpt, a shard or latest: refused at once, never a blocking open.
for name, rel in [("metadata.ckpt", "step_00000004/metadata.ckpt"), ("shard", "step_00000004/shard_00000.ckpt"),
                  ("latest", "latest")]:
    d, root, step = copy("fifo_" + name.replace(".", "_"))
    os.remove(os.path.join(root, rel))
    os.mkfifo(os.path.join(root, rel))
    rc, out = inspect(root)
    expect(f"FIFO as {name}: inspect", rc, out, [rel.split("/")[-1], "a FIFO"])
    rc, out = zero_gpt(d, 6, ckpt=root, resume=True)
    expect(f"FIFO as {name}: resume", rc, out, ["a FIFO"])
d, root, step = copy("fifo_export")
os.remove(os.path.join(step, "metadata.ckpt"))
os.mkfifo(os.path.join(step, "metadata.ckpt"))
rc, out = run([ckpt_tool, "export", root, "--format", "hf", "-o", os.path.join(work, "fifo_hf")], timeout=20)
expect("FIFO as metadata.ckpt: export", rc, out, ["a FIFO"])

# A resume at or past run.steps trains nothing and says so.
d, root, step = copy("past_end")
rc, out = zero_gpt(d, 3, ckpt=root, resume=True)
expect("resume past run.steps", rc, out, ["nothing to train", "done: no steps trained"],
       ok_status=lambda r: r == 0, absent=["done: -"])

# Strings with a newline and floats with 17 digits survive config.yaml and the saved config.
odd = os.path.join(work, "odd\nname")
# --set values are YAML: the double-quoted form carries the newline as "\n".
rc, out = zero_gpt(odd, 2, "run.token_budget=1.2345678901234567e9", f'run.out_dir="{work}/odd\\nname"')
expected = {"out_dir": odd, "token_budget": 1.2345678901234567e9}
if rc != 0:
    expect("YAML round trip (run)", rc, out, [], ok_status=lambda r: False)
else:
    with open(os.path.join(odd, "config.yaml")) as f:
        written = yaml.safe_load(f)["run"]
    saved = yaml.safe_load(dump(os.path.join(odd, "checkpoints", "step_00000002"))["config_yaml"])["run"]
    for what, got in [("config.yaml", written), ("the saved config", saved)]:
        diff = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
        expect(f"YAML round trip ({what})", 0 if not diff else 1, f"{diff}", [], ok_status=lambda r: r == 0)

if failures:
    sys.exit(f"{len(failures)} case(s) failed: {failures}")
print("all cases passed")
