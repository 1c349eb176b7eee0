// Pipeline parallelism for the GPT trainer: the split, the 1F1B schedule, a part's layout,
// and GptTrainer's pipelined training step, evaluation and sampling (see pipeline.hpp).
#include "gpt/pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "gpt/reporter.hpp"
#include "gpt/tensor_parallel.hpp"
#include "gpt/trainer.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

namespace zero::gpt {

PartSplit part_split(int n_layer, int parts, int part) {
  ZERO_CHECK(parts >= 1 && parts <= n_layer,
             fmt::format("model.pipeline_parallel: {} parts for {} blocks (n_layer); every part needs at least one "
                         "block: use pipeline_parallel <= {}",
                         parts, n_layer, n_layer));
  ZERO_CHECK(part >= 0 && part < parts, fmt::format("part_split: part {} of {}", part, parts));
  const int base = n_layer / parts, extra = n_layer % parts;
  PartSplit s;
  s.part = part;
  s.parts = parts;
  s.first_layer = part * base + std::min(part, extra);
  s.end_layer = s.first_layer + base + (part < extra ? 1 : 0);
  return s;
}

std::vector<PipeOp> one_f_one_b(int parts, int part, int m) {
  ZERO_CHECK(parts >= 1 && part >= 0 && part < parts && m >= 1,
             fmt::format("one_f_one_b: part {} of {} over {} micro-batches", part, parts, m));
  const int warmup = std::min(parts - 1 - part, m);
  std::vector<PipeOp> ops;
  for (int k = 0; k < warmup; ++k) ops.push_back({true, k});
  for (int k = 0; k < m - warmup; ++k) {
    ops.push_back({true, warmup + k});
    ops.push_back({false, k});
  }
  for (int k = m - warmup; k < m; ++k) ops.push_back({false, k});
  return ops;
}

std::vector<std::vector<PipeTransfer>> pipe_transfers(int parts, int part, const PipeOp* done, const PipeOp* next) {
  std::optional<PipeTransfer> send, recv;
  if (done && done->forward && part + 1 < parts) send = PipeTransfer{true, true, done->micro, part + 1};
  if (done && !done->forward && part > 0) send = PipeTransfer{true, false, done->micro, part - 1};
  if (next && next->forward && part > 0) recv = PipeTransfer{false, true, next->micro, part - 1};
  if (next && !next->forward && part + 1 < parts) recv = PipeTransfer{false, false, next->micro, part + 1};
  std::vector<std::vector<PipeTransfer>> groups;
  if (send && recv && send->peer == recv->peer) return {{*send, *recv}};
  if (send) groups.push_back({*send});
  if (recv) groups.push_back({*recv});
  return groups;
}

zero::Layout part_layout(const GptConfig& cfg, const PartSplit& s, int tensor_parallel) {
  const zero::Layout full = tensor_parallel > 1 ? tensor_parallel_layout(cfg, tensor_parallel) : build_layout(cfg);
  zero::Layout out;
  // A unit of the full layout (the parameters `keep` selects), its weight decay flags and
  // tensor cuts kept.
  auto copy = [&](int unit, auto keep) {
    const zero::UnitInfo& u = full.unit(unit);
    std::vector<std::pair<std::string, zero::Layout::Shape>> ps;
    for (const auto& p : u.params)
      if (keep(p)) ps.emplace_back(p.name, p.shape);
    const int id = out.add_unit(u.name, ps);
    for (const auto& p : u.params) {
      if (!keep(p)) continue;
      out.set_decay(id, p.name, p.decay);
      if (p.embedding) out.set_embedding(id, p.name);  // Muon steps it with AdamW
      if (p.replicated) out.set_replicated(id, p.name);
      if (p.split_axis >= 0) out.set_split(id, p.name, p.split_axis, p.split_blocks);
    }
    return id;
  };
  auto all = [](const zero::ParamInfo&) { return true; };
  if (s.first()) {
    copy(embeddings_unit(), all);
  } else if (s.last() && cfg.tied_head) {
    const std::string& wte = full.unit(embeddings_unit()).params[kWte].name;
    const int id = copy(embeddings_unit(), [&](const zero::ParamInfo& p) { return p.name == wte; });
    out.set_norm_counted_elsewhere(id, wte);
  }
  for (int l = s.first_layer; l < s.end_layer; ++l) copy(block_unit(l), all);
  if (s.last()) copy(ln_f_unit(cfg), all);
  return out;
}

void check_pipeline_config(const zero::Config& cfg, int pipeline) {
  if (pipeline <= 1) return;
  ZERO_CHECK(cfg.zero_optimization.stage <= 1,
             fmt::format("model.pipeline_parallel: {} with zero_optimization.stage {}: pipeline parallelism works with "
                         "ZeRO stages 0 and 1 only (as in DeepSpeed). A pipeline part accumulates its gradients over "
                         "the step's micro-batches, which arrive interleaved with other micro-batches' forwards; stage "
                         "2 would reduce-scatter and free them after every micro-batch and stage 3 would gather every "
                         "unit again for each one, a data-parallel collective per unit per micro-batch inside the "
                         "schedule. Use stage 1: each rank already holds only 1/{} of the model's parameters",
                         pipeline, cfg.zero_optimization.stage, pipeline));
}

std::string PipelineReport::describe() const {
  std::string holds;
  if (part == 0) holds += ", embeddings";
  if (part == parts - 1) holds += parts > 1 && tied ? ", ln_f, head and the tied wte copy" : ", ln_f and head";
  return fmt::format(
      "{}: part {} of {} (blocks {}-{}{}), 1F1B over {} micro-batches, bubble {:.1f}%, "
      "activations of {} micro-batch{} held ({:.2f} MiB)",
      format_grid(tensor, data, parts), part, parts, first_layer, end_layer - 1, holds, micro_batches, 100.0 * bubble,
      slots, slots == 1 ? "" : "es", static_cast<double>(activation_bytes) / (1 << 20));
}

// ------------------------------------------------------------------------------ the trainer's part

ModelPart GptTrainer::pipeline_part() const {
  if (!pipe_) return {};
  const PartSplit& s = pipe_->split;
  ModelPart part;
  part.first_layer = s.first_layer;
  part.end_layer = s.end_layer;
  part.embeddings = s.first();
  part.head = s.last();
  part.slots = in_flight_bound(s.parts, s.part, gas_);
  return part;
}

void GptTrainer::setup_pipeline_buffers() {
  PipelineState& ps = *pipe_;
  const zero::Layout& layout = engine_->layout();
  const PartSplit& s = ps.split;
  // The pipeline part's units by their names in the whole model's layout.
  const std::vector<UnitSpec> units = gpt_units(settings_.model);
  auto id = [&](int whole_unit) { return layout.find_unit(units[static_cast<std::size_t>(whole_unit)].name); };
  // An untied head (llama) is ln_f's: then only the first part holds the embeddings, and there
  // is no wte gradient to exchange.
  ps.tied = settings_.model.tied_head;
  if (s.first() || (s.last() && ps.tied)) ps.emb = id(embeddings_unit());
  if (s.last()) ps.lnf = id(ln_f_unit(settings_.model));
  for (int l = s.first_layer; l < s.end_layer; ++l) ps.blocks.push_back(id(block_unit(l)));
  if ((s.first() || s.last()) && ps.tied) {
    const std::size_t n = tied_elements() * ops_->elem_bytes();
    ps.tied_grad = OpsBuffer(*ops_, n);
    ps.tied_peer = OpsBuffer(*ops_, n);
  }
  ps.act_sends.resize(static_cast<std::size_t>(model_->part().slots));
  // Collective over the pipeline group (every part builds its trainer alike).
  ps.device_comm = engine_->device_comm(groups_->pipeline());
}

std::size_t GptTrainer::tied_elements() const {
  return static_cast<std::size_t>(settings_.model.padded_vocab_size() / settings_.tensor_parallel) *
         settings_.model.n_embd;
}

PipelineReport GptTrainer::pipeline_report() const {
  PipelineReport r;
  r.data = data_parallel_size();
  r.tensor = tensor_parallel_size();
  r.micro_batches = gas_;
  r.tied = settings_.model.tied_head;
  r.end_layer = settings_.model.n_layer;
  r.slots = model_->part().slots;
  r.activation_bytes = model_->activation_bytes();
  if (!pipe_) return r;
  r.parts = pipe_->split.parts;
  r.part = pipe_->split.part;
  r.first_layer = pipe_->split.first_layer;
  r.end_layer = pipe_->split.end_layer;
  r.peak_in_flight = pipe_->peak_in_flight;
  r.bubble = bubble_fraction(r.parts, gas_);
  return r;
}

zero::Communicator& GptTrainer::pipe_comm() { return pipe_->device_comm ? *pipe_->device_comm : groups_->pipeline(); }

void GptTrainer::part_forward() {
  PipelineState& ps = *pipe_;
  const PartSplit& s = ps.split;
  const zero::CommSiteScope site("pipeline forward");
  // After the first part the input is in part_input(), received before (pipe_exchange).
  if (s.first()) {
    zero::UnitParams E = engine_->gather(ps.emb);
    model_->forward_embeddings(param_ptrs(E, emb_params_));
  }
  for (int l = s.first_layer; l < s.end_layer; ++l) {
    zero::UnitParams P = engine_->gather(ps.blocks[static_cast<std::size_t>(l - s.first_layer)]);
    model_->forward_block(l, param_ptrs(P, unit_params_));
  }
  if (s.last()) {
    std::optional<zero::UnitParams> E;
    if (ps.emb >= 0) E.emplace(engine_->gather(ps.emb));
    const Act* const* pe = E ? param_ptrs(*E, emb_params_) : nullptr;
    zero::UnitParams P = engine_->gather(ps.lnf);
    model_->forward_head(param_ptrs(P, unit_params_), pe);
  }
}

void GptTrainer::part_backward(bool last_micro) {
  PipelineState& ps = *pipe_;
  const PartSplit& s = ps.split;
  const zero::CommSiteScope site("pipeline backward");
  const float dloss = engine_->loss_scale();
  // Before the last part the output's gradient is in output_grad(), received before
  // (pipe_exchange).

  // A tied wte's gradient goes to the step-long buffer on both parts that hold it; the engine's
  // wte gradient receives the exchanged sum once, on the last micro-batch.
  std::optional<zero::UnitGrads> GE;
  Act* const* ge = nullptr;
  Act* engine_wte = nullptr;
  if (ps.emb >= 0) {
    GE.emplace(engine_->grads(ps.emb));
    grad_ptrs(ps.emb, *GE, emb_grads_);
    if (ps.tied) {
      engine_wte = emb_grads_.ptrs[kWte];
      emb_grads_.ptrs[kWte] = ps.tied_grad.as<Act>();
    }
    ge = emb_grads_.ptrs.data();
  }
  if (s.last()) {
    std::optional<zero::UnitParams> E;
    if (ps.emb >= 0) E.emplace(engine_->gather(ps.emb));
    const Act* const* pe = E ? param_ptrs(*E, emb_params_) : nullptr;
    zero::UnitParams P = engine_->gather(ps.lnf);
    zero::UnitGrads G = engine_->grads(ps.lnf);
    model_->backward_head(param_ptrs(P, unit_params_), grad_ptrs(ps.lnf, G, unit_grads_), pe, ge, dloss);
    commit_grads(ps.lnf, G, unit_grads_);
    engine_->reduce(ps.lnf);
  }
  for (int l = s.end_layer - 1; l >= s.first_layer; --l) {
    const int u = ps.blocks[static_cast<std::size_t>(l - s.first_layer)];
    zero::UnitParams P = engine_->gather(u);
    zero::UnitGrads G = engine_->grads(u);
    model_->backward_block(l, param_ptrs(P, unit_params_), grad_ptrs(u, G, unit_grads_));
    commit_grads(u, G, unit_grads_);
    engine_->reduce(u);
  }
  if (s.first()) {
    zero::UnitParams E = engine_->gather(ps.emb);
    model_->backward_embeddings(param_ptrs(E, emb_params_), ge);
  }
  if (ps.emb >= 0) {
    if (last_micro && ps.tied) {
      // Committed by exchange_tied, after the step's last transfers: the last part's input
      // gradient must be on its way first, or the first part never reaches the exchange.
      ps.emb_grads = std::move(GE);
      ps.engine_wte = engine_wte;
      return;
    }
    commit_grads(ps.emb, *GE, emb_grads_);
    engine_->reduce(ps.emb);
  }
}

void GptTrainer::pipe_exchange(const PipeOp* done, const PipeOp* next) {
  PipelineState& ps = *pipe_;
  const PartSplit& s = ps.split;
  zero::Communicator& pipe = pipe_comm();
  const int slots = model_->part().slots;
  // A training micro-batch's boundary (model_->boundary_elements() once set_batch has run: a
  // receive may come before the op's set_batch, the step's first before any).
  const std::size_t n = static_cast<std::size_t>(micro_batch_) * settings_.model.seq_len * settings_.model.n_embd;
  for (const std::vector<PipeTransfer>& group : pipe_transfers(s.parts, s.part, done, next)) {
    // A gradient is sent from and received into the buffer the last one was sent from; waited
    // here, before the group opens (an activation's slot was waited before its forward).
    for (const PipeTransfer& t : group)
      if (!t.activation) ps.grad_send.wait();
    std::vector<zero::Work> recvs;
    zero::CommGroup g(pipe);
    for (const PipeTransfer& t : group) {
      const zero::CommSiteScope site(t.activation ? "pipeline forward" : "pipeline backward");
      const int slot = t.micro % slots;
      model_->set_slot(slot);  // the activations' buffers are the micro-batch's slot's
      if (t.send && t.activation)
        ps.act_sends[static_cast<std::size_t>(slot)] = pipe.send_async(model_->part_output(), n, ops_->dtype(), t.peer);
      else if (t.send)
        ps.grad_send = pipe.send_async(model_->output_grad(), n, ops_->dtype(), t.peer);
      else
        recvs.push_back(
            pipe.recv_async(t.activation ? model_->part_input() : model_->output_grad(), n, ops_->dtype(), t.peer));
    }
    g.end();
    for (zero::Work& w : recvs) w.wait();
  }
}

void GptTrainer::exchange_tied() {
  PipelineState& ps = *pipe_;
  const PartSplit& s = ps.split;
  zero::Communicator& pipe = pipe_comm();
  // Both parts end up with mine + theirs, the same sum in the same fp32 (or bf16) rounding
  // (addition commutes), so the two copies of wte get the same update.
  const std::size_t n = tied_elements();
  {
    const zero::CommSiteScope tied_site("pipeline tied wte gradient");
    const int peer = s.first() ? s.parts - 1 : 0;
    // One group: on NCCL a receive and a send with one peer, issued apart, wait for each other.
    zero::CommGroup group(pipe);
    zero::Work r = pipe.recv_async(ps.tied_peer.as<void>(), n, ops_->dtype(), peer);
    zero::Work w = pipe.send_async(ps.tied_grad.as<void>(), n, ops_->dtype(), peer);
    group.end();
    r.wait();
    w.wait();
  }
  ops_->residual_forward(ps.tied_grad.as<Act>(), ps.tied_grad.as<Act>(), ps.tied_peer.as<Act>(), n);
  ops_->residual_forward(ps.engine_wte, ps.engine_wte, ps.tied_grad.as<Act>(), n);
  commit_grads(ps.emb, *ps.emb_grads, emb_grads_);
  engine_->reduce(ps.emb);
  ps.emb_grads.reset();
}

GptTrainer::Step GptTrainer::pipeline_train_step() {
  PipelineState& ps = *pipe_;
  const PartSplit& s = ps.split;
  const int T = settings_.model.seq_len;
  model_->reset_loss_total();
  if (ps.tied_grad.bytes() > 0) ops_->fill_zero(ps.tied_grad.as<void>(), ps.tied_grad.bytes());
  ps.in_flight = 0;
  const std::vector<PipeOp> ops = one_f_one_b(s.parts, s.part, gas_);
  for (std::size_t i = 0; i <= ops.size(); ++i) {
    // The previous op's send and this op's receive.
    pipe_exchange(i > 0 ? &ops[i - 1] : nullptr, i < ops.size() ? &ops[i] : nullptr);
    if (i == ops.size()) break;
    const PipeOp& op = ops[i];
    const int slot = op.micro % model_->part().slots;
    model_->set_slot(slot);
    if (op.forward) {
      // The slot's activation buffer is free once its last send is done.
      ps.act_sends[static_cast<std::size_t>(slot)].wait();
      train_loader_->next(inputs_.data(), targets_.data());
      model_->set_batch(inputs_.data(), targets_.data(), micro_batch_, T);
      part_forward();
      ps.peak_in_flight = std::max(ps.peak_in_flight, ++ps.in_flight);
    } else {
      part_backward(op.micro == gas_ - 1);
      --ps.in_flight;
    }
  }
  if (ps.emb >= 0 && ps.tied) exchange_tied();
  for (auto& w : ps.act_sends) w.wait();
  ps.grad_send.wait();
  Step st;
  st.result = engine_->step();
  // The loss lives on the last part; its ranks (one per data-parallel rank) hold their batch's
  // mean, so the world's sum over them, divided by their count, is what every rank logs.
  const double mine = s.last() ? model_->take_mean_loss() : 0.0;
  st.loss = ctx_.comm().all_reduce_scalar(mine, zero::ReduceOp::sum) / (ctx_.world_size() / s.parts);
  return st;
}

// One forward of the micro-batch set on the current slot through every part, the activation
// passed on (blocking: the next part is already waiting for it, or soon will be).
void GptTrainer::pipeline_forward_only() {
  const PartSplit& s = pipe_->split;
  zero::Communicator& pipe = pipe_comm();
  const std::size_t n = model_->boundary_elements();
  const zero::CommSiteScope site("pipeline forward");
  if (!s.first()) pipe.recv(model_->part_input(), n, ops_->dtype(), s.part - 1);
  part_forward();
  if (!s.last()) pipe.send(model_->part_output(), n, ops_->dtype(), s.part + 1);
}

GptTrainer::Evaluation GptTrainer::pipeline_evaluate() {
  // The windows shared out over the data-parallel ranks; each one's loss comes from the last
  // part (the caller holds the engine in eval mode).
  const bool last = pipe_->split.last();
  return evaluate_windows(data_parallel_size(), data_parallel_rank(), last && tensor_parallel_rank() == 0,
                          [this, last] {
                            pipeline_forward_only();
                            return last ? model_->loss() : 0.0;
                          });
}

}  // namespace zero::gpt
