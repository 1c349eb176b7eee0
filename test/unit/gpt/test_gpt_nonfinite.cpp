// The host kernels on values a diverged run produces: NaN and infinite activations and logits.
// They must give NaN (which the trainer reports as a diverged loss), never undefined behaviour:
// this test's copy of the kernels is built with -fsanitize=float-cast-overflow and aborts on
// a NaN converted to an integer (exp_fast's exponent did that before it passed NaN through).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpt/host_kernels.hpp"

namespace h = zero::gpt::host;

TEST_CASE("GELU and softmax cross-entropy pass NaN through and saturate at infinity", "[gpt][math]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {nan, inf, -inf, 1e30f, -1e30f, 0.5f};
  std::vector<float> y(x.size());
  h::gelu_forward(y.data(), x.data(), x.size());
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == inf);   // GELU(x) -> x for large x
  CHECK(y[4] == 0.0f);  // GELU(x) -> 0 for very negative x (-0 included)
  CHECK(y[5] == Approx(0.345714f).epsilon(1e-5));

  // One row of logits holding a NaN: its loss is NaN, the other row's is finite.
  const int V = 4, Vp = 4;
  const std::vector<float> logits = {0.1f, nan, 0.3f, 0.2f, 0.1f, 0.2f, 0.3f, 0.4f};
  const std::vector<std::int32_t> targets = {2, 3};
  std::vector<float> losses(2), dlogits(logits.size());
  h::softmax_cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), 2, V, Vp, 1.0f);
  CHECK(std::isnan(losses[0]));
  CHECK(std::isfinite(losses[1]));
}
