// 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with
// Adam's Convergence Speed"; DeepSpeed's OneBitAdam and its keys), composed with ZeRO stages 1
// and 2.
//
// For freeze_step updates it is Adam without bias correction (DeepSpeed's update), over the
// exactly reduced gradients. Then the variance is frozen and the gradient reduction is replaced:
// each rank folds its own (unreduced) gradient into the shared momentum, m_w = b1 m + (1-b1) g_w,
// adds its worker error, and sends one sign bit per element and one scale (the RMS) per slice to
// the rank that owns the slice; the owner averages the workers' decoded messages, adds its server
// error, compresses again and all-gathers the result, which every rank decodes into the momentum
// of the next step. The owner's decoded slice is its new m; p moves by -lr m / (sqrt(v) + eps).
//
// The shared momentum is kept on every rank as the last exchange's bits and scales (1 bit per
// element); the worker error (4 bytes per element of the whole model) and the server error (4
// per owned element) are this rank's own and are reset on resume, as DeepSpeed does. The first
// compressed step (and the first after a resume) all-gathers the owned fp32 momentum instead.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "runtime/log.hpp"
#include "optim/optimizers.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

class OneBitAdam final : public Optimizer {
 public:
  OneBitAdam(const OptimizerConfig& o, const OptimizerEnv& env) : cfg_(o), env_(env) {
    const Layout& l = *env.layout;
    units_.resize(static_cast<std::size_t>(l.num_units()));
    for (int u = 0; u < l.num_units(); ++u) unit(u).numel = l.unit(u).numel;
  }
  const char* name() const override { return "OneBitAdam"; }
  int moments() const override { return 2; }
  bool per_tensor() const override { return true; }  // runs leave the padding out
  std::string unsupported(const Layout& layout) const override { return needs_whole_tensors("OneBitAdam", layout); }
  bool local_gradients(std::int64_t step) const override { return step > cfg_.freeze_step; }
  bool wants_capture() const override { return compressed_ && !shared_valid_; }
  void restored() override {
    shared_valid_ = false;
    for (Unit& u : units_) {
      std::fill(u.worker_error.begin(), u.worker_error.end(), 0.0f);
      std::fill(u.server_error.begin(), u.server_error.end(), 0.0f);
    }
  }

  void begin_step(const StepHyper& h) override {
    const bool was = compressed_;
    compressed_ = local_gradients(h.step);
    if (compressed_ && !was && env_.rank == 0)
      log_info(
          "OneBitAdam: update {} on: the variance is frozen and the momentum exchange is compressed to 1 bit "
          "(freeze_step {})",
          h.step, cfg_.freeze_step);
    hyper_ = AdamHyper{static_cast<float>(h.lr),
                       static_cast<float>(cfg_.beta1),
                       static_cast<float>(cfg_.beta2),
                       static_cast<float>(cfg_.eps),
                       static_cast<float>(cfg_.weight_decay),
                       true,
                       false,
                       h.step,
                       h.grad_scale};
  }

  void run(int pass, const OptimRun& r, Backend* device) override {
    ZERO_CHECK(device == nullptr, "OneBitAdam steps host memory only");
    const std::size_t n = static_cast<std::size_t>(r.n);
    Unit& u = unit(r.unit);
    if (pass < 0) {  // capture: the owned momentum, for the first compressed exchange
      u.owned_m.resize(static_cast<std::size_t>(env_.own_len(r.unit)));
      std::memcpy(u.owned_m.data() + r.own_at, r.state[0], n * sizeof(float));
      return;
    }
    AdamHyper a = hyper_;
    if (!r.decay) a.weight_decay = 0.0f;
    if (!compressed_) {
      offload::adam_step(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
      return;
    }
    const AdamConstants c = adam_constants(a);
    offload::onebit_adam_apply(r.master, r.state[0], r.state[1], u.new_m.data() + r.own_at, r.param_out, r.param_type,
                               n, c.decay, c.neg_step_size, c.eps);
  }

  // One all-to-all of every unit's bits (and one of their scales) to the owners, one all-gather of
  // the owners' bits (and one of their scales) back: four collectives a step, whatever the units.
  // The bits of unit u for slice c travel at c * B + offset(u), B the bytes of one slice of
  // every unit.
  void exchange(const std::vector<const void*>& full, DType type) override {
    const int W = env_.world;
    const std::size_t U = units_.size(), Wz = static_cast<std::size_t>(W);
    const float b1 = hyper_.beta1, one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(hyper_.beta1));
    std::vector<std::size_t> offset(U + 1, 0);  // bytes of the units' bits before unit u, in one slice
    for (std::size_t k = 0; k < U; ++k) offset[k + 1] = offset[k] + slice(k) / 8;
    const std::size_t B = offset[U];
    send_bits_.assign(Wz * B, 0);
    send_scales_.assign(Wz * U, 0.0f);
    for (std::size_t k = 0; k < U; ++k) {
      Unit& u = units_[k];
      const std::size_t S = slice(k), P = S * Wz, N = static_cast<std::size_t>(u.numel);
      // The shared momentum before this step, on every rank.
      shared_.assign(P, 0.0f);
      if (shared_valid_) {
        for (std::size_t c = 0; c < Wz; ++c)
          offload::onebit_decode(u.bits.data() + c * S / 8, u.scales[c], real(k, c), shared_.data() + c * S);
      } else {
        u.owned_m.resize(S);  // a slice of padding only has no runs to capture it
        if (W > 1)
          env_.comm->all_gather(u.owned_m.data(), shared_.data(), S, DType::f32);
        else
          std::copy(u.owned_m.begin(), u.owned_m.end(), shared_.begin());
      }
      u.new_m.assign(S, 0.0f);
      if (W == 1) {  // nothing to exchange: the momentum of the one rank's gradient, exactly
        offload::onebit_worker(u.new_m.data(), shared_.data(), full[k], type, N, b1, one_minus_b1, hyper_.grad_scale,
                               false);
        continue;
      }
      // Worker: this rank's momentum plus its error, compressed per destination slice.
      if (u.worker_error.empty()) u.worker_error.assign(P, 0.0f), u.server_error.assign(S, 0.0f);
      float* x = u.worker_error.data();
      offload::onebit_worker(x, shared_.data(), full[k], type, N, b1, one_minus_b1, hyper_.grad_scale, true);
      for (std::size_t c = 0; c < Wz; ++c)
        send_scales_[c * U + k] =
            offload::onebit_compress(x + c * S, real(k, c), send_bits_.data() + c * B + offset[k]);
    }
    if (W == 1) {
      shared_valid_ = false;  // the next step reads this step's momentum back through the capture
      return;
    }
    recv_bits_.assign(Wz * B, 0);
    recv_scales_.assign(Wz * U, 0.0f);
    // Bits travel as fp32 words (each slice is a multiple of 64 elements: 8 bytes of bits).
    env_.comm->all_to_all(send_bits_.data(), recv_bits_.data(), B / 4, DType::f32);
    env_.comm->all_to_all(send_scales_.data(), recv_scales_.data(), U, DType::f32);
    // Server: the owned slice of every worker's message, averaged, compressed again.
    std::vector<std::uint8_t> mine(B, 0);
    std::vector<float> mine_scales(U, 0.0f), worker_scales(Wz);
    const std::size_t r = static_cast<std::size_t>(env_.rank);
    for (std::size_t k = 0; k < U; ++k) {
      for (std::size_t w = 0; w < Wz; ++w) worker_scales[w] = recv_scales_[w * U + k];
      mine_scales[k] = offload::onebit_server(recv_bits_.data() + offset[k], B, worker_scales.data(), W,
                                              units_[k].server_error.data(), real(k, r), mine.data() + offset[k]);
    }
    std::vector<std::uint8_t> all_bits(Wz * B);
    std::vector<float> all_scales(Wz * U);
    env_.comm->all_gather(mine.data(), all_bits.data(), B / 4, DType::f32);
    env_.comm->all_gather(mine_scales.data(), all_scales.data(), U, DType::f32);
    for (std::size_t k = 0; k < U; ++k) {
      Unit& u = units_[k];
      const std::size_t S = slice(k);
      u.bits.assign(S / 8 * Wz, 0);
      u.scales.assign(Wz, 0.0f);
      for (std::size_t c = 0; c < Wz; ++c) {
        std::memcpy(u.bits.data() + c * S / 8, all_bits.data() + c * B + offset[k], S / 8);
        u.scales[c] = all_scales[c * U + k];
      }
      offload::onebit_decode(u.bits.data() + r * S / 8, u.scales[r], real(k, r), u.new_m.data());
    }
    shared_valid_ = true;
  }

 private:
  struct Unit {
    std::int64_t numel = 0;
    std::vector<float> worker_error, server_error;  // padded unit; owned slice
    std::vector<std::uint8_t> bits;                 // the last exchange's result, every slice
    std::vector<float> scales;                      // its scale per slice
    std::vector<float> owned_m, new_m;              // captured momentum; this step's, owned slice
  };
  Unit& unit(int u) { return units_[static_cast<std::size_t>(u)]; }
  std::size_t slice(std::size_t k) const { return static_cast<std::size_t>(env_.slice[k]); }
  // The real (not padding) elements of unit k's slice c.
  std::size_t real(std::size_t k, std::size_t c) const {
    const std::size_t b = c * slice(k), n = static_cast<std::size_t>(units_[k].numel);
    return b >= n ? 0 : std::min(slice(k), n - b);
  }

  OptimizerConfig cfg_;
  OptimizerEnv env_;
  std::vector<Unit> units_;
  AdamHyper hyper_;
  bool compressed_ = false, shared_valid_ = false;
  std::vector<float> shared_, send_scales_, recv_scales_;
  std::vector<std::uint8_t> send_bits_, recv_bits_;
};

}  // namespace

std::unique_ptr<Optimizer> make_onebit_adam(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<OneBitAdam>(o, env);
}

}  // namespace zero
