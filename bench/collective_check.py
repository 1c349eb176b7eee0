#!/usr/bin/env python3
"""Cost of the collective check (zero/comm.hpp) on the host GPT trainer.

Trains the tiny GPT at ZeRO stage 3 with every unit sharded (the most collectives per step:
a gather per unit forward and backward, a reduce-scatter per bucket) on 2 ranks, alternating
runs with the check on and off (ZERO_COLLECTIVE_CHECK=0), and compares the median training
throughput. Prints the collectives per step the check agreed on, and the overhead per step.

    collective_check.py ZERO_GPT [--ranks 2] [--steps 120] [--reps 3] [--mpiexec mpiexec]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("zero_gpt")
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--steps", type=int, default=120)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--mpiexec", default="mpiexec")
ap.add_argument("--stage", type=int, default=3)
a = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
config = os.path.join(here, "..", "examples", "gpt", "configs", "tiny.yaml")
flags = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
         "--mca", "btl_vader_single_copy_mechanism", "none"]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1")


def run(check_on):
    with tempfile.TemporaryDirectory() as out:
        e = dict(env, ZERO_COLLECTIVE_CHECK="1" if check_on else "0")
        cmd = [a.mpiexec, *flags, "-n", str(a.ranks), a.zero_gpt, "--config", config,
               "--set", f"zero_optimization.stage={a.stage}",
               "--set", "zero_optimization.stage3_param_persistence_threshold=0",
               "--set", f"run.steps={a.steps}", "--set", "run.eval_interval=0", "--set", "run.eval_sequences=1",
               "--set", "run.sample_tokens=0", "--set", "steps_per_print=10", "--set", f"run.out_dir={out}"]
        p = subprocess.run(cmd, env=e, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"zero-gpt failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        train = [r for r in recs if r.get("type") == "train"]
        # Steps after the first print: start-up and the first steps' allocation excluded.
        first, last = train[0], train[-1]
        return (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])


on, off = [], []
for rep in range(a.reps):
    off.append(run(False))
    on.append(run(True))
    print(f"rep {rep + 1}: check on {on[-1]:.2f} steps/s, off {off[-1]:.2f} steps/s", flush=True)
m_on, m_off = statistics.median(on), statistics.median(off)
overhead = (1.0 / m_on - 1.0 / m_off) / (1.0 / m_off) * 100.0
print(f"collective check ({a.ranks} ranks, stage {a.stage}, tiny GPT): on {m_on:.2f} steps/s, off {m_off:.2f} steps/s, "
      f"step time {1000 / m_on:.2f} ms vs {1000 / m_off:.2f} ms, overhead {overhead:+.2f}% (goal: at most 1%)")
