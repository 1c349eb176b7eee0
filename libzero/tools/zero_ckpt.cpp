// zero-ckpt: look into, convert and reshard libzero checkpoints without launching a job.
//
//   zero-ckpt inspect ckpt/                      every checkpoint under the root, verified (the
//                                                checks every loader makes: docs/checkpoints.md,
//                                                "What is checked"); exit status 2 on any failure
//   zero-ckpt export ckpt/ --format safetensors [--dtype bf16] -o model.safetensors
//   zero-ckpt export ckpt/ --format hf -o hf-dir/     config.json + model.safetensors (or
//                                                     shards) for transformers: GPT2LMHeadModel,
//                                                     BloomForCausalLM or LlamaForCausalLM
//   zero-ckpt export ckpt/ --format llmc -o gpt2.bin  llm.c's GPT-2 checkpoint (version 3;
//                                                     --dtype bf16: version 5)
//   zero-ckpt reshard ckpt/ --world 8 [--stage 3] [--tp 2] [--pp 1] -o ckpt8/
//
// <dir> is a checkpoint root (its `latest`, or --tag N) or one step directory.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

#include "zero/checkpoint.hpp"
#include "zero/error.hpp"
#include "zero/formats/hf.hpp"
#include "zero/formats/llmc_gpt2.hpp"
#include "zero/util/log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Inspect, export and reshard libzero checkpoints"};
  app.require_subcommand(1);

  std::string dir, out, format = "safetensors", dtype = "fp32", tag = "latest";
  bool show_config = false;
  int world = 0, stage = -1, n_head = 0, vocab_size = 0, tp = -1, pp = -1;
  std::uint64_t max_shard = zero::hf::ExportOptions{}.max_shard_bytes;

  auto* inspect = app.add_subcommand("inspect",
                                     "Print metadata and sizes; verify every file's checksums, where each shard lies "
                                     "and that a grid's positions agree (exit status 2 on any failure)");
  inspect->add_option("dir", dir, "Checkpoint root or step directory")->required();
  inspect->add_flag("--config", show_config, "Also print the resolved config saved with each checkpoint");

  auto* exp = app.add_subcommand("export", "Write the consolidated fp32 master weights (or bf16) as one file");
  exp->add_option("dir", dir, "Checkpoint root or step directory")->required();
  exp->add_option("--format", format,
                  "safetensors: every parameter as stored (any model); hf: a Hugging Face directory of the "
                  "checkpoint's architecture, gpt2, bloom or llama (config.json, model.safetensors without "
                  "padding rows); llmc: llm.c's GPT-2 checkpoint (gpt2_124M.bin's format)")
      ->check(CLI::IsMember({"safetensors", "hf", "llmc"}));
  exp->add_option("--dtype", dtype, "Tensor type in the file")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  exp->add_option("-o,--output", out, "Output file (--format hf: output directory)")->required();
  exp->add_option("--n-head", n_head, "hf, llmc: attention heads (default: the checkpoint's model.n_head)")
      ->check(CLI::Range(1, 1 << 20));
  exp->add_option("--vocab-size", vocab_size, "hf, llmc: true vocabulary (default: the checkpoint's model.vocab_size)")
      ->check(CLI::Range(1, 1 << 30));
  exp->add_option("--max-shard-size", max_shard,
                  "hf: above this size the weights are split into model-0000i-of-0000n.safetensors with "
                  "model.safetensors.index.json, as save_pretrained does (bytes, or 5GB, 200MB, ...)")
      ->transform(CLI::AsSizeValue(true));
  exp->add_option("--tag", tag, "\"latest\" or a step number, when dir is a root");

  auto* resh = app.add_subcommand("reshard", "Rewrite a checkpoint for another number of ranks or grid");
  resh->add_option("dir", dir, "Checkpoint root or step directory")->required();
  resh->add_option("--world", world, "Ranks the new checkpoint is for")->required()->check(CLI::Range(1, 1 << 20));
  resh->add_option("--stage", stage, "Stage recorded in the new checkpoint (default: unchanged)")
      ->check(CLI::Range(0, 3));
  resh->add_option("--tp", tp, "Tensor-parallel size of the new checkpoint (default: unchanged)")
      ->check(CLI::Range(1, (1 << 16) - 1));
  resh->add_option("--pp", pp, "Pipeline size: unchanged (default) or 1; a job resumes at any other itself")
      ->check(CLI::Range(1, (1 << 16) - 1));
  resh->add_option("-o,--output", out, "New checkpoint root (created; must not hold this step)")->required();
  resh->add_option("--tag", tag, "\"latest\" or a step number, when dir is a root");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*inspect) return zero::inspect_checkpoint(dir, std::cout, show_config) ? 0 : 2;
    if (*exp) {
      zero::DType t = dtype == "bf16" ? zero::DType::bf16 : (dtype == "fp16" ? zero::DType::f16 : zero::DType::f32);
      if (format == "hf") {
        const zero::plan::GptShape c = zero::hf::export_hf(dir, out, {t, tag, n_head, vocab_size, max_shard});
        std::printf(
            "wrote %s: config.json and the weights (%s; %s n_layer %d n_head %d n_kv_head %d n_embd %d "
            "ffn %lld vocab_size %d%s)\n",
            out.c_str(), dtype.c_str(), std::string(zero::plan::arch_name(c.arch)).c_str(), c.n_layer, c.n_head,
            c.kv_heads(), c.n_embd, static_cast<long long>(c.mlp_hidden()), c.vocab_size,
            c.tied_head ? "" : ", untied head");
        return 0;
      }
      if (format == "llmc") {
        const zero::plan::GptShape c = zero::llmc::export_gpt2(dir, out, {t, tag, n_head, vocab_size});
        std::printf(
            "wrote %s (llm.c GPT-2 checkpoint version %d, %s; max_seq_len %d vocab_size %d num_layers %d "
            "num_heads %d channels %d padded_vocab_size %lld)\n",
            out.c_str(), t == zero::DType::bf16 ? zero::llmc::kVersionBf16 : zero::llmc::kVersionF32, dtype.c_str(),
            c.seq_len, c.vocab_size, c.n_layer, c.n_head, c.n_embd, static_cast<long long>(c.padded_vocab()));
        return 0;
      }
      zero::export_safetensors(dir, out, t, tag);
      std::printf("wrote %s (%s)\n", out.c_str(), dtype.c_str());
      return 0;
    }
    if (*resh) {
      // Progress on stderr, one line rewritten in place, when the checkpoint is large enough to wait for.
      const bool tty = ::isatty(2) != 0;
      auto progress = [&](std::uint64_t done, std::uint64_t total) {
        if (total < (64u << 20)) return;
        std::fprintf(stderr, "%sreshard: %.0f%% (%.1f of %.1f MiB)%s", tty ? "\r" : "", 100.0 * done / total,
                     done / 1048576.0, total / 1048576.0, tty && done < total ? "" : "\n");
      };
      zero::reshard_checkpoint(dir, out, world, stage, tag, tp, pp, progress);
      std::printf("wrote %s for %d data-parallel rank(s)%s\n", zero::resolve_checkpoint(out).c_str(), world,
                  tp > 0 || pp > 0 ? " per position of the new grid" : "");
      return 0;
    }
  } catch (const std::exception& e) {
    zero::log(zero::LogLevel::error, std::string("zero-ckpt: ") + e.what());
    return 1;
  }
  return 1;
}
