// PowerSgd: low-rank compression of the gradient all-reduce with error feedback (Vogels et al.
// 2019, "PowerSGD", as PyTorch's powerSGD_hook), for stages 0 and 1 at the accumulation boundary.
//
// Every parameter of two or more dimensions is a matrix M [rows, numel / rows]; it is compressed
// where its rank-r factors are smaller than it by gradient_compression.min_compression_rate:
//   M = this rank's accumulated gradient + its error buffer;
//   P = M Q (Q: [cols, r], the previous step's, or a fixed seed's at the start); all-reduce P;
//   orthogonalize P (Gram-Schmidt in double, twice: deterministic, identical on every rank);
//   Q = M^T P; all-reduce Q (kept for the next step's warm start);
//   the reduced gradient is P Q^T, the sum over ranks of the projection of each M onto span(P),
//   identical on every rank; error = M - P Q^T / world, this rank's share of what was not sent.
// Vectors and matrices that would not shrink are all-reduced as they are, in one batch. What
// crosses the ranks per step: (rows + cols) x r factor values per compressed matrix, in fp32 or
// (gradient_compression.factor_dtype) bf16, plus the plain rest. With bf16 each rank's P and Q
// are rounded before the all-reduce and the sum after it, so every rank orthogonalizes and
// multiplies the same values, and M - P Q^T / world carries the rounding into the error buffer.
//
// The error is kept in fp32 without the loss scale (the gradients carry the step's scale, which
// dynamic fp16 scaling changes between steps). Before gradient_compression.start_step, and in a
// step whose gradient is not finite on some rank (one scalar all-reduce decides), every unit is
// all-reduced plainly and the error and Q are left untouched: the engine then skips the step
// on the overflow as it does without compression.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/unit_shape.hpp"
#include "offload/pinned_pool.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/layout.hpp"

namespace zero {

class Backend;

// The rank a parameter's gradient is compressed with, 0 where it goes plainly: a tensor of two or
// more dimensions is a [shape[0], numel / shape[0]] matrix, compressed (as PyTorch decides) where
// its rank-r factors are min_compression_rate times smaller than it. zero-plan counts with it.
int powersgd_rank(const ParamInfo& p, const GradientCompressionConfig& cfg);

class PowerSgd {
 public:
  struct Matrix {
    int unit = 0;
    std::int64_t offset = 0;  // element offset in the unit's flat storage
    std::int64_t rows = 0, cols = 0;
    int rank = 0;              // min(gradient_compression.rank, rows, cols)
    std::vector<float> q;      // [cols, rank], row-major
    std::vector<float> error;  // [rows, cols]; during reduce() it holds M
  };

  // grad_dtype: what the gradient buffers hold. Logs the plan on rank 0 when `log`.
  PowerSgd(Communicator& comm, const Layout& layout, const std::vector<UnitShape>& shapes,
           const GradientCompressionConfig& cfg, DType grad_dtype, int stage, bool log);

  // Replaces every unit's gradient (fulls[u]: the padded unit in grad_dtype, this rank's sum over
  // its micro-steps, scaled by loss_scale) with the sum over ranks: compressed from start_step on.
  // step: the engine's step() count. Returns true when it compressed.
  bool reduce(const std::vector<void*>& fulls, std::int64_t step, double loss_scale);
  // The same for gradients in `backend`'s memory. The compression runs on the host: where that
  // memory is not host-accessible (CUDA), every unit's gradient is copied to one pinned staging
  // buffer (Backend::staging_buffer, kept between steps) with one wait for all the copies,
  // reduced there and copied back without waiting (the optimizer's kernels are ordered after
  // the copies). That costs two transfers of the whole gradient per step, one host wait, and the
  // matrix products on the CPU; the arithmetic is the host backend's, bit for bit.
  bool reduce(Backend& backend, const std::vector<void*>& fulls, std::int64_t step, double loss_scale);

  const std::vector<Matrix>& matrices() const { return matrices_; }
  // The last compressed step's orthogonalized P of every matrix, back to back ([rows, rank] each).
  const std::vector<float>& last_p() const { return p_; }
  // Elements all-reduced per compressed step: the factors (factor_dtype), and the plain rest (grad dtype).
  std::int64_t factor_elements() const { return p_elems_ + q_elems_; }
  std::int64_t plain_elements() const { return plain_elems_; }

  // Checkpoint support: every matrix's Q, then every matrix's error, one flat fp32 array;
  // set_state({}) restores the start's (zero error, the seeded Q).
  std::vector<float> state() const;
  void set_state(const std::vector<float>& s);
  std::size_t state_size() const;
  // What its buffers are sized by: the elements of the compressed matrices, of their P and Q
  // factors, and of the parameters all-reduced plainly.
  struct Elements {
    std::int64_t compressed = 0, p = 0, q = 0, plain = 0;
  };
  // The host bytes those buffers take (zero-plan counts with it): every matrix's fp32 error and Q,
  // kept between steps; the fp32 P and summed Q; the plain batch in grad_dtype; and with 16-bit
  // factors their wire copy. Not the fixed conversion row, nor the host copy of the gradients a
  // backend without host-accessible memory is staged through.
  static std::size_t buffer_bytes_for(const Elements& e, DType grad_dtype, DType factor_dtype);
  // Host memory it holds: buffer_bytes_for its matrices, plus the conversion row.
  std::size_t buffer_bytes() const {
    return buffer_bytes_for({.compressed = compressed_elems_, .p = p_elems_, .q = q_elems_, .plain = plain_elems_},
                            gdt_, fdt_) +
           row_.size() * sizeof(float);
  }

 private:
  struct Run {  // a stretch of a unit's elements all-reduced plainly
    int unit;
    std::int64_t offset, len;
  };
  void plain_all(const std::vector<void*>& fulls);
  void all_reduce_factors(std::vector<float>& v, std::int64_t n);  // the first n values, summed
  void random_q(Matrix& m, std::uint64_t stream) const;

  Communicator& comm_;
  const std::vector<UnitShape>& shapes_;
  const GradientCompressionConfig cfg_;
  DType gdt_;
  DType fdt_;  // the factors' dtype on the wire
  std::vector<Matrix> matrices_;
  std::vector<Run> plain_;  // the parameters not compressed, in unit order
  std::int64_t compressed_elems_ = 0, p_elems_ = 0, q_elems_ = 0, plain_elems_ = 0;
  std::vector<float> p_, qsum_;       // every matrix's P, then Q, back to back (one all-reduce each)
  std::vector<char> plain_buf_;       // the plain parameters' gradients, back to back
  std::vector<float> row_;            // conversion scratch
  std::vector<char> wire_;            // a 16-bit factor all-reduce's buffer
  offload::PinnedBuffer host_grads_;  // the gradients' host copy where the backend's memory is not the host's
};

}  // namespace zero
