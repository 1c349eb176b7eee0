// docs/configuration.md's key reference is the one generated from the key table: this test
// fails when they disagree. To refresh the page after changing the table, run this test with
// ZERO_UPDATE_CONFIG_DOC=1 (it rewrites the block between the markers) and review the diff.
#include <catch2/catch.hpp>

#include "zero/config.hpp"
#include "generated_block.hpp"

TEST_CASE("docs/configuration.md's key table is the one generated from the key table", "[config]") {
  zero::test::check_generated_block(ZERO_CONFIG_DOC,
                                    "<!-- config-reference: generated from libzero/src/config/keys.cpp -->\n",
                                    "<!-- end of config-reference -->\n", zero::config_reference_markdown());
}

TEST_CASE("the generated reference names every key, its type, default and the policy", "[config]") {
  const std::string ref = zero::config_reference_markdown();
  // Rows written by hand here (not by the code under test) for a few keys of each kind.
  CHECK(ref.find("| `zero_optimization.stage` | integer 0..3 | `0` |") != std::string::npos);
  CHECK(ref.find("| `train_micro_batch_size_per_gpu` | integer 1..2147483647, or `auto` | derived |") !=
        std::string::npos);
  CHECK(ref.find("| `fp16.enabled` | bool, or `auto` | `false` |") != std::string::npos);
  CHECK(ref.find("| `optimizer.params.betas` | list of 2 numbers in [0, 1), or `auto` | Lion `[0.9, 0.99]`, "
                 "others `[0.9, 0.999]` |") != std::string::npos);
  CHECK(ref.find("| `optimizer.params.ns_steps` | integer 1..100 | `5` |") != std::string::npos);
  CHECK(ref.find("| `optimizer.params.decay_rate` | number < 0 | `-0.8` |") != std::string::npos);
  CHECK(ref.find("Also spelt `max_live_parameters`.") != std::string::npos);
  CHECK(ref.find("- `wall_clock_breakdown`: logging") != std::string::npos);
  CHECK(ref.find("- `curriculum_learning` other than `false`") != std::string::npos);
  CHECK(ref.find("- `optimizer.type: ZeroOneAdam`: 0/1 Adam is not implemented") != std::string::npos);

  const std::string help = zero::config_keys_help();
  CHECK(help.find("zero_optimization.stage") != std::string::npos);
  CHECK(help.find("integer 0..3 (default 0)") != std::string::npos);
}
