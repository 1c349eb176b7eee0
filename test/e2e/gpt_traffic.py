#!/usr/bin/env python3
"""Traffic counters of a 2-rank zero-gpt run: metrics.jsonl's intra_node_bytes / inter_node_bytes.

Two ranks as one node (ZERO_RANKS_PER_NODE=2) and as two nodes of one rank (=1): the same bytes
per step, all inside the node in the first, all across nodes in the second. Across the stages,
the known ZeRO volumes per step: stages 1 and 2 move what plain data parallelism moves (a
reduce-scatter and an all-gather instead of an all-reduce), up to the few scalar all-reduces;
stage 3 with every unit sharded adds the backward's all-gathers: up to 1.5 times, less the units
the backward uses right after the forward (stage3_max_reuse_distance 0 keeps only those; here the
embeddings, whose tied weights make the logits at the end of the forward and start the
backward: about a quarter of the tiny model's parameters).
The start-up report names the node layout.

    gpt_traffic.py MPIEXEC "FLAGS;..." ZERO_GPT CONFIG WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

mpiexec, flags, exe, config, work = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4], sys.argv[5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def run(name, stage, per_node):
    out = os.path.join(work, name)
    cmd = [mpiexec, *flags, "-n", "2", exe, "--config", config, "--set", "run.steps=4", "--set", "scheduler.params.warmup_num_steps=2", "--set", "steps_per_print=1",
           "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
           "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2", "--set", "run.eval_interval=0",
           "--set", "run.eval_sequences=4", "--set", "run.sample_tokens=0", "--set", "run.peak_tflops=1",
           "--set", f"zero_optimization.stage={stage}",
           "--set", "zero_optimization.stage3_param_persistence_threshold=0",
           "--set", "zero_optimization.stage3_max_reuse_distance=0", "--set", f"run.out_dir={out}"]
    p = subprocess.run(cmd, env=dict(os.environ, ZERO_RANKS_PER_NODE=str(per_node)), capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        sys.exit(f"{name}: zero-gpt failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in recs if r["type"] == "train"]
    return p.stdout, [(r["intra_node_bytes"], r["inter_node_bytes"]) for r in train[1:]]  # steady steps


def check(ok, what):
    if not ok:
        failures.append(what)


out1, one_node = run("s2_one_node", 2, 2)
out2, two_nodes = run("s2_two_nodes", 2, 1)
print("stage 2, bytes per step (intra, inter): one node", one_node[0], "two nodes", two_nodes[0])
check("nodes: 1 nodes x 2 ranks (simulated: ZERO_RANKS_PER_NODE)" in out1, "the report does not name one node")
check("nodes: 2 nodes x 1 ranks (simulated: ZERO_RANKS_PER_NODE)" in out2, "the report does not name two nodes")
check(all(i > 0 and x == 0 for i, x in one_node), f"one node: inter-node bytes or no bytes: {one_node}")
check(all(i == 0 and x > 0 for i, x in two_nodes), f"two nodes: intra-node bytes or no bytes: {two_nodes}")
check([i for i, _ in one_node] == [x for _, x in two_nodes], "the node layout changed the bytes sent")
check(len(set(one_node)) == 1, f"steady steps differ: {one_node}")

total = {}
for stage in (0, 1, 2, 3):
    _, b = run(f"s{stage}", stage, 1)
    total[stage] = b[0][1]
print("inter-node bytes per step by stage:", total)
for stage in (1, 2):
    check(abs(total[stage] / total[0] - 1.0) < 0.01, f"stage {stage} moves {total[stage]} bytes, stage 0 {total[0]}")
check(1.25 < total[3] / total[2] < 1.5, f"stage 3 / stage 2 = {total[3] / total[2]:.4f}, expected in (1.25, 1.5)")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
