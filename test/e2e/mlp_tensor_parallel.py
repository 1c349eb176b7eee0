#!/usr/bin/env python3
"""The MLP example split over two ranks by tensor parallelism (zero-mlp-tensor-parallel
--tensor-parallel 2: fc1 by columns, fc2 by rows, one all-reduce of the output per micro-batch)
against the smallest loop (zero-mlp) on one rank: the same samples and initial values, so every
step's loss and gradient norm must agree within 1e-4 relative, and the loss must fall.

    mlp_tensor_parallel.py MPIEXEC "FLAGS;..." ZERO_MLP ZERO_MLP_TENSOR_PARALLEL CONFIG
"""
import re
import subprocess
import sys

mpiexec, flags, whole_exe, split_exe, config = sys.argv[1], sys.argv[2].split(";"), *sys.argv[3:6]
steps = 20


def run(exe, ranks, *extra):
    cmd = [mpiexec, *flags, "-n", str(ranks), exe, "--config", config, "--steps", str(steps), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    rows = [(float(l), float(g)) for l, g in re.findall(r"^step\s+\d+\s+loss (\S+)\s+grad_norm (\S+)", out.stdout, re.M)]
    if len(rows) != steps:
        sys.exit(f"{' '.join(cmd)}: {len(rows)} step lines, expected {steps}:\n{out.stdout}")
    return rows, out.stdout


whole, _ = run(whole_exe, 1)
split, text = run(split_exe, 2, "--tensor-parallel", "2")
if "grid TP 2 x DP 1 x PP 1" not in text:
    sys.exit(f"the split run does not report the grid TP 2 x DP 1:\n{text}")
worst = 0.0
for step, ((l1, g1), (l2, g2)) in enumerate(zip(whole, split), 1):
    for what, a, b in (("loss", l1, l2), ("grad_norm", g1, g2)):
        rel = abs(a - b) / abs(a)
        worst = max(worst, rel)
        if rel > 1e-4:
            sys.exit(f"step {step}: {what} {b} on TP 2 differs from {a} on one rank by {rel:.2e} relative (> 1e-4)")
if whole[-1][0] >= whole[0][0]:
    sys.exit(f"the loss did not fall: {whole[0][0]} -> {whole[-1][0]}")
print(f"TP 2 on 2 ranks matches 1 rank over {steps} steps: loss {whole[0][0]:.6e} -> {whole[-1][0]:.6e}, "
      f"largest relative difference {worst:.2e}")
