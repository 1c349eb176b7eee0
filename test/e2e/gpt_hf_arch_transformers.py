#!/usr/bin/env python3
"""Llama and BLOOM through transformers itself (where torch and transformers import; otherwise
exit 77, which ctest reports as skipped).

For each architecture a tiny random model (llama: grouped-query attention, untied head) is built
with transformers (LlamaForCausalLM, BloomForCausalLM) and saved with save_pretrained. zero-gpt
starts from the directory (model.init_from): its validation loss before any step must be
transformers' loss over the same windows within 1e-4, and transformers' logits must be those of
the numpy forward written from the equations (hf_arch_reference.py) within 1e-4. After two steps
zero-gpt samples greedily and its checkpoint is exported (zero-ckpt export --format hf):
from_pretrained must load it strictly (no missing, unexpected or mismatched tensors), give
zero-gpt's trained loss within 1e-4, and continue the same start token to the same greedy tokens.

    gpt_hf_arch_transformers.py ZERO_GPT ZERO_CKPT CONFIG SHAKESPEARE_TXT WORKDIR
"""
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers
except ImportError as e:
    print(f"gpt_hf_arch_transformers: skipped: torch and transformers are needed ({e})")
    sys.exit(77)

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_arch_reference as ref  # noqa: E402

exe, ckpt_tool, config, text, work = sys.argv[1:6]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
T, N_EVAL, STEPS, SAMPLE = 32, 4, 2, 12
windows = ref.val_windows(text, T, N_EVAL)
torch.manual_seed(0)


def fail(msg):
    sys.exit("gpt_hf_arch_transformers: FAIL: " + msg)


def build(arch):
    if arch == "llama":
        c = ref.llama_config()
        cfg = transformers.LlamaConfig(**{k: c[k] for k in ref.LLAMA})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        c = ref.bloom_config()
        cfg = transformers.BloomConfig(**{k: c[k] for k in ref.BLOOM})
        model = transformers.BloomForCausalLM(cfg)
    # Weights far from their initial values: norms around 1, biases nonzero, the attention far
    # from uniform.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "embed" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.3)
    return c, model.float().eval()


def hf_loss(model):
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in windows:
            z = model(torch.tensor([x])).logits[0].double()
            total += torch.nn.functional.cross_entropy(z, torch.tensor(y), reduction="sum").item()
            count += len(y)
    return total / count


def numpy_state(model):
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def greedy(model, start, n):
    ids = [start]
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[1:]


def check(arch):
    c, model = build(arch)
    src = os.path.join(work, f"{arch}_src")
    model.save_pretrained(src, safe_serialization=True)
    logits_fn = ref.llama_logits if arch == "llama" else ref.bloom_logits

    # The reference equations against transformers: logits on the first window.
    state = numpy_state(model)
    if arch == "bloom":  # BloomForCausalLM's state holds the tied head under its own name too
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    with torch.no_grad():
        theirs = model(torch.tensor([windows[0][0]])).logits[0].double().numpy()
    ours = logits_fn(c, state, np.array(windows[0][0]))
    if np.abs(theirs - ours).max() > 1e-4:
        fail(f"{arch}: transformers' logits differ from the equations' by {np.abs(theirs - ours).max()}")
    expect = hf_loss(model)

    # Import.
    run_dir = os.path.join(work, f"{arch}_trained")
    out = ref.zero_gpt(exe, config, run_dir,
                       ref.model_keys(arch, c, T) +
                       [f"run.eval_sequences={N_EVAL}", f"model.init_from={src}", f"run.steps={STEPS}",
                        f"run.save_interval={STEPS}", f"run.eval_interval={STEPS}", f"run.sample_tokens={SAMPLE}",
                        "run.temperature=0"])
    if out.returncode != 0:
        fail(f"{arch}: zero-gpt from {src} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    ev = ref.evals(run_dir)
    if abs(ev[0] - expect) > 1e-4:
        fail(f"{arch}: zero-gpt's loss from save_pretrained's directory is {ev[0]}, transformers' {expect}")
    print(f"gpt_hf_arch_transformers: {arch} import: zero-gpt {ev[0]:.7f}, transformers {expect:.7f} "
          f"(|diff| {abs(ev[0] - expect):.2e}); logits vs equations |diff| {np.abs(theirs - ours).max():.2e}")

    # Export, loaded strictly.
    hf = os.path.join(work, f"{arch}_hf")
    exp = subprocess.run([ckpt_tool, "export", os.path.join(run_dir, "checkpoints"), "--format", "hf", "-o", hf],
                         capture_output=True, text=True, timeout=120)
    if exp.returncode != 0:
        fail(f"{arch}: export failed:\n{exp.stdout}\n{exp.stderr}")
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.BloomForCausalLM
    back, info = cls.from_pretrained(hf, output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            fail(f"{arch}: from_pretrained of the export reports {key}: {info[key]}")
    back = back.float().eval()
    loss = hf_loss(back)
    if abs(loss - ev[STEPS]) > 1e-4:
        fail(f"{arch}: transformers gives the export loss {loss}, zero-gpt's trained model {ev[STEPS]}")
    with open(os.path.join(run_dir, "sample.txt"), encoding="utf-8") as f:
        sampled = [int(t) for t in f.read().split()]
    theirs_ids = greedy(back, 0, SAMPLE)  # zero-gpt's start token outside the byte and GPT-2 vocabularies
    if sampled != theirs_ids:
        fail(f"{arch}: zero-gpt's greedy tokens {sampled}, transformers' from the export {theirs_ids}")
    print(f"gpt_hf_arch_transformers: {arch} export: strict load, transformers {loss:.7f}, zero-gpt "
          f"{ev[STEPS]:.7f} (|diff| {abs(loss - ev[STEPS]):.2e}); {SAMPLE} greedy tokens identical")


check("llama")
check("bloom")
print(f"gpt_hf_arch_transformers: ok (transformers {transformers.__version__})")
