// The error-compensated 1-bit momentum exchange that OneBitAdam and OneBitLamb share (Tang et al.
// 2021; Li et al. 2021; DeepSpeed's compressed_allreduce), composed with ZeRO stages 1 and 2: the
// server side of the exchange is the rank that owns the slice.
//
// Each rank folds its own (unreduced) gradient into the shared momentum, m_w = b1 m + (1-b1) g_w,
// adds its worker error, and sends one sign bit per element and one scale (the RMS) per slice of
// every unit to the slice's owner; the owner averages the workers' decoded messages, adds its
// server error, compresses again and all-gathers the result, which every rank decodes into the
// shared momentum of the next step. The owner's decoded slice is this step's momentum (new_m).
//
// The shared momentum is kept on every rank as the last exchange's bits and scales (1 bit per
// element); the worker error (4 bytes per element of the whole model) and the server error (4
// per owned element) are this rank's own and are reset on resume, as DeepSpeed does. The first
// exchange (and the first after a resume) starts from the owned fp32 momentum, captured by a
// visit of the owned state and all-gathered.
//
// An optional coefficient per tensor multiplies the momentum the exchange carries (OneBitLamb's
// scaling_coeff, which evens out the tensors' magnitudes before they share a scale): the shared
// momentum and new_m are then in the scaled form.
//
// On a device backend (exchange() and capture() given one) the same sequence runs on its
// memory: every buffer lives there, the kernels are the backend's onebit_* (the host kernels'
// arithmetic) and the collectives go through its communicator, the same calls with the same
// counts as the host's, so the traffic counted is the same. A state restored before the first
// device call moves to the device then.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "optim/optimizer.hpp"

namespace zero {

// An array of the exchange's, in host memory, or in a backend's once bound to one (bind()).
// With no backend its calls are std::vector's.
template <class T>
class OneBitStore {
 public:
  T* data() { return buf_ ? buf_.template as<T>() : host_.data(); }
  const T* data() const { return buf_ ? buf_.template as<T>() : host_.data(); }
  std::size_t size() const { return buf_ ? n_ : host_.size(); }
  bool empty() const { return size() == 0; }
  // n zeros.
  void zeros(std::size_t n, Backend* d) {
    if (d == nullptr) return host_.assign(n, T{});
    if (n_ != n || !buf_) buf_ = d->alloc(std::max<std::size_t>(n, 1) * sizeof(T)), n_ = n;
    d->zero(buf_.get(), n * sizeof(T));
  }
  // At least n values, the first ones kept and the new ones zero.
  void grow(std::size_t n, Backend* d) {
    if (d == nullptr) return host_.resize(std::max(n, host_.size()));
    if (buf_ && n <= n_) return;
    Buffer b = d->alloc(std::max<std::size_t>(n, 1) * sizeof(T));  // zero-filled
    if (buf_) d->copy(b.get(), buf_.get(), n_ * sizeof(T));
    buf_ = std::move(b), n_ = n;
  }
  void clear() {
    std::vector<T>().swap(host_);
    buf_ = Buffer{}, n_ = 0;
  }
  // The values, copied to the host; and n of them from host memory.
  std::vector<T> to_host(Backend* d) const {
    if (d == nullptr || !buf_) return host_;
    std::vector<T> v(n_);
    d->to_host(v.data(), buf_.get(), n_ * sizeof(T));
    return v;
  }
  void from_host(const T* src, std::size_t n, Backend* d) {
    if (d == nullptr) return host_.assign(src, src + n);
    zeros(n, d);
    if (n > 0) d->from_host(buf_.get(), src, n * sizeof(T));
  }
  // Moves host values to d's memory.
  void bind(Backend* d) {
    if (d == nullptr || buf_ || host_.empty()) return;
    std::vector<T> v;
    v.swap(host_);
    from_host(v.data(), v.size(), d);
  }

 private:
  std::vector<T> host_;
  Buffer buf_;
  std::size_t n_ = 0;
};

class OneBitExchange {
 public:
  explicit OneBitExchange(const OptimizerEnv& env);
  // The shared momentum of the last exchange is at hand; when not, the optimizer asks for a
  // capture visit (Optimizer::wants_capture) before the next exchange.
  bool shared_valid() const { return shared_valid_; }
  // A capture visit's run: its owned momentum (r.state[0], unscaled; in `device`'s memory when
  // not null).
  void capture(const OptimRun& r, Backend* device = nullptr);
  // The errors start again from zero and the next exchange from a capture (a resume without
  // this rank's state: another world size, an older checkpoint).
  void reset();
  // This rank's own state, for the checkpoint's per-rank record: per unit the worker error, the
  // server error, and the last exchange's scales and bits (the bits 4 to a float), then 1 when
  // an exchange has run (else every value is 0). Empty at world size 1, which keeps none.
  // set_state() takes what state() gave at the same world size and slicing ({}: reset()).
  std::size_t state_size() const;
  std::vector<float> state() const;
  void set_state(const std::vector<float>& s);
  // Host bytes it keeps from its first exchange on, for units of `slices` elements per rank
  // slice over `world` ranks: the worker and server errors, the shared momentum's bits and
  // scales, this step's owned momentum, the decoded shared momentum of the largest unit, and the
  // messages' send and receive buffers (zero-plan counts them: optimizer_buffer_bytes). bytes():
  // what it holds now, the same after an exchange.
  static std::int64_t bytes_for(const std::vector<std::int64_t>& slices, int world);
  std::int64_t bytes() const;
  // One step's exchange of every unit's padded local gradient `full` (the accumulation dtype),
  // scaled by grad_scale; `coeff`, when not null, holds one multiplier per tensor (global index).
  // Four collectives a step whatever the units: one all-to-all of the bits (and one of their
  // scales) to the owners, one all-gather of the owners' bits (and one of their scales).
  // `device`: the backend whose memory holds `full` and the state (null: host memory).
  void exchange(const std::vector<const void*>& full, DType type, float b1, float grad_scale,
                const std::vector<float>* coeff, Backend* device = nullptr);
  // This step's momentum of the owned slice of unit u (scaled form when coeff was given; in the
  // device's memory after a device exchange).
  const float* new_m(int unit) const { return units_[static_cast<std::size_t>(unit)].new_m.data(); }

 private:
  struct Unit {
    std::int64_t numel = 0;
    OneBitStore<float> worker_error, server_error;  // padded unit; owned slice
    OneBitStore<std::uint8_t> bits;                 // the last exchange's result, every slice
    OneBitStore<float> scales;                      // its scale per slice
    OneBitStore<float> owned_m, new_m;              // captured momentum; this step's, owned slice
  };
  // A run of a unit's elements [begin, end) whose momentum the coefficient `coeff` multiplies.
  struct Span {
    std::size_t begin, end;
    float coeff;
  };
  std::vector<Span> spans(std::size_t k, const std::vector<float>* coeff) const;
  std::size_t slice(std::size_t k) const { return static_cast<std::size_t>(env_.slice[k]); }
  // The real (not padding) elements of unit k's slice c.
  std::size_t real(std::size_t k, std::size_t c) const;
  // The arrays move to `device`'s memory (null: stay on the host) for good.
  void bind(Backend* device);
  // The collectives' communicator: the host one, or the device backend's over the same ranks.
  Communicator& comm() const;
  // The kernels, on the host or on device_: offload::onebit_*'s chunk by chunk, or the
  // backend's chunked forms (OneBitChunks).
  void worker(float* x, const float* shared, const void* g, DType type, std::size_t n, float b1, float one_minus_b1,
              float grad_scale, bool add_error) const;
  void compress(float* x, const OneBitChunks& c, std::uint8_t* bits, float* scales) const;
  void decode(const std::uint8_t* bits, const float* scales, const OneBitChunks& c, float* out) const;
  // worker w's scale at worker_scales[w x units].
  void server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales, float* error,
              std::size_t n, std::size_t chunk, std::uint8_t* bits, float* scale) const;
  // dst = src, n values of the arrays' memory.
  void copy(void* dst, const void* src, std::size_t bytes) const;

  OptimizerEnv env_;
  std::vector<int> first_;  // per unit: the global index of its first tensor
  std::vector<Unit> units_;
  bool shared_valid_ = false;
  Backend* device_ = nullptr;  // where the arrays live (null: host memory)
  OneBitStore<float> shared_, send_scales_, recv_scales_;
  OneBitStore<std::uint8_t> send_bits_, recv_bits_;
};

}  // namespace zero
