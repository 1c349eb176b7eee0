// The CUDA backend's Adafactor kernels against the host kernels (offload/src/host_adafactor.cpp),
// through the Backend interface optim/adafactor.cpp uses, and the optimizer itself stepped on the
// device and on the host side by side (test/gpu/optimizer_stepper.hpp).
//
// What must hold, and the tolerances: V, M, the master and the parameters bit for bit given the
// same scale (the element-wise arithmetic is the host's); a matrix's row and column sums bit for
// bit (the device folds each row and column in the host's element order); the sums of p^2 and
// u^2 deterministic (the same run twice gives the same bits) and within 1e-10 relative of the
// host's lanes (fixed-order double sums against eight sequential lanes: rounding only). Through
// the optimizer, the stored R, C and V stay bit for bit the host's over several steps, and the
// master within 1e-6 relative (its scale comes from those sums, so it may differ in the last
// bit of a float).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "offload/host_optimizer.hpp"
#include "optimizer_stepper.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

offload::AdafactorConstants constants(std::int64_t step, float grad_scale) {
  const double beta2t = 1.0 - std::pow(static_cast<double>(step), -0.8);
  return {grad_scale, static_cast<float>(beta2t), static_cast<float>(1.0 - beta2t), 1e-30f};
}

bool close(double got, double want, double rel) { return std::abs(got - want) <= rel * std::abs(want); }

// The runs a tensor of n elements is cut into: uneven, some crossing rows, some inside one.
std::vector<std::pair<std::size_t, std::size_t>> runs_of(std::size_t n) {
  const std::size_t cuts[] = {0, n / 7, n / 7 + 1, n / 2, n - n / 5, n};
  std::vector<std::pair<std::size_t, std::size_t>> r;
  for (std::size_t k = 0; k + 1 < std::size(cuts); ++k)
    if (cuts[k] < cuts[k + 1]) r.emplace_back(cuts[k], cuts[k + 1]);
  return r;
}

// One [rows, cols] matrix (cols = n, rows = 1: a vector) stepped three times by the host kernels
// and the device kernels, run by run, every pass compared.
void check_tensor(Backend& dev, std::int64_t rows, std::int64_t cols, DType gt, DType pt, bool first_moment) {
  const bool factored = rows >= 2;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  auto master = random_floats(n, 51, 0.4f, false);
  auto v = std::vector<float>(n, 0.0f), m1 = random_floats(n, 52, 0.01f, false);
  std::vector<char> out(n * dtype_size(pt), 0);
  Buffer dmaster = upload(dev, master), dv = upload(dev, v), dm1 = upload(dev, m1), dout = upload(dev, out);
  std::string what = std::to_string(rows);  // appended: GCC 12's -Wrestrict misreads "[" + ...
  what += " x " + std::to_string(cols) + " grad " + std::string(dtype_name(gt)) + " out " + std::string(dtype_name(pt));
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO(what << " step " << step);
    const auto grad = to_dtype(random_floats(n, 60 + static_cast<std::uint64_t>(step), 1.0f, false), gt);
    Buffer dgrad = upload(dev, grad);
    const auto c = constants(step, 0.5f);
    const std::size_t ge = dtype_size(gt);
    // Pass 1: host lanes and folds; device sums (and the same runs again from the same state,
    // for determinism, into a second set).
    double pl[offload::kStatFold] = {}, ul[offload::kStatFold] = {};
    std::vector<double> rs(static_cast<std::size_t>(factored ? rows : 0)), cs(static_cast<std::size_t>(cols));
    const std::size_t slots = 2 + rs.size() + cs.size();
    Buffer dsums = upload(dev, std::vector<double>(2 * slots, 0.0));
    Buffer dv_again = upload(dev, download<float>(dev, dv, n));
    for (int again = 0; again < 2; ++again)
      for (const auto& [a, b] : runs_of(n)) {
        double* s = dsums.as<double>() + static_cast<std::size_t>(again) * slots;
        const auto at = static_cast<std::int64_t>(a);
        if (!factored) {
          float* vv = (again ? dv_again : dv).as<float>() + a;
          dev.adafactor_vector(dmaster.as<float>() + a, vv, dgrad.as<char>() + a * ge, gt, b - a, c, s);
          if (!again)
            offload::adafactor_vector(master.data() + a, v.data() + a, grad.data() + a * ge, gt, at, b - a, c, pl, ul);
          continue;
        }
        dev.adafactor_matrix_sums(dmaster.as<float>() + a, dgrad.as<char>() + a * ge, gt, at, b - a, cols, c, s + 2,
                                  s + 2 + rs.size(), s);
        if (!again)
          offload::adafactor_matrix_sums(master.data() + a, grad.data() + a * ge, gt, at, b - a, cols, c, rs.data(),
                                         cs.data(), pl);
      }
    const auto sums = download<double>(dev, dsums, 2 * slots);
    for (std::size_t k = 0; k < slots; ++k) CHECK(sums[k] == sums[slots + k]);  // deterministic
    CHECK(close(sums[0], offload::fold_total(pl), 1e-10));
    std::vector<float> rf, cf;
    double scale_sumsq = 0.0;
    if (!factored) {
      require_same(download<float>(dev, dv, n).data(), v.data(), n, DType::f32, what + " V");
      CHECK(close(sums[1], offload::fold_total(ul), 1e-10));
      scale_sumsq = offload::fold_total(ul);
    } else {
      for (std::size_t i = 0; i < rs.size(); ++i) CHECK(sums[2 + i] == rs[i]);
      for (std::size_t j = 0; j < cs.size(); ++j) CHECK(sums[2 + rs.size() + j] == cs[j]);
      // The factors as optim/adafactor.cpp forms them (no stored R and C: the first step's).
      double r_sum = 0.0;
      for (double x : rs) r_sum += x / static_cast<double>(cols);
      for (double x : rs)
        rf.push_back(static_cast<float>(1.0 / std::sqrt(x / static_cast<double>(cols) / (r_sum / rows))));
      for (double x : cs) cf.push_back(static_cast<float>(1.0 / std::sqrt(x / static_cast<double>(rows))));
      Buffer drf = upload(dev, rf), dcf = upload(dev, cf), du = upload(dev, std::vector<double>(1, 0.0));
      double hl[offload::kStatFold] = {};
      for (const auto& [a, b] : runs_of(n)) {
        const auto at = static_cast<std::int64_t>(a);
        dev.adafactor_matrix_rms(dgrad.as<char>() + a * ge, gt, at, b - a, cols, c.grad_scale, drf.as<float>(),
                                 dcf.as<float>(), du.as<double>());
        offload::adafactor_matrix_rms(grad.data() + a * ge, gt, at, b - a, cols, c.grad_scale, rf.data(), cf.data(),
                                      hl);
      }
      CHECK(close(download<double>(dev, du, 1)[0], offload::fold_total(hl), 1e-10));
      scale_sumsq = offload::fold_total(hl);
      // Pass 3 below reads the factors from these buffers.
      const offload::AdafactorApply ap{c.grad_scale, 1e-3f, -1e-5f, 0.9f, 0.1f, first_moment};
      for (const auto& [a, b] : runs_of(n)) {
        const auto at = static_cast<std::int64_t>(a);
        dev.adafactor_apply(dmaster.as<float>() + a, dv.as<float>() + a, dm1.as<float>() + a, dgrad.as<char>() + a * ge,
                            gt, dout.as<char>() + a * dtype_size(pt), pt, at, b - a, cols, drf.as<float>(),
                            dcf.as<float>(), ap);
        offload::adafactor_apply(master.data() + a, v.data() + a, m1.data() + a, grad.data() + a * ge, gt,
                                 out.data() + a * dtype_size(pt), pt, at, b - a, cols, rf.data(), cf.data(), ap);
      }
    }
    if (!factored) {
      const float scale = static_cast<float>(1e-3 / std::max(1.0, std::sqrt(scale_sumsq / static_cast<double>(n))));
      const offload::AdafactorApply ap{c.grad_scale, scale, -1e-5f, 0.9f, 0.1f, first_moment};
      for (const auto& [a, b] : runs_of(n)) {
        const auto at = static_cast<std::int64_t>(a);
        dev.adafactor_apply(dmaster.as<float>() + a, dv.as<float>() + a, dm1.as<float>() + a, dgrad.as<char>() + a * ge,
                            gt, dout.as<char>() + a * dtype_size(pt), pt, at, b - a, cols, nullptr, nullptr, ap);
        offload::adafactor_apply(master.data() + a, v.data() + a, m1.data() + a, grad.data() + a * ge, gt,
                                 out.data() + a * dtype_size(pt), pt, at, b - a, cols, nullptr, nullptr, ap);
      }
    }
    require_same(download<float>(dev, dmaster, n).data(), master.data(), n, DType::f32, what + " master");
    require_same(download<float>(dev, dm1, n).data(), m1.data(), n, DType::f32, what + " M");
    require_same(download<char>(dev, dout, out.size()).data(), out.data(), n, pt, what + " params");
  }
}

}  // namespace

TEST_CASE("Adafactor's device passes equal the host kernels", "[kernels][optim]") {
  auto dev = backend("cuda");
  SECTION("vectors") {
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) check_tensor(*dev, 1, 70001, gt, DType::bf16, false);
    check_tensor(*dev, 1, 1, DType::f32, DType::f32, true);
  }
  SECTION("matrices") {
    check_tensor(*dev, 37, 53, DType::f32, DType::bf16, false);
    check_tensor(*dev, 300, 7, DType::bf16, DType::f16, true);
    check_tensor(*dev, 2, 4099, DType::f16, DType::f32, false);
    check_tensor(*dev, 257, 513, DType::bf16, DType::bf16, true);
  }
}

// optim/adafactor.cpp on the device against itself on the host: stage 0 over three slices, so
// tensors are cut across slices and runs, the statistics combined as the engine combines them.
TEST_CASE("Adafactor on the device follows the host optimizer step by step", "[optim]") {
  auto dev = backend("cuda");
  Layout layout;
  layout.add_unit("embeddings", {{"wte", {97, 24}}, {"wpe", {16, 24}}});
  layout.add_unit("h.0", {{"ln", {24}}, {"fc", {24, 96}}, {"bias", {96}}, {"proj", {96, 24}}, {"thin", {1, 33}}});
  for (const bool beta1 : {false, true}) {
    OptimizerConfig cfg;
    cfg.type = OptimizerType::adafactor;
    cfg.weight_decay = 0.01;
    cfg.scale_parameter = true;
    cfg.adafactor_beta1 = beta1 ? 0.9 : 0.0;
    for (DType gt : {DType::f32, DType::bf16}) {
      OptimizerStepper host(layout, cfg, 3, gt, nullptr), device(layout, cfg, 3, gt, dev.get());
      for (std::int64_t t = 1; t <= 4; ++t) {
        host.step(t, 1e-2, 0.25f, static_cast<std::uint64_t>(t));
        device.step(t, 1e-2, 0.25f, static_cast<std::uint64_t>(t));
        for (int u = 0; u < layout.num_units(); ++u) {
          INFO("beta1 " << beta1 << " grad " << dtype_name(gt) << " step " << t << " unit " << u);
          const auto hv = host.state(u, 0), dv = device.state(u, 0);
          require_same(dv.data(), hv.data(), hv.size(), DType::f32, "V, R and C");
          const auto hm = host.master(u), dm = device.master(u);
          for (std::size_t i = 0; i < hm.size(); ++i)
            if (!close(dm[i], hm[i], 1e-6)) {
              INFO("master element " << i << ": device " << dm[i] << " host " << hm[i]);
              REQUIRE(close(dm[i], hm[i], 1e-6));
            }
        }
      }
    }
  }
}
