// Pipeline parallelism for the GPT trainer (model.pipeline_parallel: P).
//
// The n_layer blocks are cut into P contiguous parts, the first n_layer mod P parts taking one
// block more than the others (8 blocks in 3 parts: 3, 3, 2). The first part also holds the
// embeddings, the last ln_f and the LM head. An untied head (llama's lm_head.weight) is part of
// the ln_f unit and needs nothing more. A tied head is wte, so the last part holds a
// copy of wte as a unit of its own with the first part's names (unit "embeddings", parameter
// "wte.weight"), initialised identically; over a step each of the two parts adds its share of
// wte's gradient into a private buffer, the two exchange them point to point on the last
// micro-batch and both hand the same sum to the engine, which then updates both copies alike.
// The copy's norm is counted on the first part only (Layout::set_norm_counted_elsewhere).
//
// The schedule is 1F1B (PipeDream-Flush, as Megatron-LM's): part p runs min(P - 1 - p, m)
// warm-up forwards, then alternates one forward and one backward, and finishes with the
// remaining backwards, over the m = gradient_accumulation_steps micro-batches. A part holds at
// most min(P - p, m) micro-batches' activations at once (the model's slots). Activations go to
// the next part and their gradients to the previous one point to point over the pipeline
// group; sends are asynchronous and waited before their buffer is reused, receives are waited
// before the op that needs them, which cannot deadlock: a part's receive depends only on
// earlier forwards of earlier parts or earlier backwards of later parts. On NCCL a send
// completes only when its receive runs, in the order each rank issued its calls: there, a
// part in the steady state sending an activation on while the next part sends a gradient
// back would wait on each other. So between two ops a part issues the send the first one
// produced and the receive the second one needs as one group (CommGroup) when they are with the
// same peer, as Megatron-LM's send_forward_recv_backward does (pipe_transfers), and the tied
// wte exchange is one group. The idle fraction of the schedule (the bubble) is
// (P - 1) / (m + P - 1).
//
// The engine runs over the data-parallel group (ProcessGroups); ranks of one pipeline read the
// same batches (the data loader's rank is the data-parallel coordinate). The transfers go over
// the engine's device communicator of the pipeline group on CUDA (Engine::device_comm), over
// the group itself on the host. ZeRO stages 0 and 1 only.
//
// With tensor parallelism T as well (ProcessGroups(ctx, {T, P})), each part is cut T ways as
// tensor_parallel.hpp cuts the whole model, and the pipeline group joins the ranks of the same
// tensor rank: part p's tensor rank t sends its activations to part p + 1's tensor rank t
// (the residual stream is replicated in a tensor group, so each pair carries the whole of it),
// and the tied wte copies exchanged between the end parts are the same vocabulary rows.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/layout.hpp"

namespace zero::gpt {

// Pipeline part `part`'s blocks [first_layer, end_layer) of the `parts` (the blocks its
// GptModel's ModelPart holds).
struct PartSplit {
  int part = 0, parts = 1;
  int first_layer = 0, end_layer = 0;
  bool first() const { return part == 0; }
  bool last() const { return part == parts - 1; }
};
// Throws zero::Error when there are more parts than blocks (every part needs one).
PartSplit part_split(int n_layer, int parts, int part);

// One step of a part's schedule: the forward or the backward of micro-batch `micro`.
struct PipeOp {
  bool forward = true;
  int micro = 0;
  bool operator==(const PipeOp&) const = default;
};
// Part `part`'s 1F1B order over m micro-batches (forwards and backwards each in increasing
// micro-batch order).
std::vector<PipeOp> one_f_one_b(int parts, int part, int micro_batches);
// A point-to-point transfer of the activation (forward) or the gradient of micro-batch `micro`,
// sent to or received from part `peer`.
struct PipeTransfer {
  bool send = false;
  bool activation = true;
  int micro = 0;
  int peer = 0;
  bool operator==(const PipeTransfer&) const = default;
};
// What part `part` issues between two of its ops (done: null before the first; next: null
// after the last): the send `done` produced (an activation to part + 1, an input gradient to
// part - 1), then the receive `next` needs, in groups issued in order. The two are one group
// when they are with the same peer (the 1F1B steady state: on NCCL, apart, both parts would
// wait for their sends), else one group each, the send first: a receive and a send of one
// buffer are then never in flight together (the output gradient, between two backwards).
std::vector<std::vector<PipeTransfer>> pipe_transfers(int parts, int part, const PipeOp* done, const PipeOp* next);
// The most micro-batches whose activations part `part` holds at once under 1F1B.
inline int in_flight_bound(int parts, int part, int micro_batches) {
  return parts - part < micro_batches ? parts - part : micro_batches;
}
// The schedule's idle fraction (P - 1) / (m + P - 1).
inline double bubble_fraction(int parts, int micro_batches) {
  return static_cast<double>(parts - 1) / static_cast<double>(micro_batches + parts - 1);
}

// The pipeline part's share of the model's layout at tensor parallelism T (build_layout(cfg), or
// tensor_parallel_layout(cfg, T) with each parameter's cut): its blocks, the embeddings on the
// first part, ln_f on the last, and (P > 1, tied head) on the last the copy of wte first, as unit
// "embeddings", cut by vocabulary like the first part's.
zero::Layout part_layout(const GptConfig& cfg, const PartSplit& s, int tensor_parallel = 1);

// Refuses what pipeline parallelism does not support, with the reason: ZeRO stages 2 and 3.
void check_pipeline_config(const zero::Config& cfg, int pipeline);

// A pipeline part's figures for the log and the tests.
struct PipelineReport {
  int parts = 1, part = 0, data = 1;
  int first_layer = 0, end_layer = 0;
  int micro_batches = 1;
  int slots = 1;           // micro-batches' activations the model holds (the 1F1B bound)
  int peak_in_flight = 0;  // the most held at once in the steps run so far
  double bubble = 0.0;
  std::size_t activation_bytes = 0;  // the model's (all slots)
  int tensor = 1;                    // T
  bool tied = true;                  // the head is wte (the last part holds a copy)
  // "TP 1 x DP 2 x PP 2: part 0 of 2 (blocks 0-1, embeddings), 1F1B over 4 micro-batches, bubble 20.0%"
  std::string describe() const;
};

// The trainer's pipeline state (GptTrainer holds one when P > 1).
struct PipelineState {
  PartSplit split;
  int emb = -1, lnf = -1;          // engine unit ids (-1: not in this part)
  std::vector<int> blocks;         // engine unit of block first_layer + i
  bool tied = true;                // the head is wte: the end parts exchange its gradient
  OpsBuffer tied_grad, tied_peer;  // wte's gradient over the step, this part's and the other's
  // The pipeline group's communicator for device memory (Engine::device_comm; null on the host
  // backend). Before the Works below, which are waited on as they go.
  std::unique_ptr<zero::Communicator> device_comm;
  std::vector<zero::Work> act_sends;  // per slot: the activation sent on
  zero::Work grad_send;               // the last input gradient sent back
  // The last micro-batch's embedding gradients on the end parts, committed once the tied wte
  // gradients are exchanged (after the step's last transfers).
  std::optional<zero::UnitGrads> emb_grads;
  Act* engine_wte = nullptr;  // where the engine wants wte's gradient (emb_grads_ before the swap)
  int in_flight = 0, peak_in_flight = 0;
};

}  // namespace zero::gpt
