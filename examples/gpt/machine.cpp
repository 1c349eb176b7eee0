#include "gpt/machine.hpp"

#include <fmt/format.h>

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#if ZERO_GPT_CUDA
#include "gpt/cuda_library.hpp"
#endif
#include "gpt/ops.hpp"
#include "zero/comm.hpp"

namespace zero::gpt {

// Ranks sharing a machine share its cores; returns a hint for the log, or "".
// OpenBLAS (pthreads) and OpenMP keep separate thread pools whose idle threads spin, so with
// more than one thread per rank the two pools fight over the cores (a 3-5x slowdown measured on
// the tiny model) unless OpenMP waits passively, which only the environment can set before the
// process starts. Unless the user chose (OMP_NUM_THREADS or OPENBLAS_NUM_THREADS), each rank
// therefore gives its share of the cores to the matrix products and runs its own loops on one
// thread.
std::string configure_threads(const zero::Context& ctx, int& threads) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  if (omp || blas) {
    threads = std::max(omp_get_max_threads(), openblas_get_num_threads());
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    if (omp_get_max_threads() > 1 && openblas_get_num_threads() > 1 && !wait)
      return "hint: OpenMP and OpenBLAS both run several threads; export OMP_WAIT_POLICY=passive "
             "so their idle threads do not spin against each other";
    return "";
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, cores / std::max(1, ctx.local_size()));
  omp_set_num_threads(1);
  openblas_set_num_threads(threads);
  return "";
}

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return 0.0;
}

// The per-device peak MFU divides by, and where it came from (unknown for a GPU without a
// planner preset: the run goes on without MFU). On the host every rank measures at once (ranks
// on one machine share its cores, as they do while training) and the mean counts.
MfuPeak device_peak_tflops(zero::Context& ctx, const GptSettings& s, const zero::Config& cfg, int threads) {
  if (s.peak_tflops > 0) return {s.peak_tflops, "run.peak_tflops"};
#if ZERO_GPT_CUDA
  if (cfg.backend == zero::BackendKind::cuda) {
    // The dense bf16 tensor peak of the device's preset, or none known (an H100 PCIe, a
    // consumer card): MFU is then n/a until run.peak_tflops states it.
    // Never the host measurement below: its barrier would wait for ranks whose query worked.
    std::string name;
    double bytes = 0;
    if (gpt_cuda_library().current_device(&name, &bytes)) return gpu_mfu_peak(s.peak_tflops, name, bytes);
    return {0.0,
            "the CUDA device could not be queried, so MFU is shown as n/a; set run.peak_tflops to its "
            "dense bf16 tensor peak (TFLOP/s) to see it"};
  }
#else
  (void)cfg;
#endif
  ctx.comm().barrier();
  const double mine = measure_host_sgemm_tflops();
  const double mean = ctx.comm().all_reduce_scalar(mine, zero::ReduceOp::avg);
  return {mean, fmt::format("OpenBLAS sgemm measured at start, {} thread{} per rank; set run.peak_tflops to state one",
                            threads, threads == 1 ? "" : "s")};
}

}  // namespace zero::gpt
