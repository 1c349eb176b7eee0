#!/usr/bin/env python3
"""Llama and BLOOM Hugging Face directories in and out of zero-gpt, with numpy only.

A tiny LlamaForCausalLM (grouped-query attention, untied head, three shards with an index, fp32)
and a tiny BloomForCausalLM (one bf16 file) are written here in Hugging Face's names and layout.
zero-gpt starts from each (model.init_from): its validation loss before any step must equal the
loss of a numpy forward written from Hugging Face's equations (hf_arch_reference.py) within 1e-4.
After two steps the checkpoint is exported (`zero-ckpt export --format hf`, the llama one cut
into shards by --max-shard-size): config.json must carry the model's fields, the tensors must be
Hugging Face's names and shapes, their values the checkpoint's (the raw export) to the bit once
mapped back by the documented correspondence, the numpy forward of the export must give the
trained model's loss, and a run started from the export must give that loss to the last bit.

    gpt_hf_arch.py ZERO_GPT ZERO_CKPT CONFIG SHAKESPEARE_TXT WORKDIR

With a sixth argument `errors`: configurations the trainer does not compute (rope_scaling,
rotary scaling in rope_parameters, llama biases, BLOOM's post-LayerNorm residual) and a model
section that does not fit the weights are refused, naming the field and the key to set.

With `tp MPIEXEC "FLAGS;..."`: the same directories imported at model.tensor_parallel 2 on 2
ranks give the numpy loss before any step, and each rank reads only its parts: rank 0's tensor
bytes at most 60% of what one rank reads for the whole model (the norms are read by both).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_arch_reference as ref  # noqa: E402

exe, ckpt_tool, config, text, work = sys.argv[1:6]
mode = sys.argv[6] if len(sys.argv) > 6 else "roundtrip"
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
T, N_EVAL, STEPS = 32, 4, 2
windows = ref.val_windows(text, T, N_EVAL)


def fail(msg):
    sys.exit("gpt_hf_arch: FAIL: " + msg)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def tiny(arch, rng):
    if arch == "llama":
        c = ref.llama_config()
        return c, ref.random_llama(rng, c), ref.llama_logits
    c = ref.bloom_config()
    return c, ref.random_bloom(rng, c), ref.bloom_logits


def evaluated(run_dir, settings):
    out = ref.zero_gpt(exe, config, run_dir, settings)
    if out.returncode != 0:
        fail(f"zero-gpt {' '.join(settings)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return ref.evals(run_dir)


def roundtrip(arch, seed):
    c, w, logits = tiny(arch, np.random.default_rng(seed))
    src = os.path.join(work, f"{arch}_src")
    # llama: three shards of fp32; bloom: one bf16 file (the reference reads the rounded values).
    stored = ref.write_hf_dir(src, c, w, dtype="F32" if arch == "llama" else "BF16",
                              shards=3 if arch == "llama" else 1)
    expect = ref.mean_loss(logits, c, stored, windows)
    keys = ref.model_keys(arch, c, T) + [f"run.eval_sequences={N_EVAL}"]

    # 1. Import: the loss before any step is the equations'.
    trained_dir = os.path.join(work, f"{arch}_trained")
    ev = evaluated(trained_dir, keys + [f"model.init_from={src}", f"run.steps={STEPS}",
                                        f"run.save_interval={STEPS}", f"run.eval_interval={STEPS}"])
    if 0 not in ev or STEPS not in ev:
        fail(f"{arch}: evaluations at steps {sorted(ev)}, expected 0 and {STEPS}")
    if abs(ev[0] - expect) > 1e-4:
        fail(f"{arch}: imported loss {ev[0]} differs from the numpy forward's {expect} by {abs(ev[0] - expect)}")
    print(f"gpt_hf_arch: {arch} import: zero-gpt {ev[0]:.7f}, numpy {expect:.7f} (|diff| {abs(ev[0] - expect):.2e})")

    # 2. Export, and the raw export of the same checkpoint.
    ckpt = os.path.join(trained_dir, "checkpoints")
    hf = os.path.join(work, f"{arch}_hf")
    raw = os.path.join(work, f"{arch}_raw.safetensors")
    shard = ["--max-shard-size", "20KB"] if arch == "llama" else []
    run([ckpt_tool, "export", ckpt, "--format", "hf", "-o", hf] + shard)
    run([ckpt_tool, "export", ckpt, "--format", "safetensors", "-o", raw])
    files = sorted(os.listdir(hf))
    if arch == "llama" and ("model.safetensors.index.json" not in files or "model.safetensors" in files or
                            sum(f.startswith("model-") for f in files) < 2):
        fail(f"llama: --max-shard-size 20KB wrote {files}, expected shards and an index")
    if arch == "bloom" and "model.safetensors" not in files:
        fail(f"bloom: the export wrote {files}, expected model.safetensors")

    # 3. config.json: the fields the model was trained with.
    with open(os.path.join(hf, "config.json"), encoding="utf-8") as f:
        got_cfg = json.load(f)
    want = {k: v for k, v in c.items() if k not in ("torch_dtype", "max_position_embeddings")}
    want["torch_dtype"] = "float32"
    if arch == "llama":
        want["max_position_embeddings"] = T
    for k, v in want.items():
        if got_cfg.get(k, "absent") != v:
            fail(f"{arch}: exported config.json {k} = {got_cfg.get(k, 'absent')!r}, expected {v!r}")

    # 4. Names, shapes and values.
    exported = ref.read_hf_dir(hf)
    want_shapes = {k: list(v.shape) for k, v in w.items()}
    got_shapes = {k: list(v.shape) for k, v in exported.items()}
    if got_shapes != want_shapes:
        fail(f"{arch}: exported tensors differ from Hugging Face's: missing {sorted(set(want_shapes) - set(got_shapes))}"
             f", unexpected {sorted(set(got_shapes) - set(want_shapes))}, shapes "
             f"{[(k, got_shapes[k], v) for k, v in want_shapes.items() if k in got_shapes and got_shapes[k] != v]}")
    raw_t = ref.read_safetensors(raw)
    mine = ref.hf_to_trainer(arch, c, exported)
    if set(mine) != set(raw_t):
        fail(f"{arch}: the checkpoint holds {sorted(raw_t)}, the export maps to {sorted(mine)}")
    V = c["vocab_size"]
    for name, a in mine.items():
        r = raw_t[name][:V] if name in ("wte.weight", "lm_head.weight") else raw_t[name]
        if a.shape != r.shape or not np.array_equal(a.view(np.uint32), r.view(np.uint32)):
            fail(f"{arch}: exported {name} is not the checkpoint's to the bit "
                 f"(max |diff| {np.abs(a.astype(np.float64) - r).max() if a.shape == r.shape else 'shape'})")
        if name in ("wte.weight", "lm_head.weight") and raw_t[name][V:].any():
            fail(f"{arch}: the padding rows of {name} are not zero in the checkpoint")
    exported_loss = ref.mean_loss(logits, c, exported, windows)
    if abs(exported_loss - ev[STEPS]) > 1e-4:
        fail(f"{arch}: the numpy forward of the export gives {exported_loss}, zero-gpt's trained model {ev[STEPS]}")

    # 5. Re-import: the trained model's loss to the last bit.
    again = evaluated(os.path.join(work, f"{arch}_again"), keys + [f"model.init_from={hf}", "run.steps=1"])
    if again.get(0) != ev[STEPS]:
        fail(f"{arch}: re-imported loss {again.get(0)!r} != trained loss {ev[STEPS]!r}")
    print(f"gpt_hf_arch: {arch} export: {len(exported)} tensors equal to the checkpoint's bit for bit; numpy "
          f"{exported_loss:.7f}, zero-gpt {ev[STEPS]:.7f}; re-imported loss identical")


def refused(name, arch, cfg_over, model_over, needles):
    c, w, _ = tiny(arch, np.random.default_rng(7))
    c = dict(c, **cfg_over)
    src = os.path.join(work, name)
    ref.write_hf_dir(src, c, w)
    keys = ref.model_keys(arch, ref.llama_config() if arch == "llama" else ref.bloom_config(), T)
    out = ref.zero_gpt(exe, config, os.path.join(work, name + "_run"),
                       keys + [f"model.{k}={v}" for k, v in model_over.items()] +
                       [f"model.init_from={src}", "run.steps=2"])
    msg = out.stdout + out.stderr
    if out.returncode == 0 or any(n not in msg for n in needles):
        fail(f"{name}: expected a refusal naming {needles} (status {out.returncode}):\n{msg}")
    line = next((ln for ln in msg.splitlines() if needles[0] in ln), "")
    print(f"gpt_hf_arch: {name} refused: {line.strip()[:160]}")


if mode == "errors":
    refused("rope_scaling", "llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {},
            ["rope_scaling", "does not compute"])
    refused("rope_llama3", "llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0}},
            {}, ["rope_parameters.rope_type", "llama3"])
    refused("attention_bias", "llama", {"attention_bias": True}, {}, ["attention_bias = true"])
    refused("post_layernorm", "bloom", {"apply_residual_connection_post_layernorm": True}, {},
            ["apply_residual_connection_post_layernorm"])
    refused("misfit_llama", "llama", {}, {"n_kv_head": 4, "ffn_hidden": 64, "rope_theta": 10000},
            ["does not fit the model", "num_key_value_heads = 2", "set model.n_kv_head: 2",
             "set model.ffn_hidden: 48", "set model.rope_theta: 500"])
    refused("misfit_arch", "bloom", {}, {"arch": "gpt2"}, ["does not fit the model", "set model.arch: bloom"])
    print("gpt_hf_arch: ok (every unsupported configuration and misfit refused with its key)")
elif mode == "tp":
    mpiexec, flags = sys.argv[7], sys.argv[8].split(";")

    def read_mib(out):
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("init_from: read ")), None)
        if line is None:
            fail(f"no 'init_from: read' line in:\n{out.stdout}")
        return float(line.split()[2])

    for arch, seed in (("llama", 1), ("bloom", 2)):
        c, w, logits = tiny(arch, np.random.default_rng(seed))
        src = os.path.join(work, f"{arch}_src")
        stored = ref.write_hf_dir(src, c, w, dtype="F32", shards=2 if arch == "llama" else 1)
        expect = ref.mean_loss(logits, c, stored, windows)
        keys = ref.model_keys(arch, c, T) + [f"run.eval_sequences={N_EVAL}", f"model.init_from={src}", "run.steps=1"]
        one = ref.zero_gpt(exe, config, os.path.join(work, f"{arch}_tp1"), keys)
        if one.returncode != 0:
            fail(f"{arch}: 1 rank failed:\n{one.stdout}\n{one.stderr}")
        cmd = [mpiexec, *flags, "-n", "2", exe, "--config", config, "--set", "run.sample_tokens=0", "--set",
               "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1", "--set",
               f"run.out_dir={os.path.join(work, arch + '_tp2')}", "--set", "model.tensor_parallel=2"]
        for k in keys:
            cmd += ["--set", k]
        two = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if two.returncode != 0:
            fail(f"{arch}: tensor_parallel 2 failed:\n{two.stdout}\n{two.stderr}")
        ev = ref.evals(os.path.join(work, arch + "_tp2"))
        if 0 not in ev or abs(ev[0] - expect) > 1e-4:
            fail(f"{arch}: tensor_parallel 2 imported loss {ev.get(0)} differs from the numpy forward's {expect}")
        whole, part = read_mib(one), read_mib(two)
        if not part <= 0.6 * whole:
            fail(f"{arch}: tensor rank 0 read {part} MiB, one rank {whole} MiB: the parts are not read alone")
        print(f"gpt_hf_arch: {arch} at tensor_parallel 2: loss {ev[0]:.7f}, numpy {expect:.7f} "
              f"(|diff| {abs(ev[0] - expect):.2e}); rank 0 read {part:.3f} MiB of tensors, one rank alone {whole:.3f}")
    print("gpt_hf_arch: ok (tensor-parallel import)")
else:
    roundtrip("llama", 1)
    roundtrip("bloom", 2)
    print("gpt_hf_arch: ok")
