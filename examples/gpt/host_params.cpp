// HostParams, the whole forward and backward over them, and sampling (gpt_model.hpp): what tests
// and sampling without an engine use.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "gpt/gpt_model.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

HostParams::HostParams(const GptConfig& cfg) : cfg_(cfg), specs_(gpt_units(cfg)) {
  for (const auto& u : specs_) {
    std::int64_t n = 0;
    for (const auto& t : u.tensors) n += t.numel();
    auto& d = data_.emplace_back(static_cast<std::size_t>(n), 0.0f);
    auto& ptrs = ptrs_.emplace_back();
    auto& acts = acts_.emplace_back();
    std::size_t off = 0;
    for (const auto& t : u.tensors) {
      ptrs.push_back(d.data() + off);
      acts.push_back(reinterpret_cast<Act*>(d.data() + off));
      off += static_cast<std::size_t>(t.numel());
    }
  }
}

void HostParams::init(std::uint64_t seed) {
  for (std::size_t u = 0; u < specs_.size(); ++u)
    for (std::size_t i = 0; i < specs_[u].tensors.size(); ++i) {
      const auto& t = specs_[u].tensors[i];
      init_parameter(cfg_, t.name, {ptrs_[u][i], static_cast<std::size_t>(t.numel())}, seed);
    }
}

void HostParams::zero() {
  for (auto& d : data_) std::fill(d.begin(), d.end(), 0.0f);
}

std::span<float> HostParams::tensor(std::string_view name) {
  for (std::size_t u = 0; u < specs_.size(); ++u)
    for (std::size_t i = 0; i < specs_[u].tensors.size(); ++i)
      if (specs_[u].tensors[i].name == name)
        return {ptrs_[u][i], static_cast<std::size_t>(specs_[u].tensors[i].numel())};
  ZERO_THROW("HostParams: no tensor named '" + std::string(name) +
             "'; names follow Hugging Face GPT-2 (wte.weight, h.0.attn.c_attn.weight, ...)");
}

namespace {
void require_host_fp32(const GptModel& model, const char* what) {
  ZERO_CHECK(model.ops().host_memory() && model.ops().dtype() == DType::f32,
             std::string(what) + ": HostParams are host fp32 arrays, but the model computes with " +
                 model.ops().name() + "; build it with make_host_ops()");
}
}  // namespace

double forward_all(GptModel& model, const HostParams& p) {
  require_host_fp32(model, "forward_all");
  const int L = model.config().n_layer;
  model.forward_embeddings(p.acts(embeddings_unit()));
  for (int l = 0; l < L; ++l) model.forward_block(l, p.acts(block_unit(l)));
  model.forward_head(p.acts(ln_f_unit(model.config())), p.acts(embeddings_unit()));
  return model.loss();
}

void backward_all(GptModel& model, const HostParams& p, HostParams& grads, float dloss) {
  require_host_fp32(model, "backward_all");
  const int L = model.config().n_layer;
  const int lnf = ln_f_unit(model.config());
  model.backward_head(p.acts(lnf), grads.acts(lnf), p.acts(embeddings_unit()), grads.acts(embeddings_unit()), dloss);
  for (int l = L - 1; l >= 0; --l) model.backward_block(l, p.acts(block_unit(l)), grads.acts(block_unit(l)));
  model.backward_embeddings(p.acts(embeddings_unit()), grads.acts(embeddings_unit()));
}

int sample_token(std::span<const float> logits, float temperature, int top_k, double coin) {
  ZERO_CHECK(!logits.empty(), "sample_token: empty logits");
  if (temperature <= 0.0f) return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const std::size_t k =
      (top_k <= 0 || static_cast<std::size_t>(top_k) > ids.size()) ? ids.size() : static_cast<std::size_t>(top_k);
  auto at = [&](int id) { return logits[static_cast<std::size_t>(id)]; };
  // Largest first; ties broken by id so the choice is reproducible.
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](int a, int b) { return at(a) > at(b) || (at(a) == at(b) && a < b); });
  const double mx = at(ids[0]);
  std::vector<double> p(k);
  double sum = 0.0;
  for (std::size_t i = 0; i < k; ++i) sum += p[i] = std::exp((at(ids[i]) - mx) / temperature);
  const double target = coin * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    acc += p[i];
    if (target < acc) return ids[i];
  }
  return ids[k - 1];
}

}  // namespace zero::gpt
