// bench_host_optimizers' tables 3 and 4 (host_optimizers.cpp describes the program).
//
// 3. newton_schulz (ns_steps steps) on GPT-2 124M's matrix shapes against plain cblas_sgemm calls
//    of the same sizes (the three products of each iteration, ns_steps times), both through the
//    same BLAS with the same thread count.
// 4. 12 small matrices of one shape: newton_schulz_batch (one matrix per thread, single-threaded
//    sgemm) against newton_schulz on each in turn (all threads on each matrix); the results must
//    be identical, and the table says whether they are.
#include "host_newton_schulz.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "interleaved.hpp"
#include "offload/host_optimizer.hpp"

namespace zero::bench {
namespace {

using offload::newton_schulz;
using offload::newton_schulz_batch;

double ns_flops(std::int64_t rows, std::int64_t cols, int steps) {
  const double r = static_cast<double>(std::min(rows, cols)), k = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * r * r * k + 2.0 * r * r * r);
}

std::vector<float> normal(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& e : v) e = d(rng);
  return v;
}

void against_sgemm(int t, std::int64_t R0, std::int64_t C0, int reps, int ns_steps) {
  const std::int64_t r = std::min(R0, C0), k = std::max(R0, C0);
  const auto rk = static_cast<std::size_t>(R0 * C0);
  std::vector<float> src = normal(rk, 7), x(rk), work;
  std::vector<float> A(static_cast<std::size_t>(r * r)), B(A.size()), Y(static_cast<std::size_t>(r * k));
  const auto ri = static_cast<blasint>(r), ki = static_cast<blasint>(k);
  auto load = [&] { std::copy(src.begin(), src.end(), x.begin()); };
  Timed ns{load, {[&] { newton_schulz(x.data(), R0, C0, ns_steps, work); }}};
  // The same three products on the same sizes, without the iteration's element-wise work.
  Timed gemm{[&] {
               std::fill(B.begin(), B.end(), 0.0f);
               std::fill(Y.begin(), Y.end(), 0.0f);
             },
             {[&] {
               for (int s = 0; s < ns_steps; ++s) {
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, ri, ki, 1.0f, src.data(), ki, src.data(), ki,
                             0.0f, A.data(), ri);
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ri, ri, 2.0315f, A.data(), ri, A.data(), ri,
                             1.0f, B.data(), ri);
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ki, ri, 1.0f, B.data(), ri, src.data(), ki,
                             1.0f, Y.data(), ki);
               }
             }}};
  std::vector<Timed*> its{&ns, &gemm};
  time_interleaved(reps, its);
  const double flops = ns_flops(R0, C0, ns_steps);
  char shape[32];
  std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(R0), static_cast<long long>(C0));
  std::printf("%-10s %3d | %7.2f | %9.2f %8.1f | %9.2f %8.1f | %6.1f%%\n", shape, t, flops / 1e9, ns.best_total * 1e3,
              flops / ns.best_total / 1e9, gemm.best_total * 1e3, flops / gemm.best_total / 1e9,
              100.0 * gemm.best_total / ns.best_total);
  std::fflush(stdout);
}

void batched(int t, std::int64_t R0, std::int64_t C0, std::size_t count, int reps, int ns_steps) {
  const auto rk = static_cast<std::size_t>(R0 * C0);
  const std::vector<float> src = normal(rk * count, 11);
  std::vector<float> one(src.size()), many(src.size()), work;
  std::vector<float*> xs(count);
  for (std::size_t i = 0; i < count; ++i) xs[i] = many.data() + i * rk;
  Timed single{[&] { std::copy(src.begin(), src.end(), one.begin()); }, {[&] {
                 for (std::size_t i = 0; i < count; ++i) newton_schulz(one.data() + i * rk, R0, C0, ns_steps, work);
               }}};
  Timed batch{[&] { std::copy(src.begin(), src.end(), many.begin()); },
              {[&] { newton_schulz_batch(xs.data(), count, R0, C0, ns_steps, work, t); }}};
  std::vector<Timed*> its{&single, &batch};
  time_interleaved(reps, its);
  const double flops = ns_flops(R0, C0, ns_steps) * static_cast<double>(count);
  char shape[48];
  std::snprintf(shape, sizeof shape, "%zu x %lldx%lld", count, static_cast<long long>(R0), static_cast<long long>(C0));
  std::printf("%-14s %3d | %7.3f | %9.2f %8.1f | %9.2f %8.1f | %6.2fx | %-9s | %s\n", shape, t, flops / 1e9,
              single.best_total * 1e3, flops / single.best_total / 1e9, batch.best_total * 1e3,
              flops / batch.best_total / 1e9, single.best_total / batch.best_total, one == many ? "yes" : "NO",
              offload::newton_schulz_small(R0, C0) ? "batched" : "one by one");
  std::fflush(stdout);
}

}  // namespace

void newton_schulz_tables(const std::vector<int>& thread_list, int reps, int ns_steps) {
  std::printf(
      "\n3. newton_schulz (%d steps) on GPT-2 124M's matrices against cblas_sgemm of the same sizes\n"
      "   FLOPs per iteration for X r x k (r <= k): 2r^2k (X X^T) + 2r^3 (A A) + 2r^2k (B X); sgemm = those three "
      "calls, %d times\n"
      "   BLAS: %s\n\n",
      ns_steps, ns_steps, openblas_get_config());
  std::printf("%-10s %3s | %7s | %9s %8s | %9s %8s | %7s\n", "shape", "thr", "GFLOP", "NS ms", "GFLOP/s", "sgemm ms",
              "GFLOP/s", "NS/gemm");
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  for (int t : thread_list) {
    openblas_set_num_threads(t);
    omp_set_num_threads(t);
    for (auto [R0, C0] : shapes) against_sgemm(t, R0, C0, reps, ns_steps);
  }
  std::printf(
      "   newton_schulz: each OpenMP thread a run of rows of every product (single-threaded sgemm), the "
      "element-wise work fused in\n");
  std::printf(
      "\n4. small matrices of one shape: newton_schulz on each in turn (all threads on each) against "
      "newton_schulz_batch\n   (one matrix per thread, single-threaded sgemm); same: results bit-identical; "
      "Muon: what its owners do with the shape\n\n");
  std::printf("%-14s %3s | %7s | %9s %8s | %9s %8s | %7s | %-9s | %s\n", "matrices", "thr", "GFLOP", "single ms",
              "GFLOP/s", "batch ms", "GFLOP/s", "speedup", "same", "Muon");
  const std::vector<std::pair<std::int64_t, std::int64_t>> small{{64, 256},   {128, 512},  {512, 128},
                                                                 {256, 1024}, {384, 1536}, {512, 2048}};
  for (int t : thread_list) {
    if (t < 2) continue;
    openblas_set_num_threads(t);
    omp_set_num_threads(t);
    for (auto [R0, C0] : small) batched(t, R0, C0, 12, reps, ns_steps);
  }
}

}  // namespace zero::bench
