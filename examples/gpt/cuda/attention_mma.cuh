// The warp primitives the attention kernels are written on (attention_warp.cuh and the kernel
// bodies), as inline PTX. The host test test_gpt_attention_kernels defines the same functions
// on an emulator written from the PTX ISA, so the kernel bodies run there unchanged; these
// definitions are the only code the emulator stands in for.
//
// ldmatrix.x4 loads four 8x8 bf16 matrices; lanes 8m .. 8m+7 give the addresses of matrix m's
// rows (16 bytes each, 16-byte aligned, in shared memory). Register m of lane l receives matrix
// m's row l/4, columns 2(l%4) and 2(l%4)+1 (the first in the low half); with .trans it receives
// the transposed matrix's, i.e. rows 2(l%4) and 2(l%4)+1 of column l/4. mma m16n8k16 (row.col)
// takes A [16 x 16] in four such registers (rows g / g+8, columns 2t.. / 2t+8..), B [16 x 8] in
// two (rows 2t.. / 2t+8.., column g) and accumulates D [16 x 8] in four floats (row g columns
// 2t, 2t+1, then row g + 8), g = lane / 4, t = lane % 4.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "gpt/cuda/attention_tiles.cuh"

namespace zero::gpt::cuda::attn {

__device__ __forceinline__ void cta_sync() { __syncthreads(); }

__device__ __forceinline__ void warp_sync() { __syncwarp(); }

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }

__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const bf16* row) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], const bf16* row) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at)
               : "memory");
}

// d += a . b
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace zero::gpt::cuda::attn
