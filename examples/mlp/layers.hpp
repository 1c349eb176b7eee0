// The student's two layers for one sample, read and written through the engine's views of a
// unit: fc1 holds H hidden units (all of them in mlp.cpp, this rank's share of them in
// mlp_tensor_parallel.cpp) and fc2 reads those same H units.
#pragma once

#include <cmath>

#include <zero/engine.hpp>

#include "mlp/teacher.hpp"

namespace mlp {

// h[j] = tanh(b1[j] + W1[j] . x), j < H; W1 is [H, in].
inline void fc1_forward(const zero::UnitParams& p1, const float* x, float* h, int H) {
  for (int j = 0; j < H; ++j) {
    float a = p1["b"].get(j);
    for (int i = 0; i < kIn; ++i) a += p1["w"].get(j * kIn + i) * x[i];
    h[j] = std::tanh(a);
  }
}

// out[o] = W2[o] . h, fc2 without its bias (under tensor parallelism, this rank's share).
inline void fc2_product(const zero::UnitParams& p2, const float* h, float* out, int H) {
  for (int o = 0; o < kOut; ++o) {
    float a = 0;
    for (int j = 0; j < H; ++j) a += p2["w"].get(o * H + j) * h[j];
    out[o] = a;
  }
}

// Adds the sample's share of the mean squared error (over `samples` in the optimizer step) to
// `loss`, and writes d(loss)/d(out) for a micro-batch of `micro` samples, scaled by `scale`
// (the engine's loss scale).
inline void output_loss(const zero::UnitParams& p2, const float* out, const float* y, float* dout, int micro,
                        int samples, float scale, double& loss) {
  for (int o = 0; o < kOut; ++o) {
    float d = out[o] + p2["b"].get(o) - y[o];
    loss += 0.5 * d * d / samples;
    dout[o] = d / micro * scale;
  }
}

// Adds fc2's gradients and dh += W2^T dout: each rank's hidden units need only its own columns
// of W2.
inline void fc2_backward(const zero::UnitParams& p2, const zero::UnitGrads& g2, const float* h, const float* dout,
                         float* dh, int H) {
  for (int o = 0; o < kOut; ++o) {
    float d = dout[o];
    g2["b"].add(o, d);
    for (int j = 0; j < H; ++j) {
      g2["w"].add(o * H + j, d * h[j]);
      dh[j] += d * p2["w"].get(o * H + j);
    }
  }
}

// Adds fc1's gradients through the tanh.
inline void fc1_backward(const zero::UnitGrads& g1, const float* x, const float* h, const float* dh, int H) {
  for (int j = 0; j < H; ++j) {
    float d = dh[j] * (1 - h[j] * h[j]);
    g1["b"].add(j, d);
    for (int i = 0; i < kIn; ++i) g1["w"].add(j * kIn + i, d * x[i]);
  }
}

}  // namespace mlp
