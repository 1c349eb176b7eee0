// The smallest libzero training loop: a two-layer MLP learns a fixed random "teacher" network.
// Each layer is one engine unit; the same code runs at every ZeRO stage.
//   mpirun -np 4 build/release/examples/mlp/zero-mlp --config examples/mlp/mlp.yaml
//          --set zero_optimization.stage=3 --steps 30
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <zero/comm.hpp>
#include <zero/context.hpp>
#include <zero/engine.hpp>

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
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return ctx.is_root() ? app.exit(e) : e.get_exit_code();
    }
    opts.total_num_steps = steps;
    zero::Config cfg = zero::load_config(config_path, opts);
    cfg.resolve(ctx.world_size());
    if (ctx.is_root())
      for (const auto& n : cfg.notes) std::printf("note: %s\n", n.c_str());

    zero::Layout layout;  // units: the granule of gather / reduce
    int fc1 = layout.add_unit("fc1", {{"w", {kHidden, kIn}}, {"b", {kHidden}}});
    int fc2 = layout.add_unit("fc2", {{"w", {kOut, kHidden}}, {"b", {kOut}}});
    zero::Engine engine(ctx, cfg, layout);
    // Both layers name their parameters "w" and "b": p.unit says which layer, so each draws
    // its own values.
    engine.init_params([&](const zero::ParamInfo& p, std::span<float> v) {
      const auto stream = static_cast<std::uint64_t>(engine.layout().find_unit(p.unit)) * 1000 +
                          static_cast<std::uint64_t>(p.offset);
      float scale = p.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(p.shape[1])) : 0.0f;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * noise(7 + stream, i);
    });

    const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
    const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
    std::vector<float> x(kIn), y(kOut), h(kHidden), out(kOut), dh(kHidden);
    for (int step = 0; step < steps; ++step) {
      double loss = 0.0;
      for (int k = 0; k < gas; ++k) {
        // Forward for the whole micro-batch needs both layers; keep the activations.
        std::vector<float> xs(micro * kIn), hs(micro * kHidden), douts(micro * kOut);
        {
          auto p1 = engine.gather(fc1);
          auto p2 = engine.gather(fc2);
          for (int s = 0; s < micro; ++s) {
            std::int64_t id = ((static_cast<std::int64_t>(step) * gas + k) * ctx.world_size() + ctx.rank()) * micro + s;
            sample(id, &xs[s * kIn], y.data());
            for (int j = 0; j < kHidden; ++j) {
              float a = p1["b"].get(j);
              for (int i = 0; i < kIn; ++i) a += p1["w"].get(j * kIn + i) * xs[s * kIn + i];
              hs[s * kHidden + j] = std::tanh(a);
            }
            for (int o = 0; o < kOut; ++o) {
              float a = p2["b"].get(o);
              for (int j = 0; j < kHidden; ++j) a += p2["w"].get(o * kHidden + j) * hs[s * kHidden + j];
              float d = a - y[o];
              loss += 0.5 * d * d / (micro * gas);
              douts[s * kOut + o] = d / micro * engine.loss_scale();  // d(mean loss)/d(out), scaled
            }
          }
        }
        // Backward, last unit first: add gradients, then hand each unit to the engine.
        std::vector<float> dhs(micro * kHidden, 0.0f);
        {
          auto p2 = engine.gather(fc2);
          auto g2 = engine.grads(fc2);
          for (int s = 0; s < micro; ++s)
            for (int o = 0; o < kOut; ++o) {
              float d = douts[s * kOut + o];
              g2["b"].add(o, d);
              for (int j = 0; j < kHidden; ++j) {
                g2["w"].add(o * kHidden + j, d * hs[s * kHidden + j]);
                dhs[s * kHidden + j] += d * p2["w"].get(o * kHidden + j);
              }
            }
          engine.reduce(fc2);
        }
        {
          auto p1 = engine.gather(fc1);
          auto g1 = engine.grads(fc1);
          for (int s = 0; s < micro; ++s)
            for (int j = 0; j < kHidden; ++j) {
              float hv = hs[s * kHidden + j], d = dhs[s * kHidden + j] * (1 - hv * hv);
              g1["b"].add(j, d);
              for (int i = 0; i < kIn; ++i) g1["w"].add(j * kIn + i, d * xs[s * kIn + i]);
            }
          engine.reduce(fc1);
        }
      }
      zero::StepResult r = engine.step();
      double mean = ctx.comm().all_reduce_scalar(loss, zero::ReduceOp::avg);
      if (ctx.is_root())
        std::printf("step %3d  loss %.4e  grad_norm %.4e  lr %.3e  scale %g%s\n", step + 1, mean, r.grad_norm, r.lr,
                    r.loss_scale, r.skipped ? "  (skipped: overflow)" : "");
    }
    if (ctx.is_root())
      std::printf("stage %d, %d ranks, %lld parameters: %s\n", cfg.zero_optimization.stage, ctx.world_size(),
                  static_cast<long long>(layout.num_params()), engine.memory().to_string().c_str());
    return 0;
  });
}
