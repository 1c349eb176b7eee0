// The correspondence between the trainer's parameters and Hugging Face's tensors, shared by the
// export (hf.cpp) and the import (hf_import.cpp): one table per architecture, walked element by
// element (docs/architecture.md, note hf-interchange).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero/dtype.hpp"
#include "zero/plan/plan.hpp"

namespace zero::hf {

using Shape = std::vector<std::int64_t>;

inline constexpr const char* kWte = "wte.weight";
inline constexpr const char* kLmHead = "lm_head.weight";
inline constexpr const char* kIndex = "model.safetensors.index.json";

inline std::int64_t count(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------- the correspondence
//
// How one trainer parameter is made of Hugging Face tensors. The trainer stores every matrix
// [in, out] (y = x W); nn.Linear stores [out, in].
enum class Kind {
  copy,       // the same elements in the same order (embeddings: the first vocab_size rows)
  transpose,  // one [out, in] matrix
  llama_qkv,  // q_proj, k_proj, v_proj [heads * hs, C] -> [C, (NH + 2 KV) hs], q heads reordered
  llama_o,    // o_proj [C, NH hs] -> [NH hs, C], input rows in the stored q head order
  gate_up,    // gate_proj, up_proj [F, C] -> [C, 2F]: gate, then up
  bloom_qkv,  // query_key_value [NH, 3, hs, C] -> [C, 3C]: q of every head, then k, then v
  bloom_qkv_bias,
};
struct HfTensor {
  std::string name;
  Shape shape;
};
struct Mapping {
  Kind kind = Kind::copy;
  std::vector<HfTensor> from;
};

// Calls fn(ours, source, theirs) for every element of the parameter that `m` makes: its flat
// index, the index of the Hugging Face tensor in m.from and the flat index there. Elements no
// tensor provides (padding rows) are not visited.
template <class Fn>
void place(const Mapping& m, const plan::GptShape& c, Fn&& fn) {
  const std::int64_t C = c.n_embd, NH = c.n_head, KV = c.kv_heads(), hs = c.head_size(), G = NH / KV;
  // The Hugging Face query head of stored q head j = r KV + g: g G + r.
  auto hf_head = [&](std::int64_t j) { return (j % KV) * G + j / KV; };
  switch (m.kind) {
    case Kind::copy: {
      const std::int64_t n = count(m.from[0].shape);
      for (std::int64_t i = 0; i < n; ++i) fn(i, 0, i);
      return;
    }
    case Kind::transpose: {
      const std::int64_t R = m.from[0].shape[0], K = m.from[0].shape[1];
      for (std::int64_t o = 0; o < R; ++o)
        for (std::int64_t i = 0; i < K; ++i) fn(i * R + o, 0, o * K + i);
      return;
    }
    case Kind::llama_qkv: {
      const std::int64_t W = c.qkv_width();
      for (std::int64_t col = 0; col < W; ++col) {
        const std::int64_t block = col / hs, d = col % hs;
        int s = 0;
        std::int64_t row = 0;
        if (block < NH) {
          row = hf_head(block) * hs + d;
        } else if (block < NH + KV) {
          s = 1;
          row = (block - NH) * hs + d;
        } else {
          s = 2;
          row = (block - NH - KV) * hs + d;
        }
        for (std::int64_t i = 0; i < C; ++i) fn(i * W + col, s, row * C + i);
      }
      return;
    }
    case Kind::llama_o:
      for (std::int64_t r = 0; r < C; ++r) {
        const std::int64_t in = hf_head(r / hs) * hs + r % hs;
        for (std::int64_t o = 0; o < C; ++o) fn(r * C + o, 0, o * C + in);
      }
      return;
    case Kind::gate_up: {
      const std::int64_t F = c.mlp_hidden();
      for (std::int64_t col = 0; col < 2 * F; ++col)
        for (std::int64_t i = 0; i < C; ++i) fn(i * 2 * F + col, col < F ? 0 : 1, (col % F) * C + i);
      return;
    }
    case Kind::bloom_qkv:
    case Kind::bloom_qkv_bias:
      for (std::int64_t col = 0; col < 3 * C; ++col) {
        const std::int64_t part = col / C, h = (col % C) / hs, row = (h * 3 + part) * hs + col % hs;
        if (m.kind == Kind::bloom_qkv_bias)
          fn(col, 0, row);
        else
          for (std::int64_t i = 0; i < C; ++i) fn(i * 3 * C + col, 0, row * C + i);
      }
      return;
  }
}

// Every parameter of gpt_layout(c) with the Hugging Face tensors it is made of. gpt2: the
// trainer's names are GPT-2's (Conv1D [in, out] weights), so each is its own tensor.
std::map<std::string, Mapping> mappings(const plan::GptShape& c);
// config.json's torch_dtype for a dtype.
const char* torch_dtype(DType t);

}  // namespace zero::hf
