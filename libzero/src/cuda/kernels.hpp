// Host entry points of the CUDA backend's kernels: fills and casts, accumulation, the global
// sum of squares, the fused optimizer updates over a flat shard, and block quantization.
//
// The optimizer kernels repeat the host reference (offload/src/host_adam.cpp's scalar kernel)
// operation for operation: the same per-step constants, computed on the host in double and
// rounded once; IEEE round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn),
// which the compiler never contracts, for the host's separate operations; __fmaf_rn exactly
// where the host calls std::fma; and the bf16 / fp16 rounding of zero/dtype.hpp, bit for bit.
// So results equal the host AdamW/SGD bit for bit (0 ulp), NaNs excepted: a NaN stays a NaN,
// but its payload bits follow each machine's rules.
//
// The sum of squares is deterministic: a fixed grid per device, each block accumulating into its own
// partial across calls, and one fixed-order final reduction, so the same gradients give the same
// norm bits on every run. It differs from the host's sequential double sum only in rounding
// (relative ~1e-16 x elements); squares of fp32 values are exact in double, so inf and nan
// propagate and finite values never overflow.
//
// Every function enqueues on `stream` and returns; n may be 0. No host synchronization.
// Element-wise kernels move four elements per access where the buffers are aligned for it
// (always, for the allocator's buffers), with a scalar tail and a scalar fallback otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "offload/host_optimizer.hpp"
#include "zero/dtype.hpp"
#include "zero/optim.hpp"

namespace zero::cuda {

// The per-step Adam scalars come from zero::adam_constants (zero/optim.hpp), so the kernels and
// the host paths start every update from identical floats.

// Enqueue one update; param_out may be null (no compute-dtype copy).
void launch_adam(float* master, float* m, float* v, const void* grad, DType grad_type, void* param_out,
                 DType param_type, std::size_t n, const AdamConstants& c, cudaStream_t stream);
void launch_sgd(float* master, float* momentum_buf, const void* grad, DType grad_type, void* param_out,
                DType param_type, std::size_t n, const SgdHyper& h, cudaStream_t stream);
// Lion and LAMB (optimizer_kernels.cu): offload::lion_step, lamb_moments and lamb_apply's
// arithmetic, the element-wise results bit for bit. launch_lamb_moments adds the run's sums of
// p^2 and u^2 to sums[0] and sums[1] (device doubles) in a fixed order: deterministic, but
// rounded differently from the host's eight-lane fold. scratch holds 2 x kSumBlocks doubles,
// free for the launch's use until the next launch on the stream (the same for every fixed-order
// sum below).
constexpr std::size_t kSumBlocks = 1024;
void launch_lion(float* master, float* m, const void* grad, DType grad_type, void* param_out, DType param_type,
                 std::size_t n, const offload::LionConstants& c, cudaStream_t stream);
void launch_lamb_moments(const float* master, float* m, float* v, const void* grad, DType grad_type, std::size_t n,
                         const offload::LambConstants& c, double* sums, double* scratch, cudaStream_t stream);
void launch_lamb_apply(float* master, const float* m, const float* v, void* param_out, DType param_type, std::size_t n,
                       const offload::LambConstants& c, float step, cudaStream_t stream);
// One block adds the `blocks` pairs of partials (scratch of a fixed-order sum) to sums[0] and,
// when `two`, sums[1], in a fixed order.
void launch_add_partials(const double* partials, unsigned blocks, bool two, double* sums, cudaStream_t stream);
// *sum += the sum of x^2 over n fp32 values, in a fixed order (scratch as above).
void launch_add_sumsq(const float* x, std::size_t n, double* sum, double* scratch, cudaStream_t stream);

// Adafactor (adafactor_kernels.cu): offload::adafactor_vector, adafactor_matrix_sums,
// adafactor_matrix_rms and adafactor_apply's arithmetic, element-wise results bit for bit; the
// row and column sums are the host's sequential folds (one thread per row or column, in element
// order), so they equal the host's bit for bit too; the sums of p^2 and u^2 are fixed-order sums
// as LAMB's. Runs as Backend::adafactor_* describes; scratch as above.
void launch_adafactor_vector(const float* master, float* v, const void* grad, DType grad_type, std::size_t n,
                             const offload::AdafactorConstants& c, double* sums, double* scratch, cudaStream_t stream);
void launch_adafactor_matrix_sums(const float* master, const void* grad, DType grad_type, std::int64_t at,
                                  std::size_t n, std::int64_t cols, const offload::AdafactorConstants& c,
                                  double* row_sums, double* col_sums, double* p_sum, double* scratch,
                                  cudaStream_t stream);
void launch_adafactor_matrix_rms(const void* grad, DType grad_type, std::int64_t at, std::size_t n, std::int64_t cols,
                                 float grad_scale, const float* row_factor, const float* col_factor, double* u_sum,
                                 double* scratch, cudaStream_t stream);
void launch_adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType grad_type,
                            void* param_out, DType param_type, std::int64_t at, std::size_t n, std::int64_t cols,
                            const float* row_factor, const float* col_factor, const offload::AdafactorApply& a,
                            cudaStream_t stream);

// Muon's element-wise parts (muon_kernels.cu): offload::muon_momentum and muon_apply, bit for bit.
void launch_muon_momentum(float* buf, const void* grad, DType grad_type, std::size_t n, float grad_scale,
                          float momentum, bool nesterov, float* x_out, cudaStream_t stream);
void launch_muon_apply(float* master, const float* o, void* param_out, DType param_type, std::size_t n, float decay,
                       float step, cudaStream_t stream);
// Newton-Schulz's conversions (cuda/newton_schulz.cpp runs the products): `inv` (one device
// float) = 1 / max(||x||_F, 1e-7) of the [rows, cols] fp32 matrix x, its sum of squares a
// fixed-order sum (scratch as above, plus one double: 2 x kSumBlocks + 1); X (bf16 bits) =
// x * inv, transposed when rows > cols so that X is [min, max]. ns_store writes X back into x,
// transposed back.
void launch_ns_load(const float* x, std::int64_t rows, std::int64_t cols, std::uint16_t* X, float* inv, double* scratch,
                    cudaStream_t stream);
void launch_ns_store(const std::uint16_t* X, std::int64_t rows, std::int64_t cols, float* x, cudaStream_t stream);

// 1-bit Adam / LAMB (onebit_kernels.cu): offload::onebit_worker, onebit_decode,
// onebit_adam_apply and onebit_lamb_moments' element-wise arithmetic bit for bit; the
// compressions take one block per chunk, the RMS's sum of squares a fixed-order sum (so a
// scale may differ from the host's by the rounding of that sum), and from the scale the bits
// and errors as the host's. Chunked forms (Backend::onebit_compress): `count` chunks of `chunk`
// values of x, of which the first `numel` in all are real; chunk c's bits ((chunk + 7) / 8 bytes)
// at bits + c bits_stride, its scale at scales[c scale_stride].
void launch_onebit_worker(float* x, const float* shared, const void* grad, DType grad_type, std::size_t n, float b1,
                          float one_minus_b1, float grad_scale, bool add_error, cudaStream_t stream);
void launch_onebit_compress(float* x, std::size_t chunk, std::size_t numel, std::size_t count, std::uint8_t* bits,
                            std::size_t bits_stride, float* scales, std::size_t scale_stride, cudaStream_t stream);
// The server's chunk of `chunk` values, n real; worker w's scale at worker_scales[w scale_stride].
void launch_onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales,
                          std::size_t scale_stride, int workers, float* error, std::size_t n, std::size_t chunk,
                          std::uint8_t* bits, float* scale, cudaStream_t stream);
// out[c chunk + i] = scale_c x sign_i for the real values, 0 for the padding.
void launch_onebit_decode(const std::uint8_t* bits, std::size_t bits_stride, const float* scales,
                          std::size_t scale_stride, std::size_t chunk, std::size_t numel, std::size_t count, float* out,
                          cudaStream_t stream);
// x[i] *= c (OneBitLamb's scaling coefficient on the captured momentum).
void launch_onebit_scale(float* x, std::size_t n, float c, cudaStream_t stream);
void launch_onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* param_out,
                              DType param_type, std::size_t n, float decay, float neg_lr, float eps,
                              cudaStream_t stream);
// sums[0] += the run's sum of u^2, sums[1] += of prelim^2 (fixed-order sums; scratch as above),
// sums[2] = the largest of itself and the run's ratios (non-negative, so exact in any order).
void launch_onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                                std::size_t n, const offload::OneBitLambConstants& c, double* sums, double* scratch,
                                cudaStream_t stream);

// dst[i] = src[i] converted (dtypes may be equal: a copy).
void launch_convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t stream);
// dst[i] += src[i], added in fp32 and rounded once to dst_type (equal dtypes, or an fp32 dst).
void launch_accumulate(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n, cudaStream_t stream);

// buf[i] = buf[i] / d, divided in fp32 and rounded once to t (the average after a summing
// collective: a 16-bit 1/d would bias every element by the rounding of 1/d).
void launch_divide(void* buf, DType t, std::size_t n, float d, cudaStream_t stream);

// Sum of squares over a grid of `blocks` = sumsq_blocks() (the current device's multiprocessors
// x the blocks each keeps resident: the whole device, whatever its size). partials holds
// `blocks` doubles, zeroed before the first add of a step.
int sumsq_blocks();
void launch_sumsq_add(const void* g, DType t, std::size_t n, double* partials, int blocks, cudaStream_t stream);
// *out = the fixed-order sum of the partials.
void launch_sumsq_finish(const double* partials, int blocks, double* out, cudaStream_t stream);

// Block quantization (ZeRO++ qwZ / qgZ) on device buffers: comm/quantize.hpp's packed layout,
// rounding and NaN rule, element by element through comm/quantize_math.hpp, so the packed bytes
// and the residuals equal the host quantizer's bit for bit. A message of n values takes
// quant::packed_bytes(n, block, bits) bytes (4-byte aligned: the scales are fp32); block >= 1.
// Several messages lie in slots that many bytes apart, and one launch serves all of them (the
// Backend forms of backend/backend.hpp, which these implement).
// int8 from values of dtype t; the padding after the values is zeroed.
void launch_quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out, cudaStream_t stream);
// dst's elements [k n, (k + 1) n) = message k dequantized, rounded once to t, for k < count.
void launch_dequantize_int8(const void* in, std::size_t count, std::size_t n, std::size_t block, void* dst, DType t,
                            cudaStream_t stream);
// Error feedback (qgZ): quantizes count vectors of v (int8, or int4 packed two per byte) into
// their slots of out (k, or k + 1 from `skip` on; slot skip zeroed) and leaves in v what the
// receivers will not get back, v - dequantize(out), as quant::quantize_keep_error does.
void launch_quantize_keep_error(float* v, std::size_t count, std::size_t n, std::size_t block, bool int8, void* out,
                                std::size_t skip, cudaStream_t stream);
// acc[i] += the dequantized value i of the messages in slots [first, last), in slot order, in
// fp32 (quant::dequantize_add, once per message).
void launch_dequantize_add(const void* in, std::size_t first, std::size_t last, std::size_t n, std::size_t block,
                           bool int8, float* acc, cudaStream_t stream);
// dst row r (fp32) = or += src row rows[r] (dtype t), rows of `row` elements, r < count; rows is
// device memory.
void launch_gather_rows(float* dst, const void* src, DType t, std::size_t row, const std::int32_t* rows,
                        std::size_t count, bool add, cudaStream_t stream);

}  // namespace zero::cuda
