// The smallest libzero training loop: a two-layer MLP learns a fixed random "teacher" network.
// Each layer is one engine unit; the same code runs at every ZeRO stage.
//   mpirun -np 4 build/release/examples/mlp/zero-mlp --config examples/mlp/mlp.yaml
//          --set zero_optimization.stage=3 --steps 30
// With --tensor-parallel T the hidden layer is split over T ranks, Megatron's way: fc1 by
// columns (each rank computes H/T hidden units), fc2 by rows (each rank's partial output is
// summed with one all-reduce over the tensor group); fc2's bias is replicated. The engine shards
// and reduces over the data-parallel group (world / T ranks) and computes the gradient norm
// over the whole model, so the loss curve is the unsplit run's.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <zero/comm.hpp>
#include <zero/context.hpp>
#include <zero/engine.hpp>
#include <zero/error.hpp>
#include <zero/groups.hpp>

namespace {
constexpr int kIn = 32, kHidden = 128, kOut = 8;

// Deterministic pseudo-random value in [-1, 1) from two integers (same on every rank).
float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = (a + 1) * 0x9E3779B97F4A7C15ull ^ (b * 0xD1B54A32D192ED03ull);
  x ^= x >> 29; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x >> 11) * 0x1p-53 * 2.0 - 1.0);
}

// One sample: input x and the teacher's output y = tanh-layer of x with fixed weights.
void sample(std::int64_t id, float* x, float* y) {
  for (int i = 0; i < kIn; ++i) x[i] = noise(static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(i));
  for (int o = 0; o < kOut; ++o) {
    float s = 0;
    for (int i = 0; i < kIn; ++i) s += noise(1000 + static_cast<std::uint64_t>(o), static_cast<std::uint64_t>(i)) * x[i];
    y[o] = std::tanh(s * 0.5f);
  }
}
}  // namespace

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] {
    CLI::App app{"zero-mlp: the smallest libzero training loop (a two-layer MLP learns a fixed\n"
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
    int tp = 1;
    app.add_option("--tensor-parallel", tp, "ranks that split the hidden layer (divides the world and " +
                                                std::to_string(kHidden) + ")")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return ctx.is_root() ? app.exit(e) : e.get_exit_code();
    }
    opts.total_num_steps = steps;
    if (kHidden % tp != 0) throw zero::Error("--tensor-parallel " + std::to_string(tp) + " does not divide the " +
                                             std::to_string(kHidden) + " hidden units; use 1, 2, 4, ...");
    zero::ProcessGroups groups(ctx, {.tensor = tp});  // tensor ranks adjacent, data parallel across
    const int t = groups.coord().tensor, dp = groups.data_size(), dp_rank = groups.coord().data;
    zero::Config cfg = zero::load_config(config_path, opts);
    cfg.resolve(dp);
    if (ctx.is_root())
      for (const auto& n : cfg.notes) std::printf("note: %s\n", n.c_str());

    // This rank's part of the model (the whole model when tp is 1).
    const int H = kHidden / tp;
    zero::Layout layout;  // units: the granule of gather / reduce
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
    // where the unsplit one does. Both layers name their parameters "w" and "b": p.unit says
    // which layer.
    engine.init_params([&](const zero::ParamInfo& p, std::span<float> v) {
      const bool w = p.shape.size() == 2, first = p.unit == "fc1";
      const std::int64_t whole_offset = first && !w ? std::int64_t{kHidden} * kIn : (w ? 0 : std::int64_t{kOut} * kHidden);
      const auto stream = static_cast<std::uint64_t>(engine.layout().find_unit(p.unit)) * 1000 +
                          static_cast<std::uint64_t>(whole_offset);
      float scale = w ? 1.0f / std::sqrt(static_cast<float>(first ? kIn : kHidden)) : 0.0f;
      for (std::size_t i = 0; i < v.size(); ++i) {
        auto k = static_cast<std::int64_t>(i);  // index in the whole tensor
        if (p.split_axis == 0) k += static_cast<std::int64_t>(t) * p.numel;
        if (p.split_axis == 1) k = k / H * kHidden + static_cast<std::int64_t>(t) * H + k % H;
        v[i] = scale * noise(7 + stream, static_cast<std::uint64_t>(k));
      }
    });

    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
    for (int step = 0; step < steps; ++step) {
      double loss = 0.0;
      for (int k = 0; k < gas; ++k) {
        // Forward for the whole micro-batch needs both layers; keep the activations.
        std::vector<float> xs(micro * kIn), ys(micro * kOut), hs(micro * H), outs(micro * kOut), douts(micro * kOut);
        {
          auto p1 = engine.gather(fc1);
          auto p2 = engine.gather(fc2);
          for (int s = 0; s < micro; ++s) {
            // The tensor ranks of a data-parallel rank see the same samples.
            std::int64_t id = ((static_cast<std::int64_t>(step) * gas + k) * dp + dp_rank) * micro + s;
            sample(id, &xs[s * kIn], &ys[s * kOut]);
            for (int j = 0; j < H; ++j) {
              float a = p1["b"].get(j);
              for (int i = 0; i < kIn; ++i) a += p1["w"].get(j * kIn + i) * xs[s * kIn + i];
              hs[s * H + j] = std::tanh(a);
            }
            for (int o = 0; o < kOut; ++o) {
              float a = 0;
              for (int j = 0; j < H; ++j) a += p2["w"].get(o * H + j) * hs[s * H + j];
              outs[s * kOut + o] = a;  // this rank's hidden units' share
            }
          }
          // fc2 is row-parallel: the shares of all tensor ranks add up to the output.
          if (tp > 1) groups.tensor().all_reduce(outs.data(), outs.size(), zero::DType::f32);
          for (int s = 0; s < micro; ++s) {
            for (int o = 0; o < kOut; ++o) {
              float a = outs[s * kOut + o] + p2["b"].get(o);
              float d = a - ys[s * kOut + o];
              loss += 0.5 * d * d / (micro * gas);
              douts[s * kOut + o] = d / micro * engine.loss_scale();  // d(mean loss)/d(out), scaled
            }
          }
        }
        // Backward, last unit first: add gradients, then hand each unit to the engine.
        // Each rank's hidden units need only its own rows of W2: no communication backward.
        std::vector<float> dhs(micro * H, 0.0f);
        {
          auto p2 = engine.gather(fc2);
          auto g2 = engine.grads(fc2);
          for (int s = 0; s < micro; ++s)
            for (int o = 0; o < kOut; ++o) {
              float d = douts[s * kOut + o];
              g2["b"].add(o, d);
              for (int j = 0; j < H; ++j) {
                g2["w"].add(o * H + j, d * hs[s * H + j]);
                dhs[s * H + j] += d * p2["w"].get(o * H + j);
              }
            }
          engine.reduce(fc2);
        }
        {
          auto p1 = engine.gather(fc1);
          auto g1 = engine.grads(fc1);
          for (int s = 0; s < micro; ++s)
            for (int j = 0; j < H; ++j) {
              float hv = hs[s * H + j], d = dhs[s * H + j] * (1 - hv * hv);
              g1["b"].add(j, d);
              for (int i = 0; i < kIn; ++i) g1["w"].add(j * kIn + i, d * xs[s * kIn + i]);
            }
          engine.reduce(fc1);
        }
      }
      zero::StepResult r = engine.step();
      // Every tensor rank of a replica computed the same loss: the mean over the data group.
      double mean = groups.data().all_reduce_scalar(loss, zero::ReduceOp::avg);
      if (ctx.is_root())
        std::printf("step %3d  loss %.6e  grad_norm %.4e  lr %.3e  scale %g%s\n", step + 1, mean, r.grad_norm, r.lr,
                    r.loss_scale, r.skipped ? "  (skipped: overflow)" : "");
    }
    if (ctx.is_root())
      std::printf("stage %d, %s, %lld parameters on this rank: %s\n", cfg.zero_optimization.stage,
                  groups.describe().c_str(), static_cast<long long>(layout.num_params()),
                  engine.memory().to_string().c_str());
    return 0;
  });
}
