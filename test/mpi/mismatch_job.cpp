// A training loop that evaluates on rank 0 only, for test/e2e/mismatch.py (which checks what
// the job prints and how it ends). Stage 3 on the engine test model, every unit sharded.
//   mismatch_job rank0-eval: after one step, rank 0 alone runs a forward pass (eval-mode gathers)
//     while the other ranks train on: the collective check must end the job naming both calls.
//   mismatch_job gather-all: the supported way: every rank calls gather_all(), rank 0 alone reads
//     every unit (compared with full_params taken before), then all ranks train on. Exits 0.
//   mismatch_job rank0-gather-all STAGE: at stage STAGE (0-3), rank 0 alone calls gather_all()
//     while the other ranks train on: the collective check must end the job naming both calls.
#include <cstdio>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string stage = argc > 2 ? argv[2] : "3";
  return ctx.run([&] {
    const std::string yaml = "train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: " + stage +
                             "\n  stage3_param_persistence_threshold: 0\n";
    zero::Config cfg = zero::parse_config(yaml, "mismatch_job");
    cfg.resolve(ctx.world_size());
    zero::Engine e(ctx, cfg, zero::test::make_layout());
    e.init_params(zero::test::init_value);
    const int n = e.layout().num_units();
    zero::test::train(e, ctx.rank(), ctx.world_size(), 0, 1);
    if (mode == "rank0-eval") {
      if (ctx.rank() == 0) {
        e.set_eval(true);
        for (int u = 0; u < n; ++u) e.gather(u);
        e.set_eval(false);
      }
      zero::test::train(e, ctx.rank(), ctx.world_size(), 1, 1);
      std::fprintf(stderr, "rank %d: trained on after a rank-0-only forward pass\n", ctx.rank());
      return 3;
    }
    if (mode == "rank0-gather-all") {
      if (ctx.rank() == 0) {
        const zero::GatheredModel held = e.gather_all();
        for (int u = 0; u < n; ++u) e.gather(u);
      }
      zero::test::train(e, ctx.rank(), ctx.world_size(), 1, 1);
      std::fprintf(stderr, "rank %d: trained on after a rank-0-only gather_all\n", ctx.rank());
      return 3;
    }
    if (mode == "gather-all") {
      std::vector<std::vector<float>> want;
      for (int u = 0; u < n; ++u) want.push_back(e.full_params(u));  // collective
      {
        const zero::GatheredModel held = e.gather_all();  // collective
        if (ctx.rank() == 0) {
          for (int u = 0; u < n; ++u) {
            zero::UnitParams p = e.gather(u);  // local now
            for (const auto& pi : e.layout().unit(u).params)
              for (std::int64_t i = 0; i < pi.numel; ++i)
                ZERO_CHECK(
                    p[pi.name].get(i) == want[static_cast<std::size_t>(u)][static_cast<std::size_t>(pi.offset + i)],
                    "gather_all: unit " + e.layout().unit(u).name + " differs from full_params");
          }
          std::printf("rank 0 read %d units through gather_all, equal to full_params\n", n);
        }
      }
      zero::test::train(e, ctx.rank(), ctx.world_size(), 1, 2);
      std::printf("rank %d: trained on, step %lld\n", ctx.rank(), static_cast<long long>(e.global_step()));
      return 0;
    }
    std::fprintf(stderr, "usage: mismatch_job rank0-eval | gather-all | rank0-gather-all STAGE\n");
    return 2;
  });
}
