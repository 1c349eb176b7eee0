#!/usr/bin/env python3
"""GPT-2 training throughput on one GPU: zero-gpt against a PyTorch GPT-2 of the same shape.

Both train the same model (GPT-2 124M by default: 12 layers, 12 heads, width 768, vocabulary
50257 padded to 50304, tied embeddings, T=1024) on the same llm.c token shard, with the same
micro-batch, bf16 compute with fp32 master weights, AdamW, and no gradient accumulation. The
PyTorch side uses torch.compile, F.scaled_dot_product_attention (flash attention) and the fused
AdamW; it is the fast baseline a user would write, not a strawman. Tokens/s is the mean over the
steps after the warm-up, both sides measured in this one run on this one GPU.

FLOPs follow llm.c: 6N + 6*L*T*C per token (attention included), against the peak given by
--peak-tflops (989 for an H100 SXM, dense bf16).

Prints one row:  gpt2-124M | device | libzero tok/s | PyTorch tok/s | ratio
and writes the details (both runs' per-step figures) as JSON to --out/result.json.

Usage (from the build tree's parent, on a machine with a GPU):
  python3 bench/gpt2_vs_pytorch.py --zero-gpt build/release/examples/gpt/zero-gpt
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zero-gpt", required=True, help="the zero-gpt binary (built with CUDA)")
    p.add_argument("--config", default=None,
                   help="zero-gpt config to start from (default: examples/gpt/configs/gpt2-cuda.yaml, "
                        "gpt2.yaml with --backend host)")
    p.add_argument("--shards", default=None,
                   help="glob of llm.c .bin token shards (default: a shard of random tokens)")
    p.add_argument("--batch", type=int, default=16, help="micro-batch (sequences per step)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--steps", type=int, default=30, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation too)")
    p.add_argument("--stage", type=int, default=0, help="zero-gpt's ZeRO stage")
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing on both sides")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--backend", default="cuda", help="zero-gpt's backend (host: a dry run on a CPU)")
    p.add_argument("--vocab", type=int, default=VOCAB, help=argparse.SUPPRESS)
    p.add_argument("--out", default="runs/bench_gpt2")
    p.add_argument("--skip-pytorch", action="store_true")
    p.add_argument("--skip-zero", action="store_true")
    p.add_argument("--zero-timeout", type=float, default=0,
                   help="seconds zero-gpt may run before it is stopped (0: no limit); a failed or "
                        "stopped zero-gpt still leaves the PyTorch side to run and be reported")
    return p.parse_args()


VOCAB, PADDED_VOCAB = 50257, 50304


def n_params(a):
    C, L, T = a.width, a.layers, a.seq
    padded = (a.vocab + 127) // 128 * 128
    per_block = 12 * C * C + 13 * C  # qkv, proj, fc, fc_proj weights and biases, two LayerNorms
    return padded * C + T * C + L * per_block + 2 * C


def flops_per_token(a):
    return 6 * n_params(a) + 6 * a.layers * a.seq * a.width


def random_shard(path, tokens, vocab, seed=1234):
    """An llm.c shard of random token ids below `vocab` (header: magic, version, count)."""
    import array
    import random
    rng = random.Random(seed)
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, tokens
    ids = array.array("H", (rng.randrange(vocab) for _ in range(tokens)))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.tobytes())


def read_shards(pattern, tokens_needed):
    import numpy as np
    out, have = [], 0
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype=np.int32, count=256)
        if header[0] != 20240520:
            sys.exit(f"{path}: not an llm.c shard (magic {header[0]})")
        toks = np.fromfile(path, dtype=np.uint16, offset=1024, count=int(header[2]))
        out.append(toks)
        have += len(toks)
        if have >= tokens_needed:
            break
    if have < tokens_needed:
        sys.exit(f"{pattern}: {have} tokens, the PyTorch run needs {tokens_needed}")
    return np.concatenate(out)[:tokens_needed]


def run_zero_gpt(a, shard_glob):
    out_dir = os.path.join(a.out, "zero-gpt")
    os.makedirs(out_dir, exist_ok=True)
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    default = "gpt2-cuda.yaml" if a.backend == "cuda" else "gpt2.yaml"
    config = a.config or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                      "gpt", "configs", default)
    steps = a.warmup + a.steps
    sets = {
        "backend": a.backend,
        "bf16.enabled": "true",
        "zero_optimization.stage": str(a.stage),
        "train_batch_size": str(a.batch),
        "train_micro_batch_size_per_gpu": str(a.batch),
        "steps_per_print": "1",
        "model.n_layer": str(a.layers),
        "model.n_head": str(a.heads),
        "model.n_embd": str(a.width),
        "model.seq_len": str(a.seq),
        "model.vocab_size": str(a.vocab),
        "model.activation_checkpointing": "true" if a.checkpointing else "false",
        "data.train": shard_glob,
        "data.val": "none",
        "run.steps": str(steps),
        "run.eval_interval": "0",
        "run.sample_tokens": "0",
        "run.save_interval": "0",
        "run.out_dir": out_dir,
        "run.peak_tflops": str(a.peak_tflops),
        "scheduler.params.warmup_num_steps": str(max(1, min(10, steps // 2))),
    }
    cmd = [a.zero_gpt, "--config", config]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, timeout=a.zero_timeout or None)
    wall = time.time() - t0
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    train = [r for r in rows if r.get("type") == "train"]
    timed = [r for r in train if r["step"] > a.warmup]
    if not timed:
        sys.exit(f"zero-gpt wrote no train records after step {a.warmup} to {metrics}")
    tok_s = sum(r["tokens_per_s"] for r in timed) / len(timed)
    return {"tokens_per_s": tok_s, "steps": timed, "wall_s": wall,
            "last_loss": train[-1]["loss"], "mfu": sum(r["mfu"] for r in timed) / len(timed)}


def run_pytorch(a, tokens):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    C, H, L, T = a.width, a.heads, a.layers, a.seq

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.c_fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B_, T_, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B_, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B_, T_, C))
            return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(PADDED_VOCAB, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                if a.checkpointing:
                    x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
                else:
                    x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits[..., :VOCAB].float().view(-1, VOCAB), targets.view(-1))

    model = GPT().to(dev)
    for n_, p_ in model.named_parameters():
        if p_.dim() >= 2:
            nn.init.normal_(p_, std=0.02)
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
    rest = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = torch.compile(model)
    data = torch.from_numpy(tokens.astype("int64"))
    B = a.batch
    per_step = B * T + 1

    def batch(i):
        chunk = data[i * B * T: i * B * T + per_step].to(dev, non_blocking=True)
        return chunk[:-1].view(B, T), chunk[1:].view(B, T)

    times, losses = [], []
    for i in range(a.warmup + a.steps):
        x, y = batch(i)
        torch.cuda.synchronize()
        t0 = time.time()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.time() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt)
        print(f"pytorch step {i + 1}: loss {losses[-1]:.4f} {B * T / dt:,.0f} tok/s", flush=True)
    tok_s = B * T * len(times) / sum(times)
    return {"tokens_per_s": tok_s, "step_s": times, "losses": losses,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(),
            "device": torch.cuda.get_device_name()}


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    need = (a.warmup + a.steps) * a.batch * a.seq + 1
    if a.shards:
        shard_glob = a.shards
    else:
        shard_glob = os.path.join(a.out, "random_tokens.bin")
        if not os.path.exists(shard_glob):
            random_shard(shard_glob, max(need * 2, 1 << 20), a.vocab)
    result = {"args": vars(a), "params": n_params(a), "flops_per_token": flops_per_token(a)}
    failed = []
    # Each side's failure is recorded and the other side still runs: on a machine lent for a few
    # minutes, one side's figure is worth having without the other's.
    if not a.skip_zero:
        try:
            result["libzero"] = run_zero_gpt(a, shard_glob)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, SystemExit, OSError, ValueError) as e:
            why = f"zero-gpt failed: {e}"
            print(why, file=sys.stderr, flush=True)
            result["libzero"] = {"error": why}
            failed.append("libzero")
    if not a.skip_pytorch:
        tokens = read_shards(shard_glob, need)
        try:
            result["pytorch"] = run_pytorch(a, tokens)
        except Exception as e:  # noqa: BLE001 -- any PyTorch failure is reported, not hidden
            why = f"PyTorch failed: {type(e).__name__}: {e}"
            print(why, file=sys.stderr, flush=True)
            result["pytorch"] = {"error": why}
            failed.append("pytorch")
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)

    device = result.get("pytorch", {}).get("device", "cuda device")
    z = result.get("libzero", {}).get("tokens_per_s", float("nan"))
    t = result.get("pytorch", {}).get("tokens_per_s", float("nan"))
    mfu = lambda tok: tok * flops_per_token(a) / (a.peak_tflops * 1e12)
    print(f"\nGPT-2 {n_params(a) / 1e6:.0f}M params, B={a.batch} T={a.seq}, "
          f"FLOPs/token {flops_per_token(a) / 1e9:.3f} G (6N + 6LTC), peak {a.peak_tflops} TFLOP/s")
    print(f"libzero: {z:,.0f} tok/s (MFU {100 * mfu(z):.1f}%)   "
          f"PyTorch: {t:,.0f} tok/s (MFU {100 * mfu(t):.1f}%)")
    ratio = z / t if t and not math.isnan(t) and not math.isnan(z) else float("nan")
    print(f"gpt2-{n_params(a) / 1e6:.0f}M | {device} | {z:,.0f} | {t:,.0f} | {ratio:.2f}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (see above and result.json)")


if __name__ == "__main__":
    main()
