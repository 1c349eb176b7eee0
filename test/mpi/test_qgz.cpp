// ZeRO++ qgZ (zero_quantized_gradients): the hierarchical quantized reduce-scatter against a
// double-precision reference computed by every rank from every rank's inputs: each rank gets its
// own slice of the sum, each value within the stated bound (int8 inside the node: max|x| / 254 of
// each block sent; int4 across nodes: max|x| / 14), for slice sizes that fit no block; error
// feedback makes the sum of many reductions of a constant gradient converge to the exact sum;
// the counters see exactly the bytes sent, and polling a reduction issues none of them.
// Training is deterministic and stays within 2% of plain
// stage 3 (weights and a held-out loss); across two simulated nodes (ctest entries *_nodes2)
// far fewer bytes cross the node boundary; bad combinations are clear errors. The gradient
// reducer issues qgZ's all-to-alls outside its bucket groups (an NCCL group would hold them back),
// and rank 0's start-up report allocates no buffers of its own. BufferPool (its scratch) counts
// what it holds, freed buffers kept for reuse included.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "engine/engine_impl.hpp"
#include "engine/quantized_reduce_scatter.hpp"
#include "engine/reduce.hpp"
#include "engine/unit_shape.hpp"
#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using namespace zero::test;

namespace {

MpiCommunicator& world_comm() {
  auto* m = dynamic_cast<MpiCommunicator*>(&Context::current()->comm());
  REQUIRE(m != nullptr);
  return *m;
}

// The nodes as the test sees them: owner[n][l], the rank of local rank l on node n.
struct Nodes {
  std::vector<std::vector<int>> owner;
  int n = 0, l = 0;  // this rank's
};
Nodes nodes_of(const MpiCommunicator& c) {
  Nodes t;
  const auto& node = c.nodes();
  t.owner.resize(static_cast<std::size_t>(*std::max_element(node.begin(), node.end()) + 1));
  for (int r = 0; r < c.size(); ++r) {
    auto& members = t.owner[static_cast<std::size_t>(node[static_cast<std::size_t>(r)])];
    if (r == c.rank()) t.n = node[static_cast<std::size_t>(r)], t.l = static_cast<int>(members.size());
    members.push_back(r);
  }
  return t;
}

// Rank r's gradient element j: magnitudes from 1e-3 to 10 changing every 5 elements.
float grad_value(int r, std::size_t j) {
  return hash_unit(static_cast<std::uint64_t>(r) + 17, j) *
         static_cast<float>(std::pow(10.0, static_cast<double>((j / 5) % 5) - 3.0));
}

std::size_t packed(std::size_t n, std::size_t block, int bits) {
  const std::size_t values = bits == 8 ? n : (n + 1) / 2;
  return ((n + block - 1) / block * 4 + values + 3) / 4 * 4;
}

// The exact sum of this rank's slice, and the bound on each value's error, from every rank's
// gradient (g[r], as rounded to the dtype sent).
struct Reference {
  std::vector<double> exact, bound;
};
Reference reference(const std::vector<std::vector<double>>& g, const Nodes& t, int me, std::size_t S,
                    std::size_t block) {
  const std::size_t M = t.owner.size(), L = t.owner[0].size();
  Reference ref;
  ref.exact.assign(S, 0.0);
  ref.bound.assign(S, 0.0);
  double mag = 0.0;
  for (const auto& gr : g)
    for (std::size_t i = 0; i < S; ++i) {
      ref.exact[i] += gr[static_cast<std::size_t>(me) * S + i];
      mag += std::abs(gr[static_cast<std::size_t>(me) * S + i]);
    }
  // Phase 1 on node n2: the sender of local rank l2 != l quantizes, in blocks, the chunk of the
  // slices of ranks R(*, l): position n * S + i of that chunk is element i of this rank's slice.
  std::vector<std::vector<double>> err1(M, std::vector<double>(S, 0.0)), partial(M, std::vector<double>(S, 0.0));
  for (std::size_t n2 = 0; n2 < M; ++n2)
    for (std::size_t l2 = 0; l2 < L; ++l2) {
      const auto& gs = g[static_cast<std::size_t>(t.owner[n2][l2])];
      for (std::size_t i = 0; i < S; ++i) partial[n2][i] += gs[static_cast<std::size_t>(me) * S + i];
      if (static_cast<int>(l2) == t.l) continue;
      auto chunk_value = [&](std::size_t pos) {
        return gs[static_cast<std::size_t>(t.owner[pos / S][static_cast<std::size_t>(t.l)]) * S + pos % S];
      };
      for (std::size_t i = 0; i < S; ++i) {
        const std::size_t pos = static_cast<std::size_t>(t.n) * S + i, first = pos / block * block;
        double amax = 0.0;
        for (std::size_t p = first; p < std::min(first + block, M * S); ++p)
          amax = std::max(amax, std::abs(chunk_value(p)));
        err1[n2][i] += amax / 254.0;
      }
    }
  // Phase 2: the rank R(n2, l) on every other node sends its partial sum of this slice as int4.
  for (std::size_t n2 = 0; n2 < M; ++n2)
    for (std::size_t i = 0; i < S; ++i) {
      ref.bound[i] += err1[n2][i];
      if (static_cast<int>(n2) == t.n) continue;
      const std::size_t first = i / block * block;
      double amax = 0.0;
      for (std::size_t p = first; p < std::min(first + block, S); ++p)
        amax = std::max(amax, std::abs(partial[n2][p]) + err1[n2][p]);
      ref.bound[i] += amax / 14.0;
    }
  for (auto& b : ref.bound) b += 1e-6 * mag;  // fp32 sums
  return ref;
}

std::vector<std::vector<double>> gradients(int world, std::size_t S, DType t) {
  std::vector<std::vector<double>> g(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    for (std::size_t j = 0; j < S * static_cast<std::size_t>(world); ++j) {
      float v[1] = {0};
      std::uint16_t h[1] = {0};
      if (t == DType::f32)
        v[0] = grad_value(r, j);
      else {  // what the bf16 gradient holds
        store_from_f32(h, 0, t, grad_value(r, j));
        v[0] = load_as_f32(h, 0, t);
      }
      g[static_cast<std::size_t>(r)].push_back(v[0]);
    }
  return g;
}

std::vector<char> local_gradient(int rank, std::size_t n, DType t) {
  std::vector<char> out(n * dtype_size(t));
  for (std::size_t j = 0; j < n; ++j) store_from_f32(out.data(), j, t, grad_value(rank, j));
  return out;
}

}  // namespace

TEST_CASE("qgZ: each rank gets its slice of the sum, every value within the stated bound, bytes counted as sent") {
  MpiCommunicator& comm = world_comm();
  const int world = comm.size(), me = comm.rank();
  const Nodes t = nodes_of(comm);
  const std::size_t M = t.owner.size(), L = t.owner[0].size();
  for (std::size_t block : {7u, 16u})
    for (DType dt : {DType::f32, DType::bf16}) {
      QuantizedReduceScatter q(comm, block);
      REQUIRE(q.nodes() == static_cast<int>(M));
      REQUIRE(q.ranks_per_node() == static_cast<int>(L));
      for (std::size_t S : {1u, 5u, 37u, 300u}) {
        INFO(world << " ranks (" << M << " nodes x " << L << "), " << dtype_name(dt) << ", block " << block
                   << ", slice " << S);
        const auto g = gradients(world, S, dt);
        const Reference ref = reference(g, t, me, S, block);
        const std::vector<char> mine = local_gradient(me, S * static_cast<std::size_t>(world), dt);
        auto fb = q.make_feedback(S);
        REQUIRE(fb.intra_n == (L - 1) * M * S);
        REQUIRE(fb.inter_n == (M - 1) * S);
        std::vector<float> out(S, -1.0f);
        const TrafficBytes before = q.traffic();
        q.start(mine.data(), dt, S, fb, out.data()).wait();
        const TrafficBytes sent = q.traffic() - before;
        bool quantized = false;
        for (std::size_t i = 0; i < S; ++i) {
          INFO("element " << i << ": got " << out[i] << ", exact " << ref.exact[i] << ", bound " << ref.bound[i]);
          REQUIRE(std::abs(out[i] - ref.exact[i]) <= ref.bound[i]);
          quantized = quantized || std::abs(out[i] - ref.exact[i]) > 1e-5 * std::abs(ref.exact[i]);
        }
        if (world > 1 && S > 1) REQUIRE(quantized);  // it did not send full precision
        // int8 chunks of M slices to each of L-1 node peers, int4 slices to M-1 other nodes.
        REQUIRE(sent.intra_node == static_cast<std::int64_t>((L - 1) * packed(M * S, block, 8)));
        REQUIRE(sent.inter_node == static_cast<std::int64_t>((M - 1) * packed(S, block, 4)));
        const TrafficBytes model = q.bytes_per_reduction(S);
        REQUIRE((model.intra_node == sent.intra_node && model.inter_node == sent.inter_node));
        // Deterministic: the same inputs and feedback give the same bits.
        auto fb2 = q.make_feedback(S);
        std::vector<float> again(S);
        q.start(mine.data(), dt, S, fb2, again.data()).wait();
        REQUIRE(again == out);
      }
    }
}

TEST_CASE("qgZ error feedback: summed over many reductions of a constant gradient, the error does not accumulate") {
  MpiCommunicator& comm = world_comm();
  const int world = comm.size(), me = comm.rank();
  const Nodes t = nodes_of(comm);
  const std::size_t S = 37, block = 16;
  const int K = 100;
  QuantizedReduceScatter q(comm, block);
  const auto g = gradients(world, S, DType::f32);
  const Reference ref = reference(g, t, me, S, block);
  const std::vector<char> mine = local_gradient(me, S * static_cast<std::size_t>(world), DType::f32);
  auto fb = q.make_feedback(S);
  std::vector<double> total(S, 0.0);
  std::vector<float> out(S), first;
  // Several reductions in flight at once, completed in order (as the engine's buckets do).
  for (int k = 0; k < K; k += 4) {
    std::vector<std::vector<float>> outs(4, std::vector<float>(S));
    std::vector<Work> works;
    for (int j = 0; j < 4; ++j)
      works.push_back(q.start(mine.data(), DType::f32, S, fb, outs[static_cast<std::size_t>(j)].data()));
    // Polled in between (done() only reports; the test below checks that it starts nothing),
    // then waited for.
    for (int poll = 0; poll < 3; ++poll)
      for (auto it = works.rbegin(); it != works.rend(); ++it) (void)it->done();
    for (auto& w : works) w.wait();
    for (const auto& o : outs) {
      if (first.empty()) first = o;
      for (std::size_t i = 0; i < S; ++i) total[i] += o[i];
    }
  }
  double worst_single = 0.0, worst_mean = 0.0;
  for (std::size_t i = 0; i < S; ++i) {
    worst_single = std::max(worst_single, std::abs(first[i] - ref.exact[i]));
    const double drift = std::abs(total[i] - K * ref.exact[i]);
    INFO("element " << i << ": " << K << " reductions sum to " << total[i] << ", exact " << K * ref.exact[i]);
    // What is still held back: at most one reduction's error (with the kept error in the
    // blocks' maxima), plus fp32 rounding of each of the K sums.
    REQUIRE(drift <= 1.2 * ref.bound[i] + K * 1e-6 * std::abs(ref.exact[i]) + 1e-6);
    worst_mean = std::max(worst_mean, drift / K);
  }
  INFO("worst error of one reduction " << worst_single << ", of the mean of " << K << ": " << worst_mean);
  if (world > 1) REQUIRE(worst_mean < worst_single / 10);  // the error shrinks as 1/K instead of staying
}

TEST_CASE("qgZ's done() only reports: polling issues no collective, wait() starts phase 2") {
  // A poll that started phase 2 would issue the cross-node all-to-all whenever a rank happened
  // to poll, in a different order on each rank against its other collectives (a hang on NCCL).
  // Here every rank's phase 1 is posted (the barrier) and then polled long enough to complete:
  // the counters, which count a collective when it is issued, must not move until wait().
  MpiCommunicator& comm = world_comm();
  const int world = comm.size(), me = comm.rank();
  const std::size_t S = 37, block = 16;
  QuantizedReduceScatter q(comm, block);
  const std::vector<char> mine = local_gradient(me, S * static_cast<std::size_t>(world), DType::f32);
  auto fb = q.make_feedback(S);
  std::vector<float> out(S);
  const TrafficBytes before = q.traffic();
  Work w = q.start(mine.data(), DType::f32, S, fb, out.data());
  const TrafficBytes started = q.traffic() - before;
  comm.barrier_async().wait();
  TrafficBytes polled;
  for (int poll = 0; poll < 200 && polled.intra_node == 0 && polled.inter_node == 0; ++poll) {
    (void)w.done();
    polled = q.traffic() - before - started;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  INFO(q.nodes() << " nodes x " << q.ranks_per_node() << ": polling issued " << polled.intra_node
                 << " bytes inside the node, " << polled.inter_node << " across");
  CHECK((polled.intra_node == 0 && polled.inter_node == 0));
  // Phase 2 is issued at start() only where there is no phase 1 (one rank per node).
  if (q.ranks_per_node() > 1) CHECK(started.inter_node == 0);
  w.wait();
  const TrafficBytes sent = q.traffic() - before, model = q.bytes_per_reduction(S);
  CHECK((sent.intra_node == model.intra_node && sent.inter_node == model.inter_node));
}

namespace {

// Forwards every call to `inner`, and counts the groups (group_begin .. group_end) during which
// qgZ's communicators sent anything. On NCCL a group is open for the whole calling thread, not
// for one communicator: an all-to-all of qgZ's issued inside the partition communicator's group
// is enqueued only at that group's end, after its own completion event was recorded.
class GroupWatch final : public Communicator {
 public:
  GroupWatch(Communicator& inner, const QuantizedReduceScatter& q) : inner_(inner), q_(q) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Work all_reduce_async(void* b, std::size_t n, DType t, ReduceOp op) override {
    return inner_.all_reduce_async(b, n, t, op);
  }
  Work reduce_scatter_async(const void* s, void* r, std::size_t n, DType t, ReduceOp op) override {
    return inner_.reduce_scatter_async(s, r, n, t, op);
  }
  Work all_gather_async(const void* s, void* r, std::size_t n, DType t) override {
    return inner_.all_gather_async(s, r, n, t);
  }
  Work all_to_all_async(const void* s, void* r, std::size_t n, DType t) override {
    return inner_.all_to_all_async(s, r, n, t);
  }
  Work broadcast_async(void* b, std::size_t bytes, int root) override { return inner_.broadcast_async(b, bytes, root); }
  Work barrier_async() override { return inner_.barrier_async(); }
  Work send_async(const void* b, std::size_t n, DType t, int peer) override { return inner_.send_async(b, n, t, peer); }
  Work recv_async(void* b, std::size_t n, DType t, int peer) override { return inner_.recv_async(b, n, t, peer); }
  double all_reduce_scalar(double v, ReduceOp op) override { return inner_.all_reduce_scalar(v, op); }
  void group_begin() override {
    if (depth_++ == 0) before_ = q_.traffic();
    inner_.group_begin();
  }
  void group_end() override {
    inner_.group_end();
    if (--depth_ > 0) return;
    const TrafficBytes d = q_.traffic() - before_;
    if (d.intra_node != 0 || d.inter_node != 0) ++holding_qgz_;
  }
  int groups_holding_qgz() const { return holding_qgz_; }

 private:
  Communicator& inner_;
  const QuantizedReduceScatter& q_;
  int depth_ = 0, holding_qgz_ = 0;
  TrafficBytes before_;
};

}  // namespace

TEST_CASE("the gradient reducer issues qgZ's all-to-alls outside any group of the partition communicator") {
  MpiCommunicator& comm = world_comm();
  const int world = comm.size(), me = comm.rank();
  QuantizedReduceScatter q(comm, 16);
  GroupWatch watch(comm, q);
  auto host = make_host_backend(comm);
  const Layout layout = make_layout();
  const std::vector<UnitShape> shapes = make_unit_shapes(layout, me, world, 2, 0);
  ZeroOptimizationConfig z;
  z.stage = 2;
  z.overlap_comm = true;
  z.reduce_bucket_size = 64;  // several buckets, two in flight
  GradReducer reducer(*host, watch, layout, shapes, {.zero = z, .stage = 2, .qgz = &q});
  const TrafficBytes before = q.traffic();
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    auto* g = static_cast<float*>(reducer.grads(u));
    for (std::int64_t j = 0; j < shapes[static_cast<std::size_t>(u)].padded; ++j)
      g[j] = grad_value(me + u, static_cast<std::size_t>(j));
    reducer.ready(u, true);
  }
  reducer.wait_all();
  const TrafficBytes sent = q.traffic() - before;
  if (world > 1) REQUIRE(sent.intra_node + sent.inter_node > 0);  // qgZ had something to send
  CHECK(watch.groups_holding_qgz() == 0);
  // Each owned slice is qgZ's sum of the unit, as one reduction of it with fresh error feedback gives.
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::size_t S = static_cast<std::size_t>(shapes[static_cast<std::size_t>(u)].slice);
    std::vector<float> g(S * static_cast<std::size_t>(world)), want(S);
    for (std::size_t j = 0; j < g.size(); ++j) g[j] = grad_value(me + u, j);
    auto fb = q.make_feedback(S);
    q.start(g.data(), DType::f32, S, fb, want.data()).wait();
    const auto* got = static_cast<const float*>(reducer.owned(u));
    INFO("unit " << u);
    REQUIRE(std::vector<float>(got, got + S) == want);
  }
}

namespace {

Config config(int stage, const std::string& dtype, bool qgz, const std::string& extra = "") {
  std::string y =
      "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\ngradient_clipping: 1.0\n"
      "zero_optimization:\n  stage: " +
      std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n  zero_quantized_weights_block_size: 16\n" +
      (qgz ? "  zero_quantized_gradients: true\n" : "") + extra;
  if (dtype == "bf16") y += "bf16:\n  enabled: true\n";
  Config c = parse_config(y, "test_qgz");
  c.resolve(Context::current()->world_size());
  return c;
}

struct Run {
  std::vector<std::vector<float>> master;
  TrafficBytes traffic;
  MemoryReport memory;
};

Run train_run(int stage, const std::string& dtype, bool qgz, int steps, const std::string& extra = "") {
  Context& ctx = *Context::current();
  Engine e(ctx, config(stage, dtype, qgz, extra), make_layout());
  e.init_params(init_value);
  Run r;
  const TrafficBytes before = e.traffic();
  train(e, ctx.rank(), ctx.world_size(), 0, steps);
  r.traffic = e.traffic() - before;
  for (int u = 0; u < e.layout().num_units(); ++u) r.master.push_back(e.full_master(u));
  r.memory = e.memory();
  return r;
}

// The loss whose per-sample gradient engine_model.hpp's sample_grad is, over held-out samples:
// sum over elements of c (w - x)^2 / 2 + w^4 / 40, c = 1 + unit / 4.
double held_out_loss(const std::vector<std::vector<float>>& w) {
  double loss = 0.0;
  for (std::int64_t s = 1000000; s < 1000016; ++s)
    for (std::size_t u = 0; u < w.size(); ++u)
      for (std::size_t i = 0; i < w[u].size(); ++i) {
        const double x = hash_unit(static_cast<std::uint64_t>(s) * 1000 + u, i), wi = w[u][i];
        const double c = 1.0 + 0.25 * static_cast<double>(u);
        loss += 0.5 * c * (wi - x) * (wi - x) + 0.025 * wi * wi * wi * wi;
      }
  return loss / 16.0;
}

}  // namespace

// Rank 0's start-up line reports the error-feedback buffers; measuring them must not make more
// of them (backend memory, device memory on CUDA, kept in the allocator's cache there): every
// rank's allocation peak after construction is the same.
TEST_CASE("qgZ's start-up report allocates nothing: every rank's backend peak is the same") {
  Context& ctx = *Context::current();
  for (int stage : {2, 3}) {
    Engine e(ctx, config(stage, "fp32", true), make_layout());
    const double peak = static_cast<double>(engine_backend(e).max_bytes_allocated());
    const double hi = ctx.comm().all_reduce_scalar(peak, ReduceOp::max);
    const double lo = -ctx.comm().all_reduce_scalar(-peak, ReduceOp::max);
    INFO("stage " << stage << ": this rank's peak " << peak << " bytes, the ranks' range " << lo << " to " << hi);
    CHECK(lo == hi);
  }
}

TEST_CASE("qgZ trains within 2% of plain, deterministically, sending fewer bytes across nodes") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  MpiCommunicator& comm = world_comm();
  const Nodes t = nodes_of(comm);
  const int M = static_cast<int>(t.owner.size());
  for (int stage : {2, 3})
    for (const std::string dtype : {"fp32", "bf16"}) {
      INFO("stage " << stage << ", " << dtype << ", " << world << " ranks on " << M << " nodes");
      const int steps = 20;
      const Run plain = train_run(stage, dtype, false, steps);
      const Run q = train_run(stage, dtype, true, steps), again = train_run(stage, dtype, true, steps);
      REQUIRE(q.master == again.master);  // deterministic
      const auto [worst, largest] = weight_difference(plain.master, q.master);
      const double lp = held_out_loss(plain.master), lq = held_out_loss(q.master);
      INFO("largest weight difference " << worst << " of " << largest << "; held-out loss plain " << lp << ", qgZ "
                                        << lq);
      REQUIRE(worst <= 0.02f * largest);
      REQUIRE(std::abs(lq - lp) <= 0.02 * lp);
      if (world > 1) REQUIRE(worst > 0.0f);  // the gradients did go through int8/int4
      // Error feedback: fp32, what each rank sends per unit.
      std::int64_t fb = 0;
      const Layout l = make_layout();
      const std::int64_t L = static_cast<std::int64_t>(t.owner[0].size());
      for (int u = 0; u < l.num_units(); ++u) {
        const std::int64_t S = l.slice_numel(u, world);
        fb += ((L - 1) * M * S + (M - 1) * S) * 4;
      }
      REQUIRE(q.memory.error_feedback == fb);
      REQUIRE(plain.memory.error_feedback == 0);
      if (M > 1) {
        // Job-wide inter-node bytes: the plain reduce-scatters' (a ring: the ranks whose next
        // rank is on another node send (world-1) slices of the compute dtype) are replaced by
        // qgZ's int4 slices, one to each other node from every rank; all else is the same.
        const std::int64_t esize = dtype == "fp32" ? 4 : 2;
        const std::int64_t micro_steps = steps * 2;
        std::int64_t plain_rs = 0, qgz_rs = 0;
        const auto& node = comm.nodes();
        for (int r = 0; r < world; ++r)
          for (int u = 0; u < l.num_units(); ++u) {
            const std::int64_t S = l.slice_numel(u, world);
            if (node[static_cast<std::size_t>(r)] != node[static_cast<std::size_t>((r + 1) % world)])
              plain_rs += (world - 1) * S * esize * micro_steps;
            qgz_rs += (M - 1) * static_cast<std::int64_t>(packed(static_cast<std::size_t>(S), 16, 4)) * micro_steps;
          }
        const double plain_inter = comm.all_reduce_scalar(static_cast<double>(plain.traffic.inter_node), ReduceOp::sum);
        const double q_inter = comm.all_reduce_scalar(static_cast<double>(q.traffic.inter_node), ReduceOp::sum);
        INFO("job-wide inter-node bytes: plain " << plain_inter << " (reduce-scatters " << plain_rs << "), qgZ "
                                                 << q_inter << " (reduce-scatters " << qgz_rs << ")");
        REQUIRE(q_inter == static_cast<double>(static_cast<std::int64_t>(plain_inter) - plain_rs + qgz_rs));
        REQUIRE(qgz_rs * (dtype == "fp32" ? 4 : 2) <= plain_rs);
      }
    }
}

TEST_CASE("qgZ with fp16 loss scaling: overflowed steps are skipped, their error dropped, and training goes on") {
  Context& ctx = *Context::current();
  // Start at 2^24: the first steps overflow fp16 and halve the scale until it fits.
  auto fp16 = [&](bool qgz) {
    std::string y =
        "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\n"
        "zero_optimization:\n  stage: 3\n  stage3_param_persistence_threshold: 0\n"
        "  zero_quantized_weights_block_size: 16\n" +
        std::string(qgz ? "  zero_quantized_gradients: true\n" : "") +
        "fp16:\n  enabled: true\n  initial_scale_power: 24\n  hysteresis: 1\n  loss_scale_window: 1000\n";
    Config c = parse_config(y, "test_qgz");
    c.resolve(ctx.world_size());
    Engine e(ctx, c, make_layout());
    e.init_params(init_value);
    std::vector<StepResult> steps;
    train(e, ctx.rank(), ctx.world_size(), 0, 24, &steps);
    std::vector<std::vector<float>> master;
    for (int u = 0; u < e.layout().num_units(); ++u) master.push_back(e.full_master(u));
    return std::make_pair(steps, master);
  };
  const auto [plain_steps, plain_master] = fp16(false);
  const auto [q_steps, q_master] = fp16(true);
  int skipped = 0, plain_skipped = 0;
  for (std::size_t s = 0; s < q_steps.size(); ++s) {
    INFO("step " << s << ": scale " << q_steps[s].loss_scale << (q_steps[s].skipped ? " skipped" : ""));
    skipped += q_steps[s].skipped ? 1 : 0;
    plain_skipped += plain_steps[s].skipped ? 1 : 0;
    // While the scale comes down from 2^24 every step overflows, as in plain: an inf reaches
    // the sum as NaN, never as a finite value.
    if (plain_steps[s].loss_scale >= 65536.0) REQUIRE(q_steps[s].skipped);
  }
  INFO(skipped << " steps skipped, plain " << plain_skipped);
  REQUIRE(skipped > 0);
  // A NaN left in the error feedback would skip every later step. (A sum at fp16's edge may
  // overflow in one run and not the other: the counts may differ by a step or two.)
  REQUIRE_FALSE(q_steps.back().skipped);
  REQUIRE(std::abs(skipped - plain_skipped) <= 2);
  const auto [worst, largest] = weight_difference(plain_master, q_master);
  INFO("largest weight difference " << worst << " of " << largest);
  REQUIRE(worst <= 0.02f * largest);
}

TEST_CASE("qgZ with the optimizer offloaded to the host gives the same bits as without") {
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    const Run on_device = train_run(stage, "bf16", true, 6);
    const Run offloaded = train_run(stage, "bf16", true, 6, "  offload_optimizer:\n    device: cpu\n");
    REQUIRE(offloaded.master == on_device.master);
  }
}

TEST_CASE("qgZ's bad combinations are clear errors") {
  Context& ctx = *Context::current();
  for (int stage : {0, 1})
    REQUIRE_THROWS_WITH(Engine(ctx, config(stage, "fp32", true), make_layout()),
                        Catch::Contains("zero_quantized_gradients applies to stages 2 and 3") &&
                            Catch::Contains("stage " + std::to_string(stage)));
  REQUIRE_THROWS_WITH(Engine(ctx, config(3, "fp32", true, "  reduce_scatter: false\n"), make_layout()),
                      Catch::Contains("set reduce_scatter to true"));
  REQUIRE_THROWS_WITH(parse_config("zero_optimization:\n  zero_quantized_gradients: 3\n", "t"),
                      Catch::Contains("zero_quantized_gradients"));
  // With MiCS: refused, whatever the group size.
  REQUIRE_THROWS_WITH(Engine(ctx, config(3, "fp32", true, "  mics_shard_size: 1\n"), make_layout()),
                      Catch::Contains("zero_quantized_gradients with zero_optimization.mics_shard_size = 1 is not "
                                      "supported"));
  // With PowerSGD: they never meet (PowerSGD is stages 0-1, qgZ 2-3); either stage is a clear error.
  const std::string powersgd = "gradient_compression:\n  type: powersgd\n  rank: 2\n";
  REQUIRE_THROWS_WITH(Engine(ctx, config(1, "fp32", true, powersgd), make_layout()),
                      Catch::Contains("zero_quantized_gradients applies to stages 2 and 3"));
  REQUIRE_THROWS_WITH(config(2, "fp32", true, powersgd),
                      Catch::Contains("powersgd applies to zero_optimization.stage 0 and 1"));
  // On backend: cuda the reduce-scatter runs on the backend's memory, kernels and device
  // communicators: here (no device, or a build without CUDA) the only error left is the
  // backend's own, never a refusal of qgZ.
  Config cuda = config(3, "fp32", true);
  cuda.backend = BackendKind::cuda;
  try {
    Engine e(ctx, cuda, make_layout());
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("backend: cuda") && !Catch::Contains("zero_quantized_gradients"));
  }
  // Under tensor parallelism (its per-rank checkpoint files are named by data-parallel rank).
  if (ctx.world_size() % 2 == 0) {
    ProcessGroups g(ctx, {.tensor = 2, .pipeline = 1});
    REQUIRE_THROWS_WITH(Engine(ctx, config(3, "fp32", true), make_layout(), g),
                        Catch::Contains("zero_quantized_gradients runs without tensor or pipeline parallelism"));
  }
  if (ctx.world_size() == 4) {
    // Nodes of 3 and 1 ranks: no hierarchy that gives every rank its slice evenly.
    const char* saved = std::getenv("ZERO_RANKS_PER_NODE");
    const std::string keep = saved ? saved : "";
    ::setenv("ZERO_RANKS_PER_NODE", "3", 1);
    MpiCommunicator uneven(MPI_COMM_WORLD);
    if (saved)
      ::setenv("ZERO_RANKS_PER_NODE", keep.c_str(), 1);
    else
      ::unsetenv("ZERO_RANKS_PER_NODE");
    REQUIRE_THROWS_WITH(QuantizedReduceScatter(uneven, 16), Catch::Contains("different numbers of them (3, 1)"));
  }
}

// qgZ's figure in MemoryReport::qgz_buffers is its pool's held_peak: a freed buffer serves only a
// request of its own size, so buffers of other sizes stay held beside those in use.
TEST_CASE("BufferPool counts the bytes it holds, freed buffers kept for reuse included") {
  auto host = make_host_backend(world_comm());
  BufferPool pool(*host);
  Buffer a = pool.acquire(100, false);
  Buffer b = pool.acquire(200, false);
  pool.give_back(std::move(a));
  Buffer c = pool.acquire(200, false);  // the freed 100 does not fit: a new buffer
  CHECK(pool.in_use() == 400);
  CHECK(pool.peak() == 400);
  CHECK(pool.held_peak() == 500);
  pool.give_back(std::move(b));
  Buffer d = pool.acquire(200, false);  // reuses b
  Buffer e = pool.acquire(100, true);   // reuses a
  CHECK(pool.peak() == 500);
  CHECK(pool.held_peak() == 500);
  pool.give_back(std::move(c));
  pool.give_back(std::move(d));
  pool.give_back(std::move(e));
  pool.trim();  // gives the buffers back to the backend: a new one counts again from there
  Buffer f = pool.acquire(600, false);
  CHECK(pool.held_peak() == 600);
  pool.give_back(std::move(f));
}
