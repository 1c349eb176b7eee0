#include "checksum.hpp"

#include <bit>
#include <cstring>

namespace zero::offload::detail {
namespace {

// Odd constants (so multiplication is invertible) with well-mixed bits.
constexpr std::uint64_t kMulA = 0xc2b2ae3d27d4eb4fULL;
constexpr std::uint64_t kMulB = 0x9fb21c651e98df25ULL;
constexpr std::uint64_t kMulC = 0xd6e8feb86659fd93ULL;

inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

inline std::uint64_t lane(std::uint64_t acc, std::uint64_t word) {
  return std::rotl(acc + word * kMulA, 27) * kMulB;
}

// Final avalanche: xor-shift / multiply rounds, each invertible.
inline std::uint64_t finish(std::uint64_t h) {
  h ^= h >> 31;
  h *= kMulC;
  h ^= h >> 29;
  h *= kMulB;
  h ^= h >> 32;
  return h;
}

}  // namespace

std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t a = seed + kMulA, b = seed ^ kMulB, c = seed - kMulC, d = ~seed;
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    a = lane(a, load64(p + i));
    b = lane(b, load64(p + i + 8));
    c = lane(c, load64(p + i + 16));
    d = lane(d, load64(p + i + 24));
  }
  std::uint64_t h = std::rotl(a, 1) + std::rotl(b, 17) + std::rotl(c, 33) + std::rotl(d, 49);
  for (; i + 8 <= bytes; i += 8) h = lane(h, load64(p + i));
  if (i < bytes) {
    std::uint64_t tail = 0;
    std::memcpy(&tail, p + i, bytes - i);
    h = lane(h ^ 0xffULL, tail);
  }
  return finish(h + bytes * kMulC);
}

}  // namespace zero::offload::detail
