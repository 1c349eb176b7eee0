// The collective check (see comm/collective_check.hpp) and the thread's CommSite.
#include "comm/collective_check.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <vector>

#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {
thread_local CommSite t_site;

// Fixed size of one rank's description in the mismatch exchange (longer ones are cut).
constexpr std::size_t kDescribeBytes = 200;

bool check_enabled_by_env() {
  const char* v = std::getenv("ZERO_COLLECTIVE_CHECK");
  if (v == nullptr || *v == '\0') return true;
  const std::string_view s(v);
  if (s == "0" || s == "off" || s == "false") return false;
  ZERO_CHECK(s == "1" || s == "on" || s == "true",
             fmt::format("ZERO_COLLECTIVE_CHECK='{}' is not 0/1 (on/off); unset it to keep the check on", s));
  return true;
}
}  // namespace

CommSite comm_site() { return t_site; }
CommSiteScope::CommSiteScope(CommSite s) : saved_(t_site) { t_site = s; }
CommSiteScope::~CommSiteScope() { t_site = saved_; }

std::string describe_collective(const CommSite& site, const char* kind, std::size_t count, DType t, int root) {
  std::string who = site.call ? site.call : "a direct communicator call";
  if (site.call && site.unit) who += fmt::format("({})", *site.unit);
  if (site.eval) who += " [eval]";
  std::string what = kind;
  const std::string_view k(kind);
  if (root >= 0) what += fmt::format(" {} rank {}", k == "send" ? "to" : "from", root);
  if (k == "all_reduce_scalar")
    what += " of one double";
  else if (count > 0)
    what += fmt::format(" of {} {}", count, k == "broadcast" ? "bytes" : dtype_name(t));
  return who + ": " + what;
}

CollectiveCheck::CollectiveCheck(MPI_Comm comm) : enabled_(check_enabled_by_env()) {
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

CollectiveCheck::~CollectiveCheck() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void CollectiveCheck::note(const char* kind, std::size_t count, DType t, int peer) {
  const std::lock_guard<std::mutex> lock(recent_mu_);
  recent_[static_cast<std::size_t>(stated_) % kRecent] = Stated{stated_ + 1, kind, count, t, peer, t_site};
  ++stated_;
}

void CollectiveCheck::agree(const char* kind, std::size_t count, DType t, int root,
                            const std::function<void(MPI_Request&)>& wait) {
  const CommSite site = t_site;
  note(kind, count, t, root);
  if (!enabled_ || size_ == 1) return;
  const std::int64_t seq = ++seq_;
  // The fingerprint covers what must match for the collectives to pair up correctly, and the
  // site, so that two ranks gathering the same unit for different reasons (one evaluating, one
  // training) are told apart before their data is mixed.
  const std::array<std::uint64_t, 4> fixed{count, static_cast<std::uint64_t>(t),
                                           static_cast<std::uint64_t>(static_cast<std::int64_t>(root)),
                                           site.eval ? 1u : 0u};
  // Chained through the seed: no hashing state to allocate on this path, taken per collective.
  std::uint64_t fp = XXH3_64bits(fixed.data(), sizeof fixed);
  fp = XXH3_64bits_withSeed(kind, std::strlen(kind) + 1, fp);
  if (site.call) fp = XXH3_64bits_withSeed(site.call, std::strlen(site.call) + 1, fp);
  if (site.unit) fp = XXH3_64bits_withSeed(site.unit->data(), site.unit->size() + 1, fp);

  std::array<std::uint64_t, 2> v{fp, ~fp};
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v.data(), 2, MPI_UINT64_T, MPI_MAX, comm_, &req));
  wait(req);
  if (v[0] == fp && ~v[1] == fp) return;  // largest == smallest == mine: every rank agrees

  // Disagreement: every rank is here (it took the same all-reduce), so the exchange matches.
  std::array<char, kDescribeBytes> mine{};
  const std::string text = describe_collective(site, kind, count, t, root);
  std::memcpy(mine.data(), text.data(), std::min(text.size(), kDescribeBytes - 1));
  std::vector<char> all(kDescribeBytes * static_cast<std::size_t>(size_));
  ZERO_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(kDescribeBytes), MPI_CHAR, all.data(),
                               static_cast<int>(kDescribeBytes), MPI_CHAR, comm_));
  // Ranks with the same call are listed together, so a 64-rank job prints two lines, not 64.
  std::map<std::string, std::vector<int>> by_call;
  for (int r = 0; r < size_; ++r)
    by_call[std::string(all.data() + static_cast<std::size_t>(r) * kDescribeBytes)].push_back(r);
  std::vector<std::pair<std::vector<int>, std::string>> groups;
  for (auto& [call, ranks] : by_call) groups.emplace_back(ranks, call);
  std::sort(groups.begin(), groups.end());
  std::string calls;
  for (const auto& [ranks, call] : groups) calls += fmt::format("\n  {}: {}", rank_list(ranks), call);
  ZERO_THROW(fmt::format(
      "collective mismatch at collective #{}: the ranks issued different collectives:{}\nEvery rank must issue the "
      "same collectives in the same order. At stage 3 gather() is a collective (every rank gathers the same units "
      "in the same order, in eval mode too); to run a forward pass on one rank only (sampling, evaluation on rank "
      "0), call Engine::gather_all() on every rank first and read the units through it (docs/training-loop.md, "
      "Collectives)",
      seq, calls));
}

std::string CollectiveCheck::recent() const {
  const std::lock_guard<std::mutex> lock(recent_mu_);
  std::string s;
  const std::int64_t first = std::max<std::int64_t>(0, stated_ - static_cast<std::int64_t>(kRecent));
  for (std::int64_t i = first; i < stated_; ++i) {
    const Stated& c = recent_[static_cast<std::size_t>(i) % kRecent];
    s += fmt::format("{}#{} {}", s.empty() ? "" : "; ", c.seq,
                     describe_collective(c.site, c.kind, c.count, c.t, c.root));
  }
  return s.empty() ? "none" : s;
}

}  // namespace zero
