// Causal self-attention, flash style: no T x T matrix ever reaches memory. This file is the
// entry points of gpt_kernels.hpp: it checks the shape and the alignment, then launches the
// kernels of the head size (attention_forward.cu, attention_backward.cu; their bodies are the
// .cuh files of the same names, on the tiling of attention_tiles.cuh).
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

std::string shape_text(const AttentionShape& s) {
  std::string t = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                  " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs);
  if (s.alibi_heads > 0) t += " alibi_heads=" + std::to_string(s.alibi_heads) + " head0=" + std::to_string(s.head0);
  return t;
}

void check_shape(const char* op, const AttentionShape& s) {
  ZERO_CHECK(s.B >= 1 && attention_supported(s),
             std::string(op) + ": unsupported shape " + shape_text(s) +
                 "; supported: B >= 1, T >= 1, 1 <= NKV <= NH, head size hs of 32, 64 or 128, "
                 "alibi_heads >= 0 and head0 >= 0");
  ZERO_CHECK(static_cast<long long>(s.B) * s.NH <= 65535,
             std::string(op) + ": B*NH = " + std::to_string(static_cast<long long>(s.B) * s.NH) +
                 " exceeds the grid's 65535 (" + shape_text(s) + ")");
}

// The classic multi-head shape of the (B, T, C, NH) entry points, after checking that C splits
// into NH heads (the AttentionShape check cannot see C).
AttentionShape mha_shape(const char* op, int B, int T, int C, int NH) {
  ZERO_CHECK(attention_supported(T, C, NH),
             std::string(op) + ": unsupported shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                 " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
                 "; supported: B >= 1, T >= 1, C divisible by NH with head size C/NH of 32, 64 "
                 "or 128");
  return AttentionShape{B, T, NH, NH, C / NH, 0, 0};
}

attn::Heads heads_of(const AttentionShape& s) { return {s.T, s.NH, s.NKV, s.alibi_heads, s.head0}; }

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

bool attention_supported(const AttentionShape& s) {
  if (s.T < 1 || s.NH < 1 || s.NKV < 1 || s.NKV > s.NH || s.alibi_heads < 0 || s.head0 < 0) return false;
  return s.hs == 32 || s.hs == 64 || s.hs == 128;
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionShape& s, cudaStream_t stream) {
  check_shape("attention_forward", s);
  check_aligned("attention_forward", "qkv", qkv);
  check_aligned("attention_forward", "out", out);
  const attn::Heads g = heads_of(s);
  switch (s.hs) {
    case 32: attn::launch_forward<32>(out, lse, qkv, s.B, g, stream); break;
    case 64: attn::launch_forward<64>(out, lse, qkv, s.B, g, stream); break;
    default: attn::launch_forward<128>(out, lse, qkv, s.B, g, stream); break;
  }
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  attention_forward(out, lse, qkv, mha_shape("attention_forward", B, T, C, NH), stream);
}

std::size_t attention_backward_scratch_floats(const AttentionShape& s) {
  return static_cast<std::size_t>(s.B) * s.NH * s.T;  // D per (b, h, t); the rest lives on chip
}

std::size_t attention_backward_scratch_floats(int B, int T, int C, int NH) {
  (void)C;
  return static_cast<std::size_t>(B) * NH * T;
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, const AttentionShape& s, cudaStream_t stream) {
  check_shape("attention_backward", s);
  check_aligned("attention_backward", "dqkv", dqkv);
  check_aligned("attention_backward", "dout", dout);
  check_aligned("attention_backward", "qkv", qkv);
  check_aligned("attention_backward", "out", out);
  const attn::Heads g = heads_of(s);
  switch (s.hs) {
    case 32: attn::launch_backward<32>(dqkv, scratch, dout, qkv, out, lse, s.B, g, stream); break;
    case 64: attn::launch_backward<64>(dqkv, scratch, dout, qkv, out, lse, s.B, g, stream); break;
    default: attn::launch_backward<128>(dqkv, scratch, dout, qkv, out, lse, s.B, g, stream); break;
  }
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  attention_backward(dqkv, scratch, dout, qkv, out, lse, mha_shape("attention_backward", B, T, C, NH), stream);
}

}  // namespace zero::gpt::cuda
