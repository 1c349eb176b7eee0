// The CUDA backend's Lion and LAMB kernels against the host kernels they must equal, through the
// Backend interface the optimizers use (optim/lion.cpp, optim/lamb.cpp): Lion and LAMB's two
// passes element by element bit for bit (every gradient and parameter dtype, aligned and
// misaligned runs), and LAMB's per-run sums of p^2 and u^2 deterministic and within double
// rounding of the host's lanes, over several steps of tensors cut into slices and runs at uneven
// boundaries, the trust ratio formed from them as optim/lamb.cpp forms it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "offload/host_optimizer.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

offload::LionConstants lion_constants(double lr, double wd, float grad_scale) {
  const double b1 = 0.9, b2 = 0.99;
  return {grad_scale,
          static_cast<float>(lr),
          static_cast<float>(1.0 - lr * wd),
          static_cast<float>(b1),
          static_cast<float>(1.0 - b1),
          static_cast<float>(b2),
          static_cast<float>(1.0 - b2)};
}

offload::LambConstants lamb_constants(std::int64_t step, double wd, float grad_scale) {
  const double b1 = 0.9, b2 = 0.999, t = static_cast<double>(step);
  return {grad_scale,
          static_cast<float>(b1),
          static_cast<float>(1.0 - b1),
          static_cast<float>(b2),
          static_cast<float>(1.0 - b2),
          1e-6f,
          static_cast<float>(wd),
          static_cast<float>(1.0 / (1.0 - std::pow(b1, t))),
          static_cast<float>(1.0 / (1.0 - std::pow(b2, t)))};
}

// `count` zero values, then v (a run placed `count` elements into its buffer).
template <class T>
std::vector<T> after(std::size_t count, const std::vector<T>& v) {
  std::vector<T> out(count, T{});
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

void check_lion(DType gt, DType pt, bool with_out, double wd, std::size_t n, std::size_t skip = 0) {
  auto dev = backend("cuda");
  auto master = random_floats(n, 21, 0.5f);
  auto m = random_floats(n, 22, 0.01f);
  auto grad = to_dtype(random_floats(n, 23, 2.0f), gt);
  std::vector<char> out(n * dtype_size(pt), 0);
  const std::size_t k = skip, gk = k * dtype_size(gt), pk = k * dtype_size(pt);
  Buffer dmaster = upload(*dev, after(k, master)), dm = upload(*dev, after(k, m));
  Buffer dgrad = upload(*dev, after(gk, grad)), dout = upload(*dev, after(pk, out));
  for (int step = 1; step <= 3; ++step) {
    const auto c = lion_constants(1e-4 * step, wd, 1.0f / 512.0f);
    void* host_out = with_out ? out.data() : nullptr;
    offload::lion_step(master.data(), m.data(), grad.data(), gt, host_out, pt, n, c, 1);
    dev->lion(dmaster.as<float>() + k, dm.as<float>() + k, dgrad.as<char>() + gk, gt,
              with_out ? dout.as<char>() + pk : nullptr, pt, n, c);
  }
  const std::string what = std::string("lion grad ") + std::string(dtype_name(gt)) + " out " +
                           (with_out ? std::string(dtype_name(pt)) : "none") + " wd " + std::to_string(wd) +
                           " offset " + std::to_string(k);
  require_same(download<float>(*dev, dmaster, n + k).data() + k, master.data(), n, DType::f32, what + " master");
  require_same(download<float>(*dev, dm, n + k).data() + k, m.data(), n, DType::f32, what + " m");
  if (with_out) require_same(download<char>(*dev, dout, out.size() + pk).data() + pk, out.data(), n, pt, what);
}

// A model of a few tensors, each cut into partition slices and the slices into runs (sub-groups)
// at uneven boundaries: LAMB's state on the host and on the device, stepped side by side.
struct LambModel {
  std::vector<std::size_t> sizes{1, 7, 4099, 65537, 300001};
  int slices = 3;
  DType gt;
  std::vector<std::vector<float>> master, m, v;
  std::vector<std::vector<char>> grad;
  std::vector<Buffer> dmaster, dm, dv, dgrad;

  explicit LambModel(Backend& dev, DType g) : gt(g) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const std::size_t n = sizes[t];
      master.push_back(random_floats(n, 100 + t, 0.3f, false));
      m.push_back(random_floats(n, 200 + t, 0.01f, false));
      auto vv = random_floats(n, 300 + t, 0.01f, false);
      for (float& x : vv) x = x * x;
      v.push_back(vv);
      grad.push_back(to_dtype(random_floats(n, 400 + t, 1.0f, false), gt));
      dmaster.push_back(upload(dev, master[t]));
      dm.push_back(upload(dev, m[t]));
      dv.push_back(upload(dev, v[t]));
      dgrad.push_back(upload(dev, grad[t]));
    }
  }
  // Slice s of tensor t: [lo, hi); each slice is stepped in two runs, cut at a third of it.
  std::pair<std::size_t, std::size_t> slice(std::size_t t, int s) const {
    const std::size_t n = sizes[t], per = (n + static_cast<std::size_t>(slices) - 1) / static_cast<std::size_t>(slices);
    const std::size_t lo = std::min(n, per * static_cast<std::size_t>(s)), hi = std::min(n, lo + per);
    return {lo, hi};
  }
};

double trust_of(double w2, double u2) {
  const double w = std::sqrt(w2), u = std::sqrt(u2);
  return std::clamp(w > 0.0 && u > 0.0 ? w / u : 1.0, 0.01, 10.0);
}

}  // namespace

TEST_CASE("fused Lion equals the host reference bit for bit", "[kernels][optim]") {
  for (DType gt : kTypes)
    for (DType pt : kTypes) SECTION(std::string(dtype_name(gt)) + " -> " + std::string(dtype_name(pt))) {
        check_lion(gt, pt, true, 0.1, 10007);
      }
  SECTION("no parameter output, no weight decay") { check_lion(DType::bf16, DType::bf16, false, 0.0, 513); }
  SECTION("a run larger than one grid") {
    check_lion(DType::bf16, DType::bf16, true, 0.1, small_run() ? 5000 : (std::size_t{1} << 23) + 12345);
  }
  SECTION("one element") { check_lion(DType::f16, DType::f32, true, 0.0, 1); }
  for (std::size_t skip : {1, 2, 3}) SECTION("a misaligned run, offset " + std::to_string(skip)) {
      check_lion(DType::bf16, DType::f16, true, 0.1, 1001, skip);
    }
}

TEST_CASE("LAMB's passes equal the host element by element; its sums are deterministic", "[kernels][optim]") {
  auto dev = backend("cuda");
  for (DType gt : {DType::f32, DType::bf16})
    for (DType pt : kTypes) {
      const std::size_t n = 70001;
      auto master = random_floats(n, 31, 0.5f, false);
      auto m = random_floats(n, 32, 0.01f, false);
      auto v = random_floats(n, 33, 0.01f, false);
      for (float& x : v) x = x * x;
      auto grad = to_dtype(random_floats(n, 34, 2.0f, false), gt);
      std::vector<char> out(n * dtype_size(pt), 0);
      Buffer dmaster = upload(*dev, master), dm = upload(*dev, m), dv = upload(*dev, v), dgrad = upload(*dev, grad);
      Buffer dout = upload(*dev, out), dsums = upload(*dev, std::vector<double>(4, 0.0));
      const auto c = lamb_constants(2, 0.01, 1.0f / 8.0f);
      double pl[offload::kStatFold] = {}, ul[offload::kStatFold] = {};
      offload::lamb_moments(master.data(), m.data(), v.data(), grad.data(), gt, 0, n, c, pl, ul);
      // The same run twice (the second into sums[2..3], from the state before the first).
      Buffer m0 = upload(*dev, download<float>(*dev, dm, n)), v0 = upload(*dev, download<float>(*dev, dv, n));
      dev->lamb_moments(dmaster.as<float>(), dm.as<float>(), dv.as<float>(), dgrad.get(), gt, n, c, dsums.as<double>());
      dev->lamb_moments(dmaster.as<float>(), m0.as<float>(), v0.as<float>(), dgrad.get(), gt, n, c,
                        dsums.as<double>() + 2);
      const std::string what =
          std::string("lamb grad ") + std::string(dtype_name(gt)) + " out " + std::string(dtype_name(pt));
      require_same(download<float>(*dev, dm, n).data(), m.data(), n, DType::f32, what + " m");
      require_same(download<float>(*dev, dv, n).data(), v.data(), n, DType::f32, what + " v");
      const auto sums = download<double>(*dev, dsums, 4);
      const double hp = offload::fold_total(pl), hu = offload::fold_total(ul);
      INFO(what);
      CHECK(sums[0] == sums[2]);  // bit for bit: the same run reduces in the same order
      CHECK(sums[1] == sums[3]);
      CHECK(std::abs(sums[0] - hp) <= 1e-10 * hp);
      CHECK(std::abs(sums[1] - hu) <= 1e-10 * hu);
      // The apply pass with the same step: bit for bit.
      const float step = 1e-3f * static_cast<float>(trust_of(hp, hu));
      offload::lamb_apply(master.data(), m.data(), v.data(), out.data(), pt, n, c, step, 1);
      dev->lamb_apply(dmaster.as<float>(), dm.as<float>(), dv.as<float>(), dout.get(), pt, n, c, step);
      require_same(download<float>(*dev, dmaster, n).data(), master.data(), n, DType::f32, what + " master");
      require_same(download<char>(*dev, dout, out.size()).data(), out.data(), n, pt, what + " params");
    }
}

TEST_CASE("LAMB on the device over several steps: per-tensor statistics from slices and runs", "[kernels][optim]") {
  auto dev = backend("cuda");
  for (DType gt : {DType::f32, DType::bf16}) {
    LambModel model(*dev, gt);
    const std::size_t tensors = model.sizes.size(), slices = static_cast<std::size_t>(model.slices);
    Buffer dsums = dev->alloc(2 * tensors * slices * sizeof(double));
    for (std::int64_t step = 1; step <= 5; ++step) {
      const auto c = lamb_constants(step, step % 2 ? 0.01 : 0.0, 0.25f);
      const double lr = 2e-3;
      dev->zero(dsums.get(), dsums.bytes());
      std::vector<double> host(2 * tensors, 0.0);
      // Pass 0: each slice in two runs continuing one fold (host lanes; device sums per slice).
      for (std::size_t t = 0; t < tensors; ++t)
        for (int s = 0; s < model.slices; ++s) {
          const auto [lo, hi] = model.slice(t, s);
          double pl[offload::kStatFold] = {}, ul[offload::kStatFold] = {};
          const std::size_t cut = lo + (hi - lo) / 3;
          for (const auto& [a, b] : {std::pair{lo, cut}, std::pair{cut, hi}}) {
            if (a == b) continue;
            const std::size_t ge = dtype_size(gt);
            offload::lamb_moments(model.master[t].data() + a, model.m[t].data() + a, model.v[t].data() + a,
                                  model.grad[t].data() + a * ge, gt, static_cast<std::int64_t>(a), b - a, c, pl, ul);
            double* sums = dsums.as<double>() + 2 * (t * slices + static_cast<std::size_t>(s));
            dev->lamb_moments(model.dmaster[t].as<float>() + a, model.dm[t].as<float>() + a,
                              model.dv[t].as<float>() + a, model.dgrad[t].as<char>() + a * ge, gt, b - a, c, sums);
          }
          host[2 * t] += offload::fold_total(pl), host[2 * t + 1] += offload::fold_total(ul);
        }
      // Between the passes: the slices' sums added in slice order, as SliceStats::combine does.
      const auto per_slice = download<double>(*dev, dsums, 2 * tensors * slices);
      for (std::size_t t = 0; t < tensors; ++t) {
        double w2 = 0.0, u2 = 0.0;
        for (std::size_t s = 0; s < slices; ++s)
          w2 += per_slice[2 * (t * slices + s)], u2 += per_slice[2 * (t * slices + s) + 1];
        INFO("dtype " << dtype_name(gt) << " step " << step << " tensor " << t);
        CHECK(std::abs(w2 - host[2 * t]) <= 1e-10 * host[2 * t]);
        CHECK(std::abs(u2 - host[2 * t + 1]) <= 1e-10 * host[2 * t + 1]);
        const double host_trust = trust_of(host[2 * t], host[2 * t + 1]), dev_trust = trust_of(w2, u2);
        CHECK(std::abs(dev_trust - host_trust) <= 1e-10 * host_trust);
        // Pass 1 with the host's step on both sides (the trust ratios agree to rounding, checked
        // above), so the two runs stay bit for bit the same and the next step's sums compare the
        // same values.
        const std::size_t n = model.sizes[t];
        const float step_size = static_cast<float>(lr * host_trust);
        offload::lamb_apply(model.master[t].data(), model.m[t].data(), model.v[t].data(), nullptr, DType::f32, n, c,
                            step_size, 1);
        dev->lamb_apply(model.dmaster[t].as<float>(), model.dm[t].as<float>(), model.dv[t].as<float>(), nullptr,
                        DType::f32, n, c, step_size);
      }
      for (std::size_t t = 0; t < tensors; ++t) {
        const std::size_t n = model.sizes[t];
        const std::string what = std::string("lamb ") + std::string(dtype_name(gt)) + " step " + std::to_string(step) +
                                 " tensor " + std::to_string(t);
        require_same(download<float>(*dev, model.dmaster[t], n).data(), model.master[t].data(), n, DType::f32,
                     what + " master");
        require_same(download<float>(*dev, model.dm[t], n).data(), model.m[t].data(), n, DType::f32, what + " m");
        require_same(download<float>(*dev, model.dv[t], n).data(), model.v[t].data(), n, DType::f32, what + " v");
      }
    }
  }
}
