#!/usr/bin/env python3
"""model.init_from refuses weights a run cannot train from, naming the tensor and the index.

The test writes tiny GPT-2 weights itself, as a Hugging Face directory (model.safetensors,
config.json), a bare .safetensors file and an llm.c checkpoint, each with one value that is
not finite (NaN, +inf, -inf), and starts zero-gpt from each: it must exit with status 1 before
any step, naming the tensor, the value and its index. A finite value the run's fp16 parameters
cannot hold is refused by the engine's check; a safetensors file whose tensors overlap is
refused by the format's check.

    gpt_nonfinite_init.py ZERO_GPT CONFIG WORKDIR
"""
import array
import json
import os
import shutil
import struct
import subprocess
import sys

exe, config, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
L, NH, C, T, V = 1, 2, 32, 32, 130
Vp = 256  # llm.c pads the vocabulary to a multiple of 128
failures = []

# The trainer's tensors and shapes (Hugging Face's Conv1D layout: [in, out]).
PER_LAYER = [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [C, 3 * C]),
             ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
             ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [C, 4 * C]),
             ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [4 * C, C]), ("mlp.c_proj.bias", [C])]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def weights():
    """name -> (shape, float32 values): small finite values, distinct per tensor."""
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    shapes += [(f"h.{l}.{n}", s) for l in range(L) for n, s in PER_LAYER]
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    return {n: (s, array.array("f", (0.02 * ((i * 7 + k) % 11 - 5) / 5 for i in range(numel(s)))))
            for k, (n, s) in enumerate(shapes)}


def write_safetensors(path, w, overlap=False):
    header, offset = {}, 0
    for name, (shape, values) in w.items():
        size = 4 * len(values)
        # overlap: the second tensor starts 4 bytes early (the file keeps its total size right).
        begin = offset - 4 if overlap and len(header) == 1 else offset
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + size]}
        offset = begin + size
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    data = b"".join(values.tobytes() for _, values in w.values())
    if overlap:
        data = data[:offset]
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def write_hf_dir(path, w):
    os.makedirs(path)
    write_safetensors(os.path.join(path, "model.safetensors"), w)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T,
                   "vocab_size": V}, f)


def transposed(a, rows, cols):
    return array.array("f", (a[i * cols + j] for j in range(cols) for i in range(rows)))


def write_llmc(path, w):
    """llm.c's version 3 (fp32): wte padded to Vp rows, each kind of layer tensor for every layer,
    Conv1D matrices stored [out, in]."""
    tensors = [w["wte.weight"][1] + array.array("f", [0.0] * ((Vp - V) * C)), w["wpe.weight"][1]]
    for name, shape in PER_LAYER:
        for l in range(L):
            values = w[f"h.{l}.{name}"][1]
            tensors.append(transposed(values, *shape) if len(shape) == 2 else values)
    tensors += [w["ln_f.weight"][1], w["ln_f.bias"][1]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240326, 3, T, V, L, NH, C, Vp, *([0] * 248)))
        for t in tensors:
            f.write(t.tobytes())


def with_value(name, index, value):
    w = weights()
    w[name][1][index] = value
    return w


def zero_gpt(init_from, *extra):
    cmd = [exe, "--config", config, "--set", "run.steps=1", "--set", "run.eval_interval=0",
           "--set", "run.sample_tokens=0", "--set", f"model.n_layer={L}", "--set", f"model.n_embd={C}",
           "--set", f"model.n_head={NH}", "--set", f"model.seq_len={T}", "--set", f"model.vocab_size={V}",
           "--set", "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1",
           "--set", f"run.out_dir={init_from}.run", "--set", f"model.init_from={init_from}"]
    for e in extra:
        cmd += ["--set", e]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def refused(case, init_from, expect, *extra, absent=("different initial values",)):
    rc, text = zero_gpt(init_from, *extra)
    missing = [e for e in expect if e not in text]
    wrong = [a for a in absent if a in text]
    if rc != 1 or missing or wrong or "step 1 " in text:
        failures.append(f"{case}: exit {rc} (expected 1), missing {missing}, present {wrong}:\n{text}")
    else:
        print(f"{case}: refused with status 1, naming {expect[0]}")


nan, inf = float("nan"), float("inf")

# Sanity: the same files with finite values train.
write_hf_dir(os.path.join(work, "good_hf"), weights())
rc, text = zero_gpt(os.path.join(work, "good_hf"))
if rc != 0:
    sys.exit(f"gpt_nonfinite_init: FAIL: the finite Hugging Face weights did not train ({rc}):\n{text}")
write_llmc(os.path.join(work, "good.bin"), weights())
rc, text = zero_gpt(os.path.join(work, "good.bin"))
if rc != 0:
    sys.exit(f"gpt_nonfinite_init: FAIL: the finite llm.c weights did not train ({rc}):\n{text}")

write_hf_dir(os.path.join(work, "nan_hf"), with_value("h.0.attn.c_proj.weight", 37, nan))
refused("HF directory, NaN", os.path.join(work, "nan_hf"),
        ["tensor 'h.0.attn.c_proj.weight'", "holds nan at index 37, which is not finite"])

write_safetensors(os.path.join(work, "inf.safetensors"), with_value("wpe.weight", 5, inf))
refused("safetensors file, +inf", os.path.join(work, "inf.safetensors"),
        ["tensor 'wpe.weight'", "holds inf at index 5, which is not finite"])

write_llmc(os.path.join(work, "nan.bin"), with_value("ln_f.bias", 3, nan))
refused("llm.c, NaN", os.path.join(work, "nan.bin"),
        ["tensor 'ln_f.bias'", "holds nan at index 3, which is not finite"])

# A Conv1D matrix: the index is the file's, before the transpose ([C, 4C] stored [4C, C]).
w = weights()
stored = transposed(w["h.0.mlp.c_fc.weight"][1], C, 4 * C)
stored[10] = -inf
w["h.0.mlp.c_fc.weight"] = ([C, 4 * C], transposed(stored, 4 * C, C))
write_llmc(os.path.join(work, "inf.bin"), w)
refused("llm.c, -inf in a transposed matrix", os.path.join(work, "inf.bin"),
        ["tensor 'h.0.mlp.c_fc.weight'", "holds -inf at index 10 (as stored, before llm.c's transpose)"])

# Finite in fp32, beyond fp16: refused for an fp16 run by the engine's check.
write_hf_dir(os.path.join(work, "big_hf"), with_value("h.0.mlp.c_proj.weight", 9, 1e5))
refused("HF directory, 1e5 in an fp16 run", os.path.join(work, "big_hf"),
        ["parameter 'h.0.mlp.c_proj.weight'", "initial value 100000 at index 9",
         "the run's fp16 parameters cannot hold"], "fp16.enabled=true")

write_safetensors(os.path.join(work, "overlap.safetensors"), weights(), overlap=True)
refused("safetensors file, overlapping tensors", os.path.join(work, "overlap.safetensors"),
        [f"safetensors file '{os.path.join(work, 'overlap.safetensors')}'",
         "overlap: bytes [16636, 16640) belong to both"])

if failures:
    sys.exit("gpt_nonfinite_init: FAIL:\n" + "\n\n".join(failures))
print("gpt_nonfinite_init: every file with a value the run cannot hold was refused")
