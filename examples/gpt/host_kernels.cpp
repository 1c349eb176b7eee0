#include "gpt/host_kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace zero::gpt::host {

namespace {

// Matrix products go to OpenBLAS, which threads them itself; they are therefore never called
// from inside an OpenMP parallel region (the pthread OpenBLAS would oversubscribe the cores).
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B, int ldb,
          double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Column sums and other per-column reductions over N rows are split into column chunks, one
// per task: no two threads write the same gradient element, and the summation order (rows in
// order) does not depend on the thread count, so results are reproducible run to run.
constexpr int kColumnChunk = 64;

// body(c0, c1) for each chunk of columns [c0, c1) of C, the chunks in parallel.
template <class Body>
void column_chunks(int C, Body&& body) {
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for
  for (int k = 0; k < chunks; ++k) body(k * kColumnChunk, std::min(C, (k + 1) * kColumnChunk));
}

inline std::size_t idx(std::size_t row, std::size_t width) { return row * width; }

template <class T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)

// exp for the fp32 hot loops. The libm call is scalar (it cannot be vectorised without
// -ffast-math) and tanh through it was a third of a training step's time. This one is plain
// arithmetic the compiler vectorises: e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2,
// and e^r by its degree-6 Taylor polynomial (truncation r^7/7! < 1.3e-7, about one ulp). The
// double instantiation, which the gradient tests use, keeps std::exp.
inline float exp_fast(float x) {
  // NaN in, NaN out. The clamp alone would pass a NaN on to the float-to-int conversion below,
  // which is undefined for NaN (diverged weights, a denormal loss scale); the select keeps the
  // loop vectorisable.
  const float in = x;
  x = std::min(std::max(x, -87.0f), 88.0f);
  x = x == x ? x : 0.0f;
  // Round to nearest by the 1.5 * 2^23 trick: pure float adds, no rounding-mode instruction.
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 split hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  return in == in ? p * std::bit_cast<float>(bits) : in;
}
inline double exp_fast(double x) { return std::exp(x); }

// tanh(u) = sign(u) (1 - e^{-2|u|}) / (1 + e^{-2|u|}); absolute error ~1e-7, which is what
// GELU needs (its value is 0.5 x (1 + tanh), so relative accuracy near 0 does not matter).
template <class T>
inline T tanh_fast(T u) {
  const T e = exp_fast(T(-2) * std::abs(u));
  const T t = (T(1) - e) / (T(1) + e);
  return u < T(0) ? -t : t;
}

}  // namespace

// A token's row in this rank's part of wte, or null when the id lies outside it.
template <class T>
inline T* vocab_row(T* wte, std::int32_t token, int C, int row0, int rows) {
  const std::int64_t r = static_cast<std::int64_t>(token) - row0;
  if (rows >= 0 && (r < 0 || r >= rows)) return nullptr;
  return wte + idx(static_cast<std::size_t>(r), C);
}

template <class T>
void encoder_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C, int row0,
                     int rows) {
#pragma omp parallel for
  for (int n = 0; n < B * T_; ++n) {
    const T* e = vocab_row(wte, tokens[n], C, row0, rows);
    const T* p = wpe ? wpe + idx(n % T_, C) : nullptr;
    T* o = out + idx(n, C);
    for (int c = 0; c < C; ++c) o[c] = (e ? e[c] : T(0)) + (p ? p[c] : T(0));
  }
}

template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int T_, int C, int row0,
                      int rows) {
  column_chunks(C, [&](int c0, int c1) {
    for (int n = 0; n < B * T_; ++n) {
      const T* d = dout + idx(n, C);
      T* e = vocab_row(dwte, tokens[n], C, row0, rows);
      T* p = dwpe ? dwpe + idx(n % T_, C) : nullptr;
      for (int c = c0; c < c1; ++c) {
        if (e) e[c] += d[c];
        if (p) p[c] += d[c];
      }
    }
  });
}

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C) {
  const T eps = T(1e-5);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + idx(n, C);
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += x[c];
    m /= T(C);
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= T(C);
    const T s = T(1) / std::sqrt(v + eps);
    T* o = out + idx(n, C);
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + idx(n, C);
    const T* dy = dout + idx(n, C);
    const T m = mean[n], s = rstd[n];
    // d(norm) = dy * w; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    T a = 0, bn = 0;
#pragma omp simd reduction(+ : a, bn)
    for (int c = 0; c < C; ++c) {
      const T dn = dy[c] * w[c];
      a += dn;
      bn += dn * (x[c] - m) * s;
    }
    a /= T(C);
    bn /= T(C);
    T* dx = dinp + idx(n, C);
    for (int c = 0; c < C; ++c) dx[c] += (dy[c] * w[c] - a - (x[c] - m) * s * bn) * s;
  }
  column_chunks(C, [&](int c0, int c1) {
    for (int n = 0; n < N; ++n) {
      const T* x = inp + idx(n, C);
      const T* dy = dout + idx(n, C);
      const T m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c] += dy[c] * (x[c] - m) * s;
        db[c] += dy[c];
      }
    }
  });
}

template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  if (bias) {
#pragma omp parallel for
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + idx(n, OC));
  }
  gemm(false, false, N, OC, C, T(1), inp, C, w, OC, bias ? T(1) : T(0), out, OC);
}

template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C, int OC) {
  if (dinp) gemm(false, true, N, C, OC, T(1), dout, OC, w, OC, T(1), dinp, C);
  gemm(true, false, C, OC, N, T(1), inp, C, dout, OC, T(1), dw, OC);
  if (dbias) {
    column_chunks(OC, [&](int c0, int c1) {
      for (int n = 0; n < N; ++n) {
        const T* d = dout + idx(n, OC);
        for (int c = c0; c < c1; ++c) dbias[c] += d[c];
      }
    });
  }
}

// Attention over this rank's heads (AttentionShape in attention_shape.hpp): qkv rows are q (NH heads), k and
// v (NKV heads each); query head h reads key/value head h % NKV. With ALiBi the score of query t
// and key t2 gets -slope (t - t2), slope that of the head's place in the model.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, const AttentionShape& s) {
  const int hs = s.hs, NH = s.NH, T_ = s.T;
  const std::size_t W = static_cast<std::size_t>(s.qkv_width()), C = static_cast<std::size_t>(s.width());
  const std::size_t k0 = C, v0 = C + static_cast<std::size_t>(s.NKV) * hs;
  const T scale = T(1) / std::sqrt(T(hs));
#pragma omp parallel for collapse(2)
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const std::size_t kv = static_cast<std::size_t>(h % s.NKV) * hs;
      const T slope = s.alibi_heads ? static_cast<T>(alibi_slope(s.head0 + h, s.alibi_heads)) : T(0);
      for (int t = 0; t < T_; ++t) {
        const T* q = qkv + idx(b * T_ + t, W) + h * hs;
        T* a = att + idx((b * NH + h) * T_ + t, T_);
        T mx = -std::numeric_limits<T>::infinity();
        for (int t2 = 0; t2 <= t; ++t2) {
          const T* k = qkv + idx(b * T_ + t2, W) + k0 + kv;
          T d = 0;
#pragma omp simd reduction(+ : d)
          for (int i = 0; i < hs; ++i) d += q[i] * k[i];
          a[t2] = d * scale - slope * T(t - t2);
          mx = std::max(mx, a[t2]);
        }
        T sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = exp_fast(a[t2] - mx);
          sum += a[t2];
        }
        const T inv = T(1) / sum;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T_; ++t2) a[t2] = 0;
        T* o = out + idx(b * T_ + t, C) + h * hs;
        std::fill(o, o + hs, T(0));
        for (int t2 = 0; t2 <= t; ++t2) {
          const T* v = qkv + idx(b * T_ + t2, W) + v0 + kv;
          const T p = a[t2];
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

template <class T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, const AttentionShape& s) {
  const int hs = s.hs, NH = s.NH, NKV = s.NKV, T_ = s.T;
  const std::size_t W = static_cast<std::size_t>(s.qkv_width()), C = static_cast<std::size_t>(s.width());
  const std::size_t k0 = C, v0 = C + static_cast<std::size_t>(NKV) * hs;
  const T scale = T(1) / std::sqrt(T(hs));
  // Each (b, g) task writes only the columns of key/value head g and of its query heads in batch
  // b's rows of dqkv: no races, and the order of the additions is fixed.
#pragma omp parallel for collapse(2)
  for (int b = 0; b < s.B; ++b) {
    for (int g = 0; g < NKV; ++g) {
      const std::size_t kv = static_cast<std::size_t>(g) * hs;
      for (int h = g; h < NH; h += NKV) {
        for (int t = 0; t < T_; ++t) {
          const T* a = att + idx((b * NH + h) * T_ + t, T_);
          T* da = datt + idx((b * NH + h) * T_ + t, T_);
          const T* dy = dout + idx(b * T_ + t, C) + h * hs;
          const T* q = qkv + idx(b * T_ + t, W) + h * hs;
          T* dq = dqkv + idx(b * T_ + t, W) + h * hs;
          // Through out = att v: gradients of the probabilities and of v.
          for (int t2 = 0; t2 <= t; ++t2) {
            const T* v = qkv + idx(b * T_ + t2, W) + v0 + kv;
            T* dv = dqkv + idx(b * T_ + t2, W) + v0 + kv;
            T d = 0;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < hs; ++i) d += dy[i] * v[i];
            da[t2] = d;
            for (int i = 0; i < hs; ++i) dv[i] += a[t2] * dy[i];
          }
          // Through the softmax: dpre = a * (da - sum(a * da)); then through s = q.k * scale (the
          // ALiBi term is constant).
          T ad = 0;
          for (int t2 = 0; t2 <= t; ++t2) ad += a[t2] * da[t2];
          for (int t2 = 0; t2 <= t; ++t2) {
            const T dpre = a[t2] * (da[t2] - ad) * scale;
            const T* k = qkv + idx(b * T_ + t2, W) + k0 + kv;
            T* dk = dqkv + idx(b * T_ + t2, W) + k0 + kv;
            for (int i = 0; i < hs; ++i) {
              dq[i] += dpre * k[i];
              dk[i] += dpre * q[i];
            }
          }
        }
      }
    }
  }
}

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + idx(n, C);
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) ss += x[c] * x[c];
    const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    T* o = out + idx(n, C);
    for (int c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* x = inp + idx(n, C);
    const T* dy = dout + idx(n, C);
    const T r = rstd[n];
    // dx = r (dn - x r^2 mean(dn x)), dn = dy w
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += dy[c] * w[c] * x[c];
    m = m / T(C) * r * r;
    T* dx = dinp + idx(n, C);
    for (int c = 0; c < C; ++c) dx[c] += r * (dy[c] * w[c] - x[c] * m);
  }
  column_chunks(C, [&](int c0, int c1) {
    for (int n = 0; n < N; ++n) {
      const T* x = inp + idx(n, C);
      const T* dy = dout + idx(n, C);
      for (int c = c0; c < c1; ++c) dw[c] += dy[c] * x[c] * rstd[n];
    }
  });
}

// Rotary positions on the q and k heads (the first NH + NKV heads of each qkv row): dimensions i
// and i + hs/2 of a head at position t turn by t theta^(-2i/hs), as Hugging Face's rotate-half
// does. sign -1 turns back (the backward: the rotation's transpose).
template <class T>
void rotary(T* qkv, const AttentionShape& s, double theta, int sign) {
  const int half = s.hs / 2, heads = s.NH + s.NKV;
  const std::size_t W = static_cast<std::size_t>(s.qkv_width());
#pragma omp parallel for
  for (int t = 0; t < s.T; ++t) {
    std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
    for (int i = 0; i < half; ++i) {
      const double angle = t * std::pow(theta, -2.0 * i / s.hs);
      cs[static_cast<std::size_t>(i)] = static_cast<T>(std::cos(angle));
      sn[static_cast<std::size_t>(i)] = static_cast<T>(sign * std::sin(angle));
    }
    for (int b = 0; b < s.B; ++b) {
      T* row = qkv + idx(b * s.T + t, W);
      for (int h = 0; h < heads; ++h) {
        T* x = row + h * s.hs;
        for (int i = 0; i < half; ++i) {
          const T x1 = x[i], x2 = x[i + half], c = cs[static_cast<std::size_t>(i)], n = sn[static_cast<std::size_t>(i)];
          x[i] = x1 * c - x2 * n;
          x[i + half] = x2 * c + x1 * n;
        }
      }
    }
  }
}

template <class T>
void swiglu_forward(T* out, const T* inp, int N, int F) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* g = inp + idx(n, 2 * static_cast<std::size_t>(F));
    const T* u = g + F;
    T* o = out + idx(n, F);
    for (int i = 0; i < F; ++i) o[i] = g[i] / (T(1) + exp_fast(-g[i])) * u[i];
  }
}

template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int N, int F) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* g = inp + idx(n, 2 * static_cast<std::size_t>(F));
    const T* u = g + F;
    const T* dy = dout + idx(n, F);
    T* dg = dinp + idx(n, 2 * static_cast<std::size_t>(F));
    T* du = dg + F;
    for (int i = 0; i < F; ++i) {
      const T sg = T(1) / (T(1) + exp_fast(-g[i]));
      du[i] = dy[i] * g[i] * sg;
      dg[i] = dy[i] * u[i] * sg * (T(1) + g[i] * (T(1) - sg));
    }
  }
}

template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n) {
#pragma omp parallel for simd
  for (std::size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
    out[i] = T(0.5) * x * (T(1) + tanh_fast(u));
  }
}

// d GELU(x) / dx for the tanh approximation.
template <class T>
inline T gelu_grad(T x) {
  const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
  const T th = tanh_fast(u);
  const T du = kGeluScale<T> * (T(1) + T(3 * 0.044715) * x * x);
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n) {
#pragma omp parallel for simd
  for (std::size_t i = 0; i < n; ++i) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

template <class T>
void gelu_backward_inplace(T* d, const T* inp, std::size_t n) {
#pragma omp parallel for simd
  for (std::size_t i = 0; i < n; ++i) d[i] = gelu_grad(inp[i]) * d[i];
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n) {
#pragma omp parallel for
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void logits_forward(T* logits, const T* x, const T* wte, int N, int C, int Vp) {
  gemm(false, true, N, Vp, C, T(1), x, C, wte, C, T(0), logits, Vp);
}

template <class T>
void logits_backward(T* dx, T* dwte, const T* dlogits, const T* x, const T* wte, int N, int C, int Vp) {
  gemm(false, false, N, C, Vp, T(1), dlogits, Vp, wte, C, T(1), dx, C);
  gemm(true, false, Vp, C, N, T(1), dlogits, Vp, x, C, T(1), dwte, C);
}

template <class T>
void softmax_cross_entropy(T* losses, T* dlogits, const T* logits, const std::int32_t* targets, int N, int V, int Vp,
                           T dloss) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* l = logits + idx(n, Vp);
    T mx = -std::numeric_limits<T>::infinity();
    for (int v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    // The normaliser sums up to 50k terms: accumulate in double whatever T is.
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += static_cast<double>(exp_fast(l[v] - mx));
    const T lse = mx + static_cast<T>(std::log(sum));
    const int target = targets[n];
    const bool valid = target >= 0 && target < V;  // else NaN, as the CUDA kernel reports it
    losses[n] = valid ? lse - l[target] : std::numeric_limits<T>::quiet_NaN();
    if (dlogits) {
      T* d = dlogits + idx(n, Vp);  // may alias l: each element is read before it is written
      for (int v = 0; v < V; ++v) d[v] = (exp_fast(l[v] - lse) - (v == target ? T(1) : T(0))) * dloss;
      for (int v = V; v < Vp; ++v) d[v] = 0;
    }
  }
}

// The vocabulary-parallel pieces follow softmax_cross_entropy above: the same exp, the
// normaliser summed in double, so a split over ranks differs from the whole only in the order of
// that sum's terms.
template <class T>
void cross_entropy_part_max(float* row_max, const T* logits, int N, int Vl, int v0, int V) {
  const int real = std::clamp(V - v0, 0, Vl);  // this part's ids below V
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* l = logits + idx(n, Vl);
    T mx = -std::numeric_limits<T>::infinity();
    for (int v = 0; v < real; ++v) mx = std::max(mx, l[v]);
    row_max[n] = static_cast<float>(mx);
  }
}

template <class T>
void cross_entropy_part_sums(float* sums, const T* logits, const float* row_max, const std::int32_t* targets, int N,
                             int Vl, int v0, int V) {
  const int real = std::clamp(V - v0, 0, Vl);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* l = logits + idx(n, Vl);
    const T mx = static_cast<T>(row_max[n]);
    double sum = 0;
    for (int v = 0; v < real; ++v) sum += static_cast<double>(exp_fast(l[v] - mx));
    sums[n] = static_cast<float>(sum);
    const int t = targets[n] - v0;
    sums[N + n] = t >= 0 && t < real ? static_cast<float>(l[t]) : 0.0f;
  }
}

template <class T>
void cross_entropy_part_finish(float* losses, T* dlogits, const T* logits, const float* row_max, const float* sums,
                               const std::int32_t* targets, int N, int Vl, int v0, int V, T dloss) {
  const int real = std::clamp(V - v0, 0, Vl);
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    const T* l = logits + idx(n, Vl);
    const T lse = static_cast<T>(row_max[n]) + static_cast<T>(std::log(static_cast<double>(sums[n])));
    // No part holds a target outside [0, V), so sums[N + n] is 0 and the loss would read as a
    // finite lse: report it as NaN instead, which the trainer stops on.
    const bool valid = targets[n] >= 0 && targets[n] < V;
    losses[n] = valid ? static_cast<float>(lse - static_cast<T>(sums[N + n])) : std::numeric_limits<float>::quiet_NaN();
    if (!dlogits) continue;
    T* d = dlogits + idx(n, Vl);  // may alias l: each element is read before it is written
    const int target = targets[n] - v0;
    for (int v = 0; v < real; ++v) d[v] = (exp_fast(l[v] - lse) - (v == target ? T(1) : T(0))) * dloss;
    for (int v = real; v < Vl; ++v) d[v] = 0;
  }
}

#define ZERO_GPT_INSTANTIATE(T)                                                                                      \
  template void encoder_forward<T>(T*, const std::int32_t*, const T*, const T*, int, int, int, int, int);            \
  template void encoder_backward<T>(T*, T*, const T*, const std::int32_t*, int, int, int, int, int);                 \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);                            \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, int);       \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int);                                  \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);                         \
  template void attention_forward<T>(T*, T*, const T*, const AttentionShape&);                                       \
  template void attention_backward<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&);                  \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, double);                                    \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);                       \
  template void rotary<T>(T*, const AttentionShape&, double, int);                                                   \
  template void swiglu_forward<T>(T*, const T*, int, int);                                                           \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int);                                                \
  template void gelu_forward<T>(T*, const T*, std::size_t);                                                          \
  template void gelu_backward<T>(T*, const T*, const T*, std::size_t);                                               \
  template void gelu_backward_inplace<T>(T*, const T*, std::size_t);                                                 \
  template void residual_forward<T>(T*, const T*, const T*, std::size_t);                                            \
  template void logits_forward<T>(T*, const T*, const T*, int, int, int);                                            \
  template void logits_backward<T>(T*, T*, const T*, const T*, const T*, int, int, int);                             \
  template void softmax_cross_entropy<T>(T*, T*, const T*, const std::int32_t*, int, int, int, T);                   \
  template void cross_entropy_part_max<T>(float*, const T*, int, int, int, int);                                     \
  template void cross_entropy_part_sums<T>(float*, const T*, const float*, const std::int32_t*, int, int, int, int); \
  template void cross_entropy_part_finish<T>(float*, T*, const T*, const float*, const float*, const std::int32_t*,  \
                                             int, int, int, int, T);

ZERO_GPT_INSTANTIATE(float)
ZERO_GPT_INSTANTIATE(double)

#undef ZERO_GPT_INSTANTIATE

}  // namespace zero::gpt::host
