// Process groups and node topology: the grid's rank order (Megatron's: tensor fastest, then
// data, then pipeline), who is in each group, clear errors for grids the world does not fit,
// and the bytes each collective sends inside and across nodes (the ring model of zero/comm.hpp);
// point-to-point send/recv (values, any posting order, traffic by the peer's node, the receiver's
// check of a mismatched pair, and ranks outside a transfer taking no part in it).
// Run at 1, 2 and 4 ranks, and at 4 ranks with ZERO_RANKS_PER_NODE=2 (two simulated nodes).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;

namespace {
std::string fmt_peer(const char* what, int peer) { return std::string(what) + " " + std::to_string(peer); }
int simulated_per_node() {
  const char* v = std::getenv("ZERO_RANKS_PER_NODE");
  return v ? std::atoi(v) : 0;
}
// The sum over a group of each member's world rank.
double sum_of_world_ranks(Communicator& c) { return c.all_reduce_scalar(Context::current()->rank(), ReduceOp::sum); }
}  // namespace

TEST_CASE("every grid the world fits: coordinates, group sizes and members in Megatron's order") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  for (int T = 1; T <= world; ++T)
    for (int P = 1; T * P <= world; ++P) {
      if (world % (T * P) != 0) continue;
      const int D = world / (T * P);
      INFO("TP " << T << " x PP " << P << " on " << world << " ranks");
      ProcessGroups g(ctx, {.tensor = T, .pipeline = P});
      const GridCoord c = g.coord();
      REQUIRE(g.data_size() == D);
      REQUIRE(c.tensor == r % T);
      REQUIRE(c.data == (r / T) % D);
      REQUIRE(c.pipeline == r / (T * D));
      REQUIRE(g.world_rank(c) == r);
      REQUIRE(g.tensor().size() == T);
      REQUIRE(g.data().size() == D);
      REQUIRE(g.pipeline().size() == P);
      REQUIRE(g.model().size() == T * P);
      REQUIRE(g.tensor().rank() == c.tensor);
      REQUIRE(g.data().rank() == c.data);
      REQUIRE(g.pipeline().rank() == c.pipeline);
      // Members, by the sum of their world ranks computed from the formula.
      double tensor_sum = 0, data_sum = 0, pipe_sum = 0, model_sum = 0;
      for (int t = 0; t < T; ++t) tensor_sum += g.world_rank({t, c.data, c.pipeline});
      for (int d = 0; d < D; ++d) data_sum += g.world_rank({c.tensor, d, c.pipeline});
      for (int p = 0; p < P; ++p) pipe_sum += g.world_rank({c.tensor, c.data, p});
      for (int t = 0; t < T; ++t)
        for (int p = 0; p < P; ++p) model_sum += g.world_rank({t, c.data, p});
      REQUIRE(sum_of_world_ranks(g.tensor()) == tensor_sum);
      REQUIRE(sum_of_world_ranks(g.data()) == data_sum);
      REQUIRE(sum_of_world_ranks(g.pipeline()) == pipe_sum);
      REQUIRE(sum_of_world_ranks(g.model()) == model_sum);
    }
}

TEST_CASE("a grid the world does not fit is an error naming the sizes, on every rank") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, {.tensor = world + 1})),
                      Catch::Contains(std::to_string(world) + " ranks does not divide") &&
                          Catch::Contains("tensor " + std::to_string(world + 1)));
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, {.tensor = 1, .pipeline = 0})), Catch::Contains("at least 1"));
  if (world == 4) REQUIRE_THROWS_WITH((ProcessGroups(ctx, {.tensor = 3})), Catch::Contains("does not divide"));
}

TEST_CASE("nodes: real (one host here) or simulated with ZERO_RANKS_PER_NODE") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  ProcessGroups g(ctx);
  const int per = simulated_per_node();
  if (per == 0) {
    REQUIRE(g.nodes() == 1);
    REQUIRE(g.ranks_per_node() == world);
    REQUIRE_FALSE(g.simulated_nodes());
  } else {
    REQUIRE(g.simulated_nodes());
    REQUIRE(g.nodes() == (world + per - 1) / per);
    REQUIRE(g.node_index() == r / per);
    for (int q = 0; q < world; ++q) REQUIRE(g.node_of_rank()[static_cast<std::size_t>(q)] == q / per);
  }
  const int local = r - g.node_index() * (per ? per : world);
  REQUIRE(g.node().rank() == local);
  REQUIRE(g.cross_node().size() == g.nodes());
  REQUIRE(g.cross_node().rank() == g.node_index());
  REQUIRE(g.describe().find(std::to_string(g.nodes()) + " nodes") != std::string::npos);
}

TEST_CASE("collectives count the bytes each rank sends inside its node and across nodes (ring model)") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  ProcessGroups g(ctx);  // TP 1 x PP 1: data() is the world in rank order
  Communicator& c = g.data();
  const int per = simulated_per_node() ? simulated_per_node() : world;
  const bool next_same_node = (r + 1) % world / per == r / per;
  const std::int64_t n = world;

  auto sent = [&](auto&& collective) {
    const TrafficBytes before = c.traffic();
    collective();
    const TrafficBytes d = c.traffic() - before;
    REQUIRE((next_same_node ? d.inter_node : d.intra_node) == 0);  // one link: to the next rank
    return next_same_node ? d.intra_node : d.inter_node;
  };
  std::vector<float> v(64 * static_cast<std::size_t>(world), 1.0f);  // room for the 100-byte broadcast
  REQUIRE(sent([&] { c.all_gather(v.data() + 10 * r, v.data(), 10, DType::f32); }) == (n - 1) * 10 * 4);
  REQUIRE(sent([&] { c.reduce_scatter(v.data(), v.data(), 10, DType::bf16); }) == (n - 1) * 10 * 2);
  REQUIRE(sent([&] { c.all_reduce(v.data(), 10, DType::f32); }) ==
          (world == 1 ? 0 : 2 * (n - 1) * ((10 + n - 1) / n) * 4));
  REQUIRE(sent([&] { c.broadcast(v.data(), 100, 0); }) == (world == 1 || (r + 1) % world == 0 ? 0 : 100));
  REQUIRE(sent([&] { c.barrier(); }) == 0);
  // The groups' total includes what data() sent.
  REQUIRE(g.traffic().intra_node + g.traffic().inter_node >= c.traffic().intra_node + c.traffic().inter_node);
}

TEST_CASE(
    "point to point: a ring of sends and receives in every dtype, posted in either order, counted by the peer's node") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  if (world < 2) return;
  ProcessGroups g(ctx);
  Communicator& c = g.data();
  const int next = (r + 1) % world, prev = (r + world - 1) % world;
  const int per = simulated_per_node() ? simulated_per_node() : world;
  const bool next_same_node = next / per == r / per;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (bool recv_first : {false, true}) {
      INFO(dtype_name(t) << (recv_first ? ", receive posted first" : ", send posted first"));
      const std::size_t n = 1000 + static_cast<std::size_t>(r);  // each pair its own size
      const std::size_t m = 1000 + static_cast<std::size_t>(prev);
      std::vector<std::uint16_t> out16(n), in16(m);
      std::vector<float> out32(n), in32(m);
      for (std::size_t i = 0; i < n; ++i) {
        out32[i] = static_cast<float>(r * 10000 + static_cast<int>(i));
        out16[i] = static_cast<std::uint16_t>(r * 1000 + static_cast<int>(i));
      }
      const void* src = t == DType::f32 ? static_cast<const void*>(out32.data()) : out16.data();
      void* dst = t == DType::f32 ? static_cast<void*>(in32.data()) : in16.data();
      const TrafficBytes before = c.traffic();
      Work a, b;
      if (recv_first) {
        b = c.recv_async(dst, m, t, prev);
        a = c.send_async(src, n, t, next);
      } else {
        a = c.send_async(src, n, t, next);
        b = c.recv_async(dst, m, t, prev);
      }
      b.wait();
      a.wait();
      for (std::size_t i = 0; i < m; ++i) {
        if (t == DType::f32)
          REQUIRE(in32[i] == static_cast<float>(prev * 10000 + static_cast<int>(i)));
        else
          REQUIRE(in16[i] == static_cast<std::uint16_t>(prev * 1000 + static_cast<int>(i)));
      }
      const TrafficBytes d = c.traffic() - before;
      const auto bytes = static_cast<std::int64_t>(n * dtype_size(t));
      REQUIRE((next_same_node ? d.intra_node : d.inter_node) == bytes);
      REQUIRE((next_same_node ? d.inter_node : d.intra_node) == 0);
    }
  }
  REQUIRE(c.recent_collectives().find(fmt_peer("send to rank", next)) != std::string::npos);
  REQUIRE(c.recent_collectives().find(fmt_peer("recv from rank", prev)) != std::string::npos);
}

TEST_CASE("point to point involves only its two ranks: the others go on to their next collective") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  if (world < 2) return;
  ProcessGroups g(ctx);
  Communicator& c = g.data();
  const int last = world - 1;
  double v = 0;
  if (r == 0) c.send(&r, 1, DType::f32, last);  // 4 bytes: the int's bits, read back as they are
  if (r == last) {
    int got = -1;
    c.recv(&got, 1, DType::f32, 0);
    REQUIRE(got == 0);
  }
  v = c.all_reduce_scalar(1.0, ReduceOp::sum);
  REQUIRE(v == world);
  // A peer outside the communicator, or this rank itself, is an error naming it.
  REQUIRE_THROWS_WITH(c.send(&r, 1, DType::f32, world), Catch::Contains("peer " + std::to_string(world)));
  REQUIRE_THROWS_WITH(c.recv(&v, 1, DType::f32, r), Catch::Contains("not another rank"));
}

TEST_CASE("a receive that does not match its send is an error naming both ranks and both sizes") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  if (world < 2) return;
  // Its own groups: the refused payload stays unread in this communicator, which then goes.
  ProcessGroups g(ctx);
  Communicator& c = g.data();
  std::vector<float> buf(8, 1.0f);
  if (r == 0) c.send(buf.data(), 5, DType::f32, 1);
  if (r == 1)
    REQUIRE_THROWS_WITH(c.recv(buf.data(), 4, DType::bf16, 0),
                        Catch::Contains("point-to-point mismatch") && Catch::Contains("rank 0 sent 5 fp32") &&
                            Catch::Contains("rank 1 posted a receive of 4 bf16"));
  ctx.comm().barrier();
  if (world != 4) return;
  // On a group whose ranks are not the world's (tensor rank 1's data group: world ranks 1 and 3),
  // the two ranks are named by their world ranks, as the deadline reports name them.
  ProcessGroups tp(ctx, {.tensor = 2});
  if (tp.coord().tensor == 1) {
    Communicator& d = tp.data();
    if (d.rank() == 0)
      d.send(buf.data(), 5, DType::f32, 1);
    else
      REQUIRE_THROWS_WITH(
          d.recv(buf.data(), 4, DType::f32, 0),
          Catch::Contains("world rank 1 sent 5 fp32") && Catch::Contains("world rank 3 posted a receive of 4 fp32"));
  }
  ctx.comm().barrier();
}

TEST_CASE("all_to_all delivers block j to rank j and counts each block on its destination's side") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size(), r = ctx.rank();
  ProcessGroups g(ctx);
  Communicator& c = g.data();
  const int per = simulated_per_node() ? simulated_per_node() : world;
  for (DType t : {DType::f32, DType::bf16})
    for (std::size_t n : {0u, 1u, 37u}) {
      INFO(dtype_name(t) << ", " << n << " elements per rank");
      std::vector<char> send(n * dtype_size(t) * static_cast<std::size_t>(world) + 1),
          recv(n * dtype_size(t) * static_cast<std::size_t>(world) + 1);
      // Integers below 256: exact in bf16 (up to 4 ranks).
      auto value = [](int from, int to, std::size_t i) {
        return static_cast<float>(from * 32 + to * 8 + static_cast<int>(i % 8));
      };
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < n; ++i)
          store_from_f32(send.data(), static_cast<std::size_t>(j) * n + i, t, value(r, j, i));
      const TrafficBytes before = c.traffic();
      c.all_to_all(send.data(), recv.data(), n, t);
      const TrafficBytes d = c.traffic() - before;
      for (int j = 0; j < world; ++j)
        for (std::size_t i = 0; i < n; ++i)
          REQUIRE(load_as_f32(recv.data(), static_cast<std::size_t>(j) * n + i, t) == value(j, r, i));
      std::int64_t intra = 0, inter = 0;
      for (int j = 0; j < world; ++j)
        if (j != r) (j / per == r / per ? intra : inter) += static_cast<std::int64_t>(n * dtype_size(t));
      REQUIRE(d.intra_node == intra);
      REQUIRE(d.inter_node == inter);
    }
}
namespace {
// This rank's groups as lists of world ranks, read off a grid.
ExplicitGroups lists_of(const ProcessGroups& g) {
  ExplicitGroups e;
  const GridCoord c = g.coord();
  for (int t = 0; t < g.tensor_size(); ++t) e.tensor.push_back(g.world_rank({t, c.data, c.pipeline}));
  for (int d = 0; d < g.data_size(); ++d) e.data.push_back(g.world_rank({c.tensor, d, c.pipeline}));
  for (int p = 0; p < g.pipeline_size(); ++p) e.pipeline.push_back(g.world_rank({c.tensor, c.data, p}));
  return e;
}
}  // namespace

TEST_CASE("explicit groups: Megatron's own lists give Megatron's grid") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  for (int T = 1; T <= world; ++T)
    for (int P = 1; T * P <= world; ++P) {
      if (world % (T * P) != 0) continue;
      INFO("TP " << T << " x PP " << P);
      ProcessGroups ref(ctx, {.tensor = T, .pipeline = P});
      ProcessGroups g(ctx, lists_of(ref));
      REQUIRE(g.explicit_groups());
      REQUIRE(g.tensor_size() == T);
      REQUIRE(g.pipeline_size() == P);
      REQUIRE(g.data_size() == ref.data_size());
      REQUIRE(g.coord().tensor == ref.coord().tensor);
      REQUIRE(g.coord().data == ref.coord().data);
      REQUIRE(g.coord().pipeline == ref.coord().pipeline);
      REQUIRE(sum_of_world_ranks(g.tensor()) == sum_of_world_ranks(ref.tensor()));
      REQUIRE(sum_of_world_ranks(g.data()) == sum_of_world_ranks(ref.data()));
      REQUIRE(sum_of_world_ranks(g.model()) == sum_of_world_ranks(ref.model()));
    }
}

TEST_CASE("explicit groups in another order than Megatron's, and lists that do not form a grid") {
  Context& ctx = *Context::current();
  if (ctx.world_size() != 4) return;
  const int r = ctx.rank();
  // Tensor pairs {0, 2} and {1, 3} (data parallel adjacent instead): data pairs {0, 1}, {2, 3}.
  ExplicitGroups e;
  e.tensor = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  e.data = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  e.pipeline = {r};
  ProcessGroups g(ctx, e);
  REQUIRE(g.tensor_size() == 2);
  REQUIRE(g.data_size() == 2);
  REQUIRE(g.coord().tensor == r / 2);
  REQUIRE(g.coord().data == r % 2);
  REQUIRE(g.world_rank(g.coord()) == r);
  REQUIRE(g.world_rank({1, 0, 0}) == 2);
  REQUIRE(g.tensor().rank() == r / 2);
  REQUIRE(sum_of_world_ranks(g.tensor()) == (r % 2 == 0 ? 2 : 4));
  REQUIRE(sum_of_world_ranks(g.data()) == (r < 2 ? 1 : 5));
  REQUIRE(g.describe().find("explicit groups") != std::string::npos);

  // Members that disagree on a group's order.
  ExplicitGroups bad = e;
  if (r == 2) bad.tensor = {2, 0};
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, bad)), Catch::Contains("rank 0's tensor group is [0, 2], but its member "
                                                                 "rank 2 passes [2, 0]"));
  // Groups that cross: tensor and data both {0, 1}, {2, 3}.
  bad = e;
  bad.tensor = bad.data;
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, bad)),
                      Catch::Contains("ranks 0 and 1 share a tensor group [0, 1]") && Catch::Contains("as in a grid"));
  // Sizes that differ between ranks, or do not make the world; a rank outside its own group.
  bad = e;
  if (r == 3) bad.tensor = {3};
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, bad)), Catch::Contains("rank 3 passes a tensor group of 1 ranks [3], rank 0 "
                                                                 "one of 2 [0, 2]"));
  bad = e;
  bad.pipeline = {0, 1};
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, bad)), Catch::Contains("tensor 2 x data 2 x pipeline 2 ranks is not the "
                                                                 "world of 4"));
  bad = e;
  if (r == 1) bad.data = {0, 2};
  REQUIRE_THROWS_WITH((ProcessGroups(ctx, bad)), Catch::Contains("rank 1's data group [0, 2] does not contain rank 1"));
}
