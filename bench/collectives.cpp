// bench_collectives: how close does libzero's NCCL communicator come to NCCL itself for the
// collectives the engine issues (all-reduce at stage 0, reduce-scatter of gradient buckets, both
// summing as the engine does, all-gather of parameters), at bucket sizes from 1 MiB to 1 GiB?
//
// "ours" goes through the engine's path: Communicator::*_async on the backend's communication
// stream, ordered after the compute stream and waited on with Work::wait() (the compute stream
// waits on the completion event, as in engine/reduce.cpp / engine/gather.cpp), iteration after iteration. The
// reference is the same NCCL call on a communicator and stream of its own, back to back, with
// no events in between: the limit of what the wrapper could reach. Both use the same buffers and
// run in the same process, taking turns per size. Bandwidth is NCCL's "bus bandwidth" (bytes a
// rank's link moves: all-reduce 2(n-1)/n x size, the others (n-1)/n x size), so figures compare
// across rank counts; with one rank it is 0 and only the times mean something.
//
// Run: mpirun -n <GPUs> bench_collectives [--dtype bf16] [--min-mib 1] [--max-mib 1024]
// Needs a GPU per rank. Rank 0 prints one line per collective and size.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "cuda/cuda_check.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

using namespace zero;

namespace {

enum class Op { all_reduce, reduce_scatter, all_gather };
const char* op_name(Op op) {
  return op == Op::all_reduce ? "all_reduce" : (op == Op::reduce_scatter ? "reduce_scatter" : "all_gather");
}
// Bus bandwidth factor (NCCL's tests' convention).
double bus_factor(Op op, int n) {
  if (n <= 1) return 0.0;
  return op == Op::all_reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

ncclDataType_t nccl_type(DType t) {
  return t == DType::f32 ? ncclFloat32 : (t == DType::bf16 ? ncclBfloat16 : ncclFloat16);
}

struct Setup {
  Backend& backend;
  Communicator& ours;
  ncclComm_t ref;
  cudaStream_t ref_stream;
  void* a;  // bucket-sized buffers
  void* b;
  DType t;
  int world, rank;
};

// One collective over a bucket of `bytes` (the full buffer: all-reduce's, reduce-scatter's
// input, all-gather's output).
void ours_once(Setup& s, Op op, std::size_t bytes) {
  const std::size_t es = dtype_size(s.t), count = bytes / es, slice = count / static_cast<std::size_t>(s.world);
  Work w;
  switch (op) {
    case Op::all_reduce: w = s.ours.all_reduce_async(s.a, count, s.t, ReduceOp::sum); break;
    case Op::reduce_scatter: w = s.ours.reduce_scatter_async(s.a, s.b, slice, s.t, ReduceOp::sum); break;
    case Op::all_gather:
      w = s.ours.all_gather_async(static_cast<char*>(s.b) + static_cast<std::size_t>(s.rank) * slice * es, s.b, slice,
                                  s.t);
      break;
  }
  w.wait();
}

void ref_once(Setup& s, Op op, std::size_t bytes) {
  const std::size_t es = dtype_size(s.t), count = bytes / es, slice = count / static_cast<std::size_t>(s.world);
  switch (op) {
    case Op::all_reduce:
      ZERO_NCCL_CHECK(ncclAllReduce(s.a, s.a, count, nccl_type(s.t), ncclSum, s.ref, s.ref_stream));
      break;
    case Op::reduce_scatter:
      ZERO_NCCL_CHECK(ncclReduceScatter(s.a, s.b, slice, nccl_type(s.t), ncclSum, s.ref, s.ref_stream));
      break;
    case Op::all_gather:
      ZERO_NCCL_CHECK(ncclAllGather(static_cast<char*>(s.b) + static_cast<std::size_t>(s.rank) * slice * es, s.b, slice,
                                    nccl_type(s.t), s.ref, s.ref_stream));
      break;
  }
}

// Milliseconds per collective, timed by events on `stream` around `iters` calls of `fn`.
template <class F>
double time_ms(cudaStream_t stream, int warmup, int iters, F&& fn) {
  cudaEvent_t start, stop;
  ZERO_CUDA_CHECK(cudaEventCreate(&start));
  ZERO_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) fn();
  ZERO_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  ZERO_CUDA_CHECK(cudaEventRecord(stop, stream));
  ZERO_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  Context ctx(&argc, &argv);
  return ctx.run([&] {
    CLI::App app{"NCCL communicator throughput: libzero's wrapper against NCCL, 1 MiB to 1 GiB buckets"};
    std::string dtype = "bf16";
    double min_mib = 1, max_mib = 1024;
    int iters = 20, warmup = 5;
    app.add_option("--dtype", dtype, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--min-mib", min_mib, "smallest bucket, MiB")->check(CLI::PositiveNumber);
    app.add_option("--max-mib", max_mib, "largest bucket, MiB")->check(CLI::PositiveNumber);
    app.add_option("--iters", iters, "timed collectives per size and variant")->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup, "untimed collectives first")->check(CLI::NonNegativeNumber);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    ZERO_CHECK(ctx.device() >= 0, "bench_collectives needs a CUDA device per rank");
    const DType t = dtype == "fp32" ? DType::f32 : (dtype == "bf16" ? DType::bf16 : DType::f16);

    Config cfg = parse_config("backend: cuda\ncomm: nccl\n", "bench_collectives");
    cfg.resolve(ctx.world_size());
    std::unique_ptr<Backend> backend = make_backend(ctx, cfg);

    // The reference: a communicator and stream of its own, bootstrapped the same way.
    ncclUniqueId id{};
    if (ctx.rank() == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
    ctx.comm().broadcast(&id, sizeof id, 0);
    ncclComm_t ref = nullptr;
    ZERO_NCCL_CHECK(ncclCommInitRank(&ref, ctx.world_size(), id, ctx.rank()));
    cudaStream_t ref_stream = nullptr;
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&ref_stream, cudaStreamNonBlocking));

    const std::size_t mib = std::size_t{1} << 20;
    const std::size_t quantum = dtype_size(t) * static_cast<std::size_t>(ctx.world_size());
    const std::size_t max_bytes = static_cast<std::size_t>(max_mib * static_cast<double>(mib)) / quantum * quantum;
    Buffer a = backend->alloc(max_bytes), b = backend->alloc(max_bytes);
    Setup s{*backend, backend->comm(), ref, ref_stream, a.get(), b.get(), t, ctx.world_size(), ctx.rank()};
    cudaStream_t ours_stream = static_cast<cudaStream_t>(backend->compute_stream());

    if (ctx.is_root())
      std::printf(
          "%d ranks, %s; ms per collective and bus bandwidth (GB/s); ours/nccl = bandwidth ratio\n"
          "%-15s %10s %10s %10s %10s %10s %9s\n",
          ctx.world_size(), dtype.c_str(), "collective", "bucket MiB", "ours ms", "nccl ms", "ours GB/s", "nccl GB/s",
          "ours/nccl");
    for (Op op : {Op::all_reduce, Op::reduce_scatter, Op::all_gather}) {
      for (double size = min_mib; size <= max_mib * 1.0001; size *= 2) {
        const std::size_t bytes =
            std::max(quantum, static_cast<std::size_t>(size * static_cast<double>(mib)) / quantum * quantum);
        ctx.comm().barrier();
        const double ref_ms = time_ms(ref_stream, warmup, iters, [&] { ref_once(s, op, bytes); });
        ctx.comm().barrier();
        const double ours_ms = time_ms(ours_stream, warmup, iters, [&] { ours_once(s, op, bytes); });
        // The slowest rank decides a collective's time.
        const double ref_max = ctx.comm().all_reduce_scalar(ref_ms, ReduceOp::max);
        const double ours_max = ctx.comm().all_reduce_scalar(ours_ms, ReduceOp::max);
        const double f = bus_factor(op, ctx.world_size()) * static_cast<double>(bytes) / 1e9;
        const double ours_bw = f / (ours_max / 1e3), ref_bw = f / (ref_max / 1e3);
        if (ctx.is_root())
          std::printf("%-15s %10.1f %10.3f %10.3f %10.1f %10.1f %9.3f\n", op_name(op),
                      static_cast<double>(bytes) / static_cast<double>(mib), ours_max, ref_max, ours_bw, ref_bw,
                      ref_max > 0 ? ref_max / ours_max : 0.0);
      }
    }
    ZERO_CUDA_CHECK(cudaStreamSynchronize(ref_stream));
    ncclCommDestroy(ref);
    cudaStreamDestroy(ref_stream);
    return 0;
  });
}
