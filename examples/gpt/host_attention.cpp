// The host attention kernels (host_kernels.hpp): causal attention over an AttentionShape and the
// rotary positions applied to its q and k.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gpt/host_kernels.hpp"
#include "gpt/host_math.hpp"

namespace zero::gpt::host {

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

#define ZERO_GPT_INSTANTIATE(T)                                                                     \
  template void attention_forward<T>(T*, T*, const T*, const AttentionShape&);                      \
  template void attention_backward<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&); \
  template void rotary<T>(T*, const AttentionShape&, double, int);

ZERO_GPT_INSTANTIATE(float)
ZERO_GPT_INSTANTIATE(double)

#undef ZERO_GPT_INSTANTIATE

}  // namespace zero::gpt::host
