// What zero-gpt asks of the machine it runs on: threads for its ranks, the peak resident set
// size, and the peak FLOP rate that MFU divides by.
#pragma once

#include <string>

#include "gpt/reporter.hpp"
#include "gpt/trainer.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"

namespace zero::gpt {

// Shares the machine's cores among its ranks (threads: each rank's count); returns a hint for
// the log, or "".
std::string configure_threads(const zero::Context& ctx, int& threads);
// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
double peak_rss_bytes();
// The per-device peak MFU divides by, and where it came from. Collective on the host.
MfuPeak device_peak_tflops(zero::Context& ctx, const GptSettings& s, const zero::Config& cfg, int threads);

}  // namespace zero::gpt
