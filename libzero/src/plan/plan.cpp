// The whole plan for one configuration (memory in each place, step time, days); search.cpp ranks
// the open settings and finds the largest model of a family that fits.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "optim/optimizers.hpp"
#include "plan/engine_sizes.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"
#include "zero/util/log.hpp"

namespace zero::plan {

namespace {

// Bytes an on-device AdamW step moves per owned element: read param, grad, master, m, v;
// write param, master, m, v (16-bit params and grads; fp32 gradients read 2 more).
constexpr double kDeviceAdamBytes = 2 + 2 + 4 * 3 + 2 + 4 * 3;
// Bytes the host AdamW moves per element (bench/RESULTS.md, bench_host_adam: it runs at the
// memory-traffic limit of 28 B/param), so its rate is the node's DRAM bandwidth shared by its ranks.
constexpr double kHostAdamBytes = 28;

struct UnitSizes {
  std::int64_t total_padded = 0;  // Σ padded numel
  std::int64_t largest = 0;       // largest padded unit
  std::int64_t largest_slice = 0;
};

UnitSizes unit_sizes(const std::vector<UnitShape>& shapes) {
  UnitSizes u;
  for (const UnitShape& unit : shapes) {
    u.total_padded += unit.padded;
    u.largest = std::max(u.largest, unit.padded);
    u.largest_slice = std::max(u.largest_slice, unit.slice);
  }
  return u;
}

// "GPU memory: 81.2 GiB > 80.0 GiB". A near miss can round both sides to the same text; the
// excess is then named too, so the reader still sees by how much it does not fit.
std::string over_text(const char* what, double need, double have) {
  auto text = [](double b) { return format_bytes(static_cast<std::uint64_t>(std::max(0.0, std::ceil(b)))); };
  const std::string n = text(need), h = text(have);
  if (n == h) return fmt::format("{}: {} > {} (by {})", what, n, h, text(need - have));
  return fmt::format("{}: {} > {}", what, n, h);
}

}  // namespace

NcclCommunicators nccl_communicators(const Settings& s, int D, int ranks_per_node) {
  NcclCommunicators n;
  n.own = 1;  // the backend's, over the data-parallel group or MiCS's shard group
  const int N = s.shard_ranks(D);
  if (D / N > 1 && s.stage >= 1) ++n.own;  // MiCS's replica group
  if (s.tensor_parallel > 1) ++n.own;      // the GPT trainer's tensor group
  if (s.pipeline_parallel > 1) ++n.own;    // the GPT trainer's pipeline group
  if (s.stage == 3 && s.hpz_partition_size > 1) ++n.shared;
  if (s.stage >= 2 && s.quantized_gradients) {
    const int L = std::min(N, ranks_per_node), M = N / L;
    n.shared += (L > 1 ? 1 : 0) + (M > 1 ? 1 : 0);
  }
  return n;
}

namespace {

// The memory of one rank in pipeline part part.index: its part of the model (layout) sharded
// over the D ranks of its data-parallel group (or MiCS's groups of them), with 1F1B's
// micro-batches in flight.
MemoryPlan plan_memory(const GptShape& shape, const Layout& layout, const PipelinePart& part, int D, const Cluster& c,
                       const Settings& s) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(s.dtype));
  const int N = s.shard_ranks(D);
  const std::vector<UnitShape> shapes = unit_shapes(layout, s, D);
  const UnitSizes u = unit_sizes(shapes);
  MemoryPlan m;
  m.states = model_states(layout, s, D);
  // 1F1B: part k holds the activations of min(P - k, m) micro-batches at its peak.
  const int in_flight = std::min(part.pp - part.index, s.grad_accum);
  // A plan is for GPUs: the CUDA trainer's flash-style attention.
  m.activations = part_activation_bytes(shape, part, s.micro_batch, in_flight, s.activation_checkpointing,
                                        static_cast<int>(es), AttentionStore::row_statistics);
  // The gradient reducer's staging, replayed as the engine's pools hold it (reduce_buffer_bytes):
  // micro-step gradients and reduced slices of the buckets in flight, one of each size kept. The
  // all-gather of updated slices after the step (stages 1/2) writes into the full parameters in
  // place and takes no buffer.
  m.comm_buffers = reduce_buffer_bytes(layout, s, D);
  // PowerSGD's buffers, sized by the engine's own rule (PowerSgd::buffer_bytes_for).
  if (s.powersgd()) m.comm_buffers += powersgd_buffer_bytes(powersgd_elements(layout, s.compression), s);
  // qgZ: its own pool of packed messages and partial sums (the engine's MemoryReport::qgz_buffers),
  // on nodes of L ranks as plan_time takes them; nodes that do not split the ranks evenly the
  // engine refuses, and nothing is added for them.
  if (s.quantized_gradients && D % std::min(D, c.ranks_per_node()) == 0)
    m.comm_buffers += qgz_buffer_bytes(layout, s, D, c.ranks_per_node());
  // Stage 3: the gatherer's pool (ParamGatherer::peak_bytes), an upper bound. Released units are
  // kept while their next use is within stage3_max_reuse_distance elements (by default every
  // one), and prefetches stay under stage3_max_live_parameters, so the gathered elements at once
  // stay under max live plus what the trainer holds beyond it: the GPT trainer holds the
  // embeddings through the micro-step and one other unit, so two of the largest. The pool keeps
  // a freed buffer for a request of its size: for each size it holds that size times the most
  // units of it gathered at once, at most all the sharded units of that size and at most the
  // bound over the size. With the default max live this is every sharded unit, as the engine
  // holds them. Not counted: qwZ's packed messages.
  if (s.stage == 3) {
    std::map<std::int64_t, std::int64_t> sharded;  // padded elements -> sharded units of that size
    std::int64_t largest = 0, total = 0;
    for (const UnitShape& unit : shapes) {
      if (!unit.sharded_params) continue;
      const std::int64_t p = unit.padded;
      ++sharded[p];
      largest = std::max(largest, p);
      total += p;
    }
    const std::int64_t live = std::min(total, s.max_live_parameters + 2 * largest);
    for (const auto& [p, n] : sharded) m.gathered += p * std::min(n, live / p) * es;
  }
  // Offload staging in pinned host memory (the engine's MemoryReport::offload_staging): the
  // owned gradients down and parameters up; NVMe streams the state through three sub-group
  // buffers (read, step, write).
  const std::int64_t own = s.stage == 0 ? u.total_padded : u.total_padded / N;
  const std::int64_t group = std::min(s.sub_group_size, own);
  m.pinned += offload_staging_bytes(layout, s, D);
  if (s.offload_optimizer == OffloadDevice::nvme) m.pinned += 3 * group * 4 * (1 + s.moments);
  if (s.offload_param == OffloadDevice::nvme) m.pinned += 2 * u.largest_slice * es;
  m.nccl = nccl_communicators(s, D, c.ranks_per_node());
  m.nccl_bytes = m.nccl.bytes();
  m.device_overhead = kDeviceOverheadBytes + m.nccl_bytes;
  m.host_overhead = kHostOverheadBytes;
  m.gpu_bytes = m.states.device() + m.states.secondary + m.states.error_feedback + m.states.optimizer_buffers +
                m.activations + m.comm_buffers + m.gathered + m.device_overhead;
  m.host_bytes = m.states.host + m.pinned + m.host_overhead;
  m.nvme_bytes = m.states.nvme * c.ranks_per_node();
  return m;
}

// Step time of the slowest rank: `layout` is its part of the model (all of it without model
// parallelism), `params` the model's GptShape::flops_params(), D its data-parallel group's size,
// N the ranks its states are sharded over (D, or MiCS's group).
StepTime plan_time(const Layout& layout, std::int64_t params, const GptShape& shape, int D, const Cluster& c,
                   const Settings& s) {
  const int T = s.tensor_parallel, P = s.pipeline_parallel, N = s.shard_ranks(D);
  const double es = static_cast<double>(dtype_size(s.dtype));
  const UnitSizes u = unit_sizes(unit_shapes(layout, s, D));
  StepTime t;
  // Compute: 2Ψ FLOPs per token forward, 4Ψ backward, 2Ψ more to recompute with checkpointing,
  // each rank doing 1/(T x P) of them.
  const double rate = c.gpu.peak_flops * c.gpu.efficiency;
  const double tokens = static_cast<double>(s.micro_batch) * shape.seq_len;
  const double share = static_cast<double>(params) / (static_cast<double>(T) * P);
  const double fwd_c = 2.0 * share * tokens / rate;
  const double bwd_c = (s.activation_checkpointing ? 6.0 : 4.0) * share * tokens / rate;
  // Tensor parallelism: two all-reduces of the micro-batch's activations (b x s x h) per block
  // in the forward (attention and MLP outputs), two in the backward, two more when the
  // checkpointed forward is recomputed; they sit between the matmuls, so nothing hides them.
  const double act = tokens * shape.n_embd * es;
  const int blocks = PipelinePart{T, P, 0}.blocks(shape);
  const double tp_ar = T > 1 ? 2.0 * (T - 1.0) / T * act / c.group_bytes_per_s(T, 1) : 0.0;
  const double tp_fwd = 2.0 * blocks * tp_ar;
  const double tp_bwd = (s.activation_checkpointing ? 4.0 : 2.0) * blocks * tp_ar;
  // Pipeline: each micro-batch's activations go to the next part, their gradient comes back.
  const double p2p = P > 1 ? act / c.group_bytes_per_s(P, T * D) : 0.0;
  t.tp_comm_s = s.grad_accum * (tp_fwd + tp_bwd);
  t.pp_comm_s = s.grad_accum * 2 * p2p;
  const double fwd_slot_extra = tp_fwd + p2p, bwd_slot_extra = tp_bwd + p2p;
  // Ring collectives over the rank's padded part of the model within its data-parallel group:
  // all-gather and reduce-scatter move (N-1)/N of it through each rank's link, all-reduce twice that.
  const double full = static_cast<double>(u.total_padded) * es;
  const double ring = N > 1 ? (N - 1.0) / N * full / c.group_bytes_per_s(N, T) : 0.0;
  // Stages 0/1 reduce the accumulated gradient at the boundary, in its dtype (fp32: twice the
  // bytes) or the one communication_data_type rounds it to.
  const double grad_ring = ring * static_cast<double>(dtype_size(s.comm_dtype())) / es;
  // qgZ (stages 2-3) replaces each micro-step's reduce-scatter by two all-to-alls over the nodes
  // of L ranks (M of them): int8 blocks with an fp32 scale each to the L-1 node peers ((L-1)/L of
  // the gradient, over the intra-node link), then int4 blocks to the M-1 other nodes (one slice,
  // 1/D of the gradient, to each; over the rank's part of the node's NICs, every rank sending at
  // once, where a ring's one crossing has the NICs to itself). The
  // quantization passes run at memory speed and are not counted against the links' time.
  double reduce = ring;
  if (s.quantized_gradients) {
    const int L = std::min(D, c.ranks_per_node()), M = D / L;
    const double elems = static_cast<double>(u.total_padded);
    const double scale = 4.0 / static_cast<double>(s.quantized_weights_block_size);
    reduce = (L > 1 ? (L - 1.0) / L * elems * (1.0 + scale) / c.group_bytes_per_s(L, T) : 0.0) +
             (M > 1 ? (M - 1.0) / D * elems * (0.5 + scale) / c.group_bytes_per_s(M, T * L) : 0.0);
  }
  // PowerSGD (stages 0-1, from start_step on): after the last backward the plain rest and the P
  // and Q factors are all-reduced instead of the gradient, one after the other (the factors wait
  // for the compression compute), so nothing hides them. The compression compute: M Q and M^T P
  // (4 x rows x cols x r FLOPs per matrix) at the training compute's rate, and about ten fp32
  // passes over the matrices (error feedback in and out, the two products, the reduced gradient)
  // at the device's memory bandwidth, as on a GPU; the orthogonalization (rows x r^2) is left out.
  double powersgd_comm = 0;
  if (s.powersgd()) {
    const PowerSgdElements e = powersgd_elements(layout, s.compression);
    const double bytes = static_cast<double>(e.plain) * static_cast<double>(dtype_size(s.grad_dtype())) +
                         static_cast<double>(e.p + e.q) * static_cast<double>(dtype_size(s.compression.factor_dtype));
    powersgd_comm = D > 1 ? 2.0 * (D - 1.0) / D * bytes / c.group_bytes_per_s(D, T) : 0.0;
    t.compress_s = e.flops / rate + static_cast<double>(e.compressed) * 40.0 / c.gpu.hbm_bytes_per_s;
  }
  double fwd_comm = 0, bwd_comm = 0, boundary = 0, post_step = 0;
  switch (s.stage) {
    case 0: boundary = s.powersgd() ? 0.0 : 2 * grad_ring; break;  // all-reduce during the last backward
    case 1:
      boundary = s.powersgd() ? 0.0 : grad_ring;
      post_step = ring;
      break;
    case 2:
      bwd_comm = reduce;
      post_step = ring;
      break;
    case 3: {  // gather forward, gather + reduce backward
      // qwZ sends int8 values and an fp32 scale per block instead of the compute dtype; hpZ
      // re-gathers in the backward inside its group (normally the node) from secondary shards.
      const double q =
          s.quantized_weights ? (1.0 + 4.0 / static_cast<double>(s.quantized_weights_block_size)) / es : 1.0;
      const int H = s.hpz_partition_size;
      const double regather = H > 1 ? (H - 1.0) / H * full / c.group_bytes_per_s(H, T) : q * ring;
      fwd_comm = q * ring;
      bwd_comm = regather + reduce;
      break;
    }
  }
  // MiCS: once per step, after the last backward, each rank's accumulated gradient slice is
  // all-reduced over the D / N groups (ranks N x T apart), in the gradients' dtype.
  const int R = D / N;
  if (R > 1 && s.stage >= 1)
    boundary += 2.0 * (R - 1.0) / R * (full / N) * static_cast<double>(dtype_size(s.grad_dtype())) / es /
                c.group_bytes_per_s(R, T * N);
  // The tied embedding's gradient (vocabulary / T rows) is all-reduced between the first and the
  // last pipeline part after the pipeline drains, before the step: two ranks, nothing to hide it behind.
  // (A 2-rank all-reduce moves the whole gradient through each rank's link once.)
  const double tied = P > 1 && shape.tied_head
                          ? static_cast<double>(shape.padded_vocab()) / T * shape.n_embd *
                                static_cast<double>(dtype_size(s.grad_dtype())) / c.group_bytes_per_s(P, T * D)
                          : 0.0;
  t.pp_comm_s += tied;
  post_step += powersgd_comm;
  t.comm_s = s.grad_accum * (fwd_comm + bwd_comm) + boundary + post_step + t.tp_comm_s + t.pp_comm_s;
  post_step += tied;
  // Parameter slices that live off the device travel each gather (forward and backward) and are
  // written back after the step; the prefetch overlaps the reads like a collective.
  const double slice_bytes = full / N;
  double param_io = 0, param_write = 0;
  if (s.stage == 3 && s.offload_param == OffloadDevice::nvme) {
    param_io = slice_bytes * c.ranks_per_node() / c.nvme_bytes_per_s;
    param_write = param_io;
  } else if (s.stage == 3 && s.offload_param == OffloadDevice::cpu) {
    param_io = slice_bytes / c.gpu.pcie_bytes_per_s;
    param_write = param_io;
  }
  fwd_comm += param_io;
  bwd_comm += param_io;
  auto micro_time = [&](double extra_bwd) {
    const double f = fwd_c + fwd_slot_extra, b = bwd_c + bwd_slot_extra;
    if (!s.overlap_comm) return f + b + fwd_comm + bwd_comm + extra_bwd;
    return std::max(f, fwd_comm) + std::max(b, bwd_comm + extra_bwd);
  };
  // 1F1B: m micro-batch slots plus P - 1 of fill and drain, each a forward and a backward.
  t.bubble = pipeline_bubble(P, s.grad_accum);
  t.bubble_s = (P - 1) * micro_time(0);
  const double micro_steps = (s.grad_accum - 1) * micro_time(0) + micro_time(boundary) + t.bubble_s;
  t.compute_s = s.grad_accum * (fwd_c + bwd_c);
  // Optimizer step over the owned elements.
  const double own = s.stage == 0 ? static_cast<double>(u.total_padded) : static_cast<double>(u.total_padded) / N;
  double opt_offload = 0;
  if (s.offload_optimizer == OffloadDevice::none) {
    const double grad_extra = static_cast<double>(dtype_size(s.grad_dtype())) - 2.0;
    t.optimizer_s = own * (kDeviceAdamBytes + grad_extra) / c.gpu.hbm_bytes_per_s;
  } else {
    const double adam_rate = c.host_mem_bytes_per_s / c.ranks_per_node() / kHostAdamBytes;
    t.optimizer_s = own / adam_rate;
    const double pcie = 2 * own * es / c.gpu.pcie_bytes_per_s;  // gradients down, parameters up
    double swap = 0;
    if (s.offload_optimizer == OffloadDevice::nvme)  // read and write master + moments, node-wide
      swap = 2 * own * 4 * (1 + s.moments) * c.ranks_per_node() / c.nvme_bytes_per_s;
    // The swap pipeline overlaps reading and writing with the host AdamW: only the excess shows.
    opt_offload = pcie + std::max(0.0, swap - t.optimizer_s);
  }
  // Muon: each matrix's owner runs Newton-Schulz on the whole matrix (the optimizer's own dealing
  // out over the N partition ranks; at stage 0 every rank runs them all), at the training
  // compute's rate; a matrix cut by tensor parallelism is computed by one of the T tensor ranks,
  // counted here as 1/T on each. The slowest rank's share.
  if (s.optimizer.type == OptimizerType::muon) {
    std::vector<double> flops(static_cast<std::size_t>(N), 0.0);
    double all = 0.0;
    for (const MuonOwner& m : muon_owners(layout, N, T)) {
      const double f = newton_schulz_flops(m.rows, m.cols, s.optimizer.ns_steps) / (m.split ? T : 1);
      flops[static_cast<std::size_t>(m.owner)] += f;
      all += f;
    }
    t.newton_schulz_s = (s.stage == 0 ? all : *std::max_element(flops.begin(), flops.end())) / rate;
    t.optimizer_s += t.newton_schulz_s;
  }
  t.offload_s = opt_offload + param_write + s.grad_accum * 2 * param_io;
  t.step_s = micro_steps + post_step + t.compress_s + param_write + t.optimizer_s + opt_offload;
  // Exposed: what the step spends beyond compute and the bubble (TP and PP traffic included).
  t.exposed_comm_s = std::max(0.0, micro_steps - t.bubble_s - t.compute_s) + post_step;
  return t;
}

}  // namespace

Plan make_plan(const GptShape& shape, const Cluster& c, const Settings& s, double token_budget) {
  ZERO_CHECK(c.gpus >= 1 && c.gpus_per_node >= 1, "zero-plan: the cluster needs at least one GPU and one GPU per node");
  ZERO_CHECK(s.stage >= 0 && s.stage <= 3, fmt::format("zero-plan: stage must be 0..3 (got {})", s.stage));
  ZERO_CHECK(s.micro_batch >= 1 && s.grad_accum >= 1, "zero-plan: micro-batch and accumulation must be >= 1");
  ZERO_CHECK(s.offload_param == OffloadDevice::none || s.stage == 3,
             fmt::format("zero-plan: parameter offload exists only at stage 3 (got stage {})", s.stage));
  ZERO_CHECK(s.offload_optimizer == OffloadDevice::none || s.stage >= 1,
             "zero-plan: optimizer offload needs stage >= 1, as the engine does");
  const int T = s.tensor_parallel, P = s.pipeline_parallel;
  ZERO_CHECK(T >= 1 && P >= 1 && c.gpus % (T * P) == 0,
             fmt::format("zero-plan: {} GPUs do not divide into tensor {} x pipeline {} groups; the data-parallel "
                         "size is GPUs / (T x P), so pick T x P that divides the GPU count",
                         c.gpus, T, P));
  ZERO_CHECK(P == 1 || s.stage <= 1,
             fmt::format("zero-plan: ZeRO stage {} with pipeline parallelism {} is refused, as DeepSpeed refuses it: "
                         "a pipeline part's gradients are reduced once per micro-batch under 1F1B, which stages 2-3 "
                         "would have to partition and gather each time; use stage 0 or 1 with a pipeline",
                         s.stage, P));
  check_split(shape, T, P);
  const int D = c.gpus / (T * P);
  ZERO_CHECK((s.hpz_partition_size == 1 && !s.quantized_weights) || s.stage == 3,
             "zero-plan: hpZ and qwZ (ZeRO++) gather parameters, which only stage 3 does; use --stage 3");
  ZERO_CHECK(s.hpz_partition_size >= 1 && D % s.hpz_partition_size == 0,
             fmt::format("zero-plan: the hpZ group of {} ranks does not divide the {} data-parallel ranks",
                         s.hpz_partition_size, D));
  check_groups(s, D);
  Plan p;
  p.shape = shape;
  p.params = gpt_layout(shape).num_params();
  p.settings = s;
  p.data_parallel = D;
  p.token_budget = token_budget;
  // The first part holds the embedding and P micro-batches in flight, the last the head and
  // the logits: the rank that needs more memory is one of them, and the one with the larger
  // part of the model has the longest optimizer step and data-parallel collectives.
  const PipelinePart first{T, P, 0}, last{T, P, P - 1};
  const Layout first_layout = gpt_part_layout(shape, first);
  p.memory = plan_memory(shape, first_layout, first, D, c, s);
  const Layout* slow = &first_layout;
  Layout last_layout;
  if (P > 1) {
    last_layout = gpt_part_layout(shape, last);
    const MemoryPlan m = plan_memory(shape, last_layout, last, D, c, s);
    if (m.gpu_bytes > p.memory.gpu_bytes) {
      p.memory = m;
      p.memory_part = P - 1;
    }
    if (last_layout.num_params() > first_layout.num_params()) slow = &last_layout;
  }
  p.time = plan_time(*slow, shape.flops_params(), shape, D, c, s);

  std::vector<std::string> over;
  if (static_cast<double>(p.memory.gpu_bytes) > c.gpu.memory_bytes)
    over.push_back(over_text("GPU memory", static_cast<double>(p.memory.gpu_bytes), c.gpu.memory_bytes));
  if (static_cast<double>(p.memory.host_bytes) > c.host_bytes_per_gpu)
    over.push_back(over_text("host memory per GPU", static_cast<double>(p.memory.host_bytes), c.host_bytes_per_gpu));
  if (static_cast<double>(p.memory.nvme_bytes) > c.nvme_bytes_per_node)
    over.push_back(over_text("NVMe per node", static_cast<double>(p.memory.nvme_bytes), c.nvme_bytes_per_node));
  p.fits = over.empty();
  for (const auto& o : over) p.why += (p.why.empty() ? "" : "; ") + o;

  const double F = s.activation_checkpointing ? 8.0 : 6.0;
  p.tokens_per_step = static_cast<double>(s.micro_batch) * s.grad_accum * shape.seq_len * D;
  p.tokens_per_s = p.tokens_per_step / p.time.step_s;
  p.tflops_per_gpu = static_cast<double>(shape.flops_params()) * F * p.tokens_per_s / (c.gpus * 1e12);
  p.days = token_budget / p.tokens_per_s / 86400.0;
  return p;
}

}  // namespace zero::plan
