#!/usr/bin/env python3
"""zero-plan --json: the fields the issue names, consistent with each other and with
values worked out by hand. Usage: plan_json.py <zero-plan binary>"""
import json
import os
import subprocess
import sys
import tempfile

plan = sys.argv[1]
failures = []


def run(*args, ok=(0,)):
    p = subprocess.run([plan, *args, "--json"], capture_output=True, text=True)
    if p.returncode not in ok:
        sys.exit(f"zero-plan {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return json.loads(p.stdout)


def check(cond, what):
    if not cond:
        failures.append(what)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


FIELDS = ["fits", "gpu_bytes", "host_bytes", "nvme_bytes", "step_s", "tokens_per_s", "tflops_per_gpu", "days"]

# One configuration: GPT-2 small on one A100 at stage 0. Nothing pads at one rank (every unit is a
# multiple of 64 elements), so model states are 16 bytes x 124,475,904 parameters, plus 2 for the
# gradients, which accumulate in fp32 over 8 micro-steps of bf16 (data_types.grad_accum_dtype).
j = run("--model", "gpt2", "--gpu", "A100-80GB", "--gpus", "1", "--stage", "0", "--micro-batch", "4",
        "--accum", "8", "--ckpt", "off", "--tokens", "1e9")
for f in FIELDS:
    check(f in j, f"field {f} missing")
check(j["fits"] is True, "gpt2 on one A100 should fit")
check(j["params"] == 124475904, f"params {j['params']}")
check(j["model_state_bytes"] == 18 * 124475904, f"model_state_bytes {j['model_state_bytes']}")
check(j["settings"]["grad_accum_dtype"] == "fp32", f"grad_accum_dtype {j['settings']['grad_accum_dtype']}")
j1 = run("--model", "gpt2", "--gpu", "A100-80GB", "--gpus", "1", "--stage", "0", "--micro-batch", "4",
         "--accum", "1", "--ckpt", "off")
check(j1["model_state_bytes"] == 16 * 124475904, f"model_state_bytes without accumulation {j1['model_state_bytes']}")
check(j1["settings"]["grad_accum_dtype"] == "bf16", f"grad_accum_dtype {j1['settings']['grad_accum_dtype']}")
check(j["gpu_bytes"] > j["model_state_bytes"] + j["activation_bytes"], "gpu_bytes lacks buffers/overhead")
tokens_per_step = 4 * 8 * 1024
check(close(j["tokens_per_s"], tokens_per_step / j["step_s"]), "tokens_per_s != tokens per step / step_s")
check(close(j["tflops_per_gpu"], 6 * j["params"] * j["tokens_per_s"] / 1e12), "tflops_per_gpu formula")
check(close(j["days"], 1e9 / j["tokens_per_s"] / 86400), "days formula")
check(j["nvme_bytes"] == 0, "no NVMe in use")

# Checkpointing counts 8 FLOPs per parameter and token.
j = run("--model", "gpt2", "--gpu", "A100-80GB", "--gpus", "2", "--stage", "1", "--micro-batch", "4",
        "--ckpt", "on")
check(close(j["tflops_per_gpu"], 8 * j["params"] * j["tokens_per_s"] / (2 * 1e12)), "tflops with ckpt")

# Llama 3 8B and BLOOM-7b1: the architecture and the published parameter counts; Llama's untied
# input embedding (128,256 x 4,096 rows) is a lookup, so the FLOPs count the rest (flops_params).
j = run("--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--stage", "3", "--micro-batch", "1",
        "--ckpt", "on", "--offload", "cpu")
check(j["model"]["arch"] == "llama" and j["model"]["n_kv_head"] == 8 and j["model"]["ffn_hidden"] == 14336,
      f"llama3-8b model {j['model']}")
check(j["params"] == 8030261248, f"llama3-8b params {j['params']}")
check(close(j["tflops_per_gpu"], 8 * (8030261248 - 128256 * 4096) * j["tokens_per_s"] / (8 * 1e12)),
      "llama3-8b tflops count the untied embedding")
j = run("--model", "bloom-7b1", "--gpu", "A100-80GB", "--gpus", "32", "--stage", "1", "--micro-batch", "2",
        "--accum", "256", "--ckpt", "off")
check(j["model"]["arch"] == "bloom" and j["params"] == 7069016064, f"bloom-7b1 {j['model']} {j['params']}")
# An explicit shape names its architecture; --n-kv-head with a preset is refused.
j = run("--arch", "llama", "--n-layer", "4", "--n-head", "8", "--n-kv-head", "2", "--n-embd", "512",
        "--ffn-hidden", "1376", "--gpus", "1", "--stage", "0", "--micro-batch", "1", "--ckpt", "off")
check(j["model"]["arch"] == "llama" and j["model"]["n_kv_head"] == 2, f"explicit llama {j['model']}")
p = subprocess.run([plan, "--model", "gpt2", "--n-kv-head", "4", "--gpus", "1"], capture_output=True, text=True)
check(p.returncode != 0 and "--n-kv-head" in p.stderr, f"--n-kv-head with a preset: {p.returncode} {p.stderr}")

# Does not fit: GPT-3 175B on one V100-16GB.
j = run("--model", "gpt3-175b", "--gpu", "V100-16GB", "--gpus", "1", "--stage", "0", "--micro-batch", "1",
        "--ckpt", "on")
check(j["fits"] is False, "175B on one V100 must not fit")
check("GPU memory" in j["why"], f"why: {j['why']}")

# Open settings: the fastest fitting combination, and how many were considered.
j = run("--model", "gpt2-xl", "--gpus", "8")
check(j["fits"] is True and j["fitting"] <= j["candidates"], "ranked output")

# --max-model: max_params, and the plan of that model fits.
j = run("--max-model", "--gpus", "8", "--gpu", "H100-SXM", "--stage", "3", "--offload", "cpu",
        "--host-gb", "200", "--micro-batch", "1", "--ckpt", "on")
check(j["max_params"] > 1e9 and j["fits"] is True, f"max-model: {j.get('max_params')}")
check(j["host_bytes"] > 12 * j["max_params"] / 8, "the offloaded optimizer state is in host memory")

# Tensor 2 x pipeline 2 x data 2 on 8 GPUs: the grid in the settings, the 1F1B bubble
# (P - 1) / (m + P - 1), tokens per step over the 2 data-parallel replicas only, and the
# model-parallel traffic in the step time.
j = run("--model", "gpt2-medium", "--gpu", "A100-80GB", "--gpus", "8", "--tp", "2", "--pp", "2", "--stage", "1",
        "--micro-batch", "2", "--accum", "6", "--ckpt", "off")
for f in ["tensor_parallel", "pipeline_parallel", "data_parallel"]:
    check(f in j["settings"], f"settings.{f} missing")
check((j["settings"]["tensor_parallel"], j["settings"]["pipeline_parallel"], j["settings"]["data_parallel"]) == (2, 2, 2),
      f"grid {j['settings']}")
check(close(j["bubble"], 1 / 7), f"bubble {j['bubble']}")
check(close(j["tokens_per_s"], 2 * 6 * 1024 * 2 / j["step_s"]), "tokens_per_s over the data-parallel replicas")
check(close(j["tflops_per_gpu"], 6 * j["params"] * j["tokens_per_s"] / (8 * 1e12)), "tflops_per_gpu with a grid")
check(j["tp_comm_s"] > 0 and j["pp_comm_s"] > 0 and j["bubble_s"] > 0, "model-parallel time terms")
check(j["memory_part"] in (0, 1), f"memory_part {j['memory_part']}")
# Without a grid the new terms are zero.
j = run("--model", "gpt2", "--gpus", "2", "--stage", "1", "--micro-batch", "1", "--ckpt", "off")
check(j["settings"]["data_parallel"] == 2 and j["bubble"] == 0 and j["tp_comm_s"] == 0, "no grid: plain DP")
check(j["tensor_group_optimizer_bytes"] is None, "no grid: no tensor group traffic")

# The optimizer's traffic over the tensor group (GPT-2 small, tensor 2 on one node; rank 1, the
# last of the group). AdamW sends nothing there. Lamb all-gathers ||p||^2 and ||u||^2 of each
# tensor cut by tensor parallelism, two doubles (as four floats) per tensor to its one peer:
# wte's vocabulary rows, and in each of the 12 blocks c_attn's weight and bias, attn.c_proj's
# weight, c_fc's weight and bias and mlp.c_proj's weight: 1 + 12 x 6 = 73 tensors, 73 x 16 bytes.
tp = ["--model", "gpt2", "--gpus", "2", "--tp", "2", "--stage", "1", "--micro-batch", "1", "--ckpt", "off"]
j = run(*tp)
check(j["tensor_group_optimizer_bytes"] == {"rank": 1, "intra_node": 0, "inter_node": 0},
      f"AdamW over the tensor group: {j['tensor_group_optimizer_bytes']}")
with tempfile.TemporaryDirectory() as d:
    lamb = os.path.join(d, "lamb.yaml")
    with open(lamb, "w") as f:
        f.write("optimizer:\n  type: Lamb\n  params:\n    lr: 0.001\n")
    j = run(*tp, "--config", lamb)
    check(j["tensor_group_optimizer_bytes"] == {"rank": 1, "intra_node": 73 * 16, "inter_node": 0},
          f"Lamb over the tensor group: {j['tensor_group_optimizer_bytes']}")
    # Two nodes of one GPU each: rank 0's successor in the tensor ring is on the other node.
    j = run(*tp, "--config", lamb, "--gpus-per-node", "1")
    check(j["tensor_group_optimizer_bytes"] == {"rank": 0, "intra_node": 0, "inter_node": 73 * 16},
          f"Lamb over a tensor group across nodes: {j['tensor_group_optimizer_bytes']}")
    text = subprocess.run([plan, *tp, "--config", lamb], capture_output=True, text=True).stdout
    check("optimizer bytes per step over the tensor group (rank 1): 1.1 KiB inside its node" in text,
          f"the printed tensor group traffic: {text}")

# Across two nodes of 8 at 10 Gbit/s: qgZ, MiCS and PowerSGD are candidates (--qgz any,
# --mics-shard-size any, --powersgd-rank), named in the settings; one of them ranks first.
slow = ["--model", "gpt2-medium", "--gpu", "A100-80GB", "--gpus", "16", "--gpus-per-node", "8", "--inter-gbps",
        "1.25", "--micro-batch", "8", "--ckpt", "off"]
j = run(*slow, "--qgz", "any", "--mics-shard-size", "any", "--powersgd-rank", "0,4", "--powersgd-factor-dtype", "bf16")
check(j["candidates"] == 11, f"stage 0: 2, stages 1-3: 3 each; got {j['candidates']}")
st = j["settings"]
check(st["quantized_gradients"] or st["mics_shard_size"] != -1 or st["powersgd_rank"] > 0, f"plain ranked first: {st}")
# One PowerSGD setting: its rank, factor dtype and compression time in the JSON.
j = run(*slow, "--stage", "0", "--powersgd-rank", "4", "--powersgd-factor-dtype", "bf16")
check(j["settings"]["powersgd_rank"] == 4 and j["settings"]["powersgd_factor_dtype"] == "bf16", f"{j['settings']}")
check(j["compress_s"] > 0, f"compress_s {j['compress_s']}")
j = run(*slow, "--stage", "2", "--qgz", "on")
check(j["settings"]["quantized_gradients"] is True and j["qgz_error_feedback_bytes"] > 0, "qgZ at stage 2")


def fails(*args):
    p = subprocess.run([plan, *args], capture_output=True, text=True)
    return p.returncode, p.stderr


# Invalid grids are errors that say what is wrong.
rc, err = fails("--model", "gpt2", "--gpus", "6", "--tp", "4", "--stage", "1", "--micro-batch", "1", "--ckpt", "off")
check(rc == 2 and "do not divide into tensor 4" in err, f"tp 4 on 6 GPUs: {rc} {err}")
rc, err = fails("--model", "gpt2", "--gpus", "4", "--pp", "2", "--stage", "3", "--micro-batch", "1", "--ckpt", "off")
check(rc == 2 and "refused" in err, f"stage 3 with a pipeline: {rc} {err}")
rc, err = fails("--model", "gpt2", "--gpus", "4", "--tp", "x")
check(rc == 2 and "--tp 'x'" in err, f"--tp x: {rc} {err}")
# What the engine refuses is refused here.
rc, err = fails(*slow, "--stage", "2", "--powersgd-rank", "4")
check(rc == 2 and "stages 0 and 1" in err, f"PowerSGD at stage 2: {rc} {err}")
rc, err = fails(*slow, "--stage", "2", "--qgz", "on", "--mics-shard-size", "8")
check(rc == 2 and "with MiCS" in err, f"qgZ with MiCS: {rc} {err}")
rc, err = fails(*slow, "--stage", "1", "--powersgd-rank", "x")
check(rc == 2 and "--powersgd-rank 'x'" in err, f"--powersgd-rank x: {rc} {err}")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("zero-plan --json: all checks passed")
