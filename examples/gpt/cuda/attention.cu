// Causal self-attention, flash style: no T x T matrix ever reaches memory. This file is the
// entry points of gpt_kernels.hpp: it checks the shape and the alignment, then launches the
// kernels of the head size, which live in attention_forward.cu and attention_backward.cu on the
// tiling of attention_tiles.cuh.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/status_check.hpp"
#include "zero/error.hpp"

namespace zero::gpt::cuda {

namespace {

std::string shape_text(int B, int T, int C, int NH) {
  return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH);
}

void check_shape(const char* op, int B, int T, int C, int NH) {
  ZERO_CHECK(B >= 1 && attention_supported(T, C, NH),
             std::string(op) + ": unsupported shape " + shape_text(B, T, C, NH) +
                 "; supported: B >= 1, T >= 1, C divisible by NH with head size C/NH of 32, 64 "
                 "or 128");
  ZERO_CHECK(static_cast<long long>(B) * NH <= 65535,
             std::string(op) + ": B*NH = " + std::to_string(static_cast<long long>(B) * NH) +
                 " exceeds the grid's 65535 (" + shape_text(B, T, C, NH) + ")");
}

void check_aligned(const char* op, const char* name, const void* p) {
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, std::string(op) + ": " + name +
                                                                " must be 16-byte aligned (rows are read in 16-byte "
                                                                "pieces)");
}

}  // namespace

// The opt-in is a property of the kernel on one device: it is set the first time a kernel runs
// on a device (or asks for more than before), not at every launch; a launch then costs one
// cudaGetDevice and a look-up. The lock makes it safe for loops that launch from several threads.
void attn::use_shared_memory(const char* op, const void* kernel, std::size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, std::size_t> opted;  // (kernel, device) -> bytes set
  int device = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  std::size_t& set = opted[{kernel, device}];
  if (bytes <= set) return;
  int optin = 0;
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ZERO_CHECK(bytes <= static_cast<std::size_t>(optin), std::string(op) + ": needs " + std::to_string(bytes) +
                                                           " bytes of shared memory per block, the device allows " +
                                                           std::to_string(optin) + " (built for sm_80 / sm_90)");
  GPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  set = bytes;
}

bool attention_supported(int T, int C, int NH) {
  if (T < 1 || C < 1 || NH < 1 || C % NH != 0) return false;
  const int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  check_shape("attention_forward", B, T, C, NH);
  check_aligned("attention_forward", "qkv", qkv);
  check_aligned("attention_forward", "out", out);
  switch (C / NH) {
    case 32: attn::launch_forward<32>(out, lse, qkv, B, T, C, NH, stream); break;
    case 64: attn::launch_forward<64>(out, lse, qkv, B, T, C, NH, stream); break;
    default: attn::launch_forward<128>(out, lse, qkv, B, T, C, NH, stream); break;
  }
}

std::size_t attention_backward_scratch_floats(int B, int T, int C, int NH) {
  (void)C;
  return static_cast<std::size_t>(B) * NH * T;  // D per (b, h, t); the rest lives on chip
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  check_shape("attention_backward", B, T, C, NH);
  check_aligned("attention_backward", "dqkv", dqkv);
  check_aligned("attention_backward", "dout", dout);
  check_aligned("attention_backward", "qkv", qkv);
  check_aligned("attention_backward", "out", out);
  switch (C / NH) {
    case 32: attn::launch_backward<32>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
    case 64: attn::launch_backward<64>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
    default: attn::launch_backward<128>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
  }
}

}  // namespace zero::gpt::cuda
