// Host Adam/AdamW: argument checks, CPU dispatch, the OpenMP tiling and the portable scalar kernel, which is also the
// reference the SIMD kernels must match bit for bit.
#include "offload/host_optimizer.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "host_adam_kernels.hpp"
#include "host_kernel_util.hpp"
#include "zero/error.hpp"

namespace zero::offload {
namespace {

// The reference sequence of operations. The SIMD kernels repeat it lane by lane: same order,
// fused multiply-adds exactly where std::fma appears here, nothing reassociated.
template <int G, int O>
void adam_scalar(float* master, float* m, float* v, const void* grad, void* out, std::size_t begin, std::size_t end,
                 const AdamConstants& c) {
  for (std::size_t i = begin; i < end; ++i) {
    float p = master[i];
    float g = load_grad<G>(grad, i) * c.grad_scale;
    if (c.l2) g = std::fma(c.weight_decay, p, g);
    if (c.decoupled) p = p * c.decay;
    const float mi = std::fma(c.beta1, m[i], c.one_minus_beta1 * g);
    const float vi = std::fma(c.beta2, v[i], (c.one_minus_beta2 * g) * g);
    const float denom = std::fma(std::sqrt(vi), c.inv_sqrt_bias_c2, c.eps);
    p = std::fma(c.neg_step_size, mi / denom, p);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    store_param<O>(out, i, p);
  }
}

template <int G>
void adam_scalar_out(float* master, float* m, float* v, const void* grad, void* out, int oc, std::size_t b,
                     std::size_t e, const AdamConstants& c) {
  switch (oc) {
    case detail::kF32: return adam_scalar<G, detail::kF32>(master, m, v, grad, out, b, e, c);
    case detail::kBF16: return adam_scalar<G, detail::kBF16>(master, m, v, grad, out, b, e, c);
    case detail::kF16: return adam_scalar<G, detail::kF16>(master, m, v, grad, out, b, e, c);
    default: return adam_scalar<G, detail::kNone>(master, m, v, grad, out, b, e, c);
  }
}

}  // namespace

// clang before 15 does not know "f16c" in __builtin_cpu_supports; every x86 CPU with AVX2 and
// FMA (the weaker path's other needs) also has F16C.
#if defined(__clang__) && __clang_major__ < 15
#define ZERO_CPU_HAS_F16C() true
#else
#define ZERO_CPU_HAS_F16C() __builtin_cpu_supports("f16c")
#endif

bool simd_path_supported(SimdPath path) {
  switch (path) {
    case SimdPath::scalar: return true;
#if ZERO_OFFLOAD_X86
    case SimdPath::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && ZERO_CPU_HAS_F16C();
    case SimdPath::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && ZERO_CPU_HAS_F16C();
#else
    case SimdPath::avx2:
    case SimdPath::avx512: return false;
#endif
  }
  return false;
}

SimdPath best_simd_path() {
  static const SimdPath best = simd_path_supported(SimdPath::avx512) ? SimdPath::avx512
                               : simd_path_supported(SimdPath::avx2) ? SimdPath::avx2
                                                                     : SimdPath::scalar;
  return best;
}

std::string_view simd_path_name(SimdPath path) {
  switch (path) {
    case SimdPath::scalar: return "scalar";
    case SimdPath::avx2: return "avx2";
    case SimdPath::avx512: return "avx512";
  }
  return "unknown";
}

namespace detail {

void adam_range_scalar(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                       std::size_t begin, std::size_t end, const AdamConstants& c, std::size_t /*prefetch*/) {
  switch (grad_code) {
    case kF32: return adam_scalar_out<kF32>(master, m, v, grad, out, out_code, begin, end, c);
    case kBF16: return adam_scalar_out<kBF16>(master, m, v, grad, out, out_code, begin, end, c);
    default: return adam_scalar_out<kF16>(master, m, v, grad, out, out_code, begin, end, c);
  }
}

}  // namespace detail

std::size_t adam_prefetch_elements() {
  // Measured with bench_host_adam (bench/RESULTS.md), fp32 AdamW at 100M-300M parameters: on
  // Intel (a Xeon KVM guest, family 6 model 167) 512 elements (2 KiB of each stream) brought the kernel to the
  // copy loop's bandwidth, without prefetch it reached 91-94% with one thread; on AMD (Zen 4,
  // KVM) 256 elements ran 4-13% faster than 512 and 6-15% faster than none, at 1 and 2 threads.
  // Adam spends enough cycles on sqrt and division per line that the hardware prefetchers, which
  // also stop at every 4 KiB page, leave part of the bandwidth unused.
#if ZERO_OFFLOAD_X86
  static const std::size_t elements = __builtin_cpu_is("amd") ? 256 : 512;
  return elements;
#else
  return 512;
#endif
}

void adam_step(float* master, float* m, float* v, const void* grad, DType grad_type, void* param_out, DType param_type,
               std::size_t n, const AdamHyper& h, SimdPath path, int threads) {
  if (n == 0) return;
  check_common(master, grad, grad_type, param_out, param_type, "adam_step");
  ZERO_CHECK(m != nullptr && v != nullptr, "adam_step: the moment buffers m and v must not be null");
  ZERO_CHECK(
      h.step >= 1,
      fmt::format("adam_step: step is 1-based (got {}); pass the number of steps taken including this one", h.step));
  ZERO_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f && h.beta2 >= 0.0f && h.beta2 < 1.0f,
             fmt::format("adam_step: betas must lie in [0, 1) (got beta1={}, beta2={}); check optimizer.params.betas",
                         h.beta1, h.beta2));
  ZERO_CHECK(
      simd_path_supported(path),
      fmt::format("adam_step: the {} path is not supported by this CPU; pass best_simd_path()", simd_path_name(path)));

  detail::AdamRangeFn fn = detail::adam_range_scalar;
#if ZERO_OFFLOAD_X86
  if (path == SimdPath::avx512) fn = detail::adam_range_avx512;
  if (path == SimdPath::avx2) fn = detail::adam_range_avx2;
#endif
  const AdamConstants c = adam_constants(h);
  const int gc = elem_code(grad_type);
  const int oc = param_out != nullptr ? elem_code(param_type) : detail::kNone;
  const std::size_t ahead = adam_prefetch_elements();
  for_each_tile(n, threads,
                [&](std::size_t b, std::size_t e) { fn(master, m, v, grad, gc, param_out, oc, b, e, c, ahead); });
}

}  // namespace zero::offload
