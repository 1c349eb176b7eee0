// The GPT trainer's causal attention kernels (examples/gpt/cuda/attention*.cu) on one GPU: forward
// and backward timed with CUDA events on bf16 inputs, per shape, as milliseconds and TFLOP/s
// under FlashAttention's accounting (causal forward 4 B NH T^2 hs / 2 FLOPs, backward 2.5 times
// the forward; our backward does 7 tile products where that count assumes 5, see
// attention_backward.cuh), and as a fraction of the dense bf16 peak given by --peak-tflops.
// bench/attention_vs_pytorch.py runs it beside PyTorch's flash scaled_dot_product_attention on
// the same shapes in the same run; that is the comparison to quote.
//
// Prints one row per shape; --json writes the rows for the script. Exits 77 without a GPU.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda_probe.hpp"
#include "gpt/cuda/gpt_kernels.hpp"
#include "zero/dtype.hpp"

namespace gk = zero::gpt::cuda;

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  std::fprintf(stderr, "bench_gpt_attention: %s: %s\n", what, cudaGetErrorString(rc));
  std::exit(1);
}

struct Shape {
  int B, T, NH, hs;
  // FlashAttention's count for the causal forward; the backward is 2.5 times it.
  double forward_flops() const { return 4.0 * B * NH * static_cast<double>(T) * T * hs / 2.0; }
};

struct Row {
  Shape s;
  double fwd_ms, bwd_ms;
};

// Device memory for n elements of T.
template <class T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(std::size_t n) { check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

// Normal(0, 1) values rounded to bf16, as bits.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> v(n);
  for (auto& b : v) b = zero::f32_to_bf16_bits(normal(rng));
  return v;
}

// Milliseconds per call of `op`, the mean of `iters` calls after `warmup`.
template <class Op>
double time_ms(cudaStream_t stream, int warmup, int iters, Op op) {
  for (int k = 0; k < warmup; ++k) op();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int k = 0; k < iters; ++k) op();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

Row run(const Shape& s, int warmup, int iters, cudaStream_t stream) {
  const int C = s.NH * s.hs;
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.T;
  const std::size_t n3 = rows * 3 * C, n1 = rows * C;
  DeviceArray<std::uint16_t> qkv(n3), out(n1), dout(n1), dqkv(n3);
  DeviceArray<float> lse(static_cast<std::size_t>(s.B) * s.NH * s.T);
  DeviceArray<float> scratch(gk::attention_backward_scratch_floats(s.B, s.T, C, s.NH));
  const std::vector<std::uint16_t> host_qkv = random_bf16(n3, 1), host_dout = random_bf16(n1, 2);
  check(cudaMemcpy(qkv.p, host_qkv.data(), n3 * 2, cudaMemcpyHostToDevice), "upload qkv");
  check(cudaMemcpy(dout.p, host_dout.data(), n1 * 2, cudaMemcpyHostToDevice), "upload dout");
  check(cudaMemset(dqkv.p, 0, n3 * 2), "cudaMemset");
  auto* q = reinterpret_cast<gk::bf16*>(qkv.p);
  auto* o = reinterpret_cast<gk::bf16*>(out.p);
  auto* dy = reinterpret_cast<gk::bf16*>(dout.p);
  auto* dq = reinterpret_cast<gk::bf16*>(dqkv.p);
  Row r{s, 0, 0};
  r.fwd_ms = time_ms(stream, warmup, iters, [&] { gk::attention_forward(o, lse.p, q, s.B, s.T, C, s.NH, stream); });
  r.bwd_ms = time_ms(stream, warmup, iters,
                     [&] { gk::attention_backward(dq, scratch.p, dy, q, o, lse.p, s.B, s.T, C, s.NH, stream); });
  check(cudaGetLastError(), "attention kernels");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Causal attention kernels: forward and backward time and TFLOP/s per shape (GPU)"};
  std::vector<std::string> shapes;
  int warmup = 5, iters = 20;
  double peak = 989.0;
  std::string json;
  app.add_option("--shape", shapes, "B,T,NH,hs (repeatable; default: GPT-2 124M, gpt2-xl's heads, head size 128)");
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  app.add_option("--iters", iters, "timed calls")->check(CLI::PositiveNumber);
  app.add_option("--peak-tflops", peak, "dense bf16 peak of the device (989: H100 SXM)")->check(CLI::PositiveNumber);
  app.add_option("--json", json, "write the rows here as JSON");
  CLI11_PARSE(app, argc, argv);

  std::vector<Shape> list;
  for (const std::string& text : shapes) {
    Shape s{};
    if (std::sscanf(text.c_str(), "%d,%d,%d,%d", &s.B, &s.T, &s.NH, &s.hs) != 4 || s.B < 1 ||
        !gk::attention_supported(s.T, s.NH * s.hs, s.NH)) {
      std::fprintf(stderr, "bench_gpt_attention: --shape %s: want B,T,NH,hs with B, T >= 1 and hs 32, 64 or 128\n",
                   text.c_str());
      return 2;
    }
    list.push_back(s);
  }
  if (list.empty()) list = {{16, 1024, 12, 64}, {8, 1024, 25, 64}, {8, 2048, 16, 128}};

  if (const int rc = zero::bench::cuda_device_status("bench_gpt_attention")) return rc;
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::vector<Row> rows;
  std::printf("%-22s %10s %10s %8s %10s %10s %8s\n", "B,T,NH,hs", "fwd ms", "fwd TF/s", "of peak", "bwd ms", "bwd TF/s",
              "of peak");
  for (const Shape& s : list) {
    const Row r = run(s, warmup, iters, stream);
    rows.push_back(r);
    const double f = s.forward_flops(), ftf = f / (r.fwd_ms * 1e9), btf = 2.5 * f / (r.bwd_ms * 1e9);
    const std::string name =
        std::to_string(s.B) + "," + std::to_string(s.T) + "," + std::to_string(s.NH) + "," + std::to_string(s.hs);
    std::printf("%-22s %10.3f %10.1f %7.1f%% %10.3f %10.1f %7.1f%%\n", name.c_str(), r.fwd_ms, ftf, 100.0 * ftf / peak,
                r.bwd_ms, btf, 100.0 * btf / peak);
  }
  cudaStreamDestroy(stream);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "bench_gpt_attention: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f, "[\n");
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const Row& r = rows[k];
      std::fprintf(f, "  {\"B\": %d, \"T\": %d, \"NH\": %d, \"hs\": %d, \"fwd_ms\": %.6f, \"bwd_ms\": %.6f}%s\n", r.s.B,
                   r.s.T, r.s.NH, r.s.hs, r.fwd_ms, r.bwd_ms, k + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
