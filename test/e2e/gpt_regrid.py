#!/usr/bin/env python3
"""zero-gpt resumed on other tensor x pipeline grids than the one it saved on.

The tiny GPT (2 layers, 4 heads) trains at TP 2 x PP 2 x DP 1 on 4 ranks, stage 1, and saves at
step 10 of 15; an uninterrupted run goes on to 15. The checkpoint resumes on 4 ranks at
TP 1 x PP 1 x DP 4, TP 1 x PP 2 x DP 2, TP 2 x PP 1 x DP 2 and TP 4 x PP 1 x DP 1, at ZeRO
stages 1 and 3 (the trainer runs pipelines at stages 0-1 only, so PP 2 at stage 1):
- step 11's loss, a forward pass over the resume point's weights, is the uninterrupted run's
  within 1e-6 relative, so every grid holds the same model;
- steps 12-15 stay within 1e-4 of it (another grid sums in another order);
- at stage 1, `zero-ckpt reshard --tp --pp` rewrites the checkpoint for the grid: its whole model
  (exported to safetensors) is the saved one's byte for byte, and a plain resume from the rewrite
  logs the direct resume's losses exactly (the optimizer state's equality bit for bit at every
  grid and stage: test_checkpoint_regrid);
- --dry-run says what the load would cut anew and writes nothing; with another n_embd it is
  refused naming a parameter and both grids;
- a llama with one key/value head saved at TP 2 (its attention projections replicated) resumes at
  TP 1 and TP 4 within the same bounds.

    gpt_regrid.py MPIEXEC "FLAGS;..." ZERO_GPT ZERO_CKPT CONFIG WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

mpiexec, flags, exe, ckpt_tool, config, work = (sys.argv[1], sys.argv[2].split(";"), *sys.argv[3:7])
STEPS, K = 15, 10
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def fail(msg):
    sys.exit("gpt_regrid: FAIL: " + msg)


def run(out_dir, tp, pp, stage, steps, *extra, expect_ok=True):
    cmd = [mpiexec, *flags, "-n", "4", exe, "--config", config,
           "--set", f"run.steps={steps}", "--set", "steps_per_print=1",
           "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=4",
           "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "train_batch_size=8", "--set", "gradient_accumulation_steps=auto",
           "--set", f"model.tensor_parallel={tp}", "--set", f"model.pipeline_parallel={pp}",
           "--set", f"zero_optimization.stage={stage}",
           "--set", "scheduler.params.warmup_num_steps=2", "--set", f"scheduler.params.total_num_steps={STEPS}",
           "--set", "run.eval_interval=0", "--set", "run.sample_tokens=0", "--set", "run.peak_tflops=1",
           "--set", "run.keep_checkpoints=0", "--set", f"run.save_interval={K}",
           "--set", f"run.out_dir={out_dir}", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if expect_ok and out.returncode != 0:
        fail(f"{' '.join(cmd[len(flags) + 3:])} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if r["type"] == "train"}


saved = os.path.join(work, "tp2_pp2")
run(saved, 2, 2, 1, K)
step_k = os.path.join(saved, "checkpoints", f"step_{K:08d}")
if not os.path.isdir(step_k):
    fail(f"the TP 2 x PP 2 run saved no {step_k}")
full = os.path.join(work, "uninterrupted")
run(full, 2, 2, 1, STEPS)
ref = losses(full)

# --dry-run: the library's account of the load, nothing written; another model is refused.
dry = os.path.join(work, "dry")
out = run(dry, 1, 1, 3, STEPS, "--resume-from", step_k, "--dry-run")
text = out.stdout + out.stderr
for want in ("(dry run, nothing is loaded)", "saved on the grid TP 2 x PP 2 x DP 1 at stage 1", "this job runs TP 1 x PP 1 x DP 4 at stage 3",
             "parameters (", "are cut anew across the tensor group, with their AdamW state (2 moment(s))",
             "nothing was trained or written"):
    if want not in text:
        fail(f"--dry-run did not say '{want}':\n{text}")
if os.path.exists(dry):
    fail(f"--dry-run created its run directory {dry}")
out = run(dry, 1, 1, 3, STEPS, "--resume-from", step_k, "--dry-run", "--set", "model.n_embd=64", expect_ok=False)
text = out.stdout + out.stderr
if out.returncode == 0 or "as a whole tensor" not in text or "this job's model (TP 1 x PP 1 x DP 4)" not in text:
    fail(f"--dry-run with model.n_embd=64 was not refused naming a parameter and the grid ({out.returncode}):\n{text}")

rows = []
for tp, pp in ((1, 1), (1, 2), (2, 1), (4, 1)):
    for stage in ((1,) if pp > 1 else (1, 3)):
        name = f"tp{tp}_pp{pp}_stage{stage}"
        out_dir = os.path.join(work, name)
        out = run(out_dir, tp, pp, stage, STEPS, "--resume-from", step_k)
        text = out.stdout + out.stderr
        if f"this job runs TP {tp} x PP {pp} x DP {4 // (tp * pp)}" not in text:
            fail(f"{name}: the resume did not say it cuts the TP 2 x PP 2 checkpoint anew:\n{text}")
        got = losses(out_dir)
        if sorted(got) != list(range(K + 1, STEPS + 1)):
            fail(f"{name}: the resumed run logged steps {sorted(got)}")
        first = abs(got[K + 1] - ref[K + 1]) / abs(ref[K + 1])
        if first > 1e-6:
            fail(f"{name}: step {K + 1} loss {got[K + 1]!r}, the uninterrupted TP 2 x PP 2 run's {ref[K + 1]!r}")
        later = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
        if later > 1e-4:
            fail(f"{name}: losses {got} drift from the uninterrupted run's {ref} ({later:.1e})")
        row = f"{name}: step {K + 1} {first:.1e}, later {later:.1e}"
        if stage == 1:
            # The offline rewrite for this grid, then a plain resume: the same losses.
            offline = os.path.join(work, name + "_rewritten")
            r = subprocess.run([ckpt_tool, "reshard", step_k, "--tp", str(tp), "--pp", str(pp),
                                "--world", str(4 // (tp * pp)), "-o", offline],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                fail(f"zero-ckpt reshard --tp {tp} --pp {pp} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
            # The rewrite holds the saved whole model bit for bit (its master weights, exported).
            exported = []
            for src, tag in ((step_k, "saved"), (offline, "rewritten")):
                dst = os.path.join(work, f"{name}_{tag}.safetensors")
                r = subprocess.run([ckpt_tool, "export", src, "--format", "safetensors", "-o", dst],
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    fail(f"zero-ckpt export of {src} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
                with open(dst, "rb") as f:
                    exported.append(f.read())
            if exported[0] != exported[1]:
                fail(f"{name}: the rewritten checkpoint's whole model differs from the saved one's")
            again = os.path.join(work, name + "_plain")
            out = run(again, tp, pp, stage, STEPS, "--resume-from", os.path.join(offline, f"step_{K:08d}"))
            if "cut anew" in out.stdout + out.stderr:
                fail(f"{name}: the resume from the rewritten checkpoint was not a plain one:\n{out.stdout}")
            if losses(again) != got:
                fail(f"{name}: resumed from the rewrite {losses(again)}, directly {got}")
            row += ", rewritten by zero-ckpt reshard: same model bytes, identical losses"
        rows.append(row)

print("TP 2 x PP 2 checkpoint resumed, relative loss differences from the uninterrupted run: " + "; ".join(rows))

# A llama with one key/value head saved at TP 2 x PP 1 x DP 2, where its attention projections are
# replicated on the tensor group (the key/value head on both ranks), resumed at TP 1, where they
# are whole, and at TP 4, where they are replicated over 4.
LLAMA = ("--set", "model.preset=llama-tiny", "--set", "model.n_kv_head=1", "--set", "model.ffn_hidden=48")
kv_saved = os.path.join(work, "llama_kv1_tp2")
run(kv_saved, 2, 1, 1, K, *LLAMA)
kv_full = os.path.join(work, "llama_kv1_uninterrupted")
run(kv_full, 2, 1, 1, STEPS, *LLAMA)
kv_ref = losses(kv_full)
kv_rows = []
for tp in (1, 4):
    out_dir = os.path.join(work, f"llama_kv1_tp{tp}")
    run(out_dir, tp, 1, 1, STEPS, "--resume-from", os.path.join(kv_saved, "checkpoints", f"step_{K:08d}"), *LLAMA)
    got = losses(out_dir)
    first = abs(got[K + 1] - kv_ref[K + 1]) / abs(kv_ref[K + 1])
    later = max(abs(got[s] - kv_ref[s]) / abs(kv_ref[s]) for s in got)
    if sorted(got) != list(range(K + 1, STEPS + 1)) or first > 1e-6 or later > 1e-4:
        fail(f"llama, 1 key/value head, TP 2 resumed at TP {tp}: {got} against the uninterrupted {kv_ref}")
    kv_rows.append(f"TP {tp}: step {K + 1} {first:.1e}, later {later:.1e}")
print("llama with one key/value head, saved at TP 2 (replicated attention): " + "; ".join(kv_rows))
