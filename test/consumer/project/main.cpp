// Trains a two-unit model for a few steps through the installed library.
#include <cstdio>

#include <zero/zero.hpp>  // the umbrella header, as installed

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] {
    zero::Config cfg = zero::parse_config("zero_optimization:\n  stage: 2\n", "consumer");
    cfg.resolve(ctx.world_size());
    zero::Layout layout;
    layout.add_unit("a", {{"w", {10}}});
    layout.add_unit("b", {{"w", {3, 3}}});
    zero::Engine engine(ctx, cfg, layout);
    engine.init_params([](const zero::ParamInfo&, std::span<float> v) {
      for (auto& x : v) x = 1.0f;
    });
    for (int step = 0; step < 3; ++step) {
      for (int u = 1; u >= 0; --u) {
        auto p = engine.gather(u);
        auto g = engine.grads(u);
        for (std::int64_t i = 0; i < g[0].numel; ++i) g[0].add(i, p[0].get(i));  // d/dw of w^2/2
        engine.reduce(u);
      }
      engine.step();
    }
    float w = engine.full_params(0)[0];
    std::printf("consumer: w after 3 steps = %g\n", w);
    return w < 1.0f ? 0 : 1;  // gradient descent on w^2/2 must shrink w
  });
}
