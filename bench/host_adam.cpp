// bench_host_adam: how close does the host AdamW step come to the memory bandwidth limit, and
// what does fusing the bf16 conversions into it buy?
//
// 1. AdamW with fp32 gradients against a loop with exactly its memory traffic (read p, g, m, v;
//    write p, m, v; a multiply and an add each, no sqrt or division), vectorised with the same
//    ISA and software prefetch, threaded with the same static tiling, measured in the same run.
// 2. The offload step as training runs it (bf16 gradients in, fp32 master/m/v updated, bf16
//    parameters out): one fused pass against three passes (grads to fp32, fp32 step, params to
//    bf16), the conversions vectorised and threaded the same way.
// Each figure is the minimum over --reps runs after one warm-up run; the variants take turns
// within each repetition.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in AVX-512 intrinsics
#endif
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "zero/dtype.hpp"
#include "host_buffers.hpp"
#include "offload/host_optimizer.hpp"

using zero::DType;
using namespace zero;
using namespace zero::offload;
using namespace zero::bench;

// The yardstick loops add gradient x this factor, which is 0 at run time: they move exactly the
// bytes Adam moves while leaving p, m and v as Adam left them, so interleaved runs keep a sane
// optimizer state. External linkage keeps the compiler from assuming its value.
float yardstick_factor = 0.0f;

namespace {

// The library's software prefetch distance on this CPU (elements), set in main.
std::uintptr_t prefetch_ahead = 512;

// Prefetches one line of each stream prefetch_ahead elements ahead, as the library's kernels do.
inline void ahead(std::size_t i, const void* a, const void* b, const void* c, const void* d, std::uintptr_t d_size) {
  const std::uintptr_t j = i + prefetch_ahead;
  auto at = [](const void* base, std::uintptr_t offset) {
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(base) + offset);
  };
  _mm_prefetch(at(a, 4 * j), _MM_HINT_T0);
  _mm_prefetch(at(b, 4 * j), _MM_HINT_T0);
  _mm_prefetch(at(c, 4 * j), _MM_HINT_T0);
  _mm_prefetch(at(d, d_size * j), _MM_HINT_T0);
}

// ---- reference loops, one per ISA ----

// The fp32 traffic loop in four forms: with or without the library's software prefetch, with
// ordinary or streaming (non-temporal) stores. Which is fastest depends on the CPU, and only the
// fastest is a limit.
template <bool Prefetch, bool Stream>
__attribute__((target("avx512f"))) void traffic_avx512_v(float* p, const float* g, float* m, float* v, std::size_t b,
                                                         std::size_t e) {
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    if constexpr (Prefetch) ahead(i, p, m, v, g, 4);
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), _mm512_set1_ps(yardstick_factor));
    const __m512 pi = _mm512_add_ps(_mm512_loadu_ps(p + i), gi);
    const __m512 mi = _mm512_add_ps(_mm512_loadu_ps(m + i), gi);
    const __m512 vi = _mm512_add_ps(_mm512_loadu_ps(v + i), gi);
    if constexpr (Stream) {  // 64-byte aligned: the arrays are, and tiles are multiples of 16
      _mm512_stream_ps(p + i, pi);
      _mm512_stream_ps(m + i, mi);
      _mm512_stream_ps(v + i, vi);
    } else {
      _mm512_storeu_ps(p + i, pi);
      _mm512_storeu_ps(m + i, mi);
      _mm512_storeu_ps(v + i, vi);
    }
  }
  for (; i < e; ++i) {
    const float gi = g[i] * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
  if constexpr (Stream) _mm_sfence();
}

void traffic_avx512(float* p, const float* g, float* m, float* v, std::size_t b, std::size_t e) {
  traffic_avx512_v<true, false>(p, g, m, v, b, e);
}

// A peer AdamW organised the way the widely used CPU Adam of another framework is (facts from
// its documentation and source layout; no code taken): AVX-512, eight vectors per loop
// iteration, no software prefetch, one contiguous block of the array per OpenMP thread, and the
// update m / (sqrt(v) / sqrt(1 - beta2^t) + eps). Same memory traffic as the library's kernel;
// it is here so that "the limit" is checked against the best peer at hand.
__attribute__((target("avx512f,fma"))) void peer_adamw_avx512(float* p, const float* g, float* m, float* v,
                                                              std::size_t n, const AdamConstants& c, int threads) {
  constexpr std::size_t kUnroll = 8, kStep = 16 * kUnroll;
  const std::size_t blocks = n / kStep;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t blk = 0; blk < static_cast<std::int64_t>(blocks); ++blk) {
    const std::size_t base = static_cast<std::size_t>(blk) * kStep;
    __m512 gr[kUnroll], pa[kUnroll], mo[kUnroll], ve[kUnroll];
    for (std::size_t u = 0; u < kUnroll; ++u) {
      const std::size_t i = base + 16 * u;
      gr[u] = _mm512_loadu_ps(g + i);
      pa[u] = _mm512_loadu_ps(p + i);
      mo[u] = _mm512_loadu_ps(m + i);
      ve[u] = _mm512_loadu_ps(v + i);
    }
    for (std::size_t u = 0; u < kUnroll; ++u) {
      pa[u] = _mm512_mul_ps(pa[u], _mm512_set1_ps(c.decay));
      mo[u] = _mm512_fmadd_ps(_mm512_set1_ps(c.beta1), mo[u], _mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta1), gr[u]));
      ve[u] = _mm512_fmadd_ps(_mm512_set1_ps(c.beta2), ve[u],
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta2), gr[u]), gr[u]));
      const __m512 den =
          _mm512_fmadd_ps(_mm512_sqrt_ps(ve[u]), _mm512_set1_ps(c.inv_sqrt_bias_c2), _mm512_set1_ps(c.eps));
      pa[u] = _mm512_fmadd_ps(_mm512_set1_ps(c.neg_step_size), _mm512_div_ps(mo[u], den), pa[u]);
    }
    for (std::size_t u = 0; u < kUnroll; ++u) {
      const std::size_t i = base + 16 * u;
      _mm512_storeu_ps(p + i, pa[u]);
      _mm512_storeu_ps(m + i, mo[u]);
      _mm512_storeu_ps(v + i, ve[u]);
    }
  }
  // The tail, scalar (at most 127 elements).
  for (std::size_t i = blocks * kStep; i < n; ++i) {
    p[i] *= c.decay;
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
    p[i] += c.neg_step_size * (m[i] / (std::sqrt(v[i]) * c.inv_sqrt_bias_c2 + c.eps));
  }
}

__attribute__((target("avx2"))) void traffic_avx2(float* p, const float* g, float* m, float* v, std::size_t b,
                                                  std::size_t e) {
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    if (i % 16 == 0) ahead(i, p, m, v, g, 4);
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_set1_ps(yardstick_factor));
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), gi));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gi));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), gi));
  }
  for (; i < e; ++i) {
    const float gi = g[i] * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
}

void traffic_scalar(float* p, const float* g, float* m, float* v, std::size_t b, std::size_t e) {
  for (std::size_t i = b; i < e; ++i) {
    const float gi = g[i] * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
}

// The same traffic for the bf16 offload step: read p, m, v and a bf16 gradient; write p, m, v
// and a bf16 parameter copy (truncated, not rounded: this is a bandwidth yardstick).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void traffic16_avx512(float* p, const std::uint16_t* g, float* m,
                                                                           float* v, std::uint16_t* out, std::size_t b,
                                                                           std::size_t e) {
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    ahead(i, p, m, v, g, 2);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i));
    const __m512 gi = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)),
                                    _mm512_set1_ps(yardstick_factor));
    const __m512 pi = _mm512_add_ps(_mm512_loadu_ps(p + i), gi);
    _mm512_storeu_ps(p + i, pi);
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gi));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), gi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(pi), 16)));
  }
  for (; i < e; ++i) {
    const float gi = zero::bf16_bits_to_f32(g[i]) * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
    out[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(p[i]) >> 16);
  }
}

__attribute__((target("avx2"))) void traffic16_avx2(float* p, const std::uint16_t* g, float* m, float* v,
                                                    std::uint16_t* out, std::size_t b, std::size_t e) {
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    if (i % 16 == 0) ahead(i, p, m, v, g, 2);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + i));
    const __m256 gi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
                                    _mm256_set1_ps(yardstick_factor));
    const __m256 pi = _mm256_add_ps(_mm256_loadu_ps(p + i), gi);
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gi));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), gi));
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(pi), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
  }
  for (; i < e; ++i) {
    const float gi = zero::bf16_bits_to_f32(g[i]) * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
    out[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(p[i]) >> 16);
  }
}

void traffic16_scalar(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* out, std::size_t b,
                      std::size_t e) {
  for (std::size_t i = b; i < e; ++i) {
    const float gi = zero::bf16_bits_to_f32(g[i]) * yardstick_factor;
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
    out[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(p[i]) >> 16);
  }
}

// Runs every function once as a warm-up (page faults, caches, thread pool), then `reps` rounds
// of all of them in turn; returns each one's fastest time in seconds.
std::vector<double> time_interleaved(int reps, const std::vector<std::function<void()>>& fns) {
  std::vector<double> best(fns.size(), std::numeric_limits<double>::infinity());
  for (const auto& fn : fns) fn();
  for (int r = 0; r < reps; ++r) {
    for (std::size_t k = 0; k < fns.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[k]();
      const auto t1 = std::chrono::steady_clock::now();
      best[k] = std::min(best[k], std::chrono::duration<double>(t1 - t0).count());
    }
  }
  return best;
}

std::string params_label(std::size_t n) {
  char buf[32];
  if (n % 1000000000 == 0) {
    std::snprintf(buf, sizeof buf, "%zuB", n / 1000000000);
  } else if (n % 1000000 == 0) {
    std::snprintf(buf, sizeof buf, "%zuM", n / 1000000);
  } else {
    std::snprintf(buf, sizeof buf, "%zu", n);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Host AdamW step: throughput against the memory-traffic limit, fused vs 3-pass"};
  std::vector<double> sizes_m{10, 100};
  bool large = false;
  int reps = 5;
  int max_threads = omp_get_num_procs();
  std::string path_name;
  app.add_option("--sizes", sizes_m, "parameter counts in millions (default 10 100)");
  app.add_flag("--large", large, "add 1000M (1B) parameters: needs about 20 GB of memory");
  app.add_option("--reps", reps, "timed repetitions per figure (minimum is reported)");
  app.add_option("--max-threads", max_threads, "threads go 1..N (default: all CPUs)");
  app.add_option("--path", path_name, "scalar, avx2 or avx512 (default: the best available)");
  CLI11_PARSE(app, argc, argv);
  if (large) sizes_m.push_back(1000);

  SimdPath path = best_simd_path();
  if (!path_name.empty()) {
    if (path_name == "scalar")
      path = SimdPath::scalar;
    else if (path_name == "avx2")
      path = SimdPath::avx2;
    else if (path_name == "avx512")
      path = SimdPath::avx512;
    else {
      std::fprintf(stderr, "unknown --path %s (scalar, avx2, avx512)\n", path_name.c_str());
      return 2;
    }
    if (!simd_path_supported(path)) {
      std::fprintf(stderr, "--path %s is not supported by this CPU\n", path_name.c_str());
      return 2;
    }
  }
  const bool has512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  const bool use512 = path == SimdPath::avx512 && has512;
  const bool use256 = path == SimdPath::avx2;
  auto traffic = use512 ? traffic_avx512 : use256 ? traffic_avx2 : traffic_scalar;
  auto traffic16 = use512 ? traffic16_avx512 : use256 ? traffic16_avx2 : traffic16_scalar;

  prefetch_ahead = adam_prefetch_elements();
  std::printf(
      "bench_host_adam: path %s, %d CPUs, software prefetch %zu elements ahead, min of %d "
      "reps after a warm-up\n",
      std::string(simd_path_name(path)).c_str(), omp_get_num_procs(), static_cast<std::size_t>(prefetch_ahead), reps);
  std::printf(
      "limit = loop with AdamW's memory traffic "
      "(28 B/param: read p,g,m,v; write p,m,v)\n\n");
  if (use512)
    std::printf(
        "traffic loops (Mparam/s): pf = software prefetch as the library, nt = streaming "
        "stores; peer = an AdamW organised like another framework's CPU Adam\n"
        "limit = the fastest of the traffic loops and the peer\n\n");
  std::printf("%-6s %3s | %9s | %9s %10s %9s %7s", "params", "thr", "limit GB/s", "AdamW ms", "Mparam/s", "GB/s",
              "%limit");
  if (use512) std::printf(" | %7s %7s %7s %7s | %8s", "pf", "no-pf", "pf+nt", "nt", "peer");
  std::printf("\n");

  struct Offload {
    std::string label;
    int threads;
    double fused, three, limit16;
  };
  std::vector<Offload> offload_rows;

  for (double sm : sizes_m) {
    const auto n = static_cast<std::size_t>(sm * 1e6);
    Array<float> p(n), g(n), m(n), v(n);
    Array<std::uint16_t> g16(n), out16(n);
    // First touch by the threads that will use the pages, so they are spread like the work.
    tiles(n, max_threads, [&](std::size_t b, std::size_t e) {
      std::mt19937 rng(static_cast<unsigned>(b));
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      for (std::size_t i = b; i < e; ++i) {
        p.p[i] = d(rng);
        g.p[i] = 1e-3f * d(rng);
        m.p[i] = 0.0f;
        v.p[i] = 0.0f;
        g16.p[i] = zero::f32_to_bf16_bits(g.p[i]);
        out16.p[i] = 0;
      }
    });
    std::int64_t step = 0;
    AdamHyper h;
    h.lr = 1e-4f;
    h.weight_decay = 0.01f;
    h.decoupled = true;
    const double bytes32 = 28.0 * static_cast<double>(n);
    for (int t = 1; t <= max_threads; ++t) {
      // The variants take turns within each repetition, so a noisy neighbour or frequency
      // drift affects them alike; each keeps its fastest run.
      auto limit = [&] { tiles(n, t, [&](std::size_t b, std::size_t e) { traffic(p.p, g.p, m.p, v.p, b, e); }); };
      auto adam = [&] {
        h.step = ++step;
        adam_step(p.p, m.p, v.p, g.p, DType::f32, nullptr, DType::f32, n, h, path, t);
      };
      // Offload step: bf16 grads in, bf16 params out. The three-pass baseline reuses g as its
      // fp32 gradient scratch, as a real three-pass implementation would need one.
      auto fused = [&] {
        h.step = ++step;
        adam_step(p.p, m.p, v.p, g16.p, DType::bf16, out16.p, DType::bf16, n, h, path, t);
      };
      auto three = [&] {
        h.step = ++step;
        // The conversions are the library's (zero::convert, exact RNE), split over the threads.
        tiles(n, t, [&](std::size_t b, std::size_t e) { convert(g16.p + b, DType::bf16, g.p + b, DType::f32, e - b); });
        adam_step(p.p, m.p, v.p, g.p, DType::f32, nullptr, DType::f32, n, h, path, t);
        tiles(n, t,
              [&](std::size_t b, std::size_t e) { convert(p.p + b, DType::f32, out16.p + b, DType::bf16, e - b); });
      };
      auto limit16 = [&] {
        tiles(n, t, [&](std::size_t b, std::size_t e) { traffic16(p.p, g16.p, m.p, v.p, out16.p, b, e); });
      };
      std::vector<std::function<void()>> fns{limit, adam, fused, three, limit16};
      if (use512) {
        // The other traffic loops and the peer AdamW (whose step counter it shares).
        fns.push_back([&] {
          tiles(n, t, [&](std::size_t b, std::size_t e) { traffic_avx512_v<false, false>(p.p, g.p, m.p, v.p, b, e); });
        });
        fns.push_back([&] {
          tiles(n, t, [&](std::size_t b, std::size_t e) { traffic_avx512_v<true, true>(p.p, g.p, m.p, v.p, b, e); });
        });
        fns.push_back([&] {
          tiles(n, t, [&](std::size_t b, std::size_t e) { traffic_avx512_v<false, true>(p.p, g.p, m.p, v.p, b, e); });
        });
        fns.push_back([&] {
          h.step = ++step;
          peer_adamw_avx512(p.p, g.p, m.p, v.p, n, adam_constants(h), t);
        });
      }
      const std::vector<double> best = time_interleaved(reps, fns);
      // The limit is the fastest traffic loop, or the peer AdamW if that ran faster still.
      double t_limit = best[0];
      for (std::size_t k = 5; k < best.size(); ++k) t_limit = std::min(t_limit, best[k]);
      const double t_adam = best[1];
      std::printf("%-6s %3d | %9.1f | %9.2f %10.0f %9.1f %6.1f%%", params_label(n).c_str(), t, bytes32 / t_limit / 1e9,
                  t_adam * 1e3, static_cast<double>(n) / t_adam / 1e6, bytes32 / t_adam / 1e9,
                  100.0 * t_limit / t_adam);
      if (use512)
        std::printf(" | %7.0f %7.0f %7.0f %7.0f | %8.0f", n / best[0] / 1e6, n / best[5] / 1e6, n / best[6] / 1e6,
                    n / best[7] / 1e6, n / best[8] / 1e6);
      std::printf("\n");
      std::fflush(stdout);
      offload_rows.push_back({params_label(n), t, best[2], best[3], best[4]});
    }
  }

  std::printf("\noffload step (bf16 grads in, fp32 master/m/v, bf16 params out)\n");
  std::printf("fused = one pass; 3-pass = bf16->fp32 grads, fp32 AdamW, fp32->bf16 params\n");
  std::printf("limit16 = loop with the fused step's traffic (28 B/param)\n\n");
  std::printf("%-6s %3s | %9s %9s %8s | %10s %9s %7s\n", "params", "thr", "fused ms", "3-pass ms", "speedup",
              "limit16 ms", "fused GB/s", "%limit");
  for (const Offload& r : offload_rows) {
    const double n = r.label.back() == 'B' ? std::stod(r.label) * 1e9 : std::stod(r.label) * 1e6;
    std::printf("%-6s %3d | %9.2f %9.2f %7.2fx | %10.2f %9.1f %6.1f%%\n", r.label.c_str(), r.threads, r.fused * 1e3,
                r.three * 1e3, r.three / r.fused, r.limit16 * 1e3, 28.0 * n / r.fused / 1e9,
                100.0 * r.limit16 / r.fused);
  }
  return 0;
}
