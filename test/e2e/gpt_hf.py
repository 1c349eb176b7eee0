#!/usr/bin/env python3
"""Hugging Face export and import round trip, checked with the standard library only.

A short zero-gpt run (vocabulary 130, so wte carries 126 padding rows) saves a checkpoint;
`zero-ckpt export --format hf` writes a GPT-2 directory whose config.json fields, tensor names
and shapes are checked here against what transformers' GPT2LMHeadModel expects, and whose
values are compared with the raw export (`--format safetensors`, padding rows included). A
second run starts from the directory (model.init_from): its validation loss before any step
must equal the first run's at the step it saved, to the last bit. A run whose model section
does not fit the weights must fail with a message naming the difference.

    gpt_hf.py ZERO_GPT ZERO_CKPT CONFIG WORKDIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

exe, ckpt_tool, config, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
steps, n_layer, n_head, n_embd, seq_len, vocab = 3, 2, 2, 32, 32, 130
padded = 256


def fail(msg):
    sys.exit("gpt_hf: FAIL: " + msg)


def zero_gpt(run_dir, *extra):
    cmd = [exe, "--config", config, "--set", "run.eval_sequences=8", "--set", "run.sample_tokens=0",
           "--set", f"model.n_layer={n_layer}", "--set", f"model.n_embd={n_embd}",
           "--set", f"model.n_head={n_head}", "--set", f"model.seq_len={seq_len}",
           "--set", f"model.vocab_size={vocab}", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", f"run.out_dir={run_dir}"]
    for e in extra:
        cmd += ["--set", e]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def evals(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return {r["step"]: r["val_loss"] for r in map(json.loads, f) if r["type"] == "eval"}


def read_safetensors(path):
    """Header and a name -> raw bytes map; checks the container as it goes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    start = 8 + n
    out, end = {}, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if e - b != count * {"F32": 4, "BF16": 2, "F16": 2}[t["dtype"]]:
            fail(f"{path}: tensor {name} holds {e - b} bytes for shape {t['shape']}")
        out[name] = data[start + b:start + e]
        end = max(end, e)
    if start + end != len(data):
        fail(f"{path}: {len(data) - start - end} bytes after the last tensor")
    return header, out


# 1. Train a few steps and save.
first = os.path.join(work, "trained")
out = zero_gpt(first, f"run.steps={steps}", f"run.save_interval={steps}", f"run.eval_interval={steps}")
if out.returncode != 0:
    fail(f"zero-gpt failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
trained_loss = evals(first)[steps]

# 2. Export: the Hugging Face directory and the raw file.
ckpt = os.path.join(first, "checkpoints")
hf = os.path.join(work, "hf")
raw = os.path.join(work, "raw.safetensors")
for cmd in ([ckpt_tool, "export", ckpt, "--format", "hf", "-o", hf],
            [ckpt_tool, "export", ckpt, "--format", "safetensors", "-o", raw]):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

# 3. config.json as GPT2Config reads it.
with open(os.path.join(hf, "config.json"), encoding="utf-8") as f:
    cfg = json.load(f)
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": n_layer, "n_head": n_head,
        "n_embd": n_embd, "n_positions": seq_len, "vocab_size": vocab, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
for k, v in want.items():
    if cfg.get(k) != v:
        fail(f"config.json {k} = {cfg.get(k)!r}, expected {v!r}")

# 4. Names and shapes: GPT-2's, Conv1D weights [in, out], the true vocabulary, no lm_head.
C = n_embd
shapes = {"wte.weight": [vocab, C], "wpe.weight": [seq_len, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for i in range(n_layer):
    for name, shape in {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
                        "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
                        "ln_2.weight": [C], "ln_2.bias": [C], "mlp.c_fc.weight": [C, 4 * C],
                        "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C]}.items():
        shapes[f"h.{i}.{name}"] = shape
header, tensors = read_safetensors(os.path.join(hf, "model.safetensors"))
got = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
if got != shapes:
    fail(f"tensors differ from GPT-2's:\n missing {sorted(set(shapes) - set(got))}\n"
         f" unexpected {sorted(set(got) - set(shapes))}\n"
         f" shapes {[(k, got[k], shapes[k]) for k in shapes if k in got and got[k] != shapes[k]]}")
if header.get("__metadata__", {}).get("format") != "pt":
    fail("the safetensors metadata lacks format: pt, which transformers looks for")

# 5. Values: the raw export's, wte without its padding rows.
raw_header, raw_tensors = read_safetensors(raw)
if raw_header["wte.weight"]["shape"] != [padded, C]:
    fail(f"raw export wte is {raw_header['wte.weight']['shape']}, expected [{padded}, {C}]")
for name, data in tensors.items():
    expect = raw_tensors[name][:vocab * C * 4] if name == "wte.weight" else raw_tensors[name]
    if data != expect:
        fail(f"{name} differs from the raw export")
if any(raw_tensors["wte.weight"][vocab * C * 4:]):
    fail("the padding rows of wte are not zero in the raw export")

# 6. Import: the loss before any step is the trained model's.
second = os.path.join(work, "imported")
out = zero_gpt(second, "run.steps=1", f"model.init_from={hf}")
if out.returncode != 0:
    fail(f"zero-gpt with model.init_from failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
imported = evals(second)
if 0 not in imported:
    fail(f"no validation at step 0 with model.init_from:\n{out.stdout}")
if imported[0] != trained_loss:
    fail(f"imported loss {imported[0]!r} != trained loss {trained_loss!r}")

# 7. A model section that does not fit the weights: a clear error before training.
out = zero_gpt(os.path.join(work, "misfit"), "run.steps=1", f"model.init_from={hf}", "model.n_embd=64")
text = out.stdout + out.stderr
if out.returncode == 0 or "does not fit the model" not in text or "config.json n_embd = 32" not in text:
    fail(f"a misfit model section was not refused clearly ({out.returncode}):\n{text}")
print(f"gpt_hf: ok (loss {trained_loss} after {steps} steps, the same after import)")
