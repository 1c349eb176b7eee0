// bench_host_optimizers' Newton-Schulz tables (host_newton_schulz.cpp): Muon's host iteration
// against plain sgemm of the same products, and small matrices batched against one at a time.
#pragma once

#include <vector>

namespace zero::bench {

// Tables 3 and 4 at each thread count, each figure the fastest of `reps` after a warm-up.
void newton_schulz_tables(const std::vector<int>& thread_list, int reps, int ns_steps);

}  // namespace zero::bench
