#include "backend/host_staging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "zero/error.hpp"

namespace zero {

namespace {

// All-ones bytes are a NaN in fp32, bf16 and fp16 alike.
constexpr unsigned char kPoison = 0xFF;

}  // namespace

void HostOffloadStaging::begin(std::size_t grad_esize, std::size_t param_esize, std::size_t chunk) {
  ZERO_CHECK(grad_esize > 0 && param_esize > 0 && chunk > 0,
             "OffloadStaging::begin: element sizes and chunk must be positive");
  ranges_.clear();
  gesize_ = grad_esize;
  esize_ = param_esize;
  chunk_ = chunk;
}

void HostOffloadStaging::add(const void* grads, void* params, std::size_t n) {
  Range& r = ranges_.emplace_back();
  r.dev_params = static_cast<char*>(params);
  r.n = n;
  const auto* g = static_cast<const char*>(grads);
  r.in_flight.assign(g, g + n * gesize_);
  r.grads.assign(n * gesize_, static_cast<char>(kPoison));
  r.params.assign(n * esize_, static_cast<char>(kPoison));
  r.arrived.assign((n + chunk_ - 1) / chunk_, false);
  r.handed_back.assign(n, false);
  counts_.grad_elements += static_cast<std::int64_t>(n);
}

HostOffloadStaging::Range& HostOffloadStaging::range(std::size_t r, std::size_t begin, std::size_t n, const char* who) {
  ZERO_CHECK(r < ranges_.size() && begin + n <= ranges_[r].n,
             fmt::format("OffloadStaging::{}: range {} [{}, {}) was not declared by add() in this step", who, r, begin,
                         begin + n));
  return ranges_[r];
}

const void* HostOffloadStaging::host_grads(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "host_grads");
  if (n > 0) {
    ++counts_.host_grads;
    for (std::size_t c = begin / chunk_; c <= (begin + n - 1) / chunk_; ++c) {
      if (rg.arrived[c]) continue;  // a later pass reads what the first one waited for
      const std::size_t off = c * chunk_ * gesize_, len = std::min(chunk_, rg.n - c * chunk_) * gesize_;
      std::memcpy(rg.grads.data() + off, rg.in_flight.data() + off, len);
      rg.arrived[c] = true;
      ++counts_.chunk_copies;
    }
  }
  return rg.grads.data() + begin * gesize_;
}

void* HostOffloadStaging::host_params(std::size_t r, std::size_t begin) {
  return range(r, begin, 0, "host_params").params.data() + begin * esize_;
}

void HostOffloadStaging::params_ready(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "params_ready");
  for (std::size_t i = begin; i < begin + n; ++i) {
    ZERO_CHECK(!rg.handed_back[i],
               fmt::format("OffloadStaging::params_ready: range {} element {} handed back twice in one step", r, i));
    rg.handed_back[i] = true;
  }
  rg.queued.emplace_back(begin, n);
}

void HostOffloadStaging::finish() {
  for (std::size_t r = 0; r < ranges_.size(); ++r) {
    Range& rg = ranges_[r];
    const auto missing = std::find(rg.handed_back.begin(), rg.handed_back.end(), false);
    ZERO_CHECK(missing == rg.handed_back.end(),
               fmt::format("OffloadStaging::finish: range {} element {} of {} was never handed back by params_ready", r,
                           missing - rg.handed_back.begin(), rg.n));
    for (const auto& [b, n] : rg.queued) {
      std::memcpy(rg.dev_params + b * esize_, rg.params.data() + b * esize_, n * esize_);
      counts_.params_back += static_cast<std::int64_t>(n);
    }
    rg.queued.clear();
  }
  ++counts_.steps;
}

std::int64_t HostOffloadStaging::host_bytes() const {
  std::size_t bytes = 0;
  for (const Range& r : ranges_) bytes += r.grads.size() + r.params.size();
  return static_cast<std::int64_t>(bytes);
}

}  // namespace zero
