// The planner's GPT against the GPT trainer itself: the same units and sizes as the trainer's
// layout, and activation_bytes() equal to what GptModel allocates, with and without activation
// checkpointing, for a few shapes and micro-batches, and for each architecture.
#include <catch2/catch.hpp>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt/ops.hpp"
#include "zero/plan/plan.hpp"

TEST_CASE("the planner's GPT is the trainer's GPT", "[plan]") {
  struct Shape {
    int layers, heads, embd, seq, vocab;
  };
  for (const Shape& sh : {Shape{2, 2, 64, 32, 256}, Shape{3, 4, 96, 48, 300}, Shape{1, 1, 32, 16, 1000}}) {
    zero::gpt::GptConfig cfg;
    cfg.n_layer = sh.layers;
    cfg.n_head = sh.heads;
    cfg.n_embd = sh.embd;
    cfg.seq_len = sh.seq;
    cfg.vocab_size = sh.vocab;
    const zero::plan::GptShape shape{"", sh.layers, sh.heads, sh.embd, sh.seq, sh.vocab};

    const zero::Layout trainer = zero::gpt::build_layout(cfg);
    const zero::Layout planned = zero::plan::gpt_layout(shape);
    REQUIRE(planned.num_units() == trainer.num_units());
    for (int u = 0; u < trainer.num_units(); ++u) {
      CHECK(planned.unit(u).name == trainer.unit(u).name);
      CHECK(planned.unit(u).numel == trainer.unit(u).numel);
    }
    CHECK(shape.num_params() == trainer.num_params());

    auto ops = zero::gpt::make_host_ops();
    for (bool ckpt : {false, true}) {
      cfg.activation_checkpointing = ckpt;
      for (int micro : {1, 3}) {
        zero::gpt::GptModel model(cfg, micro, *ops);
        CHECK(static_cast<std::int64_t>(model.activation_bytes()) ==
              zero::plan::activation_bytes(shape, micro, ckpt, 4, zero::plan::AttentionStore::probabilities));
      }
    }
  }
}

TEST_CASE("the planner's bloom and llama hold what the trainer allocates", "[plan]") {
  auto ops = zero::gpt::make_host_ops();
  for (const char* preset : {"bloom-tiny", "llama-tiny"}) {
    zero::gpt::GptConfig cfg = zero::gpt::gpt_preset(preset);
    cfg.seq_len = 24;
    for (bool ckpt : {false, true}) {
      cfg.activation_checkpointing = ckpt;
      for (int micro : {1, 3}) {
        INFO(preset << ", micro-batch " << micro << (ckpt ? ", activation checkpointing" : ""));
        zero::gpt::GptModel model(cfg, micro, *ops);
        CHECK(static_cast<std::int64_t>(model.activation_bytes()) ==
              zero::plan::activation_bytes(cfg, micro, ckpt, 4, zero::plan::AttentionStore::probabilities));
      }
    }
  }
}
