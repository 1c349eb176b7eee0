// CudaOps' memory plumbing, which the kernel tests do not reach: the pinned staging ring behind
// upload() (more uploads than slots, growing sizes, the host source reused at once), the
// device-side loss mean (add_mean, summed in double in a fixed order), and the teardown of an
// Ops that owns its stream (nothing may touch that stream after it is destroyed, so no CUDA
// error may be left behind).
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gpt/cuda/cuda_ops.hpp"
#include "gpt/ops.hpp"

namespace {

using zero::gpt::make_cuda_ops;
using zero::gpt::Ops;

}  // namespace

TEST_CASE("CudaOps upload: every upload lands, the host source is reusable at once", "[gpt][cuda_ops]") {
  auto ops = make_cuda_ops(nullptr);
  // More uploads than staging slots (4), with sizes that grow and shrink, so slots are reused
  // and reallocated; the one host buffer is overwritten right after each call.
  const std::vector<std::size_t> sizes = {16, 4096, 8, 1 << 20, 1000, 3, 1 << 16, 1 << 21, 64, 5};
  std::vector<void*> dev;
  std::vector<std::vector<std::uint8_t>> expect;
  std::vector<std::uint8_t> host;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.assign(sizes[i], 0);
    for (std::size_t j = 0; j < sizes[i]; ++j) host[j] = static_cast<std::uint8_t>(i * 31 + j * 7);
    dev.push_back(ops->allocate(sizes[i]));
    ops->upload(dev.back(), host.data(), sizes[i]);
    expect.push_back(host);
    std::memset(host.data(), 0xab, host.size());
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::uint8_t> got(sizes[i]);
    ops->download(got.data(), dev[i], sizes[i]);
    INFO("upload " << i << " of " << sizes[i] << " bytes");
    CHECK(got == expect[i]);
  }
  for (void* p : dev) ops->deallocate(p);
}

TEST_CASE("CudaOps add_mean adds the mean of n floats in double, the same bits every run", "[gpt][cuda_ops]") {
  auto ops = make_cuda_ops(nullptr);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(0.5f, 12.0f);
  for (int n : {1, 255, 256, 257, 4096 + 3}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = dist(rng);
    double ref = 0.0;
    for (float x : v) ref += x;
    ref /= n;
    auto* values = static_cast<float*>(ops->allocate(v.size() * sizeof(float)));
    auto* total = static_cast<double*>(ops->allocate(sizeof(double)));
    ops->upload(values, v.data(), v.size() * sizeof(float));
    double runs[2] = {0.0, 0.0};
    for (double& r : runs) {
      ops->fill_zero(total, sizeof(double));
      ops->add_mean(total, values, n);
      ops->add_mean(total, values, n);  // adds, does not overwrite
      ops->download(&r, total, sizeof(double));
    }
    INFO("n = " << n);
    // n doubles summed in another order than the host's: a few ulps of the sum.
    CHECK(runs[0] == Approx(2.0 * ref).epsilon(1e-12));
    CHECK(runs[0] == runs[1]);
    ops->deallocate(values);
    ops->deallocate(total);
  }
}

TEST_CASE("CudaOps that own their stream tear down cleanly", "[gpt][cuda_ops]") {
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    auto ops = make_cuda_ops(nullptr);
    REQUIRE(ops->stream() != nullptr);
    // Work in flight at destruction: a large fill and a few uploads.
    const std::size_t bytes = std::size_t{64} << 20;
    void* p = ops->allocate(bytes);
    ops->fill_zero(p, bytes);
    std::vector<std::uint8_t> host(4096, 1);
    for (int k = 0; k < 6; ++k) ops->upload(p, host.data(), host.size());
    ops->deallocate(p);
    ops.reset();
    // Had a member used the stream after it was destroyed (the Matmul synchronizes on it), the
    // failed call's invalid-handle error would be left here.
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}
