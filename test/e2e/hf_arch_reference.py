"""Tiny Llama and BLOOM models in Hugging Face's layout, written and evaluated with numpy only.

The forward passes follow Hugging Face's LlamaForCausalLM and BloomForCausalLM equations (names,
[out, in] nn.Linear weights, BLOOM's per-head interleaved query_key_value, rotate_half rotary
positions, ALiBi slopes of build_alibi_tensor), in float64. Used by gpt_hf_arch.py and
gpt_hf_arch_transformers.py; nothing here knows the trainer's layout except hf_to_trainer(),
which restates the documented correspondence (docs/architecture.md, note hf-interchange).
"""
import json
import math
import os
import struct
import subprocess

import numpy as np

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


# ---------------------------------------------------------------- safetensors

def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, rounded to nearest even."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: name -> float32 array. Returns the values as stored (bf16-rounded for BF16)."""
    header, blobs, stored, offset = {}, [], {}, 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "BF16":
            bits = to_bf16_bits(a)
            blob, stored[name] = bits.tobytes(), from_bf16_bits(bits).reshape(a.shape)
        else:
            blob, stored[name] = a.tobytes(), a
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    return stored


def read_safetensors(path):
    """name -> float32 array (bf16 widened exactly)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        entries = json.loads(f.read(size))
        blob = f.read()
    entries.pop("__metadata__", None)
    out = {}
    for name, t in entries.items():
        begin, end = t["data_offsets"]
        a = np.frombuffer(blob[begin:end], dtype=DTYPES[t["dtype"]][0])
        out[name] = (from_bf16_bits(a) if t["dtype"] == "BF16" else a.astype(np.float32)).reshape(t["shape"])
    return out


def read_hf_dir(path):
    """Every tensor of a Hugging Face directory, single file or shards."""
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as f:
        index = json.load(f)
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        part = read_safetensors(os.path.join(path, file))
        for name in part:
            assert index["weight_map"][name] == file, (name, file)
        out.update(part)
    assert set(out) == set(index["weight_map"]), "index and shards disagree"
    return out


# ---------------------------------------------------------------- tiny models

LLAMA = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 200, "rms_norm_eps": 1e-6, "rope_theta": 500.0,
         "tie_word_embeddings": False, "max_position_embeddings": 32}
BLOOM = {"hidden_size": 48, "n_layer": 2, "n_head": 6, "vocab_size": 130, "layer_norm_epsilon": 1e-5}


def llama_config(**over):
    c = dict(LLAMA, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
             attention_bias=False, mlp_bias=False, rope_scaling=None, torch_dtype="float32")
    c.update(over)
    return c


def bloom_config(**over):
    c = dict(BLOOM, architectures=["BloomForCausalLM"], model_type="bloom",
             apply_residual_connection_post_layernorm=False, tie_word_embeddings=True, torch_dtype="bfloat16")
    c.update(over)
    return c


def random_llama(rng, c):
    C, F, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    NH, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hs = C // NH
    n = lambda *s, std=0.3: (rng.standard_normal(s) * std).astype(np.float32)
    w = {"model.embed_tokens.weight": n(V, C, std=1.0), "model.norm.weight": 1 + n(C, std=0.1),
         "lm_head.weight": n(V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + n(C, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + n(C, std=0.1)
        w[p + "self_attn.q_proj.weight"] = n(NH * hs, C)
        w[p + "self_attn.k_proj.weight"] = n(KV * hs, C)
        w[p + "self_attn.v_proj.weight"] = n(KV * hs, C)
        w[p + "self_attn.o_proj.weight"] = n(C, NH * hs, std=0.2)
        w[p + "mlp.gate_proj.weight"] = n(F, C)
        w[p + "mlp.up_proj.weight"] = n(F, C)
        w[p + "mlp.down_proj.weight"] = n(C, F, std=0.2)
    return w


def random_bloom(rng, c):
    C, L, V = c["hidden_size"], c["n_layer"], c["vocab_size"]
    n = lambda *s, std=0.3: (rng.standard_normal(s) * std).astype(np.float32)
    w = {"transformer.word_embeddings.weight": n(V, C, std=1.0),
         "transformer.word_embeddings_layernorm.weight": 1 + n(C, std=0.1),
         "transformer.word_embeddings_layernorm.bias": n(C, std=0.1),
         "transformer.ln_f.weight": 1 + n(C, std=0.1), "transformer.ln_f.bias": n(C, std=0.1)}
    for i in range(L):
        p = f"transformer.h.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w[p + norm + ".weight"] = 1 + n(C, std=0.1)
            w[p + norm + ".bias"] = n(C, std=0.1)
        w[p + "self_attention.query_key_value.weight"] = n(3 * C, C)
        w[p + "self_attention.query_key_value.bias"] = n(3 * C, std=0.1)
        w[p + "self_attention.dense.weight"] = n(C, C, std=0.2)
        w[p + "self_attention.dense.bias"] = n(C, std=0.1)
        w[p + "mlp.dense_h_to_4h.weight"] = n(4 * C, C)
        w[p + "mlp.dense_h_to_4h.bias"] = n(4 * C, std=0.1)
        w[p + "mlp.dense_4h_to_h.weight"] = n(C, 4 * C, std=0.2)
        w[p + "mlp.dense_4h_to_h.bias"] = n(C, std=0.1)
    return w


def write_hf_dir(path, config, weights, dtype="F32", shards=1):
    """config.json and the weights, in `shards` files with an index when more than one."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    names = list(weights)
    if shards == 1:
        return write_safetensors(os.path.join(path, "model.safetensors"), weights, dtype)
    stored, weight_map, per = {}, {}, math.ceil(len(names) / shards)
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: weights[k] for k in names[s * per:(s + 1) * per]}
        stored.update(write_safetensors(os.path.join(path, file), part, dtype))
        weight_map.update({k: file for k in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
    return stored


# ---------------------------------------------------------------- forward passes (float64)

def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def causal_attention(q, k, v, bias=None):
    """q [NH, T, hs], k and v [NH, T, hs] (already repeated per query head) -> [T, NH * hs]."""
    NH, T, hs = q.shape
    s = q @ k.transpose(0, 2, 1) / math.sqrt(hs)
    if bias is not None:
        s = s + bias
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    return (softmax_rows(s) @ v).transpose(1, 0, 2).reshape(T, NH * hs)


def llama_logits(c, w, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    C, NH, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hs, T, eps, theta = C // NH, len(ids), c["rms_norm_eps"], c["rope_theta"]
    rms = lambda x, g: g * (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))
    inv_freq = 1.0 / theta ** (np.arange(0, hs, 2) / hs)
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = lambda x: x * cos + np.concatenate([-x[..., hs // 2:], x[..., :hs // 2]], -1) * sin
    h = W["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, W[p + "input_layernorm.weight"])
        q = rot((x @ W[p + "self_attn.q_proj.weight"].T).reshape(T, NH, hs).transpose(1, 0, 2))
        k = rot((x @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hs).transpose(1, 0, 2))
        v = (x @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hs).transpose(1, 0, 2)
        G = NH // KV  # repeat_kv: query head j reads key/value head j // G
        a = causal_attention(q, np.repeat(k, G, axis=0), np.repeat(v, G, axis=0))
        h = h + a @ W[p + "self_attn.o_proj.weight"].T
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        g = x @ W[p + "mlp.gate_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * (x @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return rms(h, W["model.norm.weight"]) @ head.T


def alibi_slopes(n):
    m = 2 ** math.floor(math.log2(n))
    base = 2 ** (-(2 ** -(math.log2(m) - 3)))
    slopes = [base ** p for p in range(1, m + 1)]
    if m != n:
        extra = 2 ** (-(2 ** -(math.log2(2 * m) - 3)))
        slopes += [extra ** p for p in range(1, 2 * min(m, n - m) + 1, 2)]
    return np.array(slopes)


def bloom_logits(c, w, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    C, NH, T, eps = c["hidden_size"], c["n_head"], len(ids), c["layer_norm_epsilon"]
    hs = C // NH

    def ln(x, p):
        m = x.mean(axis=-1, keepdims=True)
        var = ((x - m) ** 2).mean(axis=-1, keepdims=True)
        return (x - m) / np.sqrt(var + eps) * W[p + ".weight"] + W[p + ".bias"]

    gelu = lambda x: x * 0.5 * (1.0 + np.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    alibi = alibi_slopes(NH)[:, None, None] * np.arange(T)[None, None, :]  # by key position
    h = ln(W["transformer.word_embeddings.weight"][ids], "transformer.word_embeddings_layernorm")
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}."
        x = ln(h, p + "input_layernorm")
        fused = (x @ W[p + "self_attention.query_key_value.weight"].T + W[p + "self_attention.query_key_value.bias"])
        fused = fused.reshape(T, NH, 3, hs)
        q, k, v = (fused[:, :, j, :].transpose(1, 0, 2) for j in range(3))
        a = causal_attention(q, k, v, alibi)
        h = h + a @ W[p + "self_attention.dense.weight"].T + W[p + "self_attention.dense.bias"]
        x = ln(h, p + "post_attention_layernorm")
        m = gelu(x @ W[p + "mlp.dense_h_to_4h.weight"].T + W[p + "mlp.dense_h_to_4h.bias"])
        h = h + m @ W[p + "mlp.dense_4h_to_h.weight"].T + W[p + "mlp.dense_4h_to_h.bias"]
    return ln(h, "transformer.ln_f") @ W["transformer.word_embeddings.weight"].T


def mean_loss(logits_fn, c, w, windows):
    total, count = 0.0, 0
    for x, y in windows:
        z = logits_fn(c, w, np.array(x))
        z = z - z.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=-1))
        total += float((lse - z[np.arange(len(y)), y]).sum())
        count += len(y)
    return total / count


# ---------------------------------------------------------------- the trainer's side

def hf_to_trainer(arch, c, w):
    """The documented correspondence: HF tensors -> the trainer's names and [in, out] layout
    (padding rows excluded)."""
    out = {}
    if arch == "llama":
        C, NH, KV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        hs, G = C // NH, NH // KV
        # stored q head j = r KV + g is HF head g G + r
        order = [(j % KV) * G + j // KV for j in range(NH)]
        rows = np.concatenate([np.arange(hf * hs, hf * hs + hs) for hf in order])
        out["wte.weight"] = w["model.embed_tokens.weight"]
        for i in range(c["num_hidden_layers"]):
            p, m = f"h.{i}.", f"model.layers.{i}."
            out[p + "ln_1.weight"] = w[m + "input_layernorm.weight"]
            out[p + "ln_2.weight"] = w[m + "post_attention_layernorm.weight"]
            q = w[m + "self_attn.q_proj.weight"][rows]
            out[p + "attn.c_attn.weight"] = np.concatenate(
                [q, w[m + "self_attn.k_proj.weight"], w[m + "self_attn.v_proj.weight"]]).T
            out[p + "attn.c_proj.weight"] = w[m + "self_attn.o_proj.weight"][:, rows].T
            out[p + "mlp.c_fc.weight"] = np.concatenate([w[m + "mlp.gate_proj.weight"],
                                                         w[m + "mlp.up_proj.weight"]]).T
            out[p + "mlp.c_proj.weight"] = w[m + "mlp.down_proj.weight"].T
        out["ln_f.weight"] = w["model.norm.weight"]
        if not c["tie_word_embeddings"]:
            out["lm_head.weight"] = w["lm_head.weight"]
    else:
        C, NH = c["hidden_size"], c["n_head"]
        hs = C // NH
        t = "transformer."
        out["wte.weight"] = w[t + "word_embeddings.weight"]
        out["ln_e.weight"] = w[t + "word_embeddings_layernorm.weight"]
        out["ln_e.bias"] = w[t + "word_embeddings_layernorm.bias"]
        for i in range(c["n_layer"]):
            p, m = f"h.{i}.", f"{t}h.{i}."
            for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
                out[p + ours + ".weight"] = w[m + theirs + ".weight"]
                out[p + ours + ".bias"] = w[m + theirs + ".bias"]
            qkv = w[m + "self_attention.query_key_value.weight"].reshape(NH, 3, hs, C)
            out[p + "attn.c_attn.weight"] = np.concatenate([qkv[:, j].reshape(C, C) for j in range(3)]).T
            b = w[m + "self_attention.query_key_value.bias"].reshape(NH, 3, hs)
            out[p + "attn.c_attn.bias"] = np.concatenate([b[:, j].reshape(C) for j in range(3)])
            out[p + "attn.c_proj.weight"] = w[m + "self_attention.dense.weight"].T
            out[p + "attn.c_proj.bias"] = w[m + "self_attention.dense.bias"]
            out[p + "mlp.c_fc.weight"] = w[m + "mlp.dense_h_to_4h.weight"].T
            out[p + "mlp.c_fc.bias"] = w[m + "mlp.dense_h_to_4h.bias"]
            out[p + "mlp.c_proj.weight"] = w[m + "mlp.dense_4h_to_h.weight"].T
            out[p + "mlp.c_proj.bias"] = w[m + "mlp.dense_4h_to_h.bias"]
        out["ln_f.weight"] = w[t + "ln_f.weight"]
        out["ln_f.bias"] = w[t + "ln_f.bias"]
    return out


def model_keys(arch, c, seq_len):
    """zero-gpt --set arguments for the model of config `c`."""
    if arch == "llama":
        keys = {"arch": "llama", "n_layer": c["num_hidden_layers"], "n_head": c["num_attention_heads"],
                "n_kv_head": c["num_key_value_heads"], "n_embd": c["hidden_size"],
                "ffn_hidden": c["intermediate_size"], "norm_eps": c["rms_norm_eps"], "rope_theta": c["rope_theta"],
                "tie_word_embeddings": str(c["tie_word_embeddings"]).lower()}
    else:
        keys = {"arch": "bloom", "n_layer": c["n_layer"], "n_head": c["n_head"], "n_embd": c["hidden_size"],
                "ffn_hidden": 0, "n_kv_head": 0, "tie_word_embeddings": "true"}
    keys.update(seq_len=seq_len, vocab_size=c["vocab_size"])
    return [f"model.{k}={v}" for k, v in keys.items()]


def val_windows(text_path, seq_len, n):
    """zero-gpt's validation windows over a text file's bytes: the last 10%, window i is
    [i T, i T + T] with targets shifted by one."""
    with open(text_path, "rb") as f:
        data = f.read()
    val = data[len(data) * 9 // 10:]
    return [(list(val[i * seq_len:i * seq_len + seq_len]), list(val[i * seq_len + 1:i * seq_len + seq_len + 1]))
            for i in range(n)]


def zero_gpt(exe, config, run_dir, settings, timeout=240):
    cmd = [exe, "--config", config, "--set", "run.sample_tokens=0", "--set", "train_micro_batch_size_per_gpu=2",
           "--set", "scheduler.params.warmup_num_steps=1", "--set", f"run.out_dir={run_dir}"]
    for s in settings:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def evals(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return {r["step"]: r["val_loss"] for r in map(json.loads, f) if r["type"] == "eval"}
