// Planning: what fits, how fast and how many days, decided before any cluster time is spent; pure
// arithmetic (no MPI, no devices). What it models and how: docs/architecture.md, note planner
// (usage: docs/zero-plan.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/layout.hpp"

namespace zero::plan {

// ---- Models --------------------------------------------------------------------------------

// The decoder architectures the trainer builds (model.arch). Each is a set of choices on one
// pre-norm decoder block; the predicates of GptShape below name them, and the units, tensor
// names, shapes and the tensor-parallel cut all follow from them:
//   gpt2:  LayerNorm with bias, learned positions (wpe), GELU MLP of 4C, biases, tied head.
//   bloom: gpt2's block with ALiBi attention biases instead of wpe (Press et al.; slopes as
//          BLOOM computes them for any head count) and a LayerNorm on the word embeddings.
//   llama: RMSNorm (norm_eps), rotary positions (rope_theta, rotate-half), SwiGLU MLP of
//          ffn_hidden, grouped-query attention (n_kv_head), no biases, head tied or not.
enum class Arch { gpt2, bloom, llama };
std::string_view arch_name(Arch arch);
// "gpt2" | "bloom" | "llama"; anything else is a zero::Error listing them.
Arch parse_arch(std::string_view name);

// A decoder shape: the unit structure of examples/gpt (embeddings, one unit per block, ln_f
// with the head when it is not tied), vocabulary padded to a multiple of 128 as the trainer does.
struct GptShape {
  std::string name;  // preset name, or empty
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int seq_len = 1024;
  int vocab_size = 50257;
  Arch arch = Arch::gpt2;
  int n_kv_head = 0;        // key/value heads (llama's grouped-query attention); 0: n_head
  int ffn_hidden = 0;       // the MLP's hidden width; 0: 4 n_embd
  bool tied_head = true;    // the LM head is the token embedding (llama may untie it)
  double norm_eps = 1e-5;   // llama's RMSNorm epsilon (the LayerNorms use 1e-5)
  double rope_theta = 1e4;  // llama's rotary base

  std::int64_t padded_vocab() const { return (std::int64_t{vocab_size} + 127) / 128 * 128; }
  std::int64_t num_params() const;  // Ψ, as Layout::num_params() of gpt_layout()
  // The parameters the training FLOPs count, 6 per token each (llm.c's 6N): all but an untied
  // input embedding, a lookup (a tied one is also the head's product).
  std::int64_t flops_params() const { return num_params() - (tied_head ? 0 : padded_vocab() * n_embd); }
  void validate() const;  // throws zero::Error naming the bad field

  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return n_embd / n_head; }
  std::int64_t mlp_hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * std::int64_t{n_embd}; }
  // Columns of the fused attention input product: q for every head, k and v for every key/value
  // head. Inside it q's heads are ordered replica-major (q head r * n_kv_head + g reads key/value
  // head g), so that cutting each of its (n_head / n_kv_head + 2) equal blocks T ways gives every
  // tensor rank whole query groups with their key/value heads (the Hugging Face order, g *
  // (n_head / n_kv_head) + r, is restored on export).
  std::int64_t qkv_width() const { return std::int64_t{n_head + 2 * kv_heads()} * head_size(); }
  int qkv_blocks() const { return n_head / kv_heads() + 2; }
  // Under tensor parallelism T each rank computes n_head / T query heads. When T divides the
  // key/value heads it holds whole query groups with theirs (qkv_width() / T columns); when the
  // key/value heads divide T instead, each is replicated on T / n_kv_head ranks, and a rank's
  // heads are n_head / T queries of one group with its key and value head.
  bool kv_replicated(int tp) const { return kv_heads() % tp != 0; }
  std::int64_t qkv_part_width(int tp) const {
    return kv_replicated(tp) ? std::int64_t{n_head / tp + 2} * head_size() : qkv_width() / tp;
  }
  bool biases() const { return arch != Arch::llama; }
  bool rms_norm() const { return arch == Arch::llama; }
  bool learned_positions() const { return arch == Arch::gpt2; }
  bool rotary() const { return arch == Arch::llama; }
  bool alibi() const { return arch == Arch::bloom; }
  bool embedding_norm() const { return arch == Arch::bloom; }
  bool gated_mlp() const { return arch == Arch::llama; }
};

// Presets: the GPT-2 sizes, BLOOM's and Llama's, and a few GPT-3-like sizes used by the
// validation.
const std::vector<GptShape>& gpt_presets();
GptShape gpt_preset(std::string_view name);  // throws, listing the presets, when unknown
Layout gpt_layout(const GptShape& shape);

// A shape family for --max-model and bare parameter counts: head size 128 (or fewer heads for
// narrow models), width a multiple of 128, depth n_embd / aspect unless fixed.
struct GptFamily {
  int aspect = 128;  // n_embd / n_layer (GPT-3's 175B and 13B sit at 128)
  int n_layer = 0;   // > 0: fixed depth, only the width grows
  int seq_len = 1024;
  int vocab_size = 50257;
  GptShape shape(int n_embd) const;
  // The family member whose parameter count is closest to `params`.
  GptShape closest(double params) const;
};

// How the GPT trainer's attention keeps what its backward needs.
enum class AttentionStore {
  probabilities,  // the host trainer: [B, NH, T, T] fp32 probabilities, and their gradient
  row_statistics  // the CUDA trainer (flash-style): one fp32 log-sum-exp per row, recomputed
};

// Activation bytes per rank of the GPT trainer's forward + backward for a micro-batch of `micro`
// sequences, elements of `element_bytes` (4 for the host trainer's fp32, 2 for the CUDA
// trainer's bf16); LayerNorm and attention statistics and the losses are fp32 in both.
// Mirrors what GptModel allocates: per block the LayerNorm outputs and statistics, qkv, the
// attention output and statistics, the MLP hidden layer (before and after GELU) — kept for
// every block, or for one block with activation checkpointing — plus the residual stream at
// each block boundary, ln_f, the logits over the padded vocabulary and the backward's scratch.
// Token ids are int32.
std::int64_t activation_bytes(const GptShape& shape, int micro, bool checkpointing, int element_bytes,
                              AttentionStore attention);

// One rank's part of the model under tensor parallelism T and pipeline parallelism P, Megatron's
// split: column-parallel QKV and MLP up-projection (weights and biases / T), row-parallel
// projections (weights / T, biases and LayerNorms replicated), attention heads / T, a
// vocabulary-parallel embedding (wte / T; wpe replicated); blocks in P contiguous pipeline parts,
// the first L % P parts one block more; the embedding in the first part, ln_f and the tied head
// (its own copy of wte / T when P > 1) in the last. `index` is the part's place in 0..P-1.
struct PipelinePart {
  int tp = 1, pp = 1, index = 0;
  int blocks(const GptShape& shape) const;  // blocks in this part
  bool first() const { return index == 0; }
  bool last() const { return index == pp - 1; }
};
// Throws zero::Error when the shape cannot be split so: n_head or the padded vocabulary not a
// multiple of T, n_kv_head and T dividing neither way, more pipeline parts than blocks.
void check_split(const GptShape& shape, int tp, int pp);
// How tensor parallelism T cuts parameter `name` (a name of gpt_layout's): along `axis` in
// `blocks` equal blocks, each cut T ways (q | k | v in qkv_blocks(), SwiGLU's gate | up in 2, the
// attention output's rows in n_head / n_kv_head), or replicated (norms, wpe, row-parallel biases;
// and the attention's two projections when the key/value heads are replicated, kv_replicated(T):
// each rank then uses the columns and rows of its own heads, and the model sums their gradients
// over the tensor group).
struct TensorCut {
  bool replicated = false;
  int axis = -1;
  int blocks = 1;
};
TensorCut gpt_tensor_cut(const GptShape& shape, std::string_view name, int tp);
// The part's shapes are the whole ones cut by gpt_tensor_cut; with T > 1 each parameter is also
// marked split or replicated (Layout::set_split / set_replicated), as checkpoints record it.
// wte (and the tied head's copy), wpe and lm_head are marked as embeddings (Muon steps them with
// AdamW).
Layout gpt_part_layout(const GptShape& shape, const PipelinePart& part);
// Activation bytes of one rank of that part with `in_flight` micro-batches held for the backward
// (1F1B: min(P - index, m)): what each micro-batch keeps (block buffers, or only the residual
// stream at block boundaries under checkpointing; tensors split by TP as Megatron's are: qkv,
// attention output, the MLP hidden layer and the logits / T, the rest replicated) times
// in_flight, plus what exists once (the recomputed block, the backward's scratch).
// PipelinePart{} with in_flight 1 is activation_bytes() above.
std::int64_t part_activation_bytes(const GptShape& shape, const PipelinePart& part, int micro, int in_flight,
                                   bool checkpointing, int element_bytes, AttentionStore attention);
// The pipeline bubble of a 1F1B schedule: (P - 1) / (m + P - 1).
double pipeline_bubble(int pp, int micro_batches);

// ---- Hardware ------------------------------------------------------------------------------

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;        // usable device memory
  double peak_flops = 0;          // dense 16-bit tensor peak, FLOP/s
  double efficiency = 0;          // fraction of peak the training compute reaches
  double hbm_bytes_per_s = 0;     // device memory bandwidth (the on-device optimizer step)
  double pcie_bytes_per_s = 0;    // host <-> device, one direction
  double nvlink_bytes_per_s = 0;  // default intra-node bus bandwidth per GPU
};

// Built-in presets: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-SXM, H200.
// `efficiency` is the one calibrated figure (bench/RESULTS.md): the same default for every kind
// until a measured MFU replaces it.
const std::vector<GpuSpec>& gpu_presets();
// A preset by name, first among `extra` (user YAML), then the built-in ones.
GpuSpec gpu_preset(std::string_view name, const std::vector<GpuSpec>& extra = {});
// The built-in preset of a CUDA device, from the name and memory the driver reports
// (cudaDeviceProp::name, totalGlobalMem): "NVIDIA H100 80GB HBM3" is H100-SXM, "NVIDIA A100-SXM4-40GB"
// A100-40GB. Empty when no preset describes it (an H100 PCIe, whose peak differs from the SXM
// part's, or any other kind): callers then ask the user for the figure.
std::optional<GpuSpec> gpu_preset_for_device(std::string_view device_name, double memory_bytes);
// User presets from YAML: a list (or a map under `gpus:`) of entries with name, memory_gb,
// peak_tflops, efficiency, hbm_gbps, pcie_gbps, nvlink_gbps; a field left out copies `base`
// (a built-in preset name) or is an error. Throws with the file and the bad key.
std::vector<GpuSpec> load_gpu_presets(const std::string& path);

struct Cluster {
  GpuSpec gpu;
  int gpus = 1;
  int gpus_per_node = 8;
  double intra_node_bytes_per_s = 0;     // per GPU; 0: the GPU's NVLink figure
  double inter_node_bytes_per_s = 25e9;  // per node (all its NICs)
  double host_bytes_per_gpu = 64e9;      // host memory available to each rank
  double host_mem_bytes_per_s = 200e9;   // per node, shared by the host AdamW of its ranks
  double nvme_bytes_per_node = 0;        // 0: no NVMe
  double nvme_bytes_per_s = 6e9;         // per node, read or write
  int nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
  int ranks_per_node() const { return gpus < gpus_per_node ? gpus : gpus_per_node; }
  // Bus bandwidth of a ring over all ranks: NVLink inside a node, the NICs between nodes.
  double ring_bytes_per_s() const;
  // Bandwidth per rank of one of the concurrent groups of `size` ranks spaced `stride` apart in
  // the global rank order (TP: stride 1; DP: T; PP: T x D): NVLink when the group stays inside a
  // node, else the node's NICs shared by every group that leaves it at once.
  double group_bytes_per_s(int size, int stride) const;
};

// ---- Settings ------------------------------------------------------------------------------

struct Settings {
  int stage = 0;
  OffloadDevice offload_optimizer = OffloadDevice::none;
  // nvme at stage 3 as the engine does; cpu is DeepSpeed's host-resident parameter slice, which
  // the planner models for comparisons although libzero's CUDA backend keeps params on device.
  OffloadDevice offload_param = OffloadDevice::none;
  int micro_batch = 1;
  int grad_accum = 1;
  bool activation_checkpointing = false;
  DType dtype = DType::bf16;
  // data_types.grad_accum_dtype; automatic follows the CUDA backend's rule (a plan is for GPUs).
  GradAccumDType grad_accum_dtype = GradAccumDType::automatic;
  // communication_data_type: what stages 0/1 reduce fp32-accumulated gradients in.
  CommDataType communication_data_type = CommDataType::automatic;
  int moments = 2;  // fp32 state arrays per element besides the master (zero/optim.hpp)
  // The optimizer: its statistics and Muon's matrix exchange add to a step's traffic.
  OptimizerConfig optimizer;
  std::int64_t reduce_bucket_size = 500000000;
  std::int64_t allgather_bucket_size = 500000000;
  std::int64_t prefetch_bucket_size = 50000000;
  std::int64_t max_live_parameters = 1000000000;
  std::int64_t persistence_threshold = 100000;
  std::int64_t sub_group_size = 1000000000;
  bool overlap_comm = true;
  int tensor_parallel = 1;    // T
  int pipeline_parallel = 1;  // P; the data-parallel size is GPUs / (T x P)
  // What changes which links the collectives use (step_traffic below).
  bool reduce_scatter = true;
  std::int64_t max_reuse_distance = 1000000000;     // stage3_max_reuse_distance
  int hpz_partition_size = 1;                       // zero_hpz_partition_size
  bool quantized_weights = false;                   // zero_quantized_weights
  std::int64_t quantized_weights_block_size = 256;  // qwZ's and qgZ's
  bool quantized_gradients = false;                 // zero_quantized_gradients (qgZ), stages 2-3
  // MiCS (zero_optimization.mics_shard_size, stages 1-3): model states sharded over groups of
  // this many data-parallel ranks, replicated across them; -1: over every data-parallel rank.
  int mics_shard_size = -1;
  // PowerSGD (gradient_compression, stages 0-1, not with MiCS): type powersgd turns it on; the
  // plan models a step from start_step on (engine/powersgd.hpp: the factors all-reduced instead
  // of the matrices' gradients).
  GradientCompressionConfig compression;
  bool powersgd() const { return compression.type == CompressionType::powersgd; }
  // The ranks model states are sharded over, for a data-parallel group of `data_parallel`.
  int shard_ranks(int data_parallel) const { return mics_shard_size > 0 ? mics_shard_size : data_parallel; }
  std::string label() const;  // "stage 3, offload cpu, mb 4, ckpt"
  // The dtype gradients accumulate in: fp32 with accumulation over 16-bit compute by default.
  DType grad_dtype() const { return grad_accum_dtype_for(grad_accum_dtype, dtype, grad_accum, BackendKind::cuda); }
  // What stages 0/1 reduce the accumulated gradients in (communication_dtype_for).
  DType comm_dtype() const { return communication_dtype_for(communication_data_type, dtype, grad_dtype()); }
};

// The settings a resolved-or-not Config asks for (batch fields that are 0 stay at 1).
Settings settings_from(const Config& cfg);

// ---- Memory --------------------------------------------------------------------------------

// Model states per rank, the engine's MemoryReport categories: params + grads + master +
// optimizer is MemoryReport::model_state(); host and nvme are the bytes the offload moved away
// (tensor bytes, before the pinned pool's or the swapper's rounding); secondary is hpZ's
// MemoryReport::secondary, device memory besides the model states.
struct ModelStates {
  std::int64_t params = 0, grads = 0, master = 0, optimizer = 0;
  std::int64_t host = 0, nvme = 0;
  std::int64_t secondary = 0;
  std::int64_t error_feedback = 0;  // qgZ's fp32 buffers: MemoryReport::error_feedback
  // The 1-bit optimizers' exchange buffers and OneBitLamb's values per tensor, where the state
  // is stepped (the host backend's memory): MemoryReport::optimizer_buffers.
  std::int64_t optimizer_buffers = 0;
  std::int64_t device() const { return params + grads + master + optimizer; }
};
// `world`: the data-parallel ranks. With MiCS the states are sharded over its groups
// (Settings::shard_ranks): the stage formulas with mics_shard_size in place of the world. hpZ
// adds one chunk of every sharded unit: 1/hpz_partition_size of it in the compute dtype. qgZ
// keeps in fp32 all that a rank sends of every unit's gradient, (L-1) M + (M-1) = world - 1
// slices for M nodes of L ranks, whatever the node layout. The 1-bit optimizers' buffers are
// the engine's own size rule (optimizer_buffer_bytes).
ModelStates model_states(const Layout& layout, const Settings& s, int world);
// Throws zero::Error unless the engine accepts the MiCS setting at this stage and data-parallel
// size (stages 1-3, a divisor, not with hpZ; named after the config key), and qgZ's (stages
// 2-3, reduce_scatter on, not with MiCS), and PowerSGD's (stages 0-1, not with MiCS).
void check_groups(const Settings& s, int data_parallel);

// The bytes qgZ's scratch takes at most (zero_quantized_gradients, stages 2-3): the packed
// int8/int4 messages and fp32 partial sums of its two all-to-alls, in the backend's (device)
// memory, as its buffer pool holds them (freed buffers kept for reuse included);
// MemoryReport::qgz_buffers, a part of comm_buffers. `data_parallel` ranks on nodes of
// `ranks_per_node` (L = the smaller of the two, M = data_parallel / L nodes; an uneven split is
// an error, as in the engine), gradients reduced in the GPT trainer's order (the units
// backwards, each micro-step) into buckets of reduce_bucket_size, overlap_comm keeping one
// bucket in flight. Equals the engine's figure after a step; 0 without qgZ.
std::int64_t qgz_buffer_bytes(const Layout& layout, const Settings& s, int data_parallel, int ranks_per_node);

// The bytes the gradient reducer's pools hold at most: micro-step gradients waiting for their
// reduction and the reduced slices (stage 1 with reduce_scatter, stages 2-3; at stages 0-1 with
// fp32 accumulation under a 16-bit dtype, one micro-step gradient of each unit size), in the
// backend's (device) memory, freed buffers kept for reuse included; engine.memory().comm_buffers
// less qgZ's pool (qgz_buffer_bytes) and PowerSGD's buffers. Same reduce order, buckets and
// overlap as qgz_buffer_bytes, each unit's gradient written just before its reduction. Equals
// the engine's figure after a step.
std::int64_t reduce_buffer_bytes(const Layout& layout, const Settings& s, int data_parallel);

// Every figure per rank except nvme, which is per node (what must fit on the node's drives).
// Device memory per NCCL communicator (its channels' buffers and its proxy), an allowance until
// a GPU run measures it: public reports put a communicator of its own at 0.5 to 1.6 GB, and this
// takes the low end. One split from the backend's with resource sharing (ncclCommSplit with
// splitShare) reuses the parent's proxy and connections' buffers: a quarter of that, an estimate.
inline constexpr std::int64_t kNcclCommBytes = 512LL << 20;
inline constexpr std::int64_t kNcclSharedCommBytes = 128LL << 20;
// The NCCL communicators one rank of a plan's grid creates on the CUDA backend (comm: nccl),
// as the engine and the GPT trainer create them: the backend's over the data-parallel group (or
// MiCS's shard group), MiCS's replica group, the trainer's tensor group and its pipeline group
// each of their own; hpZ's group and qgZ's node and cross-node groups split from the backend's
// (engine: Backend::split_comm). One-rank groups get none.
struct NcclCommunicators {
  int own = 0, shared = 0;
  std::int64_t bytes() const { return own * kNcclCommBytes + shared * kNcclSharedCommBytes; }
};
NcclCommunicators nccl_communicators(const Settings& s, int data_parallel, int ranks_per_node);

// Host bytes that stage offloaded optimizer steps (MemoryReport::offload_staging), for a data-
// parallel group of `data_parallel`: with optimizer offload, every owned element's gradient and
// parameter (grad_dtype and dtype), whatever the optimizer, as the device backend's staging holds
// them; with parameters offloaded too, one sub-group's (the engine then copies through one buffer).
std::int64_t offload_staging_bytes(const Layout& layout, const Settings& s, int data_parallel);

struct MemoryPlan {
  ModelStates states;
  std::int64_t activations = 0;
  std::int64_t comm_buffers = 0;
  std::int64_t gathered = 0;         // stage 3: an upper bound on the gatherer's pool (kept + prefetched)
  std::int64_t pinned = 0;           // offload staging (offload_staging_bytes) / swap buffers in host memory
  std::int64_t device_overhead = 0;  // kDeviceOverheadBytes + nccl_bytes
  std::int64_t host_overhead = 0;
  // The NCCL communicators a rank creates (nccl_communicators) and their allowance, in
  // device_overhead.
  NcclCommunicators nccl;
  std::int64_t nccl_bytes = 0;
  std::int64_t gpu_bytes = 0, host_bytes = 0, nvme_bytes = 0;
};
// Stated per-process overheads: CUDA context, cuBLAS workspaces and allocator slack on the
// device; the process, MPI and the data loader on the host.
inline constexpr std::int64_t kDeviceOverheadBytes = 2LL << 30;
inline constexpr std::int64_t kHostOverheadBytes = 4LL << 30;

// ---- Traffic ------------------------------------------------------------------------------

// The bytes rank `rank` of `world` data-parallel ranks sends in one optimizer step, inside its
// node and to other nodes (nodes of `ranks_per_node` consecutive ranks), counted as the
// communicators count them (zero::TrafficBytes: the ring model, each rank sending to the next):
// the gradient reductions, the norm and agreement scalars, the trainer's mean loss, the
// after-step all-gather, and at
// stage 3 the parameter gathers in the GPT trainer's order (embeddings, blocks, ln_f; then
// ln_f and the blocks backwards, the embeddings held for the whole micro-step) with the
// gatherer's keep rule (stage3_max_reuse_distance), hpZ's in-group re-gathers and qwZ's int8
// packing; PowerSGD's (stages 0-1, a step from start_step on) finiteness scalar and its plain,
// P and Q all-reduces in place of the gradient all-reduce; qgZ's two all-to-alls per unit and micro-step in place of
// the reduce-scatter (int8 blocks to the L-1 node peers, M slices each; int4 blocks to the M-1 other nodes, one slice
// each; every message rounded up to whole 4-byte words, as quant::packed_bytes); with MiCS all of that inside the
// rank's group, plus the replicas' all-reduce of each gradient slice and of the norm. A steady-state step: the run's
// first micro-step records the gather order and keeps nothing, so the first step gathers more. Equals Engine::traffic()
// over such a step (tested against the GPT trainer). Data-parallel only: a grid with T or P > 1 is not modelled here.
// The bytes rank `rank` sends over its tensor group (s.tensor_parallel consecutive ranks, nodes
// of `ranks_per_node`) in one optimizer step for the optimizer's statistics of the tensors split
// by tensor parallelism (Lamb, Adafactor: optimizer_exchange's tensor_doubles, all-gathered as
// fp32 pairs) and for Muon's matrices cut by it (per unit, the parts of those this rank
// orthogonalises all-gathered and the whole results all-reduced, in fp32: tensor_matrix_floats),
// as the group's communicator counts them; `layout` is the rank's part of the model, and
// `data_parallel` the size of its data-parallel group (Muon's owners depend on the rank's place
// in it: the grid orders tensor fastest, then data). The trainer's activation all-reduces over
// the same group are not in it (step time: tp_comm_s).
TrafficBytes tensor_group_traffic(const Layout& layout, const Settings& s, int data_parallel, int ranks_per_node,
                                  int rank);
TrafficBytes step_traffic(const Layout& layout, const Settings& s, int world, int ranks_per_node, int rank);

// PowerSGD's all-reduces in a compressed step (engine/powersgd.hpp, powersgd_rank): the P factors
// (rows x r of every compressed matrix) and the Q factors (cols x r), each one all-reduce in
// factor_dtype; the parameters left plain (vectors, matrices that would not shrink), one
// all-reduce in the gradients' dtype; and the elements the compressed matrices hold.
struct PowerSgdElements {
  std::int64_t p = 0, q = 0, plain = 0, compressed = 0;
  double flops = 0;  // M Q and M^T P: 4 x rows x cols x r per matrix
};
PowerSgdElements powersgd_elements(const Layout& layout, const GradientCompressionConfig& cfg);

// ---- Time and the whole plan ---------------------------------------------------------------

struct StepTime {
  double compute_s = 0;  // forward + backward (+ recompute) of every micro-step
  double comm_s = 0;     // all collective time, hidden or not
  double exposed_comm_s = 0;
  double offload_s = 0;  // PCIe, NVMe and host AdamW time
  double optimizer_s = 0;
  double compress_s = 0;       // PowerSGD's compression compute, after the last backward
  double newton_schulz_s = 0;  // Muon's orthogonalisation (part of optimizer_s)
  double tp_comm_s = 0;        // tensor-parallel all-reduces (on the critical path)
  double pp_comm_s = 0;        // pipeline sends of activations and their gradients
  double bubble_s = 0;         // pipeline fill and drain: (P - 1) micro-batch slots
  double bubble = 0;           // its fraction of the pipeline: (P - 1) / (m + P - 1)
  double step_s = 0;
};

struct Plan {
  GptShape shape;
  std::int64_t params = 0;
  Settings settings;
  MemoryPlan memory;    // of the rank that needs the most GPU memory (first or last part)
  int memory_part = 0;  // that rank's pipeline part
  int data_parallel = 1;
  StepTime time;
  bool fits = false;
  std::string why;  // what does not fit, when !fits
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // params × (6 or 8) × tokens / (s × GPUs), the trainer's formula
  double days = 0;            // for token_budget
  double token_budget = 0;
};

Plan make_plan(const GptShape& shape, const Cluster& cluster, const Settings& s, double token_budget = 100e9);

// Settings left open: each list holds the values to try (one value = fixed).
struct SettingsSpace {
  Settings base;
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<OffloadDevice> offload_optimizer{OffloadDevice::none};
  std::vector<OffloadDevice> offload_param{OffloadDevice::none};
  std::vector<int> micro_batches{1, 2, 4, 8, 16, 32};
  std::vector<bool> checkpointing{false, true};
  std::vector<int> tensor_parallel{1};
  std::vector<int> pipeline_parallel{1};
  // ZeRO++ at stage 3: hpZ group sizes (1: off; a size must divide the data-parallel group)
  // and qwZ off/on. Other stages take only the first hpZ size 1 and qwZ off.
  std::vector<int> hpz_partition_size{1};
  std::vector<bool> quantized_weights{false};
  // Across nodes, each empty = base's value: qgZ off/on (stages 2-3, no grid), MiCS shard sizes
  // (-1: off; stages 1-3, a divisor of the data-parallel size, not with hpZ) and PowerSGD ranks
  // (0: off; stages 0-1, no grid, not with MiCS; base.compression's other fields). A listed value
  // that does not apply is skipped; base's qgZ or PowerSGD is off where it does not apply.
  std::vector<bool> quantized_gradients;
  std::vector<int> mics_shard_size;
  std::vector<int> powersgd_rank;
  // > 0: sequences per optimizer step over all ranks; each micro-batch then gets the
  // accumulation that comes closest (at least 1), instead of base.grad_accum.
  std::int64_t global_batch = 0;
  // Every combination for `gpus` ranks, skipping those the engine rejects and grids that do not
  // divide `gpus` (or pipelines at stages 2-3).
  std::vector<Settings> expand(int gpus) const;
};

// Every combination that fits, fastest first (ties: less GPU memory first).
std::vector<Plan> rank_plans(const GptShape& shape, const Cluster& cluster, const SettingsSpace& space,
                             double token_budget = 100e9);

struct MaxModel {
  bool found = false;
  Plan best;  // the fastest fitting plan of the largest shape
};
// The largest member of `family` for which some setting of `space` fits.
MaxModel max_model(const GptFamily& family, const Cluster& cluster, const SettingsSpace& space,
                   double token_budget = 100e9);

}  // namespace zero::plan
