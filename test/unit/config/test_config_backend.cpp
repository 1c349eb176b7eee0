// The backend / comm keys: defaults, accepted values, the strict loader's errors for unknown
// values and for a comm that would have no effect, the round trip through to_yaml(), and what
// an Engine says when backend: cuda cannot be had (a build without CUDA, a rank without a GPU).
#include <catch2/catch.hpp>

#include <string>

#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

using Catch::Contains;
using zero::BackendKind;
using zero::CommKind;
using zero::Config;

namespace {

Config parse(const std::string& text, const zero::LoadOptions& opts = {}) {
  return zero::parse_config(text, "backend.yaml", opts);
}

}  // namespace

TEST_CASE("backend and comm default to host and nccl", "[config]") {
  Config c = parse("");
  CHECK(c.backend == BackendKind::host);
  CHECK(c.comm == CommKind::nccl);
}

TEST_CASE("backend and comm accept their values", "[config]") {
  Config a = parse("backend: cuda\n");
  CHECK(a.backend == BackendKind::cuda);
  CHECK(a.comm == CommKind::nccl);
  Config b = parse("backend: cuda\ncomm: mpi\n");
  CHECK(b.backend == BackendKind::cuda);
  CHECK(b.comm == CommKind::mpi);
  Config c = parse("backend: cuda\ncomm: nccl\n");
  CHECK(c.comm == CommKind::nccl);
  // The host backend communicates over MPI: saying so is allowed.
  Config d = parse("backend: host\ncomm: mpi\n");
  CHECK(d.backend == BackendKind::host);
  CHECK(d.comm == CommKind::mpi);
  // DeepSpeed JSON files load the same keys.
  Config j = parse("{\"backend\": \"cuda\", \"comm\": \"mpi\", \"train_batch_size\": 8}");
  CHECK(j.backend == BackendKind::cuda);
  CHECK(j.comm == CommKind::mpi);
}

// PowerSGD runs on the CUDA backend (staged through the host): the loader accepts it there at
// stages 0 and 1, and refuses stages 2 and 3 as on the host backend.
TEST_CASE("gradient_compression: powersgd loads with backend: cuda", "[config]") {
  const std::string psgd = "gradient_compression:\n  type: powersgd\n  rank: 2\n";
  for (int stage : {0, 1}) {
    Config c = parse("backend: cuda\nzero_optimization:\n  stage: " + std::to_string(stage) + "\n" + psgd);
    CHECK(c.backend == BackendKind::cuda);
    CHECK(c.gradient_compression.type == zero::CompressionType::powersgd);
    CHECK(c.gradient_compression.rank == 2);
  }
  CHECK_THROWS_WITH(parse("backend: cuda\nzero_optimization:\n  stage: 2\n" + psgd),
                    Contains("powersgd applies to zero_optimization.stage 0 and 1"));
}

TEST_CASE("unknown backend or comm values are errors that list the choices", "[config]") {
  CHECK_THROWS_WITH(parse("backend: gpu\n"),
                    Contains("backend.yaml:1") && Contains("backend") && Contains("one of host, cuda"));
  CHECK_THROWS_WITH(parse("backend: cude\n"), Contains("did you mean cuda?"));
  CHECK_THROWS_WITH(parse("backend: cuda\ncomm: gloo\n"),
                    Contains("backend.yaml:2") && Contains("comm") && Contains("one of nccl, mpi"));
  CHECK_THROWS_WITH(parse("backend: cuda\ncomm: ncl\n"), Contains("did you mean nccl?"));
  CHECK_THROWS_WITH(parse("backend: [cuda]\n"), Contains("backend"));
  CHECK_THROWS_WITH(parse("backend:\n"), Contains("backend"));
  // Case matters, as for the other choices that are not DeepSpeed names.
  CHECK_THROWS_WITH(parse("backend: CUDA\n"), Contains("one of host, cuda"));
}

TEST_CASE("misspelt keys get the did-you-mean hint", "[config]") {
  CHECK_THROWS_WITH(parse("backends: cuda\n"), Contains("backends") && Contains("backend"));
  CHECK_THROWS_WITH(parse("backend: cuda\ncomms: mpi\n"), Contains("comms") && Contains("comm"));
}

TEST_CASE("comm: nccl with the host backend is an error, not ignored", "[config]") {
  CHECK_THROWS_WITH(parse("comm: nccl\n"),
                    Contains("comm") && Contains("applies to backend: cuda") && Contains("the default"));
  CHECK_THROWS_WITH(parse("backend: host\ncomm: nccl\n"),
                    Contains("applies to backend: cuda") && Contains("backend.yaml:1"));
}

TEST_CASE("--set overrides backend and comm, validated like the file", "[config]") {
  zero::LoadOptions o;
  o.overrides = {"backend=cuda", "comm=mpi"};
  Config c = parse("train_batch_size: 4\n", o);
  CHECK(c.backend == BackendKind::cuda);
  CHECK(c.comm == CommKind::mpi);
  zero::LoadOptions bad;
  bad.overrides = {"backend=tpu"};
  CHECK_THROWS_WITH(parse("", bad), Contains("--set backend=tpu") && Contains("one of host, cuda"));
}

TEST_CASE("to_yaml round-trips backend and comm", "[config]") {
  for (const char* text :
       {"backend: cuda\ncomm: mpi\n", "backend: cuda\n", "backend: host\n", "", "backend: host\ncomm: mpi\n"}) {
    INFO(text);
    Config a = parse(text);
    const std::string y = a.to_yaml();
    Config b = zero::parse_config(y, "round-trip");
    CHECK(b.backend == a.backend);
    CHECK(b.to_yaml() == y);
    if (a.backend == BackendKind::cuda) {
      CHECK(b.comm == a.comm);
      CHECK(y.find(a.comm == CommKind::mpi ? "\ncomm: mpi" : "\ncomm: nccl") != std::string::npos);
      CHECK(y.find("\nbackend: cuda") != std::string::npos);
    } else {
      // comm has no meaning for the host backend; writing it out would make the text invalid.
      CHECK(y.find("\nbackend: host") != std::string::npos);
      CHECK(y.find("\ncomm:") == std::string::npos);
    }
  }
}

TEST_CASE("an Engine with backend: cuda says what to do when CUDA cannot be had", "[config][engine]") {
  zero::Context ctx;
  Config c = parse("backend: cuda\ncomm: mpi\n");
  c.resolve(ctx.world_size());
  zero::Layout l;
  l.add_unit("u", {{"w", {8}}});
#if ZERO_WITH_CUDA
  if (ctx.device() >= 0) {
    // A GPU is present: the CUDA backend starts (test/gpu checks what it computes).
    zero::Engine e(ctx, c, l);
    CHECK(e.config().backend == BackendKind::cuda);
  } else {
    CHECK_THROWS_WITH(zero::Engine(ctx, c, l), Contains("no CUDA device") && Contains("backend: host"));
  }
  // Parameter offload is not built for the CUDA backend: refused, not ignored.
  Config p = parse("backend: cuda\ncomm: mpi\nzero_optimization:\n  stage: 3\n  offload_param:\n    device: cpu\n");
  p.resolve(ctx.world_size());
  CHECK_THROWS_WITH(zero::Engine(ctx, p, l), Contains("offload_param") && Contains("CUDA backend"));
#else
  CHECK_THROWS_WITH(zero::Engine(ctx, c, l),
                    Contains("built without CUDA") && Contains("-DZERO_CUDA=ON") && Contains("backend: host"));
#endif
  // The host backend is there in every build.
  Config h = parse("backend: host\n");
  h.resolve(ctx.world_size());
  zero::Engine e(ctx, h, l);
  CHECK(e.config().backend == BackendKind::host);
}
