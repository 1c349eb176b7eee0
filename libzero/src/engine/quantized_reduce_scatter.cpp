// qgZ's hierarchical quantized reduce-scatter (see engine/quantized_reduce_scatter.hpp).
#include "engine/quantized_reduce_scatter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "comm/mpi_comm.hpp"
#include "comm/quantize.hpp"
#include "zero/error.hpp"

namespace zero {

using quant::Bits;

// One reduction in flight: its inputs, scratch (fp32 words from the communicator's pool) and
// the two phases' collectives.
struct QuantizedReduceScatter::Op {
  const void* grad = nullptr;
  DType t = DType::f32;
  std::size_t slice = 0;
  Feedback* fb = nullptr;
  float* out = nullptr;
  // The site that started the reduction ("reduce", its unit): phase 2 starts later, from
  // whatever call completes phase 1, and the collective check must see the same on every rank.
  CommSite site;
  Buffer send1, recv1, partial, send2, recv2;  // backend memory from the pool
  Work work1, work2;
  int phase = 1;  // 1: node all-to-all in flight, 2: cross-node all-to-all in flight, 3: done
};

class QuantizedReduceScatter::OpWork final : public Work::Impl {
 public:
  OpWork(QuantizedReduceScatter* owner, std::shared_ptr<Op> op) : owner_(owner), op_(std::move(op)) {}
  void wait() override { owner_->complete(op_.get()); }
  bool test() override { return owner_->poll(op_.get()); }

 private:
  QuantizedReduceScatter* owner_;
  std::shared_ptr<Op> op_;
};

namespace {
std::size_t words(std::size_t bytes) { return bytes / sizeof(float); }  // packed sizes are whole words
float* floats(const Buffer& b) { return b.as<float>(); }
}  // namespace

QuantizedReduceScatter::QuantizedReduceScatter(MpiCommunicator& dp, std::size_t block, Backend* backend)
    : own_backend_(backend ? nullptr : make_host_backend(dp)),
      backend_(backend ? *backend : *own_backend_),
      pool_(backend_),
      block_(block) {
  ZERO_CHECK(block_ >= 1, "qgZ: the quantization block must hold at least one element");
  const std::vector<int>& node_of = dp.nodes();
  nodes_ = *std::max_element(node_of.begin(), node_of.end()) + 1;
  owner_.assign(static_cast<std::size_t>(nodes_), {});
  for (int r = 0; r < dp.size(); ++r)
    owner_[static_cast<std::size_t>(node_of[static_cast<std::size_t>(r)])].push_back(r);
  per_node_ = static_cast<int>(owner_[0].size());
  std::string sizes;
  bool uniform = true;
  for (const auto& members : owner_) {
    uniform = uniform && static_cast<int>(members.size()) == per_node_;
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(members.size());
  }
  ZERO_CHECK(uniform, fmt::format("zero_optimization.zero_quantized_gradients: the {} data-parallel ranks lie on {} "
                                  "nodes holding different numbers of them ({}); qgZ's hierarchical reduce-scatter "
                                  "needs the same number on every node. Place the ranks evenly (or set "
                                  "ZERO_RANKS_PER_NODE to a divisor of the world size), or set it to false",
                                  dp.size(), nodes_, sizes));
  node_ = node_of[static_cast<std::size_t>(dp.rank())];
  const auto& mine = owner_[static_cast<std::size_t>(node_)];
  local_ = static_cast<int>(std::find(mine.begin(), mine.end(), dp.rank()) - mine.begin());
  node_comm_ = dp.split(node_, local_);
  cross_comm_ = dp.split(local_, node_);
  // Split from the backend's communicator (its ranks are dp's), none for a one-rank group.
  node_dev_ = backend_.split_comm(*node_comm_);
  cross_dev_ = backend_.split_comm(*cross_comm_);
  std::vector<std::int32_t> rows;
  for (int l = 0; l < per_node_; ++l)
    for (int n = 0; n < nodes_ && l != local_; ++n) rows.push_back(owner_[static_cast<std::size_t>(n)][l]);
  for (int n = 0; n < nodes_; ++n) rows.push_back(owner_[static_cast<std::size_t>(n)][local_]);
  for (int n = 0; n < nodes_; ++n)
    if (n != node_) rows.push_back(n);
  rows_ = backend_.alloc(rows.size() * sizeof(std::int32_t));
  backend_.from_host(rows_.get(), rows.data(), rows.size() * sizeof(std::int32_t));
  intra_rows_ = rows_.as<std::int32_t>();
  own_rows_ = intra_rows_ + static_cast<std::size_t>(per_node_ - 1) * static_cast<std::size_t>(nodes_);
  inter_rows_ = own_rows_ + nodes_;
}

QuantizedReduceScatter::~QuantizedReduceScatter() {
  try {
    while (!in_phase1_.empty()) complete(in_phase1_.front().get());
  } catch (...) {
  }
}

Communicator& QuantizedReduceScatter::node() {
  if (node_dev_) return *node_dev_;
  return *node_comm_;
}
Communicator& QuantizedReduceScatter::cross() {
  if (cross_dev_) return *cross_dev_;
  return *cross_comm_;
}

QuantizedReduceScatter::Scratch QuantizedReduceScatter::scratch_for(std::size_t L, std::size_t M, std::size_t slice,
                                                                    std::size_t block) {
  Scratch s;
  s.message1 = quant::packed_bytes(M * slice, block, Bits::int8);
  s.phase1 = L > 1 ? L * s.message1 : 0;
  s.partial = M * slice * sizeof(float);
  s.message2 = quant::packed_bytes(slice, block, Bits::int4);
  s.phase2 = M > 1 ? M * s.message2 : 0;
  return s;
}

QuantizedReduceScatter::Feedback QuantizedReduceScatter::make_feedback(std::size_t slice) const {
  const auto L = static_cast<std::size_t>(per_node_), M = static_cast<std::size_t>(nodes_);
  Feedback f;
  f.intra_n = intra_feedback_elements(L, M, slice);
  f.inter_n = inter_feedback_elements(M, slice);
  f.intra = backend_.alloc(f.intra_n * sizeof(float));  // zero-filled
  f.inter = backend_.alloc(f.inter_n * sizeof(float));
  return f;
}

TrafficBytes QuantizedReduceScatter::bytes_per_reduction(std::size_t slice) const {
  return bytes_per_reduction_for(static_cast<std::size_t>(per_node_), static_cast<std::size_t>(nodes_), slice, block_);
}

TrafficBytes QuantizedReduceScatter::bytes_per_reduction_for(std::size_t L, std::size_t M, std::size_t slice,
                                                             std::size_t block) {
  // One message to each node peer, then one to each other node.
  const Scratch s = scratch_for(L, M, slice, block);
  TrafficBytes t;
  t.intra_node = static_cast<std::int64_t>((L - 1) * s.message1);
  t.inter_node = static_cast<std::int64_t>((M - 1) * s.message2);
  return t;
}

TrafficBytes QuantizedReduceScatter::traffic() const {
  TrafficBytes t = node_comm_->traffic();
  t += cross_comm_->traffic();
  return t;
}

Work QuantizedReduceScatter::start(const void* grad, DType t, std::size_t slice, Feedback& fb, float* out) {
  auto op = std::make_shared<Op>();
  op->grad = grad;
  op->t = t;
  op->slice = slice;
  op->fb = &fb;
  op->out = out;
  op->site = comm_site();
  const std::size_t L = static_cast<std::size_t>(per_node_), M = static_cast<std::size_t>(nodes_);
  const std::size_t chunk = M * slice;  // what one node peer gets: the slices of ranks R(*, l')
  const Scratch sizes = scratch_for(L, M, slice, block_);
  if (L == 1) {
    // No node peers: the partial sum is this rank's own gradient, exactly.
    op->partial = pool_.acquire(sizes.partial, false);
    backend_.gather_rows(floats(op->partial), grad, t, slice, own_rows_, M, false);
    start_inter(*op);
    return Work(std::make_unique<OpWork>(this, std::move(op)));
  }
  op->send1 = pool_.acquire(sizes.phase1, false);
  op->recv1 = pool_.acquire(sizes.phase1, false);
  // The chunk for each peer (its M slices) plus the error kept from last time, quantized into
  // the peer's slot; the new error stays. The slot to itself is zeroed, not used.
  backend_.gather_rows(floats(fb.intra), grad, t, slice, intra_rows_, (L - 1) * M, true);
  backend_.quantize_keep_error(floats(fb.intra), L - 1, chunk, block_, Bits::int8, op->send1.get(),
                               static_cast<std::size_t>(local_));
  op->work1 = node().all_to_all_async(op->send1.get(), op->recv1.get(), words(sizes.message1), DType::f32);
  in_phase1_.push_back(op);
  return Work(std::make_unique<OpWork>(this, std::move(op)));
}

void QuantizedReduceScatter::start_inter(Op& op) {
  const CommSiteScope site(op.site);
  const std::size_t L = static_cast<std::size_t>(per_node_), M = static_cast<std::size_t>(nodes_);
  const std::size_t slice = op.slice, chunk = M * slice;
  const Scratch sizes = scratch_for(L, M, slice, block_);
  if (L > 1) {
    // The node's partial sum of the M slices this local rank serves, in local-rank order.
    // In local-rank order: the peers before this rank, its own slices exactly, the peers after.
    const auto me = static_cast<std::size_t>(local_);
    op.partial = pool_.acquire(sizes.partial, false);
    float* partial = floats(op.partial);
    backend_.zero(partial, chunk * sizeof(float));
    backend_.dequantize_add(op.recv1.get(), 0, me, chunk, block_, Bits::int8, partial);
    backend_.gather_rows(partial, op.grad, op.t, slice, own_rows_, M, true);
    backend_.dequantize_add(op.recv1.get(), me + 1, L, chunk, block_, Bits::int8, partial);
    pool_.give_back(std::move(op.send1));
    pool_.give_back(std::move(op.recv1));
  }
  if (M == 1) {
    backend_.copy(op.out, op.partial.get(), slice * sizeof(float));
    pool_.give_back(std::move(op.partial));
    op.phase = 3;
    return;
  }
  op.send2 = pool_.acquire(sizes.phase2, false);
  op.recv2 = pool_.acquire(sizes.phase2, false);
  // To each other node its slice of the partial sum plus the error kept, as int4; slot node_
  // (this node's) is zeroed.
  backend_.gather_rows(floats(op.fb->inter), op.partial.get(), DType::f32, slice, inter_rows_, M - 1, true);
  backend_.quantize_keep_error(floats(op.fb->inter), M - 1, slice, block_, Bits::int4, op.send2.get(),
                               static_cast<std::size_t>(node_));
  op.work2 = cross().all_to_all_async(op.send2.get(), op.recv2.get(), words(sizes.message2), DType::f32);
  op.phase = 2;
}

void QuantizedReduceScatter::finish(Op& op) {
  const std::size_t M = static_cast<std::size_t>(nodes_), slice = op.slice;
  // In node order: the nodes before this one, its own partial sum, the nodes after.
  const auto me = static_cast<std::size_t>(node_);
  backend_.zero(op.out, slice * sizeof(float));
  backend_.dequantize_add(op.recv2.get(), 0, me, slice, block_, Bits::int4, op.out);
  backend_.accumulate(op.out, DType::f32, floats(op.partial) + me * slice, DType::f32, slice);
  backend_.dequantize_add(op.recv2.get(), me + 1, M, slice, block_, Bits::int4, op.out);
  pool_.give_back(std::move(op.partial));
  pool_.give_back(std::move(op.send2));
  pool_.give_back(std::move(op.recv2));
  op.phase = 3;
}

void QuantizedReduceScatter::advance_through(Op* op) {
  // Phase 2 collectives start in the order the reductions did, on every rank alike.
  while (op->phase == 1) {
    std::shared_ptr<Op> front = in_phase1_.front();
    in_phase1_.pop_front();
    front->work1.wait();
    start_inter(*front);
  }
}

void QuantizedReduceScatter::complete(Op* op) {
  advance_through(op);
  if (op->phase == 2) {
    op->work2.wait();
    finish(*op);
  }
}

bool QuantizedReduceScatter::poll(Op* op) {
  // Only reports: starting phase 2 here would issue the cross-node all-to-all whenever a rank
  // happens to poll, so ranks polling at different moments would order it differently against
  // their other collectives (on NCCL, a hang). Phase 2 starts in complete() alone, from wait(),
  // which every rank reaches in the same program order. The op is ready for wait() once its
  // phase 2 has completed (finish() is local arithmetic, left to wait()).
  return op->phase == 3 || (op->phase == 2 && op->work2.done());
}

}  // namespace zero
