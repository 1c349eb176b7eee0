// The trainer's forward-only passes: the validation loss, shared out over the ranks, and
// sampling, which rank 0 runs alone on a model gathered once.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "gpt/trainer.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

GptTrainer::Evaluation GptTrainer::evaluate() {
  ZERO_CHECK(val_loader_,
             "evaluate(): there is no validation data (data.val is 'none', or the "
             "training data are shards and data.val names none)");
  EvalScope eval(*engine_);
  if (pipe_) return pipeline_evaluate();
  return evaluate_windows(data_parallel_size(), data_parallel_rank(), tensor_parallel_rank() == 0,
                          [this] { return run_micro_batch(false); });
}

GptTrainer::Evaluation GptTrainer::evaluate_windows(std::int64_t world, std::int64_t rank, bool counts,
                                                    const std::function<double()>& forward) {
  const int T = settings_.model.seq_len;
  const std::int64_t B = micro_batch_;
  const std::int64_t available = val_loader_->num_samples();
  const std::int64_t total = settings_.eval_sequences > 0 ? std::min(settings_.eval_sequences, available) : available;
  // Pass p covers windows [p * B * world, (p + 1) * B * world), rank r its r-th block of B:
  // which windows are evaluated depends on nothing but `total`. Every rank runs the same
  // number of forward passes, because at stage 3 each one gathers collectively; a rank with
  // nothing left repeats window 0 and does not count it.
  const std::int64_t passes = (total + B * world - 1) / (B * world);
  double sums[2] = {0.0, 0.0};  // loss x windows, windows
  for (std::int64_t p = 0; p < passes; ++p) {
    const std::int64_t first = (p * world + rank) * B;
    const int count = static_cast<int>(std::clamp<std::int64_t>(total - first, 0, B));
    val_loader_->read(count > 0 ? first : 0, std::max(count, 1), inputs_.data(), targets_.data());
    model_->set_slot(0);
    model_->set_batch(inputs_.data(), targets_.data(), std::max(count, 1), T);
    const double loss = forward();
    if (!counts) continue;
    sums[0] += loss * count;
    sums[1] += count;
  }
  // Over the world: ranks that do not count (pipeline parts without the head, tensor ranks
  // other than 0, which evaluate the same windows as their rank 0) add zeros.
  const double loss_sum = ctx_.comm().all_reduce_scalar(sums[0], zero::ReduceOp::sum);
  const double counted = ctx_.comm().all_reduce_scalar(sums[1], zero::ReduceOp::sum);
  Evaluation e;
  e.loss = loss_sum / counted;
  e.sequences = total;
  e.tokens = total * T;
  return e;
}

std::vector<int> GptTrainer::sample(std::vector<int> prompt, int n, float temperature, int top_k, std::uint64_t seed) {
  // The one collective: every rank gathers the whole model once (zero::Engine::gather_all);
  // then rank 0 alone runs the forward passes, reading it locally, and the others go on to their
  // next collective, where they wait for rank 0 (stage 3 would otherwise need every rank in
  // every forward pass, each gather being a collective). Under tensor parallelism rank 0's
  // tensor group runs the passes together (each forward all-reduces over it, and logits_at sums
  // the vocabulary parts). Under pipeline parallelism data-parallel rank 0's pipelines sample:
  // each token's forward passes through their pipeline parts, the last part draws the token and
  // broadcasts it over its pipeline, and every part appends it. World rank 0 returns the tokens.
  const zero::GatheredModel held = engine_->gather_all();
  if (data_parallel_rank() != 0) return {};
  std::vector<int> tokens = prompt.empty() ? std::vector<int>{start_token()} : std::move(prompt);
  const std::size_t first_new = tokens.size();
  const int T_max = settings_.model.seq_len;
  std::vector<std::int32_t> window;
  std::vector<float> logits;
  SampleCoin coin(seed);
  for (int i = 0; i < n; ++i) {
    // The last seq_len tokens are the context: the model has no positions beyond that.
    const int T = static_cast<int>(std::min<std::size_t>(tokens.size(), static_cast<std::size_t>(T_max)));
    window.assign(tokens.end() - T, tokens.end());
    model_->set_slot(0);
    model_->set_batch(window.data(), nullptr, 1, T);
    if (pipe_)
      pipeline_forward_only();
    else
      run_micro_batch(false);
    std::int32_t token = 0;
    if (!pipe_ || pipe_->split.last()) {
      model_->logits_at(0, T - 1, logits);
      token = sample_token(logits, temperature, top_k, coin());
    }
    if (pipe_) {
      const zero::CommSiteScope site("pipeline sample");
      groups_->pipeline().broadcast(&token, sizeof token, pipe_->split.parts - 1);
    }
    tokens.push_back(token);
  }
  if (!ctx_.is_root()) return {};
  return {tokens.begin() + static_cast<std::ptrdiff_t>(first_new), tokens.end()};
}

}  // namespace zero::gpt
