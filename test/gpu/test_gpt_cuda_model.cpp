// The whole GPT model on CudaOps (bf16 on the GPU) against the host model (HostOps, fp32) on
// the same weights and batch: the loss, and every parameter gradient tensor by its relative
// error norm and its cosine with the host's. Both start from GPT-2's initialisation rounded to
// bf16 (the host gets those values widened to fp32), so what differs is only that the GPU
// stores activations, activation gradients and parameter gradients in bf16 and sums in another
// order. The tolerances and why they are what they are: test/support/gpt_model_compare.hpp;
// test/unit/gpt/test_gpt_bf16_model.cpp checks on any machine that bf16 rounding alone stays within
// them (the printed summaries of both tests can be read side by side).
//
// Then what the engine relies on: two identical backward passes give bit-identical gradients
// (no atomics, fixed reduction orders, the same cuBLASLt algorithm per shape), the backward adds
// into the gradients it is given (micro-batch accumulation), activation checkpointing's
// recompute reproduces the stored activations exactly, and the padded vocabulary rows of the
// tied embedding get exactly zero gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "gpt_config.hpp"
#include "gpt_model.hpp"
#include "gpt_model_compare.hpp"
#include "ops.hpp"
#include "zero/dtype.hpp"

using namespace zero::gpt;
namespace cmp = zero::gpt::compare;

namespace {

using Bits = std::vector<std::vector<std::uint16_t>>;  // bf16 bits, unit by unit
using Values = std::vector<std::vector<float>>;

// Parameters or gradients in the Ops' memory as bf16, one buffer per unit laid out like
// HostParams (tensor i of unit u at the sum of the sizes before it), with the per-tensor pointer
// arrays GptModel takes. Transfers go through the Ops, so they are ordered on its stream with
// the model's kernels.
class DeviceUnits {
 public:
  DeviceUnits(Ops& ops, const HostParams& shape) : ops_(&ops) {
    REQUIRE(ops.dtype() == zero::DType::bf16);
    for (int u = 0; u < shape.num_units(); ++u) {
      const std::size_t n = shape.unit_data(u).size();
      sizes_.push_back(n);
      buffers_.emplace_back(ops, n * sizeof(std::uint16_t));
      auto& ptrs = ptrs_.emplace_back();
      std::size_t off = 0;
      for (const TensorSpec& t : shape.specs()[static_cast<std::size_t>(u)].tensors) {
        ptrs.push_back(act_offset(buffers_.back().as<Act>(), off, sizeof(std::uint16_t)));
        off += static_cast<std::size_t>(t.numel());
      }
      REQUIRE(off == n);
    }
    zero();
  }

  // The values of `p` rounded to bf16 (exact when they already are).
  void upload(const HostParams& p) {
    std::vector<std::vector<std::uint16_t>> staging;
    for (std::size_t u = 0; u < sizes_.size(); ++u) {
      const auto& v = p.unit_data(static_cast<int>(u));
      REQUIRE(v.size() == sizes_[u]);
      auto& s = staging.emplace_back(v.size());
      zero::convert(v.data(), zero::DType::f32, s.data(), zero::DType::bf16, v.size());
      ops_->upload(buffers_[u].as<void>(), s.data(), s.size() * sizeof(std::uint16_t));
    }
    ops_->synchronize();  // the staging vectors must outlive the copies
  }
  void zero() {
    for (std::size_t u = 0; u < sizes_.size(); ++u)
      ops_->fill_zero(buffers_[u].as<void>(), sizes_[u] * sizeof(std::uint16_t));
  }
  Bits bits() const {
    Bits out;
    for (std::size_t u = 0; u < sizes_.size(); ++u) {
      auto& b = out.emplace_back(sizes_[u]);
      ops_->download(b.data(), buffers_[u].as<void>(), b.size() * sizeof(std::uint16_t));
    }
    return out;
  }
  Values values() const { return to_values(bits()); }
  static Values to_values(const Bits& bits) {
    Values out;
    for (const auto& b : bits) {
      auto& v = out.emplace_back(b.size());
      zero::convert(b.data(), zero::DType::bf16, v.data(), zero::DType::f32, b.size());
    }
    return out;
  }

  const Act* const* acts(int u) const { return ptrs_[static_cast<std::size_t>(u)].data(); }
  Act* const* acts(int u) { return ptrs_[static_cast<std::size_t>(u)].data(); }

 private:
  Ops* ops_;
  std::vector<std::size_t> sizes_;
  std::vector<OpsBuffer> buffers_;
  std::vector<std::vector<Act*>> ptrs_;
};

// forward_all / backward_all of gpt_model.hpp, for parameters in device memory.
double forward_device(GptModel& m, const DeviceUnits& p) {
  const GptConfig& c = m.config();
  m.forward_embeddings(p.acts(embeddings_unit()));
  for (int l = 0; l < c.n_layer; ++l) m.forward_block(l, p.acts(block_unit(l)));
  m.forward_head(p.acts(ln_f_unit(c)), p.acts(embeddings_unit()));
  return m.loss();
}

void backward_device(GptModel& m, const DeviceUnits& p, DeviceUnits& g, float dloss = 1.0f) {
  const GptConfig& c = m.config();
  const int lnf = ln_f_unit(c), emb = embeddings_unit();
  m.backward_head(p.acts(lnf), g.acts(lnf), p.acts(emb), g.acts(emb), dloss);
  for (int l = c.n_layer - 1; l >= 0; --l)
    m.backward_block(l, p.acts(block_unit(l)), g.acts(block_unit(l)));
  m.backward_embeddings(g.acts(emb));
  m.ops().synchronize();
}

// One micro-step (forward and backward of `batch`) adding into `g`; returns the loss.
double micro_step(GptModel& m, const DeviceUnits& p, DeviceUnits& g, const cmp::Batch& batch) {
  m.set_batch(batch.inputs.data(), batch.targets.data(), cmp::kBatch, m.config().seq_len);
  const double loss = forward_device(m, p);
  backward_device(m, p, g);
  return loss;
}

// Under compute-sanitizer (ZERO_TEST_SMALL=1) two shapes cover the paths: T a multiple of the
// attention tile and not, padded vocabulary and not, with and without checkpointing.
std::vector<cmp::ModelCase> cases() {
  std::vector<cmp::ModelCase> all = cmp::model_cases();
  if (std::getenv("ZERO_TEST_SMALL")) return {all.front(), all.back()};
  return all;
}

// ||got - want|| <= tol (||a|| + ||b||) per tensor, for a sum want = a + b.
void require_sum(const std::vector<UnitSpec>& specs, const Values& got, const Values& a,
                 const Values& b, double tol) {
  for (std::size_t u = 0; u < specs.size(); ++u) {
    std::size_t off = 0;
    for (const TensorSpec& t : specs[u].tensors) {
      double d2 = 0, a2 = 0, b2 = 0;
      for (std::size_t i = off; i < off + static_cast<std::size_t>(t.numel()); ++i) {
        const double x = a[u][i], y = b[u][i], s = got[u][i];
        d2 += (s - x - y) * (s - x - y);
        a2 += x * x;
        b2 += y * y;
      }
      off += static_cast<std::size_t>(t.numel());
      INFO(t.name << ": ||sum - (a + b)|| = " << std::sqrt(d2) << ", ||a|| = " << std::sqrt(a2)
                  << ", ||b|| = " << std::sqrt(b2));
      REQUIRE(a2 > 0);
      REQUIRE(b2 > 0);
      CHECK(std::sqrt(d2) <= tol * (std::sqrt(a2) + std::sqrt(b2)));
    }
  }
}

}  // namespace

TEST_CASE("the CUDA model matches the fp32 host model on the same bf16 weights", "[gpt][model]") {
  for (const cmp::ModelCase& mc : cases()) {
    const GptConfig cfg = cmp::config_of(mc);
    const std::string what = cmp::describe(mc);
    INFO(what);
    HostParams params(cfg);
    cmp::init_bf16(params, 2024);
    const cmp::Batch batch = cmp::random_batch(cfg, cmp::kBatch, 17);

    auto host_ops = make_host_ops();
    const cmp::HostStep host = cmp::host_step(*host_ops, cfg, params, batch);

    auto cuda_ops = make_cuda_ops(nullptr);
    GptModel dev(cfg, cmp::kBatch, *cuda_ops);
    DeviceUnits p(*cuda_ops, params), g(*cuda_ops, params);
    p.upload(params);
    // The weights arrive unchanged (they are bf16 values already).
    CHECK(p.values() == cmp::units_of(params));
    const double loss_dev = micro_step(dev, p, g, batch);
    const Values g_dev = g.values();

    const auto t = cmp::agreement_per_tensor(params.specs(), g_dev, cmp::units_of(host.grads));
    cmp::print_summary("CUDA vs host fp32", what, loss_dev, host.loss, t);
    CHECK(std::isfinite(loss_dev));
    CHECK(std::abs(loss_dev - host.loss) <= cmp::kLossRel * host.loss);
    for (const auto& x : t) {
      INFO(x.name << ": |g_host| " << x.a.norm << ", rel " << x.a.rel << ", cosine " << x.a.cosine);
      CHECK(x.a.finite);
      CHECK(x.a.norm > 0);  // every tensor takes part, or the comparison would prove nothing
      CHECK(x.a.rel <= cmp::kGradRel);
      CHECK(x.a.cosine >= cmp::kGradCos);
    }

    // The padded rows of the tied embedding: no logit of theirs enters the loss, and no token
    // id reaches them, so their gradient is exactly zero.
    const std::vector<float>& emb = g_dev[static_cast<std::size_t>(embeddings_unit())];
    const std::size_t real = static_cast<std::size_t>(cfg.vocab_size) * cfg.n_embd;
    const std::size_t padded = static_cast<std::size_t>(cfg.padded_vocab_size()) * cfg.n_embd;
    std::size_t nonzero = 0;
    for (std::size_t i = real; i < padded; ++i) nonzero += emb[i] != 0.0f;
    CHECK(nonzero == 0);
  }
}

TEST_CASE("the CUDA model's backward is deterministic, accumulates, and recomputes exactly",
          "[gpt][model]") {
  for (const cmp::ModelCase& mc : cases()) {
    const GptConfig cfg = cmp::config_of(mc);
    const std::string what = cmp::describe(mc);
    INFO(what);
    HostParams params(cfg);
    cmp::init_bf16(params, 2024);
    const cmp::Batch a = cmp::random_batch(cfg, cmp::kBatch, 17);
    const cmp::Batch b = cmp::random_batch(cfg, cmp::kBatch, 18);

    auto ops = make_cuda_ops(nullptr);
    GptModel dev(cfg, cmp::kBatch, *ops);
    DeviceUnits p(*ops, params), g(*ops, params);
    p.upload(params);

    // Twice the same micro-step from zero: the same bits, loss included.
    const double loss_a1 = micro_step(dev, p, g, a);
    const Bits g_a1 = g.bits();
    g.zero();
    const double loss_a2 = micro_step(dev, p, g, a);
    const Bits g_a2 = g.bits();
    CHECK(loss_a2 == loss_a1);
    for (std::size_t u = 0; u < g_a1.size(); ++u) {
      INFO("unit " << params.specs()[u].name);
      CHECK(g_a2[u] == g_a1[u]);
    }

    // A second micro-batch adds to the first: g(a then b) = g(a) + g(b) up to the rounding of
    // the additions themselves. Each gradient tensor is added into once per backward (wte twice,
    // the head and the embedding), and each addition rounds the sum to bf16 (at most 2^-8 of it);
    // counting those of the accumulated run and of the separate run of b, the difference is at
    // most about 4 x 2^-8 (||g(a)|| + ||g(b)||) = 2^-6 (...). Overwriting instead of adding
    // leaves out g(a), off by ||g(a)|| (about half of the right-hand norms).
    micro_step(dev, p, g, b);  // g held g(a)
    const Values g_ab = g.values();
    g.zero();
    micro_step(dev, p, g, b);
    const Values g_b = g.values();
    require_sum(params.specs(), g_ab, DeviceUnits::to_values(g_a1), g_b, 0x1p-6);

    // Checkpointing recomputes each block's forward with the same kernels on the same inputs:
    // its loss and gradients are those of the model that stores every block, bit for bit.
    GptConfig other = cfg;
    other.activation_checkpointing = !cfg.activation_checkpointing;
    GptModel dev_other(other, cmp::kBatch, *ops);
    g.zero();
    const double loss_other = micro_step(dev_other, p, g, a);
    const Bits g_other = g.bits();
    CHECK(loss_other == loss_a1);
    for (std::size_t u = 0; u < g_a1.size(); ++u) {
      INFO("unit " << params.specs()[u].name << ", checkpointing "
                   << other.activation_checkpointing);
      CHECK(g_other[u] == g_a1[u]);
    }
  }
}
