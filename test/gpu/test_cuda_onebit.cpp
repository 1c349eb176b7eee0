// The CUDA backend's 1-bit Adam / 1-bit LAMB kernels against the host kernels
// (offload/src/host_onebit.cpp), through the Backend interface the exchange and the optimizers
// use (optim/onebit_exchange.cpp, onebit_adam.cpp, onebit_lamb.cpp), on random data at sizes that
// are multiples of neither 8 nor the chunk:
//   - the worker message, the decode, the coefficient's product, OneBitAdam's update and
//     OneBitLamb's element-wise moments: bit for bit;
//   - the compressions (worker side, chunked, and the server's): the sign bits equal, each scale
//     within fp32 rounding of the host's (its double sum of squares runs in another order), the
//     errors equal where the scale is, else within the scale's difference;
//   - OneBitLamb's sums of u^2 and prelim^2 within double rounding of the host's lanes, its
//     largest ratio equal.
// Then the engine: OneBitAdam and OneBitLamb at stages 1 and 2 through backend: cuda and
// backend: host (the loop of test_cuda_engine.cpp), the same bytes counted by the traffic
// counters and the master weights within a small tolerance of the host's after the warm-up and
// the compressed steps (the scales' rounding apart, the runs are the same arithmetic).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine_impl.hpp"
#include "engine_model.hpp"
#include "gpu_test_util.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizer.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::gputest;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Random values with some exact zeros of both signs (the sign rule's edge: x >= 0 is "up").
std::vector<float> message(std::size_t n, std::uint64_t seed, float scale) {
  auto v = random_floats(n, seed, scale, false);
  for (std::size_t i = 0; i < n; i += 97) v[i] = (i / 97) % 2 ? -0.0f : 0.0f;
  return v;
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> b(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : b) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<std::uint8_t>(s >> 24);
  }
  return b;
}

// A scale within fp32 rounding of the host's: at most one unit in the last place apart.
void check_scale(float got, float want, const std::string& what) {
  INFO(what << ": scale " << got << ", host " << want);
  REQUIRE(std::abs(static_cast<double>(got) - want) <= std::ldexp(std::abs(static_cast<double>(want)), -23));
}

// Errors after compressing with scales `got_scale` and `want_scale`: equal bits when the scales
// are equal, else within their difference (error = x -+ scale, one rounding each).
void check_errors(const float* got, const float* want, std::size_t n, float got_scale, float want_scale,
                  const std::string& what) {
  if (got_scale == want_scale) return require_same(got, want, n, DType::f32, what + " errors");
  const double d = std::abs(static_cast<double>(got_scale) - want_scale);
  for (std::size_t i = 0; i < n; ++i) {
    INFO(what << " error " << i << ": " << got[i] << ", host " << want[i]);
    REQUIRE(std::abs(static_cast<double>(got[i]) - want[i]) <= d + std::ldexp(std::abs(double{want[i]}), -23));
  }
}

std::size_t chunk_len(const OneBitChunks& c, std::size_t k) {
  return k * c.chunk >= c.numel ? 0 : std::min(c.chunk, c.numel - k * c.chunk);
}

void check_compress(const OneBitChunks& c) {
  auto dev = backend("cuda");
  const std::size_t bytes = (c.chunk + 7) / 8;
  auto x = message(c.chunk * c.count, 41 + c.chunk, 0.3f);
  std::vector<std::uint8_t> bits(c.bits_stride * c.count, 0);
  std::vector<float> scales(c.scale_stride * c.count, 0.0f);
  Buffer dx = upload(*dev, x), dbits = upload(*dev, bits), dscales = upload(*dev, scales);
  dev->onebit_compress(dx.as<float>(), c, dbits.as<std::uint8_t>(), dscales.as<float>());
  for (std::size_t k = 0; k < c.count; ++k)
    scales[k * c.scale_stride] =
        offload::onebit_compress(x.data() + k * c.chunk, chunk_len(c, k), bits.data() + k * c.bits_stride);
  const auto gx = download<float>(*dev, dx, x.size());
  const auto gbits = download<std::uint8_t>(*dev, dbits, bits.size());
  const auto gscales = download<float>(*dev, dscales, scales.size());
  for (std::size_t k = 0; k < c.count; ++k) {
    const std::string what = "chunk " + std::to_string(k) + " of " + std::to_string(c.chunk);
    const std::size_t n = chunk_len(c, k);
    REQUIRE(std::memcmp(gbits.data() + k * c.bits_stride, bits.data() + k * c.bits_stride, bytes) == 0);
    check_scale(gscales[k * c.scale_stride], scales[k * c.scale_stride], what);
    check_errors(gx.data() + k * c.chunk, x.data() + k * c.chunk, n, gscales[k * c.scale_stride],
                 scales[k * c.scale_stride], what);
    // The padding is left as it was.
    require_same(gx.data() + k * c.chunk + n, x.data() + k * c.chunk + n, c.chunk - n, DType::f32, what + " padding");
  }
}

}  // namespace

TEST_CASE("1-bit worker message and decode equal the host's bit for bit", "[kernels][onebit]") {
  auto dev = backend("cuda");
  for (DType gt : kTypes)
    for (bool add_error : {false, true})
      for (std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{70001}}) {
        auto x = message(n, 1 + n, 0.01f), shared = message(n, 2 + n, 0.02f);
        auto grad = to_dtype(random_floats(n, 3 + n, 4.0f), gt);
        Buffer dx = upload(*dev, x), dshared = upload(*dev, shared), dgrad = upload(*dev, grad);
        dev->onebit_worker(dx.as<float>(), dshared.as<float>(), dgrad.get(), gt, n, 0.9f, 0.1f, 1.0f / 384.0f,
                           add_error);
        offload::onebit_worker(x.data(), shared.data(), grad.data(), gt, n, 0.9f, 0.1f, 1.0f / 384.0f, add_error);
        require_same(download<float>(*dev, dx, n).data(), x.data(), n, DType::f32,
                     std::string("worker ") + std::string(dtype_name(gt)) + " n " + std::to_string(n));
      }
  // Decode: three chunks of 1003 values (not a multiple of 8), 2500 real, bits and scales strided.
  const OneBitChunks c{1003, 2500, 3, 131, 2};
  auto bits = random_bytes(c.bits_stride * c.count, 5);
  std::vector<float> scales{0.25f, -1.0f, 3.5e-3f, 7.0f, 0.0f, 2.0f};
  Buffer dbits = upload(*dev, bits), dscales = upload(*dev, scales);
  Buffer dout = upload(*dev, std::vector<float>(c.chunk * c.count, 9.0f));
  dev->onebit_decode(dbits.as<std::uint8_t>(), dscales.as<float>(), c, dout.as<float>());
  std::vector<float> want(c.chunk * c.count, 0.0f);
  for (std::size_t k = 0; k < c.count; ++k)
    offload::onebit_decode(bits.data() + k * c.bits_stride, scales[k * c.scale_stride], chunk_len(c, k),
                           want.data() + k * c.chunk);
  require_same(download<float>(*dev, dout, want.size()).data(), want.data(), want.size(), DType::f32, "decode");
  // The coefficient's product.
  auto v = message(777, 6, 1.0f), w = v;
  Buffer dv = upload(*dev, v);
  dev->onebit_scale(dv.as<float>(), v.size(), 1.7f);
  for (float& e : w) e *= 1.7f;
  require_same(download<float>(*dev, dv, v.size()).data(), w.data(), v.size(), DType::f32, "scale");
}

TEST_CASE("1-bit compression: the host's bits, scales within fp32 rounding", "[kernels][onebit]") {
  SECTION("chunks with padding at the end, strided bits and scales") { check_compress({1000, 2337, 4, 160, 3}); }
  SECTION("a chunk that is not a multiple of 8") { check_compress({1003, 1003, 1, 126, 1}); }
  SECTION("one value, and an empty chunk") { check_compress({64, 1, 2, 8, 1}); }
  SECTION("a chunk larger than a block's stride") { check_compress({100000, 163333, 2, 12500, 1}); }
}

TEST_CASE("1-bit server: the workers' average with the error, compressed as the host's", "[kernels][onebit]") {
  auto dev = backend("cuda");
  for (int workers : {1, 3, 4}) {
    const std::size_t chunk = 808, n = 777, stride = chunk / 8 + 24, U = 2;  // 24 bytes of other units' bits
    const std::size_t W = static_cast<std::size_t>(workers);
    auto wbits = random_bytes(stride * W, 7 + W);
    auto wscales = message(U * W, 8 + W, 1.0f);
    for (float& s : wscales) s = std::abs(s);
    auto error = message(n, 9 + W, 0.05f);
    std::vector<std::uint8_t> bits(chunk / 8, 0);
    Buffer dwbits = upload(*dev, wbits), dwscales = upload(*dev, wscales), derror = upload(*dev, error);
    Buffer dbits = upload(*dev, bits), dscale = upload(*dev, std::vector<float>{0.0f});
    dev->onebit_server(dwbits.as<std::uint8_t>(), stride, dwscales.as<float>(), U, workers, derror.as<float>(), n,
                       chunk, dbits.as<std::uint8_t>(), dscale.as<float>());
    std::vector<float> ws(W);
    for (std::size_t w = 0; w < W; ++w) ws[w] = wscales[w * U];
    const float scale = offload::onebit_server(wbits.data(), stride, ws.data(), workers, error.data(), n, bits.data());
    const std::string what = "server of " + std::to_string(workers);
    const float got = download<float>(*dev, dscale, 1)[0];
    REQUIRE(download<std::uint8_t>(*dev, dbits, bits.size()) == bits);
    check_scale(got, scale, what);
    check_errors(download<float>(*dev, derror, n).data(), error.data(), n, got, scale, what);
  }
}

TEST_CASE("OneBitAdam's update and OneBitLamb's moments equal the host's", "[kernels][onebit]") {
  auto dev = backend("cuda");
  const std::size_t n = 70003;
  auto master = random_floats(n, 11, 0.5f, false), m = random_floats(n, 12, 0.01f, false);
  auto v = random_floats(n, 13, 0.01f, false);
  for (float& x : v) x = x * x;
  const auto m_new = random_floats(n, 14, 0.01f, false);
  for (DType pt : kTypes)
    for (bool with_out : {true, false}) {
      auto hm = master, hmm = m;
      std::vector<char> out(n * dtype_size(pt), 0);
      Buffer dmaster = upload(*dev, master), dm = upload(*dev, m), dv = upload(*dev, v), dnew = upload(*dev, m_new);
      Buffer dout = upload(*dev, out);
      dev->onebit_adam_apply(dmaster.as<float>(), dm.as<float>(), dv.as<float>(), dnew.as<float>(),
                             with_out ? dout.get() : nullptr, pt, n, 0.999f, -1e-3f, 1e-8f);
      offload::onebit_adam_apply(hm.data(), hmm.data(), v.data(), m_new.data(), with_out ? out.data() : nullptr, pt, n,
                                 0.999f, -1e-3f, 1e-8f);
      const std::string what = std::string("adam apply ") + std::string(dtype_name(pt));
      require_same(download<float>(*dev, dmaster, n).data(), hm.data(), n, DType::f32, what + " master");
      require_same(download<float>(*dev, dm, n).data(), hmm.data(), n, DType::f32, what + " m");
      if (with_out) require_same(download<char>(*dev, dout, out.size()).data(), out.data(), n, pt, what + " out");
    }
  // OneBitLamb's first compressed pass, in two runs of the tensor (cut at 12345) as sub-groups cut it.
  const offload::OneBitLambConstants c{0.9f, 10.0f, 0.999f, 1e-3f, 1e-6f, 0.01f, 1.3f};
  auto vf = v;
  for (float& x : vf) x *= 1.1f;
  auto hm = m, hvf = vf;
  Buffer dmaster = upload(*dev, master), dm = upload(*dev, m), dv = upload(*dev, v), dvf = upload(*dev, vf);
  Buffer dnew = upload(*dev, m_new), dsums = upload(*dev, std::vector<double>(3, 0.0));
  SliceStats stats;
  stats.reset(2, 1, 2, SliceStats::kAllSlices);
  double ratio = 0.0;
  for (auto [at, len] : {std::pair<std::size_t, std::size_t>{0, 12345}, {12345, n - 12345}}) {
    dev->onebit_lamb_moments(dmaster.as<float>() + at, dm.as<float>() + at, dv.as<float>() + at, dvf.as<float>() + at,
                             dnew.as<float>() + at, len, c, dsums.as<double>());
    offload::onebit_lamb_moments(master.data() + at, hm.data() + at, v.data() + at, hvf.data() + at, m_new.data() + at,
                                 static_cast<std::int64_t>(at), len, c, stats.lanes(0, 0), stats.lanes(1, 0), ratio);
  }
  stats.combine(nullptr, 0);
  require_same(download<float>(*dev, dm, n).data(), hm.data(), n, DType::f32, "lamb moments m");
  require_same(download<float>(*dev, dvf, n).data(), hvf.data(), n, DType::f32, "lamb moments fresh v");
  const auto sums = download<double>(*dev, dsums, 3);
  CHECK(std::abs(sums[0] - stats.total(0)) <= 1e-12 * stats.total(0));
  CHECK(std::abs(sums[1] - stats.total(1)) <= 1e-12 * stats.total(1));
  CHECK(sums[2] == ratio);
  CHECK(ratio > 0.0);
}

namespace {

Config onebit_config(const std::string& optimizer, int stage, const std::string& kind) {
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  y += "bf16:\n  enabled: true\n";
  y += "optimizer:\n  type: " + optimizer + "\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n    eps: 1.0e-8\n";
  y += "    weight_decay: 0.1\n    freeze_step: 2\n";
  if (optimizer == "OneBitLamb") y += "    bias_correction: false\n";
  y += "backend: " + kind + "\n";
  if (kind == "cuda") y += "comm: " + test_comm() + "\n";
  Config cfg = parse_config(y, "test_cuda_onebit");
  cfg.resolve(ctx().world_size());
  return cfg;
}

struct OneBitRun {
  std::vector<std::vector<float>> master;
  std::vector<TrafficBytes> sent;
};

// test_cuda_engine.cpp's loop: the gradient computed on the host from the gathered parameters
// read back, written into the gradient buffer through the backend.
OneBitRun train_onebit(const std::string& optimizer, int stage, const std::string& kind, int steps) {
  Engine e(ctx(), onebit_config(optimizer, stage, kind), make_layout());
  Backend& b = engine_backend(e);
  e.init_params(init_value);
  const int rank = ctx().rank(), world = ctx().world_size(), n = e.layout().num_units();
  const DType t = DType::bf16;
  OneBitRun r;
  for (int s = 0; s < steps; ++s) {
    const TrafficBytes before = e.traffic();
    for (int u = 0; u < n; ++u) e.gather(u);
    for (int u = n - 1; u >= 0; --u) {
      auto p = e.gather(u);
      auto g = e.grads(u);
      const std::size_t numel = static_cast<std::size_t>(e.layout().unit(u).numel), bytes = numel * dtype_size(t);
      std::vector<char> hp(bytes), hg(bytes);
      b.to_host(hp.data(), p.data(), bytes);
      std::vector<float> w(numel);
      for (std::size_t i = 0; i < numel; ++i) w[i] = load_as_f32(hp.data(), i, t);
      auto mg = micro_grad(u, w, s, 0, rank, world, 1, 2);
      b.to_host(hg.data(), g.data(), bytes);
      for (std::size_t i = 0; i < numel; ++i)
        store_from_f32(hg.data(), i, t, load_as_f32(hg.data(), i, t) + e.loss_scale() * mg[i]);
      b.from_host(g.data(), hg.data(), bytes);
      e.reduce(u);
    }
    e.step();
    r.sent.push_back(e.traffic() - before);
  }
  for (int u = 0; u < n; ++u) r.master.push_back(e.full_master(u));
  return r;
}

}  // namespace

TEST_CASE("OneBitAdam and OneBitLamb on the CUDA backend follow the host backend", "[engine][onebit]") {
  for (const char* optimizer : {"OneBitAdam", "OneBitLamb"})
    for (int stage : {1, 2}) SECTION(std::string(optimizer) + " stage " + std::to_string(stage)) {
        INFO(optimizer << " stage " << stage << " via " << test_comm() << " on " << ctx().world_size() << " ranks");
        const int steps = 5;  // 2 exact, 3 compressed
        const OneBitRun host = train_onebit(optimizer, stage, "host", steps);
        const OneBitRun dev = train_onebit(optimizer, stage, "cuda", steps);
        for (int s = 0; s < steps; ++s) {
          INFO("step " << s);
          CHECK(dev.sent[static_cast<std::size_t>(s)].intra_node == host.sent[static_cast<std::size_t>(s)].intra_node);
          CHECK(dev.sent[static_cast<std::size_t>(s)].inter_node == host.sent[static_cast<std::size_t>(s)].inter_node);
        }
        REQUIRE(dev.master.size() == host.master.size());
        for (std::size_t u = 0; u < host.master.size(); ++u) {
          REQUIRE(dev.master[u].size() == host.master[u].size());
          for (std::size_t i = 0; i < host.master[u].size(); ++i) {
            const double d = dev.master[u][i], h = host.master[u][i];
            INFO("unit " << u << " element " << i << ": cuda " << d << " host " << h);
            REQUIRE(std::abs(d - h) <= 1e-5 * std::max(std::abs(h), 1.0));
          }
        }
      }
}
