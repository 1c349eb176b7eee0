#!/usr/bin/env python3
"""zero-gpt on a simulated cluster (slow_link.sh): steps/s, tokens/s and inter-node bytes per step.

Each row is zero-gpt with its own --set overrides on HOSTS x RANKS ranks, over host links shaped
to --rate. Per row it measures:
  - steps/s and tokens/s over the steady steps (the first step, which records the plan, left out);
  - the same at --fast-rate, and from the two the share of the step spent waiting on the link;
  - inter-node bytes per step on the wire: what all hosts' links sent, from the veth counters,
    between a run of --steps and one of --short-steps (start-up and the final evaluation cancel).
    Not metrics.jsonl's inter_node_bytes: that is rank 0's alone, and with 2 ranks per host rank
    0's ring neighbour shares its host, so it reads 0 while its peers at the node boundary send
    the job's inter-node traffic.
Rows for later features (MiCS, PowerSGD) are more entries in ROWS. The last lines compare plain
stage 3 with ZeRO++ (hpZ+qwZ+qgZ), stage 1 AdamW with 1-bit Adam and stage 1 LAMB with 1-bit
LAMB, where both rows ran:
    slow-link: plain <x> steps/s, zero++ <y> steps/s, speedup <r>x, inter-node bytes/step <a> -> <b>

    stage3_slow_link.py [--zero-gpt build/cpu/examples/gpt/zero-gpt] [--rate 50mbit] [--work DIR] [--rows A,B]

Needs root (network namespaces); exits 77 where slow_link.sh cannot build the cluster.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))

# name, overrides. Stage 3 shards every unit (no persistent parameters), as ZeRO++ is measured.
# Every unit sharded and none kept from the forward for the backward (stage3_max_reuse_distance
# 0), as in a model too large to keep gathered: the backward re-gathers, which hpZ keeps in-node.
STAGE3 = ["zero_optimization.stage=3", "zero_optimization.stage3_param_persistence_threshold=0",
          "zero_optimization.stage3_max_reuse_distance=0"]
ROWS = [
    ("stage 3", STAGE3),
    ("stage 3 hpZ", STAGE3 + ["zero_optimization.zero_hpz_partition_size=2"]),
    ("stage 3 hpZ+qwZ", STAGE3 + ["zero_optimization.zero_hpz_partition_size=2",
                                  "zero_optimization.zero_quantized_weights=true"]),
    ("stage 3 hpZ+qwZ+qgZ", STAGE3 + ["zero_optimization.zero_hpz_partition_size=2",
                                      "zero_optimization.zero_quantized_weights=true",
                                      "zero_optimization.zero_quantized_gradients=true"]),
    # MiCS: states sharded inside each host (2 ranks), replicated across hosts.
    ("stage 3 MiCS", STAGE3 + ["zero_optimization.mics_shard_size=2"]),
    ("stage 0", ["zero_optimization.stage=0"]),
    # PowerSGD rank 2 from step 2 (the --short-steps run cancels the plain steps out of the bytes).
    ("stage 0 PowerSGD", ["zero_optimization.stage=0", "gradient_compression.type=powersgd",
                          "gradient_compression.rank=2", "gradient_compression.start_step=2"]),
    # 1-bit Adam against the exact AdamW at stage 1, compressed from step 3 (the --short-steps
    # run cancels the warm-up steps out of the bytes).
    ("stage 1", ["zero_optimization.stage=1"]),
    ("stage 1 1-bit Adam", ["zero_optimization.stage=1", "optimizer.type=OneBitAdam",
                            "optimizer.params.freeze_step=2"]),
    # 1-bit LAMB against LAMB (without bias correction, its warm-up) at stage 1, the same way.
    ("stage 1 LAMB", ["zero_optimization.stage=1", "optimizer.type=Lamb", "optimizer.params.bias_correction=false"]),
    ("stage 1 1-bit LAMB", ["zero_optimization.stage=1", "optimizer.type=OneBitLamb",
                            "optimizer.params.freeze_step=2"]),
]

PLAIN, ZEROPP = "stage 3", "stage 3 hpZ+qwZ+qgZ"

# The tiny GPT (bytes vocabulary) at a test's size: every run takes seconds on a 2-core machine.
TINY = ["scheduler.params.warmup_num_steps=2", "steps_per_print=1", "model.n_layer=2", "model.n_embd=32",
        "model.n_head=2", "model.seq_len=32", "train_micro_batch_size_per_gpu=2", "run.eval_interval=0",
        "run.eval_sequences=4", "run.sample_tokens=0", "run.peak_tflops=1"]
# The benchmark's model on top: 4 layers of width 64 (0.2M parameters); --set changes it further.
BENCH = ["model.n_layer=4", "model.n_embd=64", "model.n_head=4"]


class Skip(Exception):
    pass


def run_gpt(exe, config, out, sets, steps, hosts, ranks, rate, timeout=150):
    """One zero-gpt job through slow_link.sh. Returns (stdout, metrics records, link bytes sent by all hosts)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    stats = os.path.join(out, "links.txt")
    cmd = [os.path.join(HERE, "slow_link.sh"), "--hosts", str(hosts), "--ranks-per-host", str(ranks), "--rate", rate,
           "--stats", stats, "--", exe, "--config", config, "--set", f"run.steps={steps}",
           "--set", f"run.out_dir={os.path.join(out, 'run')}"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    # Terminated, not killed, on a time-out: slow_link.sh then removes its namespaces.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        text, _ = p.communicate()
        raise RuntimeError(f"{out}: no end after {timeout}s:\n{text}")
    if p.returncode == 77:
        raise Skip(text.strip().splitlines()[-1] if text.strip() else "slow_link.sh skipped")
    if p.returncode != 0:
        raise RuntimeError(f"{out}: failed ({p.returncode}): {' '.join(cmd)}\n{text}")
    recs = [json.loads(line) for line in open(os.path.join(out, "run", "metrics.jsonl"))]
    sent = sum(int(line.split()[1]) for line in open(stats) if line.strip())
    return text, recs, sent


def steady(recs):
    """steps/s and tokens/s over the train records after the first."""
    start = next(r for r in recs if r["type"] == "start")
    train = [r for r in recs if r["type"] == "train"]
    first, last = train[1], train[-1]
    steps_per_s = (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])
    return steps_per_s, steps_per_s * start["tokens_per_step"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zero-gpt", default=os.path.join(SOURCE, "build/cpu/examples/gpt/zero-gpt"))
    ap.add_argument("--config", default=os.path.join(SOURCE, "examples/gpt/configs/tiny.yaml"))
    ap.add_argument("--rate", default="50mbit", help="each host's link (tc units)")
    ap.add_argument("--fast-rate", default="10gbit", help="the reference link, to find the waiting share")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--short-steps", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="a zero-gpt override for every row")
    ap.add_argument("--work", default="/tmp/stage3_slow_link")
    ap.add_argument("--rows", default="", help="comma-separated row names to run (default: every row)")
    a = ap.parse_args()
    rows = [r for r in ROWS if not a.rows or r[0] in a.rows.split(",")]
    sets = TINY + BENCH + a.set
    shape = (a.hosts, a.ranks_per_host)
    print(f"stage3_slow_link: zero-gpt on {a.hosts} hosts x {a.ranks_per_host} ranks, host links {a.rate} "
          f"(reference {a.fast_rate}), {a.steps} steps; overrides: {' '.join(a.set) or 'none'}")
    print(f"{'row':<20} {'steps/s':>8} {'tokens/s':>9} {'steps/s @' + a.fast_rate:>16} {'waiting':>8} "
          f"{'inter-node B/step (wire)':>25}")
    measured = {}  # name: (steps/s, inter-node bytes per step on the wire)
    try:
        for name, row_sets in rows:
            tag = name.replace(" ", "_")
            w = os.path.join(a.work, tag)
            _, recs, sent_long = run_gpt(a.zero_gpt, a.config, w + "_long", sets + row_sets, a.steps, *shape, a.rate)
            _, _, sent_short = run_gpt(a.zero_gpt, a.config, w + "_short", sets + row_sets, a.short_steps, *shape,
                                       a.rate)
            _, fast_recs, _ = run_gpt(a.zero_gpt, a.config, w + "_fast", sets + row_sets, a.steps, *shape, a.fast_rate)
            steps_s, tok_s = steady(recs)
            fast_steps_s, _ = steady(fast_recs)
            wire = (sent_long - sent_short) / (a.steps - a.short_steps)
            measured[name] = (steps_s, wire)
            print(f"{name:<20} {steps_s:8.2f} {tok_s:9.0f} {fast_steps_s:16.2f} {1 - steps_s / fast_steps_s:8.0%} "
                  f"{wire:25.0f}", flush=True)
    except Skip as e:
        print(f"stage3_slow_link: SKIPPED: {e}")
        sys.exit(77)
    for base, better, labels in ((PLAIN, ZEROPP, ("plain", "zero++")),
                                 ("stage 1", "stage 1 1-bit Adam", ("stage 1 AdamW", "1-bit Adam")),
                                 ("stage 1 LAMB", "stage 1 1-bit LAMB", ("stage 1 LAMB", "1-bit LAMB"))):
        if base in measured and better in measured:
            (b, b_bytes), (f, f_bytes) = measured[base], measured[better]
            print(f"slow-link: {labels[0]} {b:.2f} steps/s, {labels[1]} {f:.2f} steps/s, speedup {f / b:.2f}x, "
                  f"inter-node bytes/step {b_bytes:.0f} -> {f_bytes:.0f}")


if __name__ == "__main__":
    main()
