// The fold states of the host kernels' per-tensor statistics (host_optimizer.hpp): the sum of
// squares follows the block-and-lane definition written out here, and the folds of LAMB,
// Adafactor and 1-bit LAMB give the same bits however a tensor is cut into runs and on any
// number of threads, with the same element-wise results.
#include <catch2/catch.hpp>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "random_values.hpp"

using namespace zero;
using namespace zero::offload;
using zero::test::random_values;

namespace {

using Fold = std::array<double, kStatFold>;

// The definition: element q of the tensor in block q / kFoldBlock, lane q mod kStatLanes; each
// block's lanes from zero in element order; the blocks' lanes added in block order; then the
// lanes in the tree ((0+1)+(2+3))+((4+5)+(6+7)).
double defined_sum_of_squares(const float* x, std::int64_t at, std::size_t n) {
  double total[kStatLanes] = {}, block[kStatLanes] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const auto q = static_cast<std::size_t>(at) + i;
    if (q % kFoldBlock == 0 && i > 0) {
      for (int l = 0; l < kStatLanes; ++l) total[l] += block[l], block[l] = 0.0;
    }
    const double p = x[i];
    block[q % kStatLanes] += p * p;
  }
  for (int l = 0; l < kStatLanes; ++l) total[l] += block[l];
  const double* t = total;
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

// Cuts of [0, n): whole, and runs ending inside blocks, on a block boundary and one element past.
std::vector<std::vector<std::size_t>> cuts_of(std::size_t n, std::int64_t at) {
  const auto b = static_cast<std::size_t>(kFoldBlock) - static_cast<std::size_t>(at) % kFoldBlock;  // a boundary
  return {{0, n}, {0, 1, 17, b, b + 1, b + kFoldBlock, n}, {0, b - 5, 2 * b + 333, n - 9, n}, {0, n / 3, n / 2, n}};
}

// Runs body(b, e) over the runs of a cut on `threads` threads.
template <class Body>
void over_runs(const std::vector<std::size_t>& cut, int threads, Body&& body) {
  omp_set_num_threads(threads);
  for (std::size_t k = 0; k + 1 < cut.size(); ++k) body(cut[k], cut[k + 1]);
  omp_set_num_threads(2);
}

// The first run's arrays and sums, and every later run's against them bit for bit.
struct SameAsFirst {
  std::vector<std::vector<float>> arrays;
  std::vector<double> sums;
  // True on the first run (which is recorded).
  bool check(const std::vector<const std::vector<float>*>& a, const std::vector<double>& s) {
    if (arrays.empty()) {
      for (const auto* x : a) arrays.push_back(*x);
      sums = s;
      return true;
    }
    for (std::size_t k = 0; k < a.size(); ++k)
      REQUIRE(std::memcmp(a[k]->data(), arrays[k].data(), a[k]->size() * 4) == 0);
    REQUIRE(s == sums);
    return false;
  }
};

}  // namespace

TEST_CASE("fold states follow the block and lane definition", "[host_optimizer][folds]") {
  const std::int64_t at = static_cast<std::int64_t>(kFoldBlock) - 300;  // a slice starting inside a block
  const std::size_t n = 3 * kFoldBlock + 1234;
  // Values of different magnitudes, so that the order of the additions shows in the bits.
  std::vector<float> p = random_values(n, 1, -1.0f, 1.0f);
  for (std::size_t i = 0; i < n; i += 7) p[i] *= 1e4f;
  const std::vector<float> g = random_values(n, 2, -1.0f, 1.0f);
  const double want = defined_sum_of_squares(p.data(), at, n);
  // A different order gives different bits here (else the test could not tell).
  double plain = 0.0;
  for (float x : p) plain += static_cast<double>(x) * x;
  REQUIRE(plain != want);
  const AdafactorConstants c{1.0f, 0.5f, 0.5f, 1e-30f};
  for (const auto& cut : cuts_of(n, at))
    for (int threads : {1, 2, 3}) {
      std::vector<float> v(n, 0.0f);
      Fold pf{}, uf{};
      over_runs(cut, threads, [&](std::size_t b, std::size_t e) {
        adafactor_vector(p.data() + b, v.data() + b, g.data() + b, DType::f32, at + static_cast<std::int64_t>(b), e - b,
                         c, pf.data(), uf.data());
      });
      INFO("runs " << cut.size() - 1 << " threads " << threads);
      REQUIRE(fold_total(pf.data()) == want);
    }
}

TEST_CASE("LAMB, Adafactor and 1-bit LAMB folds do not depend on the cut or the thread count",
          "[host_optimizer][folds]") {
  const std::int64_t at = 5 * static_cast<std::int64_t>(kFoldBlock) + 4001;
  const std::size_t n = 4 * kFoldBlock + 777;
  const std::vector<float> p0 = random_values(n, 3, -1.0f, 1.0f), g = random_values(n, 4, -0.1f, 0.1f);
  const std::vector<float> m0 = random_values(n, 5, -0.01f, 0.01f), v0 = random_values(n, 6, 0.0f, 1e-4f);

  SECTION("lamb_moments") {
    const LambConstants c{0.5f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-6f, 0.01f, 1.0f / 0.19f, 1.0f / 0.002f};
    SameAsFirst first;
    for (const auto& cut : cuts_of(n, at))
      for (int threads : {1, 2, 3}) {
        std::vector<float> m = m0, v = v0;
        Fold pf{}, uf{};
        over_runs(cut, threads, [&](std::size_t b, std::size_t e) {
          lamb_moments(p0.data() + b, m.data() + b, v.data() + b, g.data() + b, DType::f32,
                       at + static_cast<std::int64_t>(b), e - b, c, pf.data(), uf.data());
        });
        INFO("runs " << cut.size() - 1 << " threads " << threads);
        if (!first.check({&m, &v}, {fold_total(pf.data()), fold_total(uf.data())})) continue;
        // ||u||^2 from the paper's equations in double: the float rounding of u only.
        double u_double = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
          const double gi = 0.5 * g[i], mi = 0.9 * m0[i] + 0.1 * gi, vi = 0.999 * v0[i] + 0.001 * gi * gi;
          const double u = (mi / 0.19) / (std::sqrt(vi / 0.002) + 1e-6) + 0.01 * p0[i];
          u_double += u * u;
        }
        REQUIRE(first.sums[0] == defined_sum_of_squares(p0.data(), at, n));
        REQUIRE(std::abs(first.sums[1] - u_double) <= 1e-6 * u_double);
      }
  }

  SECTION("adafactor_matrix_rms and the matrix sums' fold of p^2") {
    const std::int64_t cols = 3000, rows = (at + static_cast<std::int64_t>(n)) / cols + 1;
    const std::vector<float> rf = random_values(static_cast<std::size_t>(rows), 7, 0.5f, 2.0f);
    const std::vector<float> cf = random_values(static_cast<std::size_t>(cols), 8, 0.5f, 2.0f);
    const AdafactorConstants c{1.0f, 0.5f, 0.5f, 1e-30f};
    double u_ref = -1.0, p_ref = -1.0;
    std::vector<double> rs_ref, cs_ref;
    for (const auto& cut : cuts_of(n, at))
      for (int threads : {1, 2}) {
        Fold uf{}, pf{};
        std::vector<double> rs(static_cast<std::size_t>(rows)), cs(static_cast<std::size_t>(cols));
        over_runs(cut, threads, [&](std::size_t b, std::size_t e) {
          const std::int64_t a = at + static_cast<std::int64_t>(b);
          adafactor_matrix_rms(g.data() + b, DType::f32, a, e - b, cols, 2.0f, rf.data(), cf.data(), uf.data());
          adafactor_matrix_sums(p0.data() + b, g.data() + b, DType::f32, a, e - b, cols, c, rs.data(), cs.data(),
                                pf.data());
        });
        INFO("runs " << cut.size() - 1 << " threads " << threads);
        if (u_ref < 0) {
          u_ref = fold_total(uf.data()), p_ref = fold_total(pf.data()), rs_ref = rs, cs_ref = cs;
          double u_double = 0.0;
          for (std::size_t i = 0; i < n; ++i) {
            const auto q = at + static_cast<std::int64_t>(i);
            const double u =
                2.0 * g[i] * rf[static_cast<std::size_t>(q / cols)] * cf[static_cast<std::size_t>(q % cols)];
            u_double += u * u;
          }
          REQUIRE(std::abs(u_ref - u_double) <= 1e-6 * u_double);
          REQUIRE(p_ref == defined_sum_of_squares(p0.data(), at, n));
        }
        REQUIRE(fold_total(uf.data()) == u_ref);
        REQUIRE(fold_total(pf.data()) == p_ref);
        REQUIRE(rs == rs_ref);
        REQUIRE(cs == cs_ref);
      }
  }

  SECTION("onebit_lamb_moments") {
    const OneBitLambConstants c{0.9f, 10.0f, 0.999f, 0.001f, 1e-6f, 0.01f, 2.0f};
    const std::vector<float> m_new = random_values(n, 9, -0.02f, 0.02f);
    SameAsFirst first;
    for (const auto& cut : cuts_of(n, at))
      for (int threads : {1, 2, 3}) {
        std::vector<float> m = m0, vf = v0;
        Fold uf{}, prf{};
        double worst = 0.0;
        over_runs(cut, threads, [&](std::size_t b, std::size_t e) {
          onebit_lamb_moments(p0.data() + b, m.data() + b, v0.data() + b, vf.data() + b, m_new.data() + b,
                              at + static_cast<std::int64_t>(b), e - b, c, uf.data(), prf.data(), worst);
        });
        INFO("runs " << cut.size() - 1 << " threads " << threads);
        if (first.check({&m, &vf}, {fold_total(uf.data()), fold_total(prf.data()), worst})) REQUIRE(worst > 1.0);
      }
  }
}
