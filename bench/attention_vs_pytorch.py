#!/usr/bin/env python3
"""Causal attention on one GPU: libzero's GPT kernels against PyTorch's flash attention.

Runs bench_gpt_attention (our forward and backward, bf16, qkv packed as the trainer holds it)
and F.scaled_dot_product_attention(is_causal=True) restricted to the flash backend on the same
shapes, in this one run on this one GPU. Both are timed with CUDA events over the same number of
calls after the same warm-up, and counted with FlashAttention's FLOPs (causal forward
4 B NH T^2 hs / 2, backward 2.5 times that), so the ratio is a ratio of times.

Prints one row per shape:  B,T,NH,hs | ours fwd/bwd TF/s | PyTorch fwd/bwd TF/s | ratios
and writes both sides' milliseconds as JSON to --out.

Usage (on a machine with a GPU and PyTorch):
  python3 bench/attention_vs_pytorch.py --bench build/release/bench/bench_gpt_attention
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

DEFAULT_SHAPES = ["16,1024,12,64", "8,1024,25,64", "8,2048,16,128"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", required=True, help="the bench_gpt_attention binary")
    p.add_argument("--shape", action="append", help="B,T,NH,hs (repeatable; default: %s)" % DEFAULT_SHAPES)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--out", default="runs/bench_attention/result.json")
    return p.parse_args()


def forward_flops(B, T, NH, hs):
    return 4.0 * B * NH * T * T * hs / 2.0


def time_ms(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters


def pytorch_side(shapes, warmup, iters):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for B, T, NH, hs in shapes:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd = time_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), warmup, iters)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            bwd = time_ms(torch, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup, iters)
        rows.append({"B": B, "T": T, "NH": NH, "hs": hs, "fwd_ms": fwd, "bwd_ms": bwd})
    return rows


def main():
    a = parse_args()
    texts = a.shape or DEFAULT_SHAPES
    shapes = [tuple(int(x) for x in t.split(",")) for t in texts]
    with tempfile.TemporaryDirectory() as tmp:
        ours_json = os.path.join(tmp, "ours.json")
        cmd = [a.bench, "--warmup", str(a.warmup), "--iters", str(a.iters), "--peak-tflops", str(a.peak_tflops),
               "--json", ours_json] + [arg for t in texts for arg in ("--shape", t)]
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print("attention_vs_pytorch: %s exited %d" % (a.bench, rc), file=sys.stderr)
            return rc
        with open(ours_json) as f:
            ours = json.load(f)
    try:
        theirs = pytorch_side(shapes, a.warmup, a.iters)
    except ImportError as e:
        print("attention_vs_pytorch: PyTorch is not importable (%s); only our side ran" % e, file=sys.stderr)
        return 77

    print("%-16s | %-21s | %-21s | %s" % ("B,T,NH,hs", "ours fwd/bwd TF/s", "PyTorch fwd/bwd TF/s", "ours/PyTorch"))
    for o, t in zip(ours, theirs):
        f = forward_flops(o["B"], o["T"], o["NH"], o["hs"])
        tf = lambda ms, mult: mult * f / (ms * 1e9)
        print("%-16s | %9.1f / %9.1f | %9.1f / %9.1f | fwd %.2fx, bwd %.2fx" % (
            "%d,%d,%d,%d" % (o["B"], o["T"], o["NH"], o["hs"]), tf(o["fwd_ms"], 1), tf(o["bwd_ms"], 2.5),
            tf(t["fwd_ms"], 1), tf(t["bwd_ms"], 2.5), t["fwd_ms"] / o["fwd_ms"], t["bwd_ms"] / o["bwd_ms"]))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"ours": ours, "pytorch": theirs, "peak_tflops": a.peak_tflops}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
