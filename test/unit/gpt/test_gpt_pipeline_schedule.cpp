// The GPT trainer's 1F1B schedule (examples/gpt/pipeline.hpp) on its own: the order of forwards
// and backwards per part, the activation bound, the layer split, and a simulation of the
// parts' point-to-point transfers under the trainer's waiting rules showing that every receive
// pairs with the matching send and that no combination of parts and micro-batches deadlocks,
// and a second one under NCCL's rules (a send waits for its receive, calls run in the order
// issued, a group's together) showing that the trainer's groups (pipe_transfers, the tied
// exchange) complete where the same calls issued one by one deadlock.
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
  // P = 4 parts, m = 6 micro-batches, written out by hand.
  REQUIRE(show(one_f_one_b(4, 0, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  REQUIRE(show(one_f_one_b(4, 1, 6)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  REQUIRE(show(one_f_one_b(4, 2, 6)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  REQUIRE(show(one_f_one_b(4, 3, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than parts: all forwards, then all backwards, on the early parts.
  REQUIRE(show(one_f_one_b(4, 0, 2)) == "F0 F1 B0 B1");
  REQUIRE(show(one_f_one_b(1, 0, 3)) == "F0 B0 F1 B1 F2 B2");
}

TEST_CASE("1F1B: every micro-batch once each way, in order, at most min(P - part, m) in flight") {
  for (int P = 1; P <= 6; ++P)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < P; ++s) {
        INFO("P " << P << ", part " << s << ", m " << m);
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

TEST_CASE("the layer split: contiguous, the first n_layer mod P parts one block more") {
  const int L = 8, P = 3;
  std::vector<int> sizes;
  int next = 0;
  for (int s = 0; s < P; ++s) {
    const PartSplit sp = part_split(L, P, s);
    REQUIRE(sp.first_layer == next);
    sizes.push_back(sp.end_layer - sp.first_layer);
    next = sp.end_layer;
  }
  REQUIRE(next == L);
  REQUIRE(sizes == std::vector<int>{3, 3, 2});
  REQUIRE_THROWS_WITH(part_split(2, 3, 0), Catch::Contains("3 parts for 2 blocks"));
}

TEST_CASE("the parts' transfers pair up and never deadlock under the trainer's waits") {
  // Each part runs its ops in order; an op is atomic here and may run when
  //   - a forward's activation (part > 0) was sent by the previous part's forward of the same
  //     micro-batch, and a backward's gradient (part < P - 1) by the next part's backward;
  //   - the send its buffer last carried has been received (the trainer waits on it before the
  //     buffer is reused): a forward reuses slot micro % slots, whose previous activation
  //     (micro - slots) the next part must have taken; a backward reuses the output-gradient
  //     buffer, whose previous gradient (micro - 1) the previous part must have taken. A
  //     receive is posted once the receiving op is the part's next op.
  //   - the last micro-batch's backward on the first and last part exchanges wte's gradient: it
  //     needs the other one to have reached its own.
  // Messages between two parts match in order, so the k-th send must meet the k-th receive of
  // the same micro-batch: forwards and backwards each run in micro-batch order on every part.
  for (int P = 2; P <= 5; ++P)
    for (int m = 1; m <= 8; ++m) {
      INFO("P " << P << ", m " << m);
      std::vector<std::vector<PipeOp>> ops;
      for (int s = 0; s < P; ++s) ops.push_back(one_f_one_b(P, s, m));
      for (int s = 0; s + 1 < P; ++s)
        for (bool fwd : {true, false}) {
          std::vector<int> a, b;
          for (const PipeOp& op : ops[static_cast<std::size_t>(s)])
            if (op.forward == fwd) a.push_back(op.micro);
          for (const PipeOp& op : ops[static_cast<std::size_t>(s + 1)])
            if (op.forward == fwd) b.push_back(op.micro);
          REQUIRE(a == b);
        }
      std::vector<std::size_t> pc(static_cast<std::size_t>(P), 0);
      // Whether part s has run, or is about to run, op {fwd, micro}.
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
        INFO("part " << s << " stopped before op " << pc[static_cast<std::size_t>(s)]);
        REQUIRE(pc[static_cast<std::size_t>(s)] == ops[static_cast<std::size_t>(s)].size());
      }
    }
}

namespace {

// One point-to-point call of a part: kind 0 an activation, 1 its gradient, 2 the tied wte
// gradient; n: how many calls of the same direction with the same peer the part made before.
struct Call {
  bool send = false;
  int kind = 0, micro = 0, peer = 0;
  std::size_t n = 0;
};
using Groups = std::vector<std::vector<Call>>;

// Part s's calls over a step in the order it issues them, in its groups: the transfers between
// its ops (pipe_transfers), then on the end parts the tied wte exchange (a receive and a send,
// one group). grouped = false: every call on its own, as the trainer issued them before.
Groups part_calls(int P, int s, int m, bool grouped) {
  const std::vector<PipeOp> ops = one_f_one_b(P, s, m);
  Groups out;
  auto add = [&](std::vector<Call> g) {
    if (grouped) {
      out.push_back(std::move(g));
    } else {
      for (const Call& c : g) out.push_back({c});
    }
  };
  for (std::size_t i = 0; i <= ops.size(); ++i)
    for (const auto& g : pipe_transfers(P, s, i > 0 ? &ops[i - 1] : nullptr, i < ops.size() ? &ops[i] : nullptr)) {
      REQUIRE(!g.empty());
      std::vector<Call> calls;
      for (const PipeTransfer& t : g) calls.push_back({t.send, t.activation ? 0 : 1, t.micro, t.peer, 0});
      add(calls);
    }
  if (P > 1 && (s == 0 || s == P - 1)) {
    const int peer = s == 0 ? P - 1 : 0;
    add({{false, 2, m - 1, peer, 0}, {true, 2, m - 1, peer, 0}});
  }
  std::vector<std::size_t> count(static_cast<std::size_t>(2 * P), 0);
  for (auto& g : out)
    for (Call& c : g) c.n = count[static_cast<std::size_t>(2 * c.peer + (c.send ? 1 : 0))]++;
  return out;
}

// Runs the parts' calls as NCCL does: each rank issues its groups in order on one stream, and
// NCCL's send and receive each wait for the other side (for messages larger than its buffers):
// a call completes when the matching call of its peer (the k-th send from a to b meets the k-th
// receive at b from a) is in the peer's current group, a group when all its calls have. Returns
// false when no rank can move on (a deadlock). Matching calls must carry the same transfer.
bool runs_as_nccl(const std::vector<Groups>& calls) {
  const int P = static_cast<int>(calls.size());
  struct Pos {
    std::size_t group = 0, call = 0;
  };
  // where[s][2 * peer + send]: part s's calls with peer in that direction, in order.
  std::vector<std::vector<std::vector<Pos>>> where(static_cast<std::size_t>(P),
                                                   std::vector<std::vector<Pos>>(static_cast<std::size_t>(2 * P)));
  std::vector<std::vector<std::vector<bool>>> done(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) {
    const Groups& gs = calls[static_cast<std::size_t>(s)];
    for (std::size_t g = 0; g < gs.size(); ++g) {
      done[static_cast<std::size_t>(s)].emplace_back(gs[g].size(), false);
      for (std::size_t c = 0; c < gs[g].size(); ++c)
        where[static_cast<std::size_t>(s)][static_cast<std::size_t>(2 * gs[g][c].peer + (gs[g][c].send ? 1 : 0))]
            .push_back({g, c});
    }
  }
  std::vector<std::size_t> at(static_cast<std::size_t>(P), 0);  // each part's current group
  for (;;) {
    bool progress = false;
    for (int s = 0; s < P; ++s) {
      const std::size_t g = at[static_cast<std::size_t>(s)];
      if (g == calls[static_cast<std::size_t>(s)].size()) continue;
      const auto& group = calls[static_cast<std::size_t>(s)][g];
      for (std::size_t c = 0; c < group.size(); ++c) {
        if (done[static_cast<std::size_t>(s)][g][c]) continue;
        const Call& mine = group[c];
        const auto& theirs =
            where[static_cast<std::size_t>(mine.peer)][static_cast<std::size_t>(2 * s + (mine.send ? 0 : 1))];
        INFO("part " << s << (mine.send ? " sends" : " receives") << " transfer " << mine.kind << " of micro-batch "
                     << mine.micro << " with part " << mine.peer);
        REQUIRE(mine.n < theirs.size());  // a call no other part matches
        const Pos q = theirs[mine.n];
        const Call& other = calls[static_cast<std::size_t>(mine.peer)][q.group][q.call];
        REQUIRE((other.kind == mine.kind && other.micro == mine.micro));
        if (q.group != at[static_cast<std::size_t>(mine.peer)]) continue;
        done[static_cast<std::size_t>(s)][g][c] = true;
        done[static_cast<std::size_t>(mine.peer)][q.group][q.call] = true;
        progress = true;
      }
    }
    bool finished = true;
    for (int s = 0; s < P; ++s) {
      auto& g = at[static_cast<std::size_t>(s)];
      while (g < calls[static_cast<std::size_t>(s)].size() &&
             std::all_of(done[static_cast<std::size_t>(s)][g].begin(), done[static_cast<std::size_t>(s)][g].end(),
                         [](bool d) { return d; })) {
        ++g;
        progress = true;
      }
      finished = finished && g == calls[static_cast<std::size_t>(s)].size();
    }
    if (finished) return true;
    if (!progress) return false;
  }
}

std::vector<Groups> all_calls(int P, int m, bool grouped) {
  std::vector<Groups> calls;
  for (int s = 0; s < P; ++s) calls.push_back(part_calls(P, s, m, grouped));
  return calls;
}

}  // namespace

TEST_CASE("between two ops a part sends what the first made and receives what the second needs") {
  // P = 4, part 1: forward 2 then backward 0 (the steady state): one group with part 2.
  const PipeOp f2{true, 2}, b0{false, 0}, b1{false, 1}, f3{true, 3};
  REQUIRE(pipe_transfers(4, 1, &f2, &b0) ==
          std::vector<std::vector<PipeTransfer>>{{{true, true, 2, 2}, {false, false, 0, 2}}});
  // Backward 0 then forward 3: one group with part 0.
  REQUIRE(pipe_transfers(4, 1, &b0, &f3) ==
          std::vector<std::vector<PipeTransfer>>{{{true, false, 0, 0}, {false, true, 3, 0}}});
  // Two backwards (the cool-down): peers differ, and the output gradient's buffer is sent from
  // and then received into, so two groups, the send first.
  REQUIRE(pipe_transfers(4, 1, &b0, &b1) ==
          std::vector<std::vector<PipeTransfer>>{{{true, false, 0, 0}}, {{false, false, 1, 2}}});
  // The first part receives no activation, the last sends none; nothing before the first op
  // of the first part, only the last send after the last op.
  REQUIRE(pipe_transfers(4, 0, nullptr, &f2).empty());
  REQUIRE(pipe_transfers(4, 3, &f2, &b0).empty());
  REQUIRE(pipe_transfers(4, 2, &b1, nullptr) == std::vector<std::vector<PipeTransfer>>{{{true, false, 1, 1}}});
}

TEST_CASE("on NCCL the grouped transfers complete; issued one by one, the steady state deadlocks") {
  for (int P = 2; P <= 6; ++P)
    for (int m = 1; m <= 9; ++m) {
      INFO("P " << P << ", m " << m);
      REQUIRE(runs_as_nccl(all_calls(P, m, true)));
    }
  // The trainer's calls before they were grouped: two parts each sending (an activation on, a
  // gradient back) wait for each other, as does the tied exchange's receive on both end parts.
  CHECK(!runs_as_nccl(all_calls(2, 2, false)));
  CHECK(!runs_as_nccl(all_calls(4, 8, false)));
  CHECK(!runs_as_nccl(all_calls(3, 1, false)));  // no steady state; the tied receives wait for each other
}

TEST_CASE("a pipeline part's layout keeps the embedding marks (Muon steps those with AdamW)") {
  GptConfig tied = gpt_preset("tiny");
  GptConfig untied = gpt_preset("llama-tiny");
  for (int part : {0, 1}) {
    const zero::Layout t = part_layout(tied, part_split(tied.n_layer, 2, part));
    // Both parts hold wte (the last its tied copy).
    REQUIRE(t.unit(t.find_unit("embeddings")).params[0].name == "wte.weight");
    CHECK(t.unit(t.find_unit("embeddings")).params[0].embedding);
    const zero::Layout u = part_layout(untied, part_split(untied.n_layer, 2, part));
    if (part == 0) {
      CHECK(u.unit(u.find_unit("embeddings")).params[0].embedding);
    } else {
      // The untied head is ln_f's lm_head.weight, and there is no wte copy.
      CHECK_THROWS(u.find_unit("embeddings"));
      const zero::UnitInfo& lnf = u.unit(u.find_unit("ln_f"));
      REQUIRE(lnf.params.back().name == "lm_head.weight");
      CHECK(lnf.params.back().embedding);
    }
  }
}
