// The CUDA backend's Muon kernels against the host's (offload/src/host_muon.cpp), and the
// optimizer (optim/muon.cpp) stepped on the device and on the host side by side
// (test/gpu/optimizer_stepper.hpp).
//
// What must hold, and the tolerances: the momentum (plain and Nesterov) and the update bit for
// bit (the host's arithmetic); Newton-Schulz deterministic, and, its products being bf16 with
// fp32 accumulation against the host's fp32 sgemm, within 5e-2 of the host's result in relative
// Frobenius norm, for wide, tall, square and odd shapes (bf16 keeps 8 significant bits, about
// 4e-3 relative per rounding, and five iterations of a polynomial of degree five compound it);
// batched (newton_schulz_batch) within 2e-2 of one matrix at a time.
// Through the optimizer: AdamW's tensors and the momentum buffers bit for bit, and each matrix's
// total change over three steps within 5e-2 of the host's in relative Frobenius norm.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "offload/host_optimizer.hpp"
#include "optimizer_stepper.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

// ||a - b||_F / ||b||_F over [begin, end).
double rel_frobenius(const std::vector<float>& a, const std::vector<float>& b, std::size_t begin, std::size_t end) {
  double d = 0.0, n = 0.0;
  for (std::size_t i = begin; i < end; ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    d += e * e;
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace

TEST_CASE("Muon's momentum and update equal the host kernels bit for bit", "[kernels][optim]") {
  auto dev = backend("cuda");
  const std::size_t n = 30011;
  for (DType gt : {DType::f32, DType::bf16, DType::f16})
    for (const bool nesterov : {false, true}) {
      auto buf = random_floats(n, 81, 0.1f, false);
      std::vector<float> x(n, 0.0f);
      const auto grad = to_dtype(random_floats(n, 82, 1.0f), gt);
      Buffer dbuf = upload(*dev, buf), dx = upload(*dev, x), dgrad = upload(*dev, grad);
      for (int step = 0; step < 2; ++step) {
        offload::muon_momentum(buf.data(), grad.data(), gt, n, 0.125f, 0.95f, nesterov, x.data(), 1);
        dev->muon_momentum(dbuf.as<float>(), dgrad.get(), gt, n, 0.125f, 0.95f, nesterov, dx.as<float>());
      }
      const std::string what = std::string("grad ") + std::string(dtype_name(gt)) + (nesterov ? " nesterov" : "");
      require_same(download<float>(*dev, dbuf, n).data(), buf.data(), n, DType::f32, what + " momentum");
      require_same(download<float>(*dev, dx, n).data(), x.data(), n, DType::f32, what + " update input");
    }
  for (DType pt : {DType::f32, DType::bf16, DType::f16}) {
    auto master = random_floats(n, 83, 0.3f), o = random_floats(n, 84, 0.05f);
    std::vector<char> out(n * dtype_size(pt), 0);
    Buffer dmaster = upload(*dev, master), dout = upload(*dev, out), d_o = upload(*dev, o);
    offload::muon_apply(master.data(), o.data(), out.data(), pt, n, 0.999f, 2e-2f, 1);
    dev->muon_apply(dmaster.as<float>(), d_o.as<float>(), dout.get(), pt, n, 0.999f, 2e-2f);
    require_same(download<float>(*dev, dmaster, n).data(), master.data(), n, DType::f32, "apply master");
    require_same(download<char>(*dev, dout, out.size()).data(), out.data(), n, pt, "apply params");
  }
}

TEST_CASE("Newton-Schulz on the device through cuBLASLt follows the host's fp32 iteration", "[kernels][optim]") {
  auto dev = backend("cuda");
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{64, 64}, {48, 200}, {300, 40},
                                                          {37, 53}, {1, 17},   {768, 3072}};
  std::vector<float> work;
  for (const auto& [rows, cols] : shapes) {
    INFO("[" << rows << ", " << cols << "]");
    const std::size_t n = static_cast<std::size_t>(rows * cols);
    auto x = random_floats(n, 90 + static_cast<std::uint64_t>(rows), 1.0f, false);
    Buffer dx = upload(*dev, x), dx2 = upload(*dev, x);
    offload::newton_schulz(x.data(), rows, cols, 5, work);
    dev->newton_schulz(dx.as<float>(), rows, cols, 5);
    dev->newton_schulz(dx2.as<float>(), rows, cols, 5);
    const auto got = download<float>(*dev, dx, n), again = download<float>(*dev, dx2, n);
    require_same(again.data(), got.data(), n, DType::f32, "the same matrix twice");
    CHECK(rel_frobenius(got, x, 0, n) <= 5e-2);
  }
}

TEST_CASE("Newton-Schulz batched on the device follows one matrix at a time", "[kernels][optim]") {
  auto dev = backend("cuda");
  // Several matrices of one shape, each in its own buffer: one launch per product for all of
  // them. cuBLASLt may choose other kernels for a batch than for one matrix (another order of
  // the fp32 sums, then bf16 rounding), so the results are close, not equal; a batch run twice
  // gives the same bits.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{64, 256}, {300, 40}, {37, 53}, {768, 768}};
  for (const auto& [rows, cols] : shapes) {
    INFO("[" << rows << ", " << cols << "]");
    const std::size_t n = static_cast<std::size_t>(rows * cols), count = 5;
    std::vector<Buffer> single, batched, again;
    std::vector<float*> xs, ys;
    std::vector<std::vector<float>> host;
    for (std::size_t i = 0; i < count; ++i) {
      host.push_back(random_floats(n, 200 + i + static_cast<std::uint64_t>(rows), 1.0f, false));
      single.push_back(upload(*dev, host.back()));
      batched.push_back(upload(*dev, host.back()));
      again.push_back(upload(*dev, host.back()));
      xs.push_back(batched.back().as<float>());
      ys.push_back(again.back().as<float>());
      dev->newton_schulz(single.back().as<float>(), rows, cols, 5);
    }
    dev->newton_schulz_batch(xs.data(), count, rows, cols, 5);
    dev->newton_schulz_batch(ys.data(), count, rows, cols, 5);
    std::vector<float> work;
    for (std::size_t i = 0; i < count; ++i) {
      INFO("matrix " << i);
      const auto one = download<float>(*dev, single[i], n), got = download<float>(*dev, batched[i], n);
      require_same(download<float>(*dev, again[i], n).data(), got.data(), n, DType::f32, "the same batch twice");
      CHECK(rel_frobenius(got, one, 0, n) <= 2e-2);
      offload::newton_schulz(host[i].data(), rows, cols, 5, work);
      CHECK(rel_frobenius(got, host[i], 0, n) <= 5e-2);
    }
  }
}

TEST_CASE("Muon on the device follows the host optimizer step by step", "[optim]") {
  auto dev = backend("cuda");
  Layout layout;
  const int emb = layout.add_unit("embeddings", {{"wte", {97, 32}}});
  layout.set_embedding(emb, "wte");
  layout.add_unit("h.0", {{"ln", {32}}, {"fc", {32, 128}}, {"bias", {128}}, {"proj", {128, 32}}});
  OptimizerConfig cfg;
  cfg.type = OptimizerType::muon;
  cfg.momentum = 0.95;
  cfg.weight_decay = 0.01;
  for (const bool nesterov : {false, true}) {
    cfg.nesterov = nesterov;
    OptimizerStepper host(layout, cfg, 2, DType::bf16, nullptr), device(layout, cfg, 2, DType::bf16, dev.get());
    const std::vector<float> start = host.master(1);
    for (std::int64_t t = 1; t <= 3; ++t) {
      host.step(t, 2e-2, 0.5f, static_cast<std::uint64_t>(t));
      device.step(t, 2e-2, 0.5f, static_cast<std::uint64_t>(t));
    }
    INFO("nesterov " << nesterov);
    for (int u = 0; u < layout.num_units(); ++u) {
      const auto hm = host.master(u), dm = device.master(u);
      const auto hs = host.state(u, 0), ds = device.state(u, 0);
      // state 0: AdamW's m or the momentum buffer, both element-wise; AdamW's v bit for bit too.
      require_same(ds.data(), hs.data(), hs.size(), DType::f32, "state 0 of unit " + std::to_string(u));
      const auto hv = host.state(u, 1), dv = device.state(u, 1);
      require_same(dv.data(), hv.data(), hv.size(), DType::f32, "state 1 of unit " + std::to_string(u));
      for (const ParamInfo& p : layout.unit(u).params) {
        const auto b = static_cast<std::size_t>(p.offset), e = b + static_cast<std::size_t>(p.numel);
        INFO(p.name);
        if (p.shape.size() != 2 || p.embedding) {
          require_same(dm.data() + b, hm.data() + b, e - b, DType::f32, "AdamW master " + p.name);
          continue;
        }
        // The matrices' total change.
        std::vector<float> hd(e - b), dd(e - b);
        for (std::size_t i = b; i < e; ++i) hd[i - b] = hm[i] - start[i], dd[i - b] = dm[i] - start[i];
        CHECK(rel_frobenius(dd, hd, 0, hd.size()) <= 5e-2);
      }
    }
  }
}
