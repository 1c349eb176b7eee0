#!/usr/bin/env python3
"""Runs the MLP example at ZeRO stages 0-3 on N ranks and checks that every stage prints the
same loss curve to 5 significant digits and that the reported model state shrinks with the stage
as the ZeRO formula says (fp32 here: params 4, grads 4, master 4, moments 8 bytes per element)."""
import re
import subprocess
import sys

mpiexec, flags, ranks, exe, config = sys.argv[1], sys.argv[2].split(";"), int(sys.argv[3]), sys.argv[4], sys.argv[5]

curves, states = {}, {}
for stage in range(4):
    cmd = [mpiexec, *flags, "-n", str(ranks), exe, "--config", config, "--set", f"zero_optimization.stage={stage}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"stage {stage} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    curves[stage] = re.findall(r"^step\s+\d+\s+loss (\S+)", out.stdout, re.M)
    m = re.search(r"model state ([\d.]+) (\w+)", out.stdout)
    if not curves[stage] or not m:
        sys.exit(f"stage {stage}: no loss lines or memory report in:\n{out.stdout}")
    scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[m.group(2)]
    states[stage] = float(m.group(1)) * scale
    print(f"stage {stage}: final loss {curves[stage][-1]}, model state {m.group(1)} {m.group(2)}")

for stage in range(1, 4):
    for step, (a, b) in enumerate(zip(curves[0], curves[stage]), 1):
        if f"{float(a):.4e}" != f"{float(b):.4e}":
            sys.exit(f"stage {stage} step {step}: loss {b} differs from stage 0's {a} in 5 significant digits")
    if len(curves[stage]) != len(curves[0]):
        sys.exit(f"stage {stage}: {len(curves[stage])} steps, stage 0 printed {len(curves[0])}")

if float(curves[0][-1]) >= float(curves[0][0]):
    sys.exit(f"the loss did not fall: {curves[0][0]} -> {curves[0][-1]}")
# Saving per stage, in units of the padded Ψ: 20Ψ, 8Ψ + 12Ψ/N, 4Ψ + 16Ψ/N... (fp32 compute:
# params and grads take 4 bytes each). Check the ratios the formula predicts, to the report's rounding.
n = ranks
expect = {0: 20, 1: 8 + 12 / n, 2: 4 + 16 / n, 3: 20 / n}
for stage in range(1, 4):
    want = expect[stage] / expect[0]
    got = states[stage] / states[0]
    if abs(got - want) > 0.01:
        sys.exit(f"stage {stage}: model state ratio to stage 0 is {got:.3f}, the ZeRO formula gives {want:.3f}")
print(f"all stages print the same loss curve ({len(curves[0])} steps); memory ratios match the formula")
