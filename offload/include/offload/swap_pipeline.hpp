// Streams sub-groups of swapped state through three pinned buffers.
//
// With optimizer state on NVMe, the step walks the shard in sub-groups: read a sub-group's
// master weights and moments, step them, write them back. Done one after the other, the disk
// and the CPU take turns idling. SwapPipeline overlaps them: while the caller works on sub-group
// i in one buffer, sub-group i+1 is being read into a second and sub-group i-1 written from a
// third. The caller supplies only the per-group work:
//
//   SwapPipeline pipe(swapper, pool, {{{"sg0/master", n0 * 4}, {"sg0/m", n0 * 4}, ...}, ...});
//   swapper.check_space();
//   pipe.run(SwapPipeline::Mode::write_only, init);   // first pass: fill and write
//   pipe.run(SwapPipeline::Mode::read_write, step);   // every step: read, update, write back
//
// A group is a list of segments (one swap key each) laid out in one buffer at 4096-byte aligned
// offsets, so each segment can go to disk with O_DIRECT.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "offload/nvme_swapper.hpp"
#include "offload/pinned_pool.hpp"

namespace zero::offload {

struct SwapSegment {
  std::string key;
  std::size_t bytes = 0;
};

// A group's segments while the caller works on it.
class SwapGroupView {
 public:
  std::size_t segment_count() const { return offsets_->size(); }
  void* segment(std::size_t s) const { return base_ + (*offsets_)[s]; }
  template <class T>
  T* as(std::size_t s) const {
    return static_cast<T*>(segment(s));
  }
  std::size_t bytes(std::size_t s) const { return (*segments_)[s].bytes; }
  const std::string& key(std::size_t s) const { return (*segments_)[s].key; }

 private:
  friend class SwapPipeline;
  unsigned char* base_ = nullptr;
  const std::vector<std::size_t>* offsets_ = nullptr;
  const std::vector<SwapSegment>* segments_ = nullptr;
};

class SwapPipeline {
 public:
  enum class Mode {
    read_write,  // read each group, call fn, write it back
    write_only,  // call fn on an uninitialised buffer, write it (the first pass)
    read_only,   // read each group, call fn, write nothing
  };
  using GroupFn = std::function<void(std::size_t group, SwapGroupView& view)>;

  // Reserves every segment's key in `swapper` and takes three buffers of the largest group
  // from `pool`. Both must outlive the pipeline.
  SwapPipeline(NvmeSwapper& swapper, PinnedPool& pool, std::vector<std::vector<SwapSegment>> groups);

  std::size_t group_count() const { return groups_.size(); }

  // Calls fn(i, view) for every group in order, overlapping the I/O of the neighbours. An
  // exception from fn or from a transfer stops the pass after the transfers in flight end.
  void run(Mode mode, const GroupFn& fn);

 private:
  NvmeSwapper& swapper_;
  std::vector<std::vector<SwapSegment>> groups_;
  std::vector<std::vector<std::size_t>> offsets_;  // per group, per segment
  std::vector<PinnedBuffer> buffers_;
};

}  // namespace zero::offload
