#include "offload_staging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "cuda_check.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

CudaOffloadStaging::CudaOffloadStaging(StreamSet& streams, offload::PinnedPool& pool)
    : streams_(streams), pool_(pool) {
  ready_ = Event::create();
  done_ = Event::create();
}

CudaOffloadStaging::~CudaOffloadStaging() {
  // Copies may still read or write the pinned buffers.
  if (streams_.copy) cudaStreamSynchronize(streams_.copy);
  if (streams_.upload) cudaStreamSynchronize(streams_.upload);
}

void CudaOffloadStaging::begin(std::size_t esize, std::size_t chunk) {
  ZERO_CHECK(esize > 0 && chunk > 0, "OffloadStaging::begin: element size and chunk must be positive");
  count_ = 0;
  esize_ = esize;
  chunk_ = chunk;
  stream_after(streams_.copy, streams_.compute, ready_.get());
  stream_after(streams_.upload, streams_.compute, ready_.get());
}

void CudaOffloadStaging::add(const void* grads, void* params, std::size_t n) {
  if (count_ == ranges_.size()) ranges_.emplace_back();
  Range& r = ranges_[count_++];
  r.dev_grads = static_cast<const char*>(grads);
  r.dev_params = static_cast<char*>(params);
  r.n = n;
  const std::size_t bytes = n * esize_;
  if (r.grads.capacity() < bytes || r.params.capacity() < bytes) {
    // Sizes change only if the model does; the old buffers may still be read by copies.
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.copy));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.upload));
    r.grads = pool_.acquire(bytes);
    r.params = pool_.acquire(bytes);
  }
  const std::size_t chunks = (n + chunk_ - 1) / chunk_;
  while (r.chunk_done.size() < chunks) r.chunk_done.push_back(Event::create());
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t off = c * chunk_ * esize_, len = std::min(chunk_, n - c * chunk_) * esize_;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(r.grads.as<char>() + off, r.dev_grads + off, len, cudaMemcpyDefault, streams_.copy));
    ZERO_CUDA_CHECK(cudaEventRecord(r.chunk_done[c].get(), streams_.copy));
  }
}

CudaOffloadStaging::Range& CudaOffloadStaging::range(std::size_t r, std::size_t begin, std::size_t n,
                                                     const char* who) {
  ZERO_CHECK(r < count_ && begin + n <= ranges_[r].n,
             fmt::format("OffloadStaging::{}: range {} [{}, {}) was not declared by add() in this step", who, r, begin,
                         begin + n));
  return ranges_[r];
}

const void* CudaOffloadStaging::host_grads(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "host_grads");
  if (n > 0)
    for (std::size_t c = begin / chunk_; c <= (begin + n - 1) / chunk_; ++c)
      ZERO_CUDA_CHECK(cudaEventSynchronize(rg.chunk_done[c].get()));
  return rg.grads.as<char>() + begin * esize_;
}

void* CudaOffloadStaging::host_params(std::size_t r, std::size_t begin) {
  return range(r, begin, 0, "host_params").params.as<char>() + begin * esize_;
}

void CudaOffloadStaging::params_ready(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "params_ready");
  if (n == 0) return;
  const std::size_t off = begin * esize_;
  ZERO_CUDA_CHECK(
      cudaMemcpyAsync(rg.dev_params + off, rg.params.as<char>() + off, n * esize_, cudaMemcpyDefault, streams_.upload));
}

void CudaOffloadStaging::finish() {
  // The compute stream next zeroes the gradients (read by the D2H copies) and reads the
  // parameters (written by the H2D copies): it waits for both streams.
  stream_after(streams_.compute, streams_.copy, done_.get());
  stream_after(streams_.compute, streams_.upload, done_.get());
}

}  // namespace zero::cuda
