// mlp.cpp's loop with its hidden layer split over T ranks, Megatron's way: fc1 by columns (each
// rank computes H/T hidden units), fc2 by rows (each rank's partial output is summed with one
// all-reduce over the tensor group); fc2's bias is replicated. The engine shards and reduces
// over the data-parallel group (world / T ranks) and computes the gradient norm over the whole
// model, so the loss curve is the unsplit run's.
//   mpirun -np 4 build/release/examples/mlp/zero-mlp-tensor-parallel --config examples/mlp/mlp.yaml
//          --tensor-parallel 2
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>
#include <vector>

#include <zero/comm.hpp>
#include <zero/context.hpp>
#include <zero/engine.hpp>
#include <zero/error.hpp>
#include <zero/groups.hpp>

#include "mlp/layers.hpp"
#include "mlp/teacher.hpp"

using namespace mlp;

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] {
    CLI::App app{
        "zero-mlp-tensor-parallel: the MLP example with its hidden layer split over\n"
        "tensor-parallel ranks, data parallel (ZeRO) across them."};
    std::string config_path;
    zero::LoadOptions opts;
    int steps = 30, tp = 1;
    app.add_option("-c,--config", config_path, "YAML or DeepSpeed JSON file (engine keys)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("--set", opts.overrides, "override one key (repeatable; validated like the file)")->take_all();
    app.add_option("--steps", steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--tensor-parallel", tp,
                   fmt::format("ranks that split the hidden layer (divides the world and {})", kHidden))
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return ctx.is_root() ? app.exit(e) : e.get_exit_code();
    }
    opts.total_num_steps = steps;
    if (kHidden % tp != 0)
      throw zero::Error(
          fmt::format("--tensor-parallel {} does not divide the {} hidden units; use 1, 2, 4, ...", tp, kHidden));
    zero::ProcessGroups groups(ctx, {.tensor = tp});  // tensor ranks adjacent, data parallel across
    const int t = groups.coord().tensor, dp = groups.data_size(), dp_rank = groups.coord().data;
    zero::Config cfg = zero::load_config(config_path, opts);
    cfg.resolve(dp);
    if (ctx.is_root())
      for (const auto& n : cfg.notes) fmt::print("note: {}\n", n);

    // This rank's part of the model: H of the hidden units.
    const int H = kHidden / tp;
    zero::Layout layout;
    int fc1 = layout.add_unit("fc1", {{"w", {H, kIn}}, {"b", {H}}});
    int fc2 = layout.add_unit("fc2", {{"w", {kOut, H}}, {"b", {kOut}}});
    if (tp > 1) {
      layout.set_split(fc1, "w", 0);  // rows of W1 [hidden, in]: this rank's hidden units
      layout.set_split(fc1, "b", 0);
      layout.set_split(fc2, "w", 1);  // columns of W2 [out, hidden]: the same hidden units
      layout.set_replicated(fc2, "b");
    }
    zero::Engine engine(ctx, cfg, layout, groups);
    // Every element draws the value of its place in the whole model, so a split run starts
    // where the unsplit one does.
    engine.init_params([&](const zero::ParamInfo& p, std::span<float> v) {
      const int unit = engine.layout().find_unit(p.unit);
      for (std::size_t i = 0; i < v.size(); ++i) {
        auto k = static_cast<std::int64_t>(i);  // index in the whole tensor
        if (p.split_axis == 0) k += static_cast<std::int64_t>(t) * p.numel;
        if (p.split_axis == 1) k = k / H * kHidden + static_cast<std::int64_t>(t) * H + k % H;
        v[i] = initial_value(unit, p.shape.size() == 2, k);
      }
    });

    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
    for (int step = 0; step < steps; ++step) {
      double loss = 0.0;
      for (int k = 0; k < gas; ++k) {
        std::vector<float> xs(micro * kIn), ys(micro * kOut), hs(micro * H), outs(micro * kOut), douts(micro * kOut);
        {
          auto p1 = engine.gather(fc1);
          auto p2 = engine.gather(fc2);
          for (int s = 0; s < micro; ++s) {
            // The tensor ranks of a data-parallel rank see the same samples.
            const std::int64_t id = ((static_cast<std::int64_t>(step) * gas + k) * dp + dp_rank) * micro + s;
            sample(id, &xs[s * kIn], &ys[s * kOut]);
            fc1_forward(p1, &xs[s * kIn], &hs[s * H], H);
            fc2_product(p2, &hs[s * H], &outs[s * kOut], H);  // this rank's hidden units' share
          }
          // fc2 is row-parallel: the shares of all tensor ranks add up to the output.
          if (tp > 1) groups.tensor().all_reduce(outs.data(), outs.size(), zero::DType::f32);
          for (int s = 0; s < micro; ++s)
            output_loss(p2, &outs[s * kOut], &ys[s * kOut], &douts[s * kOut], micro, micro * gas, engine.loss_scale(),
                        loss);
        }
        // No communication backward: each rank's hidden units need only its columns of W2.
        std::vector<float> dhs(micro * H, 0.0f);
        {
          auto p2 = engine.gather(fc2);
          auto g2 = engine.grads(fc2);
          for (int s = 0; s < micro; ++s) fc2_backward(p2, g2, &hs[s * H], &douts[s * kOut], &dhs[s * H], H);
          engine.reduce(fc2);
        }
        {
          auto p1 = engine.gather(fc1);
          auto g1 = engine.grads(fc1);
          for (int s = 0; s < micro; ++s) fc1_backward(g1, &xs[s * kIn], &hs[s * H], &dhs[s * H], H);
          engine.reduce(fc1);
        }
      }
      zero::StepResult r = engine.step();
      // Every tensor rank of a replica computed the same loss: the mean over the data group.
      double mean = groups.data().all_reduce_scalar(loss, zero::ReduceOp::avg);
      if (ctx.is_root())
        fmt::print("step {:3d}  loss {:.6e}  grad_norm {:.4e}  lr {:.3e}  scale {:g}{}\n", step + 1, mean, r.grad_norm,
                   r.lr, r.loss_scale, r.skipped ? "  (skipped: overflow)" : "");
    }
    if (ctx.is_root())
      fmt::print("stage {}, {}, {} parameters on this rank: {}\n", cfg.zero_optimization.stage, groups.describe(),
                 layout.num_params(), engine.memory().to_string());
    return 0;
  });
}
