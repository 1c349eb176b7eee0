// bench_host_optimizers: how close do the host steps of the other optimizers (Lion, LAMB,
// Adafactor, SGD with momentum; AdamW for reference) come to the memory-traffic limit, how does
// Lion compare with DeepSpeed's CPU Lion, and how much of the BLAS's own rate does Muon's
// Newton-Schulz iteration keep?
//
// 1. Each optimizer's full host step over N fp32 parameters with fp32 gradients, pass by pass,
//    against a yardstick per pass: a loop that moves exactly the bytes the pass must move (every
//    array it reads, every array it writes) with an add and a multiply, AVX-512 where the CPU has
//    it, threaded with the library's static tiling, with and without software prefetch (the
//    faster counts). A step's limit is the sum of its passes' limits. The passes that fold sums
//    (lamb_moments, adafactor_vector, adafactor_matrix_rms) tile by fold block, as their sums
//    are defined (host_optimizer.hpp), and use every thread. adafactor_matrix_sums folds each
//    row and column in element order by design: it uses at most two threads (one strip of the
//    matrix's columns each). The output marks it; its yardstick still uses every thread, so the
//    table shows what that determinism costs.
// 2. lion_step against DeepSpeed's cpu_lion (Lion_Optimizer::Step_8, built from DeepSpeed's own
//    source with its op builder's flags; bench/RESULTS.md has the commands) at the same thread
//    count, fp32 parameters, gradients and state. The peer is loaded only when the environment
//    variable ZERO_BENCH_DS_LION names the built library; no DeepSpeed code is in this program.
// 3. newton_schulz (5 steps) on GPT-2 124M's matrix shapes against plain cblas_sgemm calls of the
//    same sizes, and 4. small matrices batched against one at a time (host_newton_schulz.cpp).
// Each figure is the minimum over --reps runs after one warm-up run; the variants take turns
// within each repetition so that a noisy neighbour affects them alike.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in AVX-512 intrinsics
#endif
#include <cblas.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "interleaved.hpp"
#include "yardsticks.hpp"
#include "host_buffers.hpp"
#include "host_newton_schulz.hpp"
#include "offload/host_optimizer.hpp"
#include "zero/dtype.hpp"

using namespace zero;
using namespace zero::offload;
using namespace zero::bench;

// yardsticks.hpp's factor, 0 at run time, defined here with external linkage (it says why).
float yardstick_factor = 0.0f;

namespace {

std::string params_label(std::size_t n) {
  char buf[32];
  if (n % 1000000 == 0) {
    std::snprintf(buf, sizeof buf, "%zuM", n / 1000000);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  }
  return buf;
}

// ---- the DeepSpeed peer ----

using DsLionStep = void (*)(float*, float*, float*, std::size_t, std::size_t, float, float, float, float);
using DsLionSimd = const char* (*)();

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Host optimizer steps against their memory-traffic limits, Lion against DeepSpeed, Newton-Schulz "
      "against sgemm"};
  double params_m = 100;
  int reps = 5;
  std::vector<int> thread_list{1, 2};
  std::int64_t cols = 3072;
  int ns_steps = 5;
  bool skip_ns = false;
  app.add_option("--params", params_m, "parameters in millions (default 100)");
  app.add_option("--reps", reps, "timed repetitions per figure (the minimum is reported)");
  app.add_option("--threads", thread_list, "thread counts to run (default 1 2)");
  app.add_option("--cols", cols, "columns of the Adafactor matrix (rows = params / cols; default 3072)");
  app.add_option("--ns-steps", ns_steps, "Newton-Schulz iterations (default 5)");
  app.add_flag("--skip-ns", skip_ns, "leave out the Newton-Schulz table");
  CLI11_PARSE(app, argc, argv);

  const auto n = static_cast<std::size_t>(params_m * 1e6);
  const std::int64_t rows = static_cast<std::int64_t>(n) / cols;
  const auto n_mat = static_cast<std::size_t>(rows * cols);
  if (n < kTile || rows < 1) {
    std::fprintf(stderr, "--params is too small (at least %zu elements and one row of --cols)\n", kTile);
    return 2;
  }
  use_avx512 = __builtin_cpu_supports("avx512f");
  prefetch_ahead = adam_prefetch_elements();
  const SimdPath adam_path = best_simd_path();

  // The DeepSpeed peer, when built (bench/RESULTS.md, bench_host_optimizers).
  DsLionStep ds_lion = nullptr;
  std::string ds_note;
  if (const char* lib = std::getenv("ZERO_BENCH_DS_LION"); lib != nullptr && *lib != '\0') {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "ZERO_BENCH_DS_LION=%s: %s\n", lib, dlerror());
      return 2;
    }
    ds_lion = reinterpret_cast<DsLionStep>(dlsym(h, "ds_lion_step_f32"));
    auto simd = reinterpret_cast<DsLionSimd>(dlsym(h, "ds_lion_simd"));
    if (ds_lion == nullptr || simd == nullptr) {
      std::fprintf(stderr, "ZERO_BENCH_DS_LION=%s lacks ds_lion_step_f32 / ds_lion_simd\n", lib);
      return 2;
    }
    ds_note = std::string(simd()) + ", " + lib;
  }

  std::printf(
      "bench_host_optimizers: %s fp32 params, fp32 grads, %d CPUs, min of %d reps after a warm-up\n"
      "AdamW path %s; yardsticks %s, prefetch %zu elements ahead or none (the faster counts)\n"
      "limit = a loop moving exactly each pass's bytes, %zu-element tiles, static schedule; a step's limit "
      "is the sum of its passes'\n",
      params_label(n).c_str(), omp_get_num_procs(), reps, std::string(simd_path_name(adam_path)).c_str(),
      use_avx512 ? "AVX-512" : "portable C++", static_cast<std::size_t>(prefetch_ahead), kTile);
  std::fflush(stdout);

  Array<float> p(n), g(n), m(n), v(n), pd(n), md(n);
  const int max_threads = *std::max_element(thread_list.begin(), thread_list.end());
  tiles(n, std::max(1, max_threads), [&](std::size_t b, std::size_t e) {
    std::mt19937 rng(static_cast<unsigned>(b));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (std::size_t i = b; i < e; ++i) {
      p.p[i] = pd.p[i] = d(rng);
      g.p[i] = 1e-3f * d(rng);
      m.p[i] = md.p[i] = 1e-3f * d(rng);
      v.p[i] = 1e-6f;
    }
  });
  // Small per-tensor state (Adafactor's factored second moment).
  std::vector<double> row_sums(static_cast<std::size_t>(rows)), col_sums(static_cast<std::size_t>(cols));
  std::vector<float> row_ema(row_sums.size(), 0.0f), col_ema(col_sums.size(), 0.0f);
  std::vector<float> row_factor(row_sums.size()), col_factor(col_sums.size());

  // Hyper-parameters: the usual ones; a step counter shared by all so that each call is a new step.
  std::int64_t step = 0;
  const float lr = 1e-4f, wd = 0.01f;
  LionConstants lion{1.0f, lr, 1.0f - lr * wd, 0.9f, 0.1f, 0.99f, 0.01f};
  AdamHyper adam;
  adam.lr = lr;
  adam.weight_decay = wd;
  adam.decoupled = true;
  SgdHyper sgd;
  sgd.lr = 1e-2f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = wd;
  auto lamb_constants = [&](std::int64_t t) {
    const double b1 = 0.9, b2 = 0.999;
    return LambConstants{1.0f,
                         static_cast<float>(b1),
                         static_cast<float>(1 - b1),
                         static_cast<float>(b2),
                         static_cast<float>(1 - b2),
                         1e-6f,
                         wd,
                         static_cast<float>(1 / (1 - std::pow(b1, t))),
                         static_cast<float>(1 / (1 - std::pow(b2, t)))};
  };
  // Hugging Face's Adafactor defaults: relative step, decay rate -0.8, eps (1e-30, 1e-3), clip 1,
  // no first moment.
  auto adafactor_constants = [&](std::int64_t t) {
    const double beta2t = 1.0 - std::pow(static_cast<double>(t), -0.8);
    return AdafactorConstants{1.0f, static_cast<float>(beta2t), static_cast<float>(1 - beta2t), 1e-30f};
  };
  auto adafactor_apply_args = [&](std::int64_t t, double p_sumsq, double u_sumsq, std::size_t count) {
    const double rms_p = std::sqrt(p_sumsq / static_cast<double>(count));
    const double rms_u = std::sqrt(u_sumsq / static_cast<double>(count));
    const double lr_t = std::min(1e-2, 1.0 / std::sqrt(static_cast<double>(t))) * std::max(1e-3, rms_p);
    return AdafactorApply{1.0f, static_cast<float>(lr_t / std::max(1.0, rms_u)), 0.0f, 0.0f, 0.0f, false};
  };

  struct Pass {
    std::string name;
    int most;   // the most threads the pass uses by design (0: every thread)
    int bytes;  // per element
    std::size_t n;
  };
  struct Optimizer {
    std::string name;
    std::vector<Pass> passes;
  };
  const std::vector<Optimizer> optimizers{
      {"Lion", {{"lion_step", 0, 20, n}}},
      {"LAMB", {{"lamb_moments", 0, 24, n}, {"lamb_apply", 0, 16, n}}},
      {"Adafactor vec", {{"adafactor_vector", 0, 16, n}, {"adafactor_apply", 0, 16, n}}},
      {"Adafactor mat", {{"matrix_sums", 2, 8, n_mat}, {"matrix_rms", 0, 4, n_mat}, {"adafactor_apply", 0, 12, n_mat}}},
      {"SGD momentum", {{"sgd_step", 0, 20, n}}},
      {"AdamW", {{"adam_step", 0, 28, n}}},
  };

  struct Row {
    int threads;
    std::vector<std::vector<double>> pass_ms, limit_ms;  // per optimizer, per pass
    std::vector<double> step_ms;
    double lion_ms, ds_ms;
  };
  std::vector<Row> rows_out;

  for (int t : thread_list) {
    // The passes without a thread argument (adafactor_apply) and DeepSpeed's loops use the
    // OpenMP default.
    omp_set_num_threads(t);
    // The fold states of p^2 and u^2 (kStatFold doubles each), added up as the engine does.
    std::vector<double> lamb_ps(kStatFold), lamb_us(kStatFold), vec_ps(kStatFold), vec_us(kStatFold), mat_ps(kStatFold),
        mat_us(kStatFold);
    auto total = [](const std::vector<double>& l) { return fold_total(l.data()); };
    auto clear = [](std::vector<double>& l) { std::fill(l.begin(), l.end(), 0.0); };
    std::int64_t lamb_t = 0, ada_t = 0;
    float lamb_trust_step = 0.0f;
    AdafactorApply vec_apply{}, mat_apply{};

    Timed lion_k{nullptr, {[&] { lion_step(p.p, m.p, g.p, DType::f32, nullptr, DType::f32, n, lion, t); }}};
    Timed lamb_k{[&] {
                   lamb_t = ++step;
                   clear(lamb_ps);
                   clear(lamb_us);
                 },
                 {[&] {
                    lamb_moments(p.p, m.p, v.p, g.p, DType::f32, 0, n, lamb_constants(lamb_t), lamb_ps.data(),
                                 lamb_us.data());
                  },
                  [&] {
                    // The trust ratio from the folds (what the engine does between the passes).
                    const double pn = std::sqrt(total(lamb_ps)), un = std::sqrt(total(lamb_us));
                    lamb_trust_step = static_cast<float>(1e-3 * (pn > 0 && un > 0 ? pn / un : 1.0));
                    lamb_apply(p.p, m.p, v.p, nullptr, DType::f32, n, lamb_constants(lamb_t), lamb_trust_step, t);
                  }}};
    Timed vec_k{[&] {
                  ada_t = ++step;
                  clear(vec_ps);
                  clear(vec_us);
                },
                {[&] {
                   adafactor_vector(p.p, v.p, g.p, DType::f32, 0, n, adafactor_constants(ada_t), vec_ps.data(),
                                    vec_us.data());
                 },
                 [&] {
                   vec_apply = adafactor_apply_args(ada_t, total(vec_ps), total(vec_us), n);
                   adafactor_apply(p.p, v.p, nullptr, g.p, DType::f32, nullptr, DType::f32, 0, n,
                                   static_cast<std::int64_t>(n), nullptr, nullptr, vec_apply);
                 }}};
    Timed mat_k{[&] {
                  ada_t = ++step;
                  clear(mat_ps);
                  clear(mat_us);
                  std::fill(row_sums.begin(), row_sums.end(), 0.0);
                  std::fill(col_sums.begin(), col_sums.end(), 0.0);
                },
                {[&] {
                   adafactor_matrix_sums(p.p, g.p, DType::f32, 0, n_mat, cols, adafactor_constants(ada_t),
                                         row_sums.data(), col_sums.data(), mat_ps.data());
                 },
                 [&] {
                   // The factored second moment and its factors (rows + cols values; part of the
                   // step, timed with the pass that needs them).
                   const AdafactorConstants c = adafactor_constants(ada_t);
                   double row_mean = 0;
                   for (std::size_t r = 0; r < row_ema.size(); ++r) {
                     row_ema[r] = c.beta2t * row_ema[r] +
                                  c.one_minus_beta2t * static_cast<float>(row_sums[r] / static_cast<double>(cols));
                     row_mean += row_ema[r];
                   }
                   row_mean /= static_cast<double>(row_ema.size());
                   for (std::size_t r = 0; r < row_ema.size(); ++r)
                     row_factor[r] = static_cast<float>(1.0 / std::sqrt(row_ema[r] / row_mean));
                   for (std::size_t k = 0; k < col_ema.size(); ++k) {
                     col_ema[k] = c.beta2t * col_ema[k] +
                                  c.one_minus_beta2t * static_cast<float>(col_sums[k] / static_cast<double>(rows));
                     col_factor[k] = 1.0f / std::sqrt(col_ema[k]);
                   }
                   adafactor_matrix_rms(g.p, DType::f32, 0, n_mat, cols, 1.0f, row_factor.data(), col_factor.data(),
                                        mat_us.data());
                 },
                 [&] {
                   mat_apply = adafactor_apply_args(ada_t, total(mat_ps), total(mat_us), n_mat);
                   adafactor_apply(p.p, nullptr, nullptr, g.p, DType::f32, nullptr, DType::f32, 0, n_mat, cols,
                                   row_factor.data(), col_factor.data(), mat_apply);
                 }}};
    Timed sgd_k{nullptr, {[&] { sgd_step(p.p, m.p, g.p, DType::f32, nullptr, DType::f32, n, sgd, t); }}};
    Timed adam_k{[&] { adam.step = ++step; },
                 {[&] { adam_step(p.p, m.p, v.p, g.p, DType::f32, nullptr, DType::f32, n, adam, adam_path, t); }}};
    Timed ds_k{[&] { ++step; }, {[&] {
                 if (ds_lion != nullptr)
                   ds_lion(pd.p, g.p, md.p, n, static_cast<std::size_t>(step), lr, 0.9f, 0.99f, wd);
               }}};

    // The yardsticks, pass by pass (read-only arrays, read-written arrays), with and without
    // software prefetch.
    auto yards = [&](bool pf) {
      const float* P = p.p;
      const float* G = g.p;
      const float* M = m.p;
      const float* V = v.p;
      return std::vector<std::vector<std::function<void()>>>{
          {yardstick<1, 2>({G}, {p.p, m.p}, n, t, pf)},                                               // Lion
          {yardstick<2, 2>({P, G}, {m.p, v.p}, n, t, pf), yardstick<2, 1>({M, V}, {p.p}, n, t, pf)},  // LAMB
          {yardstick<2, 1>({P, G}, {v.p}, n, t, pf), yardstick<2, 1>({V, G}, {p.p}, n, t, pf)},       // Adafactor vec
          {yardstick<2, 0>({P, G}, {}, n_mat, t, pf), yardstick<1, 0>({G}, {}, n_mat, t, pf),
           yardstick<1, 1>({G}, {p.p}, n_mat, t, pf)},        // Adafactor mat
          {yardstick<1, 2>({G}, {p.p, m.p}, n, t, pf)},       // SGD momentum
          {yardstick<1, 3>({G}, {p.p, m.p, v.p}, n, t, pf)},  // AdamW
      };
    };
    auto y_pf = yards(true), y_nopf = yards(false);
    std::vector<Timed> yard_items;
    for (auto* ys : {&y_pf, &y_nopf})
      for (auto& passes : *ys) yard_items.push_back(Timed{nullptr, passes});

    std::vector<Timed*> items{&lion_k, &lamb_k, &vec_k, &mat_k, &sgd_k, &adam_k};
    if (ds_lion != nullptr) items.push_back(&ds_k);
    for (Timed& y : yard_items) items.push_back(&y);
    time_interleaved(reps, items);

    Row row{t, {}, {}, {}, lion_k.best_total * 1e3, ds_lion ? ds_k.best_total * 1e3 : 0.0};
    const std::vector<Timed*> kernels{&lion_k, &lamb_k, &vec_k, &mat_k, &sgd_k, &adam_k};
    for (std::size_t o = 0; o < optimizers.size(); ++o) {
      std::vector<double> ks, ls;
      for (std::size_t k = 0; k < optimizers[o].passes.size(); ++k) {
        ks.push_back(kernels[o]->best_pass[k] * 1e3);
        ls.push_back(std::min(yard_items[o].best_pass[k], yard_items[optimizers.size() + o].best_pass[k]) * 1e3);
      }
      row.pass_ms.push_back(ks);
      row.limit_ms.push_back(ls);
      row.step_ms.push_back(kernels[o]->best_total * 1e3);
    }
    rows_out.push_back(row);
  }

  // ---- 1. the table ----
  std::printf(
      "\n1. optimizer steps (Mparam/s of the step; %%limit = limit time / kernel time)\n"
      "   thr = threads the pass ran on; 2* = at most two threads by design (row and column folds in "
      "element order), against a limit on all threads\n"
      "   Adafactor mat: a %lld x %lld matrix (%s params); Adafactor without a first moment\n\n",
      static_cast<long long>(rows), static_cast<long long>(cols), params_label(n_mat).c_str());
  std::printf("%-14s %-17s %3s %3s | %9s %9s %7s | %9s %7s\n", "optimizer", "pass", "thr", "B/p", "ms", "Mparam/s",
              "GB/s", "limit ms", "%limit");
  std::vector<std::string> below;
  for (const Row& r : rows_out) {
    for (std::size_t o = 0; o < optimizers.size(); ++o) {
      const Optimizer& op = optimizers[o];
      int step_bytes = 0;
      double step_limit = 0;
      for (std::size_t k = 0; k < op.passes.size(); ++k) {
        const Pass& ps = op.passes[k];
        step_bytes += ps.bytes;
        step_limit += r.limit_ms[o][k];
        const double ms = r.pass_ms[o][k], lim = r.limit_ms[o][k];
        char thr[8];
        if (ps.most == 0)
          std::snprintf(thr, sizeof thr, "%d", r.threads);
        else
          std::snprintf(thr, sizeof thr, "%d*", std::min(ps.most, r.threads));
        std::printf("%-14s %-17s %3s %3d | %9.2f %9.0f %7.1f | %9.2f %6.1f%%\n", k == 0 ? op.name.c_str() : "",
                    ps.name.c_str(), thr, ps.bytes, ms, static_cast<double>(ps.n) / ms / 1e3,
                    ps.bytes * static_cast<double>(ps.n) / ms / 1e6, lim, 100.0 * lim / ms);
      }
      const std::size_t count = op.passes.front().n;
      const double ms = r.step_ms[o];
      if (op.passes.size() > 1)
        std::printf("%-14s %-17s %3d %3d | %9.2f %9.0f %7.1f | %9.2f %6.1f%%\n", "", "= step", r.threads, step_bytes,
                    ms, static_cast<double>(count) / ms / 1e3, step_bytes * static_cast<double>(count) / ms / 1e6,
                    step_limit, 100.0 * step_limit / ms);
      if (step_limit / ms < 0.85) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s at %d thread%s: %.0f%% of its limit", op.name.c_str(), r.threads,
                      r.threads == 1 ? "" : "s", 100.0 * step_limit / ms);
        below.push_back(buf);
      }
    }
    std::printf("\n");
  }
  if (below.empty()) {
    std::printf("every step at >= 85%% of its limit\n");
  } else {
    std::printf("below 85%% of the limit:\n");
    for (const std::string& s : below) std::printf("  %s\n", s.c_str());
  }

  // ---- 2. Lion against DeepSpeed ----
  std::printf("\n2. Lion against DeepSpeed's cpu_lion (Lion_Optimizer::Step_8), fp32 params, grads and state\n");
  if (ds_lion == nullptr) {
    std::printf(
        "   peer not built: set ZERO_BENCH_DS_LION to the library bench/RESULTS.md (bench_host_optimizers) "
        "builds\n");
  } else {
    std::printf("   peer: %s\n", ds_note.c_str());
    // Do the two agree? One step from the same state on a small copy, outside the timed runs.
    {
      const std::size_t k = 4096;
      std::vector<float> p1(p.p, p.p + k), m1(m.p, m.p + k), p2(p1), m2(m1), g1(g.p, g.p + k);
      lion_step(p1.data(), m1.data(), g1.data(), DType::f32, nullptr, DType::f32, k, lion, 1);
      ds_lion(p2.data(), g1.data(), m2.data(), k, 1, lr, 0.9f, 0.99f, wd);
      double dp = 0, dm = 0;
      for (std::size_t i = 0; i < k; ++i) {
        dp = std::max(dp, static_cast<double>(std::fabs(p1[i] - p2[i])));
        dm = std::max(dm, static_cast<double>(std::fabs(m1[i] - m2[i])));
      }
      std::printf("   agreement after one step from the same state (lr %g): max |dp| %.3g, max |dm| %.3g\n",
                  static_cast<double>(lr), dp, dm);
    }
    std::printf("\n%3s | %9s %9s | %12s %9s | %9s | %14s\n", "thr", "libzero ms", "Mparam/s", "DeepSpeed ms",
                "Mparam/s", "ratio", "limit Mparam/s");
    for (const Row& r : rows_out) {
      std::printf("%3d | %10.2f %9.0f | %12.2f %9.0f | %8.2fx | %14.0f\n", r.threads, r.lion_ms,
                  static_cast<double>(n) / r.lion_ms / 1e3, r.ds_ms, static_cast<double>(n) / r.ds_ms / 1e3,
                  r.ds_ms / r.lion_ms, static_cast<double>(n) / r.limit_ms[0][0] / 1e3);
    }
    std::printf("   ratio = DeepSpeed time / libzero time (above 1: libzero faster)\n");
  }

  if (!skip_ns) newton_schulz_tables(thread_list, reps, ns_steps);
  return 0;
}
