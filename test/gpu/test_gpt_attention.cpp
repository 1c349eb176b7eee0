// The causal flash-style attention kernels (examples/gpt/cuda/attention.cu) against the host
// kernels' double instantiation, on bf16-rounded random inputs, within the per-element bounds
// derived in test/support/attention_reference.hpp (bf16 rounding of P, dS and of every result,
// u = 2^-7 per rounding, plus fp32 score error). The backward runs on the GPU's own forward
// output and lse, as in training, onto a non-zero dqkv (it must add). Two backward runs must
// give bitwise-equal dqkv (no atomics, a fixed summation order).
#include <catch2/catch.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gpt/cuda/gpt_kernels.hpp"
#include "zero/error.hpp"

namespace gk = zero::gpt::cuda;
namespace at = zero::gpt::attention_test;

namespace {

void cuda_ok(cudaError_t rc, const char* what) {
  INFO(what << ": " << cudaGetErrorName(rc) << " " << cudaGetErrorString(rc));
  REQUIRE(rc == cudaSuccess);
}

// Device memory for n elements of T.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) { cuda_ok(cudaMalloc(&p_, (n ? n : 1) * sizeof(T)), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& v) {
    REQUIRE(v.size() == n_);
    cuda_ok(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    cuda_ok(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

gk::bf16* as_bf16(std::uint16_t* p) { return reinterpret_cast<gk::bf16*>(p); }

void run_case(int B, int T, int C, int NH, std::uint64_t seed, float q_scale = 1.0f) {
  INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " q_scale=" << q_scale);
  REQUIRE(gk::attention_supported(T, C, NH));
  const at::Case c = at::make_case(B, T, C, NH, seed, q_scale);
  const at::Expect e = at::expect(c);

  const std::size_t n3 = c.qkv.size(), n1 = c.dout.size();
  const std::size_t n_lse = static_cast<std::size_t>(B) * NH * T;
  DeviceArray<std::uint16_t> qkv(n3), out(n1), dout(n1), dqkv(n3);
  DeviceArray<float> lse(n_lse), scratch(gk::attention_backward_scratch_floats(B, T, C, NH));
  REQUIRE(gk::attention_backward_scratch_floats(B, T, C, NH) >= n_lse);
  qkv.upload(at::to_bits(c.qkv));
  dout.upload(at::to_bits(c.dout));
  const std::vector<std::uint16_t> dqkv0 = at::to_bits(c.dqkv0);
  dqkv.upload(dqkv0);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");

  gk::attention_forward(as_bf16(out.get()), lse.get(), as_bf16(qkv.get()), B, T, C, NH, stream);
  cuda_ok(cudaStreamSynchronize(stream), "forward");
  const std::vector<float> got_out = at::from_bits(out.download());
  const std::vector<float> got_lse = lse.download();
  const at::Check co = at::check(got_out, e.out, e.out_tol, "out");
  const at::Check cl = at::check(got_lse, e.lse, e.lse_tol, "lse");
  INFO("forward worst error / bound: out " << co.worst_ratio << ", lse " << cl.worst_ratio);
  INFO(co.first << " " << cl.first);
  CHECK(co.bad == 0);
  CHECK(cl.bad == 0);

  gk::attention_backward(as_bf16(dqkv.get()), scratch.get(), as_bf16(dout.get()), as_bf16(qkv.get()),
                         as_bf16(out.get()), lse.get(), B, T, C, NH, stream);
  cuda_ok(cudaStreamSynchronize(stream), "backward");
  const std::vector<std::uint16_t> first = dqkv.download();
  const at::Check cg = at::check(at::from_bits(first), e.dqkv, e.dqkv_tol, "dqkv");
  INFO("backward worst error / bound: dqkv " << cg.worst_ratio << " " << cg.first);
  CHECK(cg.bad == 0);

  // Again from the same start: the same bits.
  dqkv.upload(dqkv0);
  gk::attention_backward(as_bf16(dqkv.get()), scratch.get(), as_bf16(dout.get()), as_bf16(qkv.get()),
                         as_bf16(out.get()), lse.get(), B, T, C, NH, stream);
  cuda_ok(cudaStreamSynchronize(stream), "backward (second run)");
  const std::vector<std::uint16_t> second = dqkv.download();
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(std::uint16_t)) == 0);
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("attention forward and backward match the double reference", "[attention]") {
  for (const at::KernelCase& k : at::kKernelCases) {
    DYNAMIC_SECTION(k.name) { run_case(k.B, k.T, k.C, k.NH, k.seed, k.q_scale); }
  }
}

TEST_CASE("attention rejects unsupported shapes before launching", "[attention]") {
  CHECK(gk::attention_supported(1, 768, 12));
  CHECK(gk::attention_supported(1024, 128, 1));
  CHECK_FALSE(gk::attention_supported(64, 96, 1));   // head size 96
  CHECK_FALSE(gk::attention_supported(64, 48, 3));   // head size 16
  CHECK_FALSE(gk::attention_supported(64, 100, 3));  // C not divisible by NH
  CHECK_FALSE(gk::attention_supported(0, 128, 2));
  CHECK_FALSE(gk::attention_supported(64, 128, 0));
  // Nothing is dereferenced or launched: the shape check comes first.
  CHECK_THROWS_AS(gk::attention_forward(nullptr, nullptr, nullptr, 1, 64, 96, 1, nullptr), zero::Error);
  CHECK_THROWS_AS(gk::attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 64, 96, 1, nullptr),
                  zero::Error);
  CHECK_THROWS_AS(gk::attention_forward(nullptr, nullptr, nullptr, 0, 64, 128, 2, nullptr), zero::Error);
  cuda_ok(cudaGetLastError(), "no launch error left behind");
}
