// The 1-bit momentum exchange of OneBitAdam and OneBitLamb (onebit_exchange.hpp).
#include "optim/onebit_exchange.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "offload/host_optimizer.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {

OneBitExchange::OneBitExchange(const OptimizerEnv& env) : env_(env), first_(tensor_offsets(*env.layout)) {
  const Layout& l = *env.layout;
  units_.resize(static_cast<std::size_t>(l.num_units()));
  for (int u = 0; u < l.num_units(); ++u) units_[static_cast<std::size_t>(u)].numel = l.unit(u).numel;
}

std::size_t OneBitExchange::real(std::size_t k, std::size_t c) const {
  const std::size_t b = c * slice(k), n = static_cast<std::size_t>(units_[k].numel);
  return b >= n ? 0 : std::min(slice(k), n - b);
}

void OneBitExchange::capture(const OptimRun& r) {
  Unit& u = units_[static_cast<std::size_t>(r.unit)];
  u.owned_m.resize(static_cast<std::size_t>(env_.own_len(r.unit)));
  std::memcpy(u.owned_m.data() + r.own_at, r.state[0], static_cast<std::size_t>(r.n) * sizeof(float));
}

void OneBitExchange::reset() {
  shared_valid_ = false;
  for (Unit& u : units_) {
    std::fill(u.worker_error.begin(), u.worker_error.end(), 0.0f);
    std::fill(u.server_error.begin(), u.server_error.end(), 0.0f);
  }
}

std::size_t OneBitExchange::state_size() const {
  const std::size_t W = static_cast<std::size_t>(env_.world);
  if (W == 1) return 0;
  std::size_t n = 1;
  for (std::size_t k = 0; k < units_.size(); ++k) n += slice(k) * W + slice(k) * W / 32 + slice(k) + W;
  return n;
}

std::int64_t OneBitExchange::bytes_for(const std::vector<std::int64_t>& slices, int world) {
  const std::int64_t W = world, U = static_cast<std::int64_t>(slices.size()), f = sizeof(float);
  std::int64_t b = 0, largest = 0, per_rank = 0;  // per_rank: one slice of every unit's bits
  for (std::int64_t S : slices) {
    const std::int64_t P = S * W;
    b += S * f;  // new_m
    if (W > 1) b += (P + S) * f + P / 8 + W * f;
    largest = std::max(largest, P);
    per_rank += S / 8;
  }
  const std::int64_t messages = W * per_rank + W * U * f;  // bits and scales to every rank
  return b + largest * f + (W > 1 ? 2 : 1) * messages;
}

std::int64_t OneBitExchange::bytes() const {
  auto f = [](const std::vector<float>& v) { return static_cast<std::int64_t>(v.size() * sizeof(float)); };
  std::int64_t b = f(shared_) + f(send_scales_) + f(recv_scales_);
  b += static_cast<std::int64_t>(send_bits_.size() + recv_bits_.size());
  for (const Unit& u : units_)
    b += f(u.worker_error) + f(u.server_error) + f(u.scales) + f(u.owned_m) + f(u.new_m) +
         static_cast<std::int64_t>(u.bits.size());
  return b;
}

// Per unit: worker error (P), server error (S), scales (W), bits (P / 8 bytes, a multiple of 4).
std::vector<float> OneBitExchange::state() const {
  std::vector<float> s(state_size(), 0.0f);
  if (s.empty() || !shared_valid_) return s;  // nothing exchanged yet: all zero
  const std::size_t W = static_cast<std::size_t>(env_.world);
  float* at = s.data();
  for (std::size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    const std::size_t S = slice(k), P = S * W;
    at = std::copy(u.worker_error.begin(), u.worker_error.end(), at);
    at = std::copy(u.server_error.begin(), u.server_error.end(), at);
    at = std::copy(u.scales.begin(), u.scales.end(), at);
    std::memcpy(at, u.bits.data(), P / 8);
    at += P / 32;
  }
  *at = 1.0f;
  return s;
}

void OneBitExchange::set_state(const std::vector<float>& s) {
  if (s.empty() || s.back() == 0.0f) {
    reset();
    return;
  }
  ZERO_CHECK(s.size() == state_size(),
             fmt::format("OneBitExchange: a per-rank state of {} values, this rank keeps {}", s.size(), state_size()));
  const std::size_t W = static_cast<std::size_t>(env_.world);
  const float* at = s.data();
  for (std::size_t k = 0; k < units_.size(); ++k) {
    Unit& u = units_[k];
    const std::size_t S = slice(k), P = S * W;
    u.worker_error.assign(at, at + P);
    u.server_error.assign(at + P, at + P + S);
    u.scales.assign(at + P + S, at + P + S + W);
    at += P + S + W;
    u.bits.resize(P / 8);
    std::memcpy(u.bits.data(), at, P / 8);
    at += P / 32;
  }
  shared_valid_ = true;
}

std::vector<OneBitExchange::Span> OneBitExchange::spans(std::size_t k, const std::vector<float>* coeff) const {
  const std::size_t N = static_cast<std::size_t>(units_[k].numel);
  if (coeff == nullptr) return {{0, N, 1.0f}};
  std::vector<Span> s;
  std::size_t at = 0;
  const auto& params = env_.layout->unit(static_cast<int>(k)).params;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const std::size_t b = static_cast<std::size_t>(params[p].offset), e = b + static_cast<std::size_t>(params[p].numel);
    if (b > at) s.push_back({at, b, 1.0f});  // alignment between tensors: zeros, whatever multiplies them
    s.push_back({b, e, (*coeff)[static_cast<std::size_t>(first_[k]) + p]});
    at = e;
  }
  if (at < N) s.push_back({at, N, 1.0f});
  return s;
}

// The bits of unit k for slice c travel at c * B + offset(k), B the bytes of one slice of every
// unit (each slice is a multiple of 64 elements: 8 bytes of bits, so bits travel as fp32 words).
void OneBitExchange::exchange(const std::vector<const void*>& full, DType type, float b1, float grad_scale,
                              const std::vector<float>* coeff) {
  const int W = env_.world;
  const std::size_t U = units_.size(), Wz = static_cast<std::size_t>(W), esize = dtype_size(type);
  const float one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(b1));
  std::vector<std::size_t> offset(U + 1, 0);  // bytes of the units' bits before unit k, in one slice
  for (std::size_t k = 0; k < U; ++k) offset[k + 1] = offset[k] + slice(k) / 8;
  const std::size_t B = offset[U];
  send_bits_.assign(Wz * B, 0);
  send_scales_.assign(Wz * U, 0.0f);
  for (std::size_t k = 0; k < U; ++k) {
    Unit& u = units_[k];
    const std::size_t S = slice(k), P = S * Wz;
    const std::vector<Span> runs = spans(k, coeff);
    // The shared momentum before this step, on every rank (kept at the largest unit's size).
    if (shared_.size() < P) shared_.resize(P);
    std::fill_n(shared_.begin(), P, 0.0f);
    if (shared_valid_) {
      for (std::size_t c = 0; c < Wz; ++c)
        offload::onebit_decode(u.bits.data() + c * S / 8, u.scales[c], real(k, c), shared_.data() + c * S);
    } else {
      u.owned_m.resize(S);  // a slice of padding only has no runs to capture it
      if (W > 1)
        env_.comm->all_gather(u.owned_m.data(), shared_.data(), S, DType::f32);
      else
        std::copy(u.owned_m.begin(), u.owned_m.end(), shared_.begin());
      if (coeff != nullptr)
        for (const Span& s : runs)
          for (std::size_t i = s.begin; i < s.end; ++i) shared_[i] *= s.coeff;
      std::vector<float>().swap(u.owned_m);  // captured for this exchange only
    }
    u.new_m.assign(S, 0.0f);
    // Worker: this rank's momentum (plus its error when there is an exchange).
    const bool exchanged = W > 1;
    if (exchanged && u.worker_error.empty()) u.worker_error.assign(P, 0.0f), u.server_error.assign(S, 0.0f);
    float* x = exchanged ? u.worker_error.data() : u.new_m.data();
    const auto* g = static_cast<const std::uint8_t*>(full[k]);
    for (const Span& s : runs)
      offload::onebit_worker(x + s.begin, shared_.data() + s.begin, g + s.begin * esize, type, s.end - s.begin, b1,
                             one_minus_b1, grad_scale * s.coeff, exchanged);
    if (!exchanged) continue;  // the momentum of the one rank's gradient, exactly
    // Compressed per destination slice.
    for (std::size_t c = 0; c < Wz; ++c)
      send_scales_[c * U + k] = offload::onebit_compress(x + c * S, real(k, c), send_bits_.data() + c * B + offset[k]);
  }
  if (W == 1) {
    shared_valid_ = false;  // the next step reads this step's momentum back through the capture
    return;
  }
  recv_bits_.assign(Wz * B, 0);
  recv_scales_.assign(Wz * U, 0.0f);
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

}  // namespace zero
