// What the interchange formats share (zero-ckpt export --format hf | llmc, and model.init_from
// reading either): the shape of a checkpoint's GPT model with its tensors checked name for name
// against zero::plan::gpt_layout, its parameters visited one unit in memory at a time, and the
// transposition between the trainer's [in, out] matrices and nn.Linear's [out, in].
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "checkpoint/format.hpp"
#include "zero/formats/hf.hpp"
#include "zero/plan/plan.hpp"

namespace zero::hf {

// The shape of the model in r's checkpoint. The architecture, n_layer, n_embd, the key/value
// heads, the MLP width and whether the head is tied come from its tensors; n_head and the true
// vocabulary from `o` or the saved `model` section, as do seq_len (but gpt2's: wpe's rows) and
// llama's norm_eps and rope_theta. Throws zero::Error, naming the export `format` ("hf",
// "llmc"), when a tensor is missing, extra or misshapen, or a key is unknown.
plan::GptShape checkpoint_shape(const ckpt::ModelReader& r, const ExportOptions& o, std::string_view format);
// checkpoint_shape(), refusing any architecture but GPT-2's.
plan::GptShape gpt2_shape(const ckpt::ModelReader& r, const ExportOptions& o, std::string_view format);

// fn(param, values) for every parameter of the checkpoint's whole model (a tensor/pipeline
// grid's parts put together), in its order; values are the fp32 master weights, valid during
// the call. One whole unit is in memory at a time.
void for_each_param(ckpt::ModelReader& r, const std::function<void(const ckpt::ParamMeta&, const float*)>& fn);

// src [rows, cols] row-major into dst [cols, rows].
void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols);

}  // namespace zero::hf
