// What PretrainedWeights reads from (hf_import.cpp opens it, hf_read.cpp reads tensors out of
// it): the files, their tensors and how they map onto the trainer's parameters.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/hf_mapping.hpp"
#include "zero/dtype.hpp"
#include "zero/formats/hf.hpp"
#include "zero/plan/plan.hpp"

namespace zero::hf {

using plan::Arch;

struct PretrainedWeights::Source {
  struct File {
    ckpt::Fd fd;
    std::uint64_t data_start = 0;
  };
  struct Tensor {
    int file = 0;
    DType dtype = DType::f32;
    Shape shape;
    std::uint64_t begin = 0, end = 0;
    bool transposed = false;  // an llm.c matrix, stored [shape[1], shape[0]]
  };
  std::vector<File> files;
  std::map<std::string, Tensor> tensors;  // by the name the mapping uses
  std::set<std::string> ignored;          // buffers, a tied lm_head
  // config.json's shape (seq_len unset for bloom and llama), or llm.c's header; and what to
  // call it in messages.
  std::optional<plan::GptShape> config;
  std::string config_name;
  bool llmc = false;
  // bloom and llama: every parameter from its Hugging Face tensors (from config.json's shape);
  // otherwise the files hold the trainer's names.
  std::optional<std::map<std::string, Mapping>> maps;
  std::uint64_t bytes_read = 0;  // tensor bytes read so far

  void open_llmc(const std::string& path);
  void add_file(const std::string& file, Arch naming, std::map<std::string, std::string>* found);
};

void check_finite(const std::string& path, const std::string& name, const float* v, std::size_t n, const char* order);

}  // namespace zero::hf
