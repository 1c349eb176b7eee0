// Double-precision reference steps of the optimizers beyond Adam (Lamb, Lion, Adafactor, Muon
// with AdamW for the rest), written from their published equations, not from libzero's kernels:
//   - Lamb as DeepSpeed's FusedLamb: Adam's bias-corrected update plus decoupled decay, scaled
//     per tensor by the trust ratio ||p|| / ||u|| (1 where a norm is 0) clamped to
//     [min_coeff, max_coeff];
//   - Lion as DeepSpeed's: p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g), m = b2 m + (1 - b2) g;
//   - Adafactor as Hugging Face's transformers.optimization.Adafactor (factored second moment
//     for matrices, update clipping by RMS, relative step, parameter scale, optional beta1);
//   - Muon as torch.optim.Muon (momentum, optional Nesterov, quintic Newton-Schulz with
//     (3.4445, -4.7750, 2.0315) on the Frobenius-normalised matrix, adjust_lr_fn original or
//     match_rms_adamw) for 2-D parameters that are not embeddings; AdamW for the others.
// One tensor at a time, its state owned by the caller (TensorState); the step count t is 1-based.
// Everything is double: the differences from an fp32 engine are then the engine's rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zero::test::optref {

enum class Kind { lamb, lion, adafactor, muon };

// Hyper-parameters as the reference reads them (what the test's YAML asks for, defaults filled
// in by hand from the DeepSpeed / Hugging Face / PyTorch sources the test names).
struct Hyper {
  Kind kind = Kind::lamb;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // Lamb, Lion, Muon's AdamW part
  double eps = 1e-8;                  // Lamb, Muon's AdamW part
  double weight_decay = 0.0;
  // Lamb
  bool bias_correction = true;
  double max_coeff = 10.0, min_coeff = 0.01;
  // Adafactor
  double eps1 = 1e-30, eps2 = 1e-3, clip_threshold = 1.0, decay_rate = -0.8, af_beta1 = 0.0;
  bool scale_parameter = false, relative_step = false, warmup_init = false;
  // Muon
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  bool match_rms_adamw = false;
};

// One parameter tensor: its shape (row-major [rows, cols] for 2-D) and flags, and the state the
// optimizer keeps for it.
struct TensorState {
  std::string name;
  std::vector<std::int64_t> shape;
  bool decay = false;
  bool embedding = false;
  std::vector<double> m, v;      // Lamb / Lion (m) / AdamW moments; Adafactor's 1-D V in v
  std::vector<double> row, col;  // Adafactor's factored second moment
  std::vector<double> first;     // Adafactor's first moment (beta1 > 0)
  std::vector<double> buf;       // Muon's momentum buffer
  // What the steps saw (for the test's report).
  int clamped_min = 0, clamped_max = 0, muon_steps = 0, adamw_steps = 0;

  bool is_matrix() const { return shape.size() == 2; }
  std::int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  std::int64_t cols() const { return shape.size() == 2 ? shape[1] : shape.empty() ? 1 : shape[0]; }
};

inline double norm2(const std::vector<double>& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

inline double rms(const std::vector<double>& a) {
  return a.empty() ? 0.0 : norm2(a) / std::sqrt(static_cast<double>(a.size()));
}

// PyTorch AdamW with bias correction, decoupled decay.
inline void adamw_step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g, int t) {
  const std::size_t n = x.size();
  if (s.m.empty()) s.m.assign(n, 0.0), s.v.assign(n, 0.0);
  const double wd = s.decay ? h.weight_decay : 0.0;
  const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] *= 1.0 - h.lr * wd;
    s.m[i] = h.beta1 * s.m[i] + (1 - h.beta1) * g[i];
    s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * g[i] * g[i];
    x[i] -= h.lr / bc1 * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps);
  }
  ++s.adamw_steps;
}

inline void lamb_step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g, int t) {
  const std::size_t n = x.size();
  if (s.m.empty()) s.m.assign(n, 0.0), s.v.assign(n, 0.0);
  const double wd = s.decay ? h.weight_decay : 0.0;
  const double bc1 = h.bias_correction ? 1 - std::pow(h.beta1, t) : 1.0;
  const double bc2 = h.bias_correction ? 1 - std::pow(h.beta2, t) : 1.0;
  std::vector<double> u(n);
  for (std::size_t i = 0; i < n; ++i) {
    s.m[i] = h.beta1 * s.m[i] + (1 - h.beta1) * g[i];
    s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * g[i] * g[i];
    u[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + h.eps) + wd * x[i];
  }
  const double pn = norm2(x), un = norm2(u);
  // DeepSpeed's kernel: 1 where a norm is zero, else the ratio clamped. The test's bounds
  // enclose 1, so whether the 1 is clamped too does not matter.
  double trust = 1.0;
  if (pn > 0 && un > 0) {
    trust = pn / un;
    if (trust > h.max_coeff) trust = h.max_coeff, ++s.clamped_max;
    if (trust < h.min_coeff) trust = h.min_coeff, ++s.clamped_min;
  }
  for (std::size_t i = 0; i < n; ++i) x[i] -= h.lr * trust * u[i];
}

inline void lion_step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g) {
  const std::size_t n = x.size();
  if (s.m.empty()) s.m.assign(n, 0.0);
  const double wd = s.decay ? h.weight_decay : 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double c = h.beta1 * s.m[i] + (1 - h.beta1) * g[i];
    const double sign = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
    x[i] = x[i] * (1 - h.lr * wd) - h.lr * sign;
    s.m[i] = h.beta2 * s.m[i] + (1 - h.beta2) * g[i];
  }
}

inline void adafactor_step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g,
                           int t) {
  const std::size_t n = x.size();
  const double td = static_cast<double>(t);
  double lr_t = h.lr;
  if (h.relative_step) lr_t = std::min(h.warmup_init ? 1e-6 * td : 1e-2, 1.0 / std::sqrt(td));
  if (h.scale_parameter) lr_t *= std::max(h.eps2, rms(x));  // RMS of p before the update
  const double beta2t = 1.0 - std::pow(td, h.decay_rate);
  std::vector<double> u(n);
  if (s.is_matrix()) {
    const auto R = static_cast<std::size_t>(s.rows()), C = static_cast<std::size_t>(s.cols());
    if (s.row.empty()) s.row.assign(R, 0.0), s.col.assign(C, 0.0);
    std::vector<double> rmean(R, 0.0), cmean(C, 0.0);
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t j = 0; j < C; ++j) {
        const double sq = g[i * C + j] * g[i * C + j] + h.eps1;
        rmean[i] += sq / static_cast<double>(C);
        cmean[j] += sq / static_cast<double>(R);
      }
    for (std::size_t i = 0; i < R; ++i) s.row[i] = beta2t * s.row[i] + (1 - beta2t) * rmean[i];
    for (std::size_t j = 0; j < C; ++j) s.col[j] = beta2t * s.col[j] + (1 - beta2t) * cmean[j];
    double row_mean = 0;
    for (double r : s.row) row_mean += r / static_cast<double>(R);
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t j = 0; j < C; ++j)
        u[i * C + j] = g[i * C + j] / std::sqrt(s.row[i] / row_mean) / std::sqrt(s.col[j]);
  } else {
    if (s.v.empty()) s.v.assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      s.v[i] = beta2t * s.v[i] + (1 - beta2t) * (g[i] * g[i] + h.eps1);
      u[i] = g[i] / std::sqrt(s.v[i]);
    }
  }
  const double clip = std::max(1.0, rms(u) / h.clip_threshold);
  for (double& ui : u) ui = ui / clip * lr_t;
  if (h.af_beta1 > 0) {
    if (s.first.empty()) s.first.assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) u[i] = s.first[i] = h.af_beta1 * s.first[i] + (1 - h.af_beta1) * u[i];
  }
  const double wd = s.decay ? h.weight_decay : 0.0;
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] - wd * lr_t * x[i] - u[i];
}

// Row-major dense products for Newton-Schulz.
inline std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, std::size_t n,
                                  std::size_t k, std::size_t m) {  // [n, k] x [k, m]
  std::vector<double> c(n * m, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t l = 0; l < k; ++l) {
      const double ail = a[i * k + l];
      for (std::size_t j = 0; j < m; ++j) c[i * m + j] += ail * b[l * m + j];
    }
  return c;
}

inline std::vector<double> transpose(const std::vector<double>& a, std::size_t r, std::size_t c) {
  std::vector<double> t(a.size());
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}

// torch.optim.Muon's _zeropower_via_newtonschulz on a [rows, cols] matrix, in double.
inline std::vector<double> newton_schulz(std::vector<double> g, std::size_t rows, std::size_t cols, int steps) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tr = rows > cols;
  std::size_t r = rows, k = cols;
  if (tr) g = transpose(g, rows, cols), std::swap(r, k);
  const double nrm = std::max(norm2(g), 1e-7);
  for (double& x : g) x /= nrm;
  for (int s = 0; s < steps; ++s) {
    const std::vector<double> A = matmul(g, transpose(g, r, k), r, k, r);  // X X^T, [r, r]
    const std::vector<double> AA = matmul(A, A, r, r, r);
    std::vector<double> B(A.size());
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = b * A[i] + c * AA[i];
    const std::vector<double> BX = matmul(B, g, r, r, k);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = a * g[i] + BX[i];
  }
  if (tr) g = transpose(g, r, k);
  return g;
}

inline void muon_step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g, int t) {
  if (!s.is_matrix() || s.embedding) {
    adamw_step(h, s, x, g, t);
    return;
  }
  const std::size_t n = x.size();
  const auto rows = static_cast<std::size_t>(s.rows()), cols = static_cast<std::size_t>(s.cols());
  if (s.buf.empty()) s.buf.assign(n, 0.0);
  std::vector<double> upd(n);
  for (std::size_t i = 0; i < n; ++i) {
    s.buf[i] = h.momentum * s.buf[i] + g[i];
    upd[i] = h.nesterov ? g[i] + h.momentum * s.buf[i] : s.buf[i];
  }
  const std::vector<double> O = newton_schulz(std::move(upd), rows, cols, h.ns_steps);
  const double rd = static_cast<double>(rows), cd = static_cast<double>(cols);
  const double scale = h.match_rms_adamw ? 0.2 * std::sqrt(std::max(rd, cd)) : std::sqrt(std::max(1.0, rd / cd));
  const double wd = s.decay ? h.weight_decay : 0.0;
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] * (1 - h.lr * wd) - h.lr * scale * O[i];
  ++s.muon_steps;
}

inline void step(const Hyper& h, TensorState& s, std::vector<double>& x, const std::vector<double>& g, int t) {
  switch (h.kind) {
    case Kind::lamb: lamb_step(h, s, x, g, t); break;
    case Kind::lion: lion_step(h, s, x, g); break;
    case Kind::adafactor: adafactor_step(h, s, x, g, t); break;
    case Kind::muon: muon_step(h, s, x, g, t); break;
  }
}

}  // namespace zero::test::optref
