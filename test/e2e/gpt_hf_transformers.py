#!/usr/bin/env python3
"""The exported GPT-2 directory in transformers itself (where transformers and torch import;
otherwise exit 77, which ctest reports as skipped).

GPT2LMHeadModel.from_pretrained must load it with no missing, unexpected or resized tensors,
and its logits over the validation windows zero-gpt evaluated must give zero-gpt's validation
loss (the mean cross-entropy over the same windows), within fp32 summation-order differences.
Reads what gpt_hf.py left in WORKDIR.

    gpt_hf_transformers.py WORKDIR SHAKESPEARE_TXT
"""
import json
import os
import sys

try:
    import torch
    import transformers
except ImportError as e:
    print(f"gpt_hf_transformers: skipped ({e})")
    sys.exit(77)

work, text_path = sys.argv[1:3]
hf = os.path.join(work, "hf")
with open(os.path.join(work, "trained", "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
ev = [r for r in records if r["type"] == "eval"][-1]

model, info = transformers.GPT2LMHeadModel.from_pretrained(hf, output_loading_info=True)
for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
    if info.get(key):
        sys.exit(f"gpt_hf_transformers: FAIL: {key}: {info[key]}")
model.eval()
cfg = model.config
T = cfg.n_positions

# zero-gpt's split: the text's bytes, the last 10% validates; window i is bytes [i*T, i*T + T]
# (inputs, then targets shifted by one), the first val_sequences windows.
with open(text_path, "rb") as f:
    data = f.read()
val = data[len(data) * 9 // 10:]
n = ev["val_sequences"]
x = torch.tensor([list(val[i * T:i * T + T]) for i in range(n)], dtype=torch.long)
y = torch.tensor([list(val[i * T + 1:i * T + T + 1]) for i in range(n)], dtype=torch.long)
with torch.no_grad():
    logits = model(x).logits.double()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
if abs(loss - ev["val_loss"]) > 1e-4 * max(1.0, abs(loss)):
    sys.exit(f"gpt_hf_transformers: FAIL: transformers gives loss {loss}, zero-gpt {ev['val_loss']}")
print(f"gpt_hf_transformers: ok (transformers {loss}, zero-gpt {ev['val_loss']})")
