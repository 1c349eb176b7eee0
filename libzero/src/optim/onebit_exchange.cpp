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

void OneBitExchange::capture(const OptimRun& r, Backend* device) {
  bind(device);
  Unit& u = units_[static_cast<std::size_t>(r.unit)];
  u.owned_m.grow(static_cast<std::size_t>(env_.own_len(r.unit)), device_);
  copy(u.owned_m.data() + r.own_at, r.state[0], static_cast<std::size_t>(r.n) * sizeof(float));
}

void OneBitExchange::reset() {
  shared_valid_ = false;
  for (Unit& u : units_) {
    if (!u.worker_error.empty()) u.worker_error.zeros(u.worker_error.size(), device_);
    if (!u.server_error.empty()) u.server_error.zeros(u.server_error.size(), device_);
  }
}

void OneBitExchange::bind(Backend* device) {
  if (device == device_ || device == nullptr) return;
  ZERO_CHECK(device_ == nullptr, "OneBitExchange: its state is in one backend's memory; another was given");
  device_ = device;
  for (Unit& u : units_)
    for (OneBitStore<float>* f : {&u.worker_error, &u.server_error, &u.scales, &u.owned_m, &u.new_m}) f->bind(device);
  for (Unit& u : units_) u.bits.bind(device);
}

Communicator& OneBitExchange::comm() const {
  if (device_ == nullptr) return *env_.comm;
  Communicator& c = device_->comm();
  ZERO_CHECK(c.size() == env_.world && c.rank() == env_.rank,
             fmt::format("the 1-bit exchange on the {} backend: its communicator has {} ranks (this one {}), the "
                         "partition group {} (this rank {}); use the host backend",
                         device_->name(), c.size(), c.rank(), env_.world, env_.rank));
  return c;
}

void OneBitExchange::copy(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;
  if (device_ != nullptr)
    device_->copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

namespace {
// The real values of chunk c of c.
std::size_t chunk_len(const OneBitChunks& c, std::size_t k) {
  const std::size_t b = k * c.chunk;
  return b >= c.numel ? 0 : std::min(c.chunk, c.numel - b);
}
}  // namespace

void OneBitExchange::worker(float* x, const float* shared, const void* g, DType type, std::size_t n, float b1,
                            float one_minus_b1, float grad_scale, bool add_error) const {
  if (device_ != nullptr)
    device_->onebit_worker(x, shared, g, type, n, b1, one_minus_b1, grad_scale, add_error);
  else
    offload::onebit_worker(x, shared, g, type, n, b1, one_minus_b1, grad_scale, add_error);
}

void OneBitExchange::compress(float* x, const OneBitChunks& c, std::uint8_t* bits, float* scales) const {
  if (device_ != nullptr) return device_->onebit_compress(x, c, bits, scales);
  for (std::size_t k = 0; k < c.count; ++k)
    scales[k * c.scale_stride] = offload::onebit_compress(x + k * c.chunk, chunk_len(c, k), bits + k * c.bits_stride);
}

void OneBitExchange::decode(const std::uint8_t* bits, const float* scales, const OneBitChunks& c, float* out) const {
  if (device_ != nullptr) return device_->onebit_decode(bits, scales, c, out);
  for (std::size_t k = 0; k < c.count; ++k) {
    const std::size_t n = chunk_len(c, k);
    offload::onebit_decode(bits + k * c.bits_stride, scales[k * c.scale_stride], n, out + k * c.chunk);
    std::fill(out + k * c.chunk + n, out + (k + 1) * c.chunk, 0.0f);
  }
}

void OneBitExchange::server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales,
                            float* error, std::size_t n, std::size_t chunk, std::uint8_t* bits, float* scale) const {
  const std::size_t U = units_.size();
  if (device_ != nullptr)
    return device_->onebit_server(worker_bits, stride, worker_scales, U, env_.world, error, n, chunk, bits, scale);
  std::vector<float> scales(static_cast<std::size_t>(env_.world));
  for (std::size_t w = 0; w < scales.size(); ++w) scales[w] = worker_scales[w * U];
  *scale = offload::onebit_server(worker_bits, stride, scales.data(), env_.world, error, n, bits);
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
  auto f = [](const OneBitStore<float>& v) { return static_cast<std::int64_t>(v.size() * sizeof(float)); };
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
    for (const OneBitStore<float>* f : {&u.worker_error, &u.server_error, &u.scales}) {
      const std::vector<float> v = f->to_host(device_);
      at = std::copy(v.begin(), v.end(), at);
    }
    const std::vector<std::uint8_t> bits = u.bits.to_host(device_);
    std::memcpy(at, bits.data(), P / 8);
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
    u.worker_error.from_host(at, P, device_);
    u.server_error.from_host(at + P, S, device_);
    u.scales.from_host(at + P + S, W, device_);
    at += P + S + W;
    u.bits.from_host(reinterpret_cast<const std::uint8_t*>(at), P / 8, device_);
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
                              const std::vector<float>* coeff, Backend* device) {
  bind(device);
  Backend* d = device_;
  const int W = env_.world;
  const std::size_t U = units_.size(), Wz = static_cast<std::size_t>(W), esize = dtype_size(type);
  const float one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(b1));
  std::vector<std::size_t> offset(U + 1, 0);  // bytes of the units' bits before unit k, in one slice
  for (std::size_t k = 0; k < U; ++k) offset[k + 1] = offset[k] + slice(k) / 8;
  const std::size_t B = offset[U];
  send_bits_.zeros(Wz * B, d);
  send_scales_.zeros(Wz * U, d);
  for (std::size_t k = 0; k < U; ++k) {
    Unit& u = units_[k];
    const std::size_t S = slice(k), P = S * Wz, N = static_cast<std::size_t>(u.numel);
    const std::vector<Span> runs = spans(k, coeff);
    // The shared momentum before this step, on every rank (kept at the largest unit's size),
    // zero over the padding.
    shared_.grow(P, d);
    if (shared_valid_) {
      decode(u.bits.data(), u.scales.data(), OneBitChunks{S, N, Wz, S / 8, 1}, shared_.data());
    } else {
      u.owned_m.grow(S, d);  // a slice of padding only has no runs to capture it
      if (W > 1)
        comm().all_gather(u.owned_m.data(), shared_.data(), S, DType::f32);
      else
        copy(shared_.data(), u.owned_m.data(), S * sizeof(float));
      if (coeff != nullptr)
        for (const Span& s : runs) {
          if (d != nullptr)
            d->onebit_scale(shared_.data() + s.begin, s.end - s.begin, s.coeff);
          else
            for (std::size_t i = s.begin; i < s.end; ++i) shared_.data()[i] *= s.coeff;
        }
      u.owned_m.clear();  // captured for this exchange only
    }
    u.new_m.zeros(S, d);
    // Worker: this rank's momentum (plus its error when there is an exchange).
    const bool exchanged = W > 1;
    if (exchanged && u.worker_error.empty()) u.worker_error.zeros(P, d), u.server_error.zeros(S, d);
    float* x = exchanged ? u.worker_error.data() : u.new_m.data();
    const auto* g = static_cast<const std::uint8_t*>(full[k]);
    for (const Span& s : runs)
      worker(x + s.begin, shared_.data() + s.begin, g + s.begin * esize, type, s.end - s.begin, b1, one_minus_b1,
             grad_scale * s.coeff, exchanged);
    if (!exchanged) continue;  // the momentum of the one rank's gradient, exactly
    // Compressed per destination slice.
    compress(x, OneBitChunks{S, N, Wz, B, U}, send_bits_.data() + offset[k], send_scales_.data() + k);
  }
  if (W == 1) {
    shared_valid_ = false;  // the next step reads this step's momentum back through the capture
    return;
  }
  recv_bits_.zeros(Wz * B, d);
  recv_scales_.zeros(Wz * U, d);
  Communicator& c = comm();
  c.all_to_all(send_bits_.data(), recv_bits_.data(), B / 4, DType::f32);
  c.all_to_all(send_scales_.data(), recv_scales_.data(), U, DType::f32);
  // Server: the owned slice of every worker's message, averaged, compressed again.
  OneBitStore<std::uint8_t> mine, all_bits;
  OneBitStore<float> mine_scales, all_scales;
  mine.zeros(B, d);
  mine_scales.zeros(U, d);
  const std::size_t r = static_cast<std::size_t>(env_.rank);
  for (std::size_t k = 0; k < U; ++k)
    server(recv_bits_.data() + offset[k], B, recv_scales_.data() + k, units_[k].server_error.data(), real(k, r),
           slice(k), mine.data() + offset[k], mine_scales.data() + k);
  all_bits.zeros(Wz * B, d);
  all_scales.zeros(Wz * U, d);
  c.all_gather(mine.data(), all_bits.data(), B / 4, DType::f32);
  c.all_gather(mine_scales.data(), all_scales.data(), U, DType::f32);
  for (std::size_t k = 0; k < U; ++k) {
    Unit& u = units_[k];
    const std::size_t S = slice(k);
    u.bits.zeros(S / 8 * Wz, d);
    u.scales.zeros(Wz, d);
    for (std::size_t w = 0; w < Wz; ++w) {
      copy(u.bits.data() + w * S / 8, all_bits.data() + w * B + offset[k], S / 8);
      copy(u.scales.data() + w, all_scales.data() + w * U + k, sizeof(float));
    }
    decode(u.bits.data() + r * S / 8, u.scales.data() + r, OneBitChunks{S, real(k, r), 1, S / 8, 1}, u.new_m.data());
  }
  shared_valid_ = true;
}

}  // namespace zero
