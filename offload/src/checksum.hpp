// A 64-bit checksum for swap blocks.
//
// It has to keep up with NVMe reads and writes on one core, so it consumes 32 bytes per round in
// four independent multiply-rotate lanes (the multiplies pipeline instead of forming one long
// dependency chain). Every step of a lane is a bijection of its state, so changing any single
// 8-byte word of the input always changes the result; other corruptions slip through with
// probability about 2^-64. It guards against storage faults, not against an adversary.
//
// The checkpoint format (libzero/src/checkpoint_format.cpp) stores these values, so the function
// is frozen: any change to it makes existing checkpoints unreadable.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::offload::detail {

std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed = 0);

}  // namespace zero::offload::detail
