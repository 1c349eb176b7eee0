// The smallest libzero training loop: a two-layer MLP learns a fixed random "teacher" network
// (teacher.hpp). Each layer is one engine unit; the same code runs at every ZeRO stage.
//   mpirun -np 4 build/release/examples/mlp/zero-mlp --config examples/mlp/mlp.yaml
//          --set zero_optimization.stage=3 --steps 30
// The same loop with its hidden layer split over ranks is mlp_tensor_parallel.cpp.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>
#include <vector>

#include <zero/comm.hpp>
#include <zero/context.hpp>
#include <zero/engine.hpp>

#include "mlp/layers.hpp"
#include "mlp/teacher.hpp"

using namespace mlp;

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] {
    CLI::App app{
        "zero-mlp: the smallest libzero training loop (a two-layer MLP learns a fixed\n"
        "random teacher) at any ZeRO stage. Launch with mpirun / srun for several ranks."};
    std::string config_path;
    zero::LoadOptions opts;
    int steps = 30;
    app.add_option("-c,--config", config_path, "YAML or DeepSpeed JSON file (engine keys)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("--set", opts.overrides,
                   "override one key, e.g. --set zero_optimization.stage=3 (repeatable; "
                   "validated like the file)")
        ->take_all();
    app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return ctx.is_root() ? app.exit(e) : e.get_exit_code();
    }
    opts.total_num_steps = steps;
    const int world = ctx.world_size(), rank = ctx.rank();
    zero::Config cfg = zero::load_config(config_path, opts);
    cfg.resolve(world);
    if (ctx.is_root())
      for (const auto& n : cfg.notes) fmt::print("note: {}\n", n);

    zero::Layout layout;  // units: the granule of gather / reduce
    int fc1 = layout.add_unit("fc1", {{"w", {kHidden, kIn}}, {"b", {kHidden}}});
    int fc2 = layout.add_unit("fc2", {{"w", {kOut, kHidden}}, {"b", {kOut}}});
    zero::Engine engine(ctx, cfg, layout);
    // Both layers name their parameters "w" and "b": p.unit says which layer.
    engine.init_params([&](const zero::ParamInfo& p, std::span<float> v) {
      const int unit = engine.layout().find_unit(p.unit);
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = initial_value(unit, p.shape.size() == 2, static_cast<std::int64_t>(i));
    });

    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
    for (int step = 0; step < steps; ++step) {
      double loss = 0.0;
      for (int k = 0; k < gas; ++k) {
        // Forward for the whole micro-batch needs both layers; keep the activations.
        std::vector<float> xs(micro * kIn), ys(micro * kOut), hs(micro * kHidden), outs(micro * kOut),
            douts(micro * kOut);
        {
          auto p1 = engine.gather(fc1);
          auto p2 = engine.gather(fc2);
          for (int s = 0; s < micro; ++s) {
            const std::int64_t id = ((static_cast<std::int64_t>(step) * gas + k) * world + rank) * micro + s;
            sample(id, &xs[s * kIn], &ys[s * kOut]);
            fc1_forward(p1, &xs[s * kIn], &hs[s * kHidden], kHidden);
            fc2_product(p2, &hs[s * kHidden], &outs[s * kOut], kHidden);
            output_loss(p2, &outs[s * kOut], &ys[s * kOut], &douts[s * kOut], micro, micro * gas, engine.loss_scale(),
                        loss);
          }
        }
        // Backward, last unit first: add gradients, then hand each unit to the engine.
        std::vector<float> dhs(micro * kHidden, 0.0f);
        {
          auto p2 = engine.gather(fc2);
          auto g2 = engine.grads(fc2);
          for (int s = 0; s < micro; ++s)
            fc2_backward(p2, g2, &hs[s * kHidden], &douts[s * kOut], &dhs[s * kHidden], kHidden);
          engine.reduce(fc2);
        }
        {
          auto p1 = engine.gather(fc1);
          auto g1 = engine.grads(fc1);
          for (int s = 0; s < micro; ++s) fc1_backward(g1, &xs[s * kIn], &hs[s * kHidden], &dhs[s * kHidden], kHidden);
          engine.reduce(fc1);
        }
      }
      zero::StepResult r = engine.step();
      double mean = ctx.comm().all_reduce_scalar(loss, zero::ReduceOp::avg);
      if (ctx.is_root())
        fmt::print("step {:3d}  loss {:.6e}  grad_norm {:.4e}  lr {:.3e}  scale {:g}{}\n", step + 1, mean, r.grad_norm,
                   r.lr, r.loss_scale, r.skipped ? "  (skipped: overflow)" : "");
    }
    if (ctx.is_root())
      fmt::print("stage {}, {} rank{}, {} parameters on this rank: {}\n", cfg.zero_optimization.stage, world,
                 world == 1 ? "" : "s", layout.num_params(), engine.memory().to_string());
    return 0;
  });
}
