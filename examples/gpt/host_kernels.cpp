#include "gpt/host_kernels.hpp"

#include "gpt/host_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace zero::gpt::host {

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
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, double);                                    \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);                       \
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
