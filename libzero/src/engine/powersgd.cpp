// PowerSGD compression of the stage-0/1 gradient all-reduce (see engine/powersgd.hpp).
#include "engine/powersgd.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/backend.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

constexpr std::size_t kChunk = 4096;  // elements converted at a time

// splitmix64: a fixed, portable generator, so Q's start is the same on every rank and machine.
std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Orthonormalizes the columns of p [rows, r] (row-major) in place: modified Gram-Schmidt in
// double, each column projected out twice ("twice is enough" for orthogonality to rounding). A
// column that is (numerically) in the span of the earlier ones, or zero, becomes zero: that
// direction is then not sent and stays in the error buffers.
void orthogonalize(float* p, std::int64_t rows, int r, std::vector<double>& cols) {
  const std::size_t n = static_cast<std::size_t>(rows);
  cols.assign(n * static_cast<std::size_t>(r), 0.0);
  for (int k = 0; k < r; ++k)
    for (std::size_t i = 0; i < n; ++i)
      cols[static_cast<std::size_t>(k) * n + i] = p[i * static_cast<std::size_t>(r) + static_cast<std::size_t>(k)];
  for (int k = 0; k < r; ++k) {
    double* c = cols.data() + static_cast<std::size_t>(k) * n;
    double before = 0.0;
    for (std::size_t i = 0; i < n; ++i) before += c[i] * c[i];
    for (int pass = 0; pass < 2; ++pass)
      for (int j = 0; j < k; ++j) {
        const double* o = cols.data() + static_cast<std::size_t>(j) * n;
        double dot = 0.0;
        for (std::size_t i = 0; i < n; ++i) dot += o[i] * c[i];
        for (std::size_t i = 0; i < n; ++i) c[i] -= dot * o[i];
      }
    double after = 0.0;
    for (std::size_t i = 0; i < n; ++i) after += c[i] * c[i];
    const bool keep = std::isfinite(after) && after > 0.0 && after > 1e-24 * before;
    const double inv = keep ? 1.0 / std::sqrt(after) : 0.0;
    for (std::size_t i = 0; i < n; ++i) c[i] *= inv;
  }
  for (int k = 0; k < r; ++k)
    for (std::size_t i = 0; i < n; ++i)
      p[i * static_cast<std::size_t>(r) + static_cast<std::size_t>(k)] =
          static_cast<float>(cols[static_cast<std::size_t>(k) * n + i]);
}

// The 16-bit wire copy of P or Q, whichever is larger; fp32 factors go from P and Q themselves.
std::size_t wire_elements(std::int64_t p, std::int64_t q, DType factor_dtype) {
  return factor_dtype == DType::f32 ? 0 : static_cast<std::size_t>(std::max(p, q));
}

}  // namespace

std::size_t PowerSgd::buffer_bytes_for(const Elements& e, DType grad_dtype, DType factor_dtype) {
  // The error ([rows, cols]) and Q ([cols, r]) of every matrix, then P and the summed Q.
  const auto floats = static_cast<std::size_t>(e.compressed + e.q + e.p + e.q);
  return floats * sizeof(float) + static_cast<std::size_t>(e.plain) * dtype_size(grad_dtype) +
         wire_elements(e.p, e.q, factor_dtype) * dtype_size(factor_dtype);
}

int powersgd_rank(const ParamInfo& p, const GradientCompressionConfig& cfg) {
  const std::int64_t rows = p.shape.size() >= 2 ? p.shape[0] : 0;
  const std::int64_t cols = rows > 0 ? p.numel / rows : 0;
  const int r = static_cast<int>(std::min<std::int64_t>({cfg.rank, rows, cols}));
  const bool compress =
      rows > 0 && r > 0 &&
      static_cast<double>((rows + cols) * r) * cfg.min_compression_rate < static_cast<double>(rows * cols);
  return compress ? r : 0;
}

PowerSgd::PowerSgd(Communicator& comm, const Layout& layout, const std::vector<UnitShape>& shapes,
                   const GradientCompressionConfig& cfg, DType grad_dtype, int stage, bool log)
    : comm_(comm), shapes_(shapes), cfg_(cfg), gdt_(grad_dtype), fdt_(cfg.factor_dtype) {
  ZERO_CHECK(stage <= 1, fmt::format("gradient_compression: PowerSGD applies to stages 0 and 1, not stage {}: stages "
                                     "2 and 3 reduce-scatter the gradient, and a low-rank product cannot be "
                                     "reduce-scattered; use stage 0 or 1",
                                     stage));
  ZERO_CHECK(fdt_ == DType::f32 || fdt_ == DType::bf16,
             fmt::format("gradient_compression.factor_dtype = {}: the factors go as fp32 or bf16", dtype_name(fdt_)));
  ZERO_CHECK(cfg.rank >= 1,
             fmt::format("gradient_compression.rank = {}: PowerSGD needs a rank of at least 1", cfg.rank));
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const ParamInfo& p : layout.unit(u).params) {
      const int r = powersgd_rank(p, cfg);
      if (r == 0) {
        if (!plain_.empty() && plain_.back().unit == u && plain_.back().offset + plain_.back().len == p.offset)
          plain_.back().len += p.numel;
        else
          plain_.push_back({u, p.offset, p.numel});
        plain_elems_ += p.numel;
        continue;
      }
      const std::int64_t rows = p.shape[0], cols = p.numel / rows;
      Matrix m;
      m.unit = u;
      m.offset = p.offset;
      m.rows = rows;
      m.cols = cols;
      m.rank = r;
      m.error.assign(static_cast<std::size_t>(rows * cols), 0.0f);
      random_q(m, matrices_.size());
      p_elems_ += rows * r;
      q_elems_ += cols * r;
      compressed_elems_ += rows * cols;
      matrices_.push_back(std::move(m));
    }
  }
  // Sized as buffer_bytes_for counts them.
  p_.resize(static_cast<std::size_t>(p_elems_));
  qsum_.resize(static_cast<std::size_t>(q_elems_));
  plain_buf_.resize(static_cast<std::size_t>(plain_elems_) * dtype_size(gdt_));
  wire_.resize(wire_elements(p_elems_, q_elems_, fdt_) * dtype_size(fdt_));
  row_.resize(kChunk);
  if (log) {
    const double plain_bytes =
        static_cast<double>(compressed_elems_ + plain_elems_) * static_cast<double>(dtype_size(gdt_));
    const double sent = static_cast<double>(factor_elements()) * static_cast<double>(dtype_size(fdt_)) +
                        static_cast<double>(plain_elems_) * static_cast<double>(dtype_size(gdt_));
    log_info(
        "gradient_compression: PowerSGD rank {} from step {}: {} matrices compressed ({} elements) into {} "
        "{} factor elements, {} elements all-reduced plainly; {} all-reduced per step instead of {} ({:.1f}x "
        "fewer){}",
        cfg.rank, cfg.start_step, matrices_.size(), compressed_elems_, factor_elements(), dtype_name(fdt_),
        plain_elems_, format_bytes(static_cast<std::uint64_t>(sent)),
        format_bytes(static_cast<std::uint64_t>(plain_bytes)), sent > 0 ? plain_bytes / sent : 0.0,
        stage == 1 ? "; stage 1: the factors are all-reduced (no reduce-scatter), each rank keeps its slice" : "");
  }
}

void PowerSgd::random_q(Matrix& m, std::uint64_t stream) const {
  std::uint64_t s = 0x5EED0F9A2D3C4B1Full ^ (stream * 0xD1B54A32D192ED03ull);
  m.q.resize(static_cast<std::size_t>(m.cols * m.rank));
  for (float& v : m.q) v = static_cast<float>(static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

void PowerSgd::all_reduce_factors(std::vector<float>& v, std::int64_t n) {
  if (n == 0) return;
  const std::size_t c = static_cast<std::size_t>(n);
  if (fdt_ == DType::f32) {
    comm_.all_reduce(v.data(), c, DType::f32);
    return;
  }
  // Each rank's factors rounded to 16 bits, the sum rounded again: every rank then computes
  // with the same rounded values, and the error buffers keep what the rounding lost.
  convert(v.data(), DType::f32, wire_.data(), fdt_, c);
  comm_.all_reduce(wire_.data(), c, fdt_);
  convert(wire_.data(), fdt_, v.data(), DType::f32, c);
}

void PowerSgd::plain_all(const std::vector<void*>& fulls) {
  std::vector<Work> works;
  for (std::size_t u = 0; u < fulls.size(); ++u)
    works.push_back(comm_.all_reduce_async(fulls[u], static_cast<std::size_t>(shapes_[u].padded), gdt_, ReduceOp::sum));
  for (auto& w : works) w.wait();
}

bool PowerSgd::reduce(const std::vector<void*>& fulls, std::int64_t step, double loss_scale) {
  const CommSiteScope site("reduce (PowerSGD)");
  if (step < cfg_.start_step) {
    plain_all(fulls);
    return false;
  }
  const std::size_t ge = dtype_size(gdt_);
  auto at = [&](int unit, std::int64_t offset) {
    return static_cast<char*>(fulls[static_cast<std::size_t>(unit)]) + static_cast<std::size_t>(offset) * ge;
  };
  // Overflow first: a non-finite gradient on any rank reduces plainly (the engine then skips
  // the step) and leaves the error and Q as they were.
  bool finite = true;
  for (std::size_t u = 0; u < fulls.size() && finite; ++u)
    for (std::size_t b = 0; b < static_cast<std::size_t>(shapes_[u].numel) && finite; b += kChunk) {
      const std::size_t n = std::min(kChunk, static_cast<std::size_t>(shapes_[u].numel) - b);
      convert(static_cast<const char*>(fulls[u]) + b * ge, gdt_, row_.data(), DType::f32, n);
      for (std::size_t k = 0; k < n; ++k) finite = finite && std::isfinite(row_[k]);
    }
  if (comm_.all_reduce_scalar(finite ? 0.0 : 1.0, ReduceOp::max) != 0.0) {
    plain_all(fulls);
    return false;
  }

  // The plain rest goes out first and completes while the factors are computed.
  std::size_t pos = 0;
  for (const Run& r : plain_) {
    std::memcpy(plain_buf_.data() + pos, at(r.unit, r.offset), static_cast<std::size_t>(r.len) * ge);
    pos += static_cast<std::size_t>(r.len) * ge;
  }
  Work plain_work;
  if (plain_elems_ > 0)
    plain_work = comm_.all_reduce_async(plain_buf_.data(), static_cast<std::size_t>(plain_elems_), gdt_, ReduceOp::sum);

  // M = gradient + loss_scale x error (held in the error buffer), then P = M Q.
  const float scale = static_cast<float>(loss_scale);
  std::size_t po = 0;
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& m = matrices_[i];
    if (!cfg_.warm_start) random_q(m, i ^ (static_cast<std::uint64_t>(step + 1) << 32));
    const std::size_t n = m.error.size();
    const char* g = at(m.unit, m.offset);
    for (std::size_t b = 0; b < n; b += kChunk) {
      const std::size_t c = std::min(kChunk, n - b);
      convert(g + b * ge, gdt_, row_.data(), DType::f32, c);
      float* e = m.error.data() + b;
      for (std::size_t k = 0; k < c; ++k) e[k] = row_[k] + scale * e[k];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m.rows), m.rank, static_cast<int>(m.cols),
                1.0f, m.error.data(), static_cast<int>(m.cols), m.q.data(), m.rank, 0.0f, p_.data() + po, m.rank);
    po += static_cast<std::size_t>(m.rows * m.rank);
  }
  all_reduce_factors(p_, p_elems_);

  // Orthogonalize P (the same input on every rank gives the same P), then Q = M^T P.
  std::vector<double> work;
  po = 0;
  std::size_t qo = 0;
  for (Matrix& m : matrices_) {
    float* p = p_.data() + po;
    orthogonalize(p, m.rows, m.rank, work);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m.cols), m.rank, static_cast<int>(m.rows),
                1.0f, m.error.data(), static_cast<int>(m.cols), p, m.rank, 0.0f, qsum_.data() + qo, m.rank);
    po += static_cast<std::size_t>(m.rows * m.rank);
    qo += static_cast<std::size_t>(m.cols * m.rank);
  }
  all_reduce_factors(qsum_, q_elems_);

  // The reduced gradient P Q^T and this rank's new error. Written out as loops, not a BLAS
  // call: every rank must produce the same bits from the same P and Q, whatever its BLAS
  // kernel or thread count, or the replicas of stage 0 would drift apart.
  const float inv_world = 1.0f / static_cast<float>(comm_.size());
  const float inv_scale = 1.0f / scale;
  po = 0;
  qo = 0;
  for (Matrix& m : matrices_) {
    const float* p = p_.data() + po;
    std::copy_n(qsum_.data() + qo, m.q.size(), m.q.begin());
    const float* q = m.q.data();
    const int r = m.rank;
    const std::int64_t cols = m.cols;
    char* g = at(m.unit, m.offset);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < m.rows; ++i) {
      float out[kChunk];
      float* e = m.error.data() + i * cols;
      for (std::int64_t b = 0; b < cols; b += static_cast<std::int64_t>(kChunk)) {
        const std::int64_t c = std::min<std::int64_t>(static_cast<std::int64_t>(kChunk), cols - b);
        for (std::int64_t j = 0; j < c; ++j) {
          float s = 0.0f;
          for (int k = 0; k < r; ++k) s += p[i * r + k] * q[(b + j) * r + k];
          out[j] = s;
          e[b + j] = (e[b + j] - s * inv_world) * inv_scale;
        }
        convert(out, DType::f32, g + static_cast<std::size_t>(i * cols + b) * ge, gdt_, static_cast<std::size_t>(c));
      }
    }
    po += static_cast<std::size_t>(m.rows * r);
    qo += static_cast<std::size_t>(m.cols * r);
  }

  plain_work.wait();
  pos = 0;
  for (const Run& r : plain_) {
    std::memcpy(at(r.unit, r.offset), plain_buf_.data() + pos, static_cast<std::size_t>(r.len) * ge);
    pos += static_cast<std::size_t>(r.len) * ge;
  }
  return true;
}

bool PowerSgd::reduce(Backend& backend, const std::vector<void*>& fulls, std::int64_t step, double loss_scale) {
  if (backend.host_accessible()) return reduce(fulls, step, loss_scale);
  const std::size_t ges = dtype_size(gdt_);
  std::size_t total = 0;
  for (const auto& s : shapes_) total += static_cast<std::size_t>(s.padded) * ges;
  // One pinned buffer, kept from step to step. The previous step's copies back from it are
  // still ordered before this step's copies out (the same stream), and the host writes it only
  // after the wait below.
  if (host_grads_.size() < total) {
    if (host_grads_) backend.wait_copies();  // the old buffer may still feed the last copies back
    host_grads_ = backend.staging_buffer(total);
  }
  std::vector<void*> staged;
  std::size_t at = 0;
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    const std::size_t bytes = static_cast<std::size_t>(shapes_[i].padded) * ges;
    backend.to_host_async(host_grads_.as<char>() + at, fulls[i], bytes);
    staged.push_back(host_grads_.as<char>() + at);
    at += bytes;
  }
  backend.wait_copies();  // the step's one wait: every unit's accumulated gradient is on the host
  const bool compressed = reduce(staged, step, loss_scale);
  at = 0;
  for (std::size_t i = 0; i < fulls.size(); ++i) {
    const std::size_t bytes = static_cast<std::size_t>(shapes_[i].padded) * ges;
    backend.from_host_async(fulls[i], host_grads_.as<char>() + at, bytes);  // ordered before the optimizer
    at += bytes;
  }
  return compressed;
}

std::size_t PowerSgd::state_size() const {
  std::size_t n = 0;
  for (const Matrix& m : matrices_) n += m.q.size() + m.error.size();
  return n;
}

std::vector<float> PowerSgd::state() const {
  std::vector<float> s;
  s.reserve(state_size());
  for (const Matrix& m : matrices_) s.insert(s.end(), m.q.begin(), m.q.end());
  for (const Matrix& m : matrices_) s.insert(s.end(), m.error.begin(), m.error.end());
  return s;
}

void PowerSgd::set_state(const std::vector<float>& s) {
  if (s.empty()) {
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      std::fill(matrices_[i].error.begin(), matrices_[i].error.end(), 0.0f);
      random_q(matrices_[i], i);
    }
    return;
  }
  ZERO_CHECK(s.size() == state_size(),
             fmt::format("PowerSGD state: {} values given, this model's matrices hold {}", s.size(), state_size()));
  auto it = s.begin();
  for (Matrix& m : matrices_) {
    std::copy_n(it, m.q.size(), m.q.begin());
    it += static_cast<std::ptrdiff_t>(m.q.size());
  }
  for (Matrix& m : matrices_) {
    std::copy_n(it, m.error.size(), m.error.begin());
    it += static_cast<std::ptrdiff_t>(m.error.size());
  }
}

}  // namespace zero
