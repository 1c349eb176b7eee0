// Muon's host Newton-Schulz (host_optimizer.hpp): the same bits on any number of threads, the
// same bits batched (newton_schulz_batch, one matrix per thread) as one at a time,
// and close to a double-precision iteration written from the equations.
#include <cblas.h>
#include <omp.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "optimizer_reference.hpp"
#include "random_values.hpp"

using namespace zero;
using namespace zero::offload;
using zero::test::random_values;

namespace {

constexpr int kSteps = 5;

// newton_schulz on `threads` threads, OpenBLAS's own count set to 4 meanwhile (it must not
// matter: newton_schulz runs sgemm single-threaded).
std::vector<float> orthogonalised(std::vector<float> x, std::int64_t rows, std::int64_t cols, int threads) {
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(4);
  std::vector<float> work;
  newton_schulz(x.data(), rows, cols, kSteps, work, threads);
  openblas_set_num_threads(before);
  CHECK(openblas_get_num_threads() == before);
  return x;
}

// Elements that differ (a count, not a dump of both vectors, on failure).
std::size_t differ(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

}  // namespace

TEST_CASE("newton_schulz gives the same bits on any number of threads", "[host_optimizer][muon]") {
  // Wide and tall, small and large enough to be cut over the threads, rows not a multiple of the
  // threads' row runs (200 x 520 is one that OpenBLAS's own threads give other bits for).
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{
      {48, 80}, {80, 48}, {200, 520}, {520, 200}, {264, 1100}};
  for (auto [rows, cols] : shapes) {
    CAPTURE(rows, cols);
    const auto x = random_values(static_cast<std::size_t>(rows * cols), 3, -1.0f, 1.0f);
    const auto one = orthogonalised(x, rows, cols, 1);
    for (int t : {2, 3, 4}) {
      CAPTURE(t);
      CHECK(differ(orthogonalised(x, rows, cols, t), one) == 0);
    }
    // Close to the double-precision iteration (fp32 products and sums).
    const std::vector<double> ref =
        test::optref::newton_schulz(std::vector<double>(x.begin(), x.end()), static_cast<std::size_t>(rows),
                                    static_cast<std::size_t>(cols), kSteps);
    double worst = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - one[i]));
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("newton_schulz_batch gives each matrix the bits of newton_schulz", "[host_optimizer][muon]") {
  // Small shapes (batched one per thread) and one that is not small, more matrices than threads.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{{64, 256}, {128, 512}, {512, 128}, {300, 1200}};
  CHECK(newton_schulz_small(64, 256));
  CHECK(newton_schulz_small(512, 128));
  CHECK_FALSE(newton_schulz_small(300, 1200));
  for (auto [rows, cols] : shapes) {
    CAPTURE(rows, cols);
    const std::size_t count = 5, n = static_cast<std::size_t>(rows * cols);
    const auto all = random_values(n * count, 17, -2.0f, 2.0f);
    for (int t : {1, 2, 3}) {
      CAPTURE(t);
      std::vector<float> batched = all, work;
      std::vector<float*> xs;
      for (std::size_t i = 0; i < count; ++i) xs.push_back(batched.data() + i * n);
      newton_schulz_batch(xs.data(), count, rows, cols, kSteps, work, t);
      for (std::size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        const std::vector<float> one(all.begin() + static_cast<std::ptrdiff_t>(i * n),
                                     all.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
        const std::vector<float> got(batched.begin() + static_cast<std::ptrdiff_t>(i * n),
                                     batched.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
        CHECK(differ(got, orthogonalised(one, rows, cols, 2)) == 0);
      }
    }
  }
}
