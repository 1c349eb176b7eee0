// Timing variants that take turns: each item's passes run once per round after an untimed setup,
// so that a noisy neighbour on a shared machine slows them alike; the fastest run counts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace zero::bench {

// Something timed: `passes` run in order (each timed), after an untimed `setup`.
struct Timed {
  Timed(std::function<void()> s, std::vector<std::function<void()>> p) : setup(std::move(s)), passes(std::move(p)) {}
  std::function<void()> setup;
  std::vector<std::function<void()>> passes;
  std::vector<double> best_pass;                                // fastest run of each pass
  double best_total = std::numeric_limits<double>::infinity();  // fastest run of all passes
};

// One warm-up run of everything, then `reps` rounds in which each item runs once in turn.
inline void time_interleaved(int reps, std::vector<Timed*>& items) {
  for (Timed* it : items) it->best_pass.assign(it->passes.size(), std::numeric_limits<double>::infinity());
  for (int r = -1; r < reps; ++r) {
    for (Timed* it : items) {
      if (it->setup) it->setup();
      double total = 0.0;
      for (std::size_t k = 0; k < it->passes.size(); ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        it->passes[k]();
        const auto t1 = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(t1 - t0).count();
        total += s;
        if (r >= 0) it->best_pass[k] = std::min(it->best_pass[k], s);
      }
      if (r >= 0) it->best_total = std::min(it->best_total, total);
    }
  }
}

}  // namespace zero::bench
