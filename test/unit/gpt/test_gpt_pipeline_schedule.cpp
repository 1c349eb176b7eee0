// The GPT trainer's 1F1B schedule (examples/gpt/pipeline.hpp) on its own: the order of forwards
// and backwards per stage, the activation bound, the layer split, and a simulation of the
// stages' point-to-point transfers under the trainer's waiting rules showing that every receive
// pairs with the matching send and that no combination of stages and micro-batches deadlocks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "gpt/pipeline.hpp"

using namespace zero::gpt;

namespace {

std::string show(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops) {
    if (!s.empty()) s += ' ';
    s += op.forward ? 'F' : 'B';
    s += std::to_string(op.micro);
  }
  return s;
}

}  // namespace

TEST_CASE("1F1B: warm-up forwards, then one forward and one backward, then the remaining backwards") {
  // P = 4 stages, m = 6 micro-batches, written out by hand.
  REQUIRE(show(one_f_one_b(4, 0, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  REQUIRE(show(one_f_one_b(4, 1, 6)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  REQUIRE(show(one_f_one_b(4, 2, 6)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  REQUIRE(show(one_f_one_b(4, 3, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: all forwards, then all backwards, on the early stages.
  REQUIRE(show(one_f_one_b(4, 0, 2)) == "F0 F1 B0 B1");
  REQUIRE(show(one_f_one_b(1, 0, 3)) == "F0 B0 F1 B1 F2 B2");
}

TEST_CASE("1F1B: every micro-batch once each way, in order, at most min(P - stage, m) in flight") {
  for (int P = 1; P <= 6; ++P)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < P; ++s) {
        INFO("P " << P << ", stage " << s << ", m " << m);
        const std::vector<PipeOp> ops = one_f_one_b(P, s, m);
        REQUIRE(ops.size() == static_cast<std::size_t>(2 * m));
        int next_f = 0, next_b = 0, in_flight = 0, peak = 0;
        for (const PipeOp& op : ops) {
          if (op.forward) {
            REQUIRE(op.micro == next_f++);
            peak = std::max(peak, ++in_flight);
          } else {
            REQUIRE(op.micro == next_b++);
            REQUIRE(op.micro < next_f);  // its forward came first
            --in_flight;
          }
        }
        REQUIRE(peak == std::min(P - s, m));
        REQUIRE(peak == in_flight_bound(P, s, m));
      }
  REQUIRE(bubble_fraction(4, 12) == Approx(3.0 / 15.0));
  REQUIRE(bubble_fraction(1, 5) == 0.0);
}

TEST_CASE("the layer split: contiguous, the first n_layer mod P stages one block more") {
  const int L = 8, P = 3;
  std::vector<int> sizes;
  int next = 0;
  for (int s = 0; s < P; ++s) {
    const StageSplit sp = stage_split(L, P, s);
    REQUIRE(sp.first_layer == next);
    sizes.push_back(sp.end_layer - sp.first_layer);
    next = sp.end_layer;
  }
  REQUIRE(next == L);
  REQUIRE(sizes == std::vector<int>{3, 3, 2});
  REQUIRE_THROWS_WITH(stage_split(2, 3, 0), Catch::Contains("3 stages for 2 blocks"));
}

TEST_CASE("the stages' transfers pair up and never deadlock under the trainer's waits") {
  // Each stage runs its ops in order; an op is atomic here and may run when
  //   - a forward's activation (stage > 0) was sent by the previous stage's forward of the same
  //     micro-batch, and a backward's gradient (stage < P - 1) by the next stage's backward;
  //   - the send its buffer last carried has been received (the trainer waits on it before the
  //     buffer is reused): a forward reuses slot micro % slots, whose previous activation
  //     (micro - slots) the next stage must have taken; a backward reuses the output-gradient
  //     buffer, whose previous gradient (micro - 1) the previous stage must have taken. A
  //     receive is posted once the receiving op is the stage's next op.
  //   - the last micro-batch's backward on the first and last stage exchanges wte's gradient: it
  //     needs the other one to have reached its own.
  // Messages between two stages match in order, so the k-th send must meet the k-th receive of
  // the same micro-batch: forwards and backwards each run in micro-batch order on every stage.
  for (int P = 2; P <= 5; ++P)
    for (int m = 1; m <= 8; ++m) {
      INFO("P " << P << ", m " << m);
      std::vector<std::vector<PipeOp>> ops;
      for (int s = 0; s < P; ++s) ops.push_back(one_f_one_b(P, s, m));
      for (int s = 0; s + 1 < P; ++s)
        for (bool fwd : {true, false}) {
          std::vector<int> a, b;
          for (const PipeOp& op : ops[static_cast<std::size_t>(s)]) if (op.forward == fwd) a.push_back(op.micro);
          for (const PipeOp& op : ops[static_cast<std::size_t>(s + 1)]) if (op.forward == fwd) b.push_back(op.micro);
          REQUIRE(a == b);
        }
      std::vector<std::size_t> pc(static_cast<std::size_t>(P), 0);
      // Whether stage s has run, or is about to run, op {fwd, micro}.
      auto reached = [&](int s, bool fwd, int micro) {
        const auto& o = ops[static_cast<std::size_t>(s)];
        for (std::size_t i = 0; i < o.size() && i <= pc[static_cast<std::size_t>(s)]; ++i)
          if (o[i].forward == fwd && o[i].micro == micro) return true;
        return false;
      };
      auto done = [&](int s, bool fwd, int micro) {
        const auto& o = ops[static_cast<std::size_t>(s)];
        for (std::size_t i = 0; i < pc[static_cast<std::size_t>(s)]; ++i)
          if (o[i].forward == fwd && o[i].micro == micro) return true;
        return false;
      };
      auto runnable = [&](int s) {
        const PipeOp op = ops[static_cast<std::size_t>(s)][pc[static_cast<std::size_t>(s)]];
        const int slots = in_flight_bound(P, s, m);
        if (op.forward) {
          if (s > 0 && !done(s - 1, true, op.micro)) return false;
          if (s < P - 1 && op.micro >= slots && !reached(s + 1, true, op.micro - slots)) return false;
        } else {
          if (s < P - 1 && !done(s + 1, false, op.micro)) return false;
          if (s > 0 && op.micro >= 1 && !reached(s - 1, false, op.micro - 1)) return false;
          if (op.micro == m - 1 && (s == 0 || s == P - 1) && !reached(s == 0 ? P - 1 : 0, false, m - 1)) return false;
        }
        return true;
      };
      for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < P; ++s)
          while (pc[static_cast<std::size_t>(s)] < ops[static_cast<std::size_t>(s)].size() && runnable(s)) {
            ++pc[static_cast<std::size_t>(s)];
            progress = true;
          }
      }
      for (int s = 0; s < P; ++s) {
        INFO("stage " << s << " stopped before op " << pc[static_cast<std::size_t>(s)]);
        REQUIRE(pc[static_cast<std::size_t>(s)] == ops[static_cast<std::size_t>(s)].size());
      }
    }
}
