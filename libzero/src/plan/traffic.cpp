// The bytes one rank sends in a training step (zero/plan/plan.hpp: step_traffic), collective by
// collective as the engine issues them for the GPT trainer and as the communicators count them.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "comm/quantize.hpp"
#include "engine/powersgd.hpp"
#include "engine/quantized_reduce_scatter.hpp"
#include "optim/optimizer.hpp"
#include "plan/engine_sizes.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {
namespace {

// One communicator seen from one rank under the ring model (zero/comm.hpp): its size, and
// whether the rank's successor in the ring is on another node (then all it sends crosses).
struct Ring {
  std::int64_t size = 1;
  bool crosses = false;

  void all_gather(TrafficBytes& t, std::int64_t count, std::int64_t esize) const {
    add(t, ring_gather_bytes(size, count, esize));
  }
  void reduce_scatter(TrafficBytes& t, std::int64_t count, std::int64_t esize) const {
    add(t, ring_gather_bytes(size, count, esize));
  }
  void all_reduce(TrafficBytes& t, std::int64_t count, std::int64_t esize) const {
    add(t, ring_all_reduce_bytes(size, count, esize));
  }
  void scalar(TrafficBytes& t) const { all_reduce(t, size, static_cast<std::int64_t>(sizeof(double))); }
  void add(TrafficBytes& t, std::int64_t bytes) const { (crosses ? t.inter_node : t.intra_node) += bytes; }
};

// The ring of the group of `size` consecutive ranks that holds `rank` (the world: size = world).
Ring ring_of(int rank, int size, int ranks_per_node) {
  const int first = rank / size * size;
  const int next = first + (rank - first + 1) % size;
  return Ring{size, next / ranks_per_node != rank / ranks_per_node};
}

// An all-to-all of `count` elements of `esize` bytes to each other rank of the group of `size`
// consecutive ranks that holds `rank`: each block goes straight to its rank, as the
// communicators count it.
void group_all_to_all(TrafficBytes& t, int rank, int size, int ranks_per_node, std::int64_t count, std::int64_t esize) {
  const int first = rank / size * size, node = rank / ranks_per_node;
  for (int j = first; j < first + size; ++j)
    if (j != rank) (j / ranks_per_node == node ? t.intra_node : t.inter_node) += count * esize;
}

}  // namespace

PowerSgdElements powersgd_elements(const Layout& layout, const GradientCompressionConfig& cfg) {
  PowerSgdElements e;
  for (int u = 0; u < layout.num_units(); ++u)
    for (const ParamInfo& p : layout.unit(u).params) {
      const int r = powersgd_rank(p, cfg);
      if (r == 0) {
        e.plain += p.numel;
        continue;
      }
      e.p += p.shape[0] * r;
      e.q += p.numel / p.shape[0] * r;
      e.compressed += p.numel;
      e.flops += 4.0 * static_cast<double>(p.numel) * r;
    }
  return e;
}

TrafficBytes tensor_group_traffic(const Layout& layout, const Settings& s, int data_parallel, int ranks_per_node,
                                  int rank) {
  TrafficBytes t;
  const int T = s.tensor_parallel, D = data_parallel;
  if (T < 2) return t;
  ZERO_CHECK(
      D >= 1 && rank >= 0 && ranks_per_node >= 1,
      fmt::format("tensor_group_traffic: rank {} of {} data-parallel ranks with {} per node", rank, D, ranks_per_node));
  const Ring tensor = ring_of(rank, T, ranks_per_node);
  // The grid's order (tensor fastest, then data): the rank's place in its data-parallel group,
  // and with MiCS in its partition group (data rank mod N).
  const int N = s.shard_ranks(D), d = rank / T % D;
  const OptimizerExchange x = optimizer_exchange(s.optimizer, layout, {N, d % N, s.stage, T});
  for (const std::int64_t doubles : x.tensor_doubles) tensor.all_gather(t, 2 * doubles, 4);
  for (const std::int64_t parts : x.tensor_matrix_floats) {
    tensor.all_gather(t, parts, 4);
    tensor.all_reduce(t, parts * T, 4);
  }
  return t;
}

TrafficBytes step_traffic(const Layout& layout, const Settings& s, int world, int ranks_per_node, int rank) {
  ZERO_CHECK(world >= 1 && rank >= 0 && rank < world && ranks_per_node >= 1,
             fmt::format("step_traffic: rank {} of {} ranks with {} per node is not a rank of the job", rank, world,
                         ranks_per_node));
  ZERO_CHECK(s.tensor_parallel == 1 && s.pipeline_parallel == 1,
             "step_traffic: models data parallelism only; tensor and pipeline parallel traffic is not modelled");
  const int units = layout.num_units();
  ZERO_CHECK(units >= 3, "step_traffic: the GPT trainer's layout has embeddings, at least one block and ln_f");
  ZERO_CHECK(
      s.hpz_partition_size >= 1 && world % s.hpz_partition_size == 0,
      fmt::format("step_traffic: zero_hpz_partition_size {} does not divide {} ranks", s.hpz_partition_size, world));
  check_groups(s, world);
  TrafficBytes t;
  if (world == 1) return t;
  const Ring all = ring_of(rank, world, ranks_per_node);
  // MiCS: the engine's collectives run over the rank's group of N consecutive ranks (`all` is
  // then the agreement checks' and the trainer's world), and the gradient slices are summed over
  // the ranks N apart (the replica ring: rank r sends to r + N).
  const int N = s.shard_ranks(world);
  const Ring part = ring_of(rank, N, ranks_per_node);
  const Ring replica{world / N, (rank + N) % world / ranks_per_node != rank / ranks_per_node};
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(s.dtype));
  const std::int64_t gesize = static_cast<std::int64_t>(dtype_size(s.grad_dtype()));
  const std::int64_t cesize = static_cast<std::int64_t>(dtype_size(s.comm_dtype()));  // stages 0/1's reduction
  const std::vector<UnitShape> shapes = unit_shapes(layout, s, world);
  auto shape = [&](int u) -> const UnitShape& { return unit_at(shapes, u); };
  // qgZ (engine/quantized_reduce_scatter.hpp): M nodes of L ranks; to each of the L-1 node peers
  // the M slices it serves as int8 blocks, then to each of the M-1 other nodes one slice as int4.
  const int L = std::min(world, ranks_per_node), M = world / L;
  ZERO_CHECK(!s.quantized_gradients || world % L == 0,
             fmt::format("step_traffic: qgZ needs the same ranks on every node; {} ranks by {} per node", world, L));
  auto qgz = [&](TrafficBytes& to, std::int64_t sl) {
    to += QuantizedReduceScatter::bytes_per_reduction_for(static_cast<std::size_t>(L), static_cast<std::size_t>(M),
                                                          static_cast<std::size_t>(sl),
                                                          static_cast<std::size_t>(s.quantized_weights_block_size));
  };

  // Gradients: stages 0 and 1 reduce the accumulated gradient at the boundary, stages 2 and 3
  // each micro-step's gradient in the compute dtype.
  if (s.powersgd()) {  // one agreement scalar on finiteness, the plain rest, then P, then Q
    const PowerSgdElements e = powersgd_elements(layout, s.compression);
    const auto fsize = static_cast<std::int64_t>(dtype_size(s.compression.factor_dtype));
    part.scalar(t);
    if (e.plain > 0) part.all_reduce(t, e.plain, gesize);
    if (e.p > 0) part.all_reduce(t, e.p, fsize);
    if (e.q > 0) part.all_reduce(t, e.q, fsize);
  }
  // OneBitAdam and OneBitLamb after their warm-up (the steady state a plan is for): per unit, each rank's sign bits
  // and scale to every slice's owner (an all-to-all: each block straight to its rank), then the
  // owners' bits and scales all-gathered, in place of the gradient reduction.
  const bool onebit = compressed_momentum(s.optimizer.type);
  auto all_to_all = [&](std::int64_t bytes_per_peer) {
    for (int j = 0; j < world; ++j)
      if (j != rank) (j / ranks_per_node == rank / ranks_per_node ? t.intra_node : t.inter_node) += bytes_per_peer;
  };
  for (int u = 0; u < units && onebit; ++u) {
    const std::int64_t sl = shape(u).slice;
    all_to_all(sl / 8);
    all_to_all(4);
    part.all_gather(t, sl / 32, 4);
    part.all_gather(t, 1, 4);
  }
  for (int u = 0; u < units && !s.powersgd() && !onebit; ++u) {
    const std::int64_t sl = shape(u).slice, pd = shape(u).padded;
    if (s.stage == 0 || (s.stage == 1 && !s.reduce_scatter))
      part.all_reduce(t, pd, cesize);
    else if (s.stage == 1)
      part.reduce_scatter(t, sl, cesize);
    else
      for (int m = 0; m < s.grad_accum; ++m) {
        if (s.quantized_gradients)
          qgz(t, sl);
        else if (s.reduce_scatter)
          part.reduce_scatter(t, sl, esize);
        else
          part.all_reduce(t, pd, esize);
      }
  }
  // MiCS: each rank's accumulated slice, once per step, over the replicas.
  if (N < world)
    for (int u = 0; u < units; ++u) replica.all_reduce(t, shape(u).slice, gesize);
  // The global norm's sum (stage 0 holds the whole gradient; MiCS's replicas then agree on the
  // maximum), the two scalars that check the ranks agree on the step's decisions, and the
  // trainer's mean loss over the ranks (on the same world communicator, so the engine's
  // counters include it).
  if (s.stage > 0) part.scalar(t);
  if (N < world) replica.scalar(t);
  for (int k = 0; k < 3; ++k) all.scalar(t);
  // The optimizer's statistics between its passes (SliceStats::combine: an all-gather, or the
  // ordered reduce's all-to-all and all-gather of a chunk of the doubles; doubles travel as fp32
  // pairs), and Muon's momentum updates to the matrices' owners and the results back.
  if (s.stage > 0) {
    const OptimizerExchange x = optimizer_exchange(s.optimizer, layout);
    for (std::int64_t doubles : x.stat_doubles) {
      if (!SliceStats::ordered_reduce(doubles, N)) {
        part.all_gather(t, 2 * doubles, 4);
        continue;
      }
      const std::int64_t chunk = SliceStats::chunk_doubles(doubles, N);
      group_all_to_all(t, rank, N, ranks_per_node, 2 * chunk, 4);
      part.all_gather(t, 2 * chunk, 4);
    }
    for (int u : x.matrix_units) {
      part.all_gather(t, shape(u).slice, 4);
      part.reduce_scatter(t, shape(u).slice, 4);
    }
  }
  // After the update every rank all-gathers the slices it did not write (sharded units stay
  // sharded: the next gathers rebuild them).
  if (s.stage > 0)
    for (int u = 0; u < units; ++u)
      if (!shape(u).sharded_params) part.all_gather(t, shape(u).slice, esize);
  if (s.stage != 3) return t;

  // Stage 3: the trainer's gather order, and when each lease ends (the position of the next
  // gather then): blocks and ln_f right after their use, the embeddings at the micro-step's end.
  const int emb = 0, lnf = units - 1, layers = units - 2;
  std::vector<int> order{emb};
  for (int l = 0; l < layers; ++l) order.push_back(1 + l);
  order.push_back(lnf);
  order.push_back(lnf);
  for (int l = layers - 1; l >= 0; --l) order.push_back(1 + l);
  const std::size_t n = order.size();
  const Ring hpz = ring_of(rank, s.hpz_partition_size, ranks_per_node);
  std::vector<bool> gathered(shapes.size(), false), secondary(shapes.size(), false);
  auto release = [&](int u, std::size_t pos) {  // the gatherer's keep rule
    std::int64_t distance = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const int next = order[(pos + j) % n];
      if (next == u) {
        if (distance > s.max_reuse_distance) gathered[static_cast<std::size_t>(u)] = false;
        return;
      }
      distance += shape(next).padded;
    }
  };
  for (int m = 0; m < s.grad_accum; ++m)
    for (std::size_t k = 0; k < n; ++k) {
      const int u = order[k];
      const auto ui = static_cast<std::size_t>(u);
      if (!shape(u).sharded_params) continue;
      if (!gathered[ui]) {
        if (s.hpz_partition_size > 1 && secondary[ui]) {
          hpz.all_gather(t, shape(u).padded / s.hpz_partition_size, esize);
        } else if (s.quantized_weights) {
          const auto packed = static_cast<std::int64_t>(quant::packed_bytes(
              static_cast<std::size_t>(shape(u).slice), static_cast<std::size_t>(s.quantized_weights_block_size)));
          part.all_gather(t, packed / 4, 4);
        } else {
          part.all_gather(t, shape(u).slice, esize);
        }
        gathered[ui] = true;
        secondary[ui] = s.hpz_partition_size > 1;
      }
      release(u, u == emb ? n : k + 1);
    }
  return t;
}

}  // namespace zero::plan
