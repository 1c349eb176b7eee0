#!/usr/bin/env python3
"""llm.c checkpoints in and out of zero-gpt, checked against a writer written here (standard
library only).

A short zero-gpt run (vocabulary 130, so wte carries 126 padding rows) saves a checkpoint and
`zero-ckpt export --format safetensors` writes its weights under the trainer's names (Conv1D
[in, out] matrices, 256 wte rows). From those, this script writes an llm.c GPT-2 checkpoint
itself, as llm.c's train_gpt2.py write_model does: 256 int32 (magic 20240326, version 3,
max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size, zeros), then wte,
wpe, each per-layer tensor for all layers together (ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
ln2w, ln2b, fcw, fcb, fcprojw, fcprojb), lnfw, lnfb, matrices [out, in], padding rows zero.

Import: a run started from that file (model.init_from) must report, before any step, the
validation loss the first run had at the step it saved, to the last bit; so must files whose
padding rows are not zero (256 or 384 of them; they must not be read, and the trainer's stay
zero) or that have none. A model section that does not fit, a truncated file, a token shard, a
wrong magic, an unknown version and a missing file are refused with messages that say so.

Export: `zero-ckpt export --format llmc` must write the same bytes as this script (fp32,
version 3, and bf16, version 5, rounded to nearest even). Round trip: the run started from the
exported file takes one step at learning rate 0 (which leaves every weight as it was) and
saves; exporting that checkpoint gives the same bytes again.

    gpt_llmc.py ZERO_GPT ZERO_CKPT CONFIG WORKDIR
"""
import array
import json
import os
import shutil
import struct
import subprocess
import sys

exe, ckpt_tool, config, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
steps, L, NH, C, T, V = 3, 2, 2, 32, 32, 130
Vp = 256  # padded to a multiple of 128, as llm.c pads


def fail(msg):
    sys.exit("gpt_llmc: FAIL: " + msg)


def zero_gpt(run_dir, *extra):
    cmd = [exe, "--config", config, "--set", "run.eval_sequences=8", "--set", "run.sample_tokens=0",
           "--set", f"model.n_layer={L}", "--set", f"model.n_embd={C}", "--set", f"model.n_head={NH}",
           "--set", f"model.seq_len={T}", "--set", f"model.vocab_size={V}",
           "--set", "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1",
           "--set", f"run.out_dir={run_dir}"]
    for e in extra:
        cmd += ["--set", e]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def trained(run_dir, *extra):
    out = zero_gpt(run_dir, *extra)
    if out.returncode != 0:
        fail(f"zero-gpt {' '.join(extra)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return {r["step"]: r["val_loss"] for r in map(json.loads, f) if r["type"] == "eval"}


def export(ckpt, fmt, path, *extra):
    cmd = [ckpt_tool, "export", ckpt, "--format", fmt, "-o", path, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


def read_safetensors(path):
    """name -> float32 array of an F32 safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {name: array.array("f", data[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__"}


def transposed(a, rows, cols):
    """[rows, cols] row-major as [cols, rows]."""
    return array.array(a.typecode, (a[i * cols + j] for j in range(cols) for i in range(rows)))


def bf16(a):
    """fp32 values as bf16 bit patterns, rounded to nearest even (no NaNs here)."""
    return array.array("H", (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
                             for u in array.array("I", a.tobytes())))


def write_llmc(path, w, version, padded=Vp, padding_value=0.0):
    """w: the trainer's tensors by name (read_safetensors of the raw export); wte gets `padded`
    rows, those past the vocabulary filled with padding_value (llm.c's are zero)."""
    wte = array.array("f", w["wte.weight"][:V * C]) + array.array("f", [padding_value] * ((padded - V) * C))
    tensors = [wte, w["wpe.weight"]]
    per_layer = [("ln_1.weight", None), ("ln_1.bias", None), ("attn.c_attn.weight", (C, 3 * C)),
                 ("attn.c_attn.bias", None), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", None),
                 ("ln_2.weight", None), ("ln_2.bias", None), ("mlp.c_fc.weight", (C, 4 * C)),
                 ("mlp.c_fc.bias", None), ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", None)]
    for name, conv1d in per_layer:  # one tensor for every layer, then the next
        for l in range(L):
            t = w[f"h.{l}.{name}"]
            tensors.append(t if conv1d is None else transposed(t, *conv1d))  # [in, out] -> [out, in]
    tensors += [w["ln_f.weight"], w["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240326, version, T, V, L, NH, C, padded, *([0] * 248)))
        for t in tensors:
            f.write(t.tobytes() if version == 3 else bf16(t).tobytes())


def refused(name, data, expect, *extra):
    path = os.path.join(work, name + ".bin")
    with open(path, "wb") as f:
        f.write(data)
    out = zero_gpt(os.path.join(work, name), "run.steps=1", f"model.init_from={path}", *extra)
    text = out.stdout + out.stderr
    if out.returncode == 0 or any(e not in text for e in expect):
        fail(f"{name}: not refused with {expect} ({out.returncode}):\n{text}")


# 1. Train a few steps and save; the weights under the trainer's names.
first = os.path.join(work, "trained")
trained_loss = trained(first, f"run.steps={steps}", f"run.save_interval={steps}",
                       f"run.eval_interval={steps}")[steps]
ckpt = os.path.join(first, "checkpoints")
raw = os.path.join(work, "raw.safetensors")
export(ckpt, "safetensors", raw)
weights = read_safetensors(raw)
if len(weights["wte.weight"]) != Vp * C or any(weights["wte.weight"][V * C:]):
    fail("the raw export's wte is not 256 rows with zero padding rows")
ours = os.path.join(work, "written_here.bin")
write_llmc(ours, weights, 3)

# 2. Import: the loss before any step is the trained model's.
imported = trained(os.path.join(work, "imported"), "run.steps=1", f"model.init_from={ours}")
if imported.get(0) != trained_loss:
    fail(f"imported loss at step 0 {imported.get(0)!r} != trained loss {trained_loss!r}")

# Padding rows that are not zero (256 rows, as the trainer's, and 384), or none (vocab_size
# rows). The loss is the same, and (one step at learning rate 0, saved, exported) the trainer's
# wte is the trained one with zero padding rows: the file's padding rows are not read. (The
# loss alone would not tell: the trainer masks the padding logits.)
for padded, value in ((V, 0.0), (Vp, 1.0e3), (384, 1.0e3)):
    other = os.path.join(work, f"padded_{padded}.bin")
    write_llmc(other, weights, 3, padded, value)
    run_dir = os.path.join(work, f"imported_padded_{padded}")
    loss = trained(run_dir, "run.steps=1", "run.save_interval=1", "optimizer.params.lr=0",
                   f"model.init_from={other}")[0]
    if loss != trained_loss:
        fail(f"imported from a file padded to {padded} rows: loss {loss!r} != trained loss {trained_loss!r}")
    wte_raw = os.path.join(work, f"imported_padded_{padded}.safetensors")
    export(os.path.join(run_dir, "checkpoints"), "safetensors", wte_raw)
    if read_safetensors(wte_raw)["wte.weight"] != weights["wte.weight"]:
        fail(f"imported from a file padded to {padded} rows: wte is not the trained one with zero padding rows")

# 3. Clear errors before training.
with open(ours, "rb") as f:
    good = f.read()
refused("misfit", good, ["does not fit the model", "the llm.c header's channels = 32, the model has n_embd = 64"],
        "model.n_embd=64")
refused("truncated", good[:-100], ["is truncated", f"needs {len(good)}"])
refused("shard", struct.pack("<i", 20240520) + good[4:], ["is an llm.c token shard"])
refused("magic", struct.pack("<i", 12345) + good[4:], ["is not an llm.c GPT-2 checkpoint", "starts with 12345"])
refused("version", good[:4] + struct.pack("<i", 4) + good[8:], ["version 4", "reads versions 3 (fp32) and 5 (bf16)"])
out = zero_gpt(os.path.join(work, "missing"), "run.steps=1", f"model.init_from={work}/missing.bin")
if out.returncode == 0 or f"'{work}/missing.bin' does not exist" not in out.stdout + out.stderr:
    fail(f"a missing file was not refused clearly ({out.returncode}):\n{out.stdout}{out.stderr}")

# 4. Export: the same bytes as written here, in fp32 (version 3) and bf16 (version 5).
exported = os.path.join(work, "exported.bin")
export(ckpt, "llmc", exported)
with open(exported, "rb") as f:
    if f.read() != good:
        fail("zero-ckpt export --format llmc differs from the file written here")
ours16, exported16 = os.path.join(work, "written_here_bf16.bin"), os.path.join(work, "exported_bf16.bin")
write_llmc(ours16, weights, 5)
export(ckpt, "llmc", exported16, "--dtype", "bf16")
with open(ours16, "rb") as a, open(exported16, "rb") as b:
    if a.read() != b.read():
        fail("zero-ckpt export --format llmc --dtype bf16 differs from the file written here")

# 5. Round trip: start from the export, one step at learning rate 0, save, export again.
again = os.path.join(work, "round_trip")
losses = trained(again, "run.steps=1", "run.save_interval=1", "optimizer.params.lr=0",
                 f"model.init_from={exported}")
if losses.get(0) != trained_loss or losses.get(1) != trained_loss:
    fail(f"round trip losses {losses} (steps 0 and 1), expected {trained_loss} at both")
second = os.path.join(work, "exported_again.bin")
export(os.path.join(again, "checkpoints"), "llmc", second)
with open(second, "rb") as f:
    if f.read() != good:
        fail("exporting the model imported from the export gives other bytes")

# 6. The bf16 file loads: its loss is the trained one to bf16's precision.
loss16 = trained(os.path.join(work, "imported_bf16"), "run.steps=1", f"model.init_from={exported16}")[0]
if not abs(loss16 - trained_loss) < 0.05 or loss16 == trained_loss:
    fail(f"bf16 import loss {loss16} vs fp32 {trained_loss}: not within rounding")
print(f"gpt_llmc: ok (loss {trained_loss} after {steps} steps, the same from the llm.c file; {len(good)} bytes "
      f"exported as written here, again after a round trip; bf16 loss {loss16})")
