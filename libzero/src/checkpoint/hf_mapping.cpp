// The per-architecture tables of hf_mapping.hpp.
#include "checkpoint/hf_mapping.hpp"

#include <fmt/format.h>

namespace zero::hf {

using plan::Arch;

std::map<std::string, Mapping> mappings(const plan::GptShape& c) {
  const std::int64_t C = c.n_embd, V = c.vocab_size, F = c.mlp_hidden(), hs = c.head_size();
  std::map<std::string, Mapping> out;
  if (c.arch == Arch::gpt2) {
    const Layout layout = plan::gpt_layout(c);
    for (const auto& u : layout.units())
      for (const auto& p : u.params) {
        Shape s = p.shape;
        if (p.name == kWte) s[0] = V;
        out[p.name] = {Kind::copy, {{p.name, s}}};
      }
    return out;
  }
  const bool llama = c.arch == Arch::llama;
  const std::string base = llama ? "model." : "transformer.";
  auto one = [&](const std::string& ours, Kind k, const std::string& theirs, Shape s) {
    out[ours] = {k, {{base + theirs, std::move(s)}}};
  };
  // A norm: its weight, and a LayerNorm's bias.
  auto norm = [&](const std::string& ours, const std::string& theirs) {
    one(ours + ".weight", Kind::copy, theirs + ".weight", {C});
    if (!llama) one(ours + ".bias", Kind::copy, theirs + ".bias", {C});
  };
  one(kWte, Kind::copy, llama ? "embed_tokens.weight" : "word_embeddings.weight", {V, C});
  if (!llama) norm("ln_e", "word_embeddings_layernorm");
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("h.{}.", l), h = fmt::format("{}.{}.", llama ? "layers" : "h", l);
    norm(p + "ln_1", h + "input_layernorm");
    norm(p + "ln_2", h + "post_attention_layernorm");
    if (llama) {
      const std::string a = base + h + "self_attn.", m = base + h + "mlp.";
      out[p + "attn.c_attn.weight"] = {Kind::llama_qkv,
                                       {{a + "q_proj.weight", {c.n_head * hs, C}},
                                        {a + "k_proj.weight", {c.kv_heads() * hs, C}},
                                        {a + "v_proj.weight", {c.kv_heads() * hs, C}}}};
      out[p + "attn.c_proj.weight"] = {Kind::llama_o, {{a + "o_proj.weight", {C, c.n_head * hs}}}};
      out[p + "mlp.c_fc.weight"] = {Kind::gate_up, {{m + "gate_proj.weight", {F, C}}, {m + "up_proj.weight", {F, C}}}};
      out[p + "mlp.c_proj.weight"] = {Kind::transpose, {{m + "down_proj.weight", {C, F}}}};
    } else {
      const std::string a = h + "self_attention.", m = h + "mlp.";
      one(p + "attn.c_attn.weight", Kind::bloom_qkv, a + "query_key_value.weight", {3 * C, C});
      one(p + "attn.c_attn.bias", Kind::bloom_qkv_bias, a + "query_key_value.bias", {3 * C});
      one(p + "attn.c_proj.weight", Kind::transpose, a + "dense.weight", {C, C});
      one(p + "attn.c_proj.bias", Kind::copy, a + "dense.bias", {C});
      one(p + "mlp.c_fc.weight", Kind::transpose, m + "dense_h_to_4h.weight", {F, C});
      one(p + "mlp.c_fc.bias", Kind::copy, m + "dense_h_to_4h.bias", {F});
      one(p + "mlp.c_proj.weight", Kind::transpose, m + "dense_4h_to_h.weight", {C, F});
      one(p + "mlp.c_proj.bias", Kind::copy, m + "dense_4h_to_h.bias", {C});
    }
  }
  norm("ln_f", llama ? "norm" : "ln_f");
  if (!c.tied_head) out[kLmHead] = {Kind::copy, {{kLmHead, {V, C}}}};
  return out;
}

const char* torch_dtype(DType t) { return t == DType::f32 ? "float32" : (t == DType::bf16 ? "bfloat16" : "float16"); }

}  // namespace zero::hf
