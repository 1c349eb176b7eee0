// zero-gpt's own sections of the config file (model, data, run). Each key is declared once, as a
// row of the table in settings_keys.cpp, and that row gives its default, its strict reading, its
// place in the resolved section written back, its --help line and its row of the documented
// table; the rules that need several keys at once follow the reading (settings.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "zero/config.hpp"

namespace zero::gpt {

// The values of the keys; each one's meaning and default are its row's. A default-constructed
// GptSettings holds every default (the tiny preset's shape, out_dir runs/tiny).
struct GptSettings {
  GptSettings();

  // model:
  std::string preset;
  std::string arch;  // model.arch's name (the preset's unless given)
  GptConfig model;   // the preset's shape, then explicit overrides
  std::uint64_t init_seed{};
  int tensor_parallel{};    // T: ranks that split each layer (tensor_parallel.hpp)
  int pipeline_parallel{};  // P: pipeline parts (pipeline.hpp)
  std::string init_from;    // "": initialise from init_seed
  // data:
  std::string train, val;
  std::uint64_t data_seed{};
  // run:
  std::int64_t steps{}, eval_interval{}, eval_sequences{};
  int sample_tokens{};
  double temperature{};
  int top_k{};
  std::string out_dir;
  std::int64_t save_interval{};
  int keep_checkpoints{};
  double token_budget{};
  bool log_jsonl{}, strict_outputs{};
  bool allow_model_change{};  // resume a checkpoint whose n_head / vocab_size differ
  std::string progress;
  double peak_tflops{};

  // The three sections as YAML mappings ("model" -> "preset: tiny\nn_layer: 4\n..."), every
  // value resolved (presets expanded), in the form Config::extra_sections keeps them.
  std::map<std::string, std::string> sections() const;
};

// The names the trainer registers with zero::load_config: "model", "data", "run".
const std::vector<std::string>& gpt_sections();

// Reads the model / data / run sections strictly: an unknown key, a wrong type or an
// out-of-range value is a zero::Error naming the key, where it was set and what is expected.
GptSettings read_gpt_settings(const zero::Config& cfg);
// The data-parallel size the engine's config is resolved for: world / (tensor x pipeline). A
// world size the grid does not divide is a zero::Error naming both.
int gpt_data_parallel_size(const GptSettings& settings, int world_size);

// Every key of the three sections with its default and meaning (for --help).
std::string gpt_settings_help();
// The same as a Markdown table (key, type, default, meaning), for the documentation.
std::string gpt_settings_reference_markdown();

}  // namespace zero::gpt
