// Fused optimizer steps on host memory: Adam / AdamW and SGD with momentum.
//
// With the optimizer offloaded, every step reads the gradient shard, the fp32 master weights and
// both moments from host memory and writes back the weights, the moments and the compute copy of
// the parameters. The step is bound by memory bandwidth, so everything happens in one pass per
// element: gradient conversion and scaling, weight decay, the moment updates, bias correction,
// the weight update and the rounding to bf16/fp16 for the parameters sent back to the device.
//
// Three code paths (AVX-512, AVX2+FMA+F16C, portable scalar) are chosen at run time by CPUID.
// They give bit-identical results: every path performs the same IEEE operations in the same
// order, with fused multiply-adds in the same places, and rounds to bf16/fp16 to nearest even
// exactly as zero/dtype.hpp does. Work is split over OpenMP threads in fixed tiles; no element's
// arithmetic depends on the tiling, so the result is also independent of the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/dtype.hpp"
#include "zero/optim.hpp"  // AdamHyper, SgdHyper, adam_constants: the optimizer's home

namespace zero::offload {

enum class SimdPath { scalar, avx2, avx512 };

// The fastest path this CPU supports (AVX-512 needs F/BW/VL; AVX2 needs FMA and F16C too).
SimdPath best_simd_path();
// True when `path` can run on this CPU (scalar always can).
bool simd_path_supported(SimdPath path);
std::string_view simd_path_name(SimdPath path);
// How far ahead (in elements) the SIMD Adam kernels prefetch: chosen per CPU vendor from
// measurements (see host_optimizer.cpp), exposed so benchmarks can run their yardsticks alike.
std::size_t adam_prefetch_elements();

// One Adam/AdamW step over n elements, in place on master, m and v (fp32).
//   grad      : n gradients of grad_type (fp32, bf16 or fp16)
//   param_out : when not null, receives the updated weights rounded to param_type
// PyTorch semantics: g = grad*grad_scale; Adam: g += wd*p; AdamW: p *= 1 - lr*wd;
// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
// threads: 0 uses the OpenMP default (OMP_NUM_THREADS). Throws zero::Error on bad arguments or
// when `path` is not supported by this CPU.
void adam_step(float* master, float* m, float* v, const void* grad, DType grad_type, void* param_out, DType param_type,
               std::size_t n, const AdamHyper& h, SimdPath path = best_simd_path(), int threads = 0);

// One SGD step (PyTorch semantics, dampening 0, no Nesterov): g = grad*grad_scale + wd*p;
// with momentum: buf = first_step ? g : momentum*buf + g, g = buf; then p -= lr*g.
// momentum_buf may be null when momentum == 0.
void sgd_step(float* master, float* momentum_buf, const void* grad, DType grad_type, void* param_out, DType param_type,
              std::size_t n, const SgdHyper& h, int threads = 0);

}  // namespace zero::offload
