// A host emulator of the warp primitives the attention kernel bodies are written on
// (examples/gpt/cuda/attention_mma.cuh on the device), so that the very same bodies run on the
// CPU: __syncthreads, __syncwarp, __shfl_xor_sync, ldmatrix.sync.aligned.m8n8.x4[.trans].b16
// and mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, with the fragment layouts of NVIDIA's
// PTX ISA (sections "Warp-level matrix load instruction: ldmatrix" and "Matrix Fragments for
// mma.m16n8k16 with floating point type").
//
// run_grid runs a body once per thread of every block, blocks one after another. The threads of a
// block are cooperative fibers on the calling OS thread, resumed round robin: each runs until it
// reaches a primitive, where it waits; when every participant has arrived (the 32 lanes of its
// warp, or the 128 threads for cta_sync) the primitive's results are computed for all of them
// at once and they go on. So shared memory is sequentially consistent and the schedule is
// deterministic; the other orders (emulator::Order) make a missing barrier change the result (a
// race shows up as a difference between two orders).
//
// Misuse the device would not survive is reported instead of hanging: lanes of one warp at
// different primitives, lanes waiting at a primitive while others of their warp have exited, a
// cta_sync some thread never reaches, ldmatrix addresses that are not 16-byte aligned or not in
// the block's shared memory, a shfl_xor lane mask outside 0..31. run_grid then throws
// std::runtime_error naming the block, warp and lanes; an exception thrown by the body (a failed
// REQUIRE, say) stops the grid and is rethrown from run_grid. Fibers stopped that way are
// abandoned, not unwound.
//
// Include this header before the kernel bodies (attention_warp.cuh declares nothing on the host;
// it finds these declarations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "gpt/cuda/attention_tiles.cuh"

namespace zero::gpt::cuda::attn {

// __syncthreads(): all kThreads threads of the block.
void cta_sync();
// __syncwarp(): all 32 lanes of the calling warp.
void warp_sync();
// __shfl_xor_sync(0xffffffff, v, lane_mask): the v of lane (lane ^ lane_mask).
float shfl_xor(float v, int lane_mask);
// ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [row]: lanes 8m .. 8m+7 give the
// addresses of matrix m's 8 rows of 8 bf16 (16 bytes each); r[m] of lane l gets matrix m's row
// l/4, columns 2(l%4) (low half) and 2(l%4)+1 (high half).
void ldsm_x4(std::uint32_t (&r)[4], const bf16* row);
// The same with .trans: r[m] of lane l gets elements l/4 of rows 2(l%4) (low half) and
// 2(l%4)+1 (high half) of matrix m as addressed, i.e. the transposed matrix's row l/4.
void ldsm_x4_t(std::uint32_t (&r)[4], const bf16* row);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, d: d += a . b over the warp's
// fragments (layouts in warp_emulator.cpp), each dot product's 16 products summed in k order in
// fp32 and added to d.
void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]);

// Runs body once per thread (kThreads threads) for every block (x, y) of grid, x fastest,
// blocks one after another, with smem_bytes of shared memory per block (128-byte aligned),
// filled with 0xFF bytes before each block (bf16 NaNs: a read of an element nobody wrote shows
// up as NaN). Throws as described above. Not reentrant: a body must not call run_grid.
void run_grid(Grid grid, std::size_t smem_bytes, const std::function<void(const Cta&)>& body);

namespace emulator {

// How the scheduler interleaves the threads, for every later run_grid: every runnable thread to
// its next primitive, lowest first (ascending) or highest first (descending), so the warps move in
// step; or one warp at a time (lowest or highest first) until it reaches the block barrier or its
// end, so the warps are a whole barrier interval apart: a barrier missing between a warp's
// last read of a shared tile and another warp's overwrite changes the result.
enum class Order { ascending, descending, warp_by_warp, warp_by_warp_reversed };
void set_order(Order order);
Order order();

// Collective operations completed since the process started (warp primitives count once per
// warp, cta_sync once per block), for the tests' own statistics.
std::uint64_t collectives();

}  // namespace emulator
}  // namespace zero::gpt::cuda::attn
