// A GPT tensor-parallel group inside one process: T threads, each with its own Ops and a
// GptModel holding one tensor-parallel part (TensorParallel over a ThreadComm), meeting in their
// all-reduces on the host. It runs the model under tensor parallelism without MPI, so one GPU
// can run every part: test/gpu/test_gpt_cuda_model.cpp runs CudaOps parts (the CUDA part kernels
// and TensorParallel's trip through host memory), and test/unit/gpt/test_gpt_tensor_parts.cpp
// runs the same harness on HostOps against the whole model, so the harness itself is checked on
// every machine.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt_model_compare.hpp"
#include "gpt/ops.hpp"
#include "gpt/tensor_parallel.hpp"
#include "zero/comm.hpp"
#include "zero/dtype.hpp"
#include "zero/error.hpp"
#include "zero/layout.hpp"

namespace zero::gpt::test {

// The members' meeting point: a reusable barrier that every waiting member leaves with an error
// once one member has failed (a thread that throws must not leave the others waiting forever),
// and the members' buffers of the all-reduce in progress.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), bufs_(static_cast<std::size_t>(size)) {}
  int size() const { return size_; }
  std::vector<float*>& bufs() { return bufs_; }

  void arrive_and_wait() {
    std::unique_lock lock(m_);
    ZERO_CHECK(!broken_, "ThreadGroup: another member of the tensor group failed");
    const std::uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || broken_; });
    ZERO_CHECK(generation_ != generation, "ThreadGroup: another member of the tensor group failed");
  }
  void fail() {
    std::lock_guard lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  int size_;
  std::vector<float*> bufs_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool broken_ = false;
};

// Member `rank` of a ThreadGroup. All TensorParallel asks of its communicator is an fp32
// all-reduce (sum or max) of host memory; it is taken in rank order, so every member gets the
// same bits, as a real tensor group's replicated activations must be.
class ThreadComm final : public zero::Communicator {
 public:
  ThreadComm(ThreadGroup& group, int rank) : group_(&group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  zero::Work all_reduce_async(void* buf, std::size_t count, zero::DType t, zero::ReduceOp op) override {
    ZERO_CHECK(t == zero::DType::f32 && (op == zero::ReduceOp::sum || op == zero::ReduceOp::max),
               "ThreadComm: only fp32 sum and max all-reduces");
    auto* mine = static_cast<float*>(buf);
    group_->bufs()[static_cast<std::size_t>(rank_)] = mine;
    group_->arrive_and_wait();  // every member's input is in place
    std::vector<float> out(count);
    const std::vector<float*>& in = group_->bufs();
    for (std::size_t i = 0; i < count; ++i) {
      float acc = in[0][i];
      for (std::size_t r = 1; r < in.size(); ++r)
        acc = op == zero::ReduceOp::sum ? acc + in[r][i] : std::max(acc, in[r][i]);
      out[i] = acc;
    }
    group_->arrive_and_wait();  // every member has read every input
    std::copy(out.begin(), out.end(), mine);
    return {};
  }
  zero::Work reduce_scatter_async(const void*, void*, std::size_t, zero::DType, zero::ReduceOp) override {
    unsupported("reduce_scatter");
  }
  zero::Work all_gather_async(const void*, void*, std::size_t, zero::DType) override { unsupported("all_gather"); }
  zero::Work all_to_all_async(const void*, void*, std::size_t, zero::DType) override { unsupported("all_to_all"); }
  zero::Work broadcast_async(void*, std::size_t, int) override { unsupported("broadcast"); }
  zero::Work barrier_async() override { unsupported("barrier"); }
  zero::Work send_async(const void*, std::size_t, zero::DType, int) override { unsupported("send"); }
  zero::Work recv_async(void*, std::size_t, zero::DType, int) override { unsupported("recv"); }
  double all_reduce_scalar(double, zero::ReduceOp) override { unsupported("all_reduce_scalar"); }

 private:
  [[noreturn]] static void unsupported(const char* what) {
    ZERO_THROW(std::string("ThreadComm: ") + what + " is not implemented (TensorParallel needs only all_reduce)");
  }
  ThreadGroup* group_;
  int rank_;
};

using Units = std::vector<std::vector<float>>;  // values unit by unit, in a layout's order

// Rank t's part of whole-model tensors (HostParams' layout, build_layout) in the layout `part`
// (tensor_parallel_layout(cfg, T)), unit by unit.
inline Units take_parts(const GptConfig& cfg, const Units& whole, const zero::Layout& part, int T, int t) {
  const zero::Layout full = build_layout(cfg);
  Units out;
  for (int u = 0; u < part.num_units(); ++u) {
    const zero::UnitInfo& pu = part.unit(u);
    const zero::UnitInfo& wu = full.unit(u);
    auto& o = out.emplace_back(static_cast<std::size_t>(pu.numel));
    for (std::size_t i = 0; i < pu.params.size(); ++i) {
      const zero::ParamInfo& p = pu.params[i];
      const zero::ParamInfo& w = wu.params[i];
      take_part(std::span(whole[static_cast<std::size_t>(u)])
                    .subspan(static_cast<std::size_t>(w.offset), static_cast<std::size_t>(w.numel)),
                p, T, t, std::span(o).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.numel)));
    }
  }
  return out;
}

// A layout's units as UnitSpecs (names and shapes), for compare::agreement_per_tensor.
inline std::vector<UnitSpec> unit_specs(const zero::Layout& layout) {
  std::vector<UnitSpec> specs;
  for (const zero::UnitInfo& u : layout.units()) {
    UnitSpec& s = specs.emplace_back(UnitSpec{u.name, {}});
    for (const zero::ParamInfo& p : u.params) s.tensors.push_back({p.name, p.shape});
  }
  return specs;
}

// A layout's units in an Ops' memory and dtype, with the per-tensor pointers GptModel takes.
// Transfers go through the Ops, so they are ordered on its stream with the model's kernels.
class OpsUnits {
 public:
  OpsUnits(Ops& ops, const zero::Layout& layout) : ops_(&ops) {
    for (const zero::UnitInfo& u : layout.units()) {
      sizes_.push_back(static_cast<std::size_t>(u.numel));
      buffers_.emplace_back(ops, sizes_.back() * ops.elem_bytes());
      auto& ptrs = ptrs_.emplace_back();
      for (const zero::ParamInfo& p : u.params)
        ptrs.push_back(act_offset(buffers_.back().as<Act>(), static_cast<std::size_t>(p.offset), ops.elem_bytes()));
    }
    zero();
  }
  // fp32 values, rounded to the Ops' dtype.
  void upload(const Units& values) {
    std::vector<std::vector<std::byte>> staging;
    for (std::size_t u = 0; u < sizes_.size(); ++u) {
      ZERO_CHECK(values[u].size() == sizes_[u], "OpsUnits::upload: unit sizes differ");
      auto& s = staging.emplace_back(sizes_[u] * ops_->elem_bytes());
      zero::convert(values[u].data(), zero::DType::f32, s.data(), ops_->dtype(), sizes_[u]);
      ops_->upload(buffers_[u].as<void>(), s.data(), s.size());
    }
    ops_->synchronize();
  }
  void zero() {
    for (std::size_t u = 0; u < sizes_.size(); ++u)
      ops_->fill_zero(buffers_[u].as<void>(), sizes_[u] * ops_->elem_bytes());
  }
  // The elements as stored (the Ops' dtype), unit by unit.
  std::vector<std::vector<std::byte>> bytes() const {
    std::vector<std::vector<std::byte>> out;
    for (std::size_t u = 0; u < sizes_.size(); ++u) {
      auto& raw = out.emplace_back(sizes_[u] * ops_->elem_bytes());
      ops_->download(raw.data(), buffers_[u].as<void>(), raw.size());
    }
    return out;
  }
  Units values() const {
    Units out;
    for (const auto& raw : bytes()) {
      auto& v = out.emplace_back(raw.size() / ops_->elem_bytes());
      zero::convert(raw.data(), ops_->dtype(), v.data(), zero::DType::f32, v.size());
    }
    return out;
  }
  const Act* const* acts(int u) const { return ptrs_[static_cast<std::size_t>(u)].data(); }
  Act* const* acts(int u) { return ptrs_[static_cast<std::size_t>(u)].data(); }

 private:
  Ops* ops_;
  std::vector<std::size_t> sizes_;
  std::vector<OpsBuffer> buffers_;
  std::vector<std::vector<Act*>> ptrs_;
};

// What one member of the group computed in a micro-step.
struct PartStep {
  double loss = 0;
  Units grads;  // this rank's part, in tensor_parallel_layout(cfg, T)
};

// One micro-step (forward and backward of `batch`, compare::kBatch sequences) of a tensor group
// of T members on Ops made by make_ops, each from its part of `params`. The members' results in
// rank order; the first member's error is rethrown.
// `as_device`: the group's communicator also serves as TensorParallel::device, so the
// all-reduces take the device path (an fp32 scratch, an asynchronous all-reduce) in host memory.
inline std::vector<PartStep> tensor_group_step(const GptConfig& cfg, int T, const HostParams& params,
                                               const compare::Batch& batch,
                                               const std::function<std::unique_ptr<Ops>()>& make_ops,
                                               bool as_device = false) {
  const zero::Layout part = tensor_parallel_layout(cfg, T);
  Units whole;
  for (int u = 0; u < params.num_units(); ++u) whole.push_back(params.unit_data(u));
  ThreadGroup group(T);
  std::vector<PartStep> out(static_cast<std::size_t>(T));
  std::mutex error_mutex;
  std::exception_ptr first_error;  // the others then fail at their next all-reduce
  auto member = [&](int t) {
    try {
      ThreadComm comm(group, t);
      const std::unique_ptr<Ops> ops = make_ops();
      GptModel m(cfg, compare::kBatch, *ops, TensorParallel{T, t, &comm, as_device ? &comm : nullptr});
      OpsUnits p(*ops, part), g(*ops, part);
      p.upload(take_parts(cfg, whole, part, T, t));
      const int lnf = ln_f_unit(cfg), emb = embeddings_unit();
      m.set_batch(batch.inputs.data(), batch.targets.data(), compare::kBatch, cfg.seq_len);
      m.forward_embeddings(p.acts(emb));
      for (int l = 0; l < cfg.n_layer; ++l) m.forward_block(l, p.acts(block_unit(l)));
      m.forward_head(p.acts(lnf), p.acts(emb));
      PartStep& r = out[static_cast<std::size_t>(t)];
      r.loss = m.loss();
      m.backward_head(p.acts(lnf), g.acts(lnf), p.acts(emb), g.acts(emb), 1.0f);
      for (int l = cfg.n_layer - 1; l >= 0; --l) m.backward_block(l, p.acts(block_unit(l)), g.acts(block_unit(l)));
      m.backward_embeddings(p.acts(emb), g.acts(emb));
      r.grads = g.values();
    } catch (...) {
      {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      group.fail();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < T; ++t) threads.emplace_back(member, t);
  for (std::thread& th : threads) th.join();
  if (first_error) std::rethrow_exception(first_error);
  return out;
}

}  // namespace zero::gpt::test
