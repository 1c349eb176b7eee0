// What the GPT-2 interchange formats share: the transposition between the trainer's Conv1D
// [in, out] matrices (Hugging Face's orientation) and the [out, in] of nn.Linear that llm.c
// stores.
#pragma once

#include <cstdint>

namespace zero::hf {

// src [rows, cols] row-major into dst [cols, rows].
void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols);

}  // namespace zero::hf
