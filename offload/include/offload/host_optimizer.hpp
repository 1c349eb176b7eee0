// Fused optimizer steps on host memory: Adam / AdamW (host_adam*.cpp), SGD with momentum
// (host_sgd.cpp), Lion, LAMB, Adafactor and Muon (host_<name>.cpp). What follows describes Adam's;
// the others are portable C++ with the same rules (one pass per element where the mathematics
// allows it, no reassociation, results independent of the thread count).
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
#include <vector>

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
// measurements (see host_adam.cpp), exposed so benchmarks can run their yardsticks alike.
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

// Lion (Chen et al. 2023; DeepSpeed's keys): c = b1*m + (1-b1)*g; p = p*(1 - lr*wd) - lr*sign(c);
// m = b2*m + (1-b2)*g.
struct LionConstants {
  float grad_scale, lr, decay;  // decay: 1 - lr*wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
};
void lion_step(float* master, float* m, const void* grad, DType grad_type, void* param_out, DType param_type,
               std::size_t n, const LionConstants& c, int threads = 0);

// The folds of a tensor's statistics (sums of squares in double): element `at + i` of the tensor
// belongs to fold block (at + i) / kFoldBlock; within a block it folds into lane (at + i) mod
// kStatLanes, each lane in element order from zero, and the blocks' lanes add up in block order.
// A fold state is kStatFold doubles: the lanes of the blocks finished so far, then the lanes of
// the block a run ended inside (the caller keeps one state per tensor and slice, zeroed, and
// passes the runs of a slice in element order). Any cut of a tensor into runs, and any thread
// count, gives the same bits; the blocks of a run fold on all threads at once. fold_total gives
// the sum (each lane's two parts added, then the lanes in a fixed tree).
constexpr int kStatLanes = 8;
constexpr int kStatFold = 2 * kStatLanes;
constexpr std::size_t kFoldBlock = std::size_t{1} << 15;
inline double fold_total(const double* f) {
  double l[kStatLanes];
  for (int k = 0; k < kStatLanes; ++k) l[k] = f[k] + f[kStatLanes + k];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// LAMB (You et al. 2020; DeepSpeed's FusedLamb): u = (m/c1) / (sqrt(v/c2) + eps) + wd*p over a
// tensor, p -= lr * trust * u with trust = ||p|| / ||u||. Two passes: lamb_moments updates m and v
// and continues the folds of p^2 and u^2 (fold states, above); lamb_apply recomputes u from the
// stored m, v and p, the same float operations, and applies `step` = lr x the trust ratio.
struct LambConstants {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
  float inv_bias_c1, inv_bias_c2;  // 1/(1 - beta^t), or 1 without bias correction
};
void lamb_moments(const float* master, float* m, float* v, const void* grad, DType grad_type, std::int64_t at,
                  std::size_t n, const LambConstants& c, double* p_fold, double* u_fold);
void lamb_apply(float* master, const float* m, const float* v, void* param_out, DType param_type, std::size_t n,
                const LambConstants& c, float step, int threads = 0);

// Adafactor (Shazeer & Stern 2018, as Hugging Face's): s = g^2 + eps1. A run is `n` elements of
// a [rows, cols] tensor from flat element `at` (vectors: cols = n, at = 0, rows 1).
struct AdafactorConstants {
  float grad_scale, beta2t, one_minus_beta2t, eps1;
};
// Vectors: V = beta2t*V + (1-beta2t)*s; u = g / sqrt(V); the folds of p^2 and u^2 (fold states).
void adafactor_vector(const float* master, float* v, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                      const AdafactorConstants& c, double* p_fold, double* u_fold);
// Matrices, pass 1: row_sums[r] and col_sums[c] (indexed by the tensor's row and column) continue
// their folds of s in element order; the fold of p^2.
void adafactor_matrix_sums(const float* master, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                           std::int64_t cols, const AdafactorConstants& c, double* row_sums, double* col_sums,
                           double* p_fold);
// Matrices, pass 2: u = g * row_factor[r] * col_factor[c]; the fold of u^2.
void adafactor_matrix_rms(const void* grad, DType grad_type, std::int64_t at, std::size_t n, std::int64_t cols,
                          float grad_scale, const float* row_factor, const float* col_factor, double* u_fold);
// The update, from V (vectors; row_factor null) or the factors: u *= scale (lr_t over the RMS
// clip); with a first moment M = beta1*M + (1-beta1)*u, u = M; p = p + neg_decay*p - u.
struct AdafactorApply {
  float grad_scale, scale, neg_decay;  // neg_decay: -wd*lr_t
  float beta1, one_minus_beta1;
  bool first_moment;
};
void adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType grad_type, void* param_out,
                     DType param_type, std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                     const float* col_factor, const AdafactorApply& a);

// Muon (Jordan et al. 2024; PyTorch's torch.optim.Muon): buf = momentum*buf + g; x = nesterov ?
// g + momentum*buf : buf, written to x_out for the owner's orthogonalisation.
void muon_momentum(float* buf, const void* grad, DType grad_type, std::size_t n, float grad_scale, float momentum,
                   bool nesterov, float* x_out, int threads = 0);
// The quintic Newton-Schulz iteration on a [rows, cols] row-major matrix, in place: X / ||X||_F,
// then `steps` times X = a X + (b A + c A A) X with A = X X^T, over the shorter side, through
// OpenBLAS's sgemm (single-threaded) on `threads` OpenMP threads (0: all), each computing a run
// of rows of every product; the result does not depend on the thread count. `work` is scratch,
// grown as needed.
void newton_schulz(float* x, std::int64_t rows, std::int64_t cols, int steps, std::vector<float>& work,
                   int threads = 0);
// Several [rows, cols] matrices at once, one per thread (`threads` OpenMP threads, 0: all), each
// with single-threaded sgemm: the same result, bit for bit, as newton_schulz on each. Worth it
// for small matrices, whose products cannot keep the threads busy: newton_schulz_small says
// which (r^2 k at most kNewtonSchulzSmall, r the shorter side, k the longer; from
// bench_host_optimizers' table 4).
void newton_schulz_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols, int steps,
                         std::vector<float>& work, int threads = 0);
inline constexpr double kNewtonSchulzSmall = 256.0 * 256.0 * 1024.0;
bool newton_schulz_small(std::int64_t rows, std::int64_t cols);
// p = p*decay - step*o.
void muon_apply(float* master, const float* o, void* param_out, DType param_type, std::size_t n, float decay,
                float step, int threads = 0);

// 1-bit Adam (Tang et al. 2021; DeepSpeed's OneBitAdam) after its warm-up: the momentum travels
// as one sign bit per element and one scale per chunk, scale = RMS of the chunk, with the part
// the bits do not carry kept as error feedback. onebit_compress turns x (n values, the message
// plus the previous error) into bits (bit i of byte i/8: x_i >= 0) and returns the scale,
// leaving in x the new error x_i - scale * sign_i. onebit_decode writes scale * sign_i.
float onebit_compress(float* x, std::size_t n, std::uint8_t* bits);
// A worker's message: x_i = b1 * shared_i + (1 - b1) * (grad_i * grad_scale), plus x_i's
// previous value (the worker error) when add_error.
void onebit_worker(float* x, const float* shared, const void* grad, DType grad_type, std::size_t n, float b1,
                   float one_minus_b1, float grad_scale, bool add_error);
void onebit_decode(const std::uint8_t* bits, float scale, std::size_t n, float* out);
// The server's part for one chunk: x_i = (sum over workers w, in order, of scale_w * sign_w,i)
// / workers + error_i, then compressed as above (error keeps what the bits do not carry).
// worker_bits: `workers` arrays of the chunk's bits, `stride` bytes apart.
float onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales, int workers,
                    float* error, std::size_t n, std::uint8_t* bits);
// The compressed step's update: m = m_new; p = p*decay + neg_lr * m / (sqrt(v) + eps), v frozen,
// with the operations of Adam's kernel (without bias correction), so its warm-up steps and this
// one round alike.
void onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* param_out, DType param_type,
                       std::size_t n, float decay, float neg_lr, float eps, int threads = 0);

// 1-bit LAMB (Li et al. 2021; DeepSpeed's OneBitLamb) after its warm-up, the first of its two
// passes over a run of one tensor (the second is lamb_apply without bias correction, whose
// direction is the u below): from the exchange's momentum m_new (scaled by the tensor's
// scaling_coeff), m = m_new / scaling_coeff; the gradient it implies, r = (m - b1 m_last) /
// (1 - b1), feeds the fresh variance v_fresh = b2 v_fresh + (1 - b2) r^2 while v stays frozen;
// u = m / (sqrt(v) + eps) + wd p. Folds ||u||^2 and ||m / (sqrt(v) + eps)||^2 (fold states)
// and raises ratio_max to the largest (sqrt(v) + eps) / (sqrt(v_fresh) + eps).
struct OneBitLambConstants {
  float beta1, inv_one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, scaling_coeff;
};
void onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                         std::int64_t at, std::size_t n, const OneBitLambConstants& c, double* u_fold,
                         double* prelim_fold, double& ratio_max);

}  // namespace zero::offload
