#include "offload/swap_pipeline.hpp"

#include <algorithm>
#include <utility>

#include "zero/error.hpp"

namespace zero::offload {
namespace {

constexpr std::size_t kPage = 4096;

void wait_all(std::vector<SwapHandle>& handles) {
  for (SwapHandle& h : handles) h.wait();
  handles.clear();
}

}  // namespace

SwapPipeline::SwapPipeline(NvmeSwapper& swapper, PinnedPool& pool, std::vector<std::vector<SwapSegment>> groups)
    : swapper_(swapper), groups_(std::move(groups)) {
  std::size_t largest = 0;
  offsets_.reserve(groups_.size());
  for (const auto& group : groups_) {
    std::vector<std::size_t> offsets;
    std::size_t off = 0;
    for (const SwapSegment& seg : group) {
      swapper_.reserve(seg.key, seg.bytes);
      offsets.push_back(off);
      off += (seg.bytes + kPage - 1) / kPage * kPage;
    }
    largest = std::max(largest, off);
    offsets_.push_back(std::move(offsets));
  }
  // Three buffers: one being read, one being worked on, one being written.
  const std::size_t slots = std::min<std::size_t>(3, groups_.size());
  for (std::size_t i = 0; i < slots; ++i) buffers_.push_back(pool.acquire(largest));
}

void SwapPipeline::run(Mode mode, const GroupFn& fn) {
  const std::size_t n = groups_.size();
  if (n == 0) return;
  const std::size_t slots = buffers_.size();
  const bool reading = mode != Mode::write_only;
  const bool writing = mode != Mode::read_only;
  std::vector<std::vector<SwapHandle>> reads(slots), writes(slots);
  auto base = [&](std::size_t group) { return buffers_[group % slots].as<unsigned char>(); };
  auto start_reads = [&](std::size_t group) {
    auto& hs = reads[group % slots];
    for (std::size_t s = 0; s < groups_[group].size(); ++s) {
      const SwapSegment& seg = groups_[group][s];
      hs.push_back(swapper_.read_async(seg.key, base(group) + offsets_[group][s], seg.bytes));
    }
  };

  if (reading) start_reads(0);
  for (std::size_t i = 0; i < n; ++i) {
    wait_all(reads[i % slots]);
    if (i + 1 < n) {
      // The next group's buffer last held group i-2; its write-back must be on disk first.
      wait_all(writes[(i + 1) % slots]);
      if (reading) start_reads(i + 1);
    }
    SwapGroupView view;
    view.base_ = base(i);
    view.offsets_ = &offsets_[i];
    view.segments_ = &groups_[i];
    fn(i, view);
    if (writing) {
      auto& hs = writes[i % slots];
      for (std::size_t s = 0; s < groups_[i].size(); ++s) {
        const SwapSegment& seg = groups_[i][s];
        hs.push_back(swapper_.write_async(seg.key, base(i) + offsets_[i][s], seg.bytes));
      }
    }
  }
  for (auto& hs : writes) wait_all(hs);
}

}  // namespace zero::offload
